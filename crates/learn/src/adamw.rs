//! AdamW with the gradient-clip scale and the EMA of the weights fused into one pass over each
//! parameter, split over the training threads.
//!
//! Burn's AdamW updates one parameter tensor at a time with about fifteen separate tensor
//! operations, each a fresh allocation and a pass over memory, on the calling thread; with the
//! EMA and the clip that was about 1.8 ms of every BC step on the CPU backend while the other
//! core waited (docs/policy.md, "Both cores"). On the CPU backends [`Adam`] instead reads each
//! parameter and its gradient to host memory once, updates weight, moments and EMA element by
//! element in vectorised loops, the parameters cut into one run of chunks per thread, and
//! writes the weight back once.
//!
//! The arithmetic is Burn's, operation for operation in f32 (`burn-optim` 0.21's `AdamW`: the
//! moments, the bias corrections, `m_hat / (sqrt(v_hat) + eps)`, the decoupled decay as
//! `p * (1 - lr * wd) - delta * lr`), the clip is `g * s` with s [`crate::optim::clip_factor`]
//! and the EMA [`crate::optim::ema_update`]'s `ema * d + p * (1 - d)`: every element is
//! rounded as on the tensor path, so a run gives the same bits as with Burn's optimiser,
//! whatever the thread count (tests below). The state converts to and from Burn's optimiser
//! record, so `train_state/optim.mpk` keeps its format.
//!
//! On other backends (CUDA) the pass would be a device round trip, and [`Adam`] runs Burn's
//! optimiser and the tensor EMA instead: the same results.

use std::collections::HashMap;

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::record::AdaptorRecord;
use burn::optim::{
    AdamW, AdamWConfig, AdamWState, AdaptiveMomentumState, GradientsParams, Optimizer,
};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

use crate::LearnError;
use crate::optim::ema_update;
use crate::rollout::to_vec;

/// Elements per unit of parallel work.
const CHUNK: usize = 16_384;

/// Burn's AdamW record: what `train_state/optim.mpk` holds.
pub type AdamRecord<B, M> = <OptimizerAdaptor<AdamW, M, B> as Optimizer<M, B>>::Record;

/// Burn's AdamW defaults (`AdamWConfig`), which every learner here uses but for weight decay.
#[derive(Debug, Clone, Copy)]
struct Hyper {
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    weight_decay: f32,
}

/// Whether parameters of backend `B` live in host memory (the fused pass is free there).
pub fn host_backend<B: Backend>(device: &B::Device) -> bool {
    let name = B::name(device).to_ascii_lowercase();
    ["flex", "ndarray"].iter().any(|n| name.contains(n))
}

/// AdamW (Burn's defaults but for the weight decay), optionally keeping an EMA of the weights.
pub struct Adam<B: AutodiffBackend, M: AutodiffModule<B>> {
    hyper: Hyper,
    inner: Inner<B, M>,
}

#[allow(clippy::large_enum_variant)]
enum Inner<B: AutodiffBackend, M: AutodiffModule<B>> {
    Fused(Fused),
    Tensor {
        optim: OptimizerAdaptor<AdamW, M, B>,
        ema: Option<M::InnerModule>,
    },
}

/// Host copies of the optimiser state.
struct Fused {
    moments: HashMap<ParamId, Moments>,
    ema: Option<HashMap<ParamId, Vec<f32>>>,
    /// Threads of the fused pass (the calling one included).
    threads: usize,
    /// Elements per unit of parallel work.
    chunk: usize,
}

