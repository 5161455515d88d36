//! The diffusion policy: epsilon-prediction training loss, reverse chains with per-step
//! Gaussian log-likelihoods, and their recomputation under new parameters
//! (docs/algorithms.md §1–2).
//!
//! All tensors of the chain live in normalised action space ([-1, 1]). Random numbers are drawn
//! on the host from diffrl's seeded RNG, so a chain depends only on the seed, never on the
//! backend's generator or thread timing.

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use diffrl_core::seeding::Rng;
use rand::Rng as _;
use rand_distr::StandardNormal;

use crate::config::{DenoiserConfig, DiffusionConfig, EncoderConfig};
use crate::denoiser::Denoiser;
use crate::encoder::{ImageShape, ObsEncoder, ObsTensors};
use crate::planner::AgentLayout;
use crate::schedule::{Prediction, Schedule, StepCoeffs, q_sample_coeffs, step_coeffs};

pub(crate) const HALF_LN_2PI: f64 = 0.918_938_533_204_672_8;

/// Encoder + denoiser: the trainable part of a diffusion policy.
#[derive(Module, Debug)]
pub struct DiffusionModel<B: Backend> {
    /// Observation encoder.
    pub encoder: ObsEncoder<B>,
    /// Noise predictor.
    pub denoiser: Denoiser<B>,
}

impl<B: Backend> DiffusionModel<B> {
    /// Builds the networks for the given dimensions.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        obs_horizon: usize,
        state_dim: usize,
        image: Option<ImageShape>,
        vocab_size: Option<usize>,
        aux: usize,
        pred_horizon: usize,
        action_dim: usize,
        encoder: &EncoderConfig,
        denoiser: &DenoiserConfig,
        layout: &AgentLayout,
        device: &B::Device,
    ) -> Self {
        let encoder = ObsEncoder::new(
            obs_horizon,
            state_dim,
            image,
            vocab_size,
            aux,
            encoder,
            denoiser.activation,
            device,
        );
        let denoiser = Denoiser::new(
            pred_horizon,
            action_dim,
            encoder.out_dim(),
            layout,
            denoiser,
            device,
        );
        Self { encoder, denoiser }
    }
}

/// How a chain is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleMode {
    /// Deterministic evaluation: `eval_eta` coefficients and no noise (temperature 0).
    Deterministic,
    /// Stochastic rollouts: `eta` coefficients, std = max(sigma, min_sampling_std), clipped noise.
    Stochastic,
}

/// A sampled chain: the action chunk and, on request, x_K..x_0 with per-step log-probs.
#[derive(Debug, Clone)]
pub struct ChainSample<B: Backend> {
    /// x_0: [B, Tp, Da], normalised.
    pub actions: Tensor<B, 3>,
    /// x_K..x_0: [B, K + 1, Tp, Da] (when requested).
    pub chain: Option<Tensor<B, 4>>,
    /// log pi(x_{k-1} | x_k, s) per step: [B, K] (when requested).
    pub logp: Option<Tensor<B, 2>>,
}

/// The diffusion process: schedule, precomputed step coefficients and likelihood settings.
#[derive(Debug, Clone)]
pub struct DiffusionProcess {
    cfg: DiffusionConfig,
    action_horizon: usize,
    sqrt_abar: Vec<f64>,
    sqrt_one_minus_abar: Vec<f64>,
    rollout: Vec<StepCoeffs>,
    eval: Vec<StepCoeffs>,
}

impl DiffusionProcess {
    /// Precomputes everything the chain needs; `action_horizon` (Ta) sets the log-prob reduction.
    pub fn new(cfg: &DiffusionConfig, action_horizon: usize) -> Self {
        let schedule = Schedule::new(cfg.schedule, cfg.train_steps);
        let (sqrt_abar, sqrt_one_minus_abar) = q_sample_coeffs(&schedule);
        Self {
            rollout: step_coeffs(&schedule, cfg.sampler, cfg.denoising_steps, cfg.eta),
            eval: step_coeffs(&schedule, cfg.sampler, cfg.denoising_steps, cfg.eval_eta),
            cfg: cfg.clone(),
            action_horizon,
            sqrt_abar,
            sqrt_one_minus_abar,
        }
    }

