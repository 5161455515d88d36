//! Mish, GELU and tanh as one node each on the CPU backend (Burn Flex, with or without
//! autodiff), bit for bit the values and gradients of the versions they replace.
//!
//! - **Mish.** Composed of tensor operations ([`crate::nn::mish_composed`]) it is seven
//!   element-wise passes forward, each allocating its result, and the autodiff graph keeps six
//!   intermediate tensors and runs about a dozen more passes backward, computing exp again:
//!   a fifth to a third of a Push-T BC step and a quarter of a GRPO update went there. Here the forward
//!   pass is one node (a loop for exp, in vector registers by [`crate::expf`], one for the
//!   rest), and it keeps e = exp(min(x, 20)) for the backward pass, one loop.
//! - **GELU.** Flex computes it in one pass already, but its backward pass computes
//!   erf(x / sqrt 2) again (with a scalar `erff`) beside the exp. Here the forward pass
//!   computes erf in vector registers ([`crate::erff`], `libm::erff`'s bits) and keeps
//!   1 + erf(x / sqrt 2), so the backward pass computes only the exp (in vector registers).
//! - **tanh.** Flex calls the C library's `tanhf` per element, and Burn's backward pass calls
//!   it again on the input. Here the forward pass computes it in vector registers
//!   ([`crate::tanhf`], the library's bits) and keeps it, so the backward pass is one loop.
//!
//! Each kernel repeats the replaced version's arithmetic operation for operation, in the same
//! order and with the same `exp`, `erff` and `tanhf` (or a vectorised version with the same
//! bits), and a kept value is the one recomputation would give, so no trained result moves
//! (docs/policy.md, "Mish and GELU in one pass"). Every other
//! backend (CUDA) and every other dtype takes the replaced version.

use std::any::Any;
use std::f32::consts::{PI, SQRT_2};

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use burn_flex::FlexTensor;

/// An element-wise activation whose forward pass keeps one value per element for its
/// backward pass.
trait Kernel: Copy + Send + std::fmt::Debug + 'static {
    /// The kept values of every element: the library calls (`exp`, `erff`).
    fn kept_all(self, x: &[f32]) -> Vec<f32>;
    /// The output at x given its kept value.
    fn output(self, x: f32, kept: f32) -> f32;
    /// The gradients at every element, given the kept values and the gradients `g` at the
    /// output.
    fn backward_all(self, x: &[f32], kept: &[f32], g: &[f32]) -> Vec<f32>;

    /// The outputs and the kept values of every element: the library calls in one pass
    /// ([`Kernel::kept_all`]), the rest of the arithmetic in a second that the compiler
    /// vectorises.
    fn forward_all(self, x: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let kept = self.kept_all(x);
        let y = x
            .iter()
            .zip(&kept)
            .map(|(&v, &k)| self.output(v, k))
            .collect();
        (y, kept)
    }

    /// The outputs alone (inference), in the same two passes over one buffer.
    fn output_all(self, x: &[f32]) -> Vec<f32> {
        let mut y = self.kept_all(x);
        for (y, &v) in y.iter_mut().zip(x) {
            *y = self.output(v, *y);
        }
        y
    }
}

/// Mish of an f32 tensor on Flex or `Autodiff<Flex>` as one node; `Err(x)` hands back any other
/// tensor untouched for [`crate::nn::mish_composed`].
pub(crate) fn mish<B: Backend, const D: usize>(
    x: Tensor<B, D>,
) -> Result<Tensor<B, D>, Tensor<B, D>> {
    dispatch(x, Mish)
}

/// GELU (erf form) of an f32 tensor on Flex or `Autodiff<Flex>`, keeping erf for the backward
/// pass; `Err(x)` hands back any other tensor untouched for Burn's `activation::gelu`.
pub(crate) fn gelu<B: Backend, const D: usize>(
    x: Tensor<B, D>,
) -> Result<Tensor<B, D>, Tensor<B, D>> {
    dispatch(x, Gelu)
}

/// tanh of an f32 tensor on Flex or `Autodiff<Flex>` as one node that keeps its output for the
/// backward pass; `Err(x)` hands back any other tensor untouched for Burn's
/// `activation::tanh`.
pub(crate) fn tanh<B: Backend, const D: usize>(
    x: Tensor<B, D>,
) -> Result<Tensor<B, D>, Tensor<B, D>> {
    dispatch(x, Tanh)
}

