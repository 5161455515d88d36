//! `lang-cubes`: seeded resets and exact snapshots with the instruction, text in every
//! observation, which instructions each set draws, the success criteria on states built with
//! `reset_to_state`, recorded states, config errors and the left/right convention.

use diffrl_core::config::{Validate, from_toml_str};
use diffrl_core::stages::StagePredicates;
use diffrl_core::task::Task;
use diffrl_core::{Env, Observation};
use diffrl_tabletop::env::{ObsMode, layout};
use diffrl_tabletop::expert::ExpertConfig;
use diffrl_tabletop::lang_cubes::{
    INSTRUCTION_INDEX, LangCubes, LangCubesConfig, LangCubesTask, LangStages, OBSERVED_STATE_DIM,
    PARAPHRASE_INDEX, STATE_DIM,
};
use diffrl_tabletop::language::{
    Color, GOAL_DIM, HELD_OUT, INSTRUCTIONS, Instruction, InstructionSet, PARAPHRASES, Side,
};
use diffrl_tabletop::world::CUBE_HALF;

fn env_with(config: LangCubesConfig) -> LangCubes {
    LangCubesTask.build(&config)
}

fn fixed(instruction: &str) -> LangCubes {
    env_with(LangCubesConfig {
        instruction: instruction.into(),
        ..LangCubesConfig::default()
    })
}

/// Steps the expert `n` times (or to the episode's end); the observations it saw after each.
fn run_expert(env: &mut LangCubes, n: usize) -> Vec<Observation> {
    let mut expert = LangCubesTask.expert(&ExpertConfig::default(), 0).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let a = expert.act(env);
        let r = env.step(&a).unwrap();
        out.push(r.obs);
        if r.terminated || r.truncated {
            break;
        }
    }
    out
}

/// A state at `env`'s current arm with the cubes at `cubes` (yaw 0) and `instruction`.
fn state_with(env: &LangCubes, cubes: [[f64; 3]; 3], instruction: Instruction) -> Vec<f64> {
    let mut s = env.true_state();
    for (i, c) in cubes.iter().enumerate() {
        let o = layout::CUBES + 7 * i;
        s[o..o + 3].copy_from_slice(c);
        s[o + 3..o + 7].copy_from_slice(&[0.0, 0.0, 0.0, 1.0]);
    }
    s[INSTRUCTION_INDEX] = instruction.index() as f64;
    s[PARAPHRASE_INDEX] = 1.0;
    // No velocities: cubes start at rest, the arm too.
    s[layout::QD..layout::TCP].fill(0.0);
    s
}

#[test]
fn seeded_resets_and_snapshots_repeat_exactly_with_the_instruction() {
    let config = LangCubesConfig {
        instructions: InstructionSet::All,
        ..LangCubesConfig::default()
    };
    let (mut a, mut b) = (env_with(config.clone()), env_with(config));
    assert_eq!(a.reset(7), b.reset(7));
    assert_eq!(run_expert(&mut a, 5), run_expert(&mut b, 5));
    assert_eq!(a.true_state(), b.true_state());

    let snapshot = a.snapshot();
    let (text, state) = (a.text(), a.true_state());
    let rest = run_expert(&mut a, 10);
    // Another episode with another instruction in between, then back.
    let other = (0..50)
        .find(|&s| {
            a.reset(s);
            a.instruction() != Instruction::parse("pick red").unwrap() && a.text() != text
        })
        .unwrap();
    assert_ne!(a.text(), text, "seed {other}");
    let obs = a.restore(&snapshot);
    assert_eq!(obs.text.as_ref(), Some(&text));
    assert_eq!(a.true_state(), state);
    assert_eq!(run_expert(&mut a, 10), rest);
    // Restored in another environment too.
    let mut c = env_with(LangCubesConfig::default());
    c.restore(&snapshot);
    assert_eq!(run_expert(&mut c, 10), rest);
}

