//! `diffrl reward train|eval` and progress shaping in `diffrl grpo`, through the real binary.

use std::path::Path;

mod common;
use common::*;

/// A tiny config observing states, or `extra`'s observation (an `obs = ...` line).
fn config(dir: &Path, name: &str, extra: &str) -> String {
    let p = dir.join(name);
    let obs = if extra.is_empty() {
        "obs = \"state\"\n"
    } else {
        extra
    };
    std::fs::write(
        &p,
        format!(
            "[run]\nname = \"t\"\nruns_dir = \"{}\"\nthreads = 1\n\
             [env]\nmax_episode_steps = 16\n{obs}\
             [policy]\npred_horizon = 4\naction_horizon = 2\n\
             [policy.denoiser]\nhidden = 16\nblocks = 1\n\
             [policy.diffusion]\ntrain_steps = 8\ndenoising_steps = 4\n\
             [pretrain]\nsteps = 20\nbatch_size = 16\nwarmup_steps = 2\nlog_every = 10\neval_every = 0\ncheckpoint_every = 20\n\
             [eval]\nepisodes = 2\nenvs = 2\n\
             [grpo]\niterations = 1\ngroups = 2\ngroup_size = 2\nepochs = 1\nminibatch = 64\n\
             [grpo.advantage]\nestimator = \"process\"\n\
             [reward.progress]\nsteps = 30\nhidden = [16]\nbatch_size = 32\n",
            dir.join("runs").display()
        ),
    )
    .unwrap();
    p.display().to_string()
}

/// `diffrl grpo` from `policy` into `dir/out`, no final evaluation.
fn grpo(dir: &Path, cfg: &str, policy: &str, out: &str) -> Result<String, String> {
    let out = dir.join(out).display().to_string();
    diffrl(&[
        "grpo",
        "--config",
        cfg,
        "--policy",
        policy,
        "--out",
        &out,
        "--eval-episodes",
        "0",
    ])
}

#[test]
fn train_eval_and_shape_grpo_with_a_progress_model() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path(), "c.toml", "");
    let model = d.path().join("progress").display().to_string();
    let text = diffrl(&[
        "reward",
        "train",
        "--config",
        &cfg,
        "--dataset",
        &shipped(),
        "--out",
        &model,
    ])
    .unwrap();
    assert!(
        text.contains("VOC") && text.contains("pairwise accuracy"),
        "{text}"
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(Path::new(&model).join("reward.json")).unwrap())
            .unwrap();
    assert_eq!(meta["kind"], "progress");
    assert_eq!(meta["state_dim"], 5);
    assert!(meta["info"]["held_out"]["voc"].is_number());
    let bc = d.path().join("bc").display().to_string();
    diffrl(&[
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
    let policy = format!("{bc}/policy");
    let out = d.path().join("eval.json").display().to_string();
    let text = diffrl(&[
        "reward",
        "eval",
        "--model",
        &model,
        "--config",
        &cfg,
        "--dataset",
        &shipped(),
        "--policy",
        &policy,
        "--episodes",
        "4",
        "--out",
        &out,
    ])
    .unwrap();
    assert!(text.contains("+ 4 policy rollouts"), "{text}");
    let ev: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(ev["policy_rollouts"], 4);
    // GRPO with potential-based shaping from that model.
    let shaped = config(d.path(), "shaped.toml", "");
    let text = std::fs::read_to_string(&shaped).unwrap()
        + &format!("[reward.shaping]\nmodel = \"{model}\"\ngamma = 0.99\n");
    std::fs::write(&shaped, text).unwrap();
    let out = grpo(d.path(), &shaped, &policy, "grpo").unwrap();
    assert!(out.contains("shaped(progress, gamma 0.99)"), "{out}");
    // grpo-lambda reads the model's progress as its value feature, and logs the value fit; with
    // no model named and none in the run folder, `diffrl grpo` refuses before collecting
    // anything.
    let lam = config(d.path(), "lam.toml", "");
    let text = std::fs::read_to_string(&lam).unwrap().replace(
        "estimator = \"process\"",
        "estimator = \"grpo-lambda\"\nvalue = \"piecewise\"",
    );
    std::fs::write(&lam, &text).unwrap();
    let e = grpo(d.path(), &lam, &policy, "grpo-lambda-none").unwrap_err();
    let own = d.path().join("runs/t/reward/progress");
    assert!(
        e.contains("grpo-lambda")
            && e.contains("[reward.shaping]")
            && e.contains(&own.display().to_string()),
        "{e}"
    );
    assert!(!d.path().join("grpo-lambda-none").exists());
    // With the model where `diffrl run` puts it, that one is read.
    std::fs::create_dir_all(own.parent().unwrap()).unwrap();
    std::fs::rename(&model, &own).unwrap();
    let out = grpo(d.path(), &lam, &policy, "grpo-lambda").unwrap();
    assert!(out.contains("advantages grpo-lambda"), "{out}");
    assert!(
        out.contains(&format!("progress model {}", own.display())),
        "{out}"
    );
    std::fs::rename(&own, &model).unwrap();
    let metrics = std::fs::read_to_string(d.path().join("grpo-lambda/metrics.jsonl")).unwrap();
    let fit = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find_map(|v| v["train"]["value_fit"].as_array().cloned())
        .expect("a value fit in metrics.jsonl");
    assert!(
        fit.iter().all(|x| x.as_f64().unwrap().is_finite()),
        "{fit:?}"
    );
    // SRPO outcomes under the same shaping.
    let srpo = config(d.path(), "srpo.toml", "");
    let text = std::fs::read_to_string(&srpo).unwrap()
        + &format!("[reward.shaping]\nmodel = \"{model}\"\n[reward.srpo]\nlength_scale = 40.0\n");
    std::fs::write(&srpo, text).unwrap();
    let out = grpo(d.path(), &srpo, &policy, "grpo-srpo").unwrap();
    assert!(out.contains("score+srpo+shaped"), "{out}");
    // SPA attribution from demonstrations plus rollouts of the policy; GRPO's process
    // estimator then gets its contributions as step rewards.
    let spa_dir = d.path().join("spa");
    let spa = spa_dir.display().to_string();
    let out = diffrl(&[
        "reward",
        "train",
        "--kind",
        "spa",
        "--config",
        &cfg,
        "--dataset",
        &shipped(),
        "--policy",
        &policy,
        "--episodes",
        "6",
        "--steps",
        "20",
        "--out",
        &spa,
    ])
    .unwrap();
    assert!(
        out.contains("6 policy rollouts") && out.contains("mean |sum of contributions - outcome|"),
        "{out}"
    );
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(spa_dir.join("reward.json")).unwrap())
            .unwrap();
    assert_eq!(meta["kind"], "spa");
    assert!(
        meta["info"]["held_out"]["mean_abs_error"]
            .as_f64()
            .is_some(),
        "{meta}"
    );
    let with_spa = config(d.path(), "spa.toml", "");
    let text = std::fs::read_to_string(&with_spa).unwrap()
        + &format!("[reward.spa]\nmodel = \"{spa}\"\nweight = 0.5\n");
    std::fs::write(&with_spa, text).unwrap();
    let out = grpo(d.path(), &with_spa, &policy, "grpo-spa").unwrap();
    assert!(out.contains("score+spa"), "{out}");
    // A progress model where an SPA model belongs is refused with the reason.
    let wrong = config(d.path(), "wrong.toml", "");
    let text =
        std::fs::read_to_string(&wrong).unwrap() + &format!("[reward.spa]\nmodel = \"{model}\"\n");
    std::fs::write(&wrong, text).unwrap();
    let e = grpo(d.path(), &wrong, &policy, "grpo-wrong").unwrap_err();
    assert!(e.contains("not an SPA model"), "{e}");
}