    /// Chain length K.
    pub fn steps(&self) -> usize {
        self.rollout.len()
    }

    /// K': how many final steps are fine-tuned.
    pub fn ft_steps(&self) -> usize {
        self.cfg.ft_steps()
    }

    /// The settings.
    pub fn config(&self) -> &DiffusionConfig {
        &self.cfg
    }

    /// Coefficients of the stochastic (rollout) chain, noisiest step first.
    pub fn rollout_coeffs(&self) -> &[StepCoeffs] {
        &self.rollout
    }

    /// How far one unit of the denoiser's output moves the clean-chunk estimate x0_hat at
    /// rollout chain step `k` (noisiest first), before the clamp: sqrt(1 - abar) / sqrt(abar)
    /// for the noise, 1 for the chunk, sqrt(1 - abar) for the velocity. Every step's
    /// log-likelihood gradient with respect to the weights passes through this factor.
    pub fn output_gain(&self, k: usize) -> f64 {
        let c = &self.rollout[k];
        match self.cfg.prediction {
            Prediction::Epsilon => c.sqrt_one_minus_abar / c.sqrt_abar,
            Prediction::Sample => 1.0,
            Prediction::VPrediction => c.sqrt_one_minus_abar,
        }
    }

    /// The factor that gives chain step `k`'s log-likelihood gradient the weight it would
    /// have under the noise target: the noise target's [`Self::output_gain`] over this
    /// process's (1 for every step of a noise-predicting process).
    pub fn epsilon_gain_ratio(&self, k: usize) -> f64 {
        let c = &self.rollout[k];
        match self.cfg.prediction {
            Prediction::Epsilon => 1.0,
            Prediction::Sample => c.sqrt_one_minus_abar / c.sqrt_abar,
            Prediction::VPrediction => 1.0 / c.sqrt_abar,
        }
    }

    /// Standard deviation used for likelihoods at a step.
    fn logprob_std(&self, c: &StepCoeffs) -> f64 {
        c.sigma.max(self.cfg.min_logprob_std)
    }

    /// Behaviour-cloning loss: mean squared error of the predicted noise (or, with sample
    /// prediction, of the predicted chunk; with v prediction, of the predicted velocity
    /// sqrt(abar) eps - sqrt(1 - abar) x0) at uniformly drawn timesteps (docs/algorithms.md
    /// §1). `actions`: [B, Tp, Da] normalised. With `aux` = (privileged values [B, A],
    /// weight) and an encoder that has an auxiliary head, adds weight x the head's mean squared
    /// error on them.
    pub fn bc_loss<B: Backend>(
        &self,
        model: &DiffusionModel<B>,
        obs: &ObsTensors<B>,
        actions: Tensor<B, 3>,
        aux: Option<(Tensor<B, 2>, f64)>,
        rng: &mut Rng,
    ) -> Tensor<B, 1> {
        let [b, tp, da] = actions.dims();
        let device = actions.device();
        let t: Vec<usize> = (0..b)
            .map(|_| rng.random_range(0..self.cfg.train_steps))
            .collect();
        let col = |v: &Vec<f64>| {
            let data: Vec<f32> = t.iter().map(|&i| v[i] as f32).collect();
            Tensor::<B, 1>::from_data(TensorData::new(data, [b]), &device).reshape([b, 1, 1])
        };
        let (sa, s1a) = (col(&self.sqrt_abar), col(&self.sqrt_one_minus_abar));
        let eps = normal_tensor::<B, 3>(rng, [b, tp, da], None, &device);
        let target = match self.cfg.prediction {
            Prediction::Epsilon => eps.clone(),
            Prediction::Sample => actions.clone(),
            Prediction::VPrediction => eps.clone() * sa.clone() - actions.clone() * s1a.clone(),
        };
        let x_t = actions * sa + eps * s1a;
        let t_f = Tensor::<B, 1>::from_data(
            TensorData::new(t.iter().map(|&i| i as f32).collect::<Vec<_>>(), [b]),
            &device,
        );
        let (cond, aux_pred) = model.encoder.forward_aux(obs);
        let pred = model.denoiser.forward(x_t, t_f, cond);
        let loss = (pred - target).square().mean();
        match (aux_pred, aux) {
            (Some(p), Some((target, weight))) => {
                loss + (p - target).square().mean().mul_scalar(weight)
            }
            _ => loss,
        }
    }

