//! `diffrl grpo` / `diffrl ppo` through the real binary: a run killed with SIGKILL and resumed
//! ends with the weights and the metrics.jsonl of an uninterrupted run; bad settings are
//! refused with their cause.

use std::path::{Path, PathBuf};
use std::process::Stdio;

mod common;
use common::*;

/// A tiny config: short episodes, a small policy, small groups.
fn config(dir: &Path, name: &str, extra: &str) -> String {
    let p = dir.join(name);
    let text = format!(
        "[run]\nname = \"t\"\nruns_dir = \"{}\"\nthreads = 1\n\
         [env]\nmax_episode_steps = 16\n\
         [policy]\npred_horizon = 4\naction_horizon = 2\n\
         [policy.denoiser]\nhidden = 16\nblocks = 1\n\
         [policy.diffusion]\ntrain_steps = 8\ndenoising_steps = 4\n\
         [pretrain]\nsteps = 20\nbatch_size = 16\nwarmup_steps = 2\nlog_every = 10\neval_every = 0\ncheckpoint_every = 20\n\
         [eval]\nepisodes = 2\nenvs = 2\n\
         [grpo]\ngroups = 2\ngroup_size = 2\nepochs = 1\nminibatch = 64\nlr = 0.001\nclip_low = 0.2\nclip_high = 0.2\n{extra}",
        dir.join("runs").display()
    );
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn pretrain(dir: &Path, cfg: &str, out: &str) -> String {
    let out = dir.join(out);
    diffrl(&[
        "pretrain",
        "--config",
        cfg,
        "--dataset",
        &shipped(),
        "--out",
        &out.display().to_string(),
        "--eval-episodes",
        "0",
    ])
    .unwrap();
    out.join("policy").display().to_string()
}

fn iteration(state: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(state).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["iteration"].as_u64()
}

#[test]
fn killed_with_sigkill_and_resumed_equals_uninterrupted() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path(), "c.toml", "iterations = 30\n");
    let policy = pretrain(d.path(), &cfg, "bc");
    for algo in ["grpo", "ppo"] {
        let a = d.path().join(format!("{algo}-a"));
        let b = d.path().join(format!("{algo}-b"));
        let (sa, sb) = (a.display().to_string(), b.display().to_string());
        let common = [
            "--config",
            &cfg,
            "--policy",
            &policy,
            "--eval-episodes",
            "0",
        ];
        let s = diffrl(&[&[algo, "--out", &sa], &common[..]].concat()).unwrap();
        assert!(s.contains("30 iterations"), "{s}");

        let mut child = bin()
            .args([&[algo, "--out", &sb], &common[..]].concat())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Iteration 5's line is printed before its checkpoint, after iteration 4's.
        let rest = wait_for_line(child.stderr.take().unwrap(), |l| {
            l.contains(": iteration 5/30 ")
        });
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        drop(rest);
        let state = b.join("train_state/state.json");
        let at = iteration(&state).expect("a checkpoint was written before the kill");
        assert!(
            (4..30).contains(&at),
            "{algo}: killed at iteration {at}, expected mid-run"
        );
        // Without --resume the folder is protected; with it the run continues.
        let e = diffrl(&[&[algo, "--out", &sb], &common[..]].concat()).unwrap_err();
        assert!(e.contains("--resume"), "{e}");
        let s = diffrl(&[&[algo, "--out", &sb, "--resume"], &common[..]].concat()).unwrap();
        assert!(s.contains("30 iterations"), "{s}");
        let wa = std::fs::read(a.join("policy/model.safetensors")).unwrap();
        let wb = std::fs::read(b.join("policy/model.safetensors")).unwrap();
        assert!(
            wa == wb,
            "{algo}: weights after kill + resume differ from the uninterrupted run"
        );
        // The resumed log reads as an uninterrupted one: each iteration once, in order.
        let its: Vec<u64> = std::fs::read_to_string(b.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["train"]["iteration"].as_u64())
            .collect();
        assert_eq!(its, (1..=30).collect::<Vec<u64>>(), "{algo}: metrics.jsonl");
        let before = std::fs::read(PathBuf::from(&policy).join("model.safetensors")).unwrap();
        assert!(wa != before, "{algo}: fine-tuning changed nothing");
    }
}

