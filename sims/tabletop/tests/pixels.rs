//! Pixels observations of the tabletop tasks: shapes and spaces, what moves the image, seeded
//! camera and colour jitter, `render_state` against the env's own image, config errors, and
//! the viewer scene's tool and action paths.

use diffrl_core::Env;
use diffrl_core::config::Validate;
use diffrl_core::task::Task;
use diffrl_tabletop::env::{
    ACTION_SCALE, ObsMode, Randomization, Tabletop, TabletopConfig, TaskKind, layout,
    proprio_indices,
};
use diffrl_tabletop::expert::{ExpertConfig, TabletopExpert};
use diffrl_tabletop::pixels::ArmDrawing;
use diffrl_tabletop::task::TabletopTask;

fn pixels(kind: TaskKind, randomize: Randomization) -> Tabletop {
    Tabletop::builder()
        .kind(kind)
        .obs(ObsMode::Pixels)
        .randomize(randomize)
        .build()
        .unwrap()
}

fn image(env: &mut Tabletop) -> Vec<u8> {
    env.observe()
        .image
        .expect("pixels observations hold an image")
        .data
}

/// Runs the scripted expert for `steps` steps (or to the episode's end).
fn run_expert(env: &mut Tabletop, steps: usize) {
    let mut expert = TabletopExpert::new(ExpertConfig::default(), 0);
    for _ in 0..steps {
        let a = expert.act(env);
        let r = env.step(&a).unwrap();
        if r.terminated || r.truncated {
            break;
        }
    }
}

fn differing_pixels(a: &[u8], b: &[u8]) -> usize {
    a.chunks_exact(3)
        .zip(b.chunks_exact(3))
        .filter(|(x, y)| x != y)
        .count()
}

#[test]
fn pixels_observations_hold_an_image_and_proprioception() {
    for kind in TaskKind::ALL {
        let mut env = pixels(kind, Randomization::default());
        let obs = env.reset(0);
        let space = env.observation_space();
        let img = obs.image.as_ref().unwrap();
        assert_eq!(
            (img.width, img.height, img.data.len()),
            (64, 64, 64 * 64 * 3)
        );
        let image_space = space.image.unwrap();
        assert_eq!((image_space.width, image_space.height), (64, 64));
        let state = space.state.unwrap();
        let want = if matches!(kind, TaskKind::ReachGoal | TaskKind::PickCube) {
            16
        } else {
            13
        };
        assert_eq!(state.dim(), want, "{}", kind.name());
        assert_eq!(obs.state.len(), want);
        assert_eq!(env.anchor_cells().unwrap().len(), want);
        assert_eq!(
            state.names[9..13],
            ["tcp_x", "tcp_y", "tcp_z", "gripper_opening"]
        );
        // Noise-free: the state part is the true state's proprioception.
        let truth = env.true_state();
        let proprio: Vec<f32> = proprio_indices(kind)
            .into_iter()
            .map(|i| truth[i] as f32)
            .collect();
        assert_eq!(obs.state, proprio);
        let task = TabletopTask::new(kind);
        let recorded: Vec<f32> = truth.iter().map(|&v| v as f32).collect();
        assert_eq!(
            task.observe_recorded(env.config(), &recorded).unwrap(),
            proprio
        );
        assert_eq!(task.observation(env.config()), "pixels");
        // The privileged values (an auxiliary target for pixel encoders) are the cubes' centres.
        let privileged = task.privileged_recorded(env.config(), &recorded).unwrap();
        let names = kind.state_names();
        let centres: Vec<f32> = names
            .iter()
            .zip(&recorded)
            .filter(|(n, _)| {
                n.starts_with("cube_") && ["_x", "_y", "_z"].iter().any(|e| n.ends_with(e))
            })
            .map(|(_, v)| *v)
            .collect();
        assert_eq!(privileged, centres, "{}", kind.name());
        assert_eq!(privileged.len(), 3 * kind.cubes());
        assert!(
            task.privileged_recorded(env.config(), &recorded[1..])
                .is_err()
        );
        // The image is not blank: the table, the arm and the background all show.
        let distinct: std::collections::HashSet<&[u8]> = img.data.chunks_exact(3).collect();
        assert!(distinct.len() > 10, "{} colours", distinct.len());
    }
    // The size follows the config.
    let mut env = Tabletop::builder()
        .obs(ObsMode::Pixels)
        .image_size(128)
        .build()
        .unwrap();
    assert_eq!(image(&mut env).len(), 128 * 128 * 3);
}

#[test]
fn state_observations_have_no_image() {
    let mut env = Tabletop::builder().build().unwrap();
    let obs = env.reset(0);
    assert!(obs.image.is_none() && env.observation_space().image.is_none());
    assert_eq!(obs.state.len(), TaskKind::PickCube.state_dim());
    assert!(env.camera_image().is_none());
    assert_eq!(env.render_image().data.len(), 64 * 64 * 3);
}

