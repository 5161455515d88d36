//! `diffrl eval`: seeded evaluation of a policy checkpoint in the simulator, or through a
//! policy server (--remote), or over a domain-randomisation sweep (--randomize).

use std::io::Write;
use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;
use clap::Args;
use diffrl_core::record::Timeline;
use diffrl_policy::SampleMode;

use crate::config;
use crate::device::DeviceArg;
use crate::envs::load_policy;
use crate::evaluation::{print_report, run_eval, write_report};
use crate::viz::Recording;

/// `diffrl eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Policy checkpoint folder (model.safetensors + policy.json); not needed with --remote.
    #[arg(long, required_unless_present = "remote")]
    pub policy: Option<PathBuf>,
    /// Episodes (default: [eval].episodes).
    #[arg(long)]
    pub episodes: Option<usize>,
    /// Root seed (default: [eval].seed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run config whose [env] and [eval] tables apply.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Where eval.json goes (default: <policy>/../eval.json). With --randomize: the folder
    /// that receives robustness.json, robustness.md and report.md (default: <policy>/..).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Sweep file of domain-randomisation settings (e.g. configs/pusht_randomize.toml): every
    /// setting plays the same seeded episodes; writes a robustness table (success, 95% CI,
    /// mean max score, change against the nominal [env.randomize]).
    #[arg(long, value_name = "FILE.toml")]
    pub randomize: Option<PathBuf>,
    /// Play the episodes through a policy server (`diffrl serve`, or any openpi-protocol
    /// server) instead of loading --policy: the simulator stands in for the robot.
    #[arg(long, value_name = "ws://HOST:PORT", conflicts_with = "randomize")]
    pub remote: Option<String>,
    /// With --remote: the server's API key (also read from DIFFRL_API_KEY).
    #[arg(
        long,
        env = "DIFFRL_API_KEY",
        hide_env_values = true,
        requires = "remote"
    )]
    pub api_key: Option<String>,
    /// With --remote: network round-trip latency to inject per request (ms, wall clock).
    #[arg(long, default_value_t = 0.0, requires = "remote")]
    pub latency_ms: f64,
    /// Control steps between an observation and its actions taking effect (sets
    /// [env.randomize].action_delay to [N, N]; what latency costs a robot at its control rate).
    #[arg(long)]
    pub action_delay: Option<u32>,
    /// Stochastic chains (eta, min std) instead of deterministic DDIM.
    #[arg(long)]
    pub stochastic: bool,
    /// Device.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    pub device: DeviceArg,
}

impl EvalArgs {
    /// The checkpoint folder (clap requires it unless --remote is given).
    pub fn policy_dir(&self) -> &Path {
        self.policy.as_deref().unwrap_or(Path::new(""))
    }
}

/// `diffrl eval`.
pub fn eval_cmd(
    args: &EvalArgs,
    rerun: Option<&diffrl_viz::RerunSink>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    if let Some(sweep) = &args.randomize {
        return crate::commands::robustness::robustness_cmd(args, sweep, rerun, out);
    }
    if let Some(url) = &args.remote {
        crate::viz::ignored(rerun, "eval --remote");
        return crate::commands::serve::remote_eval_cmd(args, url, out);
    }
    let (mut cfg, _) = config::load(args.config.as_deref())?;
    if let Some(d) = args.action_delay {
        config::set_action_delay(&mut cfg, d)?;
    }
    let episodes = args.episodes.unwrap_or(cfg.eval.episodes);
    anyhow::ensure!(episodes >= 1, "--episodes must be at least 1");
    let seed = args.seed.unwrap_or(cfg.eval.seed);
    let mode = if args.stochastic {
        SampleMode::Stochastic
    } else {
        SampleMode::Deterministic
    };
    let recording = Recording::open(
        rerun,
        diffrl_viz::RerunSink::Off,
        "eval",
        Timeline::EnvStep,
        out,
    )?;
    let report = with_device!(args.device, |device, B| {
        let policy =
            load_policy::<<B as AutodiffBackend>::InnerBackend>(&cfg, args.policy_dir(), &device)?;
        run_eval(
            &cfg,
            &policy,
            &device,
            episodes,
            seed,
            mode,
            recording.recorder(),
        )
        .map_err(anyhow::Error::from)
    })?;
    let path = args.out.clone().unwrap_or_else(|| {
        args.policy_dir()
            .parent()
            .map_or_else(|| PathBuf::from("eval.json"), |p| p.join("eval.json"))
    });
    write_report(&path, &report)?;
    print_report(out, &report)?;
    writeln!(out, "wrote {}", path.display())?;
    Ok(())
}
