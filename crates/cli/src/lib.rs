//! The `diffrl` command-line tool. `main.rs` is a thin wrapper around [`run_cli`] so tests can
//! drive every subcommand in-process.
//!
//! What lives where: this file parses the command line and dispatches. [`commands`] holds one
//! module per subcommand (`eval`, `pretrain`, `demos`, `dagger`, `grpo`/`ppo` in `finetune`,
//! `reward`, `serve`, `sim`, `bench`, `eval --randomize` in `robustness`); [`pipeline`] is
//! `diffrl run` (stages, stage cache, report), [`plots`] holds `plot` and the PNG drawing the
//! pipeline shares, [`viz`] holds `view` and opening a recording. Shared machinery sits below
//! them, one job per module: [`config`] (the run config), [`tasks`] (the one file naming
//! concrete tasks, and the shipped dataset), [`device`] (`--device`), [`envs`] (the configured
//! environment: policy spec, vectors of worlds, dataset folder), [`bc`] (behaviour cloning),
//! [`evaluation`] (seeded evaluation and eval.json reports) and [`progress`] (progress bars,
//! metrics.jsonl). Statistics are `diffrl_core::stats`; the train_step offset between phases
//! is `diffrl_core::record::TrainStepOffset`. Imports point down this list, never back: a
//! command may use shared machinery and another command's library functions, the shared
//! modules import no command.
#![warn(missing_docs)]

/// Runs `$body` with `$B` bound to the autodiff backend of `$dev` and `$device` to its device.
macro_rules! with_device {
    ($dev:expr, |$device:ident, $B:ident| $body:expr) => {
        match $dev {
            $crate::device::DeviceArg::Cpu => {
                type $B = diffrl_policy::CpuAutodiff;
                let $device: burn::tensor::Device<$B> = Default::default();
                $body
            }
            $crate::device::DeviceArg::Cuda => {
                #[cfg(feature = "cuda")]
                {
                    match $crate::device::cuda_ready() {
                        Err(e) => Err(e),
                        Ok(()) => {
                            type $B = burn::backend::Autodiff<burn::backend::Cuda>;
                            let $device: burn::tensor::Device<$B> = Default::default();
                            $body
                        }
                    }
                }
                #[cfg(not(feature = "cuda"))]
                {
                    Err(anyhow::anyhow!(
                        "--device cuda: this diffrl was built without CUDA; rebuild with \
                         `cargo build --release -p diffrl-cli --features cuda`"
                    ))
                }
            }
        }
    };
}

pub mod bc;
pub mod commands;
pub mod config;
pub mod device;
pub mod envs;
pub mod evaluation;
pub mod pipeline;
pub mod plots;
pub mod progress;
pub mod tasks;
pub mod viz;

