//! Language-conditioned policies: instructions reach the actions, checkpoints keep the
//! vocabulary (and refuse a missing or mismatched one), policies without text are unchanged.

use crate::common;

use common::*;
use diffrl_core::seeding::rng;
use diffrl_policy::checkpoint::{self, META_FILE, VOCAB_FILE};
use diffrl_policy::config::{PolicyKind, TextEncoderConfig};
use diffrl_policy::{CheckpointError, ObsBatch, Policy, PolicyError, SampleMode, Vocabulary};

fn text_config(kind: PolicyKind) -> diffrl_policy::PolicyConfig {
    let mut cfg = tiny_config(3);
    cfg.kind = kind;
    cfg.encoder.text = TextEncoderConfig {
        max_tokens: 4,
        d_model: 8,
        heads: 2,
        ff_dim: 16,
        out_dim: 4,
        ..TextEncoderConfig::default()
    };
    cfg
}

fn vocab() -> Vocabulary {
    Vocabulary::from_texts(["push the red cube", "push the blue cube"])
}

fn text_policy(kind: PolicyKind, seed: u64) -> Policy<B> {
    let spec = diffrl_policy::PolicySpec {
        text: true,
        ..spec()
    };
    Policy::<B>::with_text(
        text_config(kind),
        spec,
        norm(),
        vocab(),
        seed,
        &Default::default(),
    )
    .unwrap()
}

fn with_text(b: usize, text: &str) -> ObsBatch {
    ObsBatch {
        text: Some(vec![text.to_owned(); b]),
        ..obs(b)
    }
}

fn actions(p: &Policy<B>, obs: &ObsBatch, seed: u64) -> Result<Vec<f32>, PolicyError> {
    p.act(
        None,
        obs,
        SampleMode::Deterministic,
        false,
        &mut rng(seed),
        &Default::default(),
    )
    .map(|a| a.actions)
}

#[test]
fn the_instruction_changes_the_actions() {
    for kind in [PolicyKind::Diffusion, PolicyKind::Gaussian] {
        let p = text_policy(kind, 4);
        let red = actions(&p, &with_text(2, "push the red cube"), 1).unwrap();
        let blue = actions(&p, &with_text(2, "Push the BLUE cube."), 1).unwrap();
        assert_ne!(red, blue, "{kind:?}");
    }
}

#[test]
fn bad_instructions_are_refused_by_name() {
    let p = text_policy(PolicyKind::Diffusion, 4);
    let none = actions(&p, &obs(2), 1).unwrap_err().to_string();
    assert!(none.contains("no text instruction"), "{none}");
    let mut o = with_text(2, "push the red cube");
    o.text.as_mut().unwrap()[1] = "push the green cube".into();
    let e = actions(&p, &o, 1).unwrap_err().to_string();
    assert!(e.contains("row 1") && e.contains("'green'"), "{e}");
    let e = actions(&p, &with_text(2, ""), 1).unwrap_err().to_string();
    assert!(e.contains("empty"), "{e}");
    let e = actions(&p, &with_text(2, "push the red cube now"), 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("5 words") && e.contains("max_tokens = 4"), "{e}");
    // A text spec needs a vocabulary, and only a text spec takes one.
    let device = Default::default();
    let text_spec = diffrl_policy::PolicySpec {
        text: true,
        ..spec()
    };
    assert!(
        Policy::<B>::new(
            text_config(PolicyKind::Diffusion),
            text_spec,
            norm(),
            0,
            &device
        )
        .is_err()
    );
    assert!(Policy::<B>::with_text(tiny_config(3), spec(), norm(), vocab(), 0, &device).is_err());
}

#[test]
fn text_checkpoints_round_trip_and_keep_their_vocabulary() {
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    let o = with_text(3, "push the blue cube");
    for kind in [PolicyKind::Diffusion, PolicyKind::Gaussian] {
        let p = text_policy(kind, 8);
        let path = dir.path().join(format!("{kind:?}"));
        checkpoint::save(&p, &path, serde_json::json!({})).unwrap();
        let (q, _) = checkpoint::load::<B>(&path, &device).unwrap();
        assert_eq!(
            actions(&p, &o, 5).unwrap(),
            actions(&q, &o, 5).unwrap(),
            "{kind:?}"
        );
        assert_eq!(q.tokenizer().unwrap().vocabulary(), &vocab());
        let meta = std::fs::read_to_string(path.join(META_FILE)).unwrap();
        assert!(meta.contains(r#""text": true"#), "{meta}");
        // Non-default text settings are written out with the config.
        assert!(meta.contains(r#""max_tokens": 4"#), "{meta}");
    }
}

#[test]
fn missing_corrupt_or_mismatched_vocabularies_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    let path = dir.path().join("p");
    let save = || {
        checkpoint::save(
            &text_policy(PolicyKind::Diffusion, 2),
            &path,
            serde_json::json!({}),
        )
        .unwrap()
    };
    let load_err = || match checkpoint::load::<B>(&path, &device) {
        Err(e @ CheckpointError::Vocabulary { .. }) => e.to_string(),
        Err(e) => panic!("expected a vocabulary error, got {e}"),
        Ok(_) => panic!("expected a vocabulary error, the checkpoint loaded"),
    };
    save();
    std::fs::remove_file(path.join(VOCAB_FILE)).unwrap();
    let e = load_err();
    assert!(e.contains(VOCAB_FILE) && e.contains("missing"), "{e}");

    save();
    std::fs::write(path.join(VOCAB_FILE), "{\"tokens\": [\"go\"").unwrap();
    let e = load_err();
    assert!(
        e.contains(VOCAB_FILE) && e.contains("not a diffrl vocabulary"),
        "{e}"
    );

    save();
    let other = Vocabulary::from_texts(["push the red cube", "push the blue cube", "then stop"]);
    std::fs::write(path.join(VOCAB_FILE), serde_json::to_vec(&other).unwrap()).unwrap();
    let e = load_err();
    assert!(
        e.contains(VOCAB_FILE) && e.contains("holds 9 tokens") && e.contains("7 rows"),
        "{e}"
    );
}

/// Policies without text write what they wrote before text existed: no vocabulary file, no
/// `text` key in the spec, no text encoder section in the config; they ignore instructions.
#[test]
fn state_only_checkpoints_are_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    let p = Policy::<B>::new(tiny_config(3), spec(), norm(), 8, &device).unwrap();
    let path = dir.path().join("p");
    checkpoint::save(&p, &path, serde_json::json!({})).unwrap();
    assert!(!path.join(VOCAB_FILE).exists());
    let meta = std::fs::read_to_string(path.join(META_FILE)).unwrap();
    assert!(!meta.contains("text"), "{meta}");
    let (q, _) = checkpoint::load::<B>(&path, &device).unwrap();
    assert!(q.tokenizer().is_none());
    assert_eq!(
        actions(&q, &obs(2), 3).unwrap(),
        actions(&q, &with_text(2, "anything at all"), 3).unwrap()
    );
}
