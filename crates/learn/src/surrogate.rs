//! The clipped surrogate objective over (decision, fine-tuned denoising step) pairs
//! (docs/algorithms.md §3), shared by GRPO and PPO: every fine-tuned chain step of every policy
//! call is a sample with its own likelihood ratio, recomputed under the current parameters.

use std::borrow::Cow;

use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use diffrl_core::episode::Episode;
use diffrl_core::seeding::rng;
use diffrl_policy::encoder::ObsTensors;
use diffrl_policy::{DiffusionProcess, ObsBatch, Policy};
use rand::seq::SliceRandom;

use crate::LearnError;
use crate::data::random_shift_frames;
use crate::finetune::{GrpoConfig, StepWeights};
use crate::optim::{clip_factor, grad_norm, lr_at};
use crate::parallel::sharded_grads_with;
use crate::rollout::GroupRollout;
use crate::session::Session;

/// One (rollout, decision, chain step) sample of an update.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pair {
    rollout: usize,
    decision: usize,
    step: usize,
    advantage: f32,
    old: f32,
    reference: f32,
}

/// The pairs of a batch: every fine-tuned chain step k in [K - K', K) of every decision j of
/// rollout i, with advantage A_{i,j} * denoise_gamma^(K - 1 - k) * w_k (w_k = 1, or with
/// `step_weights = "epsilon"` [`step_weights`]), the behaviour policy's log-prob from the
/// rollout and, when beta > 0, the reference policy's.
pub(crate) fn chain_pairs<B: AutodiffBackend>(
    run: &Session<'_, B>,
    kept: &[GroupRollout],
    advantages: &[Vec<f64>],
) -> Result<Vec<Pair>, LearnError> {
    let cfg = run.cfg;
    let k = run.policy.chain_len();
    let ft = run.policy.process().map_or(1, |p| p.ft_steps());
    let first_ft = k - ft;
    let weights = step_weights(run.policy.process(), cfg.step_weights, k, first_ft);
    let mut pairs = Vec::new();
    for (ri, r) in kept.iter().enumerate() {
        for (di, d) in r.decisions.iter().enumerate() {
            for step in first_ft..k {
                let discount = cfg.denoise_gamma.powi((k - 1 - step) as i32);
                pairs.push(Pair {
                    rollout: ri,
                    decision: di,
                    step,
                    advantage: (advantages[ri][di] * discount * weights[step - first_ft]) as f32,
                    old: d.logp[step],
                    reference: 0.0,
                });
            }
        }
    }
    if cfg.beta > 0.0 {
        for chunk in pairs.chunks_mut(cfg.minibatch) {
            let mb = Minibatch::gather(kept, chunk, run.reference, &run.device)?;
            let lp = run
                .reference
                .pair_logprobs(&mb.obs, mb.x, mb.next, &mb.steps);
            for (p, v) in chunk.iter_mut().zip(to_vec(lp)?) {
                p.reference = v;
            }
        }
    }
    Ok(pairs)
}

/// The weight w_k of each fine-tuned chain step k in [first_ft, k_len): 1, or with
/// [`StepWeights::Epsilon`] the process's `epsilon_gain_ratio(k)` divided by its mean over
/// those steps (a process-free policy, the Gaussian one, gets 1).
pub(crate) fn step_weights(
    process: Option<&DiffusionProcess>,
    mode: StepWeights,
    k_len: usize,
    first_ft: usize,
) -> Vec<f64> {
    let n = k_len - first_ft;
    match (mode, process) {
        (StepWeights::Epsilon, Some(p)) => {
            let raw: Vec<f64> = (first_ft..k_len).map(|k| p.epsilon_gain_ratio(k)).collect();
            let mean = raw.iter().sum::<f64>() / n as f64;
            raw.iter().map(|w| w / mean).collect()
        }
        _ => vec![1.0; n],
    }
}

