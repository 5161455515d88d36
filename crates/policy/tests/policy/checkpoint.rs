//! Checkpoints: save -> load gives identical actions; broken checkpoints give clear errors.

use crate::common;

use common::*;
use diffrl_core::seeding::rng;
use diffrl_policy::checkpoint::{self, META_FILE, WEIGHTS_FILE};
use diffrl_policy::config::PolicyKind;
use diffrl_policy::{CheckpointError, Policy, SampleMode};

fn actions(p: &Policy<B>, seed: u64) -> Vec<f32> {
    p.act(
        None,
        &obs(3),
        SampleMode::Stochastic,
        false,
        &mut rng(seed),
        &Default::default(),
    )
    .unwrap()
    .actions
}

#[test]
fn save_load_gives_identical_actions() {
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    for kind in [PolicyKind::Diffusion, PolicyKind::Gaussian] {
        let mut cfg = tiny_config(3);
        cfg.kind = kind;
        let p = Policy::<B>::new(cfg, spec(), norm(), 8, &device).unwrap();
        let path = dir.path().join(format!("{kind:?}"));
        checkpoint::save(&p, &path, serde_json::json!({"step": 7})).unwrap();
        // Saving again over an existing checkpoint replaces it atomically.
        checkpoint::save(&p, &path, serde_json::json!({"step": 7})).unwrap();
        let (q, info) = checkpoint::load::<B>(&path, &device).unwrap();
        assert_eq!(info["step"], 7);
        assert_eq!(actions(&p, 5), actions(&q, 5), "{kind:?}");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "temporary folders left behind");
    }
}

/// A policy fine-tuned on the last K' < K steps runs its base network for the steps before them,
/// as its rollouts did, and its checkpoint keeps the base.
#[test]
fn a_fine_tuned_policy_keeps_the_network_that_ran_its_early_steps() {
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    let base = Policy::<B>::new(tiny_config(4), spec(), norm(), 1, &device).unwrap();
    let tuned = Policy::<B>::new(tiny_config(4), spec(), norm(), 2, &device)
        .unwrap()
        .with_fine_tuned_steps(2)
        .unwrap();
    assert!(tuned.splits_chain() && !base.splits_chain());
    let with_frozen = |p: &Policy<B>| {
        p.act(
            Some(&base.model),
            &obs(3),
            SampleMode::Stochastic,
            false,
            &mut rng(5),
            &device,
        )
        .unwrap()
        .actions
    };
    let deployed = tuned.clone().with_base(base.model.clone());
    // Without a frozen copy handed in, the base runs the early steps: the rollouts' chain.
    assert_eq!(actions(&deployed, 5), with_frozen(&tuned));
    assert_ne!(
        actions(&tuned, 5),
        with_frozen(&tuned),
        "the base changed nothing"
    );
    let path = dir.path().join("tuned");
    checkpoint::save(&deployed, &path, serde_json::Value::Null).unwrap();
    assert!(path.join(checkpoint::BASE_FILE).exists());
    let (loaded, _) = checkpoint::load::<B>(&path, &device).unwrap();
    assert!(loaded.base().is_some());
    assert_eq!(actions(&loaded, 5), actions(&deployed, 5));
    // A checkpoint without a base (behaviour cloning) writes no base file.
    checkpoint::save(&base, &dir.path().join("bc"), serde_json::Value::Null).unwrap();
    assert!(!dir.path().join("bc").join(checkpoint::BASE_FILE).exists());
    // A truncated base file is an error that names it.
    let b = std::fs::read(path.join(checkpoint::BASE_FILE)).unwrap();
    std::fs::write(path.join(checkpoint::BASE_FILE), &b[..b.len() / 2]).unwrap();
    let e = checkpoint::load::<B>(&path, &device).unwrap_err();
    assert!(e.to_string().contains(checkpoint::BASE_FILE), "{e}");
}

#[test]
fn broken_checkpoints_are_named_errors() {
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    let p = Policy::<B>::new(tiny_config(3), spec(), norm(), 0, &device).unwrap();
    let path = dir.path().join("ckpt");
    checkpoint::save(&p, &path, serde_json::Value::Null).unwrap();

    // Missing folder.
    let e = checkpoint::load::<B>(&dir.path().join("nope"), &device).unwrap_err();
    assert!(matches!(e, CheckpointError::Io { .. }), "{e}");

    // Truncated weights.
    let w = std::fs::read(path.join(WEIGHTS_FILE)).unwrap();
    std::fs::write(path.join(WEIGHTS_FILE), &w[..w.len() / 2]).unwrap();
    let e = checkpoint::load::<B>(&path, &device).unwrap_err();
    assert!(
        e.to_string().contains(WEIGHTS_FILE),
        "error should name the weights file: {e}"
    );
    std::fs::write(path.join(WEIGHTS_FILE), &w).unwrap();

    // A config that describes another architecture than the weights.
    let meta = std::fs::read_to_string(path.join(META_FILE)).unwrap();
    let wider = meta.replace("\"hidden\": 16", "\"hidden\": 32");
    assert_ne!(wider, meta);
    std::fs::write(path.join(META_FILE), &wider).unwrap();
    let e = checkpoint::load::<B>(&path, &device).unwrap_err();
    assert!(matches!(e, CheckpointError::Mismatch { .. }), "{e}");

    // An invalid config (K' > K).
    let bad = meta.replace("\"ft_denoising_steps\": 0", "\"ft_denoising_steps\": 9");
    std::fs::write(path.join(META_FILE), &bad).unwrap();
    let e = checkpoint::load::<B>(&path, &device)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ft_denoising_steps") && e.contains("exceeds"),
        "{e}"
    );

    // Not JSON at all.
    std::fs::write(path.join(META_FILE), "{ not json").unwrap();
    let e = checkpoint::load::<B>(&path, &device).unwrap_err();
    assert!(matches!(e, CheckpointError::Meta { .. }), "{e}");
}