#[test]
fn every_observation_carries_the_text() {
    for obs_mode in [ObsMode::State, ObsMode::Pixels] {
        let mut env = env_with(LangCubesConfig {
            obs: obs_mode,
            image_size: 16,
            ..LangCubesConfig::default()
        });
        let space = env.observation_space();
        assert!(space.text);
        let want_dim = if obs_mode == ObsMode::State {
            OBSERVED_STATE_DIM
        } else {
            13
        };
        assert_eq!(space.state.unwrap().dim(), want_dim);
        let first = env.reset(3);
        let text = env.text();
        assert_eq!(first.text.as_ref(), Some(&text));
        assert_eq!(first.state.len(), want_dim);
        assert_eq!(first.image.is_some(), obs_mode == ObsMode::Pixels);
        for obs in run_expert(&mut env, 80) {
            assert_eq!(obs.text.as_ref(), Some(&text));
        }
        assert_eq!(env.observe().text.as_ref(), Some(&text));
        let s = env.true_state();
        assert_eq!(env.reset_to_state(&s, 0).unwrap().text, Some(text));
    }
}

#[test]
fn each_set_draws_only_its_instructions() {
    let draws = |set: InstructionSet, seeds: std::ops::Range<u64>| {
        let mut env = env_with(LangCubesConfig {
            instructions: set,
            ..LangCubesConfig::default()
        });
        let mut seen = std::collections::HashSet::new();
        let mut paraphrases = std::collections::HashSet::new();
        for seed in seeds {
            env.reset(seed);
            seen.insert(env.instruction());
            paraphrases.insert(env.paraphrase());
        }
        (seen, paraphrases)
    };
    let (train, paraphrases) = draws(InstructionSet::Train, 0..300);
    assert!(train.iter().all(|i| !i.is_held_out()));
    assert_eq!(train.len(), 18);
    assert_eq!(paraphrases.len(), PARAPHRASES);
    let (held_out, _) = draws(InstructionSet::HeldOut, 0..60);
    assert_eq!(held_out, HELD_OUT.into_iter().collect());
    let (all, _) = draws(InstructionSet::All, 0..400);
    assert_eq!(all.len(), INSTRUCTIONS.len());
    // A fixed instruction wins over the set, held-out or not.
    let mut env = fixed("stack blue on red");
    for seed in 0..5 {
        env.reset(seed);
        assert_eq!(env.instruction(), HELD_OUT[1]);
    }
}

/// The language ablation: with `shuffle_text` the observations tell an instruction drawn
/// independently of the scored one (which is unchanged, as are the scene and the physics),
/// and snapshots keep what was told.
#[test]
fn shuffled_text_tells_another_instruction_and_scores_the_real_one() {
    let mut plain = fixed("stack red on green");
    let mut shuffled = env_with(LangCubesConfig {
        instruction: "stack red on green".into(),
        shuffle_text: true,
        ..LangCubesConfig::default()
    });
    let mut told = std::collections::HashSet::new();
    for seed in 0..200 {
        let (a, b) = (plain.reset(seed), shuffled.reset(seed));
        assert_eq!(a.state, b.state, "seed {seed}: same scene");
        assert_eq!(plain.instruction(), shuffled.instruction());
        assert_eq!(a.text, Some(plain.text()));
        told.insert(b.text.clone().unwrap());
    }
    // Paraphrases of training instructions only, many of them, and the same at every step.
    assert!(told.len() > 40, "{} distinct texts", told.len());
    let texts: std::collections::HashSet<String> = INSTRUCTIONS
        .iter()
        .filter(|i| !i.is_held_out())
        .flat_map(|i| (0..PARAPHRASES).map(|p| i.text(p)))
        .collect();
    assert!(told.is_subset(&texts));
    let first = shuffled.reset(7).text;
    let snap = shuffled.snapshot();
    let obs = run_expert(&mut shuffled, 5);
    assert!(obs.iter().all(|o| o.text == first));
    assert_eq!(shuffled.restore(&snap).text, first);
}

