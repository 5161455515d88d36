//! Chain sampling and step-wise likelihoods against independent closed-form computations
//! (docs/algorithms.md §1–2).

use crate::common;

use burn::tensor::{Tensor, TensorData};
use common::*;
use diffrl_core::seeding::rng;
use diffrl_policy::config::ImageEncoderKind;
use diffrl_policy::diffusion::step_logp;
use diffrl_policy::schedule::{Prediction, Schedule, chain_timesteps};
use diffrl_policy::{ObsBatch, Policy, PolicyModel, SampleMode};

const LN_2PI: f64 = 1.837_877_066_409_345_5;

#[test]
fn step_logp_is_the_closed_form_gaussian() {
    let device = Default::default();
    let (b, tp, da, ta) = (3, 4, 2, 2);
    let n = b * tp * da;
    let x: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.05)
        .collect();
    let mu: Vec<f32> = (0..n)
        .map(|i| ((i * 17 % 13) as f32 - 6.0) * 0.04)
        .collect();
    for std in [0.1, 0.37, 1.0] {
        let got = to_vec(step_logp::<B>(
            Tensor::from_data(TensorData::new(x.clone(), [b, tp, da]), &device),
            Tensor::from_data(TensorData::new(mu.clone(), [b, tp, da]), &device),
            std,
            ta,
            [-5.0, 2.0],
        ));
        for (i, g) in got.iter().enumerate() {
            let mut acc = 0.0;
            for t in 0..ta {
                for d in 0..da {
                    let j = (i * tp + t) * da + d;
                    let z = (f64::from(x[j]) - f64::from(mu[j])) / std;
                    let lp = -0.5 * z * z - std.ln() - 0.5 * LN_2PI;
                    acc += lp.clamp(-5.0, 2.0);
                }
            }
            let want = acc / (ta * da) as f64;
            assert!(
                (f64::from(*g) - want).abs() < 1e-5,
                "std {std} row {i}: {g} vs {want}"
            );
        }
    }
}

/// Every denoiser target the chain supports.
const PREDICTIONS: [Prediction; 3] = [
    Prediction::Epsilon,
    Prediction::Sample,
    Prediction::VPrediction,
];

/// Reference DDIM step written from docs/algorithms.md §1 directly, in f64; `out` is the
/// network's output, the noise, (sample prediction) the clean chunk or (v prediction) the
/// velocity.
fn reference_mean(
    x: &[f32],
    out: &[f32],
    a: f64,
    ap: f64,
    eta: f64,
    prediction: Prediction,
) -> (Vec<f64>, f64) {
    let sigma = eta * ((1.0 - ap) / (1.0 - a) * (1.0 - a / ap)).sqrt();
    let mu = x
        .iter()
        .zip(out)
        .map(|(&x, &o)| {
            let (x, o) = (f64::from(x), f64::from(o));
            let x0 = match prediction {
                Prediction::Epsilon => (x - (1.0 - a).sqrt() * o) / a.sqrt(),
                Prediction::Sample => o,
                Prediction::VPrediction => a.sqrt() * x - (1.0 - a).sqrt() * o,
            }
            .clamp(-1.0, 1.0);
            let e2 = (x - a.sqrt() * x0) / (1.0 - a).sqrt();
            ap.sqrt() * x0 + (1.0 - ap - sigma * sigma).max(0.0).sqrt() * e2
        })
        .collect();
    (mu, sigma)
}

