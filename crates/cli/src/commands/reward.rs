//! `diffrl reward train|eval`: the progress reward model on a task's demonstrations, its held-out
//! metrics, and the reward stack fine-tuning optimises (`[reward]` in the run config).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use diffrl_core::dyn_task::DynTask;
use diffrl_core::episode::Episode;
use diffrl_core::lerobot::read_dataset;
use diffrl_core::record::{Level, Recorder, StepSeries, Timeline};
use diffrl_core::reward::{OutcomeReward, RewardModule};
use diffrl_core::seeding::{derive, rng};
use diffrl_core::space::ImageObs;
use diffrl_learn::rollout::{collect_groups, fresh_starts};
use diffrl_policy::checkpoint;
use diffrl_reward::labels::LabelKind;
use diffrl_reward::metrics::RewardMetrics;
use diffrl_reward::progress::{self, ProgressInput, ProgressModel, held_out};
use diffrl_reward::shaping::{ShapedReward, Shaping};

use crate::config::{self, RunConfig};
use crate::envs::{dataset_dir, env_spec, vec_env};
use crate::progress::bar;

type Cpu = diffrl_policy::CpuBackend;

/// `diffrl reward ...`.
#[derive(Debug, Subcommand)]
pub enum RewardCommand {
    /// Train the progress model Phi(s) on a demonstration dataset; prints held-out metrics.
    Train(TrainArgs),
    /// Reward-model metrics (VOC, pairwise accuracy, success AUROC, monotonicity) on held-out
    /// demonstrations and, optionally, rollouts of a policy.
    Eval(EvalArgs),
}

/// Arguments of `diffrl reward train`.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Run config ([reward.progress], [env]); default: the embedded Push-T config.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// LeRobot dataset folder (default: [demos].dataset, else runs/<name>/demos).
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// Output model folder (default: runs/<name>/reward/progress).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Label kind (default: [reward.progress].labels).
    #[arg(long, value_parser = parse_labels)]
    pub labels: Option<LabelKind>,
    /// Optimiser steps (default: [reward.progress].steps, or [reward.spa_train].steps).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Which model: `progress` (Phi(s), the default) or `spa` (stepwise attribution; default
    /// output runs/<name>/reward/spa).
    #[arg(long, default_value = "progress", value_parser = ["progress", "spa"])]
    pub kind: String,
    /// For `--kind spa`: also train on rollouts of this policy (attribution needs failures).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Rollouts of --policy.
    #[arg(long, default_value_t = 64)]
    pub episodes: usize,
}

/// Arguments of `diffrl reward eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Progress-model folder written by `diffrl reward train`.
    #[arg(long)]
    pub model: PathBuf,
    /// Run config ([env], [demos]).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Dataset whose held-out episodes are scored (default: the run's dataset).
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// Also score rollouts of this policy checkpoint (stochastic chains; mostly failures for
    /// a BC policy, which is what pairwise accuracy needs).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Rollouts of --policy.
    #[arg(long, default_value_t = 50)]
    pub episodes: usize,
    /// Seed of the rollouts.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Where the metrics JSON goes (default: <model>/../reward_eval.json).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

fn parse_labels(s: &str) -> Result<LabelKind, String> {
    match s {
        "stages" => Ok(LabelKind::Stages),
        "time" => Ok(LabelKind::Time),
        _ => Err(format!("unknown label kind {s:?}; available: stages, time")),
    }
}