#[derive(Default)]
struct Moments {
    /// Steps taken (Burn's `time`).
    time: usize,
    m: Vec<f32>,
    v: Vec<f32>,
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> Adam<B, M> {
    /// The fused optimiser on a CPU backend, Burn's elsewhere. `threads` (>= 1) sizes the
    /// fused pass; it does not change the result.
    pub fn new(weight_decay: f32, threads: usize, device: &B::Device) -> Self {
        if host_backend::<B>(device) {
            Self::fused(weight_decay, threads)
        } else {
            Self::tensor(weight_decay)
        }
    }

    /// The fused optimiser, whatever the backend.
    pub fn fused(weight_decay: f32, threads: usize) -> Self {
        Self {
            hyper: hyper(weight_decay),
            inner: Inner::Fused(Fused {
                moments: HashMap::new(),
                ema: None,
                threads: threads.max(1),
                chunk: CHUNK,
            }),
        }
    }

    /// Burn's optimiser and the tensor EMA.
    pub fn tensor(weight_decay: f32) -> Self {
        Self {
            hyper: hyper(weight_decay),
            inner: Inner::Tensor {
                optim: config(weight_decay).init(),
                ema: None,
            },
        }
    }

    /// Keeps an EMA of the weights, starting from `ema` (a copy of the module being trained, or
    /// a saved EMA of it); [`Adam::step`] with a decay updates it after each step.
    pub fn with_ema(mut self, ema: &M::InnerModule) -> Result<Self, LearnError> {
        match &mut self.inner {
            Inner::Fused(f) => {
                let mut c = Collect::default();
                ema.visit(&mut c);
                if let Some(e) = c.error {
                    return Err(e);
                }
                f.ema = Some(c.values);
            }
            Inner::Tensor { ema: slot, .. } => *slot = Some(ema.clone()),
        }
        Ok(self)
    }

    /// The EMA of the weights as a module shaped like `template` (the module being trained),
    /// or `None` without [`Adam::with_ema`].
    pub fn ema(&self, template: &M) -> Option<M::InnerModule> {
        match &self.inner {
            Inner::Fused(f) => {
                let values = f.ema.as_ref()?;
                Some(template.valid().map(&mut Restore { values }))
            }
            Inner::Tensor { ema, .. } => ema.clone(),
        }
    }

    /// One AdamW step at learning rate `lr` on `grads`, each gradient multiplied by `scale`
    /// first when given (a clip factor), then the EMA blended with decay `ema_decay` when
    /// given and kept. Parameters without a gradient keep their value and moments (their EMA
    /// still blends), as in Burn.
    pub fn step(
        &mut self,
        lr: f64,
        module: M,
        mut grads: GradientsParams,
        scale: Option<f64>,
        ema_decay: Option<f64>,
    ) -> Result<M, LearnError> {
        let hyper = self.hyper;
        match &mut self.inner {
            Inner::Tensor { optim, ema } => {
                if let Some(s) = scale {
                    crate::optim::scale_grads(&module, &mut grads, s);
                }
                let module = optim.step(lr, module, grads);
                if let Some(d) = ema_decay
                    && let Some(e) = ema.take()
                {
                    *ema = Some(ema_update(e, &module.valid(), d));
                }
                Ok(module)
            }
            Inner::Fused(f) => f.step::<B, M>(hyper, lr, module, grads, scale, ema_decay),
        }
    }

    /// Burn's record of the optimiser state (`module` names the parameters and their shapes).
    pub fn to_record(&self, module: &M) -> AdamRecord<B, M> {
        match &self.inner {
            Inner::Tensor { optim, .. } => optim.to_record(),
            Inner::Fused(f) => {
                let mut w = WriteRecord::<B, M> {
                    moments: &f.moments,
                    record: Default::default(),
                };
                module.visit(&mut w);
                w.record
            }
        }
    }

    /// Restores the state from Burn's record (as written by [`Adam::to_record`] or by Burn's
    /// own AdamW).
    pub fn load_record(&mut self, module: &M, record: AdamRecord<B, M>) -> Result<(), LearnError> {
        match &mut self.inner {
            Inner::Tensor { optim, .. } => {
                let fresh = config(self.hyper.weight_decay).init();
                *optim = std::mem::replace(optim, fresh).load_record(record);
                Ok(())
            }
            Inner::Fused(f) => {
                let mut r = ReadRecord::<B, M> {
                    record,
                    moments: HashMap::new(),
                    error: None,
                };
                module.visit(&mut r);
                if let Some(e) = r.error {
                    return Err(e);
                }
                f.moments = r.moments;
                Ok(())
            }
        }
    }
}

fn hyper(weight_decay: f32) -> Hyper {
    Hyper {
        beta_1: 0.9,
        beta_2: 0.999,
        epsilon: 1e-5,
        weight_decay,
    }
}

/// Burn's AdamW with the same hyper-parameters as [`hyper`] (its defaults).
fn config(weight_decay: f32) -> AdamWConfig {
    AdamWConfig::new().with_weight_decay(weight_decay)
}

/// A parameter on its way through the fused pass: its value and gradient as taken out of their
/// tensors (without a copy where nothing else holds them), f32 checked.
struct Work {
    id: ParamId,
    p: TensorData,
    g: Option<TensorData>,
    /// Whether the parameter's tensor tracked gradients.
    require_grad: bool,
    moments: Moments,
    ema: Option<Vec<f32>>,
}

/// Per-parameter constants of one step, each computed as Burn computes it.
#[derive(Clone, Copy)]
struct Consts {
    first: bool,
    beta_1: f32,
    beta_2: f32,
    factor_1: f32,
    factor_2: f32,
    correction_1: f32,
    correction_2: f32,
    epsilon: f32,
    /// `1 - lr * wd` as f32, `None` when the decay rate is 0 (Burn then skips the product).
    keep: Option<f32>,
    lr: f32,
    scale: Option<f32>,
}

/// A chunk's gradient, first and second moments, and the step's constants.
type Update<'a> = (&'a [f32], &'a mut [f32], &'a mut [f32], Consts);

