//! The 1-D temporal U-Net with FiLM conditioning of Diffusion Policy (Chi et al. 2023,
//! `ConditionalUnet1D`): a denoiser eps_theta(x_t, t, cond) over an action chunk, convolving
//! along the prediction horizon Tp with the action dimensions as channels.
//!
//! Layout, for `unet_down_dims = [d_0, ..., d_{L-1}]`:
//!
//! ```text
//! global = concat(StepEmbedding(t), cond)
//! down level i (0..L):   ResBlock(d_{i-1} or Da -> d_i), ResBlock(d_i -> d_i), skip_i,
//!                         Downsample1d unless i = L-1
//! mid:                   ResBlock(d_{L-1} -> d_{L-1}) x 2
//! up level j (0..L-1):   concat(x, skip_{L-1-j}), ResBlock(2 d_{L-1-j} -> d_{L-2-j}),
//!                         ResBlock(d_{L-2-j} -> d_{L-2-j}), Upsample1d
//! final:                 Conv1dBlock(d_0 -> d_0), Conv1d 1x1 (d_0 -> Da)
//! ```
//!
//! As in the reference implementation the up path has L-1 levels, each of which upsamples, so
//! the highest-resolution skip (`skip_0`) is not concatenated: the output resolution is reached
//! by the last upsample and refined by the final block.
//!
//! Tp need not be a power of two. Downsample1d (k=3, stride 2, padding 1) maps a length n to
//! ceil(n / 2) >= 1, so every level keeps at least one step however many levels there are;
//! Upsample1d (transposed, k=4, stride 2, padding 1) maps n to 2n, which is the skip length or
//! one more when that length was odd. The upsampled tensor is cropped at the end to the length
//! of the level it returns to (the extra step lies past the last input step), and would be
//! zero-padded at the end if it were ever shorter. So any Tp >= 1 comes back as Tp.
//!
//! The nonlinearity is `DenoiserConfig::activation` everywhere (step embedding, conv blocks and
//! the FiLM encoder); its default, Mish, is the paper's.

use burn::module::Module;
use burn::nn::conv::{Conv1d, Conv1dConfig, ConvTranspose1d, ConvTranspose1dConfig};
use burn::nn::{GroupNorm, GroupNormConfig, Linear, LinearConfig, PaddingConfig1d};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::config::{Activation, DenoiserConfig};
use crate::nn::{Freeze, StepEmbedding, activate};

/// Conv1d(k, padding k/2) -> GroupNorm -> activation, over [B, C, T] (length preserved for
/// odd k).
#[derive(Module, Debug)]
pub struct Conv1dBlock<B: Backend> {
    conv: Conv1d<B>,
    norm: GroupNorm<B>,
    #[module(skip)]
    act: Activation,
}

impl<B: Backend> Conv1dBlock<B> {
    /// `channels_in` -> `channels_out` with a temporal kernel of `kernel` steps; `groups` must
    /// divide `channels_out`.
    pub fn new(
        channels_in: usize,
        channels_out: usize,
        kernel: usize,
        groups: usize,
        act: Activation,
        device: &B::Device,
    ) -> Self {
        Self {
            conv: Conv1dConfig::new(channels_in, channels_out, kernel)
                .with_padding(PaddingConfig1d::Explicit(kernel / 2, kernel / 2))
                .init(device),
            norm: GroupNormConfig::new(groups, channels_out).init(device),
            act,
        }
    }

    /// [B, C_in, T] -> [B, C_out, T].
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        activate(self.act, self.norm.forward(self.conv.forward(x)))
    }
}

/// Residual block with FiLM conditioning (`ConditionalResidualBlock1D`):
///
/// h = block1(x); [scale, bias] = Linear(act(global)); h = scale * h + bias;
/// out = block2(h) + residual(x), where residual is a 1x1 conv when the widths differ.
#[derive(Module, Debug)]
pub struct ConditionalResidualBlock1d<B: Backend> {
    block1: Conv1dBlock<B>,
    block2: Conv1dBlock<B>,
    film: Linear<B>,
    residual: Option<Conv1d<B>>,
    #[module(skip)]
    channels_out: usize,
}

impl<B: Backend> ConditionalResidualBlock1d<B> {
    /// `channels_in` -> `channels_out`, conditioned on a global vector of width `global_dim`.
    pub fn new(
        channels_in: usize,
        channels_out: usize,
        global_dim: usize,
        cfg: &DenoiserConfig,
        device: &B::Device,
    ) -> Self {
        let block = |c_in| {
            Conv1dBlock::new(
                c_in,
                channels_out,
                cfg.unet_kernel,
                cfg.unet_groups,
                cfg.activation,
                device,
            )
        };
        Self {
            block1: block(channels_in),
            block2: block(channels_out),
            film: LinearConfig::new(global_dim, 2 * channels_out).init(device),
            residual: (channels_in != channels_out)
                .then(|| Conv1dConfig::new(channels_in, channels_out, 1).init(device)),
            channels_out,
        }
    }