/// The update's batch and pairs. Without `[grpo] random_shift` (or without frames) they are
/// `kept` and [`chain_pairs`] as collected. With it, every policy call's frames are shifted
/// (one draw per call from a generator seeded `seed`; [`random_shift_frames`]) and each pair's
/// old log-likelihood is recomputed on the shifted frames under the current weights, the ones
/// that collected the batch, so the ratio starts at 1 on what the update sees (DPPO's
/// augmentation for pixel fine-tuning).
pub(crate) fn update_batch<'k, B: AutodiffBackend>(
    run: &Session<'_, B>,
    kept: &'k [GroupRollout],
    advantages: &[Vec<f64>],
    seed: u64,
) -> Result<(Cow<'k, [GroupRollout]>, Vec<Pair>), LearnError> {
    let pad = run.cfg.random_shift;
    let frames = kept
        .iter()
        .any(|r| r.decisions.iter().any(|d| d.image.is_some()));
    let Some([c, h, w]) = run.policy.spec.image.filter(|_| pad > 0 && frames) else {
        return Ok((Cow::Borrowed(kept), chain_pairs(run, kept, advantages)?));
    };
    // The update reads only the policy calls: the episodes (every step's frames) stay behind.
    let mut shifted: Vec<GroupRollout> = kept
        .iter()
        .map(|r| GroupRollout {
            group: r.group,
            episode: Episode::default(),
            decisions: r.decisions.clone(),
        })
        .collect();
    let mut r = rng(seed);
    for d in shifted.iter_mut().flat_map(|r| r.decisions.iter_mut()) {
        if let Some(img) = d.image.as_mut() {
            random_shift_frames(img, [h, w, c], pad, &mut r);
        }
    }
    let mut pairs = chain_pairs(run, &shifted, advantages)?;
    let current = run.policy.valid();
    for chunk in pairs.chunks_mut(run.cfg.minibatch) {
        let mb = Minibatch::gather(&shifted, chunk, &current, &run.device)?;
        let lp = current.pair_logprobs(&mb.obs, mb.x, mb.next, &mb.steps);
        for (p, v) in chunk.iter_mut().zip(to_vec(lp)?) {
            p.old = v;
        }
    }
    Ok((Cow::Owned(shifted), pairs))
}

/// One pass over `pairs` in minibatches of `minibatch`: `order` is shuffled with a generator
/// seeded `shuffle_seed` (it carries over from pass to pass), and each minibatch is one AdamW
/// step on [`surrogate_loss`]. A minibatch whose loss or gradient norm is not finite is
/// skipped; after `max_nan_updates` of them the run stops. Returns (sum over applied
/// minibatches of approx. KL x pairs, pairs), for [`exceeds_target_kl`].
pub(crate) fn policy_epoch<B: AutodiffBackend>(
    run: &mut Session<'_, B>,
    kept: &[GroupRollout],
    pairs: &[Pair],
    order: &mut [usize],
    shuffle_seed: u64,
    acc: &mut UpdateAcc,
) -> Result<(f64, usize), LearnError> {
    let cfg = run.cfg;
    order.shuffle(&mut rng(shuffle_seed));
    let mut epoch_kl = (0.0, 0usize);
    for idx in order.chunks(cfg.minibatch) {
        let chunk: Vec<Pair> = idx.iter().map(|&i| pairs[i]).collect();
        let (grads, m) = minibatch_grads(run, kept, &chunk)?;
        if !m.loss.is_finite() {
            skip_non_finite(run, acc, m.loss)?;
            continue;
        }
        let gn = grad_norm(&run.policy.model, &grads);
        if !gn.is_finite() {
            skip_non_finite(run, acc, gn)?;
            continue;
        }
        let lr = lr_at(run.iteration, cfg.iterations, 0, cfg.lr, cfg.min_lr_ratio);
        let scale = clip_factor(gn, cfg.grad_clip);
        let ema_decay = (cfg.ema_decay > 0.0).then_some(cfg.ema_decay);
        run.policy.model = run
            .optim
            .step(lr, run.policy.model.clone(), grads, scale, ema_decay)?;
        acc.add(&m, gn);
        epoch_kl.0 += m.approx_kl * m.n as f64;
        epoch_kl.1 += m.n;
    }
    Ok(epoch_kl)
}

