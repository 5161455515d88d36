//! Physics, control and environment checks of the tabletop suite. Each runs in well under a
//! few seconds in the dev profile.

use diffrl_core::config::Validate;
use diffrl_core::task::Task;
use diffrl_core::{Env, EnvError};
use diffrl_tabletop::env::{Randomization, Tabletop, TabletopConfig, TaskKind, layout};
use diffrl_tabletop::expert::{ExpertConfig, TabletopExpert};
use diffrl_tabletop::robot::{HOME_Q, default_urdf_path, load_panda};
use diffrl_tabletop::task::TabletopTask;
use diffrl_tabletop::world::{
    ArmJoints, BodyPose, CUBE_HALF, GRAVITY, PHYSICS_HZ, PhysicsParams, ROBOT_FRICTION, World,
};

/// The arm's two joint models; the checks of the arm run on both.
const JOINTS: [ArmJoints; 2] = [ArmJoints::Multibody, ArmJoints::Impulse];

fn world(cubes: usize, params: PhysicsParams) -> World {
    world_with(ArmJoints::default(), cubes, params)
}

fn world_with(joints: ArmJoints, cubes: usize, params: PhysicsParams) -> World {
    let panda = load_panda(&default_urdf_path(), ROBOT_FRICTION).unwrap();
    World::with_joints(&panda, params, cubes, HOME_Q, joints)
}

fn upright(position: [f64; 3]) -> BodyPose {
    BodyPose {
        position,
        rotation: [0.0, 0.0, 0.0, 1.0],
    }
}

fn env(kind: TaskKind) -> Tabletop {
    env_with(kind, ArmJoints::default())
}

fn env_with(kind: TaskKind, joints: ArmJoints) -> Tabletop {
    Tabletop::builder()
        .kind(kind)
        .arm_joints(joints)
        .build()
        .unwrap()
}

/// A cube dropped from 0.2 m lands within one substep of sqrt(2 h / g).
#[test]
fn free_fall_takes_sqrt_2h_over_g() {
    let h = 0.2;
    let mut w = world(1, PhysicsParams::default());
    w.set_cube_pose(0, upright([0.2, -0.2, CUBE_HALF + h]));
    let dt = 1.0 / PHYSICS_HZ;
    let mut t = 0.0;
    while w.cube_pose(0).position[2] > CUBE_HALF + 1e-3 {
        w.substep();
        t += dt;
        assert!(t < 1.0, "the cube never landed");
    }
    let expected = (2.0 * h / GRAVITY).sqrt();
    assert!(
        (t - expected).abs() <= dt,
        "landed after {t} s, free fall takes {expected} s"
    );
}

/// A cube resting on the table moves less than 1 mm in 10 s.
#[test]
fn resting_cube_stays_put() {
    let mut w = world(1, PhysicsParams::default());
    let start = [0.1, 0.1, CUBE_HALF];
    w.set_cube_pose(0, upright(start));
    for _ in 0..200 {
        w.control_step();
    }
    let p = w.cube_pose(0).position;
    let drift =
        ((p[0] - start[0]).powi(2) + (p[1] - start[1]).powi(2) + (p[2] - start[2]).powi(2)).sqrt();
    assert!(drift < 1e-3, "drifted {drift} m to {p:?}");
}

/// How far a cube slides in 2 s down a static incline of `angle` whose friction (and the
/// cube's) is `mu` (Rapier averages the two).
fn slide_on_incline(angle: f64, mu: f64) -> f64 {
    let mut w = world(
        1,
        PhysicsParams {
            cube_friction: mu,
            ..PhysicsParams::default()
        },
    );
    let (s, c) = (angle / 2.0).sin_cos();
    let rotation = [0.0, s, 0.0, c];
    let half = [0.15, 0.1, 0.01];
    let centre = [0.2, 0.2, 0.15];
    w.add_static_box(
        half,
        BodyPose {
            position: centre,
            rotation,
        },
        mu,
    );
    // On the top face: centre + R (0, 0, half_z + cube_half), R about y by `angle`.
    let up = half[2] + CUBE_HALF;
    let start = [
        centre[0] + up * angle.sin(),
        centre[1],
        centre[2] + up * angle.cos(),
    ];
    w.set_cube_pose(
        0,
        BodyPose {
            position: start,
            rotation,
        },
    );
    for _ in 0..40 {
        w.control_step();
    }
    let p = w.cube_pose(0).position;
    ((p[0] - start[0]).powi(2) + (p[1] - start[1]).powi(2) + (p[2] - start[2]).powi(2)).sqrt()
}

