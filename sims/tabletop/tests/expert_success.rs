//! Expert success rates over many seeded episodes (slow: ~10 s per task in the dev profile).
//! `cargo test -p diffrl-tabletop --test expert_success -- --ignored --nocapture`; the
//! `EPISODES` and `FIRST_SEED` environment variables change the sample (default 100 from
//! seed 1000). `FAILURES=1` prints the failed seeds; `ARM_JOINTS=impulse` simulates the arm
//! on impulse joints (`[env] arm_joints`) instead of the multibody.

use diffrl_core::Env;
use diffrl_core::task::Task;
use diffrl_tabletop::env::{TabletopConfig, TaskKind};
use diffrl_tabletop::expert::ExpertConfig;
use diffrl_tabletop::lang_cubes::{LangCubesConfig, LangCubesTask};
use diffrl_tabletop::language::INSTRUCTIONS;
use diffrl_tabletop::task::TabletopTask;
use diffrl_tabletop::world::ArmJoints;

fn var(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The joint model `ARM_JOINTS` names (`multibody` when unset).
fn arm_joints() -> ArmJoints {
    match std::env::var("ARM_JOINTS").as_deref() {
        Ok("impulse") => ArmJoints::Impulse,
        Ok("multibody") | Err(_) => ArmJoints::Multibody,
        Ok(other) => panic!("ARM_JOINTS must be multibody or impulse, got {other:?}"),
    }
}

/// Success rate of `kind`'s expert over `n` episodes from `first`, and the failed seeds.
fn success_rate(kind: TaskKind, first: u64, n: u64) -> (f64, Vec<u64>) {
    let task = TabletopTask::new(kind);
    let mut env = task.build(&TabletopConfig {
        arm_joints: arm_joints(),
        ..TabletopConfig::default()
    });
    let mut failed = Vec::new();
    for seed in first..first + n {
        env.reset(seed);
        let mut expert = task.expert(&ExpertConfig::default(), seed).unwrap();
        loop {
            let a = expert.act(&env);
            let r = env.step(&a).unwrap();
            if r.terminated || r.truncated {
                if !r.info.success {
                    failed.push(seed);
                }
                break;
            }
        }
    }
    (1.0 - failed.len() as f64 / n as f64, failed)
}

#[test]
#[ignore = "slow: measures expert success over 100 episodes per task"]
fn expert_success_rates() {
    let (first, n) = (var("FIRST_SEED", 1000), var("EPISODES", 100));
    let mut report = Vec::new();
    for (kind, need) in [
        (TaskKind::ReachGoal, 0.95),
        (TaskKind::PushCube, 0.9),
        (TaskKind::PickCube, 0.95),
        (TaskKind::StackCube, 0.9),
    ] {
        let start = std::time::Instant::now();
        let (rate, failed) = success_rate(kind, first, n);
        println!(
            "{:10} {:5.1}% of {n} episodes from seed {first} ({:.1} s)",
            kind.name(),
            100.0 * rate,
            start.elapsed().as_secs_f64()
        );
        if std::env::var("FAILURES").is_ok() {
            println!("  failed seeds: {failed:?}");
        }
        report.push((kind, rate, need));
    }
    for (kind, rate, need) in report {
        assert!(rate >= need, "{}: {rate} < {need}", kind.name());
    }
}

/// Success rate of the `lang-cubes` expert on the instructions of `family` over `n` episodes
/// from `first` (episode `seed` fixes the family's instruction `seed % count`), and the failed
/// (seed, instruction) pairs.
fn lang_success_rate(family: &str, first: u64, n: u64) -> (f64, Vec<(u64, String)>) {
    let task = LangCubesTask;
    let mut envs: Vec<_> = INSTRUCTIONS
        .into_iter()
        .filter(|i| i.family() == family)
        .map(|i| {
            task.build(&LangCubesConfig {
                instruction: i.canonical(),
                arm_joints: arm_joints(),
                ..LangCubesConfig::default()
            })
        })
        .collect();
    let count = envs.len() as u64;
    let mut failed = Vec::new();
    for seed in first..first + n {
        let env = &mut envs[(seed % count) as usize];
        env.reset(seed);
        let mut expert = task.expert(&ExpertConfig::default(), seed).unwrap();
        loop {
            let a = expert.act(env);
            let r = env.step(&a).unwrap();
            if r.terminated || r.truncated {
                if !r.info.success {
                    failed.push((seed, env.instruction().canonical()));
                }
                break;
            }
        }
    }
    (1.0 - failed.len() as f64 / n as f64, failed)
}

#[test]
#[ignore = "slow: measures the lang-cubes expert over 100 episodes per instruction family"]
fn lang_cubes_expert_success_rates() {
    let (first, n) = (var("FIRST_SEED", 1000), var("EPISODES", 100));
    let mut report = Vec::new();
    for family in ["pick", "stack", "left-of", "right-of"] {
        let start = std::time::Instant::now();
        let (rate, failed) = lang_success_rate(family, first, n);
        println!(
            "lang-cubes {family:9} {:5.1}% of {n} episodes from seed {first} ({:.1} s)",
            100.0 * rate,
            start.elapsed().as_secs_f64()
        );
        if std::env::var("FAILURES").is_ok() {
            println!("  failed: {failed:?}");
        }
        report.push((family, rate));
    }
    for (family, rate) in report {
        assert!(rate >= 0.95, "{family}: {rate} < 0.95");
    }
}

/// Prints one expert episode step by step: `TRACE_KIND=push-cube TRACE_SEED=15`.
#[test]
#[ignore = "a debugging aid: prints one episode"]
fn trace_episode() {
    let kind = match std::env::var("TRACE_KIND").as_deref() {
        Ok("reach-goal") => TaskKind::ReachGoal,
        Ok("push-cube") => TaskKind::PushCube,
        Ok("stack-cube") => TaskKind::StackCube,
        _ => TaskKind::PickCube,
    };
    let seed = var("TRACE_SEED", 0);
    let task = TabletopTask::new(kind);
    let mut env = task.build(&TabletopConfig {
        arm_joints: arm_joints(),
        ..TabletopConfig::default()
    });
    env.reset(seed);
    let mut expert = task.expert(&ExpertConfig::default(), seed).unwrap();
    for k in 0..env.max_episode_steps() {
        let a = expert.act(&env);
        let r = env.step(&a).unwrap();
        println!(
            "{k:2} a {a:5.2?}  {}",
            diffrl_core::task::TaskEnv::describe_step(&env, &a, &r)
        );
        if std::env::var("TRACE_TARGETS").is_ok() {
            let t = env.world().target_tcp_pose().translation.vector;
            println!(
                "   target tcp ({:.3}, {:.3}, {:.3}) q {:.3?} q_target {:.3?} table contacts {:?}",
                t.x,
                t.y,
                t.z,
                &env.world().joint_positions()[..7],
                &env.world().targets()[..7],
                env.world().links_touching_table()
            );
            println!(
                "   finger forces {:?} qd {:.3?}",
                env.world().finger_forces(0),
                &env.world().joint_velocities()[..7]
            );
        }
        if r.terminated || r.truncated {
            break;
        }
    }
}