fn dispatch<B: Backend, const D: usize, K: Kernel>(
    x: Tensor<B, D>,
    kernel: K,
) -> Result<Tensor<B, D>, Tensor<B, D>> {
    if x.dtype() != DType::F32 {
        return Err(x);
    }
    let prim: Box<dyn Any> = Box::new(x.into_primitive().tensor());
    let prim = match prim.downcast::<FlexTensor>() {
        Ok(t) => return Ok(back::<B, D>(Box::new(outputs(&t, kernel)))),
        Err(p) => p,
    };
    let prim = match prim.downcast::<FloatTensor<Autodiff<Flex>>>() {
        Ok(t) => return Ok(back::<B, D>(Box::new(autodiff_op(*t, kernel)))),
        Err(p) => p,
    };
    Err(back::<B, D>(prim))
}

/// The tensor of backend `B` whose float primitive `prim` holds (the caller downcast it from
/// that very type, so the downcast back cannot fail).
fn back<B: Backend, const D: usize>(prim: Box<dyn Any>) -> Tensor<B, D> {
    match prim.downcast::<FloatTensor<B>>() {
        Ok(p) => Tensor::from_primitive(TensorPrimitive::Float(*p)),
        Err(_) => unreachable!("a primitive of this backend, by construction"),
    }
}

/// Mish as [`crate::nn::mish_composed`] computes it: c = clamp_max(x, 20) (a mask fill where
/// x > 20), e = exp(c), n = e (e + 2), y = (x n) / (n + 2). Kept: e.
#[derive(Debug, Clone, Copy)]
struct Mish;

/// The cap of the exponent: n / (n + 2) is 1 in f32 there, so larger inputs cannot overflow.
const CAP: f32 = 20.0;

/// min(x, 20) as the composed version's mask fill computes it (NaN stays NaN).
#[inline]
fn cap(x: f32) -> f32 {
    if x > CAP { CAP } else { x }
}

impl Kernel for Mish {
    /// exp(min(x, 20)) in vector registers, the bits of `f32::exp` (crate::expf).
    fn kept_all(self, x: &[f32]) -> Vec<f32> {
        crate::expf::exp_of(x, cap)
    }

    #[inline]
    fn output(self, x: f32, e: f32) -> f32 {
        let n = e * (e + 2.0);
        (x * n) / (n + 2.0)
    }

    fn backward_all(self, x: &[f32], e: &[f32], g: &[f32]) -> Vec<f32> {
        x.iter()
            .zip(e)
            .zip(g)
            .map(|((&x, &e), &g)| self.gradient(x, e, g))
            .collect()
    }
}

impl Mish {
    /// As Burn's autodiff computes it through the composed graph: the division (g / b as
    /// g x recip(b); -a / b^2 with b^2 as b x b), the two products, the two scalar additions,
    /// exp (g x its output) and the clamp's mask fill, each node's two incoming gradients
    /// summed.
    #[inline]
    fn gradient(self, x: f32, e: f32, g: f32) -> f32 {
        let e2 = e + 2.0;
        let n = e * e2;
        let n2 = n + 2.0;
        let xn = x * n;
        let g_xn = g * (1.0 / n2);
        let g_n2 = g * (-xn / (n2 * n2));
        let g_x_product = g_xn * n;
        let g_n = g_xn * x + g_n2;
        let g_e = g_n * e2 + g_n * e;
        let g_x_clamp = if x > CAP { 0.0 } else { g_e * e };
        g_x_product + g_x_clamp
    }
}

/// GELU as Burn Flex computes it: y = 0.5 x (1 + erf(x / sqrt 2)), and backward
/// g (0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi)). Kept: 1 + erf(x / sqrt 2).
#[derive(Debug, Clone, Copy)]
struct Gelu;

/// -x^2 / 2, the exponent of the Gaussian density in GELU's gradient.
#[inline]
fn gauss_arg(x: f32) -> f32 {
    -0.5 * x * x
}