/// Runs the chain with the policy, then replays every step with the reference formulas on the
/// network's own outputs; returns the max deviation of means and log-probs.
/// Samples a chain and recomputes it in f64: (largest deviation of the deterministic chain's
/// steps from the DDIM mean, of the recorded log-probs from the closed form with the clamp's
/// upper bound at max(2, peak density at the floor), of the same from the closed form with the
/// upper bound at 2 as given).
fn replay(mode: SampleMode, eta: f64, prediction: Prediction, floor: f64) -> (f64, f64, f64) {
    let device = Default::default();
    let mut cfg = tiny_config(5);
    cfg.diffusion.min_sampling_std = floor;
    cfg.diffusion.min_logprob_std = floor;
    cfg.diffusion.prediction = prediction;
    cfg.diffusion.eta = eta;
    cfg.diffusion.eval_eta = eta;
    let policy = Policy::<B>::new(cfg.clone(), spec(), norm(), 3, &device).unwrap();
    let o = obs(3);
    let act = policy
        .act(None, &o, mode, true, &mut rng(11), &device)
        .unwrap();
    let chain = to_vec(act.sample.chain.clone().unwrap());
    let logp = to_vec(act.sample.logp.clone().unwrap());
    let PolicyModel::Diffusion(model) = &policy.model else {
        unreachable!()
    };
    let obs_t = policy.obs_tensors(&o, &device).unwrap();
    let cond = model.encoder.forward(&obs_t);
    let sched = Schedule::new(cfg.diffusion.schedule, cfg.diffusion.train_steps);
    let ts = chain_timesteps(cfg.diffusion.train_steps, 5);
    let (b, k, tp, da) = (3, 5, 4, 2);
    let per = tp * da;
    let (mut dmu, mut dlp, mut dlp_cut) = (0.0f64, 0.0f64, 0.0f64);
    let hi = (-floor.ln() - 0.5 * LN_2PI).max(2.0);
    for (i, &t) in ts.iter().enumerate() {
        let rows = |s: usize| -> Vec<f32> {
            (0..b)
                .flat_map(|bi| {
                    chain[(bi * (k + 1) + s) * per..(bi * (k + 1) + s + 1) * per].to_vec()
                })
                .collect()
        };
        let (x, next) = (rows(i), rows(i + 1));
        let eps = to_vec(model.denoiser.forward(
            Tensor::from_data(TensorData::new(x.clone(), [b, tp, da]), &device),
            Tensor::full([b], t as f32, &device),
            cond.clone(),
        ));
        let a = sched.abar(t as i64);
        let ap = sched.abar(t as i64 - 2);
        let (mu, sigma) = reference_mean(&x, &eps, a, ap, eta, prediction);
        if mode == SampleMode::Deterministic {
            for (m, n) in mu.iter().zip(&next) {
                dmu = dmu.max((m - f64::from(*n)).abs());
            }
        }
        let std = sigma.max(floor);
        for bi in 0..b {
            let (mut acc, mut cut) = (0.0, 0.0);
            for j in 0..2 * da {
                let idx = bi * per + j;
                let z = (f64::from(next[idx]) - mu[idx]) / std;
                let lp = -0.5 * z * z - std.ln() - 0.5 * LN_2PI;
                acc += lp.clamp(-5.0, hi);
                cut += lp.clamp(-5.0, 2.0);
            }
            let got = f64::from(logp[bi * k + i]);
            dlp = dlp.max((acc / (2 * da) as f64 - got).abs());
            dlp_cut = dlp_cut.max((cut / (2 * da) as f64 - got).abs());
        }
    }
    (dmu, dlp, dlp_cut)
}

#[test]
fn deterministic_chain_is_ddim_eta_zero() {
    for prediction in PREDICTIONS {
        let (dmu, dlp, _) = replay(SampleMode::Deterministic, 0.0, prediction, 0.1);
        assert!(
            dmu < 1e-5,
            "{prediction:?}: chain deviates from DDIM(eta=0) by {dmu}"
        );
        assert!(dlp < 1e-5, "{prediction:?}: log-probs deviate by {dlp}");
    }
}

#[test]
fn stochastic_chain_log_probs_match_the_closed_form() {
    for prediction in PREDICTIONS {
        let (_, dlp, _) = replay(SampleMode::Stochastic, 1.0, prediction, 0.1);
        assert!(dlp < 1e-5, "{prediction:?}: log-probs deviate by {dlp}");
    }
}

/// Fine-tuning's 0.03 floor puts the density's peak at 2.59, above the clamp's upper bound
/// of 2: the bound in force rises to the peak, so samples near the mean keep their log-prob
/// (and its gradient) instead of all reading 2.
#[test]
fn the_clamp_never_cuts_below_the_peak_density_at_the_floor() {
    for prediction in PREDICTIONS {
        let (_, dlp, dlp_cut) = replay(SampleMode::Stochastic, 1.0, prediction, 0.03);
        assert!(dlp < 1e-5, "{prediction:?}: log-probs deviate by {dlp}");
        assert!(
            dlp_cut > 1e-2,
            "{prediction:?}: the last steps' log-probs read as if cut at 2 ({dlp_cut})"
        );
    }
}