#[test]
fn bad_settings_and_mismatched_checkpoints_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path(), "c.toml", "iterations = 2\n");
    let policy = pretrain(d.path(), &cfg, "bc");
    let out = d.path().join("g").display().to_string();
    let run = |cfg: &str, policy: &str, extra: &[&str]| {
        diffrl(
            &[
                &[
                    "grpo",
                    "--config",
                    cfg,
                    "--policy",
                    policy,
                    "--out",
                    &out,
                    "--eval-episodes",
                    "0",
                ][..],
                extra,
            ]
            .concat(),
        )
    };
    // Group size 1 has no group to compare with.
    let small = d.path().join("g1.toml");
    std::fs::write(
        &small,
        std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("group_size = 2", "group_size = 1"),
    )
    .unwrap();
    let small = small.display().to_string();
    let e = run(&small, &policy, &[]).unwrap_err();
    assert!(e.contains("grpo.group_size") && e.contains(">= 2"), "{e}");
    // K' > K.
    let kp = config(d.path(), "kp.toml", "ft_denoising_steps = 7\n");
    let e = run(&kp, &policy, &[]).unwrap_err();
    assert!(e.contains("ft_denoising_steps") && e.contains('7'), "{e}");
    // Freezing FiLM layers the policy does not have (its denoiser has no `film`).
    let film = config(d.path(), "film.toml", "freeze_film = true\n");
    let e = run(&film, &policy, &[]).unwrap_err();
    assert!(
        e.contains("freeze_film") && e.contains("no FiLM layers") && e.contains(&policy),
        "{e}"
    );
    // Refused before the output folder is made (no run so far has made it).
    assert!(!PathBuf::from(&out).exists(), "{out} made by a refused run");
    // No pretrained policy.
    let e = run(&cfg, "/nonexistent/policy", &[]).unwrap_err();
    assert!(
        e.contains("/nonexistent/policy") && e.contains("diffrl pretrain"),
        "{e}"
    );
    // An unknown estimator names the choices.
    let e = run(&cfg, &policy, &["--estimator", "grpo2"]).unwrap_err();
    assert!(e.contains("dr-grpo"), "{e}");
    // PPO on the outcome does not read step rewards, so shaping them is refused.
    let shaped = config(
        d.path(),
        "shaped.toml",
        "[reward]\nshaping = { model = \"reward/progress\", gamma = 0.99, kind = \"potential\" }\n",
    );
    let e = diffrl(&[
        "ppo", "--config", &shaped, "--policy", &policy, "--out", &out,
    ])
    .unwrap_err();
    assert!(
        e.contains("[reward.shaping]") && e.contains("rewards = \"steps\""),
        "{e}"
    );
    // A negative exploration floor.
    let neg = config(d.path(), "neg.toml", "min_sampling_std = -0.1\n");
    let e = run(&neg, &policy, &[]).unwrap_err();
    assert!(e.contains("grpo.min_sampling_std"), "{e}");
    // Resuming with a checkpoint of another architecture is refused.
    run(&cfg, &policy, &[]).unwrap();
    // Fine-tuning samples with its own exploration floors ([grpo], 0.03 by default); the BC
    // checkpoint keeps its own (0.1).
    let floors = |dir: &Path| {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("policy.json")).unwrap())
                .unwrap();
        let dc = &v["config"]["diffusion"];
        (
            dc["min_sampling_std"].as_f64().unwrap(),
            dc["min_logprob_std"].as_f64().unwrap(),
        )
    };
    assert_eq!(floors(Path::new(&policy)), (0.1, 0.1));
    assert_eq!(floors(&Path::new(&out).join("policy")), (0.03, 0.03));
    let other_cfg = d.path().join("other.toml");
    std::fs::write(
        &other_cfg,
        std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("hidden = 16", "hidden = 24"),
    )
    .unwrap();
    let other_cfg = other_cfg.display().to_string();
    let other = pretrain(d.path(), &other_cfg, "bc-wide");
    let e = run(&cfg, &other, &["--resume"]).unwrap_err();
    assert!(e.contains("another") && e.contains("policy"), "{e}");
}

#[test]
fn implicit_prm_from_the_config_then_curves_with_diffrl_plot() {
    let d = tempfile::tempdir().unwrap();
    let base = config(d.path(), "c.toml", "iterations = 2\n");
    let policy = pretrain(d.path(), &base, "bc");
    let prm = config(
        d.path(),
        "prm.toml",
        "iterations = 2\n[grpo.advantage]\nestimator = \"grpo-process\"\n\
         [grpo.implicit_prm]\nbeta = 0.5\nlr = 0.001\n",
    );
    let mut arms = Vec::new();
    for (name, cfg) in [("outcome", &base), ("prm", &prm)] {
        let out = d.path().join(name);
        let log = diffrl(&[
            "grpo",
            "--config",
            cfg,
            "--policy",
            &policy,
            "--out",
            &out.display().to_string(),
            "--eval-episodes",
            "2",
        ])
        .unwrap();
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|l: &serde_json::Value| l.get("train").is_some())
            .collect();
        assert_eq!(lines.len(), 2);
        if name == "prm" {
            assert!(
                log.contains("implicit PRM (trajectory DPO, beta 0.5"),
                "{log}"
            );
            // Its time is reported apart from collection and update.
            assert!(log.contains(", implicit PRM "), "{log}");
            assert!(
                lines
                    .iter()
                    .all(|l| l["train"]["prm_s"].as_f64().unwrap() > 0.0)
            );
            for l in &lines {
                let p = &l["train"]["prm"];
                assert!(p["loss"].as_f64().unwrap().is_finite(), "{l}");
                assert!(p["pairs"].as_u64().is_some(), "{l}");
            }
        } else {
            assert!(lines.iter().all(|l| l["train"].get("prm").is_none()));
        }
        arms.push(format!("{name}={}", out.display()));
    }
    // The implicit PRM with an estimator that ignores step rewards is refused.
    let bad = config(
        d.path(),
        "bad.toml",
        "iterations = 2\n[grpo.implicit_prm]\nbeta = 0.5\n",
    );
    let e = diffrl(&["grpo", "--config", &bad, "--policy", &policy]).unwrap_err();
    assert!(e.contains("implicit_prm") && e.contains("estimator"), "{e}");

    // `diffrl plot`: one line per arm (the same run twice averages to itself).
    let png = d.path().join("curves.png");
    let twice = format!("{},{}", arms[1], arms[1].split_once('=').unwrap().1);
    let out = diffrl(&[
        "plot",
        "--out",
        &png.display().to_string(),
        &arms[0],
        &twice,
    ])
    .unwrap();
    assert!(
        out.contains("outcome (1 run)") && out.contains("prm (2 runs)"),
        "{out}"
    );
    assert!(out.contains("evaluation") && out.contains("/4,"), "{out}");
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
    let e = diffrl(&["plot", "--out", &png.display().to_string(), "nolabel"]).unwrap_err();
    assert!(e.contains("LABEL=DIR"), "{e}");
    let e = diffrl(&[
        "plot",
        "--out",
        &png.display().to_string(),
        "x=/nonexistent",
    ])
    .unwrap_err();
    assert!(e.contains("/nonexistent/metrics.jsonl"), "{e}");
}

