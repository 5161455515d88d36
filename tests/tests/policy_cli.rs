//! `diffrl pretrain` and `diffrl eval` end to end on a tiny policy, and their bad-input errors.

mod common;

use std::path::Path;

use diffrl_core::seeding::rng;
use diffrl_policy::{CpuBackend, ObsBatch, SampleMode, checkpoint};
use serde_json::Value;

fn cli(args: &[&str]) -> Result<String, String> {
    let mut out = Vec::new();
    let mut full = vec!["diffrl"];
    full.extend_from_slice(args);
    diffrl_cli::run_cli(full, &mut out).map_err(|e| format!("{e:#}"))?;
    Ok(String::from_utf8(out).unwrap())
}

/// Actions of a checkpoint for fixed observations and seed.
fn actions(dir: &Path) -> Vec<f32> {
    let device = Default::default();
    let (p, _) = checkpoint::load::<CpuBackend>(dir, &device).unwrap();
    let n = 2 * p.config.obs_horizon * p.spec.state_dim;
    let obs = ObsBatch {
        batch: 2,
        state: (0..n).map(|i| 20.0 * i as f32).collect(),
        image: None,
        text: None,
    };
    p.act(
        None,
        &obs,
        SampleMode::Stochastic,
        false,
        &mut rng(1),
        &device,
    )
    .unwrap()
    .actions
}

fn shipped() -> String {
    common::repo_file("assets/pusht_expert_200")
        .display()
        .to_string()
}

/// A tiny, fast policy and training config.
fn config(dir: &Path, extra: &str) -> String {
    let p = dir.join("policy.toml");
    let text = format!(
        "[run]\nname = \"t\"\nruns_dir = \"{}\"\nthreads = 2\n\
         [env]\nmax_episode_steps = 20\n\
         [policy]\npred_horizon = 8\naction_horizon = 4\n\
         [policy.denoiser]\nhidden = 32\nblocks = 1\n\
         [policy.diffusion]\ntrain_steps = 20\ndenoising_steps = 5\n\
         [pretrain]\nsteps = 40\nbatch_size = 32\nwarmup_steps = 5\nlog_every = 10\neval_every = 20\neval_episodes = 2\ncheckpoint_every = 20\n\
         [eval]\nepisodes = 3\nenvs = 2\n{extra}",
        dir.join("runs").display()
    );
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

#[test]
fn pretrain_then_eval_then_resume() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path(), "");
    let ds = shipped();
    let out = d.path().join("bc");
    let o = out.display().to_string();
    let s = cli(&["pretrain", "--config", &cfg, "--dataset", &ds, "--out", &o]).unwrap();
    assert!(s.contains("pretrain: 40 steps"), "{s}");
    assert!(s.contains("eval: success"), "{s}");
    let eval: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("eval.json")).unwrap()).unwrap();
    assert_eq!(eval["episodes"], 3);
    assert_eq!(eval["per_episode"].as_array().unwrap().len(), 3);
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    assert_eq!(
        metrics.lines().filter(|l| l.contains("\"train\"")).count(),
        4
    );
    assert_eq!(
        metrics.lines().filter(|l| l.contains("\"eval\"")).count(),
        1
    );

    // `diffrl eval` on the checkpoint reproduces the final evaluation exactly.
    let policy = out.join("policy").display().to_string();
    let again = d.path().join("again.json").display().to_string();
    let s = cli(&[
        "eval", "--policy", &policy, "--config", &cfg, "--out", &again,
    ])
    .unwrap();
    assert!(s.contains("success"), "{s}");
    let e2: Value = serde_json::from_str(&std::fs::read_to_string(&again).unwrap()).unwrap();
    assert_eq!(eval["per_episode"], e2["per_episode"]);

    // A second pretrain into the same folder refuses without --resume ...
    let e = cli(&["pretrain", "--config", &cfg, "--dataset", &ds, "--out", &o]).unwrap_err();
    assert!(e.contains("--resume"), "{e}");
    // ... and resuming with another step count is another run: refused with the reason.
    let e = cli(&[
        "pretrain",
        "--config",
        &cfg,
        "--dataset",
        &ds,
        "--out",
        &o,
        "--resume",
        "--steps",
        "60",
    ])
    .unwrap_err();
    assert!(e.contains("another pretrain/policy config"), "{e}");
    // Resuming a finished run is a no-op that keeps the weights.
    let before = std::fs::read(out.join("policy/model.safetensors")).unwrap();
    cli(&[
        "pretrain",
        "--config",
        &cfg,
        "--dataset",
        &ds,
        "--out",
        &o,
        "--resume",
        "--eval-episodes",
        "0",
    ])
    .unwrap();
    assert_eq!(
        before,
        std::fs::read(out.join("policy/model.safetensors")).unwrap()
    );
    // Same config + seed = same weights, in a fresh folder.
    let again = d.path().join("bc2");
    let a2 = again.display().to_string();
    cli(&[
        "pretrain",
        "--config",
        &cfg,
        "--dataset",
        &ds,
        "--out",
        &a2,
        "--eval-episodes",
        "0",
    ])
    .unwrap();
    assert_eq!(
        actions(&out.join("policy")),
        actions(&again.join("policy")),
        "same config + seed = same policy"
    );
}