/// One chunk of one parameter.
struct Chunk<'a> {
    p: &'a mut [f32],
    update: Option<Update<'a>>,
    ema: Option<(&'a mut [f32], f32, f32)>,
}

impl Chunk<'_> {
    fn run(self) {
        if let Some((g, m, v, c)) = self.update {
            // One loop per case, without branches inside, so that it vectorises.
            let f = match (c.first, c.scale.is_some(), c.keep.is_some()) {
                (false, false, false) => adam::<false, false, false>,
                (false, false, true) => adam::<false, false, true>,
                (false, true, false) => adam::<false, true, false>,
                (false, true, true) => adam::<false, true, true>,
                (true, false, false) => adam::<true, false, false>,
                (true, false, true) => adam::<true, false, true>,
                (true, true, false) => adam::<true, true, false>,
                (true, true, true) => adam::<true, true, true>,
            };
            f(self.p, g, m, v, &c);
        }
        if let Some((e, d, one_minus_d)) = self.ema {
            for (e, p) in e.iter_mut().zip(self.p.iter()) {
                *e = *e * d + *p * one_minus_d;
            }
        }
    }
}

/// Burn's AdamW on one chunk: `FIRST` (no moments yet), `SCALE` (a clip factor), `DECAY`
/// (a non-zero decay rate) fix the branches at compile time.
fn adam<const FIRST: bool, const SCALE: bool, const DECAY: bool>(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    c: &Consts,
) {
    let n = p.len();
    let (g, m, v) = (&g[..n], &mut m[..n], &mut v[..n]);
    let (scale, keep) = (c.scale.unwrap_or(1.0), c.keep.unwrap_or(1.0));
    for i in 0..n {
        let g = if SCALE { g[i] * scale } else { g[i] };
        let (mi, vi) = if FIRST {
            (g * c.factor_1, (g * g) * c.factor_2)
        } else {
            (
                m[i] * c.beta_1 + g * c.factor_1,
                v[i] * c.beta_2 + (g * g) * c.factor_2,
            )
        };
        m[i] = mi;
        v[i] = vi;
        let delta = (mi / c.correction_1) / ((vi / c.correction_2).sqrt() + c.epsilon);
        let decayed = if DECAY { p[i] * keep } else { p[i] };
        p[i] = decayed - delta * c.lr;
    }
}

