//! Denoisers eps_theta(x_t, t, cond): a residual MLP (fast, the CPU default) and the 1-D
//! temporal U-Net of Diffusion Policy.

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::config::{Activation, DenoiserConfig, DenoiserKind};
use crate::nn::{StepEmbedding, activate};
use crate::unet::UNet1d;

/// Residual MLP over the flattened chunk: concat(x, step embedding, cond) -> Linear(H) ->
/// `blocks` x [h + Linear(act(Linear(h)))] -> Linear(act(h)) -> eps.
#[derive(Module, Debug)]
pub struct ResidualMlp<B: Backend> {
    step: StepEmbedding<B>,
    input: Linear<B>,
    blocks: Vec<(Linear<B>, Linear<B>)>,
    output: Linear<B>,
    #[module(skip)]
    act: Activation,
}

impl<B: Backend> ResidualMlp<B> {
    /// A denoiser for chunks of `pred_horizon` x `action_dim` conditioned on `cond_dim` features.
    pub fn new(
        pred_horizon: usize,
        action_dim: usize,
        cond_dim: usize,
        cfg: &DenoiserConfig,
        device: &B::Device,
    ) -> Self {
        let flat = pred_horizon * action_dim;
        let h = cfg.hidden;
        Self {
            step: StepEmbedding::new(cfg.step_embed_dim, cfg.activation, device),
            input: LinearConfig::new(flat + cfg.step_embed_dim + cond_dim, h).init(device),
            blocks: (0..cfg.blocks)
                .map(|_| {
                    (
                        LinearConfig::new(h, h).init(device),
                        LinearConfig::new(h, h).init(device),
                    )
                })
                .collect(),
            output: LinearConfig::new(h, flat).init(device),
            act: cfg.activation,
        }
    }

    /// x: [B, Tp, Da], t: [B], cond: [B, C] -> [B, Tp, Da].
    pub fn forward(&self, x: Tensor<B, 3>, t: Tensor<B, 1>, cond: Tensor<B, 2>) -> Tensor<B, 3> {
        let [b, tp, da] = x.dims();
        let emb = self.step.forward(t);
        let mut h = self
            .input
            .forward(Tensor::cat(vec![x.reshape([b, tp * da]), emb, cond], 1));
        for (l1, l2) in &self.blocks {
            h = h.clone() + l2.forward(activate(self.act, l1.forward(h)));
        }
        self.output
            .forward(activate(self.act, h))
            .reshape([b, tp, da])
    }
}

/// One of the denoiser architectures (Burn modules cannot be boxed, so variants differ in size).
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Denoiser<B: Backend> {
    /// Residual MLP.
    Mlp(ResidualMlp<B>),
    /// Temporal U-Net with FiLM.
    Unet(UNet1d<B>),
}

impl<B: Backend> Denoiser<B> {
    /// Builds the configured architecture.
    pub fn new(
        pred_horizon: usize,
        action_dim: usize,
        cond_dim: usize,
        cfg: &DenoiserConfig,
        device: &B::Device,
    ) -> Self {
        match cfg.kind {
            DenoiserKind::Mlp => Self::Mlp(ResidualMlp::new(
                pred_horizon,
                action_dim,
                cond_dim,
                cfg,
                device,
            )),
            DenoiserKind::Unet => Self::Unet(UNet1d::new(action_dim, cond_dim, cfg, device)),
        }
    }

    /// x: [B, Tp, Da], t: [B] float timesteps, cond: [B, C] -> predicted noise [B, Tp, Da].
    pub fn forward(&self, x: Tensor<B, 3>, t: Tensor<B, 1>, cond: Tensor<B, 2>) -> Tensor<B, 3> {
        match self {
            Self::Mlp(m) => m.forward(x, t, cond),
            Self::Unet(m) => m.forward(x, t, cond),
        }
    }
}
