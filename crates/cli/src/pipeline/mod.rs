//! `diffrl run`: the main job. Five stages run in order into one run folder: demos (or the
//! shipped dataset), behaviour cloning, the progress reward model, GRPO fine-tuning, and the
//! evaluation of both policies on the same seeded episodes; then report.md, summary.json and
//! the learning-curve PNGs.
//!
//! Every stage folder holds `fingerprint.json` (its settings, the fingerprints of the stages
//! it reads from, and content hashes of the folders it reads that no stage fingerprints) and, once
//! complete, `stage.json` (the same fingerprint, its wall time and results). A complete stage
//! with the same settings is reused; an incomplete one with the same settings resumes from its
//! checkpoint; one whose settings changed is started over, except GRPO when only `[grpo]
//! iterations` was raised: it goes on from its saved state. So an interrupted `diffrl run`
//! continues where it stopped, and a finished one can be fine-tuned for longer.

//! Files: this one parses `diffrl run`'s overrides, guards an existing run folder and calls the
//! stages; `stages.rs` runs the five stages; `cache.rs` decides per stage folder whether to reuse,
//! resume or start over; `report.rs` writes report.md, summary.json and the plots.

mod cache;
mod report;
mod stages;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use diffrl_core::record::Timeline;
use diffrl_core::run_dir::RunDir;
use diffrl_learn::grpo::Algorithm;
use serde_json::json;

use crate::config::{self, RunConfig};
use crate::device::DeviceArg;
use crate::viz::Recording;
use report::{finish, summary_json};
use stages::stages;
pub(crate) use stages::{own_progress_model, progress_model_dir};

/// `diffrl run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Run config (TOML). Without it, the embedded Push-T config (configs/pusht.toml).
    pub config: Option<PathBuf>,
    /// Override [run].name (the folder under [run].runs_dir).
    #[arg(long)]
    pub name: Option<String>,
    /// The run folder itself (instead of [run].runs_dir/[run].name).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Override [demos].episodes (when demos are recorded rather than read from a dataset).
    #[arg(long)]
    pub episodes: Option<usize>,
    /// Override [run].finetune: the fine-tuning stage's learner, grpo or ppo (PPO: a learned
    /// critic and GAE on the same [grpo] table; docs/run.md compares them).
    #[arg(long, value_parser = parse_learner)]
    pub finetune: Option<Algorithm>,
    /// Smoke-test preset (a few minutes on 2 cores): short behaviour cloning, reward model
    /// and GRPO, 20 evaluation episodes; the run folder gets a `-quick` suffix.
    #[arg(long)]
    pub quick: bool,
    /// Delete an existing run folder (one with a config.toml) and start over.
    #[arg(long, conflicts_with = "resume")]
    pub force: bool,
    /// Continue a run folder whose config differs: stages whose settings did not change are
    /// kept, the others are redone (GRPO with only `[grpo] iterations` raised goes on from
    /// where it stopped).
    #[arg(long)]
    pub resume: bool,
    /// Device for training and evaluation.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    pub device: DeviceArg,
}

const STAGES: usize = 5;

/// `--finetune`: a learner as `[run] finetune` spells it.
fn parse_learner(s: &str) -> Result<Algorithm, String> {
    serde_json::from_value(serde_json::Value::String(s.into()))
        .map_err(|_| format!("unknown learner {s:?}; available: grpo, ppo"))
}

/// Applies the `--quick` preset.
pub fn quick_preset(cfg: &mut RunConfig) {
    cfg.demos.episodes = cfg.demos.episodes.min(20);
    cfg.pretrain.steps = 1500;
    cfg.pretrain.warmup_steps = 100;
    cfg.pretrain.eval_every = 0;
    cfg.pretrain.checkpoint_every = 500;
    cfg.dagger.episodes = cfg.dagger.episodes.min(4);
    cfg.dagger.steps = cfg.dagger.steps.min(200);
    cfg.reward.progress.steps = 300;
    cfg.reward.vs_policy_episodes = cfg.reward.vs_policy_episodes.min(20);
    cfg.grpo.iterations = 2;
    cfg.grpo.groups = 4;
    cfg.grpo.group_size = 4;
    cfg.grpo.ft_denoising_steps = 2;
    cfg.grpo.eval_every = 0;
    cfg.eval.episodes = 20;
}

