//! End-to-end tests of the `diffrl` CLI, driven in-process through `diffrl_cli::run_cli`.

mod common;

use std::path::Path;

use diffrl_core::Env;
use diffrl_core::lerobot::read_dataset;
use diffrl_core::seeding::derive;
use diffrl_core::task::Task as _;
use diffrl_pusht::geometry::Pose;
use diffrl_pusht::{PushT, Pusher};
use serde_json::Value;

fn cli(args: &[&str]) -> anyhow_like::Result<String> {
    let mut out = Vec::new();
    let mut full = vec!["diffrl"];
    full.extend_from_slice(args);
    diffrl_cli::run_cli(full, &mut out).map_err(|e| format!("{e:#}"))?;
    Ok(String::from_utf8(out).unwrap())
}

mod anyhow_like {
    pub type Result<T> = std::result::Result<T, String>;
}

/// A small, fast config: short episodes and a light expert.
fn tiny_config(dir: &Path, extra: &str) -> String {
    let p = dir.join("tiny.toml");
    let text = format!(
        "[run]\nname = \"tiny\"\nruns_dir = \"{}\"\nthreads = 2\n[env]\nmax_episode_steps = 25\n[expert]\nsamples = 8\nhorizon = 6\n[demos]\nepisodes = 3\n\
         [policy]\npred_horizon = 8\naction_horizon = 4\n[policy.denoiser]\nhidden = 16\nblocks = 1\n\
         [policy.diffusion]\ntrain_steps = 10\ndenoising_steps = 5\n\
         [pretrain]\nsteps = 20\nbatch_size = 16\nwarmup_steps = 2\neval_every = 0\ncheckpoint_every = 10\n\
         [eval]\nepisodes = 2\nenvs = 2\n{extra}",
        dir.join("runs").display()
    );
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn vectors() -> Value {
    let path = common::repo_file("assets/testdata/pusht_gym_vectors.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn json_lines(s: &str) -> Vec<Value> {
    s.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn sim_replays_actions_like_gym_pusht() {
    let v = vectors();
    let d = tempfile::tempdir().unwrap();
    // Free space: agent positions within 1e-3 px of gym-pusht's.
    let case = &v["free_space"][0];
    let acts = d.path().join("acts.json");
    std::fs::write(&acts, case["targets"].to_string()).unwrap();
    let s: Vec<String> = case["init_state"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.to_string())
        .collect();
    let out = cli(&[
        "sim",
        "pusht",
        "--init-state",
        &s.join(","),
        "--actions",
        acts.to_str().unwrap(),
        "--json",
    ])
    .unwrap();
    let lines = json_lines(&out);
    assert_eq!(lines[0]["step"], 0);
    for (a, b) in lines[0]["state"]
        .as_array()
        .unwrap()
        .iter()
        .zip(case["reset_obs"].as_array().unwrap())
    {
        assert!((a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < 1e-3);
    }
    assert_eq!(lines.len(), 1 + case["targets"].as_array().unwrap().len());
    for (line, want) in lines[1..].iter().zip(case["agent"].as_array().unwrap()) {
        for k in 0..2 {
            let (a, b) = (
                line["state"][k].as_f64().unwrap(),
                want[k].as_f64().unwrap(),
            );
            assert!((a - b).abs() < 1e-3, "step {}: {a} vs {b}", line["step"]);
        }
        for key in ["reward", "coverage", "success"] {
            assert!(line.get(key).is_some(), "{key} missing in {line}");
        }
    }
    // With contact: the reset observation (legacy quirk) is exact; the push ends nearby.
    let case = &v["pushes"][0];
    std::fs::write(&acts, case["targets"].to_string()).unwrap();
    let s: Vec<String> = case["init_state"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.to_string())
        .collect();
    let lines = json_lines(
        &cli(&[
            "sim",
            "pusht",
            "--init-state",
            &s.join(","),
            "--actions",
            acts.to_str().unwrap(),
            "--json",
        ])
        .unwrap(),
    );
    for (a, b) in lines[0]["state"]
        .as_array()
        .unwrap()
        .iter()
        .zip(case["reset_obs"].as_array().unwrap())
    {
        assert!(
            (a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < 1e-3,
            "{a} vs {b}"
        );
    }
    let (ours, theirs) = (
        &lines.last().unwrap()["state"],
        case["obs"].as_array().unwrap().last().unwrap(),
    );
    let err = (ours[2].as_f64().unwrap() - theirs[2].as_f64().unwrap())
        .hypot(ours[3].as_f64().unwrap() - theirs[3].as_f64().unwrap());
    assert!(err < 5.0, "end position differs by {err} px");
}

#[test]
fn dart_demos_execute_noise_and_record_the_pushers_labels() {
    let d = tempfile::tempdir().unwrap();
    let cfg = tiny_config(d.path(), "");
    let out = d.path().join("dart");
    let o = out.to_str().unwrap();
    let msg = cli(&[
        "demos",
        "pusht",
        "--episodes",
        "2",
        "--seed",
        "5",
        "--noise",
        "10",
        "--out",
        o,
        "--config",
        &cfg,
    ])
    .unwrap();
    assert!(msg.contains("action jumps median"), "{msg}");
    let eps = read_dataset(&out)
        .unwrap()
        .episodes("observation.state")
        .unwrap();
    let pusher = Pusher::default();
    let (mut frames, mut labelled, mut reproduced) = (0, 0, true);
    for (i, ep) in eps.iter().enumerate() {
        let mut env = PushT::builder().max_episode_steps(25).build();
        env.reset(derive(5, i as u64));
        for (obs, a) in ep.observations.iter().zip(&ep.actions) {
            let s: Vec<f64> = obs.state.iter().map(|&v| f64::from(v)).collect();
            let label = pusher.act([s[0], s[1]], &Pose::new(s[2], s[3], s[4]));
            frames += 1;
            labelled += usize::from((label[0] - a[0]).abs() < 0.1 && (label[1] - a[1]).abs() < 0.1);
            let t = env.true_state();
            reproduced &= s.iter().zip(t).all(|(x, y)| (x - y).abs() < 1e-3);
            env.step(a).unwrap();
        }
    }
    // Labels are the pusher's action on the recorded (f32-rounded) state; the executed actions
    // carried noise, so replaying the labels leaves the recorded path.
    assert!(labelled * 100 >= frames * 95, "{labelled}/{frames}");
    assert!(
        !reproduced,
        "replaying the labels reproduced the noisy episode"
    );
    let e = cli(&["demos", "pusht", "--noise=-1", "--out", o]).unwrap_err();
    assert!(e.contains("--noise"), "{e}");
}

#[test]
fn sim_seeded_reset_and_expert() {
    let d = tempfile::tempdir().unwrap();
    let cfg = tiny_config(d.path(), "");
    let a = cli(&[
        "sim", "pusht", "--seed", "4", "--expert", "--json", "--config", &cfg,
    ])
    .unwrap();
    let b = cli(&[
        "sim", "pusht", "--seed", "4", "--expert", "--json", "--config", &cfg,
    ])
    .unwrap();
    assert_eq!(a, b, "same seed, same output");
    let lines = json_lines(&a);
    assert!(lines.len() >= 2 && lines.len() <= 26);
    let last = lines.last().unwrap();
    assert!(last["terminated"].as_bool().unwrap() || last["truncated"].as_bool().unwrap());
    let mut env = PushT::builder().build();
    let obs = env.reset(4);
    for (x, y) in lines[0]["state"].as_array().unwrap().iter().zip(&obs.state) {
        assert!((x.as_f64().unwrap() - *y as f64).abs() < 1e-3);
    }
}

#[test]
fn sim_bad_input_gives_clear_errors() {
    let d = tempfile::tempdir().unwrap();
    let acts = d.path().join("acts.json");
    let replay = |json: &str| {
        std::fs::write(&acts, json).unwrap();
        cli(&[
            "sim",
            "pusht",
            "--seed",
            "0",
            "--actions",
            acts.to_str().unwrap(),
        ])
        .unwrap_err()
    };
    let e = replay("[[1, 2], [3]]");
    assert!(
        e.contains("action 1 has 1 values") && e.contains("acts.json"),
        "{e}"
    );
    let e = replay("[[1, 2], [NaN, 3]]");
    assert!(e.contains("acts.json"), "{e}");
    // JSON has no NaN literal, but a huge number overflows f32 to infinity: rejected by the env.
    let e = replay("[[1, 2], [1e300, 3]]");
    assert!(e.contains("not finite"), "{e}");
    let e = cli(&["sim", "pusht", "--init-state", "1,2,3", "--expert"]).unwrap_err();
    assert!(e.contains("5 comma-separated"), "{e}");
    let e = cli(&["sim", "pusht", "--seed", "0"]).unwrap_err();
    assert!(e.contains("--actions") && e.contains("--expert"), "{e}");
    let e = cli(&["sim", "cartpole", "--seed", "0", "--expert"]).unwrap_err();
    assert!(e.contains("unknown simulator"), "{e}");
    let e = cli(&[
        "sim",
        "pusht",
        "--seed",
        "0",
        "--actions",
        "/nonexistent/a.json",
    ])
    .unwrap_err();
    assert!(e.contains("/nonexistent/a.json"), "{e}");
}

#[test]
fn demos_write_a_dataset_that_replays_in_the_simulator() {
    let d = tempfile::tempdir().unwrap();
    let cfg = tiny_config(d.path(), "");
    let out = d.path().join("demos");
    let o = out.to_str().unwrap();
    // Without DART noise the recorded labels are the executed actions, so they replay.
    let msg = cli(&[
        "demos",
        "pusht",
        "--episodes",
        "3",
        "--seed",
        "11",
        "--noise",
        "0",
        "--out",
        o,
        "--config",
        &cfg,
    ])
    .unwrap();
    assert!(msg.contains("3 episodes: success"), "{msg}");
    let ds = read_dataset(&out).unwrap();
    let eps = ds.episodes("observation.state").unwrap();
    assert_eq!(eps.len(), 3);
    assert_eq!(ds.info["total_frames"].as_u64().unwrap() as usize, ds.len());
    for k in [
        "meta/stats.json",
        "meta/tasks.parquet",
        "meta/episodes/chunk-000/file-000.parquet",
    ] {
        assert!(out.join(k).exists(), "{k}");
    }
    // Replaying the recorded actions from the recorded seed reproduces the recorded states.
    for (i, ep) in eps.iter().enumerate() {
        let mut env = PushT::builder().max_episode_steps(25).build();
        env.reset(derive(11, i as u64));
        for (t, (obs, a)) in ep.observations.iter().zip(&ep.actions).enumerate() {
            let s = env.true_state();
            for (x, y) in obs.state.iter().zip(s) {
                assert!((*x as f64 - y).abs() < 1e-3, "episode {i} step {t}");
            }
            let r = env.step(a).unwrap();
            assert_eq!(r.reward, ep.rewards[t]);
        }
    }
    // Same seed, same bytes.
    let out2 = d.path().join("demos2");
    cli(&[
        "demos",
        "pusht",
        "--episodes",
        "3",
        "--seed",
        "11",
        "--noise",
        "0",
        "--out",
        out2.to_str().unwrap(),
        "--config",
        &cfg,
    ])
    .unwrap();
    let data = "data/chunk-000/file-000.parquet";
    assert_eq!(
        std::fs::read(out.join(data)).unwrap(),
        std::fs::read(out2.join(data)).unwrap()
    );
    // An existing dataset is not overwritten by accident.
    let e = cli(&[
        "demos",
        "pusht",
        "--episodes",
        "3",
        "--seed",
        "11",
        "--out",
        o,
        "--config",
        &cfg,
    ])
    .unwrap_err();
    assert!(e.contains("overwrite"), "{e}");
    let inspect = cli(&["inspect", o]).unwrap();
    assert!(inspect.contains("3 episodes"), "{inspect}");
}

#[test]
fn inspect_reports_corrupt_dataset_file() {
    let d = tempfile::tempdir().unwrap();
    let cfg = tiny_config(d.path(), "");
    let out = d.path().join("demos");
    cli(&[
        "demos",
        "pusht",
        "--episodes",
        "1",
        "--out",
        out.to_str().unwrap(),
        "--config",
        &cfg,
    ])
    .unwrap();
    let f = out.join("data/chunk-000/file-000.parquet");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() - 20]).unwrap();
    let e = cli(&["inspect", out.to_str().unwrap()]).unwrap_err();
    assert!(e.contains("file-000.parquet"), "{e}");
}

#[test]
fn run_writes_run_folder_and_resumes() {
    let d = tempfile::tempdir().unwrap();
    // Demos recorded by the run itself (dataset = ""), then every later stage, tiny.
    let extra = "[reward.progress]\nsteps = 10\nbatch_size = 16\nhidden = [8]\n\
                 [grpo]\niterations = 1\ngroups = 2\ngroup_size = 2\nepochs = 1\nminibatch = 64\n";
    let cfg = tiny_config(d.path(), extra);
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "[demos]\nepisodes = 3\n",
        "[demos]\nepisodes = 3\ndataset = \"\"\n",
    );
    std::fs::write(&cfg, text).unwrap();
    let first = cli(&["run", &cfg]).unwrap();
    assert!(first.contains("[1/5] demos: 3 expert episodes"), "{first}");
    assert!(
        first.contains("[2/5] pretrain: behaviour cloning"),
        "{first}"
    );
    let run = d.path().join("runs/tiny");
    for f in [
        "config.toml",
        "metrics.jsonl",
        "report.md",
        "summary.json",
        "recording.rrd",
        "demos/meta/info.json",
        "pretrain/policy/model.safetensors",
        "grpo/policy/model.safetensors",
        "eval/bc.json",
        "eval/grpo.json",
    ] {
        assert!(run.join(f).exists(), "{f}");
    }
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(
        report.contains("## Expert demonstrations") && report.contains("| BC (20 steps) |"),
        "{report}"
    );
    let second = cli(&["run", &cfg]).unwrap();
    assert!(second.contains("demos: reusing"), "{second}");
    assert!(second.contains("pretrain: reusing"), "{second}");
    // A changed config is refused until told; with --resume the changed stages are redone.
    let e = cli(&["run", &cfg, "--episodes", "2"]).unwrap_err();
    assert!(e.contains("demos.episodes: 3 -> 2"), "{e}");
    let third = cli(&["run", &cfg, "--episodes", "2", "--resume"]).unwrap();
    assert!(third.contains("2 expert episodes"), "{third}");
    assert!(third.contains("starting it over"), "{third}");
}

#[test]
fn run_config_errors_name_key_and_file() {
    let d = tempfile::tempdir().unwrap();
    let cfg = tiny_config(d.path(), "colour = \"red\"\n");
    let e = cli(&["run", &cfg]).unwrap_err();
    assert!(e.contains("tiny.toml") && e.contains("colour"), "{e}");
    let p = d.path().join("t.toml");
    std::fs::write(&p, "[env]\nmax_episode_steps = -3\n").unwrap();
    let e = cli(&["run", p.to_str().unwrap()]).unwrap_err();
    assert!(
        e.contains("t.toml") && e.contains("env.max_episode_steps"),
        "{e}"
    );
    let e = cli(&["run", "/nonexistent/x.toml"]).unwrap_err();
    assert!(e.contains("/nonexistent/x.toml"), "{e}");
}

#[test]
fn reads_a_lerobot_written_layout() {
    // Written by tools/make_lerobot_fixture.py with pyarrow/pandas the way LeRobot writes
    // lerobot/pusht: 2-d state as list<float>, extra string column, pandas task index.
    let root = common::repo_file("assets/testdata/lerobot_v3_fixture");
    let ds = read_dataset(&root).unwrap();
    assert_eq!(ds.len(), 7);
    assert_eq!(ds.tasks, vec![diffrl_pusht::TASK.to_string()]);
    assert!(!ds.columns.contains_key("observation.image.path"));
    let eps = ds.episodes("observation.state").unwrap();
    assert_eq!(eps.iter().map(|e| e.len()).collect::<Vec<_>>(), vec![4, 3]);
    assert_eq!(eps[0].observations[0].state.len(), 2);
    assert!(eps[1].truncated && !eps[1].success());
    let out = cli(&["inspect", root.to_str().unwrap()]).unwrap();
    assert!(out.contains("7 frames, 2 episodes"), "{out}");
}

/// Every tabletop task runs from its embedded config through `diffrl sim --expert --json`:
/// the lines carry the poses the arm's users read, episodes stop within ManiSkill's 50
/// steps, and the expert solves the seeded pick-cube episode (its success rate is 100% over
/// 200 seeds, docs/tabletop.md).
#[test]
fn tabletop_tasks_run_from_their_embedded_configs() {
    for task in ["reach-goal", "push-cube", "pick-cube", "stack-cube"] {
        let out = cli(&["sim", task, "--seed", "1", "--expert", "--json"]).unwrap();
        let lines = json_lines(&out);
        assert!(
            lines.len() > 1 && lines.len() <= 51,
            "{task}: {} lines",
            lines.len()
        );
        let last = lines.last().unwrap();
        for key in ["state", "reward", "success", "ee_pose", "goal"] {
            assert!(last.get(key).is_some(), "{task}: {key} missing in {last}");
        }
        assert_eq!(last["ee_pose"].as_array().unwrap().len(), 7, "{task}");
        assert_eq!(
            last.get("cube_pose").is_some(),
            task != "reach-goal",
            "{task}"
        );
        assert_eq!(
            last.get("cube_b_pose").is_some(),
            task == "stack-cube",
            "{task}"
        );
        if task == "pick-cube" {
            assert_eq!(last["success"], true, "{last}");
        }
    }
    let e = cli(&["sim", "pick-cube", "--init-state", "1,2,3", "--expert"]).unwrap_err();
    assert!(e.contains("32"), "{e}");
}

/// highway-merge runs from its embedded config through `diffrl sim --expert --json`: every line
/// carries the agents' poses and their crash and off-road flags, and the expert merges both
/// agents on seed 0 (89% of 500 seeds, docs/driving.md).
#[test]
fn highway_merge_runs_from_its_embedded_config() {
    let out = cli(&["sim", "highway-merge", "--seed", "0", "--expert", "--json"]).unwrap();
    let lines = json_lines(&out);
    assert!(
        lines.len() > 20 && lines.len() <= 101,
        "{} lines",
        lines.len()
    );
    let last = lines.last().unwrap();
    assert_eq!(last["agents"].as_array().unwrap().len(), 8, "{last}");
    assert_eq!(last["crashed"], serde_json::json!([0.0, 0.0]), "{last}");
    assert_eq!(last["success"], true, "{last}");
    let e = cli(&["sim", "highway-merge", "--init-state", "1,2,3", "--expert"]).unwrap_err();
    assert!(e.contains("cannot start from a given state"), "{e}");
}

/// intersection and roundabout run from their embedded configs: `diffrl sim --expert --json`
/// prints the agents' poses each step and the expert brings both agents through; `turns` in a
/// config picks the routes, and a wrong one is refused naming the value and the accepted ones.
#[test]
fn junctions_run_from_their_embedded_configs() {
    let out = cli(&["sim", "intersection", "--seed", "0", "--expert", "--json"]).unwrap();
    let lines = json_lines(&out);
    assert!(
        lines.len() > 10 && lines.len() <= 151,
        "{} lines",
        lines.len()
    );
    let last = lines.last().unwrap();
    assert_eq!(last["agents"].as_array().unwrap().len(), 8, "{last}");
    assert_eq!(last["success"], true, "{last}");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(
        &config,
        "task = \"intersection\"\n[env.junction]\nturns = [\"left\", \"backwards\"]\n",
    )
    .unwrap();
    let e = cli(&["sim", "intersection", "--config", config.to_str().unwrap()]).unwrap_err();
    assert!(e.contains("backwards") && e.contains("straight"), "{e}");
    // The roundabout shares the table; on its seed 2 the expert brings both agents round.
    let out = cli(&["sim", "roundabout", "--seed", "2", "--expert", "--json"]).unwrap();
    let last = json_lines(&out).pop().unwrap();
    assert_eq!(last["agents"].as_array().unwrap().len(), 8, "{last}");
    assert_eq!(last["success"], true, "{last}");
}

/// custom-road drives the road its config gives: the embedded T-junction runs, a scene edited
/// into a config is driven (the agents start where it puts them), and a broken scene is refused
/// at load naming the item, before anything runs.
#[test]
fn custom_road_drives_the_road_of_its_config() {
    let out = cli(&["sim", "custom-road", "--seed", "0", "--expert", "--json"]).unwrap();
    let first = json_lines(&out).remove(0);
    let agents = first["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 8, "{first}");
    let dir = tempfile::tempdir().unwrap();
    let shipped = include_str!("../../configs/custom-road.toml");
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    // One agent, starting 10 m further along its lane.
    let one =
        shipped
            .replace("agents = 2", "agents = 1")
            .replacen("start = 55.0", "start = 65.0", 1);
    let cut = one.find("[[env.road.agents]]\nroute = [\"w-in\"").unwrap();
    let end = one[cut..].find("# Background").unwrap();
    let one = format!("{}{}", &one[..cut], &one[cut + end..]);
    let config = write("one.toml", one);
    let args = [
        "sim",
        "custom-road",
        "--config",
        &config,
        "--seed",
        "0",
        "--expert",
        "--json",
    ];
    let first = json_lines(&cli(&args).unwrap()).remove(0);
    assert_eq!(first["agents"].as_array().unwrap().len(), 4, "{first}");
    // 65 m along s-in (y 100 -> 10) is y = 35, less one control step at 8 m/s at most.
    let y = first["agents"][1].as_f64().unwrap();
    assert!((33.0..=35.0).contains(&y), "agent 0 at y {y}");
    // A route through a lane that does not lead there.
    let bad = write(
        "bad.toml",
        shipped.replacen(
            "route = [\"s-in\", \"s>w\"",
            "route = [\"s-in\", \"w>s\"",
            1,
        ),
    );
    let e = cli(&["sim", "custom-road", "--config", &bad]).unwrap_err();
    assert!(
        e.contains("env.road.agents[0].route") && e.contains("does not lead to"),
        "{e}"
    );
    let bad = write(
        "bad2.toml",
        shipped.replacen("width = 4.0", "width = -1.0", 1),
    );
    let e = cli(&["sim", "custom-road", "--config", &bad]).unwrap_err();
    assert!(
        e.contains("env.road.lanes") && e.contains("\"w-in\""),
        "{e}"
    );
}

/// Writes the highway-merge config `toml` as `dir/name` and records 2 expert episodes with it
/// into `dir/demos`; returns the config's and the dataset's paths.
fn highway_demos(dir: &Path, name: &str, toml: &str) -> (String, String) {
    let cfg = dir.join(name);
    std::fs::write(&cfg, toml).unwrap();
    let (cfg, ds) = (
        cfg.display().to_string(),
        dir.join("demos").display().to_string(),
    );
    cli(&[
        "demos",
        "highway-merge",
        "--config",
        &cfg,
        "--episodes",
        "2",
        "--out",
        &ds,
    ])
    .unwrap();
    (cfg, ds)
}

/// The driving metrics travel from the environment's last step to `diffrl eval`'s output and
/// eval.json: collision and off-road as rates with Wilson intervals, progress, speed, jerk.
#[test]
fn driving_metrics_reach_the_evaluation_report() {
    let d = tempfile::tempdir().unwrap();
    let (cfg, ds) = highway_demos(
        d.path(),
        "hm.toml",
        "task = \"highway-merge\"\n[run]\nthreads = 2\n[env]\nmax_episode_steps = 10\n\
         [policy.denoiser]\nhidden = 16\nblocks = 1\n[policy.diffusion]\ntrain_steps = 10\n\
         denoising_steps = 2\n[pretrain]\nsteps = 4\nbatch_size = 8\nwarmup_steps = 1\n\
         eval_every = 0\ncheckpoint_every = 4\n[eval]\nepisodes = 3\nenvs = 2\n",
    );
    let bc = d.path().join("bc").display().to_string();
    let s = cli(&["pretrain", "--config", &cfg, "--dataset", &ds, "--out", &bc]).unwrap();
    assert!(s.contains("eval: collision"), "{s}");
    let report = d.path().join("eval.json");
    cli(&[
        "eval",
        "--config",
        &cfg,
        "--policy",
        &format!("{bc}/policy"),
        "--episodes",
        "3",
        "--out",
        &report.display().to_string(),
    ])
    .unwrap();
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    for (name, rate) in [
        ("collision", true),
        ("collision_agents", true),
        ("collision_traffic", true),
        ("off_road", true),
        ("progress", false),
        ("speed", false),
        ("jerk", false),
    ] {
        let m = &r["metrics"][name];
        assert_eq!(m["episodes"], 3, "{name}: {m}");
        assert_eq!(m["rate"], rate, "{name}: {m}");
        let (mean, lo, hi) = (
            m["mean"].as_f64().unwrap(),
            m["ci95"][0].as_f64().unwrap(),
            m["ci95"][1].as_f64().unwrap(),
        );
        assert!(lo <= mean && mean <= hi, "{name}: {m}");
    }
    assert!(r["per_episode"][0]["metrics"]["speed"].as_f64().unwrap() > 0.0);
    // One expert episode recorded with `line` added to [env].
    let demos_with = |name: &str, line: &str| {
        let cfg2 = d.path().join(format!("{name}.toml"));
        let text = std::fs::read_to_string(&cfg).unwrap();
        std::fs::write(&cfg2, text.replace("[env]\n", &format!("[env]\n{line}\n"))).unwrap();
        let ds2 = d.path().join(name);
        let (cfg2, ds2) = (cfg2.display().to_string(), ds2.display().to_string());
        cli(&[
            "demos",
            "highway-merge",
            "--config",
            &cfg2,
            "--episodes",
            "1",
            "--out",
            &ds2,
        ])
        .unwrap();
        read_dataset(Path::new(&ds2)).unwrap()
    };
    // Datasets take the layout of the configured scene: 3 agents, 3 observation blocks.
    let data = demos_with("hm3", "agents = 3");
    let eps = data.episodes("observation.state").unwrap();
    assert_eq!(eps[0].observations[0].state.len(), 3 * 53);
    assert_eq!(eps[0].actions[0].len(), 6);
    // With waypoint actions the expert's demos hold where each agent went in a control step:
    // about its speed x 0.2 s ahead (agents drive at 20-30 m/s; dx = 1 is 8 m), little aside.
    let data = demos_with("hmw", "actions = \"waypoints\"");
    let eps = data.episodes("observation.state").unwrap();
    for a in &eps[0].actions {
        assert!(a.len() == 4, "{a:?}");
        for agent in a.chunks(2) {
            assert!((0.4..0.9).contains(&agent[0]), "dx {a:?}");
            assert!(agent[1].abs() < 0.2, "dy {a:?}");
        }
    }
}

/// The joint planner on highway-merge: it trains from demos, its checkpoint records the agents'
/// layout the environment declared, GRPO fine-tunes it through the chain's likelihoods, and an
/// environment with another number of agents is refused with both layouts named.
#[test]
fn joint_planner_trains_fine_tunes_and_keeps_its_agent_layout() {
    let d = tempfile::tempdir().unwrap();
    let text = "task = \"highway-merge\"\n[run]\nthreads = 2\n[env]\nmax_episode_steps = 6\n\
         [policy.denoiser]\nkind = \"joint\"\n[policy.denoiser.planner]\nd_model = 8\n\
         heads = 2\nlayers = 1\nff_dim = 8\n[policy.diffusion]\ntrain_steps = 10\n\
         denoising_steps = 2\n[pretrain]\nsteps = 4\nbatch_size = 8\nwarmup_steps = 1\n\
         eval_every = 0\ncheckpoint_every = 4\n[eval]\nepisodes = 2\nenvs = 2\n\
         [grpo]\niterations = 1\ngroups = 1\ngroup_size = 2\nepochs = 1\nminibatch = 16\n\
         eval_every = 0\n";
    let (cfg, ds) = highway_demos(d.path(), "joint.toml", text);
    let bc = d.path().join("bc").display().to_string();
    cli(&["pretrain", "--config", &cfg, "--dataset", &ds, "--out", &bc]).unwrap();
    let policy = format!("{bc}/policy");
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{policy}/policy.json")).unwrap())
            .unwrap();
    let spec = &meta["spec"];
    assert_eq!(spec["agents"], 2, "{spec}");
    let groups: Vec<(&str, u64, u64, u64)> = spec["entities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["name"].as_str().unwrap(),
                g["offset"].as_u64().unwrap(),
                g["width"].as_u64().unwrap(),
                g["count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(groups, [("lanes", 5, 4, 3), ("neighbours", 17, 6, 6)]);
    let grpo = d.path().join("grpo").display().to_string();
    let s = cli(&[
        "grpo", "--config", &cfg, "--policy", &policy, "--out", &grpo,
    ])
    .unwrap();
    assert!(s.contains("grpo: 1 iterations in"), "{s}");
    let cfg3 = d.path().join("joint3.toml");
    std::fs::write(&cfg3, text.replace("[env]\n", "[env]\nagents = 3\n")).unwrap();
    let e = cli(&[
        "eval",
        "--config",
        &cfg3.display().to_string(),
        "--policy",
        &policy,
        "--episodes",
        "1",
    ])
    .unwrap_err();
    assert!(
        e.contains("built for 2 agents") && e.contains("gives 3 agents"),
        "{e}"
    );
}

/// highway-merge with the bird's-eye raster: demos record each step's raster as the camera
/// frame, a policy trains on raster + vectors and drives in the simulator, and its checkpoint
/// records the image geometry.
#[test]
fn raster_demos_train_a_policy_that_sees_the_road() {
    let d = tempfile::tempdir().unwrap();
    let (cfg, ds) = highway_demos(
        d.path(),
        "raster.toml",
        "task = \"highway-merge\"\n[run]\nthreads = 2\n[env]\nraster = 16\nraster_m = 80.0\n\
         max_episode_steps = 6\n[policy.encoder.image]\nchannels = [4]\ngroups = 2\nkeypoints = 4\n\
         out_dim = 8\n[policy.denoiser]\nhidden = 16\nblocks = 1\n[policy.diffusion]\n\
         train_steps = 10\ndenoising_steps = 2\n[pretrain]\nsteps = 4\nbatch_size = 8\n\
         warmup_steps = 1\neval_every = 0\ncheckpoint_every = 4\n[eval]\nepisodes = 2\nenvs = 2\n",
    );
    let data = read_dataset(Path::new(&ds)).unwrap();
    let frames = data.images.as_ref().expect("rasters in the dataset");
    assert_eq!(frames.len(), data.len());
    assert_eq!((frames[0].height, frames[0].width), (16, 16));
    // Every frame shows road (red) and at least one agent (green).
    assert!(frames.iter().all(|f| f.data.chunks(3).any(|p| p[0] == 255)
        && f.data.chunks(3).any(|p| p[1] == 255)));
    let bc = d.path().join("bc").display().to_string();
    let s = cli(&["pretrain", "--config", &cfg, "--dataset", &ds, "--out", &bc]).unwrap();
    assert!(s.contains("eval: success"), "{s}");
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{bc}/policy/policy.json")).unwrap())
            .unwrap();
    assert_eq!(
        meta["spec"]["image"],
        serde_json::json!([3, 16, 16]),
        "{}",
        meta["spec"]
    );
}

#[test]
fn pixel_demos_record_camera_frames_that_a_pixel_policy_trains_on() {
    let d = tempfile::tempdir().unwrap();
    let cfg = d.path().join("px.toml");
    std::fs::write(
        &cfg,
        "task = \"pick-cube\"\n[run]\nthreads = 2\n[env]\nobs = \"pixels\"\nimage_size = 16\n\
         max_episode_steps = 12\n[policy.encoder.image]\nchannels = [4]\ngroups = 2\nkeypoints = 4\n\
         out_dim = 8\n[policy.denoiser]\nhidden = 16\nblocks = 1\n[policy.diffusion]\n\
         train_steps = 10\ndenoising_steps = 2\n[pretrain]\nsteps = 4\nbatch_size = 8\n\
         warmup_steps = 1\neval_every = 0\ncheckpoint_every = 4\n[eval]\nepisodes = 2\nenvs = 2\n",
    )
    .unwrap();
    let cfg = cfg.display().to_string();
    let ds = d.path().join("demos");
    let dss = ds.display().to_string();
    cli(&[
        "demos",
        "pick-cube",
        "--config",
        &cfg,
        "--episodes",
        "2",
        "--out",
        &dss,
    ])
    .unwrap();
    let data = read_dataset(&ds).unwrap();
    let frames = data.images.as_ref().expect("camera frames in the dataset");
    assert_eq!(frames.len(), data.len());
    assert_eq!((frames[0].height, frames[0].width), (16, 16));
    // Each frame is what the camera saw at that frame's state (not the next one's).
    let states = data.column("observation.state").unwrap();
    for i in [0, 1, data.len() - 1] {
        let drawn = diffrl_tabletop::task::TabletopTask::PICK_CUBE
            .render_state(states.row(i), 16)
            .unwrap();
        assert!(
            drawn == frames[i].data,
            "frame {i} is not its state's image"
        );
    }
    // BC from the frames, then evaluation of the pixel policy in the simulator.
    let out = d.path().join("bc").display().to_string();
    let s = cli(&[
        "pretrain",
        "--config",
        &cfg,
        "--dataset",
        &dss,
        "--out",
        &out,
    ])
    .unwrap();
    assert!(s.contains("eval: success"), "{s}");
    // A state policy on the same dataset ignores the frames; a pixels config without frames
    // in its dataset is refused with the reason.
    let state_cfg = d.path().join("state.toml");
    std::fs::write(
        &state_cfg,
        std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("obs = \"pixels\"", "obs = \"state\""),
    )
    .unwrap();
    let state_cfg = state_cfg.display().to_string();
    let out2 = d.path().join("bc_state").display().to_string();
    cli(&[
        "pretrain",
        "--config",
        &state_cfg,
        "--dataset",
        &dss,
        "--out",
        &out2,
    ])
    .unwrap();
    let sds = d.path().join("state_demos").display().to_string();
    cli(&[
        "demos",
        "pick-cube",
        "--config",
        &state_cfg,
        "--episodes",
        "1",
        "--out",
        &sds,
    ])
    .unwrap();
    let e = cli(&[
        "pretrain",
        "--config",
        &cfg,
        "--dataset",
        &sds,
        "--out",
        &d.path().join("x").display().to_string(),
    ])
    .unwrap_err();
    assert!(e.contains("no camera frames"), "{e}");
}

/// `diffrl sim drive kinematics|idm` (the highway-env checks of docs/driving.md): one JSON
/// line per step or case, start included, and clear errors for bad input.
#[test]
fn sim_drive_prints_the_vehicle_models_and_names_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let actions = dir.path().join("actions.json");
    std::fs::write(&actions, "[[0.1, 1.0], [0.0, -2.0]]").unwrap();
    let a = actions.to_str().unwrap();
    let out = cli(&[
        "sim",
        "drive",
        "kinematics",
        "--state=-1,2,0.5,10",
        "--actions",
        a,
        "--dt",
        "0.1",
        "--json",
    ])
    .unwrap();
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["step"], 0);
    assert_eq!(lines[0]["state"], serde_json::json!([-1.0, 2.0, 0.5, 10.0]));
    let s = lines[1]["state"].as_array().unwrap();
    assert!((s[3].as_f64().unwrap() - 10.1).abs() < 1e-12, "{s:?}");
    assert!(
        s[2].as_f64().unwrap() > 0.5,
        "steering left turns left: {s:?}"
    );
    let cases = dir.path().join("cases.json");
    std::fs::write(
        &cases,
        r#"[{"speed": 0, "target_speed": 20, "front_speed": null, "gap": null},
            {"speed": 20, "target_speed": 20, "front_speed": 20, "gap": 10}]"#,
    )
    .unwrap();
    let c = cases.to_str().unwrap();
    let out = json_lines(&cli(&["sim", "drive", "idm", "--cases", c, "--json"]).unwrap());
    assert_eq!(out[0]["acceleration"], 3.0);
    assert!(out[1]["acceleration"].as_f64().unwrap() < -3.0, "{out:?}");
    // Bad input: named, never a panic.
    std::fs::write(&actions, "[[0.1, 1.0], [0.0]]").unwrap();
    let e = cli(&[
        "sim",
        "drive",
        "kinematics",
        "--state",
        "0,0,0,1",
        "--actions",
        a,
        "--dt",
        "0.1",
        "--json",
    ])
    .unwrap_err();
    assert!(e.contains("action 1 has 1 values"), "{e}");
    let e = cli(&[
        "sim",
        "drive",
        "kinematics",
        "--state",
        "0,0,0",
        "--actions",
        a,
        "--dt",
        "0.1",
        "--json",
    ])
    .unwrap_err();
    assert!(e.contains("--state takes 4 values"), "{e}");
    std::fs::write(
        &cases,
        r#"[{"speed": 1, "target_speed": 2, "front_speed": 3, "gap": null}]"#,
    )
    .unwrap();
    let e = cli(&["sim", "drive", "idm", "--cases", c, "--json"]).unwrap_err();
    assert!(e.contains("case 0: leader"), "{e}");
    let e = cli(&["sim", "drive", "--json"]).unwrap_err();
    assert!(e.contains("needs a model"), "{e}");
    let e = cli(&["sim", "pusht", "kinematics", "--seed", "0", "--expert"]).unwrap_err();
    assert!(e.contains("only `diffrl sim drive` takes a model"), "{e}");
}