/// Each tensor of a safetensors file by name, as its raw bytes.
fn tensors(path: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let b = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    let data = &b[8 + n..];
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| {
            let o = &v["data_offsets"];
            let (s, e) = (o[0].as_u64().unwrap(), o[1].as_u64().unwrap());
            (k.clone(), data[s as usize..e as usize].to_vec())
        })
        .collect()
}

/// `config` with FiLM in the denoiser's block.
fn film_config(dir: &Path, name: &str, extra: &str) -> String {
    let p = config(dir, name, extra);
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(
        &p,
        text.replace("blocks = 1\n", "blocks = 1\nfilm = true\n"),
    )
    .unwrap();
    p
}

#[test]
fn a_frozen_encoder_and_frozen_film_keep_their_pretrained_weights_through_a_resume() {
    let d = tempfile::tempdir().unwrap();
    let cfg = film_config(
        d.path(),
        "c.toml",
        // A state MLP, so that the encoder has parameters to keep.
        "iterations = 3\nfreeze_encoder = true\nfreeze_film = true\n\
         [policy.encoder]\nstate_hidden = [8]\nstate_out = 8\n",
    );
    let policy = pretrain(d.path(), &cfg, "bc");
    let out = d.path().join("ft");
    let so = out.display().to_string();
    let args = |n: &str| {
        let mut a = vec!["grpo", "--config", &cfg, "--policy", &policy, "--out", &so];
        a.extend(["--eval-episodes", "0", "--iterations"]);
        a.push(n);
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let run = |a: Vec<String>| diffrl(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let s = run(args("2")).unwrap();
    assert!(s.contains("encoder and FiLM layers frozen"), "{s}");
    let mut resumed = args("3");
    resumed.push("--resume".into());
    run(resumed).unwrap();
    let before = tensors(&PathBuf::from(&policy).join("model.safetensors"));
    let after = tensors(&out.join("policy/model.safetensors"));
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    let (mut encoder, mut film, mut moved) = (0, 0, 0);
    for (k, v) in &before {
        if k.contains(".encoder.") {
            encoder += 1;
            assert!(after[k] == *v, "{k}: a frozen encoder parameter changed");
        } else if k.contains(".film.") {
            film += 1;
            assert!(after[k] == *v, "{k}: a frozen FiLM parameter changed");
        } else if after[k] != *v {
            moved += 1;
        }
    }
    assert!(encoder > 0, "the policy has no encoder parameters to check");
    assert!(film > 0, "the policy has no FiLM parameters to check");
    assert!(moved > 0, "fine-tuning moved no denoiser parameter");
    // Without the settings the same run moves both, so the checks above can fail.
    let free = film_config(
        d.path(),
        "free.toml",
        "iterations = 2\n[policy.encoder]\nstate_hidden = [8]\nstate_out = 8\n",
    );
    let out_free = d.path().join("ft-free");
    let s = diffrl(&[
        "grpo",
        "--config",
        &free,
        "--policy",
        &policy,
        "--out",
        &out_free.display().to_string(),
        "--eval-episodes",
        "0",
    ])
    .unwrap();
    assert!(!s.contains("frozen"), "{s}");
    let after_free = tensors(&out_free.join("policy/model.safetensors"));
    for (part, setting) in [(".encoder.", "freeze_encoder"), (".film.", "freeze_film")] {
        assert!(
            before
                .iter()
                .any(|(k, v)| k.contains(part) && after_free[k] != *v),
            "fine-tuning without {setting} left the {part} parameters as they were"
        );
    }
}