use commands::{bench, dagger, demos, finetune, reward, serve, sim};

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// diffrl: diffusion policies, reward models and GRPO for robot manipulation, on Rapier.
#[derive(Debug, Parser)]
#[command(name = "diffrl", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// Where to record for the Rerun Viewer (`pip install rerun-sdk==0.36.3`): off, spawn,
    /// save=PATH, connect[=URL] (rerun+http://HOST:PORT/proxy or HOST:PORT) or
    /// serve[=[HOST:]PORT] (binds 127.0.0.1 unless HOST is given). Default: off (`diffrl run`:
    /// save to the run folder). Entity paths: docs/viz.md.
    #[arg(long, global = true, value_name = "SINK")]
    pub rerun: Option<diffrl_viz::RerunSink>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The main job: demos (or the shipped dataset) -> behaviour cloning -> progress reward
    /// model -> GRPO -> evaluation of both policies, into runs/<name>/ with report.md,
    /// summary.json, plots/ and recording.rrd. Stages whose outputs exist are reused, so an
    /// interrupted run resumes.
    Run(pipeline::RunArgs),
    /// Record expert demonstrations as a LeRobot v3.0 dataset folder.
    Demos {
        /// Task (`pusht`; crates/cli/src/tasks.rs lists them).
        task: String,
        /// Number of episodes.
        #[arg(long, default_value_t = 200)]
        episodes: usize,
        /// Root seed; episode i starts from a seed derived from (seed, i).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Output folder (must not exist or be empty, unless --overwrite).
        #[arg(long)]
        out: PathBuf,
        /// Replace an existing dataset at --out.
        #[arg(long)]
        overwrite: bool,
        /// Worker threads (0 = one per core).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Keep only successful episodes.
        #[arg(long)]
        only_successful: bool,
        /// Which expert acts: sets the config's [expert].kind (Push-T: `pusher`, the default,
        /// or `mppi`).
        #[arg(long, value_name = "KIND")]
        expert: Option<String>,
        /// DART noise: standard deviation (px) added to executed actions; labels stay the
        /// expert's (default: the config's [demos].noise_px).
        #[arg(long, value_name = "PX")]
        noise: Option<f64>,
        /// Run config whose [env], [expert] and [demos] tables apply (default: the task's own).
        #[arg(long)]
        config: Option<PathBuf>,
        /// DAgger: roll out this policy checkpoint instead of the expert and record the
        /// expert's label at every state it visits (episodes seeded like `diffrl eval`'s from
        /// --seed, [eval].envs environments).
        #[arg(long, value_name = "POLICY")]
        dagger: Option<PathBuf>,
        /// With --dagger: a dataset whose episodes come first in --out (aggregation).
        #[arg(long, value_name = "DATASET", requires = "dagger")]
        base: Option<PathBuf>,
        /// With --dagger: probability per step of executing the expert's label instead of the
        /// policy's action (DAgger's mixture; 0 = the policy alone).
        #[arg(long, default_value_t = 0.0, requires = "dagger")]
        beta: f64,
        /// With --dagger: stochastic chains instead of deterministic DDIM.
        #[arg(long, requires = "dagger")]
        stochastic: bool,
    },
    /// Step a simulator from a chosen start with given actions or the expert; print each step.
    Sim(sim::SimArgs),
    /// Time a simulator's steps on one thread, a policy, the VLA network or the server
    /// (tools/bench_pusht.sh, bench_policy.sh and bench_vla.sh compare with peers).
    Bench(bench::BenchArgs),
    /// Behaviour cloning of the configured policy on a LeRobot dataset folder.
    Pretrain(commands::pretrain::PretrainArgs),
    /// Fine-tune a pretrained policy with GRPO over its denoising chains ([grpo], [reward]).
    Grpo(finetune::FinetuneArgs),
    /// Fine-tune with the DPPO-style PPO baseline (learned critic, GAE; same [grpo] table).
    Ppo(finetune::FinetuneArgs),
    /// Evaluate a policy checkpoint on seeded episodes; writes eval.json.
    Eval(commands::eval::EvalArgs),
    /// Serve a policy checkpoint over websockets with openpi-client's protocol.
    Serve(serve::ServeArgs),
    /// Progress reward models: `train` on demonstrations, `eval` their metrics.
    #[command(subcommand)]
    Reward(reward::RewardCommand),
    /// Learning curves of fine-tuning runs against environment steps, one line per arm averaged
    /// over its runs (seeds): `diffrl plot --out curves.png grpo=runs/a,runs/b shaped=runs/c`.
    Plot(plots::PlotArgs),
    /// Open a recording in the Rerun Viewer: a run folder (its recording.rrd) or an .rrd file.
    View(viz::ViewArgs),
    /// Read a LeRobot dataset folder and print its summary (checks it end to end).
    Inspect {
        /// Dataset folder.
        dataset: PathBuf,
    },
}