/// The reward stack of `[reward]`: the environment's outcome, with progress shaping of the
/// step rewards when `[reward.shaping]` names a model.
pub fn reward_module(cfg: &RunConfig) -> anyhow::Result<Box<dyn RewardModule>> {
    let outcome = OutcomeReward {
        outcome: cfg.reward.outcome,
        success_bonus: cfg.reward.success_bonus,
        time_cost: cfg.reward.time_cost,
    };
    let base: Box<dyn RewardModule> = match cfg.reward.srpo {
        Some(srpo) => Box::new(diffrl_reward::process::SrpoReward::new(
            Box::new(outcome),
            srpo,
        )?),
        None => Box::new(outcome),
    };
    let base: Box<dyn RewardModule> = match &cfg.reward.spa {
        Some(spa) => {
            let model = diffrl_reward::spa::load::<Cpu>(&spa.model, &Default::default())
                .with_context(|| format!("loading the SPA model {}", spa.model.display()))?;
            let spec = env_spec(cfg)?;
            if model.meta.state_dim != spec.state_dim {
                bail!(
                    "the SPA model {} reads states of {} values, but the configured environment \
                     observes {} ([env] observes {})",
                    spa.model.display(),
                    model.meta.state_dim,
                    spec.state_dim,
                    cfg.env.observation()
                );
            }
            Box::new(diffrl_reward::spa::SpaReward::new(
                base,
                Arc::new(model),
                spa.weight,
            )?)
        }
        None => base,
    };
    let Some(sh) = &cfg.reward.shaping else {
        return Ok(base);
    };
    let model = load_model(&sh.model)?;
    if let Some([_, h, w]) = model.meta.image_shape {
        // The learner's episodes carry the environment's own observations.
        let image = env_spec(cfg)?.image;
        if image != Some([3, h, w]) {
            bail!(
                "the progress model {} reads {h} x {w} images, but the configured environment \
                 observes {} ({}); set [env].obs = \"pixels\" and image_size = {h}, or shape \
                 with a state model",
                sh.model.display(),
                cfg.env.observation(),
                image.map_or("no images".into(), |[_, h, w]| format!("{h} x {w} images"))
            );
        }
    } else {
        check_model_space(&model, cfg, &sh.model)?;
    }
    let shaped = ShapedReward::new(
        base,
        Arc::new(model),
        Shaping {
            gamma: sh.gamma,
            kind: sh.kind,
        },
    )?;
    Ok(Box::new(shaped))
}

fn load_model(dir: &Path) -> anyhow::Result<ProgressModel<Cpu>> {
    progress::load::<Cpu>(dir, &Default::default())
        .with_context(|| format!("loading the progress model {}", dir.display()))
}

/// A model trained for another observation space is refused before any rollout.
fn check_model_space(
    model: &ProgressModel<Cpu>,
    cfg: &RunConfig,
    dir: &Path,
) -> anyhow::Result<()> {
    if model.meta.image_shape.is_some() {
        // Scored episodes get their images rendered from the states at the model's size.
        return Ok(());
    }
    let spec = env_spec(cfg)?;
    if model.meta.state_dim != spec.state_dim {
        bail!(
            "the progress model {} reads states of {} values, but the configured environment \
             observes {} ([env] observes {}); train one for this observation space with \
             `diffrl reward train`",
            dir.display(),
            model.meta.state_dim,
            spec.state_dim,
            cfg.env.observation()
        );
    }
    Ok(())
}

/// Gives every observation of `episodes` (final ones included) the image of its state at
/// `size` x `size`, as the task draws it: image progress models on state datasets and state
/// rollouts.
fn render_images(task: &dyn DynTask, episodes: &mut [Episode], size: u32) -> anyhow::Result<()> {
    for (k, ep) in episodes.iter_mut().enumerate() {
        for (t, o) in ep
            .observations
            .iter_mut()
            .chain(ep.final_observation.as_mut())
            .enumerate()
        {
            let data = task
                .render_state(&o.state, size)
                .map_err(|m| anyhow::anyhow!("rendering observation {t} of episode {k}: {m}"))?;
            o.image = Some(ImageObs {
                height: size,
                width: size,
                data,
            });
        }
    }
    Ok(())
}

fn dataset_episodes(
    cfg: &RunConfig,
    arg: Option<&Path>,
) -> anyhow::Result<(PathBuf, Vec<Episode>)> {
    let dir = dataset_dir(cfg, arg);
    let ds = read_dataset(&dir).with_context(|| {
        format!(
            "reading the dataset {} (record one with `diffrl demos {}` or set [demos].dataset)",
            dir.display(),
            cfg.task
        )
    })?;
    let mut eps = ds
        .episodes("observation.state")
        .with_context(|| format!("reading the episodes of {}", dir.display()))?;
    // Models score what the environment observes (Push-T: keypoint views of the states).
    crate::envs::observe_recorded(&cfg.env, &mut eps).with_context(|| {
        format!(
            "[env] observes {} with {}",
            cfg.env.observation(),
            dir.display()
        )
    })?;
    Ok((dir, eps))
}

