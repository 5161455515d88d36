use diffrl_core::Env;
use diffrl_tabletop::env::*;
use diffrl_tabletop::expert::*;

#[test]
fn explore() {
    let kind = match std::env::var("KIND").as_deref() {
        Ok("reach") => TaskKind::ReachGoal,
        Ok("push") => TaskKind::PushCube,
        Ok("stack") => TaskKind::StackCube,
        _ => TaskKind::PickCube,
    };
    let n: u64 = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let verbose = std::env::var("V").is_ok();
    let mut env = Tabletop::builder().kind(kind).build().unwrap();
    let mut ok = 0;
    let t = std::time::Instant::now();
    let mut steps = 0;
    let first: u64 = std::env::var("FIRST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    for seed in first..first + n {
        env.reset(seed);
        let mut ex = TabletopExpert::new(ExpertConfig::default(), seed);
        let mut success = false;
        let mut len = 0;
        for k in 0..50 {
            let a = ex.act(&env);
            let r = env.step(&a).unwrap();
            steps += 1;
            len = k + 1;
            if verbose {
                let s = env.true_state();
                println!(
                    "{k} a {:?} tcp {:.3?} open {:.3} cube {:.3?} qa {:.2?} b {:.3?} goal {:.3?} score {:.3} grasp {}",
                    a,
                    &s[18..21],
                    s[21],
                    &s[22..25],
                    &s[25..29],
                    &s[s.len().saturating_sub(10)..s.len().saturating_sub(7)],
                    &s[s.len() - 3..],
                    r.info.score,
                    env.world().cube_count() > 0 && env.world().is_grasping(0)
                );
            }
            if r.info.success {
                success = true;
                break;
            }
            if r.truncated {
                break;
            }
        }
        if success {
            ok += 1;
        } else {
            println!("seed {seed} failed");
        }
        let _ = len;
    }
    println!(
        "{kind:?}: {ok}/{n}  {:.0} steps/s",
        steps as f64 / t.elapsed().as_secs_f64()
    );
}
