//! Gaussian MLP policy over the whole action chunk (the baseline), with a learned
//! state-independent standard deviation and exact log-probabilities.
//!
//! It exposes the same chain interface as the diffusion policy with a chain of length one:
//! x_1 is the standard-normal draw and x_0 = mean + std * x_1 is the action chunk.

use burn::module::{Module, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::config::{Activation, EncoderConfig, GaussianConfig};
use crate::diffusion::{ChainSample, Noise, SampleMode};
use crate::encoder::{ImageShape, ObsEncoder, ObsTensors};
use crate::nn::Mlp;

const HALF_LN_2PI: f64 = 0.918_938_533_204_672_8;

/// Encoder + mean MLP + log-std parameters.
#[derive(Module, Debug)]
pub struct GaussianModel<B: Backend> {
    /// Observation encoder.
    pub encoder: ObsEncoder<B>,
    mean: Mlp<B>,
    log_std: Param<Tensor<B, 1>>,
    #[module(skip)]
    min_std: f64,
    #[module(skip)]
    noise_clip: f64,
    #[module(skip)]
    chunk: [usize; 2],
}

impl<B: Backend> GaussianModel<B> {
    /// Builds the networks.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        obs_horizon: usize,
        state_dim: usize,
        image: Option<ImageShape>,
        vocab_size: Option<usize>,
        pred_horizon: usize,
        action_dim: usize,
        encoder: &EncoderConfig,
        cfg: &GaussianConfig,
        noise_clip: f64,
        device: &B::Device,
    ) -> Self {
        let encoder = ObsEncoder::new(
            obs_horizon,
            state_dim,
            image,
            vocab_size,
            0,
            encoder,
            Activation::Mish,
            device,
        );
        let flat = pred_horizon * action_dim;
        let mut widths = vec![encoder.out_dim()];
        widths.extend(&cfg.hidden);
        widths.push(flat);
        let log_std = Tensor::full([flat], cfg.init_std.ln() as f32, device);
        Self {
            mean: Mlp::new(&widths, Activation::Mish, device),
            encoder,
            log_std: Param::from_tensor(log_std),
            min_std: cfg.min_std,
            noise_clip,
            chunk: [pred_horizon, action_dim],
        }
    }

    fn mean_std(&self, obs: &ObsTensors<B>) -> (Tensor<B, 3>, Tensor<B, 3>) {
        let [tp, da] = self.chunk;
        let mean = self.mean.forward(self.encoder.forward(obs));
        let b = mean.dims()[0];
        let std = self
            .log_std
            .val()
            .exp()
            .clamp_min(self.min_std)
            .reshape([1, tp, da]);
        (mean.reshape([b, tp, da]), std)
    }

    /// Per-sample log-prob of `actions` [B, Tp, Da], mean over the first `ta` actions.
    pub fn logp(&self, obs: &ObsTensors<B>, actions: Tensor<B, 3>, ta: usize) -> Tensor<B, 1> {
        let (mean, std) = self.mean_std(obs);
        let b = actions.dims()[0];
        let z = (actions - mean) / std.clone();
        let lp = z.square() * -0.5 - std.log() - HALF_LN_2PI;
        lp.narrow(1, 0, ta).mean_dims(&[1, 2]).reshape([b])
    }

    /// Samples action chunks (deterministic mode returns the mean).
    pub fn sample(
        &self,
        obs: &ObsTensors<B>,
        mode: SampleMode,
        record: bool,
        ta: usize,
        noise: &mut Noise<'_>,
    ) -> ChainSample<B> {
        let (mean, std) = self.mean_std(obs);
        let dims = mean.dims();
        let device = mean.device();
        let z = match mode {
            SampleMode::Deterministic => Tensor::zeros(dims, &device),
            SampleMode::Stochastic => noise.normal::<B, 3>(dims, Some(self.noise_clip), &device),
        };
        let actions = mean.clone() + z.clone() * std.clone();
        let logp = record.then(|| {
            let zz = (actions.clone() - mean) / std.clone();
            let lp = zz.square() * -0.5 - std.log() - HALF_LN_2PI;
            lp.narrow(1, 0, ta).mean_dims(&[1, 2]).reshape([dims[0], 1])
        });
        ChainSample {
            chain: record.then(|| Tensor::stack(vec![z, actions.clone()], 1)),
            actions,
            logp,
        }
    }
}