/// tan(20 deg) = 0.36 < 0.5: the cube sticks; tan(35 deg) = 0.70 > 0.5: it slides.
#[test]
fn incline_slides_iff_tan_exceeds_friction() {
    let stick = slide_on_incline(20f64.to_radians(), 0.5);
    assert!(stick < 2e-3, "slid {stick} m at 20 deg with mu 0.5");
    let slide = slide_on_incline(35f64.to_radians(), 0.5);
    assert!(slide > 0.05, "slid only {slide} m at 35 deg with mu 0.5");
}

/// After a step change of joint 4's target by 0.1 rad the joint settles within 2 mrad in
/// 0.5 s and never overshoots by more than 30 %.
#[test]
fn joint_pd_tracks_a_step() {
    for joints in JOINTS {
        let mut w = world_with(joints, 0, PhysicsParams::default());
        let mut q = HOME_Q;
        q[3] += 0.1;
        w.set_targets(q);
        let mut worst = 0.0f64;
        for _ in 0..10 {
            w.control_step();
            worst = worst.max(w.joint_positions()[3] - HOME_Q[3]);
        }
        let err = (w.joint_positions()[3] - q[3]).abs();
        assert!(
            err < 2e-3,
            "{joints:?}: joint 4 is {err} rad off after 0.5 s"
        );
        assert!(worst < 0.13, "overshot to {worst} rad for a 0.1 rad step");
        // The other joints held still.
        for i in [0, 1, 2, 4, 5, 6] {
            let e = (w.joint_positions()[i] - HOME_Q[i]).abs();
            assert!(e < 5e-3, "joint {} drifted {e} rad", i + 1);
        }
    }
}

/// The TCP of our URDF kinematics sits 0.105 m along the simulated hand's z axis.
#[test]
fn kinematics_match_the_simulated_arm() {
    for joints in JOINTS {
        let mut e = env_with(TaskKind::ReachGoal, joints);
        e.reset(3);
        for a in [
            [1.0, -0.5, -1.0, 1.0],
            [-0.3, 1.0, 0.4, -1.0],
            [0.0, 0.0, 0.0, 0.0],
        ] {
            for _ in 0..3 {
                e.advance(a);
            }
            let hand = e.world().link_poses()[8];
            let from_hand = hand * rapier3d_point(0.105);
            let tcp = e.world().tcp_pose().translation.vector;
            let d = (from_hand.coords - tcp).norm();
            assert!(
                d < 1e-3,
                "{joints:?}: TCP by kinematics and by simulated hand differ by {d} m"
            );
        }
    }
}

fn rapier3d_point(z: f64) -> rapier3d::na::Point3<f64> {
    rapier3d::na::Point3::new(0.0, 0.0, z)
}

/// A cube grasped and lifted by the expert slips less than 1 mm in the gripper in 10 s.
#[test]
fn grasped_cube_does_not_slip() {
    for joints in JOINTS {
        let mut e = env_with(TaskKind::PickCube, joints);
        e.reset(2);
        // The cube square to the fingers (yaw 0) at (0.05, 0.03), the goal 15 cm above it.
        let mut state = e.true_state();
        let c = layout::CUBES;
        state[c..c + 7].copy_from_slice(&[0.05, 0.03, CUBE_HALF, 0.0, 0.0, 0.0, 1.0]);
        let n = state.len();
        state[n - 3..].copy_from_slice(&[0.05, 0.03, 0.17]);
        e.reset_to_state(&state, 0).unwrap();
        let mut expert = TabletopExpert::new(ExpertConfig::default(), 0);
        let lifted = |e: &Tabletop| {
            let s = e.true_state();
            s[layout::CUBES + 2] > 0.06 && e.world().is_grasping(0)
        };
        for _ in 0..40 {
            if lifted(&e) {
                break;
            }
            let a = expert.act(&e);
            e.advance(a);
        }
        assert!(lifted(&e), "{joints:?}: the expert did not lift the cube");
        let offset = |e: &Tabletop| {
            let s = e.true_state();
            [0, 1, 2].map(|i| s[layout::CUBES + i] - s[layout::TCP + i])
        };
        let before = offset(&e);
        for _ in 0..200 {
            e.advance([0.0, 0.0, 0.0, -1.0]);
        }
        let after = offset(&e);
        let slip = ((after[0] - before[0]).powi(2)
            + (after[1] - before[1]).powi(2)
            + (after[2] - before[2]).powi(2))
        .sqrt();
        assert!(slip < 1e-3, "{joints:?}: the cube slipped {slip} m");
        assert!(e.world().is_grasping(0));
    }
}

