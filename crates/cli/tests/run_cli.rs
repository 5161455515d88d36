//! `diffrl run` end to end on a tiny config: every stage, summary.json, report.md, plots and
//! the recording; a second invocation reuses every stage and reports the same numbers; another
//! config is refused unless --resume (redo what changed) or --force (start over); folders that
//! are not runs are left alone.

use std::path::Path;

mod common;
use common::*;

/// A tiny config on the shipped dataset: short episodes, a small policy, small groups.
fn config(dir: &Path, extra: &str) -> String {
    let p = dir.join("tiny.toml");
    let text = format!(
        "[run]\nthreads = 1\n\
         [demos]\ndataset = \"{}\"\n\
         [env]\nmax_episode_steps = 16\n\
         [policy]\npred_horizon = 4\naction_horizon = 2\n\
         [policy.denoiser]\nhidden = 16\nblocks = 1\n\
         [policy.diffusion]\ntrain_steps = 8\ndenoising_steps = 4\n\
         [pretrain]\nsteps = 20\nbatch_size = 16\nwarmup_steps = 2\nlog_every = 10\neval_every = 10\neval_episodes = 2\ncheckpoint_every = 10\n\
         [eval]\nepisodes = 4\nenvs = 2\n\
         [reward.progress]\nsteps = 20\nbatch_size = 32\nhidden = [16]\n\
         [grpo]\ngroups = 2\ngroup_size = 2\nepochs = 1\nminibatch = 64\niterations = 2\nft_denoising_steps = 2\n{extra}",
        shipped().replace('\\', "\\\\"),
    );
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn every_stage_then_reuse_then_config_changes() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path(), "");
    let run = d.path().join("run");
    let out = run.display().to_string();
    let log = diffrl(&["run", &cfg, "--out", &out]).unwrap();
    for stage in [
        "[1/5] demos",
        "[2/5] pretrain",
        "[3/5] reward",
        "[4/5] grpo",
        "[5/5] eval",
    ] {
        assert!(log.contains(stage), "{stage} missing from:\n{log}");
    }
    let s = json(&run.join("summary.json"));
    for policy in ["bc", "grpo"] {
        for key in ["success_rate", "ci95", "mean_max_score", "episodes"] {
            assert!(!s[policy][key].is_null(), "summary.{policy}.{key}: {s}");
        }
        assert_eq!(s[policy]["episodes"], 4);
        // gym-pusht's metric: the step reward is clip(coverage / 0.95, 0, 1), so an episode's
        // highest reward is that of its highest coverage.
        let e = json(&run.join(format!("eval/{policy}.json")));
        let eps = e["per_episode"].as_array().unwrap();
        let mut sum = 0.0;
        for ep in eps {
            let score = ep["max_score"].as_f64().unwrap();
            let reward = ep["max_reward"].as_f64().unwrap();
            assert!(
                (reward - (score / 0.95).clamp(0.0, 1.0)).abs() < 1e-6,
                "{policy}: {ep}"
            );
            sum += reward;
        }
        let mean = s[policy]["mean_max_reward"].as_f64().unwrap();
        assert!((mean - sum / eps.len() as f64).abs() < 1e-6, "{s}");
    }
    assert!(
        s["reward"]["voc"]
            .as_f64()
            .is_some_and(|v| (-1.0..=1.0).contains(&v))
    );
    assert!(s["reward"].get("pairwise_accuracy").is_some());
    for stage in ["demos", "pretrain", "reward", "grpo", "eval"] {
        assert!(s["wall_seconds"][stage].as_f64().is_some(), "{stage}: {s}");
    }
    assert!(s["wall_seconds"]["pretrain"].as_f64().unwrap() > 0.0);
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(report.contains("| BC (20 steps) | 4 |"), "{report}");
    assert!(report.contains("| GRPO (2 iterations) | 4 |"), "{report}");
    assert!(
        report.contains("VOC") && report.contains("plots/grpo.png"),
        "{report}"
    );
    for png in ["plots/pretrain.png", "plots/grpo.png"] {
        let bytes = std::fs::read(run.join(png)).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{png}");
    }
    for f in [
        "pretrain/policy/policy.json",
        "grpo/policy/policy.json",
        "reward/progress/reward.json",
        "eval/bc.json",
        "eval/grpo.json",
        "config.toml",
        "metrics.jsonl",
    ] {
        assert!(run.join(f).is_file(), "{f}");
    }
    // The default recording: BC and GRPO training scalars, evaluation episodes, scenes.
    let rrd = diffrl_viz::read::read_rrd(&run.join("recording.rrd")).unwrap();
    assert!(rrd.footer, "the recording was finished");
    for path in [
        "/train/loss/bc",
        "/train/loss/surrogate",
        "/eval/episodes",
        "/groups/mean",
    ] {
        assert!(rrd.rows(path) > 0, "{path}: {:?}", rrd.entities.keys());
    }

    // Same config: every stage reused, same numbers.
    let again = diffrl(&["run", &cfg, "--out", &out, "--rerun", "off"]).unwrap();
    assert_eq!(again.matches("reusing").count(), 4, "{again}");
    let s2 = json(&run.join("summary.json"));
    assert_eq!(
        (&s["bc"], &s["grpo"], &s["reward"]),
        (&s2["bc"], &s2["grpo"], &s2["reward"])
    );

    // A run made before a settings table existed: the table reads as its defaults, so the
    // config is the same and every stage is reused.
    let text = std::fs::read_to_string(run.join("config.toml")).unwrap();
    let start = text
        .find("[reward.spa_train]")
        .expect("the resolved config lists it");
    let end = text[start + 1..]
        .find("\n[")
        .map_or(text.len(), |i| start + 2 + i);
    std::fs::write(
        run.join("config.toml"),
        format!("{}{}", &text[..start], &text[end..]),
    )
    .unwrap();
    let older = diffrl(&["run", &cfg, "--out", &out, "--rerun", "off"]).unwrap();
    assert_eq!(older.matches("reusing").count(), 4, "{older}");

    // Another config: refused with the difference and the ways out.
    let cfg3 = config(d.path(), "lr = 0.0003\n");
    let e = diffrl(&["run", &cfg3, "--out", &out, "--rerun", "off"]).unwrap_err();
    assert!(
        e.contains("grpo.lr: ") && e.contains("--resume") && e.contains("--force"),
        "{e}"
    );
    // --resume: BC and the reward model kept, GRPO and the evaluation redone.
    let resumed = diffrl(&["run", &cfg3, "--out", &out, "--resume", "--rerun", "off"]).unwrap();
    assert!(resumed.contains("[2/5] pretrain: reusing"), "{resumed}");
    assert!(resumed.contains("[3/5] reward: reusing"), "{resumed}");
    assert!(
        resumed.contains("[4/5] grpo: settings changed"),
        "{resumed}"
    );
    let s3 = json(&run.join("summary.json"));
    assert_eq!(s3["bc"], s["bc"]);
    // --force: everything again, from nothing.
    let forced = diffrl(&["run", &cfg3, "--out", &out, "--force", "--rerun", "off"]).unwrap();
    assert!(
        forced.contains("deleting") && !forced.contains("reusing"),
        "{forced}"
    );
    assert_eq!(
        json(&run.join("summary.json"))["grpo"],
        s3["grpo"],
        "deterministic"
    );
    assert_eq!(s3["finetune"], "grpo");

    // PPO as the fine-tuning stage's learner: BC and the reward model kept, stage 4 redone by
    // PPO under the same name, and the report names the learner.
    let ppo_cfg = d.path().join("ppo.toml");
    std::fs::write(
        &ppo_cfg,
        std::fs::read_to_string(&cfg3).unwrap().replacen(
            "[run]\n",
            "[run]\nfinetune = \"ppo\"\n",
            1,
        ),
    )
    .unwrap();
    let ppo_cfg = ppo_cfg.display().to_string();
    let ppo = diffrl(&["run", &ppo_cfg, "--out", &out, "--resume", "--rerun", "off"]).unwrap();
    assert!(
        ppo.contains("[2/5] pretrain: reusing")
            && ppo.contains("[3/5] reward: reusing")
            && ppo.contains("ppo: 2 iterations")
            && ppo.contains("-> PPO"),
        "{ppo}"
    );
    let s4 = json(&run.join("summary.json"));
    assert_eq!((&s4["finetune"], &s4["bc"]), (&"ppo".into(), &s3["bc"]));
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(report.contains("| PPO (2 iterations) | 4 |"), "{report}");
    // --finetune overrides the config's learner: back to GRPO, whose stage is the one above.
    let back = diffrl(&[
        "run",
        &ppo_cfg,
        "--out",
        &out,
        "--resume",
        "--finetune",
        "grpo",
        "--rerun",
        "off",
    ])
    .unwrap();
    assert!(
        back.contains("grpo: 2 iterations") && back.contains("[2/5] pretrain: reusing"),
        "{back}"
    );
    let s5 = json(&run.join("summary.json"));
    assert_eq!(
        (&s5["finetune"], &s5["grpo"]),
        (&"grpo".into(), &s3["grpo"])
    );
    let e = diffrl(&["run", &ppo_cfg, "--out", &out, "--finetune", "sac"]).unwrap_err();
    assert!(e.contains("sac") && e.contains("ppo"), "{e}");
}

