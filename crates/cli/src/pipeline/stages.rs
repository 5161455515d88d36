//! The five stages of `diffrl run`, in order: demos, behaviour cloning (+ DAgger), the progress
//! reward model, GRPO, and the evaluation of both policies. Each stage is one function that
//! opens its folder through [`Stage::open`] (reuse, resume or start over by fingerprint), does its
//! work when it must, and returns what later stages read.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use burn::tensor::backend::AutodiffBackend;
use diffrl_core::fs::{content_hash, write_atomic};
use diffrl_core::lerobot::read_dataset;
use diffrl_core::record::{Level, Recorder, Timeline, TrainStepOffset};
use diffrl_core::run_dir::RunDir;
use diffrl_learn::eval::EvalReport;
use diffrl_learn::grpo::Algorithm;
use diffrl_policy::SampleMode;
use diffrl_reward::metrics::RewardMetrics;
use serde_json::{Value, json};

use super::STAGES;
use super::cache::{Stage, StageState, extend_count, reward_model_hashes};
use crate::bc;
use crate::commands::{dagger, demos, finetune, reward};
use crate::config::RunConfig;
use crate::envs::load_policy;
use crate::evaluation::{print_report, run_eval, write_report};
use crate::tasks::SHIPPED_DATASETS;

/// What the stages produced.
pub(super) struct Results {
    pub demos: Option<demos::DemoSummary>,
    pub dataset: PathBuf,
    pub seconds: [f64; STAGES],
    pub reused: [bool; STAGES],
    pub reward: RewardMetrics,
    /// The reward model on held-out demos plus rollouts of the BC policy.
    pub reward_vs_policy: Option<RewardMetrics>,
    pub pretrain_steps: usize,
    /// DAgger rounds that followed behaviour cloning (empty without [dagger]).
    pub dagger: Vec<dagger::RoundRecord>,
    pub grpo_iterations: usize,
    /// The fine-tuning stage's learner (`[run] finetune`).
    pub learner: Algorithm,
    pub bc: EvalReport,
    pub grpo: EvalReport,
}

/// What every stage shares: the config, the run folder, the recording, the console.
struct Ctx<'a, B: AutodiffBackend> {
    cfg: &'a RunConfig,
    root: PathBuf,
    run: &'a mut RunDir,
    rec: &'a dyn Recorder,
    device: &'a B::Device,
    out: &'a mut dyn Write,
}

/// One stage's wall time (its own, even when reused) and whether this invocation reused it.
struct Ran {
    seconds: f64,
    reused: bool,
}

impl Ran {
    fn from_marker(m: &Value, reused: bool) -> Self {
        Self {
            seconds: m["seconds"].as_f64().unwrap_or(0.0),
            reused,
        }
    }
}

fn header(i: usize, name: &str) -> String {
    format!("[{}/{STAGES}] {name}", i + 1)
}

/// Runs the five stages into `run`.
pub(super) fn stages<B: AutodiffBackend>(
    cfg: &RunConfig,
    run: &mut RunDir,
    rec: &dyn Recorder,
    device: &B::Device,
    out: &mut dyn Write,
) -> anyhow::Result<Results> {
    let root = run.path().to_path_buf();
    let mut cx = Ctx::<B> {
        cfg,
        root,
        run,
        rec,
        device,
        out,
    };
    let (dataset, demo_summary, demos_fp, ran0) = demos_step(&mut cx)?;
    let (pre, ran1) = pretrain_stage(&mut cx, &dataset, demos_fp)?;
    let (reward, reward_vs_policy, ran2) = reward_stage(&mut cx, &dataset, &pre)?;
    let (grpo_fp, ran3) = grpo_stage(&mut cx, &pre)?;
    let (bc, grpo, ran4) = eval_stage(&mut cx, &pre, grpo_fp)?;
    cx.rec.flush();
    let ran = [ran0, ran1, ran2, ran3, ran4];
    Ok(Results {
        demos: demo_summary,
        dataset,
        seconds: ran.each_ref().map(|r| r.seconds),
        reused: ran.each_ref().map(|r| r.reused),
        reward,
        reward_vs_policy,
        pretrain_steps: cfg.pretrain.steps,
        dagger: pre.dagger,
        grpo_iterations: cfg.grpo.iterations,
        learner: cfg.run.finetune,
        bc,
        grpo,
    })
}