/// The surrogate's gradient over one minibatch and its statistics. With `[grpo] threads` > 1
/// the minibatch is cut into that many shards, each computed on its own thread and fork of the
/// model ([`sharded_grads_with`]); the gradient is the pair-weighted mean of the shards' and
/// the statistics are merged as if computed over the whole minibatch. The surrogate draws no
/// random numbers, so any thread count computes the same quantity; a given count gives the
/// same bits every time.
fn minibatch_grads<B: AutodiffBackend>(
    run: &Session<'_, B>,
    kept: &[GroupRollout],
    chunk: &[Pair],
) -> Result<(GradientsParams, SurrogateStats), LearnError> {
    let (policy, device, cfg) = (&run.policy, &run.device, run.cfg);
    let (grads, _, shards) =
        sharded_grads_with(&policy.model, chunk.len(), cfg.threads, |_, rows, model| {
            let shard = policy.with_model(model.clone());
            let mb = Minibatch::gather(kept, &chunk[rows], &shard, device)?;
            surrogate(&shard, &mb, cfg)
        })?;
    if let [(_, only)] = shards.as_slice() {
        // One shard: its own statistics, bit for bit.
        return Ok((grads, *only));
    }
    let mut m = SurrogateStats {
        ratio: [f64::INFINITY, f64::NEG_INFINITY],
        logp: [f64::INFINITY, f64::NEG_INFINITY],
        ..Default::default()
    };
    for (_, s) in &shards {
        let w = s.n as f64;
        m.n += s.n;
        m.loss += s.loss * w;
        m.clip_frac += s.clip_frac * w;
        m.approx_kl += s.approx_kl * w;
        m.ref_kl += s.ref_kl * w;
        m.ratio = [m.ratio[0].min(s.ratio[0]), m.ratio[1].max(s.ratio[1])];
        m.logp = [m.logp[0].min(s.logp[0]), m.logp[1].max(s.logp[1])];
    }
    let n = m.n.max(1) as f64;
    m.loss /= n;
    m.clip_frac /= n;
    m.approx_kl /= n;
    m.ref_kl /= n;
    Ok((grads, m))
}

/// Counts a skipped minibatch; an error once more than `max_nan_updates` were skipped in the run.
fn skip_non_finite<B: AutodiffBackend>(
    run: &mut Session<'_, B>,
    acc: &mut UpdateAcc,
    value: f64,
) -> Result<(), LearnError> {
    acc.skipped += 1;
    run.nan_updates += 1;
    if run.nan_updates > run.cfg.max_nan_updates {
        return Err(LearnError::Diverged {
            step: run.iteration,
            loss: value,
        });
    }
    Ok(())
}

/// KL early stopping: whether an epoch's pair-weighted mean approximate KL (from
/// [`policy_epoch`]) exceeds `target_kl` (when set).
pub(crate) fn exceeds_target_kl(cfg: &GrpoConfig, (kl_sum, pairs): (f64, usize)) -> bool {
    cfg.target_kl > 0.0 && pairs > 0 && kl_sum / pairs as f64 > cfg.target_kl
}

/// Tensors of one minibatch of pairs.
struct Minibatch<B: Backend> {
    obs: ObsTensors<B>,
    x: Tensor<B, 3>,
    next: Tensor<B, 3>,
    steps: Vec<usize>,
    advantage: Tensor<B, 1>,
    old: Tensor<B, 1>,
    reference: Tensor<B, 1>,
}

impl<B: Backend> Minibatch<B> {
    fn gather(
        kept: &[GroupRollout],
        pairs: &[Pair],
        policy: &Policy<B>,
        device: &B::Device,
    ) -> Result<Self, LearnError> {
        let [tp, da] = policy.chunk();
        let per = tp * da;
        let n = pairs.len();
        let mut state = Vec::new();
        let mut image: Option<Vec<u8>> = None;
        let mut text: Option<Vec<String>> = None;
        let mut x = Vec::with_capacity(n * per);
        let mut next = Vec::with_capacity(n * per);
        for p in pairs {
            let d = &kept[p.rollout].decisions[p.decision];
            state.extend_from_slice(&d.state);
            if let Some(img) = &d.image {
                image.get_or_insert_with(Vec::new).extend_from_slice(img);
            }
            if let Some(t) = &d.text {
                text.get_or_insert_with(Vec::new).push(t.clone());
            }
            x.extend_from_slice(&d.chain[p.step * per..(p.step + 1) * per]);
            next.extend_from_slice(&d.chain[(p.step + 1) * per..(p.step + 2) * per]);
        }
        let obs = policy.obs_tensors(
            &ObsBatch {
                batch: n,
                state,
                image,
                text,
            },
            device,
        )?;
        let col = |f: &dyn Fn(&Pair) -> f32| {
            Tensor::<B, 1>::from_data(
                TensorData::new(pairs.iter().map(f).collect::<Vec<_>>(), [n]),
                device,
            )
        };
        Ok(Self {
            obs,
            x: Tensor::from_data(TensorData::new(x, [n, tp, da]), device),
            next: Tensor::from_data(TensorData::new(next, [n, tp, da]), device),
            steps: pairs.iter().map(|p| p.step).collect(),
            advantage: col(&|p| p.advantage),
            old: col(&|p| p.old),
            reference: col(&|p| p.reference),
        })
    }
}