/// A run folder that records its own demos can be moved or copied: its stages' fingerprints
/// name the demos relative to the folder, so `--resume` in the new place reuses every stage. A
/// folder written before that (the folder's own path in its fingerprints) is recognised too.
#[test]
fn a_moved_run_folder_reuses_its_stages() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path(), "");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let line = text.lines().find(|l| l.starts_with("dataset = ")).unwrap();
    std::fs::write(
        &cfg,
        text.replacen(line, "dataset = \"\"\nepisodes = 3\nnoise_px = 0.0", 1),
    )
    .unwrap();
    let run = d.path().join("run");
    let out = run.display().to_string();
    let first = diffrl(&["run", &cfg, "--out", &out, "--rerun", "off"]).unwrap();
    assert!(first.contains("3 expert episodes"), "{first}");
    let s = json(&run.join("summary.json"));
    let stages = ["pretrain", "reward", "grpo", "eval"];
    let sep = std::path::MAIN_SEPARATOR;
    let relative = format!("<run>{sep}demos");
    let marker = std::fs::read_to_string(run.join("pretrain/stage.json")).unwrap();
    assert!(
        marker.contains(&relative) && !marker.contains(&out),
        "{marker}"
    );

    // As versions before 2026-11-28 wrote them: the folder's own path.
    for stage in stages {
        for f in ["stage.json", "fingerprint.json"] {
            let p = run.join(stage).join(f);
            let t = std::fs::read_to_string(&p).unwrap();
            std::fs::write(&p, t.replace(&relative, &format!("{out}{sep}demos"))).unwrap();
        }
    }
    let old = diffrl(&["run", &cfg, "--out", &out, "--rerun", "off"]).unwrap();
    assert_eq!(old.matches("reusing").count(), 5, "{old}");
    let marker = std::fs::read_to_string(run.join("eval/stage.json")).unwrap();
    assert!(
        marker.contains(&relative),
        "rewritten in the new form: {marker}"
    );

    // Moved under another name: the config names another folder, so --resume, and nothing
    // is redone.
    std::fs::create_dir(d.path().join("backup")).unwrap();
    let moved = d.path().join("backup").join("run-1");
    std::fs::rename(&run, &moved).unwrap();
    let out2 = moved.display().to_string();
    let log = diffrl(&["run", &cfg, "--out", &out2, "--resume", "--rerun", "off"]).unwrap();
    assert_eq!(log.matches("reusing").count(), 5, "{log}");
    let s2 = json(&moved.join("summary.json"));
    assert_eq!((&s["bc"], &s["grpo"]), (&s2["bc"], &s2["grpo"]));
}

