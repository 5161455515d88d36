//! Behaviour of the Push-T environment: determinism, snapshots, bad input, episode limits.

use diffrl_core::seeding::{self};
use diffrl_core::{AutoReset, Env, VecEnv};
use diffrl_pusht::{ObsMode, PushT, PushTConfig, PushTTask, Randomization};
use rand::Rng;

/// A random-ish but reproducible action sequence that keeps the agent near the block.
fn actions(seed: u64, n: usize) -> Vec<[f32; 2]> {
    let mut rng = seeding::rng(seed);
    (0..n)
        .map(|_| {
            [
                rng.random_range(150.0..360.0),
                rng.random_range(150.0..360.0),
            ]
        })
        .collect()
}

fn run(env: &mut PushT, acts: &[[f32; 2]]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for a in acts {
        let r = env.step(a).unwrap();
        for v in &r.obs.state {
            bytes.extend(v.to_le_bytes());
        }
        bytes.extend(r.reward.to_le_bytes());
        if let Some(img) = &r.obs.image {
            bytes.extend(&img.data);
        }
        if r.terminated || r.truncated {
            break;
        }
    }
    bytes
}

#[test]
fn same_seed_same_bytes() {
    for obs in [ObsMode::State, ObsMode::Keypoints, ObsMode::Pixels] {
        let acts = actions(1, 60);
        let mut a = PushT::builder().obs(obs).build();
        let mut b = PushT::builder().obs(obs).build();
        let (oa, ob) = (a.reset(7), b.reset(7));
        assert_eq!(oa, ob);
        assert_eq!(run(&mut a, &acts), run(&mut b, &acts));
        assert_ne!(
            a.reset(8),
            b.reset(9),
            "different seeds give different starts"
        );
    }
}

#[test]
fn restored_snapshot_continues_identically() {
    let acts = actions(2, 80);
    let mut env = PushT::builder().build();
    env.reset(3);
    run(&mut env, &acts[..20]);
    let snap = env.snapshot();
    let first = run(&mut env, &acts[20..]);
    // A different environment, with its own history, restored from the snapshot.
    let mut other = PushT::builder().build();
    other.reset(99);
    run(&mut other, &acts[..5]);
    other.restore(&snap);
    assert_eq!(run(&mut other, &acts[20..]), first);
    env.restore(&snap);
    assert_eq!(run(&mut env, &acts[20..]), first);
}

#[test]
fn block_moves_when_pushed() {
    let mut env = PushT::builder().build();
    env.reset_to_state([256.0, 100.0, 256.0, 300.0, 0.0], 0)
        .unwrap();
    let before = env.block_pose();
    for _ in 0..15 {
        env.step(&[256.0, 400.0]).unwrap();
    }
    let after = env.block_pose();
    assert!(
        after.y - before.y > 20.0,
        "block pushed down: {before:?} -> {after:?}"
    );
}

#[test]
fn nan_actions_are_rejected_without_changing_state() {
    let mut env = PushT::builder().build();
    env.reset(4);
    env.step(&[200.0, 200.0]).unwrap();
    let snap_state = env.true_state();
    for bad in [
        [f32::NAN, 1.0],
        [1.0, f32::INFINITY],
        [f32::NEG_INFINITY, 0.0],
    ] {
        let e = env.step(&bad).unwrap_err().to_string();
        assert!(e.contains("not finite"), "{e}");
    }
    assert!(env.step(&[1.0]).is_err());
    assert_eq!(env.true_state(), snap_state);
    assert_eq!(env.elapsed_steps(), 1);
    assert!(env.step(&[200.0, 200.0]).is_ok(), "still usable");
}

#[test]
fn out_of_range_actions_are_clamped_and_counted() {
    let mut a = PushT::builder().build();
    let mut b = PushT::builder().build();
    a.reset(5);
    b.reset(5);
    let ra = a.step(&[-100.0, 9000.0]).unwrap();
    let rb = b.step(&[0.0, 512.0]).unwrap();
    assert_eq!(ra.info.clamped, 2);
    assert_eq!(rb.info.clamped, 0);
    assert_eq!(ra.obs, rb.obs);
    // Physics never produces NaN, even under extreme targets.
    for _ in 0..50 {
        let r = a.step(&[1e30, -1e30]).unwrap();
        assert!(r.obs.state.iter().all(|v| v.is_finite()));
    }
}

#[test]
fn truncates_at_300_steps_and_refuses_to_continue() {
    let mut env = PushT::builder().build();
    env.reset(6);
    let mut n = 0;
    loop {
        let r = env.step(&[10.0, 10.0]).unwrap();
        n += 1;
        if r.truncated || r.terminated {
            assert!(r.truncated && !r.terminated);
            break;
        }
    }
    assert_eq!(n, 300);
    assert!(
        env.step(&[10.0, 10.0])
            .unwrap_err()
            .to_string()
            .contains("reset")
    );
}

#[test]
fn success_terminates_with_full_reward() {
    let mut env = PushT::builder().build();
    // Block already at the goal: angle pi/4 with the body origin at (256, 256). With the legacy
    // order, pass the position whose centre of gravity ends where the goal's is.
    let a = std::f64::consts::FRAC_PI_4;
    let (bx, by) = (256.0 - 45.0 * a.sin(), 256.0 + 45.0 * a.cos() - 45.0);
    env.reset_to_state([50.0, 50.0, bx, by, a], 0).unwrap();
    assert!(env.coverage() > 0.999, "{}", env.coverage());
    let r = env.step(&[50.0, 50.0]).unwrap();
    assert!(r.terminated && r.info.success && r.reward == 1.0);
}