/// Rewrites the tiny config (`from` -> `to`) and returns the error `diffrl pretrain` gives.
fn pretrain_error(dir: &Path, from: &str, to: &str) -> String {
    let cfg = config(dir, "");
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(text.contains(from), "{from:?} not in the tiny config");
    std::fs::write(&cfg, text.replace(from, to)).unwrap();
    let out = dir.join("o").display().to_string();
    cli(&[
        "pretrain",
        "--config",
        &cfg,
        "--dataset",
        &shipped(),
        "--out",
        &out,
    ])
    .unwrap_err()
}

#[test]
fn bad_inputs_name_their_cause() {
    let d = tempfile::tempdir().unwrap();
    // An observation mode the dataset cannot feed (keypoints are computed from recorded
    // states; the shipped dataset has no camera frames).
    let e = pretrain_error(d.path(), "[env]\n", "[env]\nobs = \"pixels\"\n");
    assert!(
        e.contains("pixels") && e.contains("no camera frames"),
        "{e}"
    );
    // Unknown denoiser name.
    let e = pretrain_error(
        d.path(),
        "hidden = 32",
        "kind = \"transformer\"\nhidden = 32",
    );
    assert!(
        e.contains("policy.denoiser.kind") && e.contains("transformer"),
        "{e}"
    );
    // K' > K.
    let e = pretrain_error(
        d.path(),
        "denoising_steps = 5",
        "denoising_steps = 5\nft_denoising_steps = 6",
    );
    assert!(
        e.contains("ft_denoising_steps") && e.contains("exceeds"),
        "{e}"
    );

    let o = d.path().join("o").display().to_string();
    // Missing or empty dataset folders.
    let cfg = config(d.path(), "");
    let empty = d.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let e = cli(&[
        "pretrain",
        "--config",
        &cfg,
        "--dataset",
        &empty.display().to_string(),
        "--out",
        &o,
    ])
    .unwrap_err();
    assert!(e.contains("empty") && e.contains("dataset"), "{e}");

    // A policy folder that is not a checkpoint.
    let e = cli(&[
        "eval",
        "--policy",
        &empty.display().to_string(),
        "--config",
        &cfg,
    ])
    .unwrap_err();
    assert!(e.contains("policy.json"), "{e}");
}

#[test]
fn unet_and_gaussian_policies_train_and_evaluate() {
    let d = tempfile::tempdir().unwrap();
    let ds = shipped();
    for (name, extra) in [
        (
            "unet",
            "[policy.denoiser]\nkind = \"unet\"\nunet_down_dims = [8, 16]\nunet_groups = 4\n",
        ),
        (
            "gaussian",
            "[policy]\nkind = \"gaussian\"\n[policy.gaussian]\nhidden = [16]\n",
        ),
    ] {
        let cfg = config(d.path(), "");
        // Later tables win over the tiny defaults: merge by replacing the matching header.
        let base = std::fs::read_to_string(&cfg).unwrap();
        let text = if name == "unet" {
            base.replace("[policy.denoiser]\nhidden = 32\nblocks = 1\n", extra)
        } else {
            base.replace(
                "[policy]\n",
                &extra.replace("[policy.gaussian]\nhidden = [16]\n", ""),
            ) + "[policy.gaussian]\nhidden = [16]\n"
        };
        std::fs::write(&cfg, text).unwrap();
        let out = d.path().join(name);
        let o = out.display().to_string();
        let s = cli(&[
            "pretrain",
            "--config",
            &cfg,
            "--dataset",
            &ds,
            "--out",
            &o,
            "--steps",
            "10",
            "--eval-episodes",
            "1",
        ])
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(s.contains("eval: success"), "{name}: {s}");
        let meta = std::fs::read_to_string(out.join("policy/policy.json")).unwrap();
        assert!(
            meta.contains(&format!("\"{name}\"")),
            "{name} not in {meta}"
        );
    }
}