/// `chunks` cut into `n` runs of consecutive chunks with near-equal element counts.
fn bins(chunks: Vec<Chunk<'_>>, n: usize) -> Vec<Vec<Chunk<'_>>> {
    let total: usize = chunks.iter().map(|c| c.p.len()).sum();
    let n = n.max(1);
    let mut out: Vec<Vec<Chunk<'_>>> = (0..n).map(|_| Vec::new()).collect();
    let mut done = 0;
    for c in chunks {
        // The bin whose share of the elements this chunk's first element falls in.
        let i = (done * n / total.max(1)).min(n - 1);
        done += c.p.len();
        out[i].push(c);
    }
    out
}

/// Splits `v` at `n` (or its end), advancing it.
fn take_mut<'a>(v: &mut &'a mut [f32], n: usize) -> &'a mut [f32] {
    let n = n.min(v.len());
    let (head, tail) = std::mem::take(v).split_at_mut(n);
    *v = tail;
    head
}

fn take<'a>(v: &mut &'a [f32], n: usize) -> &'a [f32] {
    let (head, tail) = v.split_at(n.min(v.len()));
    *v = tail;
    head
}

impl Fused {
    fn step<B: AutodiffBackend, M: AutodiffModule<B>>(
        &mut self,
        h: Hyper,
        lr: f64,
        module: M,
        mut grads: GradientsParams,
        scale: Option<f64>,
        ema_decay: Option<f64>,
    ) -> Result<M, LearnError> {
        let ema_decay = ema_decay.filter(|_| self.ema.is_some());
        // 1. Every parameter (the EMA blends even those without a gradient) and its gradient,
        // taken out of the module: a parameter nothing else holds gives its buffer, which the
        // pass then updates in place.
        let mut taker = Take {
            grads: &mut grads,
            all: ema_decay.is_some(),
            out: Vec::new(),
            error: None,
        };
        let module = module.map(&mut taker);
        if let Some(e) = taker.error {
            return Err(e);
        }
        let mut work: Vec<Work> = taker
            .out
            .into_iter()
            .map(|(id, p, g, require_grad)| Work {
                id,
                p,
                g,
                require_grad,
                moments: self.moments.remove(&id).unwrap_or_default(),
                ema: match (ema_decay, self.ema.as_mut()) {
                    (Some(_), Some(e)) => e.remove(&id),
                    _ => None,
                },
            })
            .collect();
        for w in &work {
            let n = w.p.num_elements();
            if let Some(e) = &w.ema
                && e.len() != n
            {
                return Err(LearnError::Data(format!(
                    "the EMA holds {} values for a parameter of {n}",
                    e.len()
                )));
            }
        }
        // 2. The fused pass.
        let decay_rate = lr * f64::from(h.weight_decay);
        let ema_consts = ema_decay.map(|d| (d as f32, (1.0 - d) as f32));
        let mut chunks = Vec::new();
        for w in &mut work {
            let n = w.p.num_elements();
            let consts = w.g.as_ref().map(|_| {
                let first = w.moments.time == 0;
                if first {
                    w.moments.m = vec![0.0; n];
                    w.moments.v = vec![0.0; n];
                }
                w.moments.time += 1;
                let t = w.moments.time as i32;
                Consts {
                    first,
                    beta_1: h.beta_1,
                    beta_2: h.beta_2,
                    factor_1: 1.0 - h.beta_1,
                    factor_2: 1.0 - h.beta_2,
                    correction_1: 1f32 - h.beta_1.powi(t),
                    correction_2: 1f32 - h.beta_2.powi(t),
                    epsilon: h.epsilon,
                    keep: (decay_rate != 0.0).then_some((1.0 - decay_rate) as f32),
                    lr: lr as f32,
                    scale: scale.map(|s| s as f32),
                }
            });
            // f32 was checked when the values were taken.
            let mut p = w.p.as_mut_slice::<f32>().unwrap_or_default();
            let mut g =
                w.g.as_ref()
                    .map_or(&[][..], |g| g.as_slice::<f32>().unwrap_or_default());
            let mut m = w.moments.m.as_mut_slice();
            let mut v = w.moments.v.as_mut_slice();
            let mut e = w.ema.as_deref_mut();
            while !p.is_empty() {
                let k = self.chunk.min(p.len());
                let update =
                    consts.map(|c| (take(&mut g, k), take_mut(&mut m, k), take_mut(&mut v, k), c));
                let ema = match (e.as_mut(), ema_consts) {
                    (Some(e), Some((d, od))) => Some((take_mut(e, k), d, od)),
                    _ => None,
                };
                chunks.push(Chunk {
                    p: take_mut(&mut p, k),
                    update,
                    ema,
                });
            }
        }
        if self.threads > 1 && chunks.len() > 1 {
            // One run of consecutive chunks per thread, of near-equal element counts; the
            // calling thread takes the first.
            let mut bins = bins(chunks, self.threads).into_iter();
            let first = bins.next().unwrap_or_default();
            crate::parallel::worker_pool(self.threads - 1)?.in_place_scope(|s| {
                for b in bins {
                    s.spawn(move |_| b.into_iter().for_each(Chunk::run));
                }
                first.into_iter().for_each(Chunk::run);
            });
        } else {
            chunks.into_iter().for_each(Chunk::run);
        }
        // 3. The new weights into the module; the state back into its maps.
        let mut values = HashMap::new();
        for w in work {
            if let (Some(map), Some(e)) = (self.ema.as_mut(), w.ema) {
                map.insert(w.id, e);
            }
            if w.g.is_some() || w.moments.time > 0 {
                self.moments.insert(w.id, w.moments);
            }
            values.insert(w.id, (w.p, w.require_grad));
        }
        Ok(module.map(&mut Put::<B> {
            values,
            _b: std::marker::PhantomData,
        }))
    }
}