/// VOC and monotonicity as text: "n/a" when no successful held-out episode measured them (at
/// the default `holdout_every` of 10, fewer than 10 demonstrations hold none out), never a
/// 0.000 that reads as a measurement (summary.json writes null).
pub(crate) fn voc_text(m: &RewardMetrics) -> (String, String) {
    m.voc_measured()
        .map_or(("n/a".into(), "n/a".into()), |(v, mo)| {
            (format!("{v:.3}"), format!("{mo:.3}"))
        })
}

pub(crate) fn print_metrics(
    out: &mut dyn Write,
    what: &str,
    m: &RewardMetrics,
) -> anyhow::Result<()> {
    let opt = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.3}"));
    let (voc, monotonicity) = voc_text(m);
    writeln!(
        out,
        "{what}: VOC {voc} over {} successful episodes; pairwise accuracy {} over {} pairs; \
         success AUROC {}; monotonicity {monotonicity}; {} outputs clamped",
        m.voc_trajectories,
        opt(m.pairwise_accuracy),
        m.pairs,
        opt(m.success_auroc),
        m.clamped
    )?;
    Ok(())
}

/// Trains the progress model of `cfg` on `dataset` into `out`; returns its held-out metrics.
/// With `hop`, also trains the hop model and records the fused estimate's metrics (about as
/// long again; `diffrl run` skips it). Records Phi(s) and the environment's reward along the
/// first held-out demonstrations into `rec` (`rewards/progress`, `rewards/reward`).
pub fn train_progress(
    cfg: &RunConfig,
    dataset: Option<&Path>,
    out_dir: &Path,
    hop: bool,
    rec: &dyn Recorder,
    out: &mut dyn Write,
) -> anyhow::Result<RewardMetrics> {
    let (dir, mut episodes) = dataset_episodes(cfg, dataset)?;
    let pc = &cfg.reward.progress;
    let image = pc.input == ProgressInput::Image;
    let size = cfg.env.image_size();
    if image {
        let size = size.with_context(|| {
            format!(
                "[reward.progress].input = \"image\": task {} draws no images",
                cfg.task
            )
        })?;
        render_images(cfg.env.task(), &mut episodes, size)?;
    }
    let stages = cfg.env.stages();
    writeln!(
        out,
        "reward: progress model on {} ({} episodes, every {}th held out), {:?} labels, {} steps{}",
        dir.display(),
        episodes.len(),
        pc.holdout_every,
        pc.labels,
        pc.steps,
        if image {
            format!(
                ", reading {0} x {0} images rendered from the states",
                size.unwrap_or(0)
            )
        } else {
            String::new()
        }
    )?;
    let pb = bar(
        pc.steps as u64,
        "  reward [{bar:30}] {pos}/{len} loss {msg} {elapsed_precise} (eta {eta})",
    );
    let device = Default::default();
    let mut prep = progress::prepare(&episodes, stages.as_deref(), pc)?;
    // A model that reads the instruction knows the words of every instruction the task says.
    prep.add_texts(&cfg.env.texts());
    let mut model = progress::train_prepared::<diffrl_policy::CpuAutodiff>(
        &prep,
        pc,
        &device,
        &mut |step, loss| {
            pb.set_position(step as u64);
            pb.set_message(format!("{loss:.4}"));
        },
    )?;
    pb.finish_and_clear();
    let held: Vec<&Episode> = episodes
        .iter()
        .enumerate()
        .filter(|(i, _)| held_out(*i, pc.holdout_every))
        .map(|(_, e)| e)
        .collect();
    let metrics = progress::evaluate(&model, &held)?;
    if rec.enabled() {
        const SHOWN: usize = 3;
        for ep in held.iter().take(SHOWN).filter(|e| !e.is_empty()) {
            let phi = model.episode_progress(ep)?;
            let first = rec.tick(Timeline::EnvStep);
            rec.set_time(Timeline::EnvStep, first + ep.len() as i64 - 1);
            rec.step_series(StepSeries::Progress, first, &phi[..ep.len()]);
            let r: Vec<f64> = ep.rewards.iter().map(|&v| f64::from(v)).collect();
            rec.step_series(StepSeries::Reward, first, &r);
        }
        rec.text(
            diffrl_viz::paths::RUN_LOG,
            Level::Info,
            &format!(
                "reward model: Phi(s) (rewards/progress) and the environment's reward along the \
                 first {SHOWN} held-out demonstrations, one after the other on env_step"
            ),
        );
    }
    // The hop model reads states; it is a diagnostic of state models only.
    if hop && !image {
        let train_refs: Vec<&Episode> = prep.episodes.iter().collect();
        let hop = diffrl_reward::hop::train::<diffrl_policy::CpuAutodiff>(
            &train_refs,
            &prep.labels,
            &prep.norm,
            &pc.hidden,
            pc.steps,
            pc.batch_size,
            pc.lr,
            pc.seed ^ 0x40,
            &device,
        )?;
        let fused = progress::evaluate_fused(&model, &hop, &held)?;
        print_metrics(out, "held-out, fused with the hop model", &fused)?;
        model.meta.info["held_out_fused"] = serde_json::to_value(&fused)?;
    }
    model.meta.info["dataset"] = serde_json::json!(dir.display().to_string());
    model.meta.info["held_out"] = serde_json::to_value(&metrics)?;
    progress::save(&model, out_dir)?;
    print_metrics(out, "held-out", &metrics)?;
    writeln!(out, "wrote {}", out_dir.display())?;
    Ok(metrics)
}

