//! `--rerun` through the real binary on tiny runs: pretrain, eval, grpo and eval --randomize
//! write recordings our reader decodes (footer included), a missing viewer costs one warning
//! and nothing else, a bad sink fails before training, Ctrl-C still finishes the file, and
//! `diffrl view` without a viewer names the pip command. Also the one check of the binary's own
//! `main`: output into a pipe its reader closed ends quietly.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use diffrl_viz::read::{RecordingSummary, read_rrd};

mod common;
use common::wait_for_line;

fn run(args: &[&str], path_env: Option<&Path>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_diffrl"));
    c.args(args);
    if let Some(p) = path_env {
        c.env("PATH", p);
    }
    c.output().expect("the diffrl binary runs")
}

/// Ok(stdout, stderr) on success, Err(stderr) on failure.
fn diffrl(args: &[&str]) -> Result<(String, String), String> {
    let out = run(args, None);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok((String::from_utf8_lossy(&out.stdout).into_owned(), err))
    } else {
        Err(err)
    }
}

fn shipped() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../assets/pusht_expert_200")
        .display()
        .to_string()
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// A tiny config: short episodes, a small policy, small groups.
fn config(dir: &Path, extra: &str) -> String {
    let p = dir.join("c.toml");
    std::fs::write(
        &p,
        format!(
            "[run]\nname = \"t\"\nruns_dir = \"{}\"\nthreads = 1\n\
             [env]\nmax_episode_steps = 16\n\
             [policy]\npred_horizon = 4\naction_horizon = 2\n\
             [policy.denoiser]\nhidden = 16\nblocks = 1\n\
             [policy.diffusion]\ntrain_steps = 8\ndenoising_steps = 4\n\
             [pretrain]\nsteps = 20\nbatch_size = 16\nwarmup_steps = 2\nlog_every = 10\neval_every = 0\ncheckpoint_every = 20\n\
             [eval]\nepisodes = 2\nenvs = 2\n\
             [grpo]\ngroups = 2\ngroup_size = 2\nepochs = 1\nminibatch = 64\nlr = 0.001\n{extra}",
            dir.join("runs").display()
        ),
    )
    .unwrap();
    s(&p)
}

fn entities(sum: &RecordingSummary) -> Vec<&str> {
    sum.entities.keys().map(String::as_str).collect()
}

fn assert_has(sum: &RecordingSummary, paths: &[&str]) {
    for p in paths {
        assert!(
            sum.rows(p) > 0,
            "{p} missing from the recording; it has {:?}",
            entities(sum)
        );
    }
}

fn pretrain(dir: &Path, cfg: &str, extra: &[&str]) -> Result<(String, String), String> {
    let (data, out) = (shipped(), s(&dir.join("bc")));
    let args = [
        &[
            "pretrain",
            "--config",
            cfg,
            "--dataset",
            &data,
            "--out",
            &out,
        ][..],
        extra,
    ]
    .concat();
    diffrl(&args)
}