impl Gelu {
    /// The gradient at x given the kept 1 + erf(x / sqrt 2) and exp(-x^2 / 2).
    #[inline]
    fn gradient(self, x: f32, t: f32, g: f32, gauss: f32) -> f32 {
        let inv_sqrt_2pi: f32 = 1.0 / (2.0 * PI).sqrt();
        let cdf = 0.5 * t;
        let pdf = inv_sqrt_2pi * gauss;
        g * (cdf + x * pdf)
    }
}

impl Kernel for Gelu {
    /// erf(x / sqrt 2) in vector registers first, the bits of `libm::erff` (crate::erff).
    fn kept_all(self, x: &[f32]) -> Vec<f32> {
        let mut kept = crate::erff::erf_of(x, |v| v / SQRT_2);
        for t in &mut kept {
            *t += 1.0;
        }
        kept
    }

    #[inline]
    fn output(self, x: f32, t: f32) -> f32 {
        0.5 * x * t
    }

    /// exp(-x^2 / 2) in vector registers first, the bits of `f32::exp` (crate::expf).
    fn backward_all(self, x: &[f32], t: &[f32], g: &[f32]) -> Vec<f32> {
        let mut out = crate::expf::exp_of(x, gauss_arg);
        for (((o, &x), &t), &g) in out.iter_mut().zip(x).zip(t).zip(g) {
            *o = self.gradient(x, t, g, *o);
        }
        out
    }
}

/// tanh as Burn computes it: y = tanh(x) (the C library's `tanhf`, here in vector registers
/// by [`crate::tanhf`], the same bits), and backward g (1 - y^2), with y computed again from x
/// and 1 - y^2 as -(y y) + 1. Kept: y, so the backward pass computes no tanh.
#[derive(Debug, Clone, Copy)]
struct Tanh;

impl Kernel for Tanh {
    fn kept_all(self, x: &[f32]) -> Vec<f32> {
        crate::tanhf::tanh_of(x)
    }

    #[inline]
    fn output(self, _: f32, y: f32) -> f32 {
        y
    }

    fn backward_all(self, _: &[f32], y: &[f32], g: &[f32]) -> Vec<f32> {
        y.iter()
            .zip(g)
            .map(|(&y, &g)| g * (-(y * y) + 1.0))
            .collect()
    }
}

/// The kernel's outputs over the elements of an f32 Flex tensor, into a new contiguous one.
fn outputs<K: Kernel>(x: &FlexTensor, kernel: K) -> FlexTensor {
    let x = x.to_contiguous();
    let shape = x.layout().shape().clone();
    FlexTensor::from_data(TensorData::new(kernel.output_all(f32_slice(&x)), shape))
}

fn f32_slice(x: &FlexTensor) -> &[f32] {
    match x.as_slice::<f32>() {
        Some(s) => s,
        None => unreachable!("a contiguous f32 tensor, checked by the caller"),
    }
}

/// The backward node of kernel `K`: its state is the input (contiguous) and the kept values.
#[derive(Debug)]
struct OneTensorBackward<K>(K);

impl<K: Kernel> Backward<Flex, 1> for OneTensorBackward<K> {
    type State = (FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, kept) = ops.state;
        let kernel = self.0;
        unary::<Flex, _>(ops.parents, ops.node, grads, |grad| {
            let grad = grad.to_contiguous();
            let shape = x.layout().shape().clone();
            let out = kernel.backward_all(f32_slice(&x), f32_slice(&kept), f32_slice(&grad));
            FlexTensor::from_data(TensorData::new(out, shape))
        });
    }
}

fn autodiff_op<K: Kernel>(
    x: FloatTensor<Autodiff<Flex>>,
    kernel: K,
) -> FloatTensor<Autodiff<Flex>> {
    let prep = match OneTensorBackward(kernel)
        .prepare::<NoCheckpointing>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep,
        OpsKind::UnTracked(prep) => {
            return prep.finish(outputs(&x.primitive, kernel));
        }
    };
    let input = x.primitive.to_contiguous();
    let shape = input.layout().shape().clone();
    let (y, kept) = kernel.forward_all(f32_slice(&input));
    let y = FlexTensor::from_data(TensorData::new(y, shape.clone()));
    let kept = FlexTensor::from_data(TensorData::new(kept, shape));
    prep.finish((input, kept), y)
}