    /// x: [B, C_in, T], `global_act`: the activated global condition [B, G] -> [B, C_out, T].
    ///
    /// The reference applies the activation inside every block's condition encoder; all blocks
    /// see the same global vector, so [`UNet1d::forward`] activates it once.
    pub fn forward(&self, x: Tensor<B, 3>, global_act: Tensor<B, 2>) -> Tensor<B, 3> {
        let b = x.dims()[0];
        let c = self.channels_out;
        let h = self.block1.forward(x.clone());
        let film = self.film.forward(global_act);
        let scale = film.clone().narrow(1, 0, c).reshape([b, c, 1]);
        let bias = film.narrow(1, c, c).reshape([b, c, 1]);
        let h = self.block2.forward(h * scale + bias);
        let skip = match &self.residual {
            Some(conv) => conv.forward(x),
            None => x,
        };
        h + skip
    }
}

/// One level of the contracting path.
#[derive(Module, Debug)]
pub struct DownLevel<B: Backend> {
    res1: ConditionalResidualBlock1d<B>,
    res2: ConditionalResidualBlock1d<B>,
    /// Conv1d(k=3, stride 2, padding 1); absent at the deepest level.
    downsample: Option<Conv1d<B>>,
}

/// One level of the expanding path.
#[derive(Module, Debug)]
pub struct UpLevel<B: Backend> {
    res1: ConditionalResidualBlock1d<B>,
    res2: ConditionalResidualBlock1d<B>,
    /// ConvTranspose1d(k=4, stride 2, padding 1).
    upsample: ConvTranspose1d<B>,
}

/// Diffusion Policy's temporal U-Net: x [B, Tp, Da], t [B], cond [B, C] -> eps [B, Tp, Da].
/// See the module documentation for the layout and how any Tp is handled.
#[derive(Module, Debug)]
pub struct UNet1d<B: Backend> {
    step: StepEmbedding<B>,
    down: Vec<DownLevel<B>>,
    mid: Vec<ConditionalResidualBlock1d<B>>,
    up: Vec<UpLevel<B>>,
    final_block: Conv1dBlock<B>,
    final_conv: Conv1d<B>,
    #[module(skip)]
    act: Activation,
    #[module(skip)]
    cond_dim: usize,
}

impl<B: Backend> ConditionalResidualBlock1d<B> {
    /// The same block with its FiLM layer frozen.
    fn with_frozen_film(mut self) -> Self {
        self.film = self.film.map(&mut Freeze);
        self
    }
}

impl<B: Backend> UNet1d<B> {
    /// The same U-Net with every block's FiLM layer frozen, and how many blocks there are.
    pub fn with_frozen_film(mut self) -> (Self, usize) {
        let n = 2 * (self.down.len() + self.up.len()) + self.mid.len();
        self.down = (self.down.into_iter())
            .map(|l| DownLevel {
                res1: l.res1.with_frozen_film(),
                res2: l.res2.with_frozen_film(),
                downsample: l.downsample,
            })
            .collect();
        self.mid = (self.mid.into_iter())
            .map(ConditionalResidualBlock1d::with_frozen_film)
            .collect();
        self.up = (self.up.into_iter())
            .map(|l| UpLevel {
                res1: l.res1.with_frozen_film(),
                res2: l.res2.with_frozen_film(),
                upsample: l.upsample,
            })
            .collect();
        (self, n)
    }

