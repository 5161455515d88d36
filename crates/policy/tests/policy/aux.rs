//! Behaviour cloning's auxiliary target: a linear head on the condition vector regresses
//! privileged values (where an object is). It exists only when asked for, learns the object's
//! position from the pixels, and survives a checkpoint.

use crate::common;

use burn::module::Module;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::{Tensor, TensorData};
use common::*;
use diffrl_core::seeding::rng;
use diffrl_policy::config::{ImageEncoderKind, PolicyConfig};
use diffrl_policy::{ObsBatch, Policy, PolicyModel, PolicySpec, checkpoint};
use rand::Rng as _;

const SIDE: usize = 8;

fn config(aux_weight: f64) -> PolicyConfig {
    let mut cfg = tiny_config(4);
    cfg.obs_horizon = 2;
    cfg.encoder.image.kind = ImageEncoderKind::Patches;
    cfg.encoder.image.patch_size = 2;
    cfg.encoder.image.patch_hidden = 16;
    cfg.encoder.image.token_dim = 8;
    cfg.encoder.image.out_dim = 16;
    cfg.encoder.aux_weight = aux_weight;
    cfg
}

fn spec(aux: usize) -> PolicySpec {
    PolicySpec {
        image: Some([3, SIDE, SIDE]),
        aux,
        ..PolicySpec::flat(3, 2)
    }
}

/// `cells.len()` observations of two frames each: a dark frame with one bright 2 x 2 square at
/// `cells[i]` (column, row in squares), after an older frame with its square elsewhere; and
/// the square's centre in the newest frame, in [-1, 1] per axis.
fn frames(cells: &[(usize, usize)]) -> (ObsBatch, Vec<f32>) {
    let mut image = Vec::new();
    let mut target = Vec::new();
    for &(cx, cy) in cells {
        for (fx, fy) in [(3 - cx, 3 - cy), (cx, cy)] {
            for y in 0..SIDE {
                for x in 0..SIDE {
                    let lit = x / 2 == fx && y / 2 == fy;
                    image.extend([if lit { 255 } else { 0 }; 3]);
                }
            }
        }
        target.extend([cx as f32 / 1.5 - 1.0, cy as f32 / 1.5 - 1.0]);
    }
    let obs = ObsBatch {
        batch: cells.len(),
        state: vec![5.0; cells.len() * 2 * 3],
        image: Some(image),
        text: None,
    };
    (obs, target)
}

fn aux_error(policy: &Policy<B>, cells: &[(usize, usize)]) -> f32 {
    let (obs, target) = frames(cells);
    let obs = policy.obs_tensors(&obs, &Default::default()).unwrap();
    let PolicyModel::Diffusion(m) = &policy.model else {
        unreachable!()
    };
    let pred = m.encoder.forward_aux(&obs).1.expect("the head");
    let target =
        Tensor::<B, 2>::from_data(TensorData::new(target, [cells.len(), 2]), &pred.device());
    to_vec((pred - target).square().mean())[0]
}

#[test]
fn the_head_exists_only_when_asked_for() {
    let params = |cfg: PolicyConfig, spec: PolicySpec| {
        let p = Policy::<B>::new(cfg, spec, norm(), 0, &Default::default()).unwrap();
        (p.has_aux_head(), p.model.num_params())
    };
    let (plain, n) = params(config(0.0), spec(0));
    assert!(!plain);
    // A weight without privileged values, or privileged values with weight 0: no head, the
    // same network.
    assert_eq!(params(config(1.0), spec(0)), (false, n));
    assert_eq!(params(config(0.0), spec(2)), (false, n));
    // Both: one linear map from the condition (2 states of 3, 2 frames of 16 features) onto
    // the 2 values.
    assert_eq!(params(config(1.0), spec(2)), (true, n + (6 + 32) * 2 + 2));
    // A state policy gets one too, reading its states.
    let state = PolicySpec {
        aux: 2,
        ..PolicySpec::flat(3, 2)
    };
    assert!(params(config(1.0), state).0);
    // The spec and config of a policy without the head serialise as before the head existed.
    let v = serde_json::to_value(spec(0)).unwrap();
    assert!(v.get("aux").is_none(), "{v}");
    let v = serde_json::to_value(config(0.0)).unwrap();
    assert!(v["encoder"].get("aux_weight").is_none(), "{v}");
    let mut bad = config(-1.0);
    bad.encoder.aux_weight = f64::NAN;
    assert!(Policy::<B>::new(bad, spec(2), norm(), 0, &Default::default()).is_err());
    assert!(Policy::<B>::new(config(-1.0), spec(2), norm(), 0, &Default::default()).is_err());
    // A Gaussian policy has no head to train: the setting is refused, not ignored.
    let mut gaussian = config(1.0);
    gaussian.kind = diffrl_policy::config::PolicyKind::Gaussian;
    let err = Policy::<B>::new(gaussian, spec(2), norm(), 0, &Default::default())
        .map(|_| ())
        .expect_err("refused")
        .to_string();
    assert!(err.contains("aux_weight"), "{err}");
}

#[test]
fn the_head_learns_where_the_square_is_and_survives_a_checkpoint() {
    let device = Default::default();
    let mut policy = Policy::<AD>::new(config(1.0), spec(2), norm(), 0, &device).unwrap();
    let all: Vec<(usize, usize)> = (0..4).flat_map(|y| (0..4).map(move |x| (x, y))).collect();
    let before = aux_error(&policy.valid(), &all);
    let mut optim = AdamWConfig::new().init();
    let mut r = rng(3);
    for _ in 0..150 {
        let cells: Vec<(usize, usize)> = (0..32)
            .map(|_| (r.random_range(0..4), r.random_range(0..4)))
            .collect();
        let (obs, target) = frames(&cells);
        let obs = policy.obs_tensors(&obs, &device).unwrap();
        let aux = Tensor::<AD, 2>::from_data(TensorData::new(target, [32, 2]), &device);
        // Actions that the frames do not tell: only the auxiliary loss says where to look.
        let actions = Tensor::<AD, 3>::zeros([32, 4, 2], &device);
        let loss = policy.bc_loss_aux(&obs, actions, Some(aux), &mut r);
        let grads = GradientsParams::from_grads(loss.backward(), &policy.model);
        policy.model = optim.step(3e-3, policy.model.clone(), grads);
    }
    let policy = policy.valid();
    let after = aux_error(&policy, &all);
    eprintln!("auxiliary error over the 16 cells: {before:.3} -> {after:.3}");
    assert!(after < 0.05 && after < before / 5.0, "{before} -> {after}");
    // The head is part of the checkpoint: a reload predicts the same.
    let dir = tempfile::tempdir().unwrap();
    checkpoint::save(&policy, dir.path(), serde_json::json!({})).unwrap();
    let (back, _) = checkpoint::load::<B>(dir.path(), &device).unwrap();
    assert!(back.has_aux_head());
    assert_eq!(back.spec.aux, 2);
    assert_eq!(aux_error(&back, &all), after);
}
