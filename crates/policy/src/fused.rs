//! Mish in one pass over the elements on the CPU backend (Burn Flex, with or without autodiff).
//!
//! Composed of tensor operations, Mish is seven element-wise passes forward, each allocating its
//! result, and the autodiff graph keeps six intermediate tensors and runs about a dozen more
//! passes backward: a third of a Push-T BC step and nearly half of a GRPO update went there
//! (docs/policy.md, "Mish in one pass"). Here the forward pass is one loop, and the backward pass
//! one loop that keeps only the input. Both repeat the composed version's arithmetic operation
//! for operation, in the same order and with the same `exp`, so values and gradients are
//! bit for bit those of [`crate::nn::mish_composed`] and no trained result moves. Every other
//! backend (CUDA) and every other dtype takes the composed version.

use std::any::Any;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use burn_flex::FlexTensor;

/// The largest exponent the composed Mish takes (`clamp_max(20)`): n / (n + 2) is 1 in f32
/// there, so larger inputs cannot overflow.
const CAP: f32 = 20.0;

/// Mish of an f32 tensor on Flex or `Autodiff<Flex>` in one pass; `Err(x)` hands back any other
/// tensor untouched for the composed version.
pub(crate) fn mish<B: Backend, const D: usize>(
    x: Tensor<B, D>,
) -> Result<Tensor<B, D>, Tensor<B, D>> {
    if x.dtype() != DType::F32 {
        return Err(x);
    }
    let prim: Box<dyn Any> = Box::new(x.into_primitive().tensor());
    let prim = match prim.downcast::<FlexTensor>() {
        Ok(t) => return Ok(back::<B, D>(Box::new(map(&t, forward)))),
        Err(p) => p,
    };
    let prim = match prim.downcast::<FloatTensor<Autodiff<Flex>>>() {
        Ok(t) => return Ok(back::<B, D>(Box::new(autodiff_mish(*t)))),
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

/// The composed version's forward arithmetic for one element: c = clamp_max(x, 20) (a mask
/// fill where x > 20), e = exp(c), n = e (e + 2), y = (x n) / (n + 2).
#[inline]
fn forward(x: f32) -> f32 {
    forward_and_exp(x).0
}

/// [`forward`] and the e = exp(min(x, 20)) it computed, for the backward pass.
#[inline]
fn forward_and_exp(x: f32) -> (f32, f32) {
    let e = capped(x).exp();
    let n = e * (e + 2.0);
    ((x * n) / (n + 2.0), e)
}

#[inline]
fn capped(x: f32) -> f32 {
    if x > CAP { CAP } else { x }
}

/// The gradient at x of one element, given the gradient `g` at the output, as Burn's autodiff
/// computes it through the composed graph: division (g / b as g x recip(b); -a / b^2 with b^2
/// as b x b), the two products, the two scalar additions, exp (its output recomputed) and the
/// mask fill of the clamp, with each node's two incoming gradients summed.
/// `e` is exp(min(x, 20)) as the forward pass computed it (the same bits a recomputation gives).
#[inline]
fn backward(x: f32, e: f32, g: f32) -> f32 {
    let masked = x > CAP;
    let e2 = e + 2.0;
    let n = e * e2;
    let n2 = n + 2.0;
    let xn = x * n;
    let g_xn = g * (1.0 / n2);
    let g_n2 = g * (-xn / (n2 * n2));
    let g_x_product = g_xn * n;
    let g_n = g_xn * x + g_n2;
    let g_e = g_n * e2 + g_n * e;
    let g_c = g_e * e;
    let g_x_clamp = if masked { 0.0 } else { g_c };
    g_x_product + g_x_clamp
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

/// The backward node: its state is the input (contiguous) and the forward pass's exp(min(x, 20)).
#[derive(Debug)]
struct MishBackward;

impl Backward<Flex, 1> for MishBackward {
    type State = (FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, e) = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |grad| {
            let grad = grad.to_contiguous();
            let shape = x.layout().shape().clone();
            let out: Vec<f32> = f32_slice(&x)
                .iter()
                .zip(f32_slice(&e))
                .zip(f32_slice(&grad))
                .map(|((&x, &e), &g)| backward(x, e, g))
                .collect();
            FlexTensor::from_data(TensorData::new(out, shape))
        });
    }
}

fn autodiff_mish(x: FloatTensor<Autodiff<Flex>>) -> FloatTensor<Autodiff<Flex>> {
    let prep = match MishBackward
        .prepare::<NoCheckpointing>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep,
        OpsKind::UnTracked(prep) => return prep.finish(map(&x.primitive, forward)),
    };
    let input = x.primitive.to_contiguous();
    let shape = input.layout().shape().clone();
    let (y, e): (Vec<f32>, Vec<f32>) = f32_slice(&input)
        .iter()
        .map(|&v| forward_and_exp(v))
        .unzip();
    let y = FlexTensor::from_data(TensorData::new(y, shape.clone()));
    let e = FlexTensor::from_data(TensorData::new(e, shape));
    prep.finish((input, e), y)
}
