//! `diffrl pretrain`: behaviour cloning of the configured policy on a LeRobot dataset.

use std::io::Write;

use anyhow::bail;
use diffrl_core::record::Timeline;

use crate::config;
use crate::train::{PretrainArgs, dataset_dir, pretrain};
use crate::viz::Recording;

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