/// Takes each parameter's value (and its gradient) out of the module, leaving an empty tensor
/// in its place until [`Put`] returns it.
struct Take<'a> {
    grads: &'a mut GradientsParams,
    /// Also parameters without a gradient (for the EMA).
    all: bool,
    out: Vec<(ParamId, TensorData, Option<TensorData>, bool)>,
    error: Option<LearnError>,
}

/// `data` when it holds f32 values.
fn f32_data(data: TensorData, what: &str) -> Result<TensorData, LearnError> {
    match data.as_slice::<f32>() {
        Ok(_) => Ok(data),
        Err(e) => Err(LearnError::Data(format!(
            "AdamW expects f32 {what}s: {e:?}"
        ))),
    }
}

impl<B: AutodiffBackend> ModuleMapper<B> for Take<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        if self.error.is_some() {
            return Param::from_mapped_value(id, tensor, mapper);
        }
        let g = self.grads.remove::<B::InnerBackend, D>(id);
        if g.is_none() && !self.all {
            return Param::from_mapped_value(id, tensor, mapper);
        }
        let device = tensor.device();
        let require_grad = tensor.is_require_grad();
        let n = tensor.shape().num_elements();
        let taken = f32_data(tensor.inner().into_data(), "parameter").and_then(|p| {
            let g = g.map(|g| f32_data(g.into_data(), "gradient")).transpose()?;
            if let Some(g) = &g
                && g.num_elements() != n
            {
                return Err(LearnError::Data(format!(
                    "a gradient of {} values for a parameter of {n}",
                    g.num_elements()
                )));
            }
            Ok((p, g))
        });
        match taken {
            Ok((p, g)) => self.out.push((id, p, g, require_grad)),
            Err(e) => self.error = Some(e),
        }
        let empty = TensorData::new(Vec::<f32>::new(), [0; D]);
        let placeholder = Tensor::from_inner(Tensor::from_data(empty, &device));
        Param::from_mapped_value(id, placeholder, mapper)
    }
}

/// Puts the values [`Take`] took back, as they are after the pass, with each parameter's
/// `require_grad`.
struct Put<B: AutodiffBackend> {
    values: HashMap<ParamId, (TensorData, bool)>,
    _b: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleMapper<B> for Put<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let Some((data, require_grad)) = self.values.remove(&id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let inner = Tensor::<B::InnerBackend, D>::from_data(data, &tensor.device());
        let mut t = Tensor::from_inner(inner);
        if require_grad {
            t = t.require_grad();
        }
        Param::from_mapped_value(id, t, mapper)
    }
}

/// Every parameter's values, by id.
#[derive(Default)]
struct Collect {
    values: HashMap<ParamId, Vec<f32>>,
    error: Option<LearnError>,
}