#[test]
fn recomputed_log_probs_equal_the_sampled_ones() {
    let device = Default::default();
    let mut cfg = tiny_config(6);
    cfg.diffusion.ft_denoising_steps = 4;
    let policy = Policy::<AD>::new(cfg, spec(), norm(), 5, &device).unwrap();
    let o = obs(4);
    let act = policy
        .valid()
        .act(None, &o, SampleMode::Stochastic, true, &mut rng(2), &device)
        .unwrap();
    let chain = Tensor::from_data(act.sample.chain.unwrap().into_data(), &device);
    let old = to_vec(act.sample.logp.unwrap());
    let obs_t = policy.obs_tensors(&o, &device).unwrap();
    let new = to_vec(policy.chain_logprobs(&obs_t, chain));
    assert_eq!(new.len(), 4 * 4, "[B, K'] = [4, 4]");
    for bi in 0..4 {
        for i in 0..4 {
            let (o, n) = (old[bi * 6 + 2 + i], new[bi * 4 + i]);
            assert!((o - n).abs() < 1e-5, "row {bi} step {i}: {o} vs {n}");
        }
    }
}

#[test]
fn same_seed_same_actions_other_seed_other_actions() {
    let device = Default::default();
    let policy = Policy::<B>::new(tiny_config(4), spec(), norm(), 1, &device).unwrap();
    let a = policy
        .act(
            None,
            &obs(2),
            SampleMode::Stochastic,
            false,
            &mut rng(9),
            &device,
        )
        .unwrap();
    let b = policy
        .act(
            None,
            &obs(2),
            SampleMode::Stochastic,
            false,
            &mut rng(9),
            &device,
        )
        .unwrap();
    let c = policy
        .act(
            None,
            &obs(2),
            SampleMode::Stochastic,
            false,
            &mut rng(10),
            &device,
        )
        .unwrap();
    assert_eq!(a.actions, b.actions);
    assert_ne!(a.actions, c.actions);
    assert_eq!(a.actions.len(), 2 * 4 * 2);
}

/// A server batching independent requests: each row's chunk must not depend on its batch mates.
#[test]
fn per_row_noise_makes_rows_independent_of_their_batch() {
    let device = Default::default();
    let policy = Policy::<B>::new(tiny_config(4), spec(), norm(), 1, &device).unwrap();
    let batch = obs(3);
    let row = |b: usize| ObsBatch {
        batch: 1,
        state: batch.state[b * 6..(b + 1) * 6].to_vec(),
        image: None,
        text: None,
    };
    for mode in [SampleMode::Deterministic, SampleMode::Stochastic] {
        let mut rngs = vec![rng(5), rng(6), rng(7)];
        let all = policy.act_rows(&batch, mode, &mut rngs, &device).unwrap();
        for (b, seed) in [(0, 5), (1, 6), (2, 7)] {
            let one = policy
                .act_rows(&row(b), mode, &mut [rng(seed)], &device)
                .unwrap();
            let part = &all.actions[b * 8..(b + 1) * 8];
            for (x, y) in part.iter().zip(&one.actions) {
                assert!((x - y).abs() < 1e-5, "{mode:?} row {b}: {x} vs {y}");
            }
        }
        // Other streams, other chunks; a missing stream is an error, not a panic.
        let other = policy
            .act_rows(&row(0), mode, &mut [rng(99)], &device)
            .unwrap();
        assert_ne!(other.actions, all.actions[..8].to_vec());
        assert!(
            policy
                .act_rows(&batch, mode, &mut [rng(1)], &device)
                .is_err()
        );
    }
}