/// Parses `args` (including the program name) and runs the command; output goes to `out`.
pub fn run_cli<I, T>(args: I, out: &mut dyn Write) -> anyhow::Result<()>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = Cli::try_parse_from(args)?;
    let rerun = cli.rerun.as_ref();
    match cli.command {
        Command::Run(args) => pipeline::run(&args, rerun, out),
        Command::Demos {
            task,
            episodes,
            seed,
            out: dir,
            overwrite,
            threads,
            only_successful,
            expert,
            noise,
            config,
            dagger,
            base,
            beta,
            stochastic,
        } => {
            anyhow::ensure!(episodes >= 1, "--episodes must be at least 1");
            viz::ignored(rerun, "demos");
            let (mut cfg, _) = config::load_for(&task, config.as_deref())?;
            if let Some(kind) = &expert {
                let mut patch = toml::Table::new();
                patch.insert("kind".into(), toml::Value::String(kind.clone()));
                cfg.expert = cfg
                    .expert
                    .patched(&patch)
                    .map_err(|i| anyhow::anyhow!("--expert {kind}: {}", i.message))?;
            }
            let noise_px = noise.unwrap_or(cfg.demos.noise_px);
            anyhow::ensure!(
                noise_px.is_finite() && noise_px >= 0.0,
                "--noise must be a finite number of pixels >= 0, got {noise_px}"
            );
            if let Some(policy) = dagger {
                cfg.run.threads = threads;
                let args = dagger::DaggerArgs {
                    policy,
                    base,
                    beta,
                    stochastic,
                    episodes,
                    seed,
                };
                return dagger::dagger_cmd(&cfg, &args, &dir, overwrite, out);
            }
            let (eps, summary) =
                demos::generate(&cfg.env, &cfg.expert, noise_px, episodes, seed, threads)?;
            writeln!(out, "{summary}")?;
            let kind = cfg.expert.table().get("kind").and_then(|k| k.as_str());
            let command = format!(
                "diffrl demos {task} --episodes {episodes} --seed {seed}{} --noise {noise_px}{}",
                kind.map_or(String::new(), |k| format!(" --expert {k}")),
                if only_successful {
                    " --only-successful"
                } else {
                    ""
                }
            );
            let provenance = serde_json::json!({"command": command, "seed": seed, "env": cfg.env, "expert": cfg.expert, "noise_px": noise_px, "diffrl_version": env!("CARGO_PKG_VERSION")});
            let written = demos::write(
                &cfg.env,
                &dir,
                &eps,
                &summary,
                provenance,
                only_successful,
                overwrite,
            )?;
            writeln!(out, "wrote {written} episodes to {}", dir.display())?;
            Ok(())
        }
        Command::Sim(args) => sim::run(&args, rerun, out),
        Command::Pretrain(args) => commands::pretrain::pretrain_cmd(&args, rerun, out),
        Command::Eval(args) => commands::eval::eval_cmd(&args, rerun, out),
        Command::Serve(args) => {
            viz::ignored(rerun, "serve");
            serve::serve_cmd(&args, out)
        }
        Command::Reward(cmd) => reward::run(&cmd, rerun, out),
        Command::Grpo(args) => {
            finetune::finetune_cmd(&args, diffrl_learn::grpo::Algorithm::Grpo, rerun, out)
        }
        Command::Ppo(args) => {
            finetune::finetune_cmd(&args, diffrl_learn::grpo::Algorithm::Ppo, rerun, out)
        }
        Command::Bench(args) => {
            viz::ignored(rerun, "bench");
            bench::run(&args, out)
        }
        Command::Plot(args) => plots::plot_cmd(&args, out),
        Command::View(args) => viz::view_cmd(&args, out),
        Command::Inspect { dataset } => {
            viz::ignored(rerun, "inspect");
            let ds = diffrl_core::lerobot::read_dataset(&dataset)?;
            let eps = ds.episodes("observation.state")?;
            let summary = demos::summarize(&eps, 0.0);
            writeln!(
                out,
                "{}: {} frames, {} episodes at {} fps; features {:?}",
                dataset.display(),
                ds.len(),
                eps.len(),
                ds.fps,
                ds.columns.keys().collect::<Vec<_>>()
            )?;
            writeln!(
                out,
                "success {:.1}% (95% CI {:.1}-{:.1}%), mean max reward {:.3}, mean length {:.1}, \
                 action jumps median {:.1} (p90 {:.1})",
                100.0 * summary.success_rate,
                100.0 * summary.success_ci95[0],
                100.0 * summary.success_ci95[1],
                summary.mean_max_reward,
                summary.mean_length,
                summary.action_jump_median,
                summary.action_jump_p90
            )?;
            Ok(())
        }
    }
}