#[test]
fn the_image_changes_when_the_cube_moves() {
    let mut env = pixels(TaskKind::PickCube, Randomization::default());
    env.reset(0);
    let before = image(&mut env);
    let mut s = env.true_state();
    s[layout::CUBES] += 0.06;
    s[layout::CUBES + 1] -= 0.04;
    let obs = env.reset_to_state(&s, 0).unwrap();
    let after = obs.image.unwrap().data;
    let changed = differing_pixels(&before, &after);
    assert!(changed >= 10, "only {changed} pixels changed");
    // Only the cube moved: most of the image is the same.
    assert!(changed < 64 * 64 / 4, "{changed} pixels changed");
}

#[test]
fn same_seed_same_bytes_and_restore_gives_the_same_image() {
    let run = || {
        let mut env = pixels(TaskKind::StackCube, Randomization::default());
        env.reset(5);
        run_expert(&mut env, 12);
        image(&mut env)
    };
    assert_eq!(run(), run());

    let mut env = pixels(TaskKind::PickCube, Randomization::default());
    env.reset(2);
    run_expert(&mut env, 8);
    let snapshot = env.snapshot();
    let at_snapshot = image(&mut env);
    run_expert(&mut env, 10);
    assert_ne!(image(&mut env), at_snapshot, "the arm moved");
    let restored = env.restore(&snapshot);
    assert_eq!(restored.image.unwrap().data, at_snapshot);
}

#[test]
fn camera_and_colour_jitter_change_the_image_and_are_seeded() {
    let plain = |seed| {
        let mut env = pixels(TaskKind::PickCube, Randomization::default());
        env.reset(seed);
        image(&mut env)
    };
    let jittered = |r: Randomization, seed| {
        let mut env = pixels(TaskKind::PickCube, r);
        let obs = env.reset(seed);
        (
            obs.image.unwrap().data,
            env.camera_jitter(),
            env.color_scale(),
        )
    };
    let camera = Randomization {
        camera_pos_jitter: 0.03,
        camera_rot_jitter: 0.05,
        ..Randomization::default()
    };
    let (a, jitter_a, _) = jittered(camera.clone(), 3);
    let (b, jitter_b, _) = jittered(camera.clone(), 3);
    assert_eq!(a, b, "same seed, same camera");
    assert_eq!(jitter_a, jitter_b);
    assert!(jitter_a.iter().all(|v| *v != 0.0));
    let changed = differing_pixels(&a, &plain(3));
    assert!(changed > 200, "camera jitter changed {changed} pixels");
    let (_, jitter_c, _) = jittered(camera, 4);
    assert_ne!(jitter_a, jitter_c, "another seed, another camera");

    let colour = Randomization {
        color_jitter: [0.7, 1.3],
        ..Randomization::default()
    };
    let (c, _, scale) = jittered(colour.clone(), 3);
    assert_eq!(c, jittered(colour, 3).0);
    assert!(scale.iter().all(|s| (0.7..=1.3).contains(s)) && scale != [1.0; 3]);
    let p = plain(3);
    // Every channel is the plain image's times its factor.
    for (got, want) in c.chunks_exact(3).zip(p.chunks_exact(3)) {
        for ch in 0..3 {
            let expected = (f64::from(want[ch]) * scale[ch]).round().min(255.0);
            assert!((f64::from(got[ch]) - expected).abs() <= 1.0);
        }
    }
}

#[test]
fn obs_noise_reaches_the_proprioception_not_the_image() {
    let noisy = Randomization {
        obs_noise: 0.01,
        ..Randomization::default()
    };
    let mut a = pixels(TaskKind::ReachGoal, noisy);
    let mut b = pixels(TaskKind::ReachGoal, Randomization::default());
    let (oa, ob) = (a.reset(1), b.reset(1));
    assert_eq!(oa.image, ob.image);
    let moved = oa
        .state
        .iter()
        .zip(&ob.state)
        .filter(|(x, y)| x != y)
        .count();
    // Joint positions, TCP and goal are noised; the gripper opening is not.
    assert_eq!(moved, 15);
    assert_eq!(oa.state[12], ob.state[12]);
}

#[test]
fn render_state_of_a_recorded_state_is_the_envs_image() {
    for kind in TaskKind::ALL {
        let task = TabletopTask::new(kind);
        let mut env = pixels(kind, Randomization::default());
        env.reset(7);
        run_expert(&mut env, 15);
        let recorded: Vec<f32> = env.true_state().iter().map(|&v| v as f32).collect();
        assert_eq!(task.image_size(env.config()), Some(64));
        let drawn = task.render_state(&recorded, 64).unwrap();
        assert_eq!(drawn, image(&mut env), "{}", kind.name());
        // A state policy's env draws the same picture.
        let mut state_env = Tabletop::builder().kind(kind).build().unwrap();
        state_env.reset(7);
        run_expert(&mut state_env, 15);
        assert_eq!(state_env.render_image().data, drawn);
        assert_eq!(task.render_state(&recorded, 96).unwrap().len(), 96 * 96 * 3);
    }
}

