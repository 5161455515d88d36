use diffrl_core::Env;
use diffrl_tabletop::env::*;

#[test]
fn lag_probe() {
    let mut env = Tabletop::builder()
        .kind(TaskKind::ReachGoal)
        .build()
        .unwrap();
    env.reset(3);
    for k in 0..14 {
        let a = if k < 6 {
            [0.0, 0.0, -1.0, 1.0]
        } else {
            [0.0, 0.0, 0.0, 1.0]
        };
        env.advance(a);
        let t = env.world().target_tcp_pose().translation.vector;
        let m = env.world().tcp_pose().translation.vector;
        println!(
            "{k} target z {:.4} measured z {:.4} lag {:.4} qd {:.3?}",
            t.z,
            m.z,
            t.z - m.z,
            &env.true_state()[9..16]
        );
    }
}