/// Stage 1: the configured dataset, or expert episodes recorded into demos/.
fn demos_step<B: AutodiffBackend>(
    cx: &mut Ctx<'_, B>,
) -> anyhow::Result<(PathBuf, Option<demos::DemoSummary>, Value, Ran)> {
    let h = header(0, "demos");
    let (dataset, summary, fp) = demos_stage(cx.cfg, &cx.root, &h, cx.out)?;
    if let Some(s) = &summary {
        writeln!(cx.out, "      {s}")?;
    }
    let ran = Ran {
        seconds: summary.as_ref().map_or(0.0, |s| s.seconds),
        reused: summary.is_none(),
    };
    cx.run
        .log(&json!({"stage": "demos", "dataset": dataset, "summary": summary}))?;
    Ok((dataset, summary, fp, ran))
}

/// What behaviour cloning hands on: its fingerprint, the policy later stages start from, and
/// its DAgger rounds.
struct Pretrained {
    fp: Value,
    policy_dir: PathBuf,
    dagger: Vec<dagger::RoundRecord>,
}

/// Stage 2: behaviour cloning, then the DAgger rounds when [dagger] asks for them.
fn pretrain_stage<B: AutodiffBackend>(
    cx: &mut Ctx<'_, B>,
    dataset: &Path,
    demos_fp: Value,
) -> anyhow::Result<(Pretrained, Ran)> {
    let cfg = cx.cfg;
    let h = header(1, "pretrain");
    let mut fp = json!({"demos": demos_fp, "dataset": dataset, "policy": cfg.policy, "pretrain": cfg.pretrain, "env": cfg.env, "seed": cfg.run.seed});
    // Only with rounds, so runs without DAgger keep their fingerprint; the expert labels.
    if cfg.dagger.rounds > 0 {
        fp["dagger"] = json!(cfg.dagger);
        fp["expert"] = json!(cfg.expert);
    }
    let (stage, state) = Stage::open(
        &cx.root,
        "pretrain",
        fp.clone(),
        &h,
        &format!("behaviour cloning on {}", dataset.display()),
        cx.out,
    )?;
    let policy_dir = if cfg.dagger.rounds > 0 {
        stage
            .dir
            .join(format!("dagger/round-{}/policy", cfg.dagger.rounds))
    } else {
        stage.dir.join("policy")
    };
    let (marker, reused) = match state {
        StageState::Done(m) => (m, true),
        _ => {
            let t0 = Instant::now();
            let bc_done = stage.dir.join("bc.json");
            if !bc_done.exists() {
                bc::pretrain::<B>(
                    cfg, dataset, None, &stage.dir, true, 0, cx.device, cx.out, cx.rec,
                )?;
                write_atomic(&bc_done, b"{}\n")
                    .with_context(|| format!("writing {}", bc_done.display()))?;
            }
            let rounds = dagger_rounds(cx, dataset, &stage.dir)?;
            let m = stage.finish(
                t0.elapsed().as_secs_f64(),
                json!({"steps": cfg.pretrain.steps, "dagger": rounds}),
            )?;
            cx.run
                .log(&json!({"stage": "pretrain", "seconds": m["seconds"]}))?;
            (m, false)
        }
    };
    let dagger = serde_json::from_value(marker["results"]["dagger"].clone()).unwrap_or_default();
    let ran = Ran::from_marker(&marker, reused);
    Ok((
        Pretrained {
            fp,
            policy_dir,
            dagger,
        },
        ran,
    ))
}