/// Trains the SPA attribution model on the dataset's episodes plus `rollouts` (every 10th
/// episode held out); returns the held-out mean |sum of contributions - outcome| and the
/// correlation of the sums with the outcomes.
pub fn train_spa(
    cfg: &RunConfig,
    dataset: Option<&Path>,
    rollouts: Vec<Episode>,
    out_dir: &Path,
    out: &mut dyn Write,
) -> anyhow::Result<serde_json::Value> {
    let (dir, mut episodes) = dataset_episodes(cfg, dataset)?;
    let demos = episodes.len();
    episodes.extend(rollouts);
    let outcome = OutcomeReward {
        outcome: cfg.reward.outcome,
        success_bonus: cfg.reward.success_bonus,
        time_cost: cfg.reward.time_cost,
    };
    let outcomes: Vec<f64> = episodes
        .iter()
        .map(|e| outcome.rewards(e).map(|r| r.outcome))
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("outcomes: {}", e.0))?;
    let (train, held): (Vec<usize>, Vec<usize>) =
        (0..episodes.len()).partition(|&i| !held_out(i, 10));
    let sc = &cfg.reward.spa_train;
    writeln!(
        out,
        "reward: SPA attribution on {} demonstrations of {} + {} policy rollouts (every 10th held out), {} steps",
        demos,
        dir.display(),
        episodes.len() - demos,
        sc.steps
    )?;
    let pb = bar(
        sc.steps as u64,
        "  spa [{bar:30}] {pos}/{len} loss {msg} {elapsed_precise} (eta {eta})",
    );
    let eps: Vec<&Episode> = train.iter().map(|&i| &episodes[i]).collect();
    let ys: Vec<f64> = train.iter().map(|&i| outcomes[i]).collect();
    let mut model = diffrl_reward::spa::train::<diffrl_policy::CpuAutodiff>(
        &eps,
        &ys,
        sc,
        &Default::default(),
        &mut |step, loss| {
            pb.set_position(step as u64);
            pb.set_message(format!("{loss:.4}"));
        },
    )?;
    pb.finish_and_clear();
    let mut sums = Vec::new();
    let mut truth = Vec::new();
    for &i in &held {
        sums.push(model.contributions(&episodes[i])?.iter().sum::<f64>());
        truth.push(outcomes[i]);
    }
    let n = sums.len().max(1) as f64;
    let mae = sums
        .iter()
        .zip(&truth)
        .map(|(a, b)| (a - b).abs())
        .sum::<f64>()
        / n;
    let corr = diffrl_reward::metrics::pearson(&sums, &truth);
    let metrics = serde_json::json!({"held_out_episodes": held.len(), "mean_abs_error": mae, "correlation": corr});
    writeln!(
        out,
        "held-out: {} episodes, mean |sum of contributions - outcome| {mae:.3}, correlation {}",
        held.len(),
        corr.map_or("n/a".into(), |c| format!("{c:.3}"))
    )?;
    model.meta.info["held_out"] = metrics.clone();
    model.meta.info["dataset"] = serde_json::json!(dir.display().to_string());
    diffrl_reward::spa::save(&model, out_dir)?;
    writeln!(out, "wrote {}", out_dir.display())?;
    Ok(metrics)
}

