//! `diffrl run`: the main job. Stages run in order into `runs/<name>/`; a stage whose output
//! is complete (written atomically) is reused, so an interrupted run resumes where it stopped.
//!
//! Stages so far: 1. demos (expert -> LeRobot dataset, or `[demos].dataset` from disk),
//! 2. pretrain (behaviour cloning of the diffusion policy, resumable) with its seeded
//! evaluation. Reward models and GRPO join as their issues land; the report says which ran.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use diffrl_core::fs::write_atomic;
use diffrl_core::lerobot::read_dataset;
use diffrl_core::run_dir::RunDir;
use serde_json::json;

use crate::config;
use crate::demos;
use crate::train;
use diffrl_learn::eval::EvalReport;

/// Runs the pipeline for `config_path` (embedded default when `None`).
pub fn run(
    config_path: Option<&Path>,
    name: Option<String>,
    episodes: Option<usize>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let (mut cfg, text) = config::load(config_path)?;
    if let Some(n) = name {
        anyhow::ensure!(
            !n.is_empty() && !n.contains(['/', '\\']),
            "--name must be a plain folder name"
        );
        cfg.run.name = n;
    }
    if let Some(e) = episodes {
        anyhow::ensure!(e >= 1, "--episodes must be at least 1");
        cfg.demos.episodes = e;
    }
    // The resolved config (overrides applied) is what the run folder records.
    let resolved = toml::to_string(&cfg).unwrap_or(text);
    let mut run = RunDir::open(&cfg.run.runs_dir, &cfg.run.name, &resolved).with_context(|| {
        format!(
            "creating run folder {}",
            cfg.run.runs_dir.join(&cfg.run.name).display()
        )
    })?;
    writeln!(out, "run folder: {}", run.path().display())?;

    // Stage 1: demonstrations.
    let demos_dir = run.path().join("demos");
    let fingerprint = json!({"seed": cfg.run.seed, "episodes": cfg.demos.episodes, "only_successful": cfg.demos.only_successful, "env": cfg.env, "expert": cfg.expert});
    let existing = read_dataset(&demos_dir)
        .ok()
        .filter(|ds| ds.info["diffrl"]["provenance"]["fingerprint"] == fingerprint);
    let summary = if !cfg.demos.dataset.as_os_str().is_empty() {
        writeln!(
            out,
            "[1/2] demos: using the dataset {} ([demos].dataset)",
            cfg.demos.dataset.display()
        )?;
        None
    } else if let Some(ds) = existing {
        writeln!(
            out,
            "[1/2] demos: reusing {} ({} frames)",
            demos_dir.display(),
            ds.len()
        )?;
        serde_json::from_value(ds.info["diffrl"]["summary"].clone()).ok()
    } else {
        writeln!(
            out,
            "[1/2] demos: {} expert episodes (MPPI over cloned Rapier worlds)",
            cfg.demos.episodes
        )?;
        let (eps, summary) = demos::generate(
            &cfg.env,
            &cfg.expert,
            cfg.demos.episodes,
            cfg.run.seed,
            cfg.run.threads,
        )?;
        let provenance = json!({"command": "diffrl run", "fingerprint": fingerprint, "diffrl_version": env!("CARGO_PKG_VERSION")});
        demos::write(
            &demos_dir,
            &eps,
            &summary,
            provenance,
            cfg.demos.only_successful,
            true,
        )?;
        run.log(&json!({"stage": "demos", "summary": summary}))?;
        Some(serde_json::to_value(&summary)?)
    };
    let summary: Option<serde_json::Value> = summary;
    let demo_summary: Option<demos::DemoSummary> = match &summary {
        Some(s) => Some(serde_json::from_value(s.clone()).context("reading the demo summary")?),
        None => None,
    };
    if let Some(s) = &demo_summary {
        writeln!(out, "      {s}")?;
    }

    // Stage 2: behaviour cloning + evaluation.
    let dataset = if cfg.demos.dataset.as_os_str().is_empty() {
        demos_dir.clone()
    } else {
        cfg.demos.dataset.clone()
    };
    let pre_dir = run.path().join("pretrain");
    let pre_fp = json!({"demos": fingerprint, "dataset": dataset, "policy": cfg.policy, "pretrain": cfg.pretrain, "eval": cfg.eval, "env": cfg.env});
    let fp_path = pre_dir.join("fingerprint.json");
    let same = std::fs::read_to_string(&fp_path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|v| v == pre_fp);
    let done: Option<EvalReport> = if same {
        std::fs::read_to_string(pre_dir.join("eval.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
    } else {
        None
    };
    let t0 = std::time::Instant::now();
    let bc = match done {
        Some(r) => {
            writeln!(out, "[2/2] pretrain: reusing {}", pre_dir.display())?;
            r
        }
        None => {
            if !same && pre_dir.exists() {
                writeln!(
                    out,
                    "[2/2] pretrain: settings changed since {} was written; starting it over",
                    pre_dir.display()
                )?;
                std::fs::remove_dir_all(&pre_dir)
                    .with_context(|| format!("removing {}", pre_dir.display()))?;
            } else if pre_dir.join("train_state").exists() {
                writeln!(out, "[2/2] pretrain: resuming {}", pre_dir.display())?;
            } else {
                writeln!(
                    out,
                    "[2/2] pretrain: behaviour cloning on {}",
                    dataset.display()
                )?;
            }
            std::fs::create_dir_all(&pre_dir)
                .with_context(|| format!("creating {}", pre_dir.display()))?;
            write_atomic(&fp_path, serde_json::to_string_pretty(&pre_fp)?.as_bytes())?;
            let device = Default::default();
            let r = train::pretrain::<diffrl_policy::CpuAutodiff>(
                &cfg,
                &dataset,
                &pre_dir,
                true,
                cfg.eval.episodes,
                &device,
                out,
            )?
            .context("the pretrain stage evaluates at least one episode")?;
            run.log(&json!({"stage": "pretrain", "eval": {"success_rate": r.success_rate, "ci95": r.ci95, "mean_max_score": r.mean_max_score, "mean_length": r.mean_length, "episodes": r.episodes}, "seconds": t0.elapsed().as_secs_f64()}))?;
            r
        }
    };

    let mut report = format!(
        "# diffrl run `{name}`\n\nConfig: `config.toml` (resolved). Task: {task}.\n\n## Stages\n\n| stage | status | output |\n|---|---|---|\n\
         | demos | done | `demos/` (LeRobot v3.0) |\n| pretrain + eval | done | `pretrain/policy/` (checkpoint), `pretrain/eval.json` |\n\
         | reward, grpo | not available yet in this version | |\n",
        name = cfg.run.name,
        task = cfg.task,
    );
    if let Some(s) = &demo_summary {
        report.push_str(&format!(
            "\n## Expert demonstrations\n\n- episodes: {n}\n- success rate: {sr:.1}% (Wilson 95% CI {lo:.1}-{hi:.1}%)\n- mean max reward: {mr:.3}\n- mean length: {ml:.1} steps\n- wall time: {sec:.1} s\n",
            n = s.episodes,
            sr = 100.0 * s.success_rate,
            lo = 100.0 * s.success_ci95[0],
            hi = 100.0 * s.success_ci95[1],
            mr = s.mean_max_reward,
            ml = s.mean_length,
            sec = s.seconds,
        ));
    }
    report.push_str(&format!(
        "\n## Behaviour cloning ({kind:?} policy, {denoiser:?} denoiser, K = {k})\n\n| policy | episodes | success | Wilson 95% CI | mean max score | mean length |\n|---|---|---|---|---|---|\n\
         | BC (EMA) | {n} | {sr:.1}% | {lo:.1}-{hi:.1}% | {ms:.3} | {ml:.1} |\n",
        kind = cfg.policy.kind,
        denoiser = cfg.policy.denoiser.kind,
        k = cfg.policy.diffusion.denoising_steps,
        n = bc.episodes,
        sr = 100.0 * bc.success_rate,
        lo = 100.0 * bc.ci95[0],
        hi = 100.0 * bc.ci95[1],
        ms = bc.mean_max_score,
        ml = bc.mean_length,
    ));
    write_atomic(&run.path().join("report.md"), report.as_bytes())?;
    writeln!(out, "report: {}", run.path().join("report.md").display())?;
    Ok(())
}
