//! `lang-cubes` through the CLI: datasets record each episode's own instruction, `sim --json`
//! shows it, and an unknown `[env] instruction` is refused with the valid ones.

mod common;

use common::diffrl;
use diffrl_core::Env;
use diffrl_core::lerobot::read_dataset;
use diffrl_core::seeding::derive;
use diffrl_core::task::Task;
use diffrl_tabletop::lang_cubes::{LangCubesConfig, LangCubesTask, STATE_DIM};

/// A root seed whose first two episodes draw different instructions.
const SEED: u64 = 0;

#[test]
fn demos_record_each_episodes_own_instruction() {
    let mut env = LangCubesTask.build(&LangCubesConfig::default());
    let want: Vec<String> = (0..2)
        .map(|i| env.reset(derive(SEED, i)).text.unwrap())
        .collect();
    assert_ne!(want[0], want[1], "pick a SEED whose episodes differ");
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("demos");
    let out_s = out.display().to_string();
    let seed = SEED.to_string();
    diffrl(&[
        "demos",
        "lang-cubes",
        "--episodes",
        "2",
        "--seed",
        &seed,
        "--threads",
        "1",
        "--out",
        &out_s,
    ])
    .unwrap();
    let ds = read_dataset(&out).unwrap();
    let eps = ds.episodes("observation.state").unwrap();
    let got: Vec<String> = eps.iter().map(|e| e.task.clone().unwrap()).collect();
    assert_eq!(got, want);
    assert_eq!(ds.tasks.len(), 2);
    // The recorded state holds the instruction: restoring it gives the episode's text back.
    for (ep, text) in eps.iter().zip(&want) {
        let s: Vec<f64> = ep.observations[0]
            .state
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        assert_eq!(s.len(), STATE_DIM);
        let obs = diffrl_core::task::TaskEnv::reset_to_state(&mut env, &s, 0).unwrap();
        assert_eq!(obs.text.as_ref(), Some(text));
    }
}

#[test]
fn sim_json_shows_the_instruction_on_every_line() {
    let out = diffrl(&["sim", "lang-cubes", "--seed", "3", "--expert", "--json"]).unwrap();
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut env = LangCubesTask.build(&LangCubesConfig::default());
    let text = env.reset(3).text.unwrap();
    assert!(lines.len() > 1);
    for l in &lines {
        assert_eq!(l["instruction"], serde_json::json!(text), "{l}");
    }
    assert_eq!(lines.last().unwrap()["success"], true);
}

#[test]
fn an_unknown_instruction_is_refused_with_the_valid_ones() {
    let d = tempfile::tempdir().unwrap();
    let config = d.path().join("bad.toml");
    std::fs::write(
        &config,
        "task = \"lang-cubes\"\n[env]\ninstruction = \"pick purple\"\n",
    )
    .unwrap();
    let err = diffrl(&[
        "sim",
        "lang-cubes",
        "--seed",
        "0",
        "--expert",
        "--config",
        &config.display().to_string(),
    ])
    .unwrap_err();
    for want in [
        "env.instruction",
        "\"pick purple\"",
        "\"stack red on green\"",
    ] {
        assert!(err.contains(want), "{want} not in: {err}");
    }
}