#[test]
fn early_steps_run_the_frozen_copy_only_before_the_last_k_prime() {
    let device = Default::default();
    let o = obs(2);
    let policy = |ft: usize, seed: u64| {
        let mut cfg = tiny_config(4);
        cfg.diffusion.ft_denoising_steps = ft;
        Policy::<B>::new(cfg, spec(), norm(), seed, &device).unwrap()
    };
    let chain = |p: &Policy<B>, frozen: Option<&PolicyModel<B>>| {
        let act = p
            .act(
                frozen,
                &o,
                SampleMode::Stochastic,
                true,
                &mut rng(3),
                &device,
            )
            .unwrap();
        to_vec(act.sample.chain.unwrap())
    };
    let p2 = policy(2, 1);
    let mut p4 = policy(4, 1);
    p4.model = p2.model.clone();
    let other_policy = policy(2, 2);
    let own = chain(&p2, None);
    let theirs = chain(&other_policy, None);
    assert_ne!(theirs, own, "seeds 1 and 2 give other weights");
    let other = other_policy.model;
    // A frozen copy equal to the trainable network changes nothing ...
    assert_eq!(chain(&p2, Some(&p2.model.clone())), own);
    // ... nor does another one when every step is fine-tuned (K' = K) ...
    assert_eq!(chain(&p4, Some(&other)), chain(&p4, None));
    assert_eq!(chain(&p4, None), own);
    // ... but with K' = 2 of 4, x_4..x_2 come from the frozen network and x_1, x_0 from the
    // trainable one (same noise draws, so the prefix equals the frozen network's own chain).
    let mixed = chain(&p2, Some(&other));
    let per = 4 * 2;
    let steps = |c: &Vec<f32>, r: std::ops::Range<usize>| c[r.start * per..r.end * per].to_vec();
    assert_eq!(steps(&mixed, 0..3), steps(&theirs, 0..3));
    assert_ne!(steps(&mixed, 2..3), steps(&own, 2..3));
    assert_ne!(steps(&mixed, 3..5), steps(&theirs, 3..5));
}

/// Both image encoders (CNN and patches) take images, refuse missing or short ones, and
/// survive a checkpoint round trip.
#[test]
fn pixel_policies_take_images() {
    let device = Default::default();
    let dir = tempfile::tempdir().unwrap();
    for kind in [ImageEncoderKind::Cnn, ImageEncoderKind::Patches] {
        let mut cfg = tiny_config(3);
        cfg.encoder.image.kind = kind;
        cfg.encoder.image.channels = vec![8];
        cfg.encoder.image.keypoints = 4;
        cfg.encoder.image.out_dim = 8;
        cfg.encoder.image.patch_size = 5;
        let spec = diffrl_policy::PolicySpec {
            image: Some([3, 12, 12]),
            ..diffrl_policy::PolicySpec::flat(3, 2)
        };
        let p = Policy::<B>::new(cfg, spec, norm(), 0, &device).unwrap();
        let mut o = obs(2);
        let act = |p: &Policy<B>, o: &ObsBatch| {
            p.act(
                None,
                o,
                SampleMode::Deterministic,
                false,
                &mut rng(0),
                &device,
            )
        };
        let missing = act(&p, &o);
        assert!(
            missing.unwrap_err().to_string().contains("no image"),
            "{kind:?}"
        );
        o.image = Some((0..2 * 2 * 12 * 12 * 3).map(|i| (i % 251) as u8).collect());
        let a = act(&p, &o).unwrap();
        assert_eq!(a.actions.len(), 2 * 4 * 2);
        assert!(a.actions.iter().all(|v| v.is_finite()));
        let path = dir.path().join(format!("{kind:?}"));
        diffrl_policy::checkpoint::save(&p, &path, serde_json::json!({})).unwrap();
        let (q, _) = diffrl_policy::checkpoint::load::<B>(&path, &device).unwrap();
        assert_eq!(act(&q, &o).unwrap().actions, a.actions, "{kind:?}");
        o.image.as_mut().unwrap().pop();
        let short = act(&p, &o);
        assert!(
            short.unwrap_err().to_string().contains("observation.image"),
            "{kind:?}"
        );
    }
}

#[test]
fn pair_log_probs_equal_the_chain_log_probs() {
    for prediction in PREDICTIONS {
        pair_log_probs_match(prediction);
    }
}

