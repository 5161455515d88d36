//! `diffrl bench pusht`: environment steps per second on one thread, for side-by-side
//! comparison with gym-pusht (tools/bench_pusht.sh runs both with the same workloads).

use std::io::Write;
use std::time::Instant;

use clap::{Args, ValueEnum};
use diffrl_core::Env;
use diffrl_core::seeding;
use diffrl_pusht::{ObsMode, PushT};
use rand::Rng;

/// Which actions drive the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// Uniform random targets in [0, 512]^2 (gym's random policy; little contact).
    Random,
    /// Targets at the block position plus uniform noise of +-20 px (constant pushing).
    Push,
}

/// Arguments of `diffrl bench pusht`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Simulator (only `pusht`).
    pub task: String,
    /// Observation mode: state, keypoints or pixels.
    #[arg(long, default_value = "state")]
    pub obs: ObsMode,
    /// Action workload.
    #[arg(long, value_enum, default_value_t = Workload::Random)]
    pub workload: Workload,
    /// Environment steps to time.
    #[arg(long, default_value_t = 20_000)]
    pub steps: usize,
    /// Seed of resets and actions.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Runs the benchmark and prints one JSON line.
pub fn run(args: &BenchArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.task == "pusht",
        "unknown simulator {:?}; available: pusht",
        args.task
    );
    anyhow::ensure!(args.steps >= 1, "--steps must be at least 1");
    let mut env = PushT::builder().obs(args.obs).build();
    let mut rng = seeding::rng(args.seed);
    let mut episode = 0;
    env.reset(seeding::derive(args.seed, episode));
    let (mut successes, mut resets) = (0usize, 0usize);
    let start = Instant::now();
    for _ in 0..args.steps {
        let a = match args.workload {
            Workload::Random => [rng.random_range(0.0..512.0), rng.random_range(0.0..512.0)],
            Workload::Push => {
                let b = env.block_pose();
                [
                    (b.x + rng.random_range(-20.0..20.0)) as f32,
                    (b.y + rng.random_range(-20.0..20.0)) as f32,
                ]
            }
        };
        let r = env.step(&a)?;
        if r.terminated || r.truncated {
            successes += r.terminated as usize;
            resets += 1;
            episode += 1;
            env.reset(seeding::derive(args.seed, episode));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let obs = format!("{:?}", args.obs).to_lowercase();
    let workload = format!("{:?}", args.workload).to_lowercase();
    writeln!(
        out,
        "{}",
        serde_json::json!({"impl": "diffrl", "obs": obs, "workload": workload, "steps": args.steps, "seconds": secs,
                           "steps_per_s": args.steps as f64 / secs, "resets": resets, "successes": successes})
    )?;
    Ok(())
}
