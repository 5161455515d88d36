//! Criterion benches: one Push-T control step (state and pixel observations, free motion and
//! pushing) and a VecEnv of 8 worlds on 1 and 2 threads.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use diffrl_core::{AutoReset, Env, VecEnv};
use diffrl_pusht::{ObsMode, PushT};

/// Targets that keep the agent pushing the block (constant contact).
fn push_target(env: &PushT, t: usize) -> [f32; 2] {
    let b = env.block_pose();
    let wiggle = ((t % 7) as f64 - 3.0) * 5.0;
    [(b.x + wiggle) as f32, (b.y - wiggle) as f32]
}

fn step(c: &mut Criterion) {
    let mut g = c.benchmark_group("pusht_step");
    g.throughput(Throughput::Elements(1));
    for obs in [ObsMode::State, ObsMode::Pixels] {
        for pushing in [false, true] {
            let name = format!("{obs:?}/{}", if pushing { "push" } else { "free" }).to_lowercase();
            g.bench_function(BenchmarkId::from_parameter(name), |b| {
                let mut env = PushT::builder()
                    .obs(obs)
                    .max_episode_steps(usize::MAX)
                    .build();
                env.reset_to_state([100.0, 100.0, 250.0, 300.0, 0.3], 0)
                    .unwrap();
                let mut t = 0usize;
                b.iter(|| {
                    t += 1;
                    let a = if pushing {
                        push_target(&env, t)
                    } else {
                        [100.0 + (t % 50) as f32 * 4.0, 100.0]
                    };
                    let r = env.step(&a).unwrap();
                    if r.terminated || r.truncated {
                        env.reset(t as u64);
                    }
                    r.reward
                })
            });
        }
    }
    g.finish();
}

fn vec_env(c: &mut Criterion) {
    let mut g = c.benchmark_group("pusht_vec_env_8");
    g.throughput(Throughput::Elements(8));
    for threads in [1usize, 2] {
        g.bench_function(BenchmarkId::new("threads", threads), |b| {
            let envs = (0..8).map(|_| PushT::builder().build()).collect();
            let mut v = VecEnv::new(envs, AutoReset::SameStep, threads);
            v.reset(0);
            let mut t = 0usize;
            b.iter(|| {
                t += 1;
                let actions: Vec<Vec<f32>> = (0..8)
                    .map(|i| vec![200.0 + ((t + i) % 9) as f32 * 10.0, 250.0])
                    .collect();
                v.step(&actions).unwrap().rewards[0]
            })
        });
    }
    g.finish();
}

criterion_group!(benches, step, vec_env);
criterion_main!(benches);