fn pair_log_probs_match(prediction: Prediction) {
    let device = Default::default();
    let mut cfg = tiny_config(5);
    cfg.diffusion.ft_denoising_steps = 5;
    cfg.diffusion.prediction = prediction;
    let policy = Policy::<B>::new(cfg, spec(), norm(), 9, &device).unwrap();
    let o = obs(3);
    let act = policy
        .act(None, &o, SampleMode::Stochastic, true, &mut rng(4), &device)
        .unwrap();
    let chain = act.sample.chain.unwrap();
    let want = to_vec(act.sample.logp.unwrap());
    let obs_t = policy.obs_tensors(&o, &device).unwrap();
    // Every (observation, step) pair, in an order that mixes both.
    let pairs: Vec<(usize, usize)> = (0..5).flat_map(|i| (0..3).map(move |b| (b, i))).collect();
    let rows: Vec<usize> = pairs.iter().map(|&(b, _)| b).collect();
    let pick = |off: usize| {
        let xs = pairs
            .iter()
            .map(|&(b, i)| {
                chain
                    .clone()
                    .narrow(0, b, 1)
                    .narrow(1, i + off, 1)
                    .reshape([1, 4, 2])
            })
            .collect();
        Tensor::cat(xs, 0)
    };
    let idx = Tensor::from_data(
        TensorData::new(
            rows.iter().map(|&r| r as i64).collect::<Vec<_>>(),
            [rows.len()],
        ),
        &device,
    );
    let obs_rows = diffrl_policy::encoder::ObsTensors {
        state: obs_t.state.clone().select(0, idx),
        image: None,
        text: None,
    };
    let steps: Vec<usize> = pairs.iter().map(|&(_, i)| i).collect();
    let got = to_vec(policy.pair_logprobs(&obs_rows, pick(0), pick(1), &steps));
    for (n, &(b, i)) in pairs.iter().enumerate() {
        assert!(
            (got[n] - want[b * 5 + i]).abs() < 1e-5,
            "pair {n}: {} vs {}",
            got[n],
            want[b * 5 + i]
        );
    }
}

/// The BC loss regresses the noise (epsilon prediction), the clean chunk (sample prediction)
/// or the velocity sqrt(abar) eps - sqrt(1 - abar) x0 (v prediction) at the drawn timesteps:
/// recomputed here from the same random stream.
#[test]
fn bc_loss_regresses_the_noise_the_chunk_or_the_velocity() {
    use rand::Rng as _;
    let device = Default::default();
    for prediction in PREDICTIONS {
        let mut cfg = tiny_config(5);
        cfg.diffusion.prediction = prediction;
        let policy = Policy::<B>::new(cfg.clone(), spec(), norm(), 7, &device).unwrap();
        let o = obs(3);
        let obs_t = policy.obs_tensors(&o, &device).unwrap();
        let data: Vec<f32> = (0..3 * 4 * 2)
            .map(|i| ((i % 7) as f32 - 3.0) / 4.0)
            .collect();
        let actions = Tensor::<B, 3>::from_data(TensorData::new(data.clone(), [3, 4, 2]), &device);
        let got = to_vec(policy.bc_loss(&obs_t, actions, &mut rng(5)))[0];
        let PolicyModel::Diffusion(model) = &policy.model else {
            unreachable!()
        };
        let sched = Schedule::new(cfg.diffusion.schedule, cfg.diffusion.train_steps);
        let mut r = rng(5);
        let t: Vec<usize> = (0..3)
            .map(|_| r.random_range(0..cfg.diffusion.train_steps))
            .collect();
        let eps = to_vec(diffrl_policy::diffusion::normal_tensor::<B, 3>(
            &mut r,
            [3, 4, 2],
            None,
            &device,
        ));
        let x_t: Vec<f32> = (0..24)
            .map(|i| {
                let a = sched.abar(t[i / 8] as i64);
                (a.sqrt() * f64::from(data[i]) + (1.0 - a).sqrt() * f64::from(eps[i])) as f32
            })
            .collect();
        let out = to_vec(model.denoiser.forward(
            Tensor::from_data(TensorData::new(x_t, [3, 4, 2]), &device),
            Tensor::from_data(
                TensorData::new(t.iter().map(|&v| v as f32).collect::<Vec<_>>(), [3]),
                &device,
            ),
            model.encoder.forward(&obs_t),
        ));
        let v: Vec<f32> = (0..24)
            .map(|i| {
                let a = sched.abar(t[i / 8] as i64);
                (a.sqrt() * f64::from(eps[i]) - (1.0 - a).sqrt() * f64::from(data[i])) as f32
            })
            .collect();
        let target = match prediction {
            Prediction::Epsilon => &eps,
            Prediction::Sample => &data,
            Prediction::VPrediction => &v,
        };
        let want = out
            .iter()
            .zip(target)
            .map(|(o, y)| f64::from(o - y).powi(2))
            .sum::<f64>()
            / 24.0;
        assert!(
            (f64::from(got) - want).abs() < 1e-5,
            "{prediction:?}: {got} vs {want}"
        );
    }
}

