//! `diffrl eval --randomize` through the real binary on a tiny policy: the table lands in
//! robustness.json, robustness.md and report.md, its nominal row is a plain `diffrl eval`, and
//! a bad sweep file is refused with its cause before anything is written.

use std::path::{Path, PathBuf};

mod common;
use common::*;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A tiny config (short episodes, a small policy) and a policy trained for 20 steps on it.
fn tiny_policy(dir: &Path) -> (String, String) {
    let cfg = write(
        dir,
        "c.toml",
        &format!(
            "[run]\nname = \"t\"\nruns_dir = \"{}\"\nthreads = 1\n\
             [env]\nobs = \"state\"\nmax_episode_steps = 24\n\
             [policy]\npred_horizon = 4\naction_horizon = 2\n\
             [policy.denoiser]\nhidden = 16\nblocks = 1\n\
             [policy.diffusion]\ntrain_steps = 8\ndenoising_steps = 4\n\
             [pretrain]\nsteps = 20\nbatch_size = 16\nwarmup_steps = 2\nlog_every = 10\neval_every = 0\ncheckpoint_every = 20\n\
             [eval]\nepisodes = 3\nenvs = 2\n",
            dir.join("runs").display()
        ),
    );
    let out = dir.join("bc");
    diffrl(&[
        "pretrain",
        "--config",
        &cfg,
        "--dataset",
        &shipped(),
        "--out",
        &out.display().to_string(),
        "--eval-episodes",
        "0",
    ])
    .unwrap();
    (cfg, out.join("policy").display().to_string())
}

const SWEEP: &str = "episodes = 4\nseed = 11\n\
    [grid]\nfriction = [[1.0, 1.0]]\naction_delay = [[2, 2]]\nimage_tint = [[0.5, 0.5]]\n\
    [[setting]]\nname = \"noisy\"\nrandomize = { obs_noise_px = 5.0, kp = [60.0, 140.0] }\n";