/// Scalars of one minibatch.
#[derive(Debug, Clone, Copy, Default)]
pub struct SurrogateStats {
    /// Pairs.
    pub n: usize,
    /// Loss value.
    pub loss: f64,
    /// Fraction of clipped ratios.
    pub clip_frac: f64,
    /// Approximate KL(old || new).
    pub approx_kl: f64,
    /// k3 KL to the reference.
    pub ref_kl: f64,
    /// Ratio range.
    pub ratio: [f64; 2],
    /// New log-prob range.
    pub logp: [f64; 2],
}

/// The loss of a minibatch of (env step, denoising step) pairs (docs/algorithms.md §3):
/// mean of -min(r A, clip(r, 1 - clip[0], 1 + clip[1]) A) with r = exp(new - old), plus
/// beta * mean of the k3 KL exp(ref - new) - (ref - new) - 1 when `reference` is given.
pub fn surrogate_loss<B: Backend>(
    new: Tensor<B, 1>,
    old: Tensor<B, 1>,
    advantage: Tensor<B, 1>,
    reference: Option<Tensor<B, 1>>,
    clip: [f64; 2],
    beta: f64,
) -> Tensor<B, 1> {
    let ratio = (new.clone() - old).exp();
    let s1 = ratio.clone() * advantage.clone();
    let s2 = ratio.clamp(1.0 - clip[0], 1.0 + clip[1]) * advantage;
    let loss = s1.min_pair(s2).neg().mean();
    match reference {
        Some(r) => {
            let d = r - new;
            loss + (d.clone().exp() - d - 1.0).mean() * beta
        }
        None => loss,
    }
}

/// The clipped surrogate + k3 KL of one minibatch, with its statistics.
fn surrogate<B: Backend>(
    policy: &Policy<B>,
    mb: &Minibatch<B>,
    cfg: &GrpoConfig,
) -> Result<(Tensor<B, 1>, SurrogateStats), LearnError> {
    let new = policy.pair_logprobs(&mb.obs, mb.x.clone(), mb.next.clone(), &mb.steps);
    let ratio = (new.clone() - mb.old.clone()).exp();
    let loss = surrogate_loss(
        new.clone(),
        mb.old.clone(),
        mb.advantage.clone(),
        (cfg.beta > 0.0).then(|| mb.reference.clone()),
        [cfg.clip_low, cfg.clip_high],
        cfg.beta,
    );
    let ref_kl = if cfg.beta > 0.0 {
        let d = mb.reference.clone() - new.clone();
        (d.clone().exp() - d - 1.0)
            .mean()
            .into_scalar()
            .elem::<f64>()
    } else {
        0.0
    };
    let r = to_vec(ratio)?;
    let lp = to_vec(new)?;
    let n = r.len();
    let mut s = SurrogateStats {
        n,
        loss: loss.clone().into_scalar().elem::<f64>(),
        ref_kl,
        ratio: [f64::INFINITY, f64::NEG_INFINITY],
        logp: [f64::INFINITY, f64::NEG_INFINITY],
        ..Default::default()
    };
    for (&ri, &li) in r.iter().zip(&lp) {
        let (ri, li) = (f64::from(ri), f64::from(li));
        s.clip_frac += f64::from(u8::from(
            ri < 1.0 - cfg.clip_low || ri > 1.0 + cfg.clip_high,
        ));
        s.approx_kl += (ri - 1.0) - ri.ln();
        s.ratio = [s.ratio[0].min(ri), s.ratio[1].max(ri)];
        s.logp = [s.logp[0].min(li), s.logp[1].max(li)];
    }
    s.clip_frac /= n.max(1) as f64;
    s.approx_kl /= n.max(1) as f64;
    Ok((loss, s))
}