/// A policy call cut over threads (`act_threads`) gives `act`'s actions, chain and log-probs
/// bit for bit, for any thread count and uneven runs of rows: the residual MLP at the default
/// width, the U-Net, a patch-encoder pixel policy, and the CPU VLA's parts.
#[test]
fn threaded_calls_equal_the_whole_batch_call() {
    use diffrl_policy::config::DenoiserKind;
    let device = Default::default();
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    let mut mlp = tiny_config(5);
    mlp.denoiser = Default::default();
    let mut unet = tiny_config(5);
    unet.denoiser.kind = DenoiserKind::Unet;
    let mut pixels = tiny_config(5);
    pixels.encoder.image.kind = ImageEncoderKind::Patches;
    pixels.encoder.image.patch_size = 4;
    let pixel_spec = diffrl_policy::PolicySpec {
        image: Some([3, 16, 16]),
        ..spec()
    };
    // The CPU VLA's parts: keypoint read-out, instruction encoder, FiLM, the clean chunk.
    let mut vla = tiny_config(5);
    vla.encoder.image.kind = ImageEncoderKind::PatchKeypoints;
    vla.encoder.image.patch_size = 4;
    vla.denoiser.film = true;
    vla.diffusion.prediction = Prediction::Sample;
    let vla_spec = diffrl_policy::PolicySpec {
        text: true,
        ..pixel_spec.clone()
    };
    let words = ["pick the red cube", "stack the blue cube on the red cube"];
    let vocab = diffrl_policy::Vocabulary::from_texts(words);
    let batch = 37;
    for (name, cfg, spec) in [
        ("mlp", mlp, spec()),
        ("unet", unet, spec()),
        ("pixels", pixels, pixel_spec),
        ("vla", vla, vla_spec),
    ] {
        let (pixels, text) = (spec.image.is_some(), spec.text);
        let p = if text {
            Policy::<B>::with_text(cfg, spec, norm(), vocab.clone(), 3, &device).unwrap()
        } else {
            Policy::<B>::new(cfg, spec, norm(), 3, &device).unwrap()
        };
        let mut o = obs(batch);
        if pixels {
            o.image = Some(
                (0..batch * 2 * 16 * 16 * 3)
                    .map(|i| (i * 7 % 251) as u8)
                    .collect(),
            );
        }
        if text {
            o.text = Some((0..batch).map(|i| words[i % 3 % 2].to_owned()).collect());
        }
        // Bad input gets the whole batch's error, as from `act`.
        let mut bad = o.clone();
        match &mut bad.image {
            Some(px) => px.truncate(px.len() - batch),
            None => bad.state.truncate(bad.state.len() - batch),
        }
        let err = |r: Result<diffrl_policy::Act<B>, diffrl_policy::PolicyError>| {
            r.unwrap_err().to_string()
        };
        let mode = SampleMode::Stochastic;
        assert_eq!(
            err(p.act_threads(None, &bad, mode, true, &mut rng(1), &device, 3)),
            err(p.act(None, &bad, mode, true, &mut rng(1), &device)),
            "{name}"
        );
        for mode in [SampleMode::Deterministic, SampleMode::Stochastic] {
            let whole = p.act(None, &o, mode, true, &mut rng(11), &device).unwrap();
            for threads in [2, 3, 8] {
                let mut r = rng(11);
                let cut = p
                    .act_threads(None, &o, mode, true, &mut r, &device, threads)
                    .unwrap();
                let what = format!("{name}, {mode:?}, {threads} threads");
                assert_eq!(
                    bits(cut.actions.clone()),
                    bits(whole.actions.clone()),
                    "{what}"
                );
                let chain = |a: &diffrl_policy::Act<B>| to_vec(a.sample.chain.clone().unwrap());
                let logp = |a: &diffrl_policy::Act<B>| to_vec(a.sample.logp.clone().unwrap());
                assert_eq!(bits(chain(&cut)), bits(chain(&whole)), "{what}");
                assert_eq!(bits(logp(&cut)), bits(logp(&whole)), "{what}");
                assert_eq!(
                    bits(to_vec(cut.sample.actions.clone())),
                    bits(to_vec(whole.sample.actions.clone())),
                    "{what}"
                );
                // The stream is left where the whole call leaves it.
                let mut after = rng(11);
                p.act(None, &o, mode, false, &mut after, &device).unwrap();
                assert_eq!(
                    rand::Rng::random::<u64>(&mut r),
                    rand::Rng::random::<u64>(&mut after),
                    "{what}"
                );
            }
        }
    }
}