#[test]
fn bad_reward_settings_are_refused_with_their_cause() {
    let d = tempfile::tempdir().unwrap();
    // A model folder that is not one.
    let cfg = config(d.path(), "c.toml", "");
    let e = diffrl(&[
        "reward",
        "eval",
        "--model",
        "/nonexistent/progress",
        "--config",
        &cfg,
    ])
    .unwrap_err();
    assert!(
        e.contains("reward.json") && e.contains("diffrl reward train"),
        "{e}"
    );
    // A model trained on 5-d states used with keypoint observations (18-d).
    let model = d.path().join("progress").display().to_string();
    diffrl(&[
        "reward",
        "train",
        "--config",
        &cfg,
        "--dataset",
        &shipped(),
        "--out",
        &model,
        "--steps",
        "5",
    ])
    .unwrap();
    let kp = config(d.path(), "kp.toml", "obs = \"keypoints\"\n");
    let e = diffrl(&["reward", "eval", "--model", &model, "--config", &kp]).unwrap_err();
    assert!(
        e.contains("reads states of 5 values") && e.contains("18"),
        "{e}"
    );
    // Budgets that do not sum to 1; a gamma out of range.
    let bad = config(d.path(), "b.toml", "");
    let text = std::fs::read_to_string(&bad).unwrap() + "stage_budgets = [0.9, 0.9, 0.9]\n";
    std::fs::write(&bad, text).unwrap();
    let e = diffrl(&[
        "reward",
        "train",
        "--config",
        &bad,
        "--dataset",
        &shipped(),
        "--out",
        &model,
    ])
    .unwrap_err();
    assert!(e.contains("stage_budgets"), "{e}");
    let g = config(d.path(), "g.toml", "");
    let text =
        std::fs::read_to_string(&g).unwrap() + "[reward.shaping]\nmodel = \"x\"\ngamma = 1.5\n";
    std::fs::write(&g, text).unwrap();
    let e = diffrl(&["reward", "train", "--config", &g, "--dataset", &shipped()]).unwrap_err();
    assert!(e.contains("reward.shaping.gamma"), "{e}");
}