impl<B: Backend> ModuleVisitor<B> for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        match to_vec(param.val()) {
            Ok(v) => {
                self.values.insert(param.id, v);
            }
            Err(e) => self.error = Some(e),
        }
    }
}

/// Replaces each parameter's value by the stored one (the EMA's), matched by id.
struct Restore<'a> {
    values: &'a HashMap<ParamId, Vec<f32>>,
}

impl<B: Backend> ModuleMapper<B> for Restore<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let value = match self.values.get(&id) {
            Some(v) if v.len() == tensor.shape().num_elements() => {
                Tensor::from_data(TensorData::new(v.clone(), tensor.shape()), &tensor.device())
            }
            _ => tensor,
        };
        Param::from_mapped_value(id, value, mapper)
    }
}

/// Burn's record from the host moments.
struct WriteRecord<'a, B: AutodiffBackend, M: AutodiffModule<B>> {
    moments: &'a HashMap<ParamId, Moments>,
    record: AdamRecord<B, M>,
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> ModuleVisitor<B> for WriteRecord<'_, B, M> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(mo) = self.moments.get(&param.id) else {
            return;
        };
        if mo.time == 0 {
            return;
        }
        let shape = param.val().shape();
        let device = param.val().device();
        let t = |v: &Vec<f32>| {
            Tensor::<B::InnerBackend, D>::from_data(
                TensorData::new(v.clone(), shape.clone()),
                &device,
            )
        };
        let state: AdamWState<B::InnerBackend, D> =
            AdamWState::new(AdaptiveMomentumState::new(mo.time, t(&mo.m), t(&mo.v)));
        self.record
            .insert(param.id, AdaptorRecord::from_state(state));
    }
}