/// Rollouts of a policy checkpoint on the configured environment (stochastic chains).
fn policy_rollouts(
    cfg: &RunConfig,
    policy_dir: &Path,
    episodes: usize,
    seed: u64,
) -> anyhow::Result<Vec<Episode>> {
    let device = Default::default();
    let (policy, _) = checkpoint::load::<Cpu>(policy_dir, &device)
        .with_context(|| format!("loading the policy {}", policy_dir.display()))?;
    crate::envs::check_spec(
        &policy.spec,
        &env_spec(cfg)?,
        &format!("the policy {}", policy_dir.display()),
    )?;
    let mut out = Vec::with_capacity(episodes);
    let pb = bar(
        episodes as u64,
        "  rollouts [{bar:30}] {pos}/{len} {elapsed_precise} (eta {eta})",
    );
    let mut round = 0u64;
    while out.len() < episodes {
        let n = (episodes - out.len()).min(cfg.eval.envs.max(1));
        let mut venv = vec_env(cfg, n);
        let mut r = rng(derive(seed, round));
        let (rollouts, _) = collect_groups(
            &mut venv,
            &policy,
            None,
            n,
            1,
            &fresh_starts(derive(seed, 1000 + round), n, 1),
            &mut r,
            &device,
            &diffrl_core::record::NoRecorder,
        )?;
        out.extend(rollouts.into_iter().map(|g| g.episode));
        pb.set_position(out.len() as u64);
        round += 1;
    }
    pb.finish_and_clear();
    Ok(out)
}

/// Metrics of the progress model in `model_dir` on the held-out demonstrations of `dataset`
/// plus, with `policy = (dir, episodes, seed)`, that many stochastic rollouts of the policy
/// (mostly failures for a BC policy: what pairwise accuracy and AUROC need). Returns the
/// metrics, the number of held-out demos and of rollouts.
pub(crate) fn score_model(
    cfg: &RunConfig,
    model_dir: &Path,
    dataset: Option<&Path>,
    policy: Option<(&Path, usize, u64)>,
) -> anyhow::Result<(RewardMetrics, usize, usize)> {
    let model = load_model(model_dir)?;
    check_model_space(&model, cfg, model_dir)?;
    let (_, episodes) = dataset_episodes(cfg, dataset)?;
    let every = model.meta.config.holdout_every;
    let mut scored: Vec<Episode> = episodes
        .into_iter()
        .enumerate()
        .filter(|(i, _)| held_out(*i, every))
        .map(|(_, e)| e)
        .collect();
    let demos = scored.len();
    if let Some((p, episodes, seed)) = policy {
        scored.extend(policy_rollouts(cfg, p, episodes, seed)?);
    }
    if let Some([_, h, _]) = model.meta.image_shape {
        render_images(cfg.env.task(), &mut scored, h as u32)?;
    }
    let refs: Vec<&Episode> = scored.iter().collect();
    let metrics = progress::evaluate(&model, &refs)?;
    Ok((metrics, demos, scored.len() - demos))
}

