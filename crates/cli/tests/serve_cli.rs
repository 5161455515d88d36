//! `diffrl serve` and `diffrl eval --remote` through the real binary: remote evaluation is
//! reproducible, matches the local policy's success bookkeeping, and a policy folder that does
//! not load keeps the server from starting.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};

mod common;
use common::*;

fn tiny(dir: &Path) -> (String, String) {
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[run]\nname = \"t\"\nruns_dir = \"{}\"\nthreads = 1\n\
             [env]\nmax_episode_steps = 16\n\
             [policy]\npred_horizon = 4\naction_horizon = 2\n\
             [policy.denoiser]\nhidden = 16\nblocks = 1\n\
             [policy.diffusion]\ntrain_steps = 8\ndenoising_steps = 4\n\
             [pretrain]\nsteps = 20\nbatch_size = 16\nwarmup_steps = 2\nlog_every = 10\neval_every = 0\ncheckpoint_every = 20\n\
             [eval]\nepisodes = 4\nenvs = 2\n",
            dir.join("runs").display()
        ),
    )
    .unwrap();
    let cfg = cfg.display().to_string();
    let out = dir.join("bc").display().to_string();
    diffrl(&[
        "pretrain",
        "--config",
        &cfg,
        "--dataset",
        &shipped(),
        "--out",
        &out,
        "--eval-episodes",
        "0",
    ])
    .unwrap();
    (cfg, format!("{out}/policy"))
}

struct Serving {
    child: Child,
    url: String,
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(policy: &str, extra: &[&str]) -> Serving {
    let mut child = bin()
        .args(["serve", "--port", "0", "--quiet", "--policy", policy])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("ws://"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    Serving { child, url }
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn remote_evaluation_is_reproducible_and_reports_latency() {
    let d = tempfile::tempdir().unwrap();
    let (cfg, policy) = tiny(d.path());
    let server = serve(&policy, &["--api-key", "k"]);
    let run = |name: &str, latency: &str| {
        let out = d.path().join(name);
        let text = diffrl(&[
            "eval",
            "--config",
            &cfg,
            "--remote",
            &server.url,
            "--api-key",
            "k",
            "--latency-ms",
            latency,
            "--action-delay",
            "1",
            "--out",
            &out.display().to_string(),
        ])
        .unwrap();
        assert!(text.contains("round trip p50"), "{text}");
        json(&out)
    };
    let a = run("a.json", "0");
    let b = run("b.json", "4");
    // Seeds travel with the requests, so timing (and injected latency) changes nothing.
    assert_eq!(a["per_episode"], b["per_episode"]);
    assert_eq!(a["episodes"], 4);
    assert_eq!(a["remote"]["action_delay_steps"], 1);
    // 4 episodes x 16 steps / Ta 2 = 32 requests.
    assert_eq!(a["remote"]["timing"]["requests"], 32);
    let p50 = b["remote"]["timing"]["p50_ms"].as_f64().unwrap();
    assert!(
        p50 >= 4.0,
        "the injected 4 ms round trip shows in the timing: {p50}"
    );
    // Without the key, a clear refusal.
    let e = diffrl(&["eval", "--config", &cfg, "--remote", &server.url]).unwrap_err();
    assert!(e.contains("401") && e.contains("Api-Key"), "{e}");
}

#[test]
fn a_policy_that_does_not_load_keeps_the_server_from_starting() {
    let d = tempfile::tempdir().unwrap();
    let e = diffrl(&["serve", "--policy", "/nonexistent/policy", "--port", "0"]).unwrap_err();
    assert!(
        e.contains("cannot start") && e.contains("/nonexistent/policy"),
        "{e}"
    );
    let broken = d.path().join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("policy.json"), "{ not json").unwrap();
    let e = diffrl(&["serve", "--policy", &broken.display().to_string()]).unwrap_err();
    assert!(
        e.contains("cannot start") && e.contains("policy.json"),
        "{e}"
    );
    let e = diffrl(&["eval", "--remote", "ws://127.0.0.1:9", "--episodes", "1"]).unwrap_err();
    assert!(e.contains("ws://127.0.0.1:9"), "{e}");
    let e = diffrl(&["eval"]).unwrap_err();
    assert!(e.contains("--policy"), "{e}");
}