/// Host moments from Burn's record.
struct ReadRecord<B: AutodiffBackend, M: AutodiffModule<B>> {
    record: AdamRecord<B, M>,
    moments: HashMap<ParamId, Moments>,
    error: Option<LearnError>,
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> ModuleVisitor<B> for ReadRecord<B, M> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(rec) = self.record.remove(&param.id) else {
            return;
        };
        let state: AdamWState<B::InnerBackend, D> = rec.into_state();
        let mo = state.momentum;
        let n = param.val().shape().num_elements();
        let read = || -> Result<Moments, LearnError> {
            let (m, v) = (to_vec(mo.moment_1)?, to_vec(mo.moment_2)?);
            if m.len() != n || v.len() != n {
                return Err(LearnError::Resume(format!(
                    "optimiser state of {} values for a parameter of {n}",
                    m.len()
                )));
            }
            Ok(Moments {
                time: mo.time,
                m,
                v,
            })
        };
        match read() {
            Ok(m) => {
                self.moments.insert(param.id, m);
            }
            Err(e) => self.error = Some(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::{Linear, LinearConfig};

    type Ad = burn::backend::Autodiff<burn::backend::Flex>;

    fn bits<Bk: Backend>(m: &Linear<Bk>) -> Vec<u32> {
        let mut v: Vec<u32> = m
            .weight
            .val()
            .into_data()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect();
        let b = m
            .bias
            .as_ref()
            .unwrap()
            .val()
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        v.extend(b.iter().map(|x| x.to_bits()));
        v
    }

    /// Asserts `a` and `b` hold the same bits, naming the first element that differs.
    #[track_caller]
    fn same(a: &[u32], b: &[u32]) {
        assert_eq!(a.len(), b.len());
        if let Some(i) = a.iter().zip(b).position(|(x, y)| x != y) {
            panic!(
                "element {i} of {} differs: {} vs {}",
                a.len(),
                f32::from_bits(a[i]),
                f32::from_bits(b[i])
            );
        }
    }

    /// Grads of a deterministic loss at step `k`.
    fn grads(model: &Linear<Ad>, k: usize) -> GradientsParams {
        let device = Default::default();
        let x: Vec<f32> = (0..6 * 40)
            .map(|i| ((i + 7 * k) as f32 * 0.37).sin())
            .collect();
        let y: Vec<f32> = (0..6 * 50)
            .map(|i| ((i + 3 * k) as f32 * 0.11).cos())
            .collect();
        let x = Tensor::<Ad, 2>::from_data(TensorData::new(x, [6, 40]), &device);
        let y = Tensor::<Ad, 2>::from_data(TensorData::new(y, [6, 50]), &device);
        let loss = (model.forward(x) - y).powi_scalar(2).mean();
        GradientsParams::from_grads(loss.backward(), model)
    }

    /// Ten steps with weight decay, a clip factor on some steps and an EMA: the fused pass
    /// (one thread, three threads, chunks smaller than a parameter) gives Burn's bits, and its
    /// record resumes Burn's optimiser exactly.
    #[test]
    fn fused_adamw_gives_burns_bits() {
        let device = Default::default();
        let init: Linear<Ad> = LinearConfig::new(40, 50).init(&device);
        let run =
            |mut opt: Adam<Ad, Linear<Ad>>, steps: std::ops::Range<usize>, mut m: Linear<Ad>| {
                for k in steps {
                    let g = grads(&m, k);
                    let scale = (k % 3 == 0).then_some(0.37);
                    let lr = 1e-2 / (1.0 + k as f64);
                    m = opt
                        .step(lr, m, g, scale, Some(0.5 + 0.04 * k as f64))
                        .unwrap();
                }
                (m, opt)
            };
        let mk = |mut o: Adam<Ad, Linear<Ad>>| {
            if let Inner::Fused(f) = &mut o.inner {
                f.chunk = 300; // parameters of 2,000 and 50 values: several chunks, ragged ends
            }
            o.with_ema(&init.valid()).unwrap()
        };
        let (a, oa) = run(mk(Adam::tensor(1e-2)), 0..10, init.clone());
        let (b, ob) = run(mk(Adam::fused(1e-2, 1)), 0..10, init.clone());
        let (c, oc) = run(mk(Adam::fused(1e-2, 3)), 0..10, init.clone());
        assert_ne!(bits(&a), bits(&init), "the steps moved the weights");
        same(&bits(&a), &bits(&b));
        same(&bits(&a), &bits(&c));
        let ema = |o: &Adam<Ad, Linear<Ad>>, m: &Linear<Ad>| bits(&o.ema(m).unwrap());
        same(&ema(&oa, &a), &ema(&ob, &b));
        same(&ema(&oa, &a), &ema(&oc, &c));
        // Stop after 4 steps, move the state through Burn's record, go on: the same bits.
        let (m4, o4) = run(mk(Adam::fused(1e-2, 2)), 0..4, init.clone());
        let mut burn = Adam::<Ad, Linear<Ad>>::tensor(1e-2)
            .with_ema(&o4.ema(&m4).unwrap())
            .unwrap();
        burn.load_record(&m4, o4.to_record(&m4)).unwrap();
        let (d, _) = run(burn, 4..10, m4.clone());
        same(&bits(&a), &bits(&d));
        let mut fused = Adam::<Ad, Linear<Ad>>::fused(1e-2, 2)
            .with_ema(&o4.ema(&m4).unwrap())
            .unwrap();
        fused.load_record(&m4, o4.to_record(&m4)).unwrap();
        let (e, _) = run(fused, 4..10, m4);
        same(&bits(&a), &bits(&e));
        // A step without a decay leaves the EMA as it was, on either path.
        for mut o in [mk(Adam::tensor(1e-2)), mk(Adam::fused(1e-2, 2))] {
            let before = bits(&o.ema(&init).unwrap());
            let m = o
                .step(1e-2, init.clone(), grads(&init, 0), None, None)
                .unwrap();
            same(&bits(&o.ema(&m).unwrap()), &before);
        }
    }

    #[test]
    fn chunks_split_a_parameter() {
        let mut v = vec![0.0f32; 5];
        let mut s = v.as_mut_slice();
        assert_eq!(take_mut(&mut s, 2).len(), 2);
        assert_eq!(take_mut(&mut s, 2).len(), 2);
        assert_eq!(take_mut(&mut s, 2).len(), 1);
        assert!(s.is_empty());
    }
}