    /// The noise draws of [`DiffusionProcess::sample`] in `mode`, in order, by their clip: x_K
    /// (unclipped), then one clipped draw per chain step when stochastic.
    pub fn noise_draws(&self, mode: SampleMode) -> Vec<Option<f64>> {
        let mut clips = vec![None];
        if mode == SampleMode::Stochastic {
            clips.extend(std::iter::repeat_n(
                Some(self.cfg.noise_clip),
                self.rollout.len(),
            ));
        }
        clips
    }

    /// Samples a chain for a batch of observations. Steps before the last K' use `frozen` when
    /// given (the pretrained copy during fine-tuning), the rest use `model`. Its noise draws
    /// are those of [`DiffusionProcess::noise_draws`].
    #[allow(clippy::too_many_arguments)]
    pub fn sample<B: Backend>(
        &self,
        model: &DiffusionModel<B>,
        frozen: Option<&DiffusionModel<B>>,
        obs: &ObsTensors<B>,
        dims: [usize; 3],
        mode: SampleMode,
        record: bool,
        noise: &mut Noise<'_>,
    ) -> ChainSample<B> {
        let device = obs.state.device();
        let coeffs = match mode {
            SampleMode::Deterministic => &self.eval,
            SampleMode::Stochastic => &self.rollout,
        };
        let k_total = coeffs.len();
        let first_ft = k_total - self.ft_steps();
        let cond = model.encoder.forward(obs);
        let frozen = frozen.filter(|_| first_ft > 0);
        let frozen_cond = frozen.map(|f| f.encoder.forward(obs));
        let mut x = noise.normal::<B, 3>(dims, None, &device);
        let mut xs = Vec::with_capacity(if record { k_total + 1 } else { 0 });
        let mut logps = Vec::with_capacity(if record { k_total } else { 0 });
        if record {
            xs.push(x.clone());
        }
        for (i, c) in coeffs.iter().enumerate() {
            let (net, cond) = match (frozen, &frozen_cond) {
                (Some(f), Some(fc)) if i < first_ft => (f, fc.clone()),
                _ => (model, cond.clone()),
            };
            let t = Tensor::<B, 1>::full([dims[0]], c.t as f32, &device);
            let pred = net.denoiser.forward(x.clone(), t, cond);
            let mu = self.mean(x, pred, c);
            let next = match mode {
                SampleMode::Deterministic => mu.clone(),
                SampleMode::Stochastic => {
                    let std = c.sigma.max(self.cfg.min_sampling_std);
                    let z = noise.normal::<B, 3>(dims, Some(self.cfg.noise_clip), &device);
                    mu.clone() + z * std
                }
            };
            if record {
                logps.push(self.logp(next.clone(), mu, c));
                xs.push(next.clone());
            }
            x = next;
        }
        ChainSample {
            actions: x,
            chain: record.then(|| Tensor::stack(xs, 1)),
            logp: record.then(|| Tensor::stack(logps, 1)),
        }
    }

