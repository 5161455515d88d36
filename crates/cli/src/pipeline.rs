//! `diffrl run`: the main job. Stages run in order into `runs/<name>/`; a stage whose output
//! is complete (written atomically) is reused, so an interrupted run resumes where it stopped.
//!
//! Stages so far: 1. demos (expert -> LeRobot dataset). Pretraining, reward models, GRPO and
//! evaluation join as their issues land; the report says which stages ran.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use diffrl_core::fs::write_atomic;
use diffrl_core::lerobot::read_dataset;
use diffrl_core::run_dir::RunDir;
use serde_json::json;

use crate::config;
use crate::demos;

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
    let summary = if let Some(ds) = existing {
        writeln!(
            out,
            "[1/1] demos: reusing {} ({} frames)",
            demos_dir.display(),
            ds.len()
        )?;
        serde_json::from_value(ds.info["diffrl"]["summary"].clone()).ok()
    } else {
        writeln!(
            out,
            "[1/1] demos: {} expert episodes (MPPI over cloned Rapier worlds)",
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
    if let Some(s) = &summary {
        let s: demos::DemoSummary =
            serde_json::from_value(s.clone()).context("reading the demo summary")?;
        writeln!(out, "      {s}")?;
        let report = format!(
            "# diffrl run `{name}`\n\nConfig: `config.toml` (resolved). Task: {task}.\n\n## Stages\n\n| stage | status | output |\n|---|---|---|\n\
             | demos | done | `demos/` (LeRobot v3.0) |\n| pretrain, reward, grpo, eval | not available yet in this version | |\n\n\
             ## Expert demonstrations\n\n- episodes: {n}\n- success rate: {sr:.1}% (Wilson 95% CI {lo:.1}-{hi:.1}%)\n- mean max reward: {mr:.3}\n- mean length: {ml:.1} steps\n- wall time: {sec:.1} s\n",
            name = cfg.run.name,
            task = cfg.task,
            n = s.episodes,
            sr = 100.0 * s.success_rate,
            lo = 100.0 * s.success_ci95[0],
            hi = 100.0 * s.success_ci95[1],
            mr = s.mean_max_reward,
            ml = s.mean_length,
            sec = s.seconds,
        );
        write_atomic(&run.path().join("report.md"), report.as_bytes())?;
        writeln!(out, "report: {}", run.path().join("report.md").display())?;
    }
    Ok(())
}
