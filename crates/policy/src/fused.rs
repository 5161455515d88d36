//! Mish and GELU in one pass over the elements on the CPU backend (Burn Flex, with or without
//! autodiff), bit for bit the values and gradients of the versions they replace.
//!
//! - **Mish.** Composed of tensor operations ([`crate::nn::mish_composed`]) it is seven
//!   element-wise passes forward, each allocating its result, and the autodiff graph keeps six
//!   intermediate tensors and runs about a dozen more passes backward, computing exp again:
//!   a fifth to a third of a Push-T BC step and a quarter of a GRPO update went there. Here the forward
//!   pass is one loop, and it keeps e = exp(min(x, 20)) for the backward pass, one loop too.
//! - **GELU.** Flex computes it in one pass already, but its backward pass computes
//!   erf(x / sqrt 2) again (with a scalar `erff`) beside the exp. Here the forward pass keeps
//!   1 + erf(x / sqrt 2), so the backward pass computes only the exp.
//!
//! Each kernel repeats the replaced version's arithmetic operation for operation, in the same
//! order and with the same `exp` and `erff`, and a kept value is the one recomputation would
//! give, so no trained result moves (docs/policy.md, "Mish and GELU in one pass"). Every other
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
    /// The output and the kept value of one element.
    fn forward(self, x: f32) -> (f32, f32);
    /// The gradient at x, given the kept value and the gradient `g` at the output.
    fn backward(self, x: f32, kept: f32, g: f32) -> f32;
}

/// Mish of an f32 tensor on Flex or `Autodiff<Flex>` in one pass; `Err(x)` hands back any other
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

fn dispatch<B: Backend, const D: usize, K: Kernel>(
    x: Tensor<B, D>,
    kernel: K,
) -> Result<Tensor<B, D>, Tensor<B, D>> {
    if x.dtype() != DType::F32 {
        return Err(x);
    }
    let prim: Box<dyn Any> = Box::new(x.into_primitive().tensor());
    let prim = match prim.downcast::<FlexTensor>() {
        Ok(t) => return Ok(back::<B, D>(Box::new(map(&t, |v| kernel.forward(v).0)))),
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

impl Kernel for Mish {
    #[inline]
    fn forward(self, x: f32) -> (f32, f32) {
        let e = (if x > CAP { CAP } else { x }).exp();
        let n = e * (e + 2.0);
        ((x * n) / (n + 2.0), e)
    }

    /// As Burn's autodiff computes it through the composed graph: the division (g / b as
    /// g x recip(b); -a / b^2 with b^2 as b x b), the two products, the two scalar additions,
    /// exp (g x its output) and the clamp's mask fill, each node's two incoming gradients
    /// summed.
    #[inline]
    fn backward(self, x: f32, e: f32, g: f32) -> f32 {
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

impl Kernel for Gelu {
    #[inline]
    fn forward(self, x: f32) -> (f32, f32) {
        let t = 1.0 + libm::erff(x / SQRT_2);
        (0.5 * x * t, t)
    }

    #[inline]
    fn backward(self, x: f32, t: f32, g: f32) -> f32 {
        let inv_sqrt_2pi: f32 = 1.0 / (2.0 * PI).sqrt();
        let cdf = 0.5 * t;
        let pdf = inv_sqrt_2pi * (-0.5 * x * x).exp();
        g * (cdf + x * pdf)
    }
}

/// `f` over the elements of an f32 Flex tensor, into a new contiguous one.
fn map(x: &FlexTensor, f: impl Fn(f32) -> f32) -> FlexTensor {
    let x = x.to_contiguous();
    let shape = x.layout().shape().clone();
    let out: Vec<f32> = f32_slice(&x).iter().map(|&v| f(v)).collect();
    FlexTensor::from_data(TensorData::new(out, shape))
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
            let out: Vec<f32> = f32_slice(&x)
                .iter()
                .zip(f32_slice(&kept))
                .zip(f32_slice(&grad))
                .map(|((&x, &k), &g)| kernel.backward(x, k, g))
                .collect();
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
            return prep.finish(map(&x.primitive, |v| kernel.forward(v).0));
        }
    };
    let input = x.primitive.to_contiguous();
    let shape = input.layout().shape().clone();
    let (y, kept): (Vec<f32>, Vec<f32>) =
        f32_slice(&input).iter().map(|&v| kernel.forward(v)).unzip();
    let y = FlexTensor::from_data(TensorData::new(y, shape.clone()));
    let kept = FlexTensor::from_data(TensorData::new(kept, shape));
    prep.finish((input, kept), y)
}