/// Fingerprints follow what a stage reads: GRPO shaped by the run's own progress model is
/// redone when the reward stage retrains that model, though GRPO's settings did not change.
#[test]
fn retraining_the_reward_model_redoes_the_grpo_stage_that_reads_it() {
    let d = tempfile::tempdir().unwrap();
    let run = d.path().join("run");
    let out = run.display().to_string();
    let shaping = format!(
        "[reward.shaping]\nmodel = \"{}\"\n",
        run.join("reward/progress")
            .display()
            .to_string()
            .replace('\\', "\\\\")
    );
    let cfg = config(d.path(), &shaping);
    diffrl(&["run", &cfg, "--out", &out, "--rerun", "off"]).unwrap();
    let again = diffrl(&["run", &cfg, "--out", &out, "--rerun", "off"]).unwrap();
    assert!(again.contains("[4/5] grpo: reusing"), "{again}");

    // Only the reward model's training changes.
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "[reward.progress]\nsteps = 20\n",
        "[reward.progress]\nsteps = 25\n",
    );
    std::fs::write(&cfg, text).unwrap();
    let log = diffrl(&["run", &cfg, "--out", &out, "--resume", "--rerun", "off"]).unwrap();
    assert!(log.contains("[2/5] pretrain: reusing"), "{log}");
    assert!(!log.contains("[3/5] reward: reusing"), "{log}");
    assert!(!log.contains("[4/5] grpo: reusing"), "{log}");
    assert!(!log.contains("[5/5] eval: reusing"), "{log}");
}

