//! Data-parallel gradients over threads on one device: the batch is cut into equal shards,
//! each thread computes its shard's loss and gradients on its own fork of the model (its own
//! autodiff graph, same parameter ids), and the shards' gradients are averaged in shard order.
//! Burn's CPU backend runs each step's many small kernels on one thread; shards are how a
//! training step uses every core.
//!
//! Determinism: shard i always gets rows [i * B / n, (i + 1) * B / n) and the sum runs in shard
//! order, so a given seed and shard count give bit-identical results. Different shard counts
//! give different (equally valid) results: each shard draws its own diffusion noise.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};

use crate::LearnError;

pub use diffrl_core::shards::shard_ranges;

/// Averages the gradients of several shards, weighting shard i by `weights[i]`.
struct Average<'a> {
    parts: &'a mut [GradientsParams],
    weights: &'a [f32],
    out: GradientsParams,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Average<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let mut sum: Option<Tensor<B::InnerBackend, D>> = None;
        for (part, w) in self.parts.iter_mut().zip(self.weights) {
            if let Some(g) = part.remove::<B::InnerBackend, D>(param.id) {
                let g = g.mul_scalar(*w);
                sum = Some(match sum {
                    None => g,
                    Some(s) => s + g,
                });
            }
        }
        if let Some(s) = sum {
            self.out.register::<B::InnerBackend, D>(param.id, s);
        }
    }
}

/// The training's worker threads: a pool of exactly `workers` threads of its own, made on first
/// use and kept for the process, that runs the shards after the first of a sharded step (and
/// the fused AdamW's runs after the first) while the calling thread does the first. Rayon's
/// global pool holds one thread per core instead, so with two cores its idle thread woke with
/// each step and spun (`sched_yield`) beside the two busy ones (docs/policy.md).
pub(crate) fn worker_pool(workers: usize) -> Result<Arc<rayon::ThreadPool>, LearnError> {
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<rayon::ThreadPool>>>> = OnceLock::new();
    let mut pools = POOLS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(pool) = pools.get(&workers) {
        return Ok(pool.clone());
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(workers)
        .thread_name(|i| format!("diffrl-worker-{}", i + 1))
        .build()
        .map_err(|e| LearnError::Worker(format!("cannot start {workers} worker threads: {e}")))?;
    let pool = Arc::new(pool);
    pools.insert(workers, pool.clone());
    Ok(pool)
}

/// The gradient of the batch-mean loss and the loss value, computed over `shards` threads.
///
/// `loss(shard, rows, model)` returns the mean loss over the rows `rows` of the batch, computed
/// with `model` (a fork of `model`); shards are weighted by their row counts, so the result is
/// the gradient of the mean over all `batch` rows. With one shard it runs on the calling thread
/// on `model` itself.
pub fn sharded_grads<B, M, F>(
    model: &M,
    batch: usize,
    shards: usize,
    loss: F,
) -> Result<(GradientsParams, f64), LearnError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + Send + Sync,
    F: Fn(usize, std::ops::Range<usize>, &M) -> Result<Tensor<B, 1>, LearnError> + Sync,
{
    let (grads, value, _) = sharded_grads_with(model, batch, shards, |i, rows, m| {
        Ok((loss(i, rows, m)?, ()))
    })?;
    Ok((grads, value))
}

/// [`sharded_grads`] for a loss that also reports something of its shard (statistics such as
/// clip fractions): `loss` returns (mean loss, extra), and the extras come back in shard order
/// beside each shard's row range.
#[allow(clippy::type_complexity)]
pub fn sharded_grads_with<B, M, T, F>(
    model: &M,
    batch: usize,
    shards: usize,
    loss: F,
) -> Result<(GradientsParams, f64, Vec<(std::ops::Range<usize>, T)>), LearnError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + Send + Sync,
    T: Send,
    F: Fn(usize, std::ops::Range<usize>, &M) -> Result<(Tensor<B, 1>, T), LearnError> + Sync,
{
    let ranges = shard_ranges(batch, shards);
    if ranges.len() == 1 {
        let (l, extra) = loss(0, ranges[0].clone(), model)?;
        let v = l.clone().into_scalar().elem::<f64>();
        return Ok((
            GradientsParams::from_grads(l.backward(), model),
            v,
            vec![(ranges[0].clone(), extra)],
        ));
    }
    let device = model.devices().pop().unwrap_or_default();
    type Shard = (GradientsParams, f64);
    // Shard 0 runs on the calling thread, the others on a pool of exactly that many threads
    // (`worker_pool`): threads that persist, so a step starts no thread and faults no fresh stack
    // in, and no idle thread spins beside the busy ones (docs/policy.md). A shard that panics
    // becomes an error.
    let shard =
        |i: usize, range: std::ops::Range<usize>, fork: M| -> Result<(Shard, T), LearnError> {
            let run = || {
                let (l, extra) = loss(i, range, &fork)?;
                let v = l.clone().into_scalar().elem::<f64>();
                Ok(((GradientsParams::from_grads(l.backward(), &fork), v), extra))
            };
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(run))
                .unwrap_or_else(|_| Err(LearnError::Worker(format!("gradient shard {i} panicked"))))
        };
    let pool = worker_pool(ranges.len() - 1)?;
    let mut forks: Vec<M> = ranges.iter().map(|_| model.clone().fork(&device)).collect();
    let first = forks.remove(0);
    let mut rest: Vec<Option<Result<(Shard, T), LearnError>>> =
        (1..ranges.len()).map(|_| None).collect();
    let mut results = Vec::with_capacity(ranges.len());
    pool.in_place_scope(|s| {
        for ((slot, fork), (i, range)) in rest
            .iter_mut()
            .zip(forks)
            .zip(ranges.iter().enumerate().skip(1))
        {
            let (shard, range) = (&shard, range.clone());
            s.spawn(move |_| *slot = Some(shard(i, range, fork)));
        }
        results.push(shard(0, ranges[0].clone(), first));
    });
    results.extend(rest.into_iter().map(|r| {
        r.unwrap_or_else(|| Err(LearnError::Worker("a gradient shard did not run".into())))
    }));
    let mut parts = Vec::with_capacity(results.len());
    let mut extras = Vec::with_capacity(results.len());
    let mut value = 0.0;
    let weights: Vec<f32> = ranges
        .iter()
        .map(|r| r.len() as f32 / batch as f32)
        .collect();
    for ((r, w), range) in results.into_iter().zip(&weights).zip(&ranges) {
        let ((g, v), extra) = r?;
        value += f64::from(*w) * v;
        parts.push(g);
        extras.push((range.clone(), extra));
    }
    let mut avg = Average {
        parts: &mut parts,
        weights: &weights,
        out: GradientsParams::new(),
    };
    model.visit(&mut avg);
    Ok((avg.out, value, extras))
}