#[test]
fn recordings_of_pretrain_eval_grpo_and_robustness() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path(), "");

    let rrd = d.path().join("rec/pretrain.rrd");
    let (out, _) = pretrain(
        d.path(),
        &cfg,
        &[
            "--eval-episodes",
            "2",
            "--rerun",
            &format!("save={}", s(&rrd)),
        ],
    )
    .unwrap();
    assert!(out.contains("rerun: recording to save="), "{out}");
    let sum = read_rrd(&rrd).unwrap();
    assert!(sum.footer, "the footer is written at exit");
    assert_has(
        &sum,
        &[
            "/log",
            "/train/loss/bc",
            "/train/lr/lr",
            "/scene/block",
            "/scene/goal",
            "/scene/agent",
            "/scene/actions/predicted",
            "/scene/actions/executed",
            "/chain/x",
            "/chain/logp",
            "/rewards/reward",
            "/eval/episodes",
            "/eval/summary",
        ],
    );
    assert_eq!(sum.rows("/train/loss/bc"), 2, "20 steps, a line every 10");
    assert_eq!(sum.rows("/eval/episodes"), 2, "one line per episode");
    assert_eq!(sum.rows("/chain/logp") % 4, 0, "K = 4 log-probs per call");
    assert!(sum.blueprint_messages > 0);
    let policy = s(&d.path().join("bc/policy"));

    let rrd = d.path().join("eval.rrd");
    diffrl(&[
        "eval",
        "--config",
        &cfg,
        "--policy",
        &policy,
        "--episodes",
        "3",
        "--rerun",
        &format!("save={}", s(&rrd)),
    ])
    .unwrap();
    let sum = read_rrd(&rrd).unwrap();
    assert!(sum.footer);
    assert_has(&sum, &["/scene/agent", "/chain/x", "/eval/summary"]);
    assert_eq!(sum.rows("/eval/episodes"), 3);

    let rrd = d.path().join("grpo.rrd");
    diffrl(&[
        "grpo",
        "--config",
        &cfg,
        "--policy",
        &policy,
        "--out",
        &s(&d.path().join("grpo")),
        "--iterations",
        "2",
        "--eval-episodes",
        "0",
        "--rerun",
        &format!("save={}", s(&rrd)),
    ])
    .unwrap();
    let sum = read_rrd(&rrd).unwrap();
    assert!(sum.footer);
    assert_has(
        &sum,
        &[
            "/scene/agent",
            "/chain/x",
            "/chain/logp",
            "/rewards/reward",
            "/rewards/advantage",
            "/groups/mean",
            "/groups/std",
            "/train/loss/surrogate",
            "/train/kl/approx",
            "/train/clip/frac",
            "/train/success/rollouts",
            "/train/lr/lr",
        ],
    );
    assert_eq!(sum.rows("/groups/mean"), 2, "one row per iteration");
    assert_eq!(sum.rows("/train/kl/approx"), 2);
    // Rollout 0 of each iteration: its rewards and advantages cover the same steps.
    assert_eq!(sum.rows("/rewards/reward"), sum.rows("/rewards/advantage"));
    let logp = &sum.entities["/chain/logp"];
    assert!(
        ["denoise_step", "env_step", "train_step"]
            .iter()
            .all(|t| logp.timelines.contains(*t)),
        "{:?}",
        logp.timelines
    );

    let sweep = d.path().join("sweep.toml");
    std::fs::write(
        &sweep,
        "episodes = 2\nseed = 3\n[grid]\nfriction = [[1.0, 1.0]]\nkp = [[60.0, 60.0]]\n",
    )
    .unwrap();
    let rrd = d.path().join("robust.rrd");
    diffrl(&[
        "eval",
        "--config",
        &cfg,
        "--policy",
        &policy,
        "--randomize",
        &s(&sweep),
        "--out",
        &s(d.path()),
        "--rerun",
        &format!("save={}", s(&rrd)),
    ])
    .unwrap();
    let sum = read_rrd(&rrd).unwrap();
    assert!(sum.footer);
    assert_has(
        &sum,
        &[
            "/robustness/table",
            "/robustness/success_rate",
            "/robustness/mean_max_score",
        ],
    );

    // Without --rerun nothing is recorded.
    let before = std::fs::read_dir(d.path()).unwrap().count();
    diffrl(&[
        "eval",
        "--config",
        &cfg,
        "--policy",
        &policy,
        "--episodes",
        "1",
        "--out",
        &s(&d.path().join("e.json")),
    ])
    .unwrap();
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), before + 1);
}

/// Push-T from pixels, trained on demonstrations recorded with its camera: the evaluation
/// records the policy's frame and, at every policy call, where it looked.
#[test]
fn a_pixel_policy_records_its_frame_and_saliency() {
    let d = tempfile::tempdir().unwrap();
    let cfg = d.path().join("pixels.toml");
    std::fs::write(
        &cfg,
        "[run]\nthreads = 1\n[env]\nobs = \"pixels\"\nimage_size = 32\nmax_episode_steps = 8\n\
         [policy]\npred_horizon = 4\naction_horizon = 2\n[policy.encoder.image]\nkind = \"patches\"\n\
         [policy.denoiser]\nhidden = 16\nblocks = 1\n\
         [policy.diffusion]\ntrain_steps = 8\ndenoising_steps = 4\n\
         [pretrain]\nsteps = 4\nbatch_size = 8\nwarmup_steps = 1\neval_every = 0\ncheckpoint_every = 4\n\
         [eval]\nepisodes = 1\nenvs = 1\n",
    )
    .unwrap();
    let (cfg, demos) = (s(&cfg), s(&d.path().join("demos")));
    diffrl(&[
        "demos",
        "pusht",
        "--config",
        &cfg,
        "--episodes",
        "2",
        "--out",
        &demos,
    ])
    .unwrap();
    let rrd = d.path().join("pixels.rrd");
    let out = s(&d.path().join("bc"));
    diffrl(&[
        "pretrain",
        "--config",
        &cfg,
        "--dataset",
        &demos,
        "--out",
        &out,
        "--rerun",
        &format!("save={}", s(&rrd)),
    ])
    .unwrap();
    let sum = read_rrd(&rrd).unwrap();
    assert_has(&sum, &["/pixels", "/saliency/frame", "/saliency/max"]);
    // 8 steps in chunks of 2: one map per policy call.
    assert_eq!(sum.rows("/saliency/frame"), 4);
}

