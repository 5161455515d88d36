//! report.md, summary.json and the learning-curve PNGs of a finished run.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use diffrl_core::fs::write_atomic;
use diffrl_core::stats;
use diffrl_learn::eval::EvalReport;
use serde_json::{Value, json};

use super::stages::{Results, brief};
use crate::commands::reward::voc_text;
use crate::config::RunConfig;
use crate::plots::{Panel, Series, curve, metrics_lines};

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

/// One line on GRPO's periodic evaluations (`[grpo] eval_every`), from the BC policy through
/// each evaluated iteration to the final policy; None when there were none.
fn grpo_evals_line(root: &Path, r: &Results) -> Option<String> {
    let lines = metrics_lines(&root.join("grpo/metrics.jsonl"));
    let mut evals = std::collections::BTreeMap::new();
    for l in &lines {
        let e = &l["eval"];
        if let (Some(it), Some(s), Some(n)) = (
            e["iteration"].as_u64(),
            e["success_rate"].as_f64(),
            e["episodes"].as_u64(),
        ) {
            evals.insert(it, (s, n));
        }
    }
    let n = evals.values().next()?.1;
    let steps: Vec<String> = evals
        .iter()
        .map(|(it, (s, _))| format!("{it}: {:.1}%", 100.0 * s))
        .collect();
    Some(format!(
        "{}'s success during training ({n} evaluation episodes each, deterministic chains): \
         BC {:.1}% ({} episodes), iteration {}, final {:.1}% ({} episodes).\n\n",
        learner(r),
        100.0 * r.bc.success_rate,
        r.bc.episodes,
        steps.join(", iteration "),
        100.0 * r.grpo.success_rate,
        r.grpo.episodes
    ))
}

