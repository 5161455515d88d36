//! The shipped expert dataset is what its recorded command produces with this simulator.

mod common;

use diffrl_core::Env;
use diffrl_core::lerobot::read_dataset;
use diffrl_core::seeding::derive;
use diffrl_pusht::PushT;

#[test]
fn shipped_dataset_replays_exactly_from_its_seeds() {
    let ds = read_dataset(&common::repo_file("assets/pusht_expert_200"))
        .expect("assets/pusht_expert_200 is a readable LeRobot v3.0 dataset");
    let eps = ds.episodes("observation.state").unwrap();
    assert!(eps.len() >= 200, "{} episodes", eps.len());
    let prov = &ds.info["diffrl"]["provenance"];
    assert_eq!(
        prov["command"],
        "diffrl demos pusht --episodes 200 --seed 0"
    );
    let seed = prov["seed"].as_u64().unwrap();
    // The stored summary is the dataset's own success rate.
    let summary = &ds.info["diffrl"]["summary"];
    let successes = eps.iter().filter(|e| e.success()).count();
    assert_eq!(summary["successes"].as_u64().unwrap() as usize, successes);
    assert!(
        successes * 2 > eps.len(),
        "mostly successful: {successes}/{}",
        eps.len()
    );
    for i in [0usize, 1, 57, 199] {
        let ep = &eps[i];
        let mut env = PushT::builder().build();
        env.reset(derive(seed, i as u64));
        for (t, (obs, a)) in ep.observations.iter().zip(&ep.actions).enumerate() {
            for (x, y) in obs.state.iter().zip(env.true_state()) {
                assert!(
                    (*x as f64 - y).abs() < 1e-3,
                    "episode {i} step {t}: {:?} vs {:?}",
                    obs.state,
                    env.true_state()
                );
            }
            let r = env.step(a).unwrap();
            assert_eq!(r.info.success, ep.successes[t], "episode {i} step {t}");
        }
    }
}