/// DAgger: the policy's rollouts labelled by the expert, aggregated after the base dataset,
/// the same bytes for the same seed; then behaviour cloning continues from the policy.
#[test]
fn dagger_round_aggregates_relabelled_rollouts_and_training_continues() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path(), "");
    let bc = d.path().join("bc").display().to_string();
    cli(&[
        "pretrain",
        "--config",
        &cfg,
        "--dataset",
        &shipped(),
        "--out",
        &bc,
        "--eval-episodes",
        "0",
    ])
    .unwrap();
    let policy = d.path().join("bc/policy").display().to_string();
    let round = |out: &str| {
        cli(&[
            "demos",
            "pusht",
            "--config",
            &cfg,
            "--dagger",
            &policy,
            "--base",
            &shipped(),
            "--episodes",
            "3",
            "--seed",
            "5",
            "--out",
            out,
        ])
    };
    let a = d.path().join("a").display().to_string();
    let s = round(&a).unwrap();
    assert!(s.contains("dagger: 3 policy episodes"), "{s}");
    assert!(
        s.contains("wrote 203 episodes (200 from the base dataset"),
        "{s}"
    );
    let ds = diffrl_core::lerobot::read_dataset(Path::new(&a)).unwrap();
    let eps = ds.episodes("observation.state").unwrap();
    assert_eq!(eps.len(), 203);
    let base = diffrl_core::lerobot::read_dataset(Path::new(&shipped()))
        .unwrap()
        .episodes("observation.state")
        .unwrap();
    assert_eq!(
        eps[..200],
        base[..],
        "the base dataset comes first, unchanged"
    );
    // The new episodes' actions are the expert's labels at the states the policy visited.
    // States are stored as f32, and where two contacts score alike the pusher's choice can
    // flip with the rounding: nearly every label (not every one) is the expert's at the
    // stored state. Labels that were the policy's actions would almost never agree.
    let pusher = diffrl_pusht::Pusher::new(diffrl_pusht::PusherConfig::default());
    let (mut agree, mut total) = (0, 0);
    for ep in &eps[200..] {
        assert!(ep.len() <= 20 && !ep.is_empty());
        for (o, a) in ep.observations.iter().zip(&ep.actions) {
            let s: Vec<f64> = o.state.iter().map(|&v| f64::from(v)).collect();
            let block = diffrl_pusht::geometry::Pose {
                x: s[2],
                y: s[3],
                angle: s[4],
            };
            let want = pusher.act([s[0], s[1]], &block);
            total += 1;
            agree += usize::from((want[0] - a[0]).abs() < 1.0 && (want[1] - a[1]).abs() < 1.0);
        }
    }
    assert!(
        agree * 10 >= total * 9,
        "{agree} of {total} labels are the expert's"
    );
    let b = d.path().join("b").display().to_string();
    round(&b).unwrap();
    let file = "data/chunk-000/file-000.parquet";
    assert_eq!(
        std::fs::read(Path::new(&a).join(file)).unwrap(),
        std::fs::read(Path::new(&b).join(file)).unwrap(),
        "same seed, same data"
    );
    // Training continues from the policy on the aggregate.
    let next = d.path().join("next").display().to_string();
    let s = cli(&[
        "pretrain",
        "--config",
        &cfg,
        "--dataset",
        &a,
        "--init",
        &policy,
        "--out",
        &next,
        "--steps",
        "10",
        "--eval-episodes",
        "0",
    ])
    .unwrap();
    assert!(s.contains("203 episodes"), "{s}");
    // Bad input: beta outside [0, 1], a policy built with other settings.
    let e = cli(&[
        "demos",
        "pusht",
        "--config",
        &cfg,
        "--dagger",
        &policy,
        "--beta",
        "1.5",
        "--episodes",
        "1",
        "--out",
        &d.path().join("c").display().to_string(),
    ])
    .unwrap_err();
    assert!(e.contains("beta") && e.contains("[0, 1]"), "{e}");
    let other_cfg = d.path().join("other.toml");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("hidden = 32", "hidden = 16");
    std::fs::write(&other_cfg, text).unwrap();
    let e = cli(&[
        "pretrain",
        "--config",
        &other_cfg.display().to_string(),
        "--dataset",
        &a,
        "--init",
        &policy,
        "--out",
        &d.path().join("n2").display().to_string(),
        "--steps",
        "10",
    ])
    .unwrap_err();
    assert!(e.contains("other [policy] settings"), "{e}");
}