/// The fine-tuning learner's name in report.md ("GRPO" or "PPO"; `[run] finetune`).
fn learner(r: &Results) -> String {
    r.learner.name().to_uppercase()
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

pub(super) fn summary_json(r: &Results, total: f64, quick: bool) -> Value {
    let paired = paired_score_diff(&r.bc, &r.grpo);
    json!({
        "bc": brief(&r.bc),
        "grpo": brief(&r.grpo),
        "finetune": r.learner,
        "grpo_minus_bc": {
            "success_rate": r.grpo.success_rate - r.bc.success_rate,
            "mean_max_score": paired.map(|p| p.0),
            "mean_max_score_ci95": paired.map(|p| [p.0 - p.1, p.0 + p.1]),
            "wilson_intervals_separate": r.grpo.ci95[0] > r.bc.ci95[1] || r.bc.ci95[0] > r.grpo.ci95[1],
            "mcnemar": mcnemar(&r.bc, &r.grpo).map(|(g, b, p)| json!({"only_grpo_succeeded": g, "only_bc_succeeded": b, "p_value": p})),
        },
        "reward": {
            // null, not 0.000 and 1.000, when no successful held-out demonstration measured them.
            "voc": r.reward.voc_measured().map(|m| m.0),
            "voc_trajectories": r.reward.voc_trajectories,
            "pairwise_accuracy": r.reward.pairwise_accuracy,
            "success_auroc": r.reward.success_auroc,
            "monotonicity": r.reward.voc_measured().map(|m| m.1),
            "pairs": r.reward.pairs,
            "vs_policy": r.reward_vs_policy.as_ref().map(|m| json!({
                "pairwise_accuracy": m.pairwise_accuracy,
                "success_auroc": m.success_auroc,
                "pairs": m.pairs,
                "voc": m.voc_measured().map(|m| m.0),
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

/// The learning-curve PNGs under plots/: behaviour cloning, and GRPO; returns (file, caption).
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
                title: format!("{}: training rollouts (stochastic chains)", learner(r)),
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
                title: format!("{}: evaluation (deterministic chains)", learner(r)),
                x_label: "iteration (0 = the BC policy)".into(),
                y_label: "percent".into(),
                series: evals,
            },
            Panel {
                title: format!("{}: update size", learner(r)),
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
        format!("{}: rollouts, evaluations, update size", learner(r)),
    ));
    Ok(written)
}

/// Writes summary.json, report.md and the plots, and prints the one-line result.
pub(super) fn finish(
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
            "| {name} | {} | {:.1}% ({}/{}) | {:.1}-{:.1}% | {:.3} | {} | {:.1} |\n",
            e.episodes,
            pct(e.success_rate),
            e.successes,
            e.episodes,
            pct(e.ci95[0]),
            pct(e.ci95[1]),
            e.mean_max_score,
            e.mean_max_reward
                .map_or_else(|| "-".to_string(), |m| format!("{m:.3}")),
            e.mean_length
        )
    };
    let separate = summary["grpo_minus_bc"]["wilson_intervals_separate"].as_bool() == Some(true);
    let mut md = format!(
        "# diffrl run `{name}`{quick}\n\nConfig: `config.toml` (resolved). Task: {task}. Dataset: `{ds}`. \
         Summary: `summary.json`. Recording: `recording.rrd` (`diffrl view {root}`).\n\n\
         ## Results\n\nSame {n} seeded episodes for both policies (root seed {seed}, deterministic DDIM chains).\n\n\
         | policy | episodes | success | Wilson 95% CI | mean max score | mean max reward | mean length |\n|---|---|---|---|---|---|---|\n{bc}{grpo}\n\
         Mean max score: each episode's highest task score (Push-T: coverage); mean max reward: its highest step reward \
         (Push-T: gym-pusht's clip(coverage / 0.95, 0, 1); LeRobot reports it as `avg_max_reward`).\n\n",
        name = cfg.run.name,
        quick = if quick { " (--quick preset)" } else { "" },
        task = cfg.task,
        ds = r.dataset.display(),
        root = root.display(),
        n = cfg.eval.episodes,
        seed = cfg.eval.seed,
        bc = row(&bc_name(r), &r.bc),
        grpo = row(
            &format!("{} ({} iterations)", learner(r), r.grpo_iterations),
            &r.grpo
        ),
    );
    if !r.bc.metrics.is_empty() || !r.grpo.metrics.is_empty() {
        md.push_str(&format!(
            "| task metric | BC | {} |\n|---|---|---|\n",
            learner(r)
        ));
        let names: std::collections::BTreeSet<&String> =
            r.bc.metrics.keys().chain(r.grpo.metrics.keys()).collect();
        for k in names {
            let cell = |e: &EvalReport| e.metrics.get(k).map_or("-".into(), |m| m.text());
            md.push_str(&format!("| {k} | {} | {} |\n", cell(&r.bc), cell(&r.grpo)));
        }
        md.push('\n');
    }
    md.push_str(&format!("Training data: {}.\n\n", data_line(cfg, r)));
    if let Some(line) = grpo_evals_line(root, r) {
        md.push_str(&line);
    }
    md.push_str(&format!(
        "{} - BC: success {:+.1} points ({}{}); mean max score {}.\n\n",
        learner(r),
        pct(r.grpo.success_rate - r.bc.success_rate),
        if separate {
            "the Wilson intervals do not overlap"
        } else {
            "the Wilson intervals overlap"
        },
        match mcnemar(&r.bc, &r.grpo) {
            Some((g, b, p)) => format!(
                "; paired: {g} episodes only {} solved, {b} only BC, exact McNemar p = {p:.3}{}",
                learner(r),
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
    let (voc, monotonicity) = voc_text(&r.reward);
    md.push_str(&format!(
        "## Reward model\n\nProgress model Phi(s) (`reward/progress`), held-out demonstrations: VOC {voc} over {} \
         successful episodes, pairwise accuracy {} over {} pairs, success AUROC {}, monotonicity {monotonicity}.\n\n",
        r.reward.voc_trajectories,
        opt(r.reward.pairwise_accuracy),
        r.reward.pairs,
        opt(r.reward.success_auroc),
    ));
    if let Some(m) = &r.reward_vs_policy {
        md.push_str(&format!(
            "Against the BC policy's own rollouts ({} stochastic episodes added to the held-out \
             demonstrations): pairwise accuracy {} over {} pairs, success AUROC {}.\n\n",
            cfg.reward.vs_policy_episodes,
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
        "BC {:.1}% -> {} {:.1}% success (mean max score {:.3} -> {:.3}{}); reward model VOC {}; {:.0} s",
        pct(r.bc.success_rate),
        learner(r),
        pct(r.grpo.success_rate),
        r.bc.mean_max_score,
        r.grpo.mean_max_score,
        match (r.bc.mean_max_reward, r.grpo.mean_max_reward) {
            (Some(a), Some(b)) => format!(", mean max reward {a:.3} -> {b:.3}"),
            _ => String::new(),
        },
        voc_text(&r.reward).0,
        total
    )?;
    writeln!(out, "report: {}", root.join("report.md").display())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_difference_needs_the_same_episodes() {
        use diffrl_learn::eval::EpisodeStats;
        let ep = |s: f32| EpisodeStats {
            env: 0,
            episode: 0,
            success: false,
            max_score: s,
            max_reward: None,
            total_reward: 0.0,
            length: 1,
            metrics: Default::default(),
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
            max_reward: None,
            total_reward: 0.0,
            length: 1,
            metrics: Default::default(),
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
