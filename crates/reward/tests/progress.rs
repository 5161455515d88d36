//! The progress model end to end on a synthetic task: states move from a random start towards
//! a goal; successful episodes reach it. Learns progress that orders time (VOC), separates
//! successes from failures, round-trips through its folder, and names bad input.

use diffrl_core::episode::Episode;
use diffrl_core::seeding::rng;
use diffrl_core::space::Observation;
use diffrl_core::stages::StagePredicates;
use diffrl_policy::config::ImageEncoderConfig;
use diffrl_policy::{CpuAutodiff, CpuBackend};
use diffrl_reward::RewardError;
use diffrl_reward::labels::LabelKind;
use diffrl_reward::progress::{self, ProgressConfig, ProgressInput};
use rand::Rng;

/// Stage 1: x > 0.5; stage 2: x > 0.9 (the goal).
struct Line;
impl StagePredicates for Line {
    fn names(&self) -> Vec<String> {
        vec!["halfway".into(), "goal".into()]
    }
    fn completed(&self, s: &[f32]) -> usize {
        usize::from(s[0] > 0.5) + usize::from(s[0] > 0.9)
    }
}

fn episodes(n: usize, seed: u64) -> Vec<Episode> {
    let mut r = rng(seed);
    (0..n)
        .map(|i| {
            let success = i % 3 != 0;
            let start: f32 = r.random_range(0.0..0.2);
            let end: f32 = if success {
                0.95
            } else {
                r.random_range(0.3..0.6)
            };
            let len = r.random_range(20..40);
            let mut ep = Episode::default();
            for t in 0..len {
                let x = start + (end - start) * t as f32 / (len - 1) as f32;
                let y: f32 = r.random_range(-1.0..1.0);
                ep.push(
                    Observation::state(vec![x, y]),
                    vec![0.0],
                    0.0,
                    x,
                    success && t + 1 == len,
                );
            }
            ep
        })
        .collect()
}

fn cfg(labels: LabelKind) -> ProgressConfig {
    ProgressConfig {
        labels,
        hidden: vec![32, 32],
        steps: 400,
        batch_size: 64,
        lr: 3e-3,
        context: 1,
        context_stride: 1,
        ..ProgressConfig::default()
    }
}

#[test]
fn learns_progress_that_orders_time_and_outcomes() {
    let eps = episodes(60, 1);
    for labels in [LabelKind::Stages, LabelKind::Time] {
        let model = progress::train::<CpuAutodiff>(
            &eps,
            Some(&Line),
            &cfg(labels),
            &Default::default(),
            &mut |_, _| {},
        )
        .unwrap();
        let test = episodes(30, 2);
        let refs: Vec<&Episode> = test.iter().collect();
        let m = progress::evaluate(&model, &refs).unwrap();
        assert!(m.voc > 0.9, "{labels:?}: {m:?}");
        assert!(m.success_auroc.unwrap() > 0.9, "{labels:?}: {m:?}");
        assert!(m.pairwise_accuracy.unwrap() > 0.9, "{labels:?}: {m:?}");
    }
}

/// Out and back: x rises from 0 to 1 in the first half and falls to 0.2 in the second, so a
/// state alone does not say whether the episode is early or late; the direction of motion does.
fn out_and_back(n: usize, seed: u64) -> Vec<Episode> {
    let mut r = rng(seed);
    (0..n)
        .map(|_| {
            let len = r.random_range(30..50);
            let mut ep = Episode::default();
            for t in 0..len {
                let u = t as f32 / (len - 1) as f32;
                let x = if u < 0.5 {
                    2.0 * u
                } else {
                    1.0 - 1.6 * (u - 0.5)
                };
                let y: f32 = r.random_range(-0.05..0.05);
                ep.push(
                    Observation::state(vec![x, y]),
                    vec![0.0],
                    0.0,
                    x,
                    t + 1 == len,
                );
            }
            ep
        })
        .collect()
}