    /// Recomputes log pi(x_{k-1} | x_k, s) of the last `K'` steps of stored chains under
    /// `model` (differentiable when `B` is an autodiff backend). `chain`: [B, K + 1, Tp, Da].
    /// Returns [B, K'], step i of the result being chain step K - K' + i.
    pub fn chain_logprobs<B: Backend>(
        &self,
        model: &DiffusionModel<B>,
        obs: &ObsTensors<B>,
        chain: Tensor<B, 4>,
    ) -> Tensor<B, 2> {
        let [b, kp1, tp, da] = chain.dims();
        let k_total = self.rollout.len();
        debug_assert_eq!(kp1, k_total + 1);
        let device = chain.device();
        let first_ft = k_total - self.ft_steps();
        let cond = model.encoder.forward(obs);
        let mut out = Vec::with_capacity(self.ft_steps());
        for (i, c) in self.rollout.iter().enumerate().skip(first_ft) {
            let x = chain.clone().narrow(1, i, 1).reshape([b, tp, da]);
            let next = chain.clone().narrow(1, i + 1, 1).reshape([b, tp, da]);
            let t = Tensor::<B, 1>::full([b], c.t as f32, &device);
            let pred = model.denoiser.forward(x.clone(), t, cond.clone());
            out.push(self.logp(next, self.mean(x, pred, c), c));
        }
        Tensor::stack(out, 1)
    }

    /// Log-probs of single reverse steps of stored chains under `model`, one (observation,
    /// step) pair per row, so that a minibatch can mix environment steps and denoising steps
    /// (docs/algorithms.md §3). `step[n]` is the chain index i of pair n (x_i -> x_{i+1} of the
    /// stored chain, i in 0..K); `x`, `next`: [N, Tp, Da]. Returns [N].
    pub fn pair_logprobs<B: Backend>(
        &self,
        model: &DiffusionModel<B>,
        obs: &ObsTensors<B>,
        x: Tensor<B, 3>,
        next: Tensor<B, 3>,
        step: &[usize],
    ) -> Tensor<B, 1> {
        let [n, tp, _] = x.dims();
        let device = x.device();
        let col = |f: &dyn Fn(&StepCoeffs) -> f64| {
            let v: Vec<f32> = step.iter().map(|&i| f(&self.rollout[i]) as f32).collect();
            Tensor::<B, 1>::from_data(TensorData::new(v, [n]), &device)
        };
        let t = col(&|c| c.t as f64);
        let out = model
            .denoiser
            .forward(x.clone(), t, model.encoder.forward(obs));
        let c3 = |f: &dyn Fn(&StepCoeffs) -> f64| col(f).reshape([n, 1, 1]);
        let clip = self.cfg.clip_x0;
        let x0 = match self.cfg.prediction {
            Prediction::Epsilon => {
                (x.clone() - out * c3(&|c| c.sqrt_one_minus_abar)) / c3(&|c| c.sqrt_abar)
            }
            Prediction::Sample => out,
            Prediction::VPrediction => {
                x.clone() * c3(&|c| c.sqrt_abar) - out * c3(&|c| c.sqrt_one_minus_abar)
            }
        }
        .clamp(-clip, clip);
        let mu = x0 * c3(&|c| c.c_x0) + x * c3(&|c| c.c_xt);
        let std = c3(&|c| self.logprob_std(c));
        let z = (next - mu) / std.clone();
        let [lo, hi] = self.cfg.logprob_bounds();
        let lp = (z.square() * -0.5 - std.log() - HALF_LN_2PI).clamp(lo, hi);
        lp.narrow(1, 0, self.action_horizon.min(tp))
            .mean_dims(&[1, 2])
            .reshape([n])
    }

    /// mu = c_x0 * clamp(x0_hat) + c_xt * x, x0_hat from the network output `out` (the noise,
    /// the chunk or the velocity, `[policy.diffusion] prediction`).
    fn mean<B: Backend>(&self, x: Tensor<B, 3>, out: Tensor<B, 3>, c: &StepCoeffs) -> Tensor<B, 3> {
        let clip = self.cfg.clip_x0;
        let x0 = match self.cfg.prediction {
            Prediction::Epsilon => (x.clone() - out * c.sqrt_one_minus_abar) / c.sqrt_abar,
            Prediction::Sample => out,
            Prediction::VPrediction => x.clone() * c.sqrt_abar - out * c.sqrt_one_minus_abar,
        }
        .clamp(-clip, clip);
        x0 * c.c_x0 + x * c.c_xt
    }