/// restore(snapshot) continues bit for bit, in the same and in another environment.
#[test]
fn snapshot_restore_is_exact() {
    for joints in JOINTS {
        let mut e = env_with(TaskKind::StackCube, joints);
        e.reset(11);
        let mut expert = TabletopExpert::new(ExpertConfig::default(), 0);
        for _ in 0..12 {
            let a = expert.act(&e);
            e.step(&a).unwrap();
        }
        let snap = e.snapshot();
        let mut actions = Vec::new();
        let mut first = Vec::new();
        for _ in 0..15 {
            let a = expert.act(&e);
            let r = e.step(&a).unwrap();
            actions.push(a);
            first.push((r.obs.state, r.reward.to_bits()));
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut other = env_with(TaskKind::StackCube, joints);
        for target in [&mut e, &mut other] {
            target.restore(&snap);
            for (a, (obs, reward)) in actions.iter().zip(&first) {
                let r = target.step(a).unwrap();
                assert_eq!(bits(&r.obs.state), bits(obs));
                assert_eq!(r.reward.to_bits(), *reward);
            }
        }
    }
}

/// Non-finite and wrongly sized actions are errors that leave the state alone; out-of-range
/// ones are clamped and counted.
#[test]
fn bad_actions_are_rejected_or_clamped() {
    let mut e = env(TaskKind::PickCube);
    e.reset(5);
    let before = e.true_state();
    let err = e.step(&[f32::NAN, 0.0, 0.0, 0.0]).unwrap_err();
    assert!(
        matches!(err, EnvError::NonFiniteAction { index: 0, .. }),
        "{err}"
    );
    let err = e.step(&[0.0, 0.0, f32::INFINITY, 0.0]).unwrap_err();
    assert!(
        matches!(err, EnvError::NonFiniteAction { index: 2, .. }),
        "{err}"
    );
    assert!(matches!(
        e.step(&[0.0; 3]),
        Err(EnvError::ActionShape {
            expected: 4,
            got: 3
        })
    ));
    assert_eq!(e.true_state(), before);
    assert_eq!(e.elapsed_steps(), 0);
    let r = e.step(&[2.0, 0.0, -3.0, 0.5]).unwrap();
    assert_eq!(r.info.clamped, 2);
}

/// The same seed gives the same episode, bit for bit; another seed another one.
#[test]
fn seeded_resets_are_deterministic() {
    let run = |seed: u64| {
        let mut e = env(TaskKind::PushCube);
        let mut obs = vec![e.reset(seed).state];
        let mut expert = TabletopExpert::new(ExpertConfig::default(), seed);
        for _ in 0..8 {
            let a = expert.act(&e);
            obs.push(e.step(&a).unwrap().obs.state);
        }
        obs.iter()
            .flatten()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

/// Randomised physics and observation noise are drawn from the reset seed.
#[test]
fn randomisation_is_seeded() {
    let config = TabletopConfig {
        kind: TaskKind::PickCube,
        randomize: Randomization {
            cube_mass: [0.03, 0.2],
            cube_friction: [0.5, 1.5],
            gain_scale: [0.8, 1.2],
            action_delay: [0, 2],
            obs_noise: 0.001,
            ..Randomization::default()
        },
        ..TabletopConfig::default()
    };
    let mut a = Tabletop::new(config.clone());
    let mut b = Tabletop::new(config);
    assert_eq!(a.reset(3), b.reset(3));
    assert_eq!(a.world().params(), b.world().params());
    let p = a.world().params();
    assert!((0.03..=0.2).contains(&p.cube_mass) && (0.8..=1.2).contains(&p.gain_scale));
    a.reset(4);
    assert_ne!(a.world().params(), b.world().params());
    // Noise makes the observation differ from the recorded state.
    let obs = a.observe().state;
    let truth = a.true_state();
    assert!(
        obs.iter()
            .zip(&truth)
            .any(|(o, t)| (f64::from(*o) - t).abs() > 1e-5)
    );
}

/// Every expert solves most of a handful of seeds (a random policy solves none of
/// push/pick/stack; the fractions are far above chance).
#[test]
fn experts_solve_their_tasks() {
    for (kind, need) in [
        (TaskKind::ReachGoal, 6),
        (TaskKind::PushCube, 5),
        (TaskKind::PickCube, 5),
        (TaskKind::StackCube, 4),
    ] {
        for arm_joints in JOINTS {
            let task = TabletopTask::new(kind);
            let mut e = task.build(&TabletopConfig {
                arm_joints,
                ..TabletopConfig::default()
            });
            let mut solved = 0;
            for seed in 100..106 {
                e.reset(seed);
                let mut expert = task.expert(&ExpertConfig::default(), seed).unwrap();
                loop {
                    let a = expert.act(&e);
                    let r = e.step(&a).unwrap();
                    if r.terminated || r.truncated {
                        solved += usize::from(r.info.success);
                        break;
                    }
                }
            }
            assert!(
                solved >= need,
                "{} ({arm_joints:?}): {solved}/6 (need {need})",
                kind.name()
            );
        }
    }
}

/// reset_to_state round-trips a recorded state and refuses overlapping cubes.
#[test]
fn reset_to_state_round_trips_and_refuses_overlaps() {
    for joints in JOINTS {
        let mut e = env_with(TaskKind::StackCube, joints);
        e.reset(9);
        let state = e.true_state();
        let mut f = env_with(TaskKind::StackCube, joints);
        f.reset_to_state(&state, 1).unwrap();
        let back = f.true_state();
        for (i, (a, b)) in state.iter().zip(&back).enumerate() {
            if !(layout::TCP..layout::TCP + 4).contains(&i) {
                assert!((a - b).abs() < 1e-5, "component {i}: {a} vs {b}");
            }
        }
        // Cube A sunk halfway into the table.
        let mut sunk = state.clone();
        sunk[layout::CUBES + 2] = 0.0;
        let err = f.reset_to_state(&sunk, 1).unwrap_err().to_string();
        assert!(err.contains("table"), "{err}");
        // Cube A inside cube B.
        let mut inside = state.clone();
        inside[layout::CUBES..layout::CUBES + 3]
            .copy_from_slice(&state[layout::CUBES + 7..layout::CUBES + 10]);
        let err = f.reset_to_state(&inside, 1).unwrap_err().to_string();
        assert!(err.contains("cube 1"), "{err}");
        // The refused resets left the environment where it was.
        assert_eq!(f.true_state(), back);
        let err = f.reset_to_state(&state[..5], 1).unwrap_err().to_string();
        assert!(err.contains("39"), "{err}");
        let mut nan = state.clone();
        nan[3] = f64::NAN;
        assert!(
            f.reset_to_state(&nan, 1)
                .unwrap_err()
                .to_string()
                .contains("q_panda_joint4")
        );
    }
}

/// Config errors name the field.
#[test]
fn invalid_configs_name_the_field() {
    let mut c = TabletopConfig::default();
    c.randomize.cube_mass = [0.1, 0.05];
    let err = c.validate().unwrap_err();
    assert_eq!(err.field, "randomize.cube_mass");
    let mut c = TabletopConfig::default();
    c.randomize.action_delay = [3, 1];
    assert_eq!(c.validate().unwrap_err().field, "randomize.action_delay");
    let mut c = TabletopConfig::default();
    c.randomize.obs_noise = f64::NAN;
    assert_eq!(c.validate().unwrap_err().field, "randomize.obs_noise");
    assert!(TabletopConfig::default().validate().is_ok());
    let parsed: Result<TabletopConfig, _> =
        serde_json::from_str(r#"{"max_episode_steps": 20, "colour": 1}"#);
    assert!(parsed.unwrap_err().to_string().contains("colour"));
    // The task comes from the config's `task`, never from [env].
    let parsed: Result<TabletopConfig, _> = serde_json::from_str(r#"{"kind": "stack-cube"}"#);
    assert!(parsed.unwrap_err().to_string().contains("kind"));
    assert!(
        Tabletop::with_urdf(
            TabletopConfig::default(),
            std::path::Path::new("/no/such/panda.urdf")
        )
        .err()
        .unwrap()
        .to_string()
        .contains("/no/such/panda.urdf")
    );
}

/// The scene holds the table, the arm's links, the cubes and the goal.
#[test]
fn scene_has_the_named_bodies() {
    let e = env(TaskKind::StackCube);
    let scene = e.scene().unwrap();
    let names: Vec<&str> = scene.bodies.iter().map(|b| b.name).collect();
    for n in [
        "table",
        "arm/link3",
        "arm/hand",
        "arm/left_finger",
        "cube_a",
        "cube_b",
        "goal",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    assert!(scene.is_3d());
}

/// Task metadata: names, dataset widths, stages from recorded states.
#[test]
fn tasks_describe_themselves() {
    let names: Vec<&str> = [
        TabletopTask::REACH_GOAL,
        TabletopTask::PUSH_CUBE,
        TabletopTask::PICK_CUBE,
        TabletopTask::STACK_CUBE,
    ]
    .iter()
    .map(|t| t.name())
    .collect();
    assert_eq!(
        names,
        ["reach-goal", "push-cube", "pick-cube", "stack-cube"]
    );
    let task = TabletopTask::PUSH_CUBE;
    let e = task.build(&TabletopConfig::default());
    assert_eq!(
        e.kind(),
        TaskKind::PushCube,
        "the task's kind wins over the config's"
    );
    let info = task.dataset();
    assert_eq!((info.fps, info.robot_type.as_str()), (20, "panda"));
    assert_eq!(info.state_names.len(), e.true_state().len());
    let state: Vec<f32> = e.true_state().iter().map(|&v| v as f32).collect();
    assert_eq!(
        task.observe_recorded(&TabletopConfig::default(), &state)
            .unwrap(),
        state
    );
    assert!(
        task.observe_recorded(&TabletopConfig::default(), &state[1..])
            .is_err()
    );
    assert_eq!(
        task.stages(&TabletopConfig::default())
            .unwrap()
            .completed(&state),
        0
    );
    assert!(
        task.unobserved(&TabletopConfig::default(), &["color_jitter".into()])
            .is_some()
    );
    assert!(
        task.unobserved(&TabletopConfig::default(), &["cube_mass".into()])
            .is_none()
    );
}

/// TCP targets stay inside the workspace box however long an action pushes outwards.
#[test]
fn workspace_clamps_the_tcp_target() {
    use diffrl_tabletop::env::WORKSPACE;
    let mut e = env(TaskKind::ReachGoal);
    e.reset(1);
    for (action, axis, bound) in [
        ([0.0, 0.0, -1.0, 1.0], 2, WORKSPACE[0][2]),
        ([0.0, 0.0, 1.0, 1.0], 2, WORKSPACE[1][2]),
        ([0.0, 1.0, 0.0, 1.0], 1, WORKSPACE[1][1]),
    ] {
        for _ in 0..30 {
            e.advance(action);
        }
        let t = e.world().target_tcp_pose().translation.vector;
        assert!(
            (t[axis] - bound).abs() < 1e-3,
            "axis {axis}: target {} vs bound {bound}",
            t[axis]
        );
    }
}

/// With an action delay of 2 steps the arm holds still for two steps, then moves.
#[test]
fn action_delay_holds_the_arm() {
    let config = TabletopConfig {
        kind: TaskKind::ReachGoal,
        randomize: Randomization {
            action_delay: [2, 2],
            ..Randomization::default()
        },
        ..TabletopConfig::default()
    };
    let mut e = Tabletop::new(config);
    e.reset(4);
    let start = e.world().targets();
    for _ in 0..2 {
        e.step(&[1.0, 0.0, 0.0, 1.0]).unwrap();
        assert_eq!(e.world().targets(), start);
    }
    e.step(&[0.0, 0.0, 0.0, 1.0]).unwrap();
    let moved = e.world().target_tcp_pose().translation.x;
    let before = {
        let q: [f64; 7] = start[..7].try_into().unwrap();
        e.world().model().tcp_pose(&q).translation.x
    };
    assert!(
        (moved - before - 0.025).abs() < 1e-3,
        "moved {} m",
        moved - before
    );
}

/// A snapshot continues identically on another thread (each thread has its own Rapier
/// pipeline), as vectorised environments run them.
#[test]
fn snapshots_continue_identically_on_other_threads() {
    let mut e = env(TaskKind::PickCube);
    e.reset(21);
    let mut expert = TabletopExpert::new(ExpertConfig::default(), 0);
    for _ in 0..14 {
        let a = expert.act(&e);
        e.step(&a).unwrap();
    }
    let snap = e.snapshot();
    let run = move |mut env: Tabletop| {
        let mut expert = TabletopExpert::new(ExpertConfig::default(), 0);
        let mut out = Vec::new();
        for _ in 0..10 {
            let a = expert.act(&env);
            let r = env.step(&a).unwrap();
            out.extend(r.obs.state.iter().map(|x| x.to_bits()));
            if r.terminated {
                break;
            }
        }
        out
    };
    let mut other = env(TaskKind::PickCube);
    other.restore(&snap);
    let here = run(e);
    let there = std::thread::spawn(move || run(other)).join().unwrap();
    assert_eq!(here, there);
}