#[test]
fn missing_viewer_warns_once_and_training_finishes() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path(), "");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (out, err) = pretrain(
        d.path(),
        &cfg,
        &[
            "--eval-episodes",
            "2",
            "--rerun",
            &format!("connect=127.0.0.1:{port}"),
        ],
    )
    .unwrap();
    assert!(out.contains("eval: success"), "{out}");
    assert_eq!(
        err.matches("warning: rerun").count(),
        1,
        "exactly one warning: {err}"
    );
    assert!(err.contains("no viewer at"), "{err}");
}

#[test]
fn bad_sinks_fail_before_training() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path(), "");
    let file = d.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let e = pretrain(
        d.path(),
        &cfg,
        &["--rerun", &format!("save={}", s(&file.join("x.rrd")))],
    )
    .unwrap_err();
    assert!(e.contains("cannot write the recording"), "{e}");
    assert!(
        !d.path().join("bc").exists(),
        "nothing was trained or written"
    );

    let e = pretrain(d.path(), &cfg, &["--rerun", "file=x.rrd"]).unwrap_err();
    assert!(e.contains("save=PATH"), "{e}");

    // No viewer on PATH: spawn and view say how to get it.
    let empty = d.path().join("empty-path");
    std::fs::create_dir_all(&empty).unwrap();
    let out = run(
        &[
            "pretrain",
            "--config",
            &cfg,
            "--dataset",
            &shipped(),
            "--out",
            &s(&d.path().join("bc")),
            "--rerun",
            "spawn",
        ],
        Some(&empty),
    );
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(e.contains("pip install rerun-sdk==0.36.3"), "{e}");
    assert!(!e.contains("panicked"), "{e}");

    let rrd = d.path().join("r.rrd");
    pretrain(
        d.path(),
        &cfg,
        &[
            "--eval-episodes",
            "0",
            "--rerun",
            &format!("save={}", s(&rrd)),
        ],
    )
    .unwrap();
    let out = run(&["view", &s(&rrd)], Some(&empty));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(e.contains("pip install rerun-sdk==0.36.3"), "{e}");
    let e = diffrl(&["view", &s(d.path())]).unwrap_err();
    assert!(
        e.contains("no recording at") && e.contains("recording.rrd"),
        "{e}"
    );

    // Commands that record nothing say so.
    let (_, err) = diffrl(&["inspect", &shipped(), "--rerun", "save=x.rrd"]).unwrap();
    assert!(err.contains("records nothing"), "{err}");
}

#[cfg(unix)]
#[test]
fn ctrl_c_finishes_the_recording() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path(), "iterations = 1000\n");
    pretrain(d.path(), &cfg, &["--eval-episodes", "0"]).unwrap();
    let rrd: PathBuf = d.path().join("grpo.rrd");
    let mut child = Command::new(env!("CARGO_BIN_EXE_diffrl"))
        .args([
            "grpo",
            "--config",
            &cfg,
            "--policy",
            &s(&d.path().join("bc/policy")),
            "--out",
            &s(&d.path().join("grpo")),
            "--eval-episodes",
            "0",
            "--rerun",
            &format!("save={}", s(&rrd)),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Three iterations logged (to the recording too) before Ctrl-C.
    let rest = wait_for_line(child.stderr.take().unwrap(), |l| {
        l.contains(": iteration 3/")
    });
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let err: Vec<String> = rest.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{status:?}: {}", err.join("\n"));
    let sum = read_rrd(&rrd).unwrap();
    assert!(sum.footer, "Ctrl-C wrote the footer");
    assert!(
        sum.rows("/train/loss/surrogate") >= 3,
        "{:?}",
        entities(&sum)
    );
}

/// `diffrl sim ... --json | head`: the reader goes away before the command is done, and the
/// command ends quietly with status 0 instead of reporting "error: Broken pipe".
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_diffrl"))
        .args(["sim", "pusht", "--seed", "0", "--expert", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Ours was the only read end: the command's first line already finds the pipe closed.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(!err.contains("error"), "{err}");
}