#[test]
fn context_orders_what_a_single_state_cannot() {
    let eps = out_and_back(40, 5);
    let test = out_and_back(20, 6);
    let refs: Vec<&Episode> = test.iter().collect();
    let voc_with = |context: usize| {
        let c = ProgressConfig {
            context,
            context_stride: 3,
            holdout_every: 0,
            rank_weight: 0.0,
            ..cfg(LabelKind::Time)
        };
        let model =
            progress::train::<CpuAutodiff>(&eps, None, &c, &Default::default(), &mut |_, _| {})
                .unwrap();
        (progress::evaluate(&model, &refs).unwrap().voc, model)
    };
    let (alone, _) = voc_with(1);
    let (with, model) = voc_with(2);
    assert!(
        alone < 0.7,
        "a single state orders the return trip: VOC {alone}"
    );
    assert!(with > 0.9, "two states 3 steps apart: VOC {with}");
    // Causal: Phi(s_t) reads s_t and earlier states only, so a prefix gives the same values.
    let states: Vec<&[f32]> = test[0]
        .observations
        .iter()
        .map(|o| o.state.as_slice())
        .collect();
    let full = model.predict(&states).unwrap();
    assert_eq!(model.predict(&states[..10]).unwrap(), full[..10]);
    // The context survives a save/load round trip.
    let d = tempfile_dir("context");
    progress::save(&model, &d).unwrap();
    let back = progress::load::<CpuBackend>(&d, &Default::default()).unwrap();
    assert_eq!(back.predict(&states).unwrap(), full);
    let bad = ProgressConfig {
        context: 0,
        ..cfg(LabelKind::Time)
    };
    let e = progress::train::<CpuAutodiff>(&eps, None, &bad, &Default::default(), &mut |_, _| {})
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("context"), "{e}");
}

/// `episodes` seen through a 16 x 16 camera: a bright 2 x 2 spot at x (columns) on a dark
/// background whose rows carry the noise dimension y; the state vector is kept for the labels.
fn with_images(eps: &[Episode]) -> Vec<Episode> {
    const S: usize = 16;
    let pixels = |s: &[f32]| {
        let mut data = vec![20u8; S * S * 3];
        let col = ((s[0].clamp(0.0, 1.0) * (S - 2) as f32).round() as usize).min(S - 2);
        let row = (((s[1] + 1.0) / 2.0 * (S - 2) as f32).round() as usize).min(S - 2);
        for (r, c) in [
            (row, col),
            (row, col + 1),
            (row + 1, col),
            (row + 1, col + 1),
        ] {
            data[(r * S + c) * 3..(r * S + c) * 3 + 3].fill(250);
        }
        diffrl_core::space::ImageObs {
            height: S as u32,
            width: S as u32,
            data,
        }
    };
    eps.iter()
        .cloned()
        .map(|mut ep| {
            for o in &mut ep.observations {
                o.image = Some(pixels(&o.state));
            }
            ep
        })
        .collect()
}

#[test]
fn image_model_learns_progress_from_pixels() {
    let eps = with_images(&episodes(60, 1));
    let c = ProgressConfig {
        input: ProgressInput::Image,
        image_encoder: ImageEncoderConfig {
            channels: vec![8],
            groups: 4,
            keypoints: 4,
            out_dim: 8,
            ..ImageEncoderConfig::default()
        },
        batch_size: 32,
        steps: 150,
        context: 2,
        context_stride: 2,
        ..cfg(LabelKind::Stages)
    };
    let model =
        progress::train::<CpuAutodiff>(&eps, Some(&Line), &c, &Default::default(), &mut |_, _| {})
            .unwrap();
    let test = with_images(&episodes(30, 2));
    let refs: Vec<&Episode> = test.iter().collect();
    let m = progress::evaluate(&model, &refs).unwrap();
    assert!(m.voc > 0.9, "{m:?}");
    assert!(m.success_auroc.unwrap() > 0.9, "{m:?}");
    // Round trip; then what an image model refuses.
    let d = tempfile_dir("image");
    progress::save(&model, &d).unwrap();
    let back = progress::load::<CpuBackend>(&d, &Default::default()).unwrap();
    let obs: Vec<&Observation> = test[0].observations.iter().collect();
    assert_eq!(
        back.predict_obs(&obs).unwrap(),
        model.predict_obs(&obs).unwrap()
    );
    let e = back.predict(&[&[0.1, 0.2]]).err().unwrap().to_string();
    assert!(e.contains("reads images"), "{e}");
    let bare = Observation::state(vec![0.1, 0.2]);
    match back.predict_obs(&[obs[0], &bare]) {
        Err(RewardError::Shape { what, got, .. }) => {
            assert!(
                what.contains("observation 1") && got.contains("no image"),
                "{what} {got}"
            )
        }
        other => panic!("{other:?}"),
    }
    let mut small = obs[0].clone();
    small.image = Some(diffrl_core::space::ImageObs {
        height: 8,
        width: 8,
        data: vec![0; 8 * 8 * 3],
    });
    match back.predict_obs(&[&small]) {
        Err(RewardError::Shape { expected, got, .. }) => {
            assert!(
                expected.contains("16 x 16") && got.contains("8 x 8"),
                "{expected} {got}"
            )
        }
        other => panic!("{other:?}"),
    }
    // Training an image model on episodes without images names the problem.
    let e = progress::train::<CpuAutodiff>(
        &episodes(5, 3),
        Some(&Line),
        &c,
        &Default::default(),
        &mut |_, _| {},
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("no images"), "{e}");
}

