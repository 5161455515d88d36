//! `diffrl run`: the main job. Five stages run in order into one run folder: demos (or the
//! shipped dataset), behaviour cloning, the progress reward model, GRPO fine-tuning, and the
//! evaluation of both policies on the same seeded episodes; then report.md, summary.json and
//! the learning-curve PNGs.
//!
//! Every stage folder holds `fingerprint.json` (its settings, the fingerprints of the stages
//! it reads from, and content hashes of the folders it reads that no stage fingerprints) and, once
//! complete, `stage.json` (the same fingerprint, its wall time and results). A complete stage
//! with the same settings is reused; an incomplete one with the same settings resumes from its
//! checkpoint; one whose settings changed is started over. So an interrupted `diffrl run`
//! continues where it stopped.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use burn::tensor::backend::AutodiffBackend;
use clap::Args;
use diffrl_core::fs::{content_hash, write_atomic};
use diffrl_core::lerobot::read_dataset;
use diffrl_core::record::{Level, Recorder, Timeline, TrainStepOffset};
use diffrl_core::run_dir::RunDir;
use diffrl_core::stats;
use diffrl_learn::eval::EvalReport;
use diffrl_learn::grpo::Algorithm;
use diffrl_policy::{SampleMode, checkpoint};
use diffrl_reward::metrics::RewardMetrics;
use serde_json::{Value, json};

use crate::config::{self, RunConfig};
use crate::plots::{Panel, Series, curve, metrics_lines};
use crate::tasks::SHIPPED_DATASET;
use crate::train::{DeviceArg, check_spec, env_spec, run_eval, write_report};
use crate::viz::Recording;
use crate::{demos, finetune, reward_cmd, train};

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
    /// Smoke-test preset (a few minutes on 2 cores): short behaviour cloning, reward model
    /// and GRPO, 20 evaluation episodes; the run folder gets a `-quick` suffix.
    #[arg(long)]
    pub quick: bool,
    /// Delete an existing run folder (one with a config.toml) and start over.
    #[arg(long, conflicts_with = "resume")]
    pub force: bool,
    /// Continue a run folder whose config differs: stages whose settings did not change are
    /// kept, the others are redone.
    #[arg(long)]
    pub resume: bool,
    /// Device for training and evaluation.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    pub device: DeviceArg,
}

const STAGES: usize = 5;

/// Stochastic rollouts of the BC policy the reward stage scores the progress model on.
const VS_POLICY_EPISODES: usize = 50;

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
            "--resume: the config changed ({diff}); stages whose settings changed are redone"
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

/// A stage folder: its settings fingerprint, and whether it is done, half done or fresh.
struct Stage {
    dir: PathBuf,
    fp: Value,
}

enum StageState {
    Done(Value),
    Partial,
    Fresh,
}

impl Stage {
    /// Opens `dir` for settings `fp`; prints `header: fresh` when the stage starts from nothing.
    fn open(
        dir: PathBuf,
        fp: Value,
        header: &str,
        fresh: &str,
        out: &mut dyn Write,
    ) -> anyhow::Result<(Self, StageState)> {
        let read = |name: &str| -> Option<Value> {
            std::fs::read_to_string(dir.join(name))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
        };
        if let Some(m) = read("stage.json").filter(|m| m["fingerprint"] == fp) {
            writeln!(out, "{header}: reusing {} (same settings)", dir.display())?;
            return Ok((Self { dir, fp }, StageState::Done(m)));
        }
        let state = if read("fingerprint.json").is_some_and(|f| f == fp) {
            writeln!(out, "{header}: resuming {}", dir.display())?;
            StageState::Partial
        } else {
            if dir.exists() {
                writeln!(
                    out,
                    "{header}: settings changed since {} was written; starting it over",
                    dir.display()
                )?;
                std::fs::remove_dir_all(&dir)
                    .with_context(|| format!("removing {}", dir.display()))?;
            } else {
                writeln!(out, "{header}: {fresh}")?;
            }
            StageState::Fresh
        };
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        write_atomic(
            &dir.join("fingerprint.json"),
            serde_json::to_string_pretty(&fp)?.as_bytes(),
        )
        .with_context(|| format!("writing {}", dir.join("fingerprint.json").display()))?;
        Ok((Self { dir, fp }, state))
    }

