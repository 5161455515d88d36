//! Parity with gym-pusht 0.1.8 on committed reference vectors
//! (assets/testdata/pusht_gym_vectors.json, written by tools/pusht_vectors.sh).

use diffrl_core::Env;
use diffrl_pusht::geometry::{GOAL, Pose, coverage, keypoints};
use diffrl_pusht::{PushT, SUCCESS_THRESHOLD};
use serde_json::Value;

/// A file of the repository. The package directory is read at run time (cargo sets it for test
/// processes): the compile-time value goes stale when clones at other paths share one target
/// directory and cargo reuses their test binaries.
fn repo_file(rel: &str) -> std::path::PathBuf {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    dir.join("../..").join(rel)
}

fn vectors() -> Value {
    let path = repo_file("assets/testdata/pusht_gym_vectors.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("committed test vectors")).unwrap()
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn coverage_and_reward_match_shapely() {
    let v = vectors();
    let cases = v["coverage"].as_array().unwrap();
    assert!(cases.len() >= 1000);
    let (mut worst, mut nonzero) = (0.0f64, 0);
    for c in cases {
        let p = f64s(&c["pose"]);
        let ours = coverage(&Pose::new(p[0], p[1], p[2]), &GOAL);
        let theirs = c["coverage"].as_f64().unwrap();
        worst = worst.max((ours - theirs).abs());
        let reward = (ours / SUCCESS_THRESHOLD).clamp(0.0, 1.0);
        assert!((reward - c["reward"].as_f64().unwrap()).abs() < 1e-4 / SUCCESS_THRESHOLD + 1e-12);
        nonzero += (theirs > 0.0) as usize;
    }
    eprintln!(
        "{} poses ({nonzero} overlapping the goal): worst coverage error {worst:.2e}",
        cases.len()
    );
    assert!(
        nonzero > 400,
        "the vectors exercise partial overlaps ({nonzero})"
    );
    assert!(worst < 1e-4, "worst coverage error {worst}");
}

#[test]
fn keypoints_match_gym_order() {
    let v = vectors();
    for c in v["keypoints"].as_array().unwrap() {
        let p = f64s(&c["pose"]);
        let ours = keypoints(&Pose::new(p[0], p[1], p[2]));
        for (a, b) in ours.iter().zip(f64s(&c["keypoints"])) {
            assert!((a - b).abs() < 1e-6, "{ours:?} vs {:?}", c["keypoints"]);
        }
    }
}

#[test]
fn reset_to_state_observation_matches_legacy_quirk() {
    let v = vectors();
    let mut env = PushT::builder().build();
    for c in v["resets"].as_array().unwrap() {
        let s = f64s(&c["init_state"]);
        let obs = env
            .reset_to_state([s[0], s[1], s[2], s[3], s[4]], 0)
            .unwrap();
        let want = f64s(&c["obs"]);
        for (i, (a, b)) in obs.state.iter().zip(&want).enumerate() {
            assert!(
                (*a as f64 - b).abs() < 1e-3,
                "component {i}: {:?} vs {want:?} (init {s:?})",
                obs.state
            );
        }
    }
}

#[test]
fn free_space_agent_trajectories_match() {
    let v = vectors();
    let mut worst = 0.0f64;
    for c in v["free_space"].as_array().unwrap() {
        let s = f64s(&c["init_state"]);
        let mut env = PushT::builder().max_episode_steps(1000).build();
        env.reset_to_state([s[0], s[1], s[2], s[3], s[4]], 0)
            .unwrap();
        for (t, want) in c["targets"]
            .as_array()
            .unwrap()
            .iter()
            .zip(c["agent"].as_array().unwrap())
        {
            let t = f64s(t);
            env.advance([t[0], t[1]]);
            let want = f64s(want);
            let got = env.agent_pos();
            worst = worst
                .max((got[0] - want[0]).abs())
                .max((got[1] - want[1]).abs());
        }
    }
    eprintln!("free space: worst agent position error {worst:.2e} px");
    assert!(worst < 1e-3, "worst free-space agent error {worst} px");
}

/// Contact physics differs by engine (pymunk vs Rapier), so pushes agree statistically: the
/// block's final displacement and rotation are compared over scripted straight pushes.
#[test]
fn scripted_pushes_agree_statistically() {
    let v = vectors();
    let cases = v["pushes"].as_array().unwrap();
    let (mut disp_err, mut rel_err, mut rot_err, mut n) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for c in cases {
        let s = f64s(&c["init_state"]);
        let mut env = PushT::builder().max_episode_steps(1000).build();
        let obs0 = env
            .reset_to_state([s[0], s[1], s[2], s[3], s[4]], 0)
            .unwrap();
        for t in c["targets"].as_array().unwrap() {
            let t = f64s(t);
            env.step(&[t[0] as f32, t[1] as f32]).unwrap();
        }
        let theirs = f64s(c["obs"].as_array().unwrap().last().unwrap());
        let ours = env.true_state();
        let start = f64s(&c["reset_obs"]);
        let d_theirs = (theirs[2] - start[2]).hypot(theirs[3] - start[3]);
        let d_ours = (ours[2] - obs0.state[2] as f64).hypot(ours[3] - obs0.state[3] as f64);
        let err = (ours[2] - theirs[2]).hypot(ours[3] - theirs[3]);
        let mut dr = (ours[4] - theirs[4]).rem_euclid(std::f64::consts::TAU);
        if dr > std::f64::consts::PI {
            dr = std::f64::consts::TAU - dr;
        }
        disp_err.push(err);
        rel_err.push(err / d_theirs.max(1.0));
        rot_err.push(dr);
        n += 1;
        eprintln!(
            "push: theirs moved {d_theirs:7.2} px, ours {d_ours:7.2} px, end-pose error {err:6.2} px, {:5.1} deg",
            dr.to_degrees()
        );
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (md, mr, mrot) = (
        median(&mut disp_err),
        median(&mut rel_err),
        median(&mut rot_err),
    );
    eprintln!(
        "{n} pushes: median end-position error {md:.2} px, relative {mr:.3}, rotation {:.2} deg",
        mrot.to_degrees()
    );
    assert!(n >= 50);
    assert!(mr < 0.05, "median relative displacement error {mr}");
    assert!(
        mrot.to_degrees() < 2.0,
        "median rotation error {} deg",
        mrot.to_degrees()
    );
}