#[test]
fn save_load_round_trip_and_bad_input() {
    let eps = episodes(20, 3);
    let model = progress::train::<CpuAutodiff>(
        &eps,
        Some(&Line),
        &ProgressConfig {
            steps: 20,
            ..cfg(LabelKind::Stages)
        },
        &Default::default(),
        &mut |_, _| {},
    )
    .unwrap();
    let d = tempfile_dir("round-trip");
    progress::save(&model, &d).unwrap();
    let back = progress::load::<CpuBackend>(&d, &Default::default()).unwrap();
    let s: [&[f32]; 2] = [&[0.1, 0.2], &[0.8, -0.3]];
    assert_eq!(model.predict(&s).unwrap(), back.predict(&s).unwrap());
    // A folder written before the context existed reads as one state (its training setting).
    let meta_path = d.join("reward.json");
    let mut meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&meta_path).unwrap()).unwrap();
    let config = meta["config"].as_object_mut().unwrap();
    config.remove("context");
    config.remove("context_stride");
    std::fs::write(&meta_path, meta.to_string()).unwrap();
    let old = progress::load::<CpuBackend>(&d, &Default::default()).unwrap();
    assert_eq!(old.meta.config.context, 1);
    assert_eq!(model.predict(&s).unwrap(), old.predict(&s).unwrap());
    // Settings that cannot build a network are a checkpoint error naming the file.
    meta["config"]["context"] = serde_json::json!(0);
    std::fs::write(&meta_path, meta.to_string()).unwrap();
    let e = progress::load::<CpuBackend>(&d, &Default::default())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("reward.json") && e.contains("context"), "{e}");
    // Another observation space.
    match back.predict(&[&[0.1, 0.2, 0.3]]) {
        Err(RewardError::Shape { expected, .. }) => assert!(expected.contains("2 values")),
        other => panic!("{other:?}"),
    }
    // A NaN input gives a NaN output: an error naming the batch element.
    match back.predict(&[&[0.1, 0.2], &[f32::NAN, 0.0]]) {
        Err(RewardError::NonFinite { index, .. }) => assert_eq!(index, 1),
        other => panic!("{other:?}"),
    }
    // Not a reward-model folder; a corrupt one.
    let e = progress::load::<CpuBackend>(&d.join("nope"), &Default::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("reward.json") && e.contains("diffrl reward train"),
        "{e}"
    );
    std::fs::write(d.join("reward.json"), "{").unwrap();
    let e = progress::load::<CpuBackend>(&d, &Default::default())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("invalid JSON"), "{e}");
    // Bad settings.
    let bad = ProgressConfig {
        stage_budgets: vec![0.9, 0.9],
        ..cfg(LabelKind::Stages)
    };
    let e = progress::train::<CpuAutodiff>(
        &eps,
        Some(&Line),
        &bad,
        &Default::default(),
        &mut |_, _| {},
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("stage_budgets"), "{e}");
    std::fs::remove_dir_all(&d).ok();
}

fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("diffrl-reward-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// Episodes where the instruction decides what progress a state means: "go right" moves x
/// from 0 to 1, "move to the left" from 1 to 0 (time labels), so x alone is ambiguous.
fn told_episodes(n: usize, seed: u64) -> Vec<Episode> {
    let mut r = rng(seed);
    (0..n)
        .map(|i| {
            let right = i % 2 == 0;
            let len = r.random_range(20..30);
            let mut ep = Episode {
                task: Some(
                    if right {
                        "go right"
                    } else {
                        "move to the left"
                    }
                    .into(),
                ),
                ..Episode::default()
            };
            for t in 0..len {
                let f = t as f32 / (len - 1) as f32;
                let x = if right { f } else { 1.0 - f };
                let y: f32 = r.random_range(-1.0..1.0);
                ep.push(
                    Observation::state(vec![x, y]),
                    vec![0.0],
                    0.0,
                    f,
                    t + 1 == len,
                );
            }
            ep
        })
        .collect()
}

#[test]
fn a_model_that_reads_the_instruction_tells_apart_what_the_state_cannot() {
    let eps = told_episodes(40, 5);
    let held = told_episodes(20, 6);
    let voc_of = |model: &progress::ProgressModel<CpuBackend>, right: bool| {
        let sel: Vec<&Episode> = held
            .iter()
            .filter(|e| (e.task.as_deref() == Some("go right")) == right)
            .collect();
        progress::evaluate(model, &sel).unwrap().voc
    };
    let train = |text: bool| {
        let c = ProgressConfig {
            text,
            holdout_every: 0,
            rank_weight: 0.0,
            ..cfg(LabelKind::Time)
        };
        progress::train::<CpuAutodiff>(&eps, None, &c, &Default::default(), &mut |_, _| {}).unwrap()
    };
    let told = train(true);
    let blind = train(false);
    for right in [true, false] {
        assert!(
            voc_of(&told, right) > 0.9,
            "told, right = {right}: {}",
            voc_of(&told, right)
        );
    }
    // Without the instruction one direction must be read backwards.
    assert!(
        voc_of(&blind, true).min(voc_of(&blind, false)) < 0.5,
        "blind: {} {}",
        voc_of(&blind, true),
        voc_of(&blind, false)
    );

    // The folder round trip keeps the encoding; a text on the observation wins over the task.
    let d = tempfile::tempdir().unwrap();
    progress::save(&told, d.path()).unwrap();
    let back = progress::load::<CpuBackend>(d.path(), &Default::default()).unwrap();
    let ep = &held[0];
    assert_eq!(
        told.episode_progress(ep).unwrap(),
        back.episode_progress(ep).unwrap()
    );
    let mut o = ep.observations[0].clone();
    o.text = Some("go right".into());
    assert_eq!(
        back.predict_obs(&[&o]).unwrap(),
        back.predict_obs_with_task(&[&ep.observations[0]], Some("go right"))
            .unwrap()
    );

    // No instruction, an unknown word, too many words: errors that say so.
    let e = back
        .predict_obs(&[&ep.observations[0]])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("observation 0") && e.contains("no instruction"),
        "{e}"
    );
    o.text = Some("go up".into());
    let e = back.predict_obs(&[&o]).unwrap_err().to_string();
    assert!(e.contains("unknown word \"up\""), "{e}");
    o.text = Some("go right and then move to the left".into());
    let e = back.predict_obs(&[&o]).unwrap_err().to_string();
    assert!(e.contains("at most 4"), "{e}");
    // State vectors alone are refused: the model needs the instruction.
    let e = back.predict(&[&[0.5, 0.0]]).unwrap_err().to_string();
    assert!(e.contains("instruction"), "{e}");
}

/// The same ambiguity seen through the camera: an image model that also reads the instruction
/// orders both directions (without it one direction fails), and its folder round trip keeps
/// its predictions.
#[test]
fn an_image_model_reads_the_instruction_too() {
    let eps = with_images(&told_episodes(40, 5));
    let held = with_images(&told_episodes(10, 6));
    let c = ProgressConfig {
        input: ProgressInput::Image,
        image_encoder: ImageEncoderConfig {
            channels: vec![8],
            groups: 4,
            keypoints: 4,
            out_dim: 8,
            ..ImageEncoderConfig::default()
        },
        text: true,
        batch_size: 32,
        steps: 150,
        holdout_every: 0,
        rank_weight: 0.0,
        ..cfg(LabelKind::Time)
    };
    let model = progress::train::<CpuAutodiff>(&eps, None, &c, &Default::default(), &mut |_, _| {})
        .unwrap();
    for right in [true, false] {
        let sel: Vec<&Episode> = held
            .iter()
            .filter(|e| (e.task.as_deref() == Some("go right")) == right)
            .collect();
        let m = progress::evaluate(&model, &sel).unwrap();
        assert!(m.voc > 0.9, "right = {right}: {m:?}");
    }
    let d = tempfile_dir("image-text");
    progress::save(&model, &d).unwrap();
    let back = progress::load::<CpuBackend>(&d, &Default::default()).unwrap();
    assert_eq!(
        back.episode_progress(&held[1]).unwrap(),
        model.episode_progress(&held[1]).unwrap()
    );
}