    /// Marks the stage complete with its wall time and results.
    fn finish(&self, seconds: f64, results: Value) -> anyhow::Result<Value> {
        let marker = json!({"fingerprint": self.fp, "seconds": seconds, "results": results});
        let path = self.dir.join("stage.json");
        write_atomic(&path, serde_json::to_string_pretty(&marker)?.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(marker)
    }
}

/// What the stages produced.
struct Results {
    demos: Option<demos::DemoSummary>,
    dataset: PathBuf,
    seconds: [f64; STAGES],
    reused: [bool; STAGES],
    reward: RewardMetrics,
    /// The reward model on held-out demos plus rollouts of the BC policy.
    reward_vs_policy: Option<RewardMetrics>,
    pretrain_steps: usize,
    /// DAgger rounds that followed behaviour cloning (empty without [dagger]).
    dagger: Vec<crate::dagger::RoundRecord>,
    grpo_iterations: usize,
    bc: EvalReport,
    grpo: EvalReport,
}

fn header(i: usize, name: &str) -> String {
    format!("[{}/{STAGES}] {name}", i + 1)
}

fn stages<B: AutodiffBackend>(
    cfg: &RunConfig,
    run: &mut RunDir,
    rec: &dyn Recorder,
    device: &B::Device,
    out: &mut dyn Write,
) -> anyhow::Result<Results> {
    let root = run.path().to_path_buf();
    let mut seconds = [0.0; STAGES];
    let mut reused = [false; STAGES];

    // 1. Demonstrations: the configured dataset, or expert episodes recorded into demos/.
    let h = header(0, "demos");
    let (dataset, demo_summary, demos_fp) = demos_stage(cfg, &root, &h, out)?;
    if let Some(s) = &demo_summary {
        seconds[0] = s.seconds;
        writeln!(out, "      {s}")?;
    }
    if demo_summary.is_none() {
        reused[0] = true;
    }
    run.log(&json!({"stage": "demos", "dataset": dataset, "summary": demo_summary}))?;

    // 2. Behaviour cloning.
    let h = header(1, "pretrain");
    let mut pre_fp = json!({"demos": demos_fp, "dataset": dataset, "policy": cfg.policy, "pretrain": cfg.pretrain, "env": cfg.env, "seed": cfg.run.seed});
    // Only with rounds, so runs without DAgger keep their fingerprint; the expert labels.
    if cfg.dagger.rounds > 0 {
        pre_fp["dagger"] = json!(cfg.dagger);
        pre_fp["expert"] = json!(cfg.expert);
    }
    let (stage, state) = Stage::open(
        root.join("pretrain"),
        pre_fp.clone(),
        &h,
        &format!("behaviour cloning on {}", dataset.display()),
        out,
    )?;
    let mut policy_dir = stage.dir.join("policy");
    if cfg.dagger.rounds > 0 {
        policy_dir = stage
            .dir
            .join(format!("dagger/round-{}/policy", cfg.dagger.rounds));
    }
    let marker = match state {
        StageState::Done(m) => {
            reused[1] = true;
            m
        }
        _ => {
            let t0 = Instant::now();
            let bc_done = stage.dir.join("bc.json");
            if !bc_done.exists() {
                train::pretrain::<B>(cfg, &dataset, None, &stage.dir, true, 0, device, out, rec)?;
                write_atomic(&bc_done, b"{}\n")
                    .with_context(|| format!("writing {}", bc_done.display()))?;
            }
            // DAgger rounds continue from the BC policy; each round's training steps follow
            // the previous ones on the recording's train_step timeline.
            let mut rounds = Vec::new();
            let (mut data, mut policy) = (dataset.clone(), stage.dir.join("policy"));
            for r in 1..=cfg.dagger.rounds {
                let dir = stage.dir.join(format!("dagger/round-{r}"));
                let shifted = TrainStepOffset::new(
                    rec,
                    (cfg.pretrain.steps + (r - 1) * cfg.dagger.steps) as i64,
                );
                let record =
                    crate::dagger::round::<B>(cfg, r, &data, &policy, &dir, device, out, &shifted)?;
                writeln!(
                    out,
                    "      DAgger round {r}: the previous policy succeeded in {:.1}% of {} rollouts; \
                     trained on {} episodes",
                    100.0 * record.rollouts.success_rate,
                    record.rollouts.episodes,
                    record.episodes_in_data
                )?;
                rounds.push(record);
                data = dir.join("data");
                policy = dir.join("policy");
            }
            let m = stage.finish(
                t0.elapsed().as_secs_f64(),
                json!({"steps": cfg.pretrain.steps, "dagger": rounds}),
            )?;
            run.log(&json!({"stage": "pretrain", "seconds": m["seconds"]}))?;
            m
        }
    };
    seconds[1] = marker["seconds"].as_f64().unwrap_or(0.0);
    let dagger_rounds: Vec<crate::dagger::RoundRecord> =
        serde_json::from_value(marker["results"]["dagger"].clone()).unwrap_or_default();

    // 3. The progress reward model (held-out metrics; shaping uses it when [reward.shaping]
    // names it).
    let h = header(2, "reward");
    // Scored against rollouts of the BC policy too, so the stage depends on it.
    let reward_fp = json!({"dataset": dataset, "progress": cfg.reward.progress, "obs": cfg.env.observation(), "vs_policy": {"pretrain": pre_fp, "episodes": VS_POLICY_EPISODES}});
    let (stage, state) = Stage::open(
        root.join("reward"),
        reward_fp,
        &h,
        "progress reward model Phi(s) on the dataset",
        out,
    )?;
    let marker = match state {
        StageState::Done(m) => {
            reused[2] = true;
            m
        }
        _ => {
            let t0 = Instant::now();
            let metrics = reward_cmd::train_progress(
                cfg,
                Some(&dataset),
                &stage.dir.join("progress"),
                false,
                rec,
                out,
            )?;
            rec.text(
                diffrl_viz::paths::RUN_LOG,
                Level::Info,
                &format!(
                    "reward model: held-out VOC {:.3}, pairwise accuracy {}",
                    metrics.voc,
                    metrics
                        .pairwise_accuracy
                        .map_or("n/a".into(), |v| format!("{v:.3}"))
                ),
            );
            // What shaping meets in fine-tuning: the BC policy's own failures.
            let (vs_policy, _, rollouts) = reward_cmd::score_model(
                cfg,
                &stage.dir.join("progress"),
                Some(&dataset),
                Some((
                    &policy_dir,
                    VS_POLICY_EPISODES,
                    diffrl_core::seeding::derive(cfg.run.seed, 0x5C0E),
                )),
            )?;
            reward_cmd::print_metrics(
                out,
                &format!("held-out demos + {rollouts} rollouts of the BC policy"),
                &vs_policy,
            )?;
            let mut results = serde_json::to_value(&metrics)?;
            results["vs_policy"] = serde_json::to_value(&vs_policy)?;
            let m = stage.finish(t0.elapsed().as_secs_f64(), results)?;
            run.log(&json!({"stage": "reward", "seconds": m["seconds"], "metrics": metrics}))?;
            m
        }
    };
    seconds[2] = marker["seconds"].as_f64().unwrap_or(0.0);
    let reward: RewardMetrics = serde_json::from_value(marker["results"].clone())
        .with_context(|| format!("reading {}", root.join("reward/stage.json").display()))?;
    let reward_vs_policy: Option<RewardMetrics> =
        serde_json::from_value(marker["results"]["vs_policy"].clone()).ok();

    // 4. GRPO from the BC checkpoint. Its training scalars follow BC's on the train_step
    // timeline of the recording.
    let h = header(3, "grpo");
    let mut reward_fp = json!({"outcome": cfg.reward.outcome, "success_bonus": cfg.reward.success_bonus, "shaping": cfg.reward.shaping, "srpo": cfg.reward.srpo});
    // Only when set, so runs from before SPA existed keep their fingerprint.
    if let Some(spa) = &cfg.reward.spa {
        reward_fp["spa"] = json!(spa);
    }
    // The models it reads by content, not by path: retraining the reward stage (or any model
    // folder named here) redoes fine-tuning.
    let models = reward_model_hashes(cfg)?;
    if !models.is_empty() {
        reward_fp["model_content"] = Value::Object(models);
    }
    let grpo_fp = json!({"pretrain": pre_fp, "grpo": cfg.grpo, "reward": reward_fp});
    let (stage, state) = Stage::open(
        root.join("grpo"),
        grpo_fp.clone(),
        &h,
        "fine-tuning the BC policy",
        out,
    )?;
    let grpo_dir = stage.dir.clone();
    let offset = (cfg.pretrain.steps + cfg.dagger.rounds * cfg.dagger.steps) as i64;
    let marker = match state {
        StageState::Done(m) => {
            reused[3] = true;
            m
        }
        state => {
            let resume =
                matches!(state, StageState::Partial) && grpo_dir.join("train_state").exists();
            let t0 = Instant::now();
            let shifted = TrainStepOffset::new(rec, offset);
            finetune::finetune::<B>(
                cfg,
                Algorithm::Grpo,
                &policy_dir,
                &grpo_dir,
                resume,
                0,
                device,
                out,
                &shifted,
            )?;
            let m = stage.finish(
                t0.elapsed().as_secs_f64(),
                json!({"iterations": cfg.grpo.iterations}),
            )?;
            run.log(&json!({"stage": "grpo", "seconds": m["seconds"]}))?;
            m
        }
    };
    seconds[3] = marker["seconds"].as_f64().unwrap_or(0.0);

    // 5. Both policies on the same seeded episodes (deterministic chains).
    let h = header(4, "eval");
    let eval_fp = json!({"pretrain": pre_fp, "grpo": grpo_fp, "eval": cfg.eval});
    let (stage, state) = Stage::open(
        root.join("eval"),
        eval_fp,
        &h,
        "both policies on the same seeded episodes",
        out,
    )?;
    let (bc, grpo) = match state {
        StageState::Done(m) => {
            reused[4] = true;
            seconds[4] = m["seconds"].as_f64().unwrap_or(0.0);
            (
                read_report(&stage.dir.join("bc.json"))?,
                read_report(&stage.dir.join("grpo.json"))?,
            )
        }
        _ => {
            let t0 = Instant::now();
            let mut reports = Vec::new();
            for (what, dir, step) in [
                ("bc", &policy_dir, offset),
                (
                    "grpo",
                    &grpo_dir.join("policy"),
                    offset + cfg.grpo.iterations as i64,
                ),
            ] {
                writeln!(out, "{h}: {what} policy on {} episodes", cfg.eval.episodes)?;
                let (policy, _) = checkpoint::load::<B::InnerBackend>(dir, device)
                    .with_context(|| format!("loading {}", dir.display()))?;
                check_spec(
                    &policy.spec,
                    &env_spec(cfg)?,
                    &format!("the policy {}", dir.display()),
                )?;
                rec.set_time(Timeline::TrainStep, step);
                rec.text(
                    diffrl_viz::paths::RUN_LOG,
                    Level::Info,
                    &format!("evaluating the {what} policy ({})", dir.display()),
                );
                let r = run_eval(
                    cfg,
                    &policy,
                    device,
                    cfg.eval.episodes,
                    cfg.eval.seed,
                    SampleMode::Deterministic,
                    rec,
                )?;
                write_report(&stage.dir.join(format!("{what}.json")), &r)?;
                write!(out, "      {what}: ")?;
                train::print_report(out, &r)?;
                reports.push(r);
            }
            seconds[4] = t0.elapsed().as_secs_f64();
            let grpo = reports.pop().context("two evaluations")?;
            let bc = reports.pop().context("two evaluations")?;
            stage.finish(seconds[4], json!({"bc": brief(&bc), "grpo": brief(&grpo)}))?;
            run.log(&json!({"stage": "eval", "seconds": seconds[4], "bc": brief(&bc), "grpo": brief(&grpo)}))?;
            (bc, grpo)
        }
    };
    rec.flush();
    Ok(Results {
        demos: demo_summary,
        dataset,
        seconds,
        reused,
        reward,
        reward_vs_policy,
        pretrain_steps: cfg.pretrain.steps,
        dagger: dagger_rounds,
        grpo_iterations: cfg.grpo.iterations,
        bc,
        grpo,
    })
}

/// One line on the demonstrations and DAgger rounds the BC policy learnt from.
fn data_line(cfg: &RunConfig, r: &Results) -> String {
    let demos = match &r.demos {
        Some(d) => format!(
            "{} {}-expert episodes recorded by this run (DART noise {} px; expert success {:.1}%)",
            d.episodes,
            cfg.expert.name(),
            cfg.demos.noise_px,
            100.0 * d.success_rate
        ),
        None => format!("the dataset `{}`", r.dataset.display()),
    };
    let rounds: Vec<String> = r
        .dagger
        .iter()
        .map(|d| {
            format!(
                "round {} labelled {} rollouts of the previous policy ({:.1}% success) -> {} episodes",
                d.round,
                d.rollouts.episodes,
                100.0 * d.rollouts.success_rate,
                d.episodes_in_data
            )
        })
        .collect();
    if rounds.is_empty() {
        format!("{demos}; no DAgger rounds")
    } else {
        format!(
            "{demos}, then DAgger with the {} expert: {}",
            cfg.expert.name(),
            rounds.join("; ")
        )
    }
}

/// The BC row's name: its steps, and its DAgger rounds when there were any.
fn bc_name(r: &Results) -> String {
    match r.dagger.last() {
        None => format!("BC ({} steps)", r.pretrain_steps),
        Some(last) => format!(
            "BC ({} steps) + {} DAgger rounds ({} steps; {} episodes in the last round's data)",
            r.pretrain_steps,
            r.dagger.len(),
            r.dagger.iter().map(|d| d.steps).sum::<usize>(),
            last.episodes_in_data
        ),
    }
}

fn read_report(path: &Path) -> anyhow::Result<EvalReport> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

fn brief(r: &EvalReport) -> Value {
    json!({"success_rate": r.success_rate, "ci95": r.ci95, "mean_max_score": r.mean_max_score, "episodes": r.episodes, "successes": r.successes, "mean_length": r.mean_length})
}

/// Content hashes of the reward-model folders GRPO reads (`[reward.shaping]`, `[reward.spa]`).
fn reward_model_hashes(cfg: &RunConfig) -> anyhow::Result<serde_json::Map<String, Value>> {
    let mut hashes = serde_json::Map::new();
    let folders = [
        ("shaping", cfg.reward.shaping.as_ref().map(|s| &s.model)),
        ("spa", cfg.reward.spa.as_ref().map(|s| &s.model)),
    ];
    for (key, dir) in folders {
        if let Some(dir) = dir {
            let hash = content_hash(dir).with_context(|| {
                format!(
                    "reading the model folder {} ([reward.{key}].model)",
                    dir.display()
                )
            })?;
            hashes.insert(key.into(), json!(hash));
        }
    }
    Ok(hashes)
}

/// Stage 1. Returns the dataset folder, the expert summary when demos were recorded by this
/// run (None for a given dataset), and the fingerprint later stages depend on.
fn demos_stage(
    cfg: &RunConfig,
    root: &Path,
    h: &str,
    out: &mut dyn Write,
) -> anyhow::Result<(PathBuf, Option<demos::DemoSummary>, Value)> {
    let configured = &cfg.demos.dataset;
    if !configured.as_os_str().is_empty() {
        if configured.is_dir() {
            let ds = read_dataset(configured).with_context(|| {
                format!(
                    "reading the dataset {} ([demos].dataset)",
                    configured.display()
                )
            })?;
            writeln!(
                out,
                "{h}: using the dataset {} ({} frames; [demos].dataset)",
                configured.display(),
                ds.len()
            )?;
            // Its content, so a dataset rewritten in place retrains what learned from it.
            let content = content_hash(configured)
                .with_context(|| format!("hashing the dataset {}", configured.display()))?;
            let fingerprint = json!({"dataset": configured, "content": content});
            return Ok((configured.clone(), None, fingerprint));
        }
        if configured != Path::new(SHIPPED_DATASET) {
            bail!(
                "[demos].dataset = {:?} does not exist; set it to a LeRobot dataset folder, or to \
                 \"\" to record expert demonstrations",
                configured.display()
            );
        }
        writeln!(
            out,
            "{h}: the shipped dataset {SHIPPED_DATASET} is not here (run from the repository \
             root to use it); recording {} expert episodes instead",
            cfg.demos.episodes
        )?;
    }
    let demos_dir = root.join("demos");
    let fingerprint = json!({"seed": cfg.run.seed, "episodes": cfg.demos.episodes, "only_successful": cfg.demos.only_successful, "noise_px": cfg.demos.noise_px, "env": cfg.env, "expert": cfg.expert});
    if let Some(ds) = read_dataset(&demos_dir)
        .ok()
        .filter(|ds| ds.info["diffrl"]["provenance"]["fingerprint"] == fingerprint)
    {
        writeln!(
            out,
            "{h}: reusing {} ({} frames)",
            demos_dir.display(),
            ds.len()
        )?;
        let summary = serde_json::from_value(ds.info["diffrl"]["summary"].clone()).ok();
        return Ok((demos_dir, summary, fingerprint));
    }
    writeln!(
        out,
        "{h}: {} expert episodes ({} expert, DART noise {} px)",
        cfg.demos.episodes,
        cfg.expert.name(),
        cfg.demos.noise_px
    )?;
    let (eps, summary) = demos::generate(
        &cfg.env,
        &cfg.expert,
        cfg.demos.noise_px,
        cfg.demos.episodes,
        cfg.run.seed,
        cfg.run.threads,
    )?;
    let provenance = json!({"command": "diffrl run", "fingerprint": fingerprint, "diffrl_version": env!("CARGO_PKG_VERSION")});
    demos::write(
        cfg.env.task(),
        &demos_dir,
        &eps,
        &summary,
        provenance,
        cfg.demos.only_successful,
        true,
    )?;
    Ok((demos_dir, Some(summary), fingerprint))
}

fn summary_json(r: &Results, total: f64, quick: bool) -> Value {
    let paired = paired_score_diff(&r.bc, &r.grpo);
    json!({
        "bc": brief(&r.bc),
        "grpo": brief(&r.grpo),
        "grpo_minus_bc": {
            "success_rate": r.grpo.success_rate - r.bc.success_rate,
            "mean_max_score": paired.map(|p| p.0),
            "mean_max_score_ci95": paired.map(|p| [p.0 - p.1, p.0 + p.1]),
            "wilson_intervals_separate": r.grpo.ci95[0] > r.bc.ci95[1] || r.bc.ci95[0] > r.grpo.ci95[1],
            "mcnemar": mcnemar(&r.bc, &r.grpo).map(|(g, b, p)| json!({"only_grpo_succeeded": g, "only_bc_succeeded": b, "p_value": p})),
        },
        "reward": {
            "voc": r.reward.voc,
            "pairwise_accuracy": r.reward.pairwise_accuracy,
            "success_auroc": r.reward.success_auroc,
            "monotonicity": r.reward.monotonicity,
            "pairs": r.reward.pairs,
            "vs_policy": r.reward_vs_policy.as_ref().map(|m| json!({
                "pairwise_accuracy": m.pairwise_accuracy,
                "success_auroc": m.success_auroc,
                "pairs": m.pairs,
                "voc": m.voc,
            })),
        },
        "wall_seconds": {
            "demos": r.seconds[0],
            "pretrain": r.seconds[1],
            "reward": r.seconds[2],
            "grpo": r.seconds[3],
            "eval": r.seconds[4],
            "total_this_invocation": total,
        },
        "reused": {
            "demos": r.reused[0],
            "pretrain": r.reused[1],
            "reward": r.reused[2],
            "grpo": r.reused[3],
            "eval": r.reused[4],
        },
        "dataset": r.dataset,
        "pretrain_steps": r.pretrain_steps,
        "dagger": r.dagger,
        "grpo_iterations": r.grpo_iterations,
        "quick": quick,
        "diffrl_version": env!("CARGO_PKG_VERSION"),
    })
}

/// Mean paired difference of max scores (GRPO - BC) over episodes played from the same seeds,
/// with the half-width of its normal 95% interval; None unless the episode lists pair up.
fn paired_score_diff(bc: &EvalReport, grpo: &EvalReport) -> Option<(f64, f64)> {
    let n = bc.per_episode.len();
    if n < 2 || n != grpo.per_episode.len() || bc.seed != grpo.seed || bc.envs != grpo.envs {
        return None;
    }
    let d: Vec<f64> = bc
        .per_episode
        .iter()
        .zip(&grpo.per_episode)
        .map(|(a, b)| f64::from(b.max_score) - f64::from(a.max_score))
        .collect();
    stats::paired_mean_interval(&d, stats::Z95)
}

/// Exact McNemar test on paired successes: (episodes only GRPO solved, episodes only BC solved,
/// two-sided p). None unless the episode lists pair up.
fn mcnemar(bc: &EvalReport, grpo: &EvalReport) -> Option<(usize, usize, f64)> {
    if bc.per_episode.len() != grpo.per_episode.len()
        || bc.seed != grpo.seed
        || bc.envs != grpo.envs
    {
        return None;
    }
    let pairs = bc.per_episode.iter().zip(&grpo.per_episode);
    let only_grpo = pairs
        .clone()
        .filter(|(a, b)| !a.success && b.success)
        .count();
    let only_bc = pairs.filter(|(a, b)| a.success && !b.success).count();
    Some((only_grpo, only_bc, stats::mcnemar_exact(only_grpo, only_bc)))
}

/// Reads the JSON lines of a metrics.jsonl (unreadable lines skipped).
fn plots(root: &Path, r: &Results) -> anyhow::Result<Vec<(String, String)>> {
    let dir = root.join("plots");
    let mut written = Vec::new();
    let pre = metrics_lines(&root.join("pretrain/metrics.jsonl"));
    let loss = curve(&pre, "train", "step", "loss", f64::log10);
    let pct = |v: f64| 100.0 * v;
    let mut evals = vec![
        Series {
            label: "success %".into(),
            points: curve(&pre, "eval", "step", "success_rate", pct),
        },
        Series {
            label: "mean max score x 100".into(),
            points: curve(&pre, "eval", "step", "mean_max_score", pct),
        },
    ];
    let last = r.pretrain_steps as f64;
    evals[0].points.push((last, pct(r.bc.success_rate)));
    evals[1].points.push((last, pct(r.bc.mean_max_score)));
    crate::plots::write_png(
        &dir.join("pretrain.png"),
        &[
            Panel {
                title: "Behaviour cloning: training loss".into(),
                x_label: "optimiser step".into(),
                y_label: "log10 denoising MSE".into(),
                series: vec![Series {
                    label: "loss".into(),
                    points: loss,
                }],
            },
            Panel {
                title: "Behaviour cloning: evaluations (EMA weights)".into(),
                x_label: "optimiser step".into(),
                y_label: "percent".into(),
                series: evals,
            },
        ],
    )?;
    written.push((
        "plots/pretrain.png".into(),
        "behaviour cloning: loss and evaluations".into(),
    ));
    let g = metrics_lines(&root.join("grpo/metrics.jsonl"));
    let n = r.grpo_iterations as f64;
    let mut evals = vec![
        Series {
            label: "eval success %".into(),
            points: vec![(0.0, pct(r.bc.success_rate))],
        },
        Series {
            label: "eval mean max score x 100".into(),
            points: vec![(0.0, pct(r.bc.mean_max_score))],
        },
    ];
    evals[0]
        .points
        .extend(curve(&g, "eval", "iteration", "success_rate", pct));
    evals[1]
        .points
        .extend(curve(&g, "eval", "iteration", "mean_max_score", pct));
    evals[0].points.push((n, pct(r.grpo.success_rate)));
    evals[1].points.push((n, pct(r.grpo.mean_max_score)));
    crate::plots::write_png(
        &dir.join("grpo.png"),
        &[
            Panel {
                title: "GRPO: training rollouts (stochastic chains)".into(),
                x_label: "iteration".into(),
                y_label: "percent".into(),
                series: vec![
                    Series {
                        label: "success %".into(),
                        points: curve(&g, "train", "iteration", "success_rate", pct),
                    },
                    Series {
                        label: "mean max score x 100".into(),
                        points: curve(&g, "train", "iteration", "mean_max_score", pct),
                    },
                ],
            },
            Panel {
                title: "GRPO: evaluation (deterministic chains)".into(),
                x_label: "iteration (0 = the BC policy)".into(),
                y_label: "percent".into(),
                series: evals,
            },
            Panel {
                title: "GRPO: update size".into(),
                x_label: "iteration".into(),
                y_label: "value".into(),
                series: vec![
                    Series {
                        label: "clip fraction".into(),
                        points: curve(&g, "train", "iteration", "clip_frac", |v| v),
                    },
                    Series {
                        label: "approx KL x 1000".into(),
                        points: curve(&g, "train", "iteration", "approx_kl", |v| 1000.0 * v),
                    },
                ],
            },
        ],
    )?;
    written.push((
        "plots/grpo.png".into(),
        "GRPO: rollouts, evaluations, update size".into(),
    ));
    Ok(written)
}

fn finish(
    cfg: &RunConfig,
    root: &Path,
    r: &Results,
    total: f64,
    quick: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let summary = summary_json(r, total, quick);
    let plots = plots(root, r)?;
    let pct = |v: f64| 100.0 * v;
    let row = |name: &str, e: &EvalReport| {
        format!(
            "| {name} | {} | {:.1}% ({}/{}) | {:.1}-{:.1}% | {:.3} | {:.1} |\n",
            e.episodes,
            pct(e.success_rate),
            e.successes,
            e.episodes,
            pct(e.ci95[0]),
            pct(e.ci95[1]),
            e.mean_max_score,
            e.mean_length
        )
    };
    let separate = summary["grpo_minus_bc"]["wilson_intervals_separate"].as_bool() == Some(true);
    let mut md = format!(
        "# diffrl run `{name}`{quick}\n\nConfig: `config.toml` (resolved). Task: {task}. Dataset: `{ds}`. \
         Summary: `summary.json`. Recording: `recording.rrd` (`diffrl view {root}`).\n\n\
         ## Results\n\nSame {n} seeded episodes for both policies (root seed {seed}, deterministic DDIM chains).\n\n\
         | policy | episodes | success | Wilson 95% CI | mean max score | mean length |\n|---|---|---|---|---|---|\n{bc}{grpo}\n",
        name = cfg.run.name,
        quick = if quick { " (--quick preset)" } else { "" },
        task = cfg.task,
        ds = r.dataset.display(),
        root = root.display(),
        n = cfg.eval.episodes,
        seed = cfg.eval.seed,
        bc = row(&bc_name(r), &r.bc),
        grpo = row(&format!("GRPO ({} iterations)", r.grpo_iterations), &r.grpo),
    );
    md.push_str(&format!("Training data: {}.\n\n", data_line(cfg, r)));
    md.push_str(&format!(
        "GRPO - BC: success {:+.1} points ({}{}); mean max score {}.\n\n",
        pct(r.grpo.success_rate - r.bc.success_rate),
        if separate {
            "the Wilson intervals do not overlap"
        } else {
            "the Wilson intervals overlap"
        },
        match mcnemar(&r.bc, &r.grpo) {
            Some((g, b, p)) => format!(
                "; paired: {g} episodes only GRPO solved, {b} only BC, exact McNemar p = {p:.3}{}",
                match (separate, p < 0.05) {
                    (false, true) => ": the paired test on the same episodes tells them apart",
                    (false, false) => ": not a clear difference",
                    _ => "",
                }
            ),
            None if !separate => ": not a clear difference".into(),
            None => String::new(),
        },
        match paired_score_diff(&r.bc, &r.grpo) {
            Some((m, h)) => format!(
                "{m:+.3} (paired 95% interval {:+.3} to {:+.3})",
                m - h,
                m + h
            ),
            None => "n/a".into(),
        }
    ));
    let opt = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.3}"));
    md.push_str(&format!(
        "## Reward model\n\nProgress model Phi(s) (`reward/progress`), held-out demonstrations: VOC {:.3} over {} \
         successful episodes, pairwise accuracy {} over {} pairs, success AUROC {}, monotonicity {:.3}.\n\n",
        r.reward.voc,
        r.reward.voc_trajectories,
        opt(r.reward.pairwise_accuracy),
        r.reward.pairs,
        opt(r.reward.success_auroc),
        r.reward.monotonicity,
    ));
    if let Some(m) = &r.reward_vs_policy {
        md.push_str(&format!(
            "Against the BC policy's own rollouts ({VS_POLICY_EPISODES} stochastic episodes \
             added to the held-out demonstrations): pairwise accuracy {} over {} pairs, success \
             AUROC {}.\n\n",
            opt(m.pairwise_accuracy),
            m.pairs,
            opt(m.success_auroc),
        ));
    }
    if let Some(s) = &r.demos {
        md.push_str(&format!(
            "## Expert demonstrations\n\n{} episodes, success {:.1}% (Wilson 95% CI {:.1}-{:.1}%), mean max reward {:.3}, mean length {:.1}.\n\n",
            s.episodes,
            pct(s.success_rate),
            pct(s.success_ci95[0]),
            pct(s.success_ci95[1]),
            s.mean_max_reward,
            s.mean_length
        ));
    }
    md.push_str("## Wall time per stage\n\n| stage | seconds | this invocation |\n|---|---|---|\n");
    for (i, name) in ["demos", "pretrain", "reward", "grpo", "eval"]
        .iter()
        .enumerate()
    {
        md.push_str(&format!(
            "| {name} | {:.1} | {} |\n",
            r.seconds[i],
            if r.reused[i] { "reused" } else { "ran" }
        ));
    }
    md.push_str(&format!(
        "\nThis invocation: {total:.1} s in all.\n\n## Plots\n\n"
    ));
    for (file, what) in &plots {
        md.push_str(&format!("{what}:\n\n![{what}]({file})\n\n"));
    }
    write_atomic(
        &root.join("summary.json"),
        serde_json::to_string_pretty(&summary)?.as_bytes(),
    )
    .with_context(|| format!("writing {}", root.join("summary.json").display()))?;
    write_atomic(&root.join("report.md"), md.as_bytes())
        .with_context(|| format!("writing {}", root.join("report.md").display()))?;
    writeln!(
        out,
        "BC {:.1}% -> GRPO {:.1}% success (mean max score {:.3} -> {:.3}); reward model VOC {:.3}; {:.0} s",
        pct(r.bc.success_rate),
        pct(r.grpo.success_rate),
        r.bc.mean_max_score,
        r.grpo.mean_max_score,
        r.reward.voc,
        total
    )?;
    writeln!(out, "report: {}", root.join("report.md").display())?;
    Ok(())
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