#[test]
fn observation_modes_have_declared_shapes() {
    for obs in [ObsMode::State, ObsMode::Keypoints, ObsMode::Pixels] {
        let mut env = PushT::builder().obs(obs).build();
        let o = env.reset(1);
        let space = env.observation_space();
        assert_eq!(o.state.len(), space.state.as_ref().unwrap().dim());
        // GiGPO's anchor grid: 5 in every state dimension.
        assert_eq!(env.anchor_cells(), Some(vec![5.0; o.state.len()]));
        assert!(
            space.state.as_ref().unwrap().contains(&o.state),
            "{obs:?}: {:?}",
            o.state
        );
        match (space.image, o.image) {
            (Some(s), Some(img)) => assert_eq!(img.data.len(), (s.height * s.width * 3) as usize),
            (None, None) => {}
            other => panic!("image mismatch {other:?}"),
        }
    }
}

#[test]
fn randomization_changes_physics_per_episode_and_repeats_per_seed() {
    let r = Randomization {
        block_mass: [0.5, 2.0],
        kp: [80.0, 120.0],
        action_delay: [0, 2],
        obs_noise_px: 1.0,
        ..Randomization::default()
    };
    let mut env = PushT::builder().randomize(r.clone()).build();
    env.reset(1);
    let p1 = env.physics();
    env.reset(2);
    let p2 = env.physics();
    assert_ne!(p1, p2);
    env.reset(1);
    assert_eq!(env.physics(), p1);
    let mut twin = PushT::builder().randomize(r).build();
    assert_eq!(env.reset(11), twin.reset(11));
    let acts = actions(3, 30);
    assert_eq!(run(&mut env, &acts), run(&mut twin, &acts));
}

#[test]
fn invalid_randomization_is_reported_with_field() {
    let text = "obs = \"pixels\"\n[randomize]\nblock_mass = [2.0, 1.0]\n";
    let e =
        diffrl_core::config::from_toml_str::<PushTConfig>(text, std::path::Path::new("env.toml"))
            .unwrap_err();
    assert_eq!(
        e.to_string().split(':').nth(1).unwrap().trim(),
        "randomize.block_mass"
    );
    let e = diffrl_core::config::from_toml_str::<PushTConfig>(
        "obs = \"depth\"\n",
        std::path::Path::new("env.toml"),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("obs") && e.to_string().contains("env.toml"),
        "{e}"
    );
}

#[test]
fn vec_env_is_deterministic_across_thread_counts() {
    let run_vec = |threads| {
        let envs = (0..4)
            .map(|_| PushT::builder().max_episode_steps(20).build())
            .collect();
        let mut v = VecEnv::new(envs, AutoReset::SameStep, threads);
        let mut out = vec![v.reset(17)];
        let acts = actions(9, 50);
        for a in &acts {
            out.push(v.step(&vec![a.to_vec(); 4]).unwrap().obs);
        }
        out
    };
    assert_eq!(run_vec(1), run_vec(2));
}

#[test]
fn rendered_state_matches_the_pixels_the_env_observes() {
    let acts = actions(4, 40);
    let mut state = PushT::builder().obs(ObsMode::State).build();
    let mut pixels = PushT::builder().obs(ObsMode::Pixels).build();
    let (mut s, mut p) = (state.reset(11), pixels.reset(11));
    for a in &acts {
        let img = p.image.as_ref().unwrap();
        let drawn = diffrl_pusht::render::render_state(&s.state, img.width).unwrap();
        // The observed state is f32: anti-aliased edges may differ by a unit or two.
        let worst = drawn
            .iter()
            .zip(&img.data)
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap();
        assert!(worst <= 3, "largest pixel difference {worst}");
        s = state.step(a).unwrap().obs;
        p = pixels.step(a).unwrap().obs;
    }
    assert!(diffrl_pusht::render::render_state(&[1.0, 2.0], 96).is_none());
}

/// Datasets record the 5-d true state; each observation mode trains on what its environment
/// observes at that state: the state itself, its keypoints, or (pixels) the agent position.
#[test]
fn recorded_states_become_each_modes_observation() {
    use diffrl_core::task::Task;
    let acts = actions(6, 10);
    for obs in [ObsMode::State, ObsMode::Keypoints, ObsMode::Pixels] {
        let cfg = PushTConfig {
            obs,
            ..PushTConfig::default()
        };
        let mut env = PushT::builder().config(cfg.clone()).build();
        let mut o = env.reset(3);
        for a in &acts {
            let state = env.true_state().map(|v| v as f32);
            let seen = PushTTask.observe_recorded(&cfg, &state).unwrap();
            let worst = seen
                .iter()
                .zip(&o.state)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert_eq!(seen.len(), o.state.len(), "{obs:?}");
            assert!(worst < 1e-3, "{obs:?}: {seen:?} vs {:?}", o.state);
            o = env.step(a).unwrap().obs;
        }
    }
    let pixels = PushTConfig {
        obs: ObsMode::Pixels,
        ..PushTConfig::default()
    };
    assert_eq!(
        PushTTask.observe_recorded(&pixels, &[1.0, 2.0]).unwrap(),
        [1.0, 2.0]
    );
    let e = PushTTask.observe_recorded(&pixels, &[1.0; 3]).unwrap_err();
    assert!(e.contains("3-d states"), "{e}");
}
