//! Criterion benches of the tabletop suite, one thread:
//! - `tabletop_step/<task>`: one control step (IK, 10 physics substeps, reward, state
//!   observation) under the scripted expert's actions, resetting when an episode ends (the
//!   reset is included);
//! - `tabletop_step_pixels/<size>`: the same for pick-cube with pixels observations of
//!   `size` x `size` (the camera image rendered every step);
//! - `tabletop_physics/control_step`: the world alone, 10 substeps with a cube in the closed
//!   gripper;
//! - `tabletop_reset/<task>`: one seeded reset (a fresh world).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use diffrl_core::Env;
use diffrl_tabletop::env::{ObsMode, Tabletop, TaskKind};
use diffrl_tabletop::expert::{ExpertConfig, TabletopExpert};

/// Times one control step of `env` driven by the expert, resetting to a new seed whenever an
/// episode ends.
fn expert_steps(b: &mut criterion::Bencher, mut env: Tabletop) {
    let mut expert = TabletopExpert::new(ExpertConfig::default(), 0);
    let mut episode = 0u64;
    b.iter(|| {
        let a = expert.act(&env);
        let r = env.step(&a).unwrap();
        if r.terminated || r.truncated {
            episode += 1;
            env.reset(episode);
        }
        r.reward
    });
}

fn step(c: &mut Criterion) {
    let mut g = c.benchmark_group("tabletop_step");
    g.throughput(Throughput::Elements(1));
    for kind in TaskKind::ALL {
        g.bench_function(BenchmarkId::from_parameter(kind.name()), |b| {
            expert_steps(b, Tabletop::builder().kind(kind).build().unwrap());
        });
    }
    g.finish();
}

fn step_pixels(c: &mut Criterion) {
    let mut g = c.benchmark_group("tabletop_step_pixels");
    g.throughput(Throughput::Elements(1));
    for size in [64, 128] {
        g.bench_function(BenchmarkId::from_parameter(size), |b| {
            let env = Tabletop::builder()
                .kind(TaskKind::PickCube)
                .obs(ObsMode::Pixels)
                .image_size(size)
                .build()
                .unwrap();
            expert_steps(b, env);
        });
    }
    g.finish();
}

fn physics(c: &mut Criterion) {
    let mut g = c.benchmark_group("tabletop_physics");
    g.throughput(Throughput::Elements(1));
    g.bench_function("control_step", |b| {
        // Hold a lifted cube: the expert runs until it lifts, then the arm holds still.
        let mut env = Tabletop::builder()
            .kind(TaskKind::PickCube)
            .build()
            .unwrap();
        env.reset(2);
        let mut expert = TabletopExpert::new(ExpertConfig::default(), 0);
        for _ in 0..25 {
            let a = expert.act(&env);
            env.advance(a);
        }
        b.iter(|| env.advance([0.0, 0.0, 0.0, -1.0]));
    });
    g.finish();
}

fn reset(c: &mut Criterion) {
    let mut g = c.benchmark_group("tabletop_reset");
    for kind in [TaskKind::PickCube, TaskKind::StackCube] {
        g.bench_function(BenchmarkId::from_parameter(kind.name()), |b| {
            let mut env = Tabletop::builder().kind(kind).build().unwrap();
            let mut seed = 0u64;
            b.iter(|| {
                seed += 1;
                env.reset(seed)
            });
        });
    }
    g.finish();
}

criterion_group!(benches, step, step_pixels, physics, reset);
criterion_main!(benches);
