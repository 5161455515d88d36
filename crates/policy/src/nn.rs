//! Small building blocks shared by the networks: activations, sinusoidal step embeddings,
//! MLPs.

use burn::module::{Module, ModuleMapper, Param};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::config::Activation;

/// Applies `act` element-wise.
pub fn activate<B: Backend, const D: usize>(act: Activation, x: Tensor<B, D>) -> Tensor<B, D> {
    match act {
        Activation::Mish => mish(x),
        Activation::Silu => activation::silu(x),
        Activation::Relu => activation::relu(x),
    }
}

/// Mish, x * tanh(softplus(x)), with one transcendental instead of three:
/// tanh(ln(1 + e^x)) = n / (n + 2) with n = e^x (e^x + 2). The exponent is capped at 20, where
/// n / (n + 2) = 1 in f32, so large inputs cannot overflow.
pub fn mish<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let e = x.clone().clamp_max(20.0).exp();
    let n = e.clone() * (e + 2.0);
    x * n.clone() / (n + 2.0)
}

/// Sinusoidal embedding of (float) timesteps, [B] -> [B, dim]: the first half sin, the second
/// half cos, frequencies exp(-ln(10000) i / (dim/2 - 1)) (Diffusion Policy's SinusoidalPosEmb).
pub fn sinusoidal_embedding<B: Backend>(t: Tensor<B, 1>, dim: usize) -> Tensor<B, 2> {
    let half = dim / 2;
    let scale = (10_000f64).ln() / (half as f64 - 1.0).max(1.0);
    let freqs: Vec<f32> = (0..half)
        .map(|i| (-(i as f64) * scale).exp() as f32)
        .collect();
    let device = t.device();
    let freqs = Tensor::<B, 1>::from_data(TensorData::new(freqs, [half]), &device);
    let b = t.dims()[0];
    let arg = t.reshape([b, 1]) * freqs.reshape([1, half]);
    Tensor::cat(vec![arg.clone().sin(), arg.cos()], 1)
}

/// A plain MLP: Linear -> act -> ... -> Linear (no activation after the last layer).
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    layers: Vec<Linear<B>>,
    act: Activation,
}

impl<B: Backend> Mlp<B> {
    /// Widths `[in, h1, ..., out]`.
    pub fn new(widths: &[usize], act: Activation, device: &B::Device) -> Self {
        let layers = widths
            .windows(2)
            .map(|w| LinearConfig::new(w[0], w[1]).init(device))
            .collect();
        Self { layers, act }
    }

    /// [B, in] -> [B, out].
    pub fn forward(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
        let n = self.layers.len();
        for (i, l) in self.layers.iter().enumerate() {
            x = l.forward(x);
            if i + 1 < n {
                x = activate(self.act, x);
            }
        }
        x
    }
}

/// Step embedding: sinusoidal -> Linear(E, 2E) -> act -> Linear(2E, E).
#[derive(Module, Debug)]
pub struct StepEmbedding<B: Backend> {
    mlp: Mlp<B>,
    dim: usize,
}

impl<B: Backend> StepEmbedding<B> {
    /// An embedding of width `dim`.
    pub fn new(dim: usize, act: Activation, device: &B::Device) -> Self {
        Self {
            mlp: Mlp::new(&[dim, 2 * dim, dim], act, device),
            dim,
        }
    }

    /// [B] float timesteps -> [B, dim].
    pub fn forward(&self, t: Tensor<B, 1>) -> Tensor<B, 2> {
        self.mlp.forward(sinusoidal_embedding(t, self.dim))
    }

    /// Output width.
    pub fn dim(&self) -> usize {
        self.dim
    }
}

/// Marks every float parameter of a module as frozen (no gradient, so no update).
pub(crate) struct Freeze;

impl<B: Backend> ModuleMapper<B> for Freeze {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, t, mapper) = param.consume();
        Param::from_mapped_value(id, t.set_require_grad(false), mapper)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_mish_equals_the_definition() {
        type B = burn::backend::Flex;
        let device = Default::default();
        let xs: Vec<f32> = (-400..=400).map(|i| i as f32 * 0.1).collect();
        let t = Tensor::<B, 1>::from_data(TensorData::new(xs.clone(), [xs.len()]), &device);
        let got: Vec<f32> = mish(t).into_data().convert::<f32>().into_vec().unwrap();
        for (x, g) in xs.iter().zip(got) {
            let x = f64::from(*x);
            let want = x * (1.0 + x.exp()).ln().tanh();
            assert!(
                (f64::from(g) - want).abs() < 1e-5 * want.abs().max(1.0),
                "mish({x}) = {g}, want {want}"
            );
        }
    }
}