/// Accumulated update statistics of an iteration: sums over applied minibatches (weighted by
/// their pairs where a mean over pairs is wanted).
#[derive(Debug, Default)]
pub(crate) struct UpdateAcc {
    pub n: usize,
    pub updates: usize,
    pub skipped: usize,
    pub loss: f64,
    pub clipped: f64,
    pub approx_kl: f64,
    pub ref_kl: f64,
    pub grad_norm: f64,
    /// Sum over epochs of the critic's mean loss (PPO).
    pub value_loss: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
    pub logp_min: f64,
    pub logp_max: f64,
    /// Epochs run (fewer than configured after a KL early stop).
    pub epochs: usize,
    /// Seconds updating.
    pub seconds: f64,
}

impl UpdateAcc {
    fn add(&mut self, m: &SurrogateStats, grad_norm: f64) {
        if self.updates == 0 {
            self.ratio_min = f64::INFINITY;
            self.ratio_max = f64::NEG_INFINITY;
            self.logp_min = f64::INFINITY;
            self.logp_max = f64::NEG_INFINITY;
        }
        let w = m.n as f64;
        self.n += m.n;
        self.updates += 1;
        self.loss += m.loss * w;
        self.clipped += m.clip_frac * w;
        self.approx_kl += m.approx_kl * w;
        self.ref_kl += m.ref_kl * w;
        self.grad_norm += grad_norm;
        self.ratio_min = self.ratio_min.min(m.ratio[0]);
        self.ratio_max = self.ratio_max.max(m.ratio[1]);
        self.logp_min = self.logp_min.min(m.logp[0]);
        self.logp_max = self.logp_max.max(m.logp[1]);
    }

    pub fn mean(&self, v: f64) -> f64 {
        v / self.n.max(1) as f64
    }
}

pub(crate) fn to_vec<B: Backend>(t: Tensor<B, 1>) -> Result<Vec<f32>, LearnError> {
    t.into_data()
        .convert::<f32>()
        .into_vec()
        .map_err(|e| LearnError::Data(format!("reading a tensor back: {e:?}")))
}

#[cfg(test)]
mod tests {
    use diffrl_policy::config::DiffusionConfig;
    use diffrl_policy::schedule::Prediction;

    use super::*;

    fn process(prediction: Prediction) -> DiffusionProcess {
        let cfg = DiffusionConfig {
            prediction,
            ..DiffusionConfig::default()
        };
        DiffusionProcess::new(&cfg, 4)
    }

    #[test]
    fn epsilon_step_weights_give_each_target_the_noise_targets_gradient_scale() {
        let k = process(Prediction::Epsilon).steps();
        // Uniform weights, and epsilon weights of a noise-predicting or process-free policy, are 1.
        for (p, mode) in [
            (Some(process(Prediction::Sample)), StepWeights::Uniform),
            (Some(process(Prediction::Epsilon)), StepWeights::Epsilon),
            (None, StepWeights::Epsilon),
        ] {
            assert_eq!(step_weights(p.as_ref(), mode, k, 0), vec![1.0; k]);
        }
        for prediction in [Prediction::Sample, Prediction::VPrediction] {
            let p = process(prediction);
            for first in [0, k - 3] {
                let w = step_weights(Some(&p), StepWeights::Epsilon, k, first);
                assert_eq!(w.len(), k - first);
                let mean = w.iter().sum::<f64>() / w.len() as f64;
                assert!((mean - 1.0).abs() < 1e-12, "{prediction:?}: mean {mean}");
                // w_k / w_j = (eps gain / own gain at k) / (the same at j), so the weighted
                // gains of any two steps stand as the noise target's gains do.
                let eps = process(Prediction::Epsilon);
                for (i, j) in [(first, k - 1), (first, first + 1)] {
                    let got = (w[i - first] * p.output_gain(i)) / (w[j - first] * p.output_gain(j));
                    let want = eps.output_gain(i) / eps.output_gain(j);
                    assert!(
                        (got / want - 1.0).abs() < 1e-9,
                        "{prediction:?} {i}/{j}: {got} vs {want}"
                    );
                }
                // The noisiest steps weigh more: the noise target amplifies their output most.
                assert!(w[0] > w[w.len() - 1], "{prediction:?}: {w:?}");
            }
        }
    }
}