/// Runs `diffrl reward ...`; `train` records into `rerun` when given.
pub fn run(
    cmd: &RewardCommand,
    rerun: Option<&diffrl_viz::RerunSink>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match cmd {
        RewardCommand::Train(a) => {
            let (mut cfg, _) = config::load(a.config.as_deref())?;
            if let Some(l) = a.labels {
                cfg.reward.progress.labels = l;
            }
            if let Some(s) = a.steps {
                anyhow::ensure!(s >= 1, "--steps must be at least 1");
                cfg.reward.progress.steps = s;
                cfg.reward.spa_train.steps = s;
            }
            if a.kind == "spa" {
                crate::viz::ignored(rerun, "reward train --kind spa");
                let rollouts = match &a.policy {
                    Some(p) => policy_rollouts(&cfg, p, a.episodes, 7)?,
                    None => Vec::new(),
                };
                let out_dir = a
                    .out
                    .clone()
                    .unwrap_or_else(|| cfg.run.runs_dir.join(&cfg.run.name).join("reward/spa"));
                train_spa(&cfg, a.dataset.as_deref(), rollouts, &out_dir, out)?;
                return Ok(());
            }
            anyhow::ensure!(
                a.policy.is_none(),
                "--policy is for --kind spa (the progress model trains on demonstrations)"
            );
            let out_dir = a
                .out
                .clone()
                .unwrap_or_else(|| cfg.run.runs_dir.join(&cfg.run.name).join("reward/progress"));
            let recording = crate::viz::Recording::open(
                rerun,
                diffrl_viz::RerunSink::Off,
                "reward train",
                Timeline::EnvStep,
                out,
            )?;
            train_progress(
                &cfg,
                a.dataset.as_deref(),
                &out_dir,
                true,
                recording.recorder(),
                out,
            )?;
            Ok(())
        }
        RewardCommand::Eval(a) => {
            crate::viz::ignored(rerun, "reward eval");
            let (cfg, _) = config::load(a.config.as_deref())?;
            let policy = a.policy.as_deref().map(|p| (p, a.episodes, a.seed));
            let (metrics, demos, rollouts) =
                score_model(&cfg, &a.model, a.dataset.as_deref(), policy)?;
            let scored_len = demos + rollouts;
            print_metrics(
                out,
                &format!(
                    "{demos} held-out demos{}",
                    if a.policy.is_some() {
                        format!(" + {rollouts} policy rollouts")
                    } else {
                        String::new()
                    }
                ),
                &metrics,
            )?;
            let path = a.out.clone().unwrap_or_else(|| {
                a.model.parent().map_or_else(
                    || PathBuf::from("reward_eval.json"),
                    |p| p.join("reward_eval.json"),
                )
            });
            let doc = serde_json::json!({
                "model": a.model.display().to_string(),
                "held_out_demos": demos,
                "policy": a.policy.as_ref().map(|p| p.display().to_string()),
                "policy_rollouts": scored_len - demos,
                "metrics": metrics,
            });
            diffrl_core::fs::write_atomic(&path, &serde_json::to_vec_pretty(&doc)?)
                .with_context(|| format!("writing {}", path.display()))?;
            writeln!(out, "wrote {}", path.display())?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn voc_without_held_out_successes_reads_na() {
        let mut m = RewardMetrics {
            voc: 0.0,
            voc_trajectories: 0,
            pairwise_accuracy: None,
            pairs: 0,
            success_auroc: None,
            monotonicity: 1.0,
            clamped: 0,
        };
        assert_eq!(voc_text(&m), ("n/a".into(), "n/a".into()));
        let mut text = Vec::new();
        print_metrics(&mut text, "held-out", &m).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains("VOC n/a over 0") && text.contains("monotonicity n/a"),
            "{text}"
        );
        m.voc = 0.98;
        m.voc_trajectories = 3;
        assert_eq!(voc_text(&m), ("0.980".into(), "1.000".into()));
    }
}
