//! Occlusion saliency: a pixel policy cloned on images where one square alone tells the action
//! looks at that square; bad requests get errors that say what is wrong.

use crate::common;

use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::{Tensor, TensorData};
use common::*;
use diffrl_core::seeding::rng;
use diffrl_policy::config::ImageEncoderKind;
use diffrl_policy::{ObsBatch, Policy, PolicySpec};
use rand::Rng as _;

const SIDE: usize = 8;
const SQUARE: usize = 4;

/// A policy with the patch encoder over 8 x 8 RGB frames in 4 x 4 patches, one frame of history.
fn pixel_policy<Bk: burn::tensor::backend::Backend>() -> Policy<Bk> {
    let mut cfg = tiny_config(4);
    cfg.obs_horizon = 1;
    cfg.encoder.image.kind = ImageEncoderKind::Patches;
    cfg.encoder.image.patch_size = SQUARE;
    cfg.encoder.image.patch_hidden = 16;
    cfg.encoder.image.token_dim = 8;
    cfg.encoder.image.out_dim = 8;
    let spec = PolicySpec {
        image: Some([3, SIDE, SIDE]),
        ..PolicySpec::flat(3, 2)
    };
    Policy::new(cfg, spec, norm(), 0, &Default::default()).unwrap()
}

/// `b` observations: random pixels, except the top-left square, uniformly grey at `levels[i]`.
fn frames(levels: &[u8], r: &mut diffrl_core::seeding::Rng) -> ObsBatch {
    let mut image = Vec::with_capacity(levels.len() * SIDE * SIDE * 3);
    for &level in levels {
        for y in 0..SIDE {
            for x in 0..SIDE {
                let v = if y < SQUARE && x < SQUARE {
                    level
                } else {
                    r.random()
                };
                image.extend([v; 3]);
            }
        }
    }
    ObsBatch {
        batch: levels.len(),
        state: vec![5.0; levels.len() * 3],
        image: Some(image),
        text: None,
    }
}

#[test]
fn occlusion_saliency_finds_the_square_that_tells_the_action() {
    let device = Default::default();
    let mut policy = pixel_policy::<AD>();
    let mut optim = AdamWConfig::new().init();
    let mut r = rng(1);
    // Every action of the chunk is the top-left square's grey level (normalised to [-1, 1]).
    for _ in 0..300 {
        let levels: Vec<u8> = (0..32).map(|_| r.random()).collect();
        let obs = policy
            .obs_tensors(&frames(&levels, &mut r), &device)
            .unwrap();
        let target: Vec<f32> = levels
            .iter()
            .flat_map(|&l| [f32::from(l) / 127.5 - 1.0; 4 * 2])
            .collect();
        let actions = Tensor::<AD, 3>::from_data(TensorData::new(target, [32, 4, 2]), &device);
        let loss = policy.bc_loss(&obs, actions, &mut r);
        let grads = GradientsParams::from_grads(loss.backward(), &policy.model);
        policy.model = optim.step(3e-3, policy.model.clone(), grads);
    }
    let policy = policy.valid();
    let s = policy
        .occlusion_saliency(&frames(&[230], &mut rng(9)), 0, SQUARE, 0, &device)
        .unwrap();
    assert_eq!(
        (s.rows, s.cols, s.square, s.values.len()),
        (2, 2, SQUARE, 4)
    );
    let others = s.values[1..].iter().copied().fold(0.0f32, f32::max);
    eprintln!("saliency per square: {:?}", s.values);
    assert!(s.values[0] > 3.0 * others, "{:?}", s.values);
    // The same call gives the same map (its own fixed noise, deterministic chains).
    let again = policy
        .occlusion_saliency(&frames(&[230], &mut rng(9)), 0, SQUARE, 0, &device)
        .unwrap();
    assert_eq!(again, s);
}

#[test]
fn saliency_of_a_policy_without_images_or_of_a_bad_request_is_refused() {
    let device = Default::default();
    let flat = Policy::<B>::new(tiny_config(3), spec(), norm(), 0, &device).unwrap();
    let e = flat
        .occlusion_saliency(&obs(1), 0, 4, 0, &device)
        .unwrap_err();
    assert!(e.to_string().contains("reads images"), "{e}");
    let p = pixel_policy::<B>();
    let o = frames(&[10, 20], &mut rng(0));
    let e = p.occlusion_saliency(&o, 2, 4, 0, &device).unwrap_err();
    assert!(e.to_string().contains("saliency row"), "{e}");
    let e = p.occlusion_saliency(&o, 0, 0, 0, &device).unwrap_err();
    assert!(e.to_string().contains("square side"), "{e}");
    let mut short = o.clone();
    short.image.as_mut().unwrap().pop();
    let e = p.occlusion_saliency(&short, 0, 4, 0, &device).unwrap_err();
    assert!(e.to_string().contains("observation.image"), "{e}");
    let mut short = o.clone();
    short.state.pop();
    let e = p.occlusion_saliency(&short, 1, 4, 0, &device).unwrap_err();
    assert!(e.to_string().contains("observation.state"), "{e}");
    // Row 1 of a two-row batch: a map of 2 x 2 squares.
    assert_eq!(
        p.occlusion_saliency(&o, 1, 4, 0, &device)
            .unwrap()
            .values
            .len(),
        4
    );
}
