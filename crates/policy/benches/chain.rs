//! Criterion benches of the default residual-MLP diffusion policy at Diffusion Policy's horizons
//! (To 2, Tp 16, Ta 8; Push-T state dimensions): one K = 10 chain with log-probs at batch 1 and 64, one BC training step at batch 256.
//! tools/bench_policy.sh compares the same network against PyTorch side by side.

use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::{Tensor, TensorData};
use criterion::{Criterion, criterion_group, criterion_main};
use diffrl_core::normalize::Normalizer;
use diffrl_core::seeding::rng;
use diffrl_policy::encoder::ObsTensors;
use diffrl_policy::{
    CpuAutodiff, CpuBackend, Normalizers, ObsBatch, Policy, PolicyConfig, PolicySpec, SampleMode,
};
use rand::Rng as _;

fn setup() -> (PolicyConfig, PolicySpec, Normalizers) {
    let spec = PolicySpec::flat(5, 2);
    let mm = |d| Normalizer::MinMax {
        min: vec![0.0; d],
        max: vec![512.0; d],
    };
    let norm = Normalizers {
        state: mm(5),
        action: mm(2),
    };
    (
        PolicyConfig {
            obs_horizon: 2,
            pred_horizon: 16,
            action_horizon: 8,
            ..PolicyConfig::default()
        },
        spec,
        norm,
    )
}

fn chain(c: &mut Criterion) {
    let (cfg, spec, norm) = setup();
    let device = Default::default();
    let policy = Policy::<CpuBackend>::new(cfg, spec, norm, 0, &device).unwrap();
    let mut r = rng(0);
    for b in [1usize, 64] {
        let obs = ObsBatch {
            batch: b,
            state: (0..b * 10).map(|_| r.random_range(0.0..512.0)).collect(),
            image: None,
            text: None,
        };
        c.bench_function(&format!("chain_k10_b{b}"), |bench| {
            bench.iter(|| {
                let act = policy
                    .act(None, &obs, SampleMode::Stochastic, true, &mut r, &device)
                    .unwrap();
                act.sample.logp.map(|l| l.into_data())
            })
        });
    }
}

fn train_step(c: &mut Criterion) {
    let (cfg, spec, norm) = setup();
    let device = Default::default();
    let mut policy = Policy::<CpuAutodiff>::new(cfg, spec, norm, 0, &device).unwrap();
    let mut optim = AdamWConfig::new().init();
    let mut r = rng(1);
    let b = 256;
    c.bench_function("bc_step_b256", |bench| {
        bench.iter(|| {
            let o: Vec<f32> = (0..b * 10).map(|_| r.random_range(-1.0..1.0)).collect();
            let a: Vec<f32> = (0..b * 32).map(|_| r.random_range(-1.0..1.0)).collect();
            let obs = ObsTensors {
                state: Tensor::from_data(TensorData::new(o, [b, 2, 5]), &device),
                image: None,
                text: None,
            };
            let actions = Tensor::from_data(TensorData::new(a, [b, 16, 2]), &device);
            let loss = policy.bc_loss(&obs, actions, &mut r);
            let grads = GradientsParams::from_grads(loss.backward(), &policy.model);
            policy.model = optim.step(1e-4, policy.model.clone(), grads);
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = chain, train_step
}
criterion_main!(benches);