#[test]
fn folders_that_are_not_runs_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path(), "");
    let other = d.path().join("photos");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("a.jpg"), b"x").unwrap();
    let e = diffrl(&[
        "run",
        &cfg,
        "--out",
        &other.display().to_string(),
        "--force",
    ])
    .unwrap_err();
    assert!(e.contains("not a diffrl run folder"), "{e}");
    assert!(other.join("a.jpg").exists(), "left alone");
    let file = d.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let e = diffrl(&[
        "run",
        &cfg,
        "--out",
        &file.join("run").display().to_string(),
    ])
    .unwrap_err();
    assert!(e.contains("creating the run folder"), "{e}");
    let bad = d.path().join("bad.toml");
    std::fs::write(&bad, "[demos]\ndataset = \"/no/such/dataset\"\n").unwrap();
    let e = diffrl(&[
        "run",
        &bad.display().to_string(),
        "--out",
        &d.path().join("r").display().to_string(),
    ])
    .unwrap_err();
    assert!(
        e.contains("/no/such/dataset") && e.contains("does not exist"),
        "{e}"
    );
}

/// Ctrl-C in the middle of GRPO: the process stops between writes (exit 130) with a finished
/// recording; the next `diffrl run` resumes the stage and ends where an uninterrupted run ends.
#[cfg(unix)]
#[test]
fn ctrl_c_then_rerun_resumes_to_the_uninterrupted_result() {
    use std::process::Stdio;
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path(), "");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("iterations = 2\n", "iterations = 40\n");
    std::fs::write(&cfg, text).unwrap();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    diffrl(&[
        "run",
        &cfg,
        "--out",
        &a.display().to_string(),
        "--rerun",
        "off",
    ])
    .unwrap();

    let mut child = bin()
        .args(["run", &cfg, "--out", &b.display().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let state = b.join("grpo/train_state/state.json");
    let iteration = || -> u64 {
        std::fs::read_to_string(&state)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["iteration"].as_u64())
            .unwrap_or(0)
    };
    // Iteration 5's line is printed before its checkpoint, after iteration 4's.
    let rest = wait_for_line(child.stderr.take().unwrap(), |l| {
        l.contains("grpo: iteration 5/40 ")
    });
    let sent = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let err: Vec<String> = rest.map_while(Result::ok).collect();
    let err = err.join("\n");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    let at = iteration();
    assert!(
        (4..40).contains(&at),
        "interrupted at iteration {at}, expected mid-run"
    );
    let rrd = diffrl_viz::read::read_rrd(&b.join("recording.rrd")).unwrap();
    assert!(rrd.footer, "the recording was finished on Ctrl-C");

    let log = diffrl(&["run", &cfg, "--out", &b.display().to_string()]).unwrap();
    assert!(log.contains("[2/5] pretrain: reusing"), "{log}");
    assert!(log.contains("[4/5] grpo: resuming"), "{log}");
    assert!(
        b.join("recording-1.rrd").is_file(),
        "the rerun records into recording-1.rrd"
    );
    let wa = std::fs::read(a.join("grpo/policy/model.safetensors")).unwrap();
    let wb = std::fs::read(b.join("grpo/policy/model.safetensors")).unwrap();
    assert!(
        wa == wb,
        "interrupted + resumed weights differ from the uninterrupted run"
    );
    assert_eq!(
        json(&a.join("summary.json"))["grpo"],
        json(&b.join("summary.json"))["grpo"]
    );
}