    #[test]
    fn paired_difference_needs_the_same_episodes() {
        use diffrl_learn::eval::EpisodeStats;
        let ep = |s: f32| EpisodeStats {
            env: 0,
            episode: 0,
            success: false,
            max_score: s,
            total_reward: 0.0,
            length: 1,
        };
        let bc = EvalReport::from_episodes(vec![ep(0.1), ep(0.2), ep(0.3)], 5, 1);
        let g = EvalReport::from_episodes(vec![ep(0.2), ep(0.3), ep(0.4)], 5, 1);
        let (m, h) = paired_score_diff(&bc, &g).unwrap();
        assert!((m - 0.1).abs() < 1e-6 && h < 1e-6, "{m} {h}");
        let other = EvalReport::from_episodes(vec![ep(0.2), ep(0.3), ep(0.4)], 6, 1);
        assert!(paired_score_diff(&bc, &other).is_none());
        assert!(mcnemar(&bc, &other).is_none());
    }

    #[test]
    fn mcnemar_counts_the_discordant_pairs() {
        use diffrl_learn::eval::EpisodeStats;
        let ep = |success: bool| EpisodeStats {
            env: 0,
            episode: 0,
            success,
            max_score: 0.5,
            total_reward: 0.0,
            length: 1,
        };
        // 12 episodes only GRPO solved, 4 only BC, 80 neither, 4 both (the p-value's own test
        // is in diffrl_core::stats).
        let mut a = Vec::new();
        let mut b = Vec::new();
        for (x, y, n) in [
            (false, true, 12),
            (true, false, 4),
            (false, false, 80),
            (true, true, 4),
        ] {
            for _ in 0..n {
                a.push(ep(x));
                b.push(ep(y));
            }
        }
        let (g, o, p) = mcnemar(
            &EvalReport::from_episodes(a, 1, 1),
            &EvalReport::from_episodes(b, 1, 1),
        )
        .unwrap();
        assert_eq!((g, o), (12, 4));
        assert_eq!(p, stats::mcnemar_exact(12, 4));
        let none = EvalReport::from_episodes(vec![ep(false); 3], 1, 1);
        assert_eq!(mcnemar(&none, &none).unwrap().2, 1.0);
    }
}
