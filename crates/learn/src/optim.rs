//! Optimisation helpers Burn leaves to the user: global-norm gradient clipping, an EMA of the
//! weights, and the warmup + cosine learning-rate schedule.

use std::collections::HashMap;

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor};

struct SquaredNorm<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    total: Option<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredNorm<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            let s = g.square().sum();
            self.total = Some(match self.total.take() {
                Some(t) => t + s,
                None => s,
            });
        }
    }
}

struct Scale<'a> {
    grads: &'a mut GradientsParams,
    factor: f64,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            self.grads.register(param.id, g.mul_scalar(self.factor));
        }
    }
}

/// Global L2 norm of the gradients of `model`'s parameters.
pub fn grad_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &GradientsParams,
) -> f64 {
    let mut v = SquaredNorm::<B> { grads, total: None };
    model.visit(&mut v);
    v.total
        .map_or(0.0, |t| t.into_scalar().elem::<f64>().sqrt())
}

/// The global-norm clip: gradients of global norm `norm` are scaled by `max_norm / norm` when
/// `max_norm` > 0 and the finite `norm` exceeds it, else left as they are (none).
pub fn clip_factor(norm: f64, max_norm: f64) -> Option<f64> {
    (max_norm > 0.0 && norm > max_norm && norm.is_finite()).then(|| max_norm / norm)
}

/// Multiplies every gradient of `model`'s parameters by `factor`.
pub(crate) fn scale_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    factor: f64,
) {
    model.visit(&mut Scale { grads, factor });
}

struct Collect<B: Backend> {
    flat: HashMap<ParamId, Tensor<B, 1>>,
}

impl<B: Backend> ModuleVisitor<B> for Collect<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let t = param.val();
        let n = t.shape().num_elements();
        self.flat.insert(param.id, t.reshape([n]));
    }
}

struct Blend<B: Backend> {
    online: HashMap<ParamId, Tensor<B, 1>>,
    decay: f64,
}

impl<B: Backend> ModuleMapper<B> for Blend<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, ema, mapper) = param.consume();
        let value = match self.online.remove(&id) {
            Some(o) => {
                let dims = ema.dims();
                ema.mul_scalar(self.decay) + o.reshape(dims).mul_scalar(1.0 - self.decay)
            }
            None => ema,
        };
        Param::from_mapped_value(id, value, mapper)
    }
}

/// ema <- decay * ema + (1 - decay) * online, parameter by parameter (matched by id: `ema`
/// must be a copy of `online`'s module).
pub fn ema_update<B: Backend, M: Module<B>>(ema: M, online: &M, decay: f64) -> M {
    let mut c = Collect {
        flat: HashMap::new(),
    };
    online.visit(&mut c);
    let mut blend = Blend {
        online: c.flat,
        decay,
    };
    ema.map(&mut blend)
}

/// EMA decay with warmup (Diffusion Policy's schedule): min(max_decay, (1 + step) / (10 + step)).
pub fn ema_decay(step: usize, max_decay: f64) -> f64 {
    ((1.0 + step as f64) / (10.0 + step as f64)).min(max_decay)
}

/// Linear warmup to `lr` over `warmup` steps, then cosine decay to `lr * min_ratio` at `total`.
pub fn lr_at(step: usize, total: usize, warmup: usize, lr: f64, min_ratio: f64) -> f64 {
    if step < warmup {
        return lr * (step + 1) as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1) as f64;
    let p = ((step - warmup) as f64 / span).min(1.0);
    let floor = lr * min_ratio;
    floor + (lr - floor) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lr_schedule_warms_up_then_decays() {
        assert!((lr_at(0, 100, 10, 1.0, 0.0) - 0.1).abs() < 1e-12);
        assert!((lr_at(9, 100, 10, 1.0, 0.0) - 1.0).abs() < 1e-12);
        assert!((lr_at(10, 100, 10, 1.0, 0.0) - 1.0).abs() < 1e-12);
        assert!((lr_at(55, 100, 10, 1.0, 0.0) - 0.5).abs() < 1e-12);
        assert!(lr_at(100, 100, 10, 1.0, 0.1) - 0.1 < 1e-12);
    }

    #[test]
    fn ema_decay_warms_up() {
        assert!((ema_decay(0, 0.999) - 0.1).abs() < 1e-12);
        assert_eq!(ema_decay(1_000_000, 0.999), 0.999);
    }
}
