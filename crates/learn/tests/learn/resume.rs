//! An interrupted behaviour-cloning run resumed from its checkpoint ends with exactly the
//! weights of an uninterrupted run.

use std::cell::Cell;
use std::path::Path;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use diffrl_core::episode::Episode;
use diffrl_core::seeding::rng;
use diffrl_core::space::Observation;
use diffrl_learn::bc::{BcConfig, BcHooks, train};
use diffrl_learn::data::{ChunkDataset, fit_normalizers};
use diffrl_policy::checkpoint;
use diffrl_policy::config::{DenoiserConfig, DiffusionConfig, PolicyConfig};
use diffrl_policy::{CpuAutodiff, CpuBackend, Policy, PolicySpec};
use rand::Rng as _;

struct StopAt {
    calls: Cell<usize>,
    at: usize,
}

impl BcHooks<CpuBackend> for StopAt {
    fn should_stop(&self) -> bool {
        self.calls.set(self.calls.get() + 1);
        self.calls.get() == self.at
    }
}

fn episodes() -> Vec<Episode> {
    let mut r = rng(3);
    (0..4)
        .map(|_| {
            let mut e = Episode::default();
            for _ in 0..25 {
                let s: Vec<f32> = (0..3).map(|_| r.random_range(0.0..10.0)).collect();
                let a = vec![s[0] + s[1], s[2] * 2.0];
                e.push(Observation::state(s), a, 0.0, 0.0, false);
            }
            e
        })
        .collect()
}

fn run(out: &Path, stop_at: usize, resume: bool) -> usize {
    let eps = episodes();
    let norm = fit_normalizers(&eps).unwrap();
    let cfg = PolicyConfig {
        pred_horizon: 4,
        action_horizon: 2,
        denoiser: DenoiserConfig {
            hidden: 16,
            blocks: 1,
            step_embed_dim: 8,
            ..DenoiserConfig::default()
        },
        diffusion: DiffusionConfig {
            train_steps: 10,
            denoising_steps: 5,
            ..DiffusionConfig::default()
        },
        ..PolicyConfig::default()
    };
    let device = Default::default();
    let spec = PolicySpec::flat(3, 2);
    let policy = Policy::<CpuAutodiff>::new(cfg.clone(), spec, norm, 0, &device).unwrap();
    let data = ChunkDataset::build(&eps, cfg.obs_horizon, cfg.pred_horizon, &policy.norm).unwrap();
    let bc = BcConfig {
        steps: 30,
        batch_size: 16,
        warmup_steps: 5,
        eval_every: 0,
        checkpoint_every: 10,
        log_every: 10,
        ..BcConfig::default()
    };
    let mut hooks = StopAt {
        calls: Cell::new(0),
        at: stop_at,
    };
    train(policy, &data, &bc, 7, out, resume, &mut hooks)
        .unwrap()
        .steps
}

#[test]
fn interrupted_and_resumed_equals_uninterrupted() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    assert_eq!(run(&a, usize::MAX, false), 30);
    assert_eq!(run(&b, 13, false), 13, "stopped after 13 steps");
    let device = Default::default();
    let partial = flat(
        &checkpoint::load::<CpuBackend>(&b.join("policy"), &device)
            .unwrap()
            .0
            .model,
    );
    assert_eq!(run(&b, usize::MAX, true), 30, "resumed to the end");
    let (pa, _) = checkpoint::load::<CpuBackend>(&a.join("policy"), &device).unwrap();
    let (pb, _) = checkpoint::load::<CpuBackend>(&b.join("policy"), &device).unwrap();
    let (wa, wb) = (flat(&pa.model), flat(&pb.model));
    assert!(wa.len() > 100);
    let diff = wa
        .iter()
        .zip(&wb)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert_eq!(
        diff, 0.0,
        "EMA weights differ by up to {diff} after resuming"
    );
    assert_ne!(
        partial, wa,
        "the interrupted state must differ from the finished one"
    );
}

/// Every float parameter, flattened in visit order.
fn flat<M: Module<CpuBackend>>(m: &M) -> Vec<f32> {
    struct Flat(Vec<f32>);
    impl ModuleVisitor<CpuBackend> for Flat {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<CpuBackend, D>>) {
            self.0.extend(
                p.val()
                    .into_data()
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .unwrap(),
            );
        }
    }
    let mut f = Flat(Vec::new());
    m.visit(&mut f);
    f.0
}
