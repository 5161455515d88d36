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
/// n / (n + 2) = 1 in f32, so large inputs cannot overflow. On the CPU backend one pass over the
/// elements computes [`mish_composed`]'s values and gradients bit for bit (`crate::fused`).
pub fn mish<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    crate::fused::mish(x).unwrap_or_else(mish_composed)
}

/// [`mish`] composed of tensor operations: what every backend but the CPU one runs.
pub fn mish_composed<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let e = x.clone().clamp_max(20.0).exp();
    let n = e.clone() * (e + 2.0);
    x * n.clone() / (n + 2.0)
}

/// GELU, x Phi(x) with the exact normal CDF (Burn's `activation::gelu`): on the CPU backend its
/// forward pass keeps erf for the backward pass, bit for bit Burn's values and gradients
/// (`crate::fused`).
pub fn gelu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    crate::fused::gelu(x).unwrap_or_else(activation::gelu)
}

/// tanh (Burn's `activation::tanh`): on the CPU backend one node that computes it in vector
/// registers and keeps it for the backward pass, bit for bit Burn's values and gradients
/// (`crate::fused`).
pub fn tanh<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    crate::fused::tanh(x).unwrap_or_else(activation::tanh)
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

    /// Inputs over the range a network sees, the cap at 20 and beyond, signed zeros and
    /// tiny values.
    fn probe_inputs() -> Vec<f32> {
        let mut xs: Vec<f32> = (-4000..=4000).map(|i| i as f32 * 0.00731).collect();
        xs.extend([
            -90.0, -40.0, -1e-30, -0.0, 0.0, 1e-30, 19.999, 20.0, 20.001, 25.0, 90.0, 1e30,
        ]);
        xs
    }

    fn bits(t: Vec<f32>) -> Vec<u32> {
        t.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn one_pass_gelu_gives_burns_values_and_gradients_bit_for_bit() {
        type B = burn::backend::Flex;
        let xs = probe_inputs();
        let n = xs.len();
        let t = || Tensor::<B, 1>::from_data(TensorData::new(xs.clone(), [n]), &Default::default());
        // The CPU backend takes the one-pass node (else this test would compare Burn with itself).
        assert!(crate::fused::gelu(t()).is_ok());
        assert!(
            crate::fused::gelu(Tensor::<Ad, 1>::from_data(
                t().into_data(),
                &Default::default()
            ))
            .is_ok()
        );
        let fused: Vec<f32> = gelu(t()).into_data().into_vec().unwrap();
        let burns: Vec<f32> = activation::gelu(t()).into_data().into_vec().unwrap();
        assert_eq!(bits(fused), bits(burns));
        let (fx, fw) = grads_of(gelu, &xs, 0.0);
        let (cx, cw) = grads_of(activation::gelu, &xs, 0.0);
        assert_eq!(fw, cw);
        for (i, (f, c)) in fx.iter().zip(&cx).enumerate() {
            assert_eq!(f.to_bits(), c.to_bits(), "x = {}: {f} against {c}", xs[i]);
        }
    }

    #[test]
    fn one_pass_tanh_gives_burns_values_and_gradients_bit_for_bit() {
        type B = burn::backend::Flex;
        let mut xs = probe_inputs();
        xs.extend([-22.0, 21.999, 22.0, 1.0, -1.0, 0.34657, 1.0397, f32::NAN]);
        let n = xs.len();
        let t = || Tensor::<B, 1>::from_data(TensorData::new(xs.clone(), [n]), &Default::default());
        // The CPU backend takes the one-pass node (else this test would compare Burn with itself).
        assert!(crate::fused::tanh(t()).is_ok());
        assert!(
            crate::fused::tanh(Tensor::<Ad, 1>::from_data(
                t().into_data(),
                &Default::default()
            ))
            .is_ok()
        );
        let fused: Vec<f32> = tanh(t()).into_data().into_vec().unwrap();
        let burns: Vec<f32> = activation::tanh(t()).into_data().into_vec().unwrap();
        assert_eq!(bits(fused), bits(burns));
        let xs = &xs[..n - 1]; // gradients: without the NaN, which would spread to w's
        let (fx, fw) = grads_of(tanh, xs, 0.0);
        let (cx, cw) = grads_of(activation::tanh, xs, 0.0);
        assert_eq!(fw, cw);
        for (i, (f, c)) in fx.iter().zip(&cx).enumerate() {
            assert_eq!(f.to_bits(), c.to_bits(), "x = {}: {f} against {c}", xs[i]);
        }
        // A non-contiguous input (the keypoint read-out's narrowed, transposed scores) is read
        // in its logical order.
        let m = Tensor::<B, 2>::from_data(
            TensorData::new(xs[..6000].to_vec(), [60, 100]),
            &Default::default(),
        );
        let fused: Vec<f32> = tanh(m.clone().transpose().narrow(0, 10, 50))
            .into_data()
            .into_vec()
            .unwrap();
        let burns: Vec<f32> = activation::tanh(m.transpose().narrow(0, 10, 50))
            .into_data()
            .into_vec()
            .unwrap();
        assert_eq!(bits(fused), bits(burns));
    }

    #[test]
    fn one_pass_mish_gives_the_composed_values_bit_for_bit() {
        type B = burn::backend::Flex;
        let xs = probe_inputs();
        let t = || {
            Tensor::<B, 2>::from_data(
                TensorData::new(xs.clone(), [1, xs.len()]),
                &Default::default(),
            )
        };
        // The CPU backend takes the one-pass node (else this test would compare the composed
        // version with itself), with or without autodiff.
        assert!(crate::fused::mish(t()).is_ok());
        assert!(
            crate::fused::mish(Tensor::<Ad, 2>::from_data(
                t().into_data(),
                &Default::default()
            ))
            .is_ok()
        );
        let fused: Vec<f32> = mish(t()).into_data().into_vec().unwrap();
        let composed: Vec<f32> = mish_composed(t()).into_data().into_vec().unwrap();
        assert_eq!(bits(fused), bits(composed));
        // A transposed (non-contiguous) input is read in its logical order.
        let m = Tensor::<B, 2>::from_data(
            TensorData::new(xs[..6000].to_vec(), [60, 100]),
            &Default::default(),
        );
        let fused: Vec<f32> = mish(m.clone().transpose()).into_data().into_vec().unwrap();
        let composed: Vec<f32> = mish_composed(m.transpose()).into_data().into_vec().unwrap();
        assert_eq!(bits(fused), bits(composed));
    }

    /// Gradients at x and at w of sum(y w + y y) (+ `branch` sum(sin h)), y = act(h), h = 1.5 x.
    fn grads_of(
        act: fn(Tensor<Ad, 1>) -> Tensor<Ad, 1>,
        xs: &[f32],
        branch: f32,
    ) -> (Vec<f32>, Vec<u32>) {
        let n = xs.len();
        let device = Default::default();
        let w: Vec<f32> = (0..n).map(|i| ((i % 13) as f32 - 6.0) * 0.37).collect();
        let w = Tensor::<Ad, 1>::from_data(TensorData::new(w, [n]), &device).require_grad();
        let x =
            Tensor::<Ad, 1>::from_data(TensorData::new(xs.to_vec(), [n]), &device).require_grad();
        let h = x.clone() * 1.5;
        let y = act(h.clone());
        let mut loss = (y.clone() * w.clone() + y.clone() * y).sum();
        if branch != 0.0 {
            loss = loss + (h.sin() * branch).sum();
        }
        let g = loss.backward();
        let gx: Vec<f32> = x.grad(&g).unwrap().into_data().into_vec().unwrap();
        let gw: Vec<f32> = w.grad(&g).unwrap().into_data().into_vec().unwrap();
        (gx, bits(gw))
    }

    type Ad = burn::backend::Autodiff<burn::backend::Flex>;

    /// The gradients through the one-pass node equal those through the composed graph bit for
    /// bit when the activation's input feeds nothing else (a layer's output, as in every
    /// network here; the output may be used many times). When the input feeds another branch
    /// too, the composed graph sums three gradients there in its own order and the one-pass
    /// node two, so they agree up to that rounding.
    #[test]
    fn one_pass_mish_gives_the_composed_gradients_bit_for_bit() {
        let xs = probe_inputs();
        let (fx, fw) = grads_of(mish, &xs, 0.0);
        let (cx, cw) = grads_of(mish_composed, &xs, 0.0);
        assert_eq!(fw, cw);
        for (i, (f, c)) in fx.iter().zip(&cx).enumerate() {
            assert_eq!(f.to_bits(), c.to_bits(), "x = {}: {f} against {c}", xs[i]);
        }
        let (fx, fw) = grads_of(mish, &xs, 0.25);
        let (cx, cw) = grads_of(mish_composed, &xs, 0.25);
        assert_eq!(fw, cw);
        for (i, (f, c)) in fx.iter().zip(&cx).enumerate() {
            assert!(
                f == c || (f - c).abs() <= 1e-6 * c.abs().max(1.0),
                "x = {}: {f} against {c}",
                xs[i]
            );
        }
        // Without a gradient to track, the node computes the values alone.
        let n = xs.len();
        let x = Tensor::<Ad, 1>::from_data(TensorData::new(xs, [n]), &Default::default());
        let got: Vec<f32> = mish(x.clone()).into_data().into_vec().unwrap();
        let want: Vec<f32> = mish_composed(x).into_data().into_vec().unwrap();
        assert_eq!(bits(got), bits(want));
    }

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