/// Raising `[grpo] iterations` of a finished run and passing --resume extends its GRPO stage
/// from the saved state (BC and the reward model reused) to where a run of the larger count
/// ends; lowering it again starts the stage over.
#[test]
fn raising_grpo_iterations_extends_the_finished_stage() {
    let d = tempfile::tempdir().unwrap();
    let short = config(d.path(), "");
    let long = d.path().join("long.toml");
    let text = std::fs::read_to_string(&short).unwrap();
    assert!(text.contains("iterations = 2\n"));
    std::fs::write(&long, text.replace("iterations = 2\n", "iterations = 4\n")).unwrap();
    let long = long.display().to_string();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    let (a_out, b_out) = (a.display().to_string(), b.display().to_string());
    diffrl(&["run", &long, "--out", &a_out, "--rerun", "off"]).unwrap();
    diffrl(&["run", &short, "--out", &b_out, "--rerun", "off"]).unwrap();

    let log = diffrl(&["run", &long, "--out", &b_out, "--resume", "--rerun", "off"]).unwrap();
    assert!(log.contains("[2/5] pretrain: reusing"), "{log}");
    assert!(log.contains("[3/5] reward: reusing"), "{log}");
    assert!(
        log.contains("[4/5] grpo: extending") && log.contains("from 2 to 4 iterations"),
        "{log}"
    );
    assert!(log.contains("[4/5] grpo: resuming"), "{log}");
    let wa = std::fs::read(a.join("grpo/policy/model.safetensors")).unwrap();
    let wb = std::fs::read(b.join("grpo/policy/model.safetensors")).unwrap();
    assert!(wa == wb, "2 + 2 iterations differ from 4 in one go");
    assert_eq!(
        json(&a.join("summary.json"))["grpo"],
        json(&b.join("summary.json"))["grpo"]
    );

    let log = diffrl(&["run", &short, "--out", &b_out, "--resume", "--rerun", "off"]).unwrap();
    assert!(
        log.contains("[4/5] grpo: settings changed") && !log.contains("extending"),
        "{log}"
    );
}

/// `[dagger]` rounds inside the pretrain stage: each round's data holds the previous data plus
/// the labelled rollouts, the last round's policy is what GRPO starts from, the report and
/// summary.json name the rounds, a rerun reuses them; the reward stage scores the model
/// against the BC policy's rollouts.
#[test]
fn dagger_rounds_feed_the_later_stages() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path(), "[dagger]\nrounds = 2\nepisodes = 2\nsteps = 10\n");
    let run = d.path().join("run");
    let out = run.display().to_string();
    let log = diffrl(&["run", &cfg, "--out", &out]).unwrap();
    assert!(log.contains("DAgger round 2"), "{log}");
    let s = json(&run.join("summary.json"));
    let rounds = s["dagger"].as_array().unwrap();
    assert_eq!(rounds.len(), 2, "{s}");
    // 200 shipped episodes, then 2 more per round.
    assert_eq!(rounds[0]["episodes_in_data"], 202);
    assert_eq!(rounds[1]["episodes_in_data"], 204);
    assert_eq!(rounds[1]["rollouts"]["episodes"], 2);
    let data = diffrl_core::lerobot::read_dataset(&run.join("pretrain/dagger/round-2/data"))
        .unwrap()
        .episodes("observation.state")
        .unwrap();
    assert_eq!(data.len(), 204);
    assert!(
        run.join("pretrain/dagger/round-2/policy/policy.json")
            .exists()
    );
    let grpo_log = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(
        grpo_log.contains("then DAgger") && grpo_log.contains("2 DAgger rounds"),
        "{grpo_log}"
    );
    // The reward stage scored the model on [reward].vs_policy_episodes rollouts (default 200).
    assert!(
        grpo_log.contains("own rollouts (200 stochastic episodes"),
        "{grpo_log}"
    );
    assert!(log.contains("pretrain/dagger/round-2/policy"), "{log}");
    let vs = &s["reward"]["vs_policy"];
    assert!(
        vs["pairs"].as_u64().is_some() && vs.get("success_auroc").is_some(),
        "{s}"
    );
    // A rerun reuses everything, rounds included.
    let again = diffrl(&["run", &cfg, "--out", &out]).unwrap();
    assert!(again.contains("[2/5] pretrain: reusing"), "{again}");
    assert_eq!(json(&run.join("summary.json"))["dagger"], s["dagger"]);
}