/// The DAgger rounds after behaviour cloning in `dir`. Each continues from the previous
/// policy, and its training steps follow the previous ones on the recording's train_step
/// timeline.
fn dagger_rounds<B: AutodiffBackend>(
    cx: &mut Ctx<'_, B>,
    dataset: &Path,
    dir: &Path,
) -> anyhow::Result<Vec<dagger::RoundRecord>> {
    let cfg = cx.cfg;
    let mut rounds = Vec::new();
    let (mut data, mut policy) = (dataset.to_path_buf(), dir.join("policy"));
    for r in 1..=cfg.dagger.rounds {
        let round_dir = dir.join(format!("dagger/round-{r}"));
        let shifted = TrainStepOffset::new(
            cx.rec,
            (cfg.pretrain.steps + (r - 1) * cfg.dagger.steps) as i64,
        );
        let record = dagger::round::<B>(
            cfg, r, &data, &policy, &round_dir, cx.device, cx.out, &shifted,
        )?;
        writeln!(
            cx.out,
            "      DAgger round {r}: the previous policy succeeded in {:.1}% of {} rollouts; \
             trained on {} episodes",
            100.0 * record.rollouts.success_rate,
            record.rollouts.episodes,
            record.episodes_in_data
        )?;
        rounds.push(record);
        data = round_dir.join("data");
        policy = round_dir.join("policy");
    }
    Ok(rounds)
}