/// Runs the pipeline.
pub fn run(
    args: &RunArgs,
    rerun: Option<&diffrl_viz::RerunSink>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let t_all = Instant::now();
    let (mut cfg, _) = config::load(args.config.as_deref())?;
    if let Some(n) = &args.name {
        anyhow::ensure!(
            !n.is_empty() && !n.contains(['/', '\\']),
            "--name must be a plain folder name, got {n:?}"
        );
        cfg.run.name = n.clone();
    }
    if let Some(e) = args.episodes {
        anyhow::ensure!(e >= 1, "--episodes must be at least 1");
        cfg.demos.episodes = e;
    }
    if let Some(f) = args.finetune {
        cfg.run.finetune = f;
    }
    if args.quick {
        quick_preset(&mut cfg);
        if args.name.is_none() {
            cfg.run.name = format!("{}-quick", cfg.run.name);
        }
    }
    if let Some(dir) = &args.out {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| *n != "." && *n != "..")
            .with_context(|| format!("--out {}: needs a folder name", dir.display()))?;
        cfg.run.name = name.to_string();
        cfg.run.runs_dir = dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    }
    let root = cfg.run.runs_dir.join(&cfg.run.name);
    // The resolved config (overrides applied) is what the run folder records.
    let resolved = toml::to_string(&cfg).context("writing the resolved config")?;
    check_existing(&root, &cfg, &resolved, args, out)?;
    let mut run = RunDir::open(&cfg.run.runs_dir, &cfg.run.name, &resolved)
        .with_context(|| format!("creating the run folder {}", root.display()))?;
    writeln!(out, "run folder: {}", root.display())?;
    let recording = Recording::open(
        rerun,
        default_recording(&root),
        "run",
        Timeline::TrainStep,
        out,
    )?;
    let rec = recording.recorder();
    if let Some(w) = args.device.sharding_warning(&cfg) {
        writeln!(out, "{w}")?;
    }
    let result = with_device!(args.device, |device, B| {
        stages::<B>(&cfg, &mut run, rec, &device, out)
    })?;
    let total = t_all.elapsed().as_secs_f64();
    finish(&cfg, &root, &result, total, args.quick, out)?;
    run.log(&json!({"stage": "done", "summary": summary_json(&result, total, args.quick)}))?;
    Ok(())
}

/// Refuses to overwrite a run made with another config unless told how.
fn check_existing(
    root: &Path,
    cfg: &RunConfig,
    resolved: &str,
    args: &RunArgs,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let cfg_path = root.join("config.toml");
    if !root.exists() {
        return Ok(());
    }
    let nonempty = std::fs::read_dir(root)
        .with_context(|| format!("reading {}", root.display()))?
        .next()
        .is_some();
    if !cfg_path.exists() {
        if nonempty {
            bail!(
                "{} exists, is not empty and is not a diffrl run folder (no config.toml); \
                 choose another --out or --name",
                root.display()
            );
        }
        return Ok(());
    }
    let old = std::fs::read_to_string(&cfg_path)
        .with_context(|| format!("reading {}", cfg_path.display()))?;
    if args.force {
        writeln!(
            out,
            "--force: deleting {} and starting over",
            root.display()
        )?;
        std::fs::remove_dir_all(root).with_context(|| format!("deleting {}", root.display()))?;
        return Ok(());
    }
    // Equal as configs: settings added since the run was made read as their defaults.
    if old == resolved || toml::from_str::<RunConfig>(&old).is_ok_and(|o| o == *cfg) {
        return Ok(());
    }
    let diff = config_diff(&old, resolved);
    if args.resume {
        writeln!(
            out,
            "--resume: the config changed ({diff}); stages whose settings changed are redone \
             (a raised [grpo] iterations extends GRPO)"
        )?;
        return Ok(());
    }
    bail!(
        "{} holds a run made with another config ({diff}). Pass --resume to keep the stages \
         whose settings did not change and redo the rest, --force to delete it and start over, \
         or --out DIR / --name NAME for a new run",
        root.display()
    )
}

/// The first few keys that differ between two config texts, e.g. `grpo.iterations: 30 -> 2`.
fn config_diff(old: &str, new: &str) -> String {
    let (Ok(a), Ok(b)) = (old.parse::<toml::Table>(), new.parse::<toml::Table>()) else {
        return "its config.toml does not parse".into();
    };
    let mut diffs = Vec::new();
    diff_tables("", &a, &b, &mut diffs);
    match diffs.len() {
        0 => "formatting only".into(),
        n if n > 3 => format!("{}, and {} more", diffs[..3].join(", "), n - 3),
        _ => diffs.join(", "),
    }
}

fn diff_tables(prefix: &str, a: &toml::Table, b: &toml::Table, out: &mut Vec<String>) {
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    for k in keys {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match (a.get(k), b.get(k)) {
            (Some(toml::Value::Table(x)), Some(toml::Value::Table(y))) => {
                diff_tables(&path, x, y, out)
            }
            (x, y) if x != y => {
                let show = |v: Option<&toml::Value>| v.map_or("(none)".into(), |v| v.to_string());
                out.push(format!("{path}: {} -> {}", show(x), show(y)));
            }
            _ => {}
        }
    }
}

/// Where this invocation records by default: `recording.rrd`, or `recording-N.rrd` (the next
/// free N) when an earlier invocation wrote that; `diffrl view RUN` opens them all.
fn default_recording(root: &Path) -> diffrl_viz::RerunSink {
    let first = diffrl_viz::RerunSink::run_default(root);
    if !root.join(diffrl_viz::RECORDING_FILE).exists() {
        return first;
    }
    let n = (1..)
        .find(|n| !root.join(format!("recording-{n}.rrd")).exists())
        .unwrap_or(1);
    diffrl_viz::RerunSink::Save(root.join(format!("recording-{n}.rrd")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_diff_names_the_changed_keys() {
        let a = "[grpo]\niterations = 30\nlr = 1e-5\n[run]\nname = \"x\"\n";
        let b = "[grpo]\niterations = 2\nlr = 1e-5\n[run]\nname = \"x\"\nseed = 3\n";
        assert_eq!(
            config_diff(a, b),
            "grpo.iterations: 30 -> 2, run.seed: (none) -> 3"
        );
        assert_eq!(config_diff(a, a), "formatting only");
        assert_eq!(config_diff("[", a), "its config.toml does not parse");
    }
}