    /// A denoiser for chunks with `action_dim` channels conditioned on `cond_dim` features.
    ///
    /// # Panics
    /// If `cfg.unet_down_dims` is empty or `cfg.unet_groups` does not divide every width
    /// (both rejected by `PolicyConfig::validate`).
    pub fn new(
        action_dim: usize,
        cond_dim: usize,
        cfg: &DenoiserConfig,
        device: &B::Device,
    ) -> Self {
        let dims = &cfg.unet_down_dims;
        assert!(!dims.is_empty(), "unet_down_dims must not be empty");
        let levels = dims.len();
        let global_dim = cfg.step_embed_dim + cond_dim;
        let res =
            |c_in, c_out| ConditionalResidualBlock1d::new(c_in, c_out, global_dim, cfg, device);

        let down = (0..levels)
            .map(|i| {
                let c_in = if i == 0 { action_dim } else { dims[i - 1] };
                let c = dims[i];
                DownLevel {
                    res1: res(c_in, c),
                    res2: res(c, c),
                    downsample: (i + 1 < levels).then(|| {
                        Conv1dConfig::new(c, c, 3)
                            .with_stride(2)
                            .with_padding(PaddingConfig1d::Explicit(1, 1))
                            .init(device)
                    }),
                }
            })
            .collect();
        let deepest = dims[levels - 1];
        let mid = vec![res(deepest, deepest), res(deepest, deepest)];
        // Up level j returns from level L-1-j to level L-2-j.
        let up = (0..levels - 1)
            .map(|j| {
                let c_skip = dims[levels - 1 - j];
                let c = dims[levels - 2 - j];
                UpLevel {
                    res1: res(2 * c_skip, c),
                    res2: res(c, c),
                    upsample: ConvTranspose1dConfig::new([c, c], 4)
                        .with_stride(2)
                        .with_padding(1)
                        .init(device),
                }
            })
            .collect();

        Self {
            step: StepEmbedding::new(cfg.step_embed_dim, cfg.activation, device),
            down,
            mid,
            up,
            final_block: Conv1dBlock::new(
                dims[0],
                dims[0],
                cfg.unet_kernel,
                cfg.unet_groups,
                cfg.activation,
                device,
            ),
            final_conv: Conv1dConfig::new(dims[0], action_dim, 1).init(device),
            act: cfg.activation,
            cond_dim,
        }
    }

    /// x: [B, Tp, Da] noisy action chunk, t: [B] float timesteps, cond: [B, cond_dim] ->
    /// predicted noise [B, Tp, Da].
    pub fn forward(&self, x: Tensor<B, 3>, t: Tensor<B, 1>, cond: Tensor<B, 2>) -> Tensor<B, 3> {
        let emb = self.step.forward(t);
        let global = if self.cond_dim == 0 {
            emb
        } else {
            Tensor::cat(vec![emb, cond], 1)
        };
        let global = activate(self.act, global);

        // Channels-first: convolve along the horizon.
        let mut h = x.swap_dims(1, 2);
        let mut skips = Vec::with_capacity(self.down.len());
        for level in &self.down {
            h = level.res1.forward(h, global.clone());
            h = level.res2.forward(h, global.clone());
            skips.push(h.clone());
            if let Some(down) = &level.downsample {
                h = down.forward(h);
            }
        }
        for block in &self.mid {
            h = block.forward(h, global.clone());
        }
        for level in &self.up {
            let skip = skips.pop().expect("one skip per down level");
            h = level
                .res1
                .forward(Tensor::cat(vec![h, skip], 1), global.clone());
            h = level.res2.forward(h, global.clone());
            // The level this upsample returns to is the one whose skip is now on top.
            // There are L skips and L-1 up levels, so one is always left.
            let target = skips.last().expect("skip_0 outlives the up path").dims()[2];
            h = match_length(level.upsample.forward(h), target);
        }
        let eps = self.final_conv.forward(self.final_block.forward(h));
        eps.swap_dims(1, 2)
    }
}