/// Stage 3: the progress reward model (held-out metrics, and scored against rollouts of the BC
/// policy, so the stage depends on it); shaping uses it when [reward.shaping] names it.
fn reward_stage<B: AutodiffBackend>(
    cx: &mut Ctx<'_, B>,
    dataset: &Path,
    pre: &Pretrained,
) -> anyhow::Result<(RewardMetrics, Option<RewardMetrics>, Ran)> {
    let cfg = cx.cfg;
    let h = header(2, "reward");
    let fp = json!({"dataset": dataset, "progress": cfg.reward.progress, "obs": cfg.env.observation(), "vs_policy": {"pretrain": pre.fp, "episodes": cfg.reward.vs_policy_episodes}});
    let (stage, state) = Stage::open(
        &cx.root,
        "reward",
        fp,
        &h,
        "progress reward model Phi(s) on the dataset",
        cx.out,
    )?;
    let (marker, reused) = match state {
        StageState::Done(m) => (m, true),
        _ => {
            let t0 = Instant::now();
            let model = stage.dir.join("progress");
            let metrics =
                reward::train_progress(cfg, Some(dataset), &model, false, cx.rec, cx.out)?;
            cx.rec.text(
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
            let (vs_policy, _, rollouts) = reward::score_model(
                cfg,
                &model,
                Some(dataset),
                Some((
                    &pre.policy_dir,
                    cfg.reward.vs_policy_episodes,
                    diffrl_core::seeding::derive(cfg.run.seed, 0x5C0E),
                )),
            )?;
            reward::print_metrics(
                cx.out,
                &format!("held-out demos + {rollouts} rollouts of the BC policy"),
                &vs_policy,
            )?;
            let mut results = serde_json::to_value(&metrics)?;
            results["vs_policy"] = serde_json::to_value(&vs_policy)?;
            let m = stage.finish(t0.elapsed().as_secs_f64(), results)?;
            cx.run
                .log(&json!({"stage": "reward", "seconds": m["seconds"], "metrics": metrics}))?;
            (m, false)
        }
    };
    let reward: RewardMetrics = serde_json::from_value(marker["results"].clone())
        .with_context(|| format!("reading {}", stage.dir.join("stage.json").display()))?;
    let vs_policy = serde_json::from_value(marker["results"]["vs_policy"].clone()).ok();
    Ok((reward, vs_policy, Ran::from_marker(&marker, reused)))
}

/// Where GRPO's training steps start on the recording's train_step timeline: after BC's and
/// the DAgger rounds'.
fn grpo_offset(cfg: &RunConfig) -> i64 {
    (cfg.pretrain.steps + cfg.dagger.rounds * cfg.dagger.steps) as i64
}

/// Where the reward stage of the run folder `root` writes its progress model.
pub(crate) fn progress_model_dir(root: &Path) -> PathBuf {
    root.join("reward").join("progress")
}

/// The config `algorithm` runs with when its estimator reads a progress model (GRPO with
/// `grpo-lambda`) and none is named: [reward.shaping] set to the model of the run folder
/// `root`'s reward stage (potential shaping, gamma 0.99); None when nothing changes.
pub(crate) fn own_progress_model(
    cfg: &RunConfig,
    algorithm: Algorithm,
    root: &Path,
) -> Option<RunConfig> {
    let wants = algorithm == Algorithm::Grpo
        && cfg.grpo.advantage.estimator == diffrl_learn::advantages::Estimator::GrpoLambda;
    if !wants || cfg.reward.shaping.is_some() {
        return None;
    }
    let mut c = cfg.clone();
    c.reward.shaping = Some(crate::config::ShapingSection {
        model: progress_model_dir(root),
        gamma: 0.99,
        kind: Default::default(),
    });
    Some(c)
}

/// Stage 4: GRPO from the BC checkpoint. Returns its fingerprint, which evaluation reads.
fn grpo_stage<B: AutodiffBackend>(
    cx: &mut Ctx<'_, B>,
    pre: &Pretrained,
) -> anyhow::Result<(Value, Ran)> {
    let own;
    let cfg = match own_progress_model(cx.cfg, cx.cfg.run.finetune, &cx.root) {
        Some(c) => {
            own = c;
            &own
        }
        None => cx.cfg,
    };
    let h = header(3, "grpo");
    // The configured shaping (none when the run's own model is used: that model enters by its
    // content below, so moving the run folder keeps the fingerprint).
    let mut reward_fp = json!({"outcome": cfg.reward.outcome, "success_bonus": cfg.reward.success_bonus, "shaping": cx.cfg.reward.shaping, "srpo": cfg.reward.srpo});
    // Only when set, so runs from before SPA and the time cost existed keep their fingerprint.
    if let Some(spa) = &cfg.reward.spa {
        reward_fp["spa"] = json!(spa);
    }
    if cfg.reward.time_cost != 0.0 {
        reward_fp["time_cost"] = json!(cfg.reward.time_cost);
    }
    // The models it reads by content, not by path: retraining the reward stage (or any model
    // folder named here) redoes fine-tuning.
    let models = reward_model_hashes(cfg)?;
    if !models.is_empty() {
        reward_fp["model_content"] = Value::Object(models);
    }
    let mut fp = json!({"pretrain": pre.fp, "grpo": cfg.grpo, "reward": reward_fp});
    // Only when not GRPO, so runs from before the choice existed keep their fingerprint.
    if cfg.run.finetune != Algorithm::Grpo {
        fp["finetune"] = json!(cfg.run.finetune);
    }
    // More iterations and nothing else: the finished (or stopped) stage goes on from its saved
    // state; with the default constant learning rate that is the longer run exactly.
    extend_count(
        &cx.root,
        "grpo",
        &fp,
        ("grpo", "iterations"),
        "train_state",
        &h,
        cx.out,
    )?;
    let (stage, state) = Stage::open(
        &cx.root,
        "grpo",
        fp.clone(),
        &h,
        "fine-tuning the BC policy",
        cx.out,
    )?;
    let (marker, reused) = match state {
        StageState::Done(m) => (m, true),
        state => {
            let resume =
                matches!(state, StageState::Partial) && stage.dir.join("train_state").exists();
            let t0 = Instant::now();
            let shifted = TrainStepOffset::new(cx.rec, grpo_offset(cfg));
            finetune::finetune::<B>(
                cfg,
                cfg.run.finetune,
                &pre.policy_dir,
                &stage.dir,
                resume,
                0,
                cx.device,
                cx.out,
                &shifted,
            )?;
            let m = stage.finish(
                t0.elapsed().as_secs_f64(),
                json!({"iterations": cfg.grpo.iterations}),
            )?;
            cx.run
                .log(&json!({"stage": "grpo", "seconds": m["seconds"]}))?;
            (m, false)
        }
    };
    Ok((fp, Ran::from_marker(&marker, reused)))
}

/// Stage 5: both policies on the same seeded episodes (deterministic chains).
fn eval_stage<B: AutodiffBackend>(
    cx: &mut Ctx<'_, B>,
    pre: &Pretrained,
    grpo_fp: Value,
) -> anyhow::Result<(EvalReport, EvalReport, Ran)> {
    let cfg = cx.cfg;
    let h = header(4, "eval");
    let fp = json!({"pretrain": pre.fp, "grpo": grpo_fp, "eval": cfg.eval});
    let (stage, state) = Stage::open(
        &cx.root,
        "eval",
        fp,
        &h,
        "both policies on the same seeded episodes",
        cx.out,
    )?;
    if let StageState::Done(m) = state {
        let bc = read_report(&stage.dir.join("bc.json"))?;
        let grpo = read_report(&stage.dir.join("grpo.json"))?;
        return Ok((bc, grpo, Ran::from_marker(&m, true)));
    }
    let t0 = Instant::now();
    let offset = grpo_offset(cfg);
    let grpo_policy = cx.root.join("grpo/policy");
    let mut reports = Vec::new();
    for (what, dir, step) in [
        ("bc", &pre.policy_dir, offset),
        ("grpo", &grpo_policy, offset + cfg.grpo.iterations as i64),
    ] {
        writeln!(
            cx.out,
            "{h}: {what} policy on {} episodes",
            cfg.eval.episodes
        )?;
        let policy = load_policy::<B::InnerBackend>(cfg, dir, cx.device)?;
        cx.rec.set_time(Timeline::TrainStep, step);
        cx.rec.text(
            diffrl_viz::paths::RUN_LOG,
            Level::Info,
            &format!("evaluating the {what} policy ({})", dir.display()),
        );
        let r = run_eval(
            cfg,
            &policy,
            cx.device,
            cfg.eval.episodes,
            cfg.eval.seed,
            SampleMode::Deterministic,
            cx.rec,
        )?;
        write_report(&stage.dir.join(format!("{what}.json")), &r)?;
        let mut text = Vec::new();
        print_report(&mut text, &r)?;
        for line in String::from_utf8_lossy(&text).lines() {
            writeln!(cx.out, "      {what}: {line}")?;
        }
        reports.push(r);
    }
    let seconds = t0.elapsed().as_secs_f64();
    let grpo = reports.pop().context("two evaluations")?;
    let bc = reports.pop().context("two evaluations")?;
    stage.finish(seconds, json!({"bc": brief(&bc), "grpo": brief(&grpo)}))?;
    cx.run.log(
        &json!({"stage": "eval", "seconds": seconds, "bc": brief(&bc), "grpo": brief(&grpo)}),
    )?;
    Ok((
        bc,
        grpo,
        Ran {
            seconds,
            reused: false,
        },
    ))
}

fn read_report(path: &Path) -> anyhow::Result<EvalReport> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

pub(super) fn brief(r: &EvalReport) -> Value {
    let mut v = json!({"success_rate": r.success_rate, "ci95": r.ci95, "mean_max_score": r.mean_max_score, "mean_max_reward": r.mean_max_reward, "episodes": r.episodes, "successes": r.successes, "mean_length": r.mean_length});
    if !r.metrics.is_empty() {
        v["metrics"] = json!(r.metrics);
    }
    v
}

/// The demos stage's work. Returns the dataset folder, the expert summary when demos were recorded by this
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
        if !SHIPPED_DATASETS.iter().any(|d| configured == Path::new(d)) {
            bail!(
                "[demos].dataset = {:?} does not exist; set it to a LeRobot dataset folder, or to \
                 \"\" to record expert demonstrations",
                configured.display()
            );
        }
        writeln!(
            out,
            "{h}: the shipped dataset {} is not here (run from the repository root to use it); \
             recording {} expert episodes instead",
            configured.display(),
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
        &cfg.env,
        &demos_dir,
        &eps,
        &summary,
        provenance,
        cfg.demos.only_successful,
        true,
    )?;
    Ok((demos_dir, Some(summary), fingerprint))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpo_lambda_without_a_named_model_reads_the_run_s_own() {
        let (mut cfg, _) = crate::config::load_default("pusht").unwrap();
        let root = Path::new("runs/x");
        cfg.grpo.advantage.estimator = diffrl_learn::advantages::Estimator::Grpo;
        assert!(
            own_progress_model(&cfg, cfg.run.finetune, root).is_none(),
            "plain GRPO needs none"
        );
        // The embedded Push-T job's estimator.
        cfg.grpo.advantage.estimator = crate::config::load_default("pusht")
            .unwrap()
            .0
            .grpo
            .advantage
            .estimator;
        let own = own_progress_model(&cfg, cfg.run.finetune, root).expect("the run's model");
        let sh = own.reward.shaping.expect("shaping set");
        assert_eq!(sh.model, root.join("reward").join("progress"));
        // A named model is kept, and PPO reads none.
        cfg.reward.shaping = Some(crate::config::ShapingSection {
            model: "elsewhere".into(),
            gamma: 0.9,
            kind: Default::default(),
        });
        assert!(own_progress_model(&cfg, cfg.run.finetune, root).is_none());
        cfg.reward.shaping = None;
        cfg.run.finetune = Algorithm::Ppo;
        assert!(own_progress_model(&cfg, cfg.run.finetune, root).is_none());
    }

    /// The binary run outside the repository: a shipped dataset that is not under the working
    /// directory is recorded by the run itself (tests run in crates/cli, which has no assets/),
    /// and any other missing folder is an error naming the key.
    #[test]
    fn a_missing_shipped_dataset_is_recorded_and_another_missing_one_is_an_error() {
        let (mut cfg, _) = crate::config::load_default("pusht").unwrap();
        cfg.demos.episodes = 2;
        for shipped in SHIPPED_DATASETS {
            assert!(
                !Path::new(shipped).exists(),
                "{shipped} exists in the test's working directory"
            );
            cfg.demos.dataset = shipped.into();
            let root = tempfile::tempdir().unwrap();
            let mut out = Vec::new();
            let (dir, summary, fingerprint) =
                demos_stage(&cfg, root.path(), "demos", &mut out).unwrap();
            let text = String::from_utf8(out).unwrap();
            assert!(
                text.contains(&format!("the shipped dataset {shipped} is not here"))
                    && text.contains("recording 2 expert episodes instead"),
                "{text}"
            );
            assert_eq!(dir, root.path().join("demos"));
            assert_eq!(summary.expect("recorded by the run").episodes, 2);
            assert_eq!(fingerprint["episodes"], 2);
            let ds = read_dataset(&dir).unwrap();
            assert_eq!(ds.info["total_episodes"], 2, "{}", ds.info);
        }
        cfg.demos.dataset = "assets/no_such_dataset".into();
        let root = tempfile::tempdir().unwrap();
        let err = demos_stage(&cfg, root.path(), "demos", &mut Vec::new())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("[demos].dataset") && err.contains("assets/no_such_dataset"),
            "{err}"
        );
        assert!(!root.path().join("demos").exists());
    }
}