#[cfg(test)]
mod tests {
    use super::*;

    type Ad = burn::backend::Autodiff<burn::backend::Flex>;

    /// Shard gradients average to the whole batch's gradient (a mean squared error), and the
    /// same shard count gives the same bits.
    #[test]
    fn sharded_gradients_equal_the_batch_gradient() {
        use burn::nn::{Linear, LinearConfig};
        use burn::tensor::TensorData;
        let device = Default::default();
        let model: Linear<Ad> = LinearConfig::new(3, 2).init(&device);
        let batch = 7;
        let x: Vec<f32> = (0..batch * 3).map(|i| (i as f32 * 0.37).sin()).collect();
        let y: Vec<f32> = (0..batch * 2).map(|i| (i as f32 * 0.11).cos()).collect();
        let loss = |_: usize, rows: std::ops::Range<usize>, m: &Linear<Ad>| {
            let n = rows.len();
            let xs = Tensor::<Ad, 2>::from_data(
                TensorData::new(x[rows.start * 3..rows.end * 3].to_vec(), [n, 3]),
                &device,
            );
            let ys = Tensor::<Ad, 2>::from_data(
                TensorData::new(y[rows.start * 2..rows.end * 2].to_vec(), [n, 2]),
                &device,
            );
            Ok((m.forward(xs) - ys).powi_scalar(2).mean_dim(1).mean())
        };
        let grad = |g: &GradientsParams| -> Vec<f32> {
            let w: Tensor<burn::backend::Flex, 2> = g.get(model.weight.id).unwrap();
            let b: Tensor<burn::backend::Flex, 1> = g.get(model.bias.as_ref().unwrap().id).unwrap();
            let mut v = w.into_data().to_vec::<f32>().unwrap();
            v.extend(b.into_data().to_vec::<f32>().unwrap());
            v
        };
        let (g1, l1) = sharded_grads(&model, batch, 1, loss).unwrap();
        let (g3, l3) = sharded_grads(&model, batch, 3, loss).unwrap();
        let (g3b, _) = sharded_grads(&model, batch, 3, loss).unwrap();
        assert!((l1 - l3).abs() < 1e-6, "{l1} vs {l3}");
        let (a, b) = (grad(&g1), grad(&g3));
        assert_eq!(a.len(), 8);
        for (u, v) in a.iter().zip(&b) {
            assert!((u - v).abs() < 1e-6, "{a:?} vs {b:?}");
        }
        assert_eq!(grad(&g3), grad(&g3b));
        // A shard that panics, on the calling thread or on the pool, is an error.
        for bad in [0, 2] {
            let panicky = |i: usize, rows: std::ops::Range<usize>, m: &Linear<Ad>| {
                assert_ne!(i, bad, "shard {i} fails");
                loss(i, rows, m)
            };
            let e = sharded_grads(&model, batch, 3, panicky).unwrap_err();
            assert!(
                e.to_string()
                    .contains(&format!("gradient shard {bad} panicked")),
                "{e}"
            );
        }
    }
}
