//! `diffrl pretrain`: behaviour cloning of the configured policy on a LeRobot dataset.

use std::io::Write;
use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use diffrl_core::record::Timeline;

use crate::bc::pretrain;
use crate::config;
use crate::device::DeviceArg;
use crate::envs::dataset_dir;
use crate::viz::Recording;

/// `diffrl pretrain`.
#[derive(Debug, Args)]
pub struct PretrainArgs {
    /// Run config (TOML); without it, the embedded Push-T config.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// LeRobot dataset folder (default: [demos].dataset, else runs/<name>/demos).
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// Output folder (default: runs/<name>/pretrain).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Continue from the output folder's train_state (exactly where it stopped).
    #[arg(long)]
    pub resume: bool,
    /// Override [pretrain].steps.
    #[arg(long)]
    pub steps: Option<usize>,
    /// Start from this policy checkpoint's weights and normalisers instead of a new network
    /// (a fresh optimiser and learning-rate schedule), e.g. a DAgger round on aggregated data.
    #[arg(long, value_name = "POLICY", conflicts_with = "resume")]
    pub init: Option<PathBuf>,
    /// Override [eval].episodes for the final evaluation (0 = skip it).
    #[arg(long)]
    pub eval_episodes: Option<usize>,
    /// Device.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    pub device: DeviceArg,
}

/// `diffrl pretrain`.
pub fn pretrain_cmd(
    args: &PretrainArgs,
    rerun: Option<&diffrl_viz::RerunSink>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let (mut cfg, _) = config::load(args.config.as_deref())?;
    if let Some(s) = args.steps {
        anyhow::ensure!(s >= 1, "--steps must be at least 1");
        cfg.pretrain.steps = s;
    }
    let dataset = dataset_dir(&cfg, args.dataset.as_deref());
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| cfg.run.runs_dir.join(&cfg.run.name).join("pretrain"));
    if !args.resume && out_dir.join("train_state").exists() {
        bail!(
            "{} already holds a training run: pass --resume to continue it, or choose another --out",
            out_dir.display()
        );
    }
    let episodes = args.eval_episodes.unwrap_or(cfg.eval.episodes);
    let recording = Recording::open(
        rerun,
        diffrl_viz::RerunSink::Off,
        "pretrain",
        Timeline::TrainStep,
        out,
    )?;
    if let Some(w) = args.device.sharding_warning(&cfg) {
        writeln!(out, "{w}")?;
    }
    with_device!(args.device, |device, B| {
        pretrain::<B>(
            &cfg,
            &dataset,
            args.init.as_deref(),
            &out_dir,
            args.resume,
            episodes,
            &device,
            out,
            recording.recorder(),
        )
    })?;
    Ok(())
}