#[test]
fn render_state_explains_what_it_cannot_draw() {
    let task = TabletopTask::PICK_CUBE;
    let e = task.render_state(&[0.0; 5], 64).unwrap_err();
    assert!(
        e.contains("pick-cube") && e.contains("32-value") && e.contains("has 5"),
        "{e}"
    );
    let mut env = pixels(TaskKind::PickCube, Randomization::default());
    let mut s: Vec<f32> = env.true_state().iter().map(|&v| v as f32).collect();
    // A pixels observation's state part is not a full state.
    let proprio = env.observe().state;
    let e = task.render_state(&proprio, 64).unwrap_err();
    assert!(e.contains("has 16"), "{e}");
    let e = task.render_state(&s, 0).unwrap_err();
    assert!(e.contains("size"), "{e}");
    s[layout::CUBES] = f32::NAN;
    let e = task.render_state(&s, 64).unwrap_err();
    assert!(e.contains("cube_a_x") && e.contains("not finite"), "{e}");
}

#[test]
fn bad_image_sizes_are_rejected() {
    for size in [0, 8, 15, 257, 1024] {
        let config = TabletopConfig {
            obs: ObsMode::Pixels,
            image_size: size,
            ..TabletopConfig::default()
        };
        let e = config.validate().unwrap_err();
        assert_eq!(e.field, "image_size");
        assert!(e.message.contains("16..=256") && e.message.contains(&size.to_string()));
        let e = Tabletop::try_new(config).err().unwrap().to_string();
        assert!(e.contains("image_size"), "{e}");
    }
    for size in [16, 64, 256] {
        let config = TabletopConfig {
            obs: ObsMode::Pixels,
            image_size: size,
            ..TabletopConfig::default()
        };
        assert!(config.validate().is_ok());
    }
    let parsed: TabletopConfig =
        serde_json::from_str(r#"{"obs": "pixels", "image_size": 96}"#).unwrap();
    assert_eq!((parsed.obs, parsed.image_size), (ObsMode::Pixels, 96));
    assert_eq!(TabletopConfig::default().image_size, 64);
}

#[test]
fn unobserved_knows_pixel_policies_see_the_camera() {
    let task = TabletopTask::PICK_CUBE;
    let fields = ["camera_pos_jitter".to_string(), "color_jitter".to_string()];
    let state = TabletopConfig::default();
    assert!(task.unobserved(&state, &fields).is_some());
    let pixels = TabletopConfig {
        obs: ObsMode::Pixels,
        ..TabletopConfig::default()
    };
    assert!(task.unobserved(&pixels, &fields).is_none());
    assert_eq!(task.observation(&state), "state");
}

#[test]
fn the_scene_has_the_tool_action_paths_and_the_policy_image() {
    for obs in [ObsMode::State, ObsMode::Pixels] {
        let mut env = Tabletop::builder().obs(obs).build().unwrap();
        env.reset(1);
        run_expert(&mut env, 5);
        let scene = env.scene().unwrap();
        let tcp = env.world().tcp_pose().translation.vector;
        let tool = scene.tool.unwrap();
        for i in 0..3 {
            assert!((f64::from(tool[i]) - tcp[i]).abs() < 1e-6);
        }
        let a = scene.actions_3d.unwrap();
        assert!(a.cumulative && a.scale == [ACTION_SCALE as f32; 3]);
        let target = env.world().target_tcp_pose().translation.vector;
        for i in 0..3 {
            assert!((f64::from(a.origin[i]) - target[i]).abs() < 1e-6);
        }
        match obs {
            ObsMode::State => assert!(scene.image.is_none()),
            ObsMode::Pixels => assert_eq!(scene.image.unwrap().data, image(&mut env)),
        }
    }
}

/// The camera draws links from forward kinematics of the recorded joint positions; they sit
/// where the physics has them.
#[test]
fn forward_kinematics_puts_links_where_the_physics_has_them() {
    let mut env = Tabletop::builder().build().unwrap();
    env.reset(4);
    run_expert(&mut env, 20);
    let arm = ArmDrawing::new(env.world());
    let q = env.world().joint_positions();
    for (i, ((fk, _), (sim, _))) in arm
        .link_boxes(&q)
        .iter()
        .zip(env.world().link_boxes())
        .enumerate()
    {
        let d = (fk.translation.vector - sim.translation.vector).norm();
        let angle = fk.rotation.angle_to(&sim.rotation);
        assert!(d < 1e-4 && angle < 1e-3, "link {i}: {d} m, {angle} rad");
    }
}
