//! Denoisers eps_theta(x_t, t, cond): a residual MLP (fast, the CPU default), the 1-D
//! temporal U-Net of Diffusion Policy, and the joint multi-agent planner.

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::config::{Activation, DenoiserConfig, DenoiserKind};
use crate::nn::{Freeze, StepEmbedding, activate};
use crate::planner::{AgentLayout, JointPlanner};
use crate::unet::UNet1d;

/// Residual MLP over the flattened chunk: concat(x, step embedding, cond) -> Linear(H) ->
/// `blocks` x [h + Linear(act(Linear(h)))] -> Linear(act(h)) -> eps.
///
/// With `film`, every block also modulates its inner layer by the condition (FiLM, as the
/// U-Net's blocks do): h + Linear(act(Linear(h) * (1 + gamma) + beta)), where
/// [gamma, beta] = Linear(act(concat(step embedding, cond))) per block. The products let the
/// condition switch features of the state on and off, which a condition that only joins the
/// input learns slowly (docs/vla.md).
#[derive(Module, Debug)]
pub struct ResidualMlp<B: Backend> {
    step: StepEmbedding<B>,
    input: Linear<B>,
    blocks: Vec<(Linear<B>, Linear<B>)>,
    /// One FiLM layer per block, or none.
    film: Vec<Linear<B>>,
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
            film: (0..if cfg.film { cfg.blocks } else { 0 })
                .map(|_| LinearConfig::new(cfg.step_embed_dim + cond_dim, 2 * h).init(device))
                .collect(),
            output: LinearConfig::new(h, flat).init(device),
            act: cfg.activation,
        }
    }

    /// x: [B, Tp, Da], t: [B], cond: [B, C] -> [B, Tp, Da].
    pub fn forward(&self, x: Tensor<B, 3>, t: Tensor<B, 1>, cond: Tensor<B, 2>) -> Tensor<B, 3> {
        let [b, tp, da] = x.dims();
        let emb = self.step.forward(t);
        let film_in = (!self.film.is_empty())
            .then(|| activate(self.act, Tensor::cat(vec![emb.clone(), cond.clone()], 1)));
        let mut h = self
            .input
            .forward(Tensor::cat(vec![x.reshape([b, tp * da]), emb, cond], 1));
        for (i, (l1, l2)) in self.blocks.iter().enumerate() {
            let mut inner = l1.forward(h.clone());
            if let (Some(film), Some(z)) = (self.film.get(i), &film_in) {
                let w = inner.dims()[1];
                let gb = film.forward(z.clone());
                // Each half copied whole: a narrowed half is a strided view, which Burn's CPU
                // backend adds and multiplies element by element (forward and backward) but
                // copies as rows; the values are the same.
                let half = |from: usize| {
                    gb.clone()
                        .narrow(1, from, w)
                        .reshape([b * w])
                        .reshape([b, w])
                };
                inner = inner * (half(0) + 1.0) + half(w);
            }
            h = h + l2.forward(activate(self.act, inner));
        }
        self.output
            .forward(activate(self.act, h))
            .reshape([b, tp, da])
    }

    /// The same denoiser with its FiLM layers frozen, and how many there are.
    fn with_frozen_film(mut self) -> (Self, usize) {
        let n = self.film.len();
        self.film = self.film.into_iter().map(|l| l.map(&mut Freeze)).collect();
        (self, n)
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
    /// Joint multi-agent planner.
    Joint(JointPlanner<B>),
}

impl<B: Backend> Denoiser<B> {
    /// The same denoiser with every FiLM layer frozen (the residual MLP's with `film`, each
    /// U-Net block's), and how many were frozen (0 for the joint planner and an MLP without
    /// FiLM).
    pub fn with_frozen_film(self) -> (Self, usize) {
        match self {
            Self::Mlp(m) => {
                let (m, n) = m.with_frozen_film();
                (Self::Mlp(m), n)
            }
            Self::Unet(u) => {
                let (u, n) = u.with_frozen_film();
                (Self::Unet(u), n)
            }
            joint @ Self::Joint(_) => (joint, 0),
        }
    }

    /// Builds the configured architecture; the joint planner reads the agents' `layout`.
    pub fn new(
        pred_horizon: usize,
        action_dim: usize,
        cond_dim: usize,
        layout: &AgentLayout,
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
            DenoiserKind::Joint => {
                Self::Joint(JointPlanner::new(pred_horizon, layout, cfg, device))
            }
        }
    }

    /// x: [B, Tp, Da], t: [B] float timesteps, cond: [B, C] -> predicted noise [B, Tp, Da].
    pub fn forward(&self, x: Tensor<B, 3>, t: Tensor<B, 1>, cond: Tensor<B, 2>) -> Tensor<B, 3> {
        match self {
            Self::Mlp(m) => m.forward(x, t, cond),
            Self::Unet(m) => m.forward(x, t, cond),
            Self::Joint(m) => m.forward(x, t, cond),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::Module;
    use burn::tensor::TensorData;

    type Cpu = crate::CpuBackend;

    fn cfg(film: bool) -> DenoiserConfig {
        DenoiserConfig {
            hidden: 8,
            blocks: 2,
            step_embed_dim: 4,
            film,
            ..DenoiserConfig::default()
        }
    }

    /// FiLM adds one Linear(step + cond -> 2H) per block and nothing else; a config without it
    /// serialises as before the option existed.
    #[test]
    fn film_adds_one_modulation_layer_per_block() {
        let device = Default::default();
        let (tp, da, c) = (3, 2, 5);
        let plain = ResidualMlp::<Cpu>::new(tp, da, c, &cfg(false), &device);
        let film = ResidualMlp::<Cpu>::new(tp, da, c, &cfg(true), &device);
        assert_eq!(
            film.num_params() - plain.num_params(),
            2 * ((4 + c) * 16 + 16)
        );
        let json = serde_json::to_string(&cfg(false)).unwrap();
        assert!(!json.contains("film"), "{json}");
        assert!(
            serde_json::to_string(&cfg(true))
                .unwrap()
                .contains("\"film\":true")
        );
        let data = |n: usize| {
            (0..n)
                .map(|i| ((i * 7 % 11) as f32 - 5.0) / 5.0)
                .collect::<Vec<_>>()
        };
        let x =
            Tensor::<Cpu, 3>::from_data(TensorData::new(data(4 * tp * da), [4, tp, da]), &device);
        let t =
            Tensor::<Cpu, 1>::from_data(TensorData::new(vec![0.0f32, 3.0, 5.0, 9.0], [4]), &device);
        let cond = Tensor::<Cpu, 2>::from_data(TensorData::new(data(4 * c), [4, c]), &device);
        let out = film.forward(x.clone(), t.clone(), cond.clone());
        assert_eq!(out.dims(), [4, tp, da]);
        let v: Vec<f32> = out.into_data().convert::<f32>().into_vec().unwrap();
        assert!(v.iter().all(|x| x.is_finite()));
        // Another condition, another output.
        let other = film.forward(x, t, cond.clone() * 2.0);
        let w: Vec<f32> = other.into_data().convert::<f32>().into_vec().unwrap();
        assert_ne!(v, w);
    }
}