    /// Per-sample log-prob of one reverse step (see [`step_logp`]).
    fn logp<B: Backend>(
        &self,
        next: Tensor<B, 3>,
        mu: Tensor<B, 3>,
        c: &StepCoeffs,
    ) -> Tensor<B, 1> {
        step_logp(
            next,
            mu,
            self.logprob_std(c),
            self.action_horizon,
            self.cfg.logprob_bounds(),
        )
    }
}

/// log N(next; mu, std^2) per element, clamped to `clamp` per element, then averaged over the
/// first `ta` actions and every action dimension: [B, Tp, Da] -> [B] (docs/algorithms.md §2).
pub fn step_logp<B: Backend>(
    next: Tensor<B, 3>,
    mu: Tensor<B, 3>,
    std: f64,
    ta: usize,
    clamp: [f64; 2],
) -> Tensor<B, 1> {
    let [b, tp, _] = next.dims();
    let z = (next - mu) / std;
    let lp = (z.square() * -0.5 - (std.ln() + HALF_LN_2PI)).clamp(clamp[0], clamp[1]);
    lp.narrow(1, 0, ta.min(tp)).mean_dims(&[1, 2]).reshape([b])
}

/// Standard-normal samples drawn from `rng` (clipped to +-clip when given) as a tensor.
pub fn normal_tensor<B: Backend, const D: usize>(
    rng: &mut Rng,
    dims: [usize; D],
    clip: Option<f64>,
    device: &B::Device,
) -> Tensor<B, D> {
    let data = normal_values(rng, dims.iter().product(), clip);
    Tensor::from_data(TensorData::new(data, dims), device)
}

/// `n` standard-normal samples drawn from `rng` in order, clipped to +-clip when given.
pub(crate) fn normal_values(rng: &mut Rng, n: usize, clip: Option<f64>) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let z: f64 = rng.sample(StandardNormal);
            match clip {
                Some(c) => z.clamp(-c, c) as f32,
                None => z as f32,
            }
        })
        .collect()
}

/// Where the sampling noise of a batch comes from.
///
/// `Shared` draws the whole batch row-major from one stream (training rollouts, evaluation);
/// `PerRow` gives row b its own stream, so a row's sample does not depend on which other rows
/// share its batch (a policy server batching independent requests).
pub enum Noise<'a> {
    /// One stream for the batch.
    Shared(&'a mut Rng),
    /// One stream per batch row (its length is the batch size).
    PerRow(&'a mut [Rng]),
    /// Values drawn beforehand: each draw takes the next vector, whose length must be the
    /// draw's element count (a run of rows of a batch whose noise was drawn `Shared`).
    Given(std::collections::VecDeque<Vec<f32>>),
}

impl Noise<'_> {
    /// Standard-normal samples of shape `dims` (dims[0] = batch), clipped to +-clip when given.
    pub fn normal<B: Backend, const D: usize>(
        &mut self,
        dims: [usize; D],
        clip: Option<f64>,
        device: &B::Device,
    ) -> Tensor<B, D> {
        match self {
            Noise::Shared(rng) => normal_tensor(rng, dims, clip, device),
            Noise::PerRow(rngs) => {
                assert_eq!(rngs.len(), dims[0], "one noise stream per batch row");
                let per_row: usize = dims[1..].iter().product();
                let data: Vec<f32> = rngs
                    .iter_mut()
                    .flat_map(|rng| {
                        (0..per_row)
                            .map(|_| {
                                let z: f64 = rng.sample(StandardNormal);
                                clip.map_or(z, |c| z.clamp(-c, c)) as f32
                            })
                            .collect::<Vec<_>>()
                    })
                    .collect();
                Tensor::from_data(TensorData::new(data, dims), device)
            }
            Noise::Given(draws) => {
                let data = draws.pop_front().expect("a drawn noise vector per draw");
                assert_eq!(
                    data.len(),
                    dims.iter().product::<usize>(),
                    "drawn noise of the draw's size"
                );
                Tensor::from_data(TensorData::new(data, dims), device)
            }
        }
    }
}