/// Crops (at the end) or zero-pads (at the end) the time axis of [B, C, T] to `len`.
fn match_length<B: Backend>(x: Tensor<B, 3>, len: usize) -> Tensor<B, 3> {
    let [b, c, t] = x.dims();
    match t.cmp(&len) {
        std::cmp::Ordering::Equal => x,
        std::cmp::Ordering::Greater => x.narrow(2, 0, len),
        std::cmp::Ordering::Less => {
            let pad = Tensor::zeros([b, c, len - t], &x.device());
            Tensor::cat(vec![x, pad], 2)
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::backend::AutodiffBackend;
    use burn::tensor::{Distribution, Tensor, TensorData};

    use super::*;

    type Cpu = Flex;
    type Ad = Autodiff<Flex>;

    fn tiny_cfg(down_dims: &[usize]) -> DenoiserConfig {
        DenoiserConfig {
            step_embed_dim: 8,
            unet_down_dims: down_dims.to_vec(),
            unet_kernel: 3,
            unet_groups: 4,
            ..DenoiserConfig::default()
        }
    }

    fn inputs<B: Backend>(
        batch: usize,
        tp: usize,
        da: usize,
        cond_dim: usize,
        device: &B::Device,
    ) -> (Tensor<B, 3>, Tensor<B, 1>, Tensor<B, 2>) {
        let normal = Distribution::Normal(0.0, 1.0);
        let x = Tensor::random([batch, tp, da], normal, device);
        let t = Tensor::from_data(
            TensorData::new((0..batch).map(|i| (7 * i + 3) as f32).collect(), [batch]),
            device,
        );
        let cond = Tensor::random([batch, cond_dim], normal, device);
        (x, t, cond)
    }

    #[test]
    fn output_matches_input_shape_for_any_horizon() {
        let device = Default::default();
        // Two levels exercise an exact halving; three levels make odd lengths (10 -> 5 -> 3)
        // whose upsampled length has to be cropped back to the skip's.
        for dims in [&[8, 16][..], &[8, 16, 16][..]] {
            let net = UNet1d::<Cpu>::new(2, 5, &tiny_cfg(dims), &device);
            for tp in [8, 16, 10, 5, 3, 1] {
                let (x, t, cond) = inputs::<Cpu>(3, tp, 2, 5, &device);
                let eps = net.forward(x, t, cond);
                assert_eq!(eps.dims(), [3, tp, 2], "down_dims {dims:?}, Tp {tp}");
                let values = eps.into_data().to_vec::<f32>().unwrap();
                assert!(values.iter().all(|v| v.is_finite()), "Tp {tp}");
            }
        }
    }

    #[test]
    fn works_without_condition() {
        let device = Default::default();
        let net = UNet1d::<Cpu>::new(2, 0, &tiny_cfg(&[8, 16]), &device);
        let (x, t, cond) = inputs::<Cpu>(2, 8, 2, 0, &device);
        assert_eq!(net.forward(x, t, cond).dims(), [2, 8, 2]);
    }

    #[test]
    fn samples_in_a_batch_are_independent() {
        let device = Default::default();
        let net = UNet1d::<Cpu>::new(2, 5, &tiny_cfg(&[8, 16, 16]), &device);
        let (x, t, cond) = inputs::<Cpu>(2, 10, 2, 5, &device);
        let before = net.forward(x.clone(), t.clone(), cond.clone());

        // Change everything about sample 1.
        let (x2, _, cond2) = inputs::<Cpu>(2, 10, 2, 5, &device);
        let x = Tensor::cat(vec![x.narrow(0, 0, 1), x2.narrow(0, 1, 1)], 0);
        let cond = Tensor::cat(vec![cond.narrow(0, 0, 1), cond2.narrow(0, 1, 1)], 0);
        let t = Tensor::cat(
            vec![t.narrow(0, 0, 1), Tensor::from_data([42.0f32], &device)],
            0,
        );
        let after = net.forward(x, t, cond);

        let sample0 = |e: Tensor<Cpu, 3>| e.narrow(0, 0, 1).into_data().to_vec::<f32>().unwrap();
        let sample1 = |e: Tensor<Cpu, 3>| e.narrow(0, 1, 1).into_data().to_vec::<f32>().unwrap();
        for (a, b) in sample0(before.clone()).iter().zip(sample0(after.clone())) {
            assert!((a - b).abs() < 1e-5, "sample 0 changed: {a} vs {b}");
        }
        let moved = sample1(before)
            .iter()
            .zip(sample1(after))
            .any(|(a, b)| (a - b).abs() > 1e-4);
        assert!(moved, "sample 1 should depend on its own inputs");
    }

    /// Checks every float parameter has a finite, non-zero gradient.
    struct GradCheck<'a, B: AutodiffBackend> {
        grads: &'a B::Gradients,
        path: Vec<String>,
        checked: usize,
        failures: Vec<String>,
    }

    impl<B: AutodiffBackend> ModuleVisitor<B> for GradCheck<'_, B> {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_string());
        }

        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }

        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.checked += 1;
            let name = self.path.join(".");
            let Some(grad) = param.val().grad(self.grads) else {
                self.failures.push(format!("{name}: no gradient"));
                return;
            };
            let values = grad.into_data().to_vec::<f32>().unwrap();
            if !values.iter().all(|v| v.is_finite()) {
                self.failures.push(format!("{name}: non-finite gradient"));
            } else if values.iter().all(|v| *v == 0.0) {
                self.failures.push(format!("{name}: zero gradient"));
            }
        }
    }

    #[test]
    fn every_parameter_gets_a_finite_nonzero_gradient() {
        let device = Default::default();
        let net = UNet1d::<Ad>::new(2, 5, &tiny_cfg(&[8, 16, 16]), &device);
        let (x, t, cond) = inputs::<Ad>(3, 10, 2, 5, &device);
        let target = Tensor::<Ad, 3>::random([3, 10, 2], Distribution::Normal(0.0, 1.0), &device);
        let loss = (net.forward(x, t, cond) - target).square().mean();
        let grads = loss.backward();

        let mut check = GradCheck::<Ad> {
            grads: &grads,
            path: Vec::new(),
            checked: 0,
            failures: Vec::new(),
        };
        net.visit(&mut check);
        assert!(check.checked > 0, "no parameter visited");
        assert!(check.failures.is_empty(), "{:#?}", check.failures);
    }
}