/// The oracle ablation: with `goal_in_state` the observed state ends with the told
/// instruction's one-hot form, the same from a live episode and from its recorded state, and
/// every instruction gets a different one.
#[test]
fn goal_in_state_appends_the_told_instructions_one_hot() {
    let config = LangCubesConfig {
        instructions: InstructionSet::All,
        goal_in_state: true,
        ..LangCubesConfig::default()
    };
    let mut env = env_with(config.clone());
    let mut plain = env_with(LangCubesConfig {
        goal_in_state: false,
        ..config.clone()
    });
    for seed in 0..30 {
        let (o, p) = (env.reset(seed), plain.reset(seed));
        assert_eq!(o.state.len(), OBSERVED_STATE_DIM + GOAL_DIM);
        assert_eq!(o.state[..OBSERVED_STATE_DIM], p.state[..]);
        assert_eq!(o.state[OBSERVED_STATE_DIM..], env.instruction().one_hot());
        let recorded: Vec<f32> = env.true_state().iter().map(|&v| v as f32).collect();
        assert_eq!(
            LangCubesTask.observe_recorded(&config, &recorded).unwrap(),
            o.state
        );
        assert_eq!(env.anchor_cells().unwrap().len(), o.state.len());
        let names = &env.observation_space().state.unwrap().names;
        assert_eq!(names.len(), o.state.len());
        assert_eq!(names[OBSERVED_STATE_DIM], "goal_pick");
        let goal = &o.state[OBSERVED_STATE_DIM..];
        assert_eq!(Instruction::from_one_hot(goal), Some(env.instruction()));
    }
    let forms: std::collections::HashSet<Vec<u32>> = INSTRUCTIONS
        .iter()
        .map(|i| i.one_hot().iter().map(|v| v.to_bits()).collect())
        .collect();
    assert_eq!(forms.len(), INSTRUCTIONS.len());
    // Under shuffle_text the one-hot follows the told instruction, like the text.
    let mut shuffled = env_with(LangCubesConfig {
        instruction: "pick red".into(),
        shuffle_text: true,
        ..config
    });
    let told: std::collections::HashSet<Vec<u32>> = (0..50)
        .map(|seed| {
            let o = shuffled.reset(seed);
            o.state[OBSERVED_STATE_DIM..]
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect();
    assert!(told.len() > 5, "{} distinct told goals", told.len());
}

/// `joint_velocities = false` leaves exactly the nine joint velocities out of state
/// observations, live and recorded alike.
#[test]
fn joint_velocities_can_be_left_out() {
    let config = LangCubesConfig {
        joint_velocities: false,
        ..LangCubesConfig::default()
    };
    let (mut env, mut full) = (env_with(config.clone()), fixed(""));
    let o = env.reset(3);
    let f = full.reset(3);
    let mut expected = f.state[..layout::QD].to_vec();
    expected.extend(&f.state[layout::TCP..]);
    assert_eq!(o.state, expected);
    let names = env.observation_space().state.unwrap().names;
    assert_eq!(names.len(), o.state.len());
    assert!(!names.iter().any(|n| n.starts_with("qd_")), "{names:?}");
    let recorded: Vec<f32> = env.true_state().iter().map(|&v| v as f32).collect();
    assert_eq!(
        LangCubesTask.observe_recorded(&config, &recorded).unwrap(),
        o.state
    );
    assert_eq!(env.anchor_cells().unwrap().len(), o.state.len());
}

#[test]
fn resets_keep_cubes_apart_and_never_start_solved() {
    let mut env = env_with(LangCubesConfig {
        instructions: InstructionSet::All,
        ..LangCubesConfig::default()
    });
    for seed in 0..100 {
        env.reset(seed);
        let f = env.facts();
        for i in 0..3 {
            assert!((f.cubes[i].position[2] - CUBE_HALF).abs() < 1e-3);
            for j in i + 1..3 {
                let (a, b) = (f.cubes[i].position, f.cubes[j].position);
                assert!((a[0] - b[0]).hypot(a[1] - b[1]) > 0.1, "seed {seed}");
            }
        }
        assert!(!env.is_success(), "seed {seed}: {}", env.text());
    }
}

#[test]
fn success_per_family_on_constructed_states() {
    let (red, green, blue) = (
        [0.0, -0.1, CUBE_HALF],
        [0.0, 0.0, CUBE_HALF],
        [0.1, 0.15, CUBE_HALF],
    );
    let mut env = fixed("pick red");
    let case = |env: &mut LangCubes, cubes: [[f64; 3]; 3], instruction: &str| {
        let i = Instruction::parse(instruction).unwrap();
        let s = state_with(env, cubes, i);
        env.reset_to_state(&s, 0).unwrap();
        assert_eq!(env.instruction(), i);
        env.is_success()
    };
    // Stack: red resting on green (StackCube-v1's test), not the other way round.
    let on_green = [0.003, 0.0, 3.0 * CUBE_HALF];
    assert!(case(
        &mut env,
        [on_green, green, blue],
        "stack red on green"
    ));
    assert!(!case(
        &mut env,
        [on_green, green, blue],
        "stack green on red"
    ));
    assert!(!case(
        &mut env,
        [on_green, green, blue],
        "stack red on blue"
    ));
    assert!(!case(&mut env, [red, green, blue], "stack red on green"));
    // Left of green is world -y as the camera sees it: red is 10 cm to green's left.
    assert!(case(&mut env, [red, green, blue], "put red left of green"));
    assert!(!case(
        &mut env,
        [red, green, blue],
        "put red right of green"
    ));
    assert!(case(&mut env, [red, green, blue], "put green right of red"));
    let too_far = [0.0, -0.15, CUBE_HALF];
    assert!(!case(
        &mut env,
        [too_far, green, blue],
        "put red left of green"
    ));
    let off_axis = [0.05, -0.1, CUBE_HALF];
    assert!(!case(
        &mut env,
        [off_axis, green, blue],
        "put red left of green"
    ));
    // Pick: a cube in the air but not held is not picked.
    let floating = [0.0, -0.1, CUBE_HALF + 0.08];
    assert!(!case(&mut env, [floating, green, blue], "pick red"));

    // Pick, done by the expert: red held 5 cm up, the others still down.
    env.reset(0);
    let last = run_expert(&mut env, 80);
    assert!(env.is_success(), "{} steps", last.len());
    let f = env.facts();
    assert!(f.cubes[0].grasped && f.cubes[0].position[2] >= CUBE_HALF + 0.05);
    assert!(f.cubes[1].on_table() && f.cubes[2].on_table());
    assert_eq!(env.score(), 1.0);
}

#[test]
fn left_is_left_in_the_front_camera() {
    let camera = diffrl_tabletop::pixels::default_camera(64).unwrap();
    let u = |y: f32| camera.project([0.0, y, 0.02]).unwrap().0[0];
    let left = u(Side::Left.sign() as f32 * 0.1);
    let right = u(Side::Right.sign() as f32 * 0.1);
    assert!(left < u(0.0) && u(0.0) < right, "{left} {right}");
}

#[test]
fn recorded_states_keep_the_instruction_and_observations_drop_it() {
    let mut env = fixed("put blue right of red");
    env.reset(5);
    run_expert(&mut env, 12);
    let recorded: Vec<f32> = env.true_state().iter().map(|&v| v as f32).collect();
    assert_eq!(recorded.len(), STATE_DIM);
    let config = LangCubesConfig::default();
    let seen = LangCubesTask.observe_recorded(&config, &recorded).unwrap();
    assert_eq!(seen, env.observe().state);
    assert_eq!(seen, recorded[..OBSERVED_STATE_DIM].to_vec());
    let err = LangCubesTask
        .observe_recorded(&config, &recorded[..40])
        .unwrap_err();
    assert!(err.contains("45"), "{err}");
    // The privileged values (behaviour cloning's auxiliary target) are the cubes' centres and
    // the instruction's goal.
    let privileged = LangCubesTask
        .privileged_recorded(&config, &recorded)
        .unwrap();
    let centre = |k: usize| recorded[layout::CUBES + 7 * k..layout::CUBES + 7 * k + 3].to_vec();
    let goal = Instruction::parse("put blue right of red")
        .unwrap()
        .one_hot();
    assert_eq!(
        privileged,
        [centre(0), centre(1), centre(2), goal.to_vec()].concat()
    );
    assert!(
        LangCubesTask
            .privileged_recorded(&config, &recorded[..40])
            .is_err()
    );
    // Another environment, drawing from the held-out set, takes the instruction from the state.
    let mut other = env_with(LangCubesConfig {
        instructions: InstructionSet::HeldOut,
        ..LangCubesConfig::default()
    });
    let state: Vec<f64> = recorded.iter().map(|&v| f64::from(v)).collect();
    other.reset_to_state(&state, 0).unwrap();
    assert_eq!(
        (other.instruction(), other.text()),
        (env.instruction(), env.text())
    );
    // Bad indices and overlapping cubes are refused and change nothing.
    let before = other.true_state();
    let mut bad = state.clone();
    bad[INSTRUCTION_INDEX] = 21.0;
    let e = other.reset_to_state(&bad, 0).unwrap_err().to_string();
    assert!(e.contains("instruction_index"), "{e}");
    let mut overlap = state.clone();
    overlap[layout::CUBES..layout::CUBES + 3]
        .copy_from_slice(&state[layout::CUBES + 7..layout::CUBES + 10]);
    // 1 cm off green's centre (with the centres exactly together parry finds no contact).
    overlap[layout::CUBES] += 0.01;
    let e = other.reset_to_state(&overlap, 0).unwrap_err().to_string();
    assert!(e.contains("red cube overlaps the green cube"), "{e}");
    assert_eq!(other.true_state(), before);
    // The recorded state draws; images are the cubes in their colours.
    let rgb = LangCubesTask.render_state(&recorded, 32).unwrap();
    assert_eq!(rgb.len(), 32 * 32 * 3);
}

#[test]
fn stages_follow_the_named_cube() {
    let stages = LangStages::default();
    assert_eq!(stages.names().len(), 4);
    let mut env = fixed("stack green on blue");
    env.reset(2);
    let mut best = 0;
    let mut expert = LangCubesTask.expert(&ExpertConfig::default(), 0).unwrap();
    for _ in 0..80 {
        let a = expert.act(&env);
        let r = env.step(&a).unwrap();
        let s: Vec<f32> = env.true_state().iter().map(|&v| v as f32).collect();
        best = best.max(stages.completed(&s));
        if r.terminated || r.truncated {
            assert!(r.info.success);
            break;
        }
    }
    assert_eq!(best, 4);
    // An observation without the instruction never completes "place".
    let s: Vec<f32> = env.true_state()[..OBSERVED_STATE_DIM]
        .iter()
        .map(|&v| v as f32)
        .collect();
    assert!(stages.completed(&s) < 4);
    // Observations that end with the goal (goal_in_state) complete it, with or without the
    // joint velocities (the task's predicates for that config).
    for joint_velocities in [true, false] {
        let config = LangCubesConfig {
            instruction: "stack green on blue".into(),
            goal_in_state: true,
            joint_velocities,
            ..LangCubesConfig::default()
        };
        let recorded: Vec<f32> = env.true_state().iter().map(|&v| v as f32).collect();
        let observed = LangCubesTask.observe_recorded(&config, &recorded).unwrap();
        let predicates = LangCubesTask.stages(&config).unwrap();
        assert_eq!(predicates.completed(&observed), 4, "{joint_velocities}");
    }
}

#[test]
fn an_unknown_instruction_is_a_config_error_naming_it() {
    let config = LangCubesConfig {
        instruction: "pick purple".into(),
        ..LangCubesConfig::default()
    };
    let e = config.validate().unwrap_err();
    assert_eq!(e.field, "instruction");
    for want in [
        "\"pick purple\"",
        "\"pick red\"",
        "\"put red right of blue\"",
    ] {
        assert!(e.message.contains(want), "{want} not in {}", e.message);
    }
    let text = "instructions = \"held-out\"\ninstruction = \"stack red on green\"\n";
    let origin = std::path::Path::new("env.toml");
    let parsed: LangCubesConfig = from_toml_str(text, origin).unwrap();
    assert_eq!(
        parsed.active(),
        vec![Instruction::Stack(Color::Red, Color::Green)]
    );
    assert!(from_toml_str::<LangCubesConfig>("instructions = \"test\"\n", origin).is_err());
    let e = from_toml_str::<LangCubesConfig>("instruction = \"pick purple\"\n", origin)
        .unwrap_err()
        .to_string();
    assert!(e.contains("pick purple"), "{e}");
}
