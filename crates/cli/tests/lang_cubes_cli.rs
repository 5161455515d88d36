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

/// A policy trained on one demonstration still reads every instruction of the suite: its
/// vocabulary holds the words of all paraphrases, so evaluating it on another family (whose
/// words the demo never said) runs instead of failing on an unknown word, as `diffrl run
/// configs/vla.toml --quick` did.
#[test]
fn a_policy_from_few_demos_reads_every_instruction_of_the_suite() {
    let d = tempfile::tempdir().unwrap();
    let path = |n: &str| d.path().join(n).display().to_string();
    let config = |instruction: &str| {
        format!(
            "task = \"lang-cubes\"\n[run]\nname = \"t\"\nruns_dir = \"{}\"\nthreads = 1\n\
             [env]\nmax_episode_steps = 8\ninstruction = \"{instruction}\"\n\
             [policy]\npred_horizon = 4\naction_horizon = 2\n\
             [policy.denoiser]\nhidden = 16\nblocks = 1\n\
             [policy.diffusion]\ntrain_steps = 8\ndenoising_steps = 2\n\
             [pretrain]\nsteps = 2\nbatch_size = 8\nwarmup_steps = 1\neval_every = 0\n\
             [eval]\nepisodes = 2\nenvs = 2\n",
            path("runs")
        )
    };
    std::fs::write(path("train.toml"), config("pick red")).unwrap();
    std::fs::write(path("other.toml"), config("put green right of blue")).unwrap();
    let common = ["--config", &path("train.toml")];
    record_demos(&path("train.toml"), "1", &path("demos"));
    diffrl(
        &[
            &[
                "pretrain",
                "--dataset",
                &path("demos"),
                "--out",
                &path("bc"),
            ],
            &["--eval-episodes", "0"][..],
            &common[..],
        ]
        .concat(),
    )
    .unwrap();
    let vocab: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(d.path().join("bc/policy/vocab.json")).unwrap(),
    )
    .unwrap();
    let tokens: Vec<&str> = vocab["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_knows_the_suite(&tokens);
    let report = diffrl(&[
        "eval",
        "--policy",
        &path("bc/policy"),
        "--config",
        &path("other.toml"),
        "--episodes",
        "2",
    ])
    .unwrap();
    assert!(report.contains("/2; Wilson"), "{report}");
}

/// `[reward.progress] text = true`: the progress model reads the instruction, and knows the
/// words of every instruction of the suite, not only those of its few demonstrations.
#[test]
fn a_progress_model_that_reads_the_instruction_knows_the_whole_suite() {
    let d = tempfile::tempdir().unwrap();
    let path = |n: &str| d.path().join(n).display().to_string();
    std::fs::write(
        path("c.toml"),
        "task = \"lang-cubes\"\n[env]\nmax_episode_steps = 40\n\
         [reward.progress]\ntext = true\nsteps = 20\nbatch_size = 16\nhidden = [16]\nholdout_every = 0\n",
    )
    .unwrap();
    let common = ["--config", &path("c.toml")];
    record_demos(&path("c.toml"), "2", &path("demos"));
    diffrl(
        &[
            &[
                "reward",
                "train",
                "--dataset",
                &path("demos"),
                "--out",
                &path("rm"),
            ],
            &common[..],
        ]
        .concat(),
    )
    .unwrap();
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.path().join("rm/reward.json")).unwrap())
            .unwrap();
    let tokens: Vec<&str> = meta["text"]["vocab"]["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("no text.vocab.tokens in {meta}"))
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_knows_the_suite(&tokens);
}

/// Every word of every instruction of the suite is in `tokens`.
fn assert_knows_the_suite(tokens: &[&str]) {
    for text in LangCubesTask.texts(&LangCubesConfig::default()) {
        for w in text.split_whitespace() {
            assert!(tokens.contains(&w), "{w:?} of {text:?} not in {tokens:?}");
        }
    }
}

/// `diffrl demos lang-cubes` with `config`: `episodes` demonstrations into `out`.
fn record_demos(config: &str, episodes: &str, out: &str) {
    diffrl(&[
        "demos",
        "lang-cubes",
        "--config",
        config,
        "--episodes",
        episodes,
        "--out",
        out,
    ])
    .unwrap();
}

/// `[policy.encoder] aux_weight`: a pixel policy of lang-cubes trains with the cubes' nine
/// coordinates and the instruction's ten goal values as its auxiliary target (its checkpoint
/// records their count); a task that names no privileged values refuses the setting with the
/// reason.
#[test]
fn an_auxiliary_target_trains_from_the_cubes_and_is_refused_where_a_task_has_none() {
    let d = tempfile::tempdir().unwrap();
    let path = |n: &str| d.path().join(n).display().to_string();
    std::fs::write(
        path("c.toml"),
        "task = \"lang-cubes\"\n[env]\nobs = \"pixels\"\nimage_size = 16\nmax_episode_steps = 6\n\
         [policy]\npred_horizon = 4\naction_horizon = 2\n\
         [policy.encoder]\naux_weight = 1.0\n[policy.encoder.image]\nkind = \"patches\"\n\
         [policy.denoiser]\nhidden = 16\nblocks = 1\n\
         [policy.diffusion]\ntrain_steps = 8\ndenoising_steps = 2\n\
         [pretrain]\nsteps = 2\nbatch_size = 4\nwarmup_steps = 1\neval_every = 0\n",
    )
    .unwrap();
    record_demos(&path("c.toml"), "1", &path("demos"));
    let pretrain = |config: &str, demos: &str, out: &str| {
        diffrl(&[
            "pretrain",
            "--config",
            config,
            "--dataset",
            demos,
            "--out",
            out,
            "--eval-episodes",
            "0",
        ])
    };
    pretrain(&path("c.toml"), &path("demos"), &path("bc")).unwrap();
    let meta: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(d.path().join("bc/policy/policy.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(meta["spec"]["aux"], 9 + 10, "{meta}");
    assert_eq!(meta["config"]["encoder"]["aux_weight"], 1.0, "{meta}");
    // Push-T's pixels come with no privileged values.
    std::fs::write(
        path("p.toml"),
        "task = \"pusht\"\n[env]\nobs = \"pixels\"\nmax_episode_steps = 5\n\
         [policy.encoder]\naux_weight = 0.5\n",
    )
    .unwrap();
    diffrl(&[
        "demos",
        "pusht",
        "--config",
        &path("p.toml"),
        "--episodes",
        "1",
        "--out",
        &path("pdemos"),
    ])
    .unwrap();
    let err = pretrain(&path("p.toml"), &path("pdemos"), &path("pbc")).unwrap_err();
    assert!(
        err.contains("aux_weight = 0.5") && err.contains("names no privileged values"),
        "{err}"
    );
}
