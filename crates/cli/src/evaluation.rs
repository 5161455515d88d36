//! Seeded evaluation of a policy on the configured environment ([`run_eval`]), the periodic
//! evaluations during training, and eval.json reports.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use burn::tensor::backend::Backend;
use diffrl_core::fs::write_atomic;
use diffrl_core::record::{Level, Recorder, Timeline, Topic};
use diffrl_learn::LearnError;
use diffrl_learn::eval::{EvalReport, evaluate};
use diffrl_policy::{Policy, SampleMode};
use indicatif::ProgressBar;

use crate::config::RunConfig;
use crate::envs::vec_env;
use crate::progress::bar;

/// Evaluates `policy` on the configured environment, recording environment 0's episodes and
/// every episode's end into `rec` (`&NoRecorder` for none), then a summary line.
pub fn run_eval<B: Backend>(
    cfg: &RunConfig,
    policy: &Policy<B>,
    device: &B::Device,
    episodes: usize,
    seed: u64,
    mode: SampleMode,
    rec: &dyn Recorder,
) -> Result<EvalReport, LearnError> {
    let mut venv = vec_env(cfg, cfg.eval.envs.min(episodes.max(1)));
    let pb = bar(
        episodes as u64,
        "  eval [{bar:30}] {pos}/{len} episodes {elapsed_precise} (eta {eta})",
    );
    let report = evaluate(
        &mut venv,
        policy,
        device,
        episodes,
        seed,
        mode,
        &mut |d, _| pb.set_position(d as u64),
        rec,
    );
    pb.finish_and_clear();
    if let Ok(r) = &report
        && rec.enabled()
    {
        rec.text(
            diffrl_viz::paths::EVAL_SUMMARY,
            Level::Info,
            &format!(
                "evaluation (seed {seed}): success {:.1}% ({}/{}; Wilson 95% CI {:.1}-{:.1}%),                  mean max score {:.3}{}, mean length {:.1}",
                100.0 * r.success_rate,
                r.successes,
                r.episodes,
                100.0 * r.ci95[0],
                100.0 * r.ci95[1],
                r.mean_max_score,
                max_reward_text(r),
                r.mean_length
            ),
        );
        rec.flush();
    }
    report
}

/// A periodic evaluation during training on `n` episodes: prints a line above the progress bar
/// and returns the summary stored with the checkpoint (None when off).
pub(crate) fn periodic_eval<B: Backend>(
    cfg: &RunConfig,
    pb: &ProgressBar,
    policy: &Policy<B>,
    at: (&str, usize),
    n: usize,
    rec: &dyn Recorder,
) -> Result<Option<serde_json::Value>, LearnError> {
    if n == 0 {
        return Ok(None);
    }
    let device = policy_device(policy);
    rec.set_time(Timeline::TrainStep, at.1 as i64);
    let r = pb.suspend(|| {
        run_eval(
            cfg,
            policy,
            &device,
            n,
            cfg.eval.seed,
            SampleMode::Deterministic,
            rec,
        )
    })?;
    rec.train_scalars(
        at.1 as i64,
        &[
            (Topic::Success, "eval", r.success_rate),
            (Topic::Reward, "eval_mean_max_score", r.mean_max_score),
        ],
    );
    pb.println(format!(
        "  {} {}: success {:.1}% (95% CI {:.1}-{:.1}%), mean max score {:.3} over {n} episodes{}",
        at.0,
        at.1,
        100.0 * r.success_rate,
        100.0 * r.ci95[0],
        100.0 * r.ci95[1],
        r.mean_max_score,
        if r.metrics.is_empty() {
            String::new()
        } else {
            format!("; {}", r.metrics_text())
        }
    ));
    Ok(Some(serde_json::json!({
        at.0: at.1,
        "success_rate": r.success_rate,
        "ci95": r.ci95,
        "mean_max_score": r.mean_max_score,
        "mean_max_reward": r.mean_max_reward,
        "mean_length": r.mean_length,
        "episodes": r.episodes,
        "metrics": r.metrics
    })))
}

/// The device a policy's weights live on.
pub(crate) fn policy_device<B: Backend>(policy: &Policy<B>) -> B::Device {
    use burn::module::Module;
    policy.model.devices().pop().unwrap_or_default()
}

/// The evaluation at the end of a training command: `episodes` seeded episodes of `policy`
/// (deterministic chains) at `step` on the recording's train_step timeline, written to
/// `out_dir/eval.json` and printed; None when `episodes` is 0.
pub(crate) fn final_eval<B: Backend>(
    cfg: &RunConfig,
    policy: &Policy<B>,
    step: usize,
    episodes: usize,
    out_dir: &Path,
    out: &mut dyn Write,
    rec: &dyn Recorder,
) -> anyhow::Result<Option<EvalReport>> {
    if episodes == 0 {
        return Ok(None);
    }
    rec.set_time(Timeline::TrainStep, step as i64);
    let r = run_eval(
        cfg,
        policy,
        &policy_device(policy),
        episodes,
        cfg.eval.seed,
        SampleMode::Deterministic,
        rec,
    )?;
    write_report(&out_dir.join("eval.json"), &r)?;
    print_report(out, &r)?;
    Ok(Some(r))
}

/// Writes an eval.json (atomically).
pub(crate) fn write_report(path: &Path, r: &EvalReport) -> anyhow::Result<()> {
    let json = serde_json::to_vec_pretty(r)?;
    write_atomic(path, &json).with_context(|| format!("writing {}", path.display()))
}

/// `, mean max reward 0.953` (LeRobot's `avg_max_reward`), or nothing for a report without it.
pub(crate) fn max_reward_text(r: &EvalReport) -> String {
    r.mean_max_reward
        .map_or_else(String::new, |m| format!(", mean max reward {m:.3}"))
}

/// Prints an evaluation's one-line summary.
pub(crate) fn print_report(out: &mut dyn Write, r: &EvalReport) -> anyhow::Result<()> {
    writeln!(
        out,
        "eval: success {:.1}% ({}/{}; Wilson 95% CI {:.1}-{:.1}%), mean max score {:.3}{}, mean length {:.1}",
        100.0 * r.success_rate,
        r.successes,
        r.episodes,
        100.0 * r.ci95[0],
        100.0 * r.ci95[1],
        r.mean_max_score,
        max_reward_text(r),
        r.mean_length
    )?;
    if !r.metrics.is_empty() {
        writeln!(out, "eval: {}", r.metrics_text())?;
    }
    Ok(())
}