#[test]
fn robustness_table_is_written_and_its_nominal_row_is_a_plain_eval() {
    let d = tempfile::tempdir().unwrap();
    let (cfg, policy) = tiny_policy(d.path());
    let sweep = write(d.path(), "sweep.toml", SWEEP);
    let run = d.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let report_head = "# diffrl run `t`\n\n## Stages\n\nkeep me\n";
    std::fs::write(run.join("report.md"), report_head).unwrap();
    let run_s = run.display().to_string();
    let randomize = |extra: &[&str]| {
        diffrl(
            &[
                &[
                    "eval",
                    "--policy",
                    &policy,
                    "--config",
                    &cfg,
                    "--randomize",
                    &sweep,
                    "--out",
                    &run_s,
                ][..],
                extra,
            ]
            .concat(),
        )
        .unwrap()
    };
    let stdout = randomize(&[]);
    assert!(
        stdout.contains("| setting | success | 95% CI | mean max score |")
            && stdout.contains("| noisy |")
            && stdout.contains("skipping image_tint = [0.5, 0.5]"),
        "{stdout}"
    );

    let table = json(&run.join("robustness.json"));
    let rows = table["rows"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "nominal",
            "friction = [1.0, 1.0]",
            "action_delay = [2, 2]",
            "noisy"
        ]
    );
    assert_eq!(table["episodes"], 4);
    assert_eq!(table["seed"], 11);
    assert_eq!(table["skipped"][0]["origin"], "grid.image_tint[0]");
    assert!(
        table["skipped"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("states")
    );
    assert_eq!(
        rows[1]["randomize"]["friction"],
        serde_json::json!([1.0, 1.0])
    );
    assert_eq!(
        rows[1]["randomize"]["kp"],
        serde_json::json!([100.0, 100.0])
    );
    assert_eq!(rows[3]["randomize"]["obs_noise_px"], 5.0);
    for r in rows {
        assert_eq!(r["episodes"], 4);
        let d = r["delta_mean_max_score"].as_f64().unwrap();
        let expect =
            r["mean_max_score"].as_f64().unwrap() - rows[0]["mean_max_score"].as_f64().unwrap();
        assert!((d - expect).abs() < 1e-12);
    }

    // The nominal row is `diffrl eval` with the same seed and episodes.
    let eval_json = d.path().join("eval.json");
    diffrl(&[
        "eval",
        "--policy",
        &policy,
        "--config",
        &cfg,
        "--episodes",
        "4",
        "--seed",
        "11",
        "--out",
        &eval_json.display().to_string(),
    ])
    .unwrap();
    let plain = json(&eval_json);
    for key in [
        "episodes",
        "successes",
        "success_rate",
        "ci95",
        "mean_max_score",
        "mean_length",
    ] {
        assert_eq!(rows[0][key], plain[key], "{key}");
    }

    let md = std::fs::read_to_string(run.join("robustness.md")).unwrap();
    assert!(md.starts_with("# Robustness\n"), "{md}");
    assert!(
        md.contains("| friction = [1.0, 1.0] |") && md.contains("Skipped:"),
        "{md}"
    );
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(report.starts_with(report_head), "{report}");
    assert_eq!(report.matches("## Robustness").count(), 1, "{report}");

    // Again with --episodes (the flag beats the file) and --action-delay (it moves the nominal
    // setting, as in a plain eval); the report section is replaced, not added.
    randomize(&["--episodes", "2", "--action-delay", "3"]);
    let table = json(&run.join("robustness.json"));
    assert_eq!(table["episodes"], 2);
    assert_eq!(
        table["rows"][0]["randomize"]["action_delay"],
        serde_json::json!([3, 3])
    );
    assert_eq!(
        table["rows"][1]["randomize"]["action_delay"],
        serde_json::json!([3, 3])
    );
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(report.starts_with(report_head), "{report}");
    assert_eq!(report.matches("## Robustness").count(), 1, "{report}");
    assert!(report.contains("(0/2)") || report.contains("(1/2)") || report.contains("(2/2)"));
}

#[test]
fn a_bad_sweep_file_is_refused_before_anything_is_written() {
    let d = tempfile::tempdir().unwrap();
    // The sweep is checked before the policy is read, so no checkpoint is needed.
    let policy = d.path().join("missing/policy").display().to_string();
    let out: PathBuf = d.path().join("out");
    let out_s = out.display().to_string();
    let refuse = |text: &str| {
        let sweep = write(d.path(), "bad.toml", text);
        let e = diffrl(&[
            "eval",
            "--policy",
            &policy,
            "--randomize",
            &sweep,
            "--out",
            &out_s,
        ])
        .unwrap_err();
        assert!(!out.exists(), "nothing may be written for a bad sweep");
        assert!(e.contains("bad.toml"), "{e}");
        e
    };
    let e = refuse("[grid]\nfriction = [[0.0, 0.0], [1.0, 0.5]]\n");
    assert!(
        e.contains("grid.friction[1]: must be a range [lo, hi] with 0 <= lo <= hi"),
        "{e}"
    );
    let e = refuse("[grid]\nfrction = [[0.5, 0.5]]\n");
    assert!(e.contains("frction"), "{e}");
    let e = refuse("[[setting]]\nname = \"late\"\nrandomize = { action_delay = [2, 20] }\n");
    assert!(
        e.contains("setting[0].randomize.action_delay") && e.contains("late"),
        "{e}"
    );
    // A good sweep with a missing policy fails on the policy, still writing nothing.
    let sweep = write(d.path(), "good.toml", SWEEP);
    let e = diffrl(&[
        "eval",
        "--policy",
        &policy,
        "--randomize",
        &sweep,
        "--out",
        &out_s,
    ])
    .unwrap_err();
    assert!(e.contains("missing/policy"), "{e}");
    assert!(!out.exists());
}
