//! Behaviour cloning: AdamW with warmup + cosine learning rate, global-norm gradient clipping,
//! an EMA of the weights (the EMA is what gets evaluated and exported), periodic evaluation
//! through a hook, and atomic checkpoints from which `resume` continues exactly.
//!
//! Output folder:
//! - `policy/`: the EMA policy (safetensors + policy.json), rewritten at every checkpoint;
//! - `train_state/`: online weights, EMA weights and optimiser state (Burn records, MessagePack)
//!   plus `state.json` (step, config) for exact resumption.

use std::path::Path;
use std::time::Instant;

use burn::module::{AutodiffModule, Module};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use diffrl_core::config::{Invalid, Validate, ensure};
use diffrl_core::seeding::{derive, rng};
use diffrl_policy::checkpoint::{self, write_dir_atomic};
use diffrl_policy::encoder::ObsTensors;
use diffrl_policy::{Policy, PolicyModel};
use rand::Rng as _;
use serde::{Deserialize, Serialize};

use crate::LearnError;
use crate::adamw::Adam;
use crate::data::{ChunkDataset, random_shift};
use crate::optim::{clip_factor, ema_decay, grad_norm, lr_at};
use crate::parallel::sharded_grads;
use crate::state::{self, STATE_DIR};

/// Behaviour-cloning settings (`[pretrain]` in a run config).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BcConfig {
    /// Optimiser steps.
    pub steps: usize,
    /// Samples per step (drawn uniformly with replacement).
    pub batch_size: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Final learning rate as a fraction of the peak (cosine decay).
    pub min_lr_ratio: f64,
    /// Linear warmup steps.
    pub warmup_steps: usize,
    /// AdamW decoupled weight decay.
    pub weight_decay: f64,
    /// Global gradient-norm clip (0 = off).
    pub grad_clip: f64,
    /// Largest EMA decay (the decay warms up as (1 + step) / (10 + step)).
    pub ema_decay: f64,
    /// Steps between log lines.
    pub log_every: usize,
    /// Steps between evaluations in the simulator (0 = only at the end).
    pub eval_every: usize,
    /// Episodes per periodic evaluation.
    pub eval_episodes: usize,
    /// Steps between checkpoints.
    pub checkpoint_every: usize,
    /// Threads that share each step's batch (data-parallel gradients, crate::parallel): 1 =
    /// the whole batch on one thread. Results are bit-identical for a given seed and thread
    /// count; another count gives another (equally valid) run. On a GPU use 1.
    pub threads: usize,
    /// Random-shift augmentation of camera images (DrQ's; Diffusion Policy's random crop):
    /// each sample's frames are padded by this many pixels on every side (edge pixels
    /// repeated) and cropped back at an offset drawn uniformly in [-n, n] per axis, the same
    /// for the sample's To frames. 0 = off; ignored without images. Evaluation sees the frames
    /// as they are.
    pub random_shift: usize,
}

impl Default for BcConfig {
    fn default() -> Self {
        Self {
            steps: 45_000,
            batch_size: 256,
            lr: 1e-3,
            min_lr_ratio: 0.01,
            warmup_steps: 500,
            weight_decay: 1e-6,
            grad_clip: 1.0,
            ema_decay: 0.999,
            log_every: 100,
            eval_every: 5_000,
            eval_episodes: 50,
            checkpoint_every: 1_000,
            threads: 2,
            random_shift: 0,
        }
    }
}

impl Validate for BcConfig {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(self.steps >= 1, "steps", "must be >= 1")?;
        ensure(self.batch_size >= 1, "batch_size", "must be >= 1")?;
        ensure(self.lr > 0.0 && self.lr.is_finite(), "lr", "must be > 0")?;
        ensure(
            (0.0..=1.0).contains(&self.min_lr_ratio),
            "min_lr_ratio",
            "must be in [0, 1]",
        )?;
        ensure(self.weight_decay >= 0.0, "weight_decay", "must be >= 0")?;
        ensure(self.grad_clip >= 0.0, "grad_clip", "must be >= 0 (0 = off)")?;
        ensure(
            (0.0..1.0).contains(&self.ema_decay),
            "ema_decay",
            "must be in [0, 1)",
        )?;
        ensure(self.log_every >= 1, "log_every", "must be >= 1")?;
        ensure(
            (1..=256).contains(&self.threads),
            "threads",
            "must be in 1..=256",
        )?;
        ensure(
            self.random_shift <= 16,
            "random_shift",
            "must be in 0..=16 pixels",
        )?;
        ensure(
            self.checkpoint_every >= 1,
            "checkpoint_every",
            "must be >= 1",
        )?;
        Ok(())
    }
}

/// One log line of training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BcLog {
    /// Optimiser steps done.
    pub step: usize,
    /// Mean loss over the steps since the previous line.
    pub loss: f64,
    /// Learning rate of the last step.
    pub lr: f64,
    /// Gradient norm before clipping (mean since the previous line).
    pub grad_norm: f64,
    /// Steps per second since the previous line.
    pub steps_per_sec: f64,
    /// Seconds since this process started training.
    pub elapsed_s: f64,
}

/// Callbacks from the training loop (logging, evaluation, interruption).
pub trait BcHooks<B: Backend> {
    /// A log line (every `log_every` steps).
    fn log(&mut self, _line: &BcLog) {}
    /// Evaluates the EMA policy after `step` steps; the returned JSON is stored with the
    /// checkpoint metadata.
    fn evaluate(
        &mut self,
        _step: usize,
        _policy: &Policy<B>,
    ) -> Result<Option<serde_json::Value>, LearnError> {
        Ok(None)
    }
    /// Whether to stop after the current step (Ctrl-C); a checkpoint is written first.
    fn should_stop(&self) -> bool {
        false
    }
}

/// Hooks that do nothing.
pub struct NoHooks;
impl<B: Backend> BcHooks<B> for NoHooks {}

#[derive(Debug, Serialize, Deserialize)]
struct TrainState {
    step: usize,
    seed: u64,
    config: BcConfig,
    policy: diffrl_policy::PolicyConfig,
    dataset_len: usize,
}

const POLICY_DIR: &str = "policy";

/// How training ended.
pub struct BcOutcome<B: Backend> {
    /// The EMA policy.
    pub policy: Policy<B>,
    /// Steps done in total.
    pub steps: usize,
    /// Whether the loop was interrupted before `steps`.
    pub interrupted: bool,
}

/// Trains `policy` on `data`; writes checkpoints under `out`. With `resume`, continues from
/// `out/train_state` when it exists (refusing a state saved with another config).
pub fn train<B: AutodiffBackend>(
    mut policy: Policy<B>,
    data: &ChunkDataset,
    cfg: &BcConfig,
    seed: u64,
    out: &Path,
    resume: bool,
    hooks: &mut dyn BcHooks<B::InnerBackend>,
) -> Result<BcOutcome<B::InnerBackend>, LearnError> {
    cfg.validate()
        .map_err(|e| LearnError::Data(format!("pretrain.{}: {}", e.field, e.message)))?;
    if data.len == 0 {
        return Err(LearnError::Data("no training samples".into()));
    }
    match (&data.aux, policy.has_aux_head()) {
        (None, true) => {
            return Err(LearnError::Data(
                "the policy has an auxiliary head ([policy.encoder] aux_weight > 0) but \
                 the training samples carry no privileged values"
                    .into(),
            ));
        }
        (Some(a), true) if a.dim != policy.spec.aux => {
            return Err(LearnError::Data(format!(
                "the training samples carry {} privileged values, the policy's auxiliary head \
                 predicts {}",
                a.dim, policy.spec.aux
            )));
        }
        _ => {}
    }
    let device = policy_device(&policy);
    // AdamW and the EMA of the weights, fused on the CPU (crate::adamw).
    let adam = |ema: &PolicyModel<B::InnerBackend>| {
        Adam::<B, PolicyModel<B>>::new(cfg.weight_decay as f32, cfg.threads, &device).with_ema(ema)
    };
    let mut optim = adam(&policy.model.valid())?;
    let mut start = 0;
    let state_dir = out.join(STATE_DIR);
    let saved: Option<TrainState> = if resume {
        state::read_json(&state_dir)?
    } else {
        None
    };
    if let Some(st) = saved {
        if st.config != *cfg
            || st.policy != policy.config
            || st.seed != seed
            || st.dataset_len != data.len
        {
            return Err(LearnError::Resume(format!(
                "{} was written by a run with another pretrain/policy config, seed or dataset; \
                 remove it or use another output folder",
                state_dir.display()
            )));
        }
        policy.model =
            policy
                .model
                .clone()
                .load_record(state::load(&state_dir, "online.mpk", &device)?);
        let ema = policy
            .model
            .valid()
            .load_record(state::load(&state_dir, "ema.mpk", &device)?);
        optim = adam(&ema)?;
        optim.load_record(
            &policy.model,
            state::load(&state_dir, "optim.mpk", &device)?,
        )?;
        start = st.step;
    }
    let [to, ds] = data.obs_shape;
    let [tp, da] = data.action_shape;
    let t0 = Instant::now();
    let mut window = (0.0f64, 0.0f64, 0usize, Instant::now());
    let mut step = start;
    let mut interrupted = false;
    let mut last_eval: Option<serde_json::Value> = None;
    while step < cfg.steps {
        let mut r = rng(derive(seed, step as u64));
        let idx: Vec<usize> = (0..cfg.batch_size)
            .map(|_| r.random_range(0..data.len))
            .collect();
        let (o, a) = data.gather(&idx);
        let mut px = data.gather_images(&idx);
        if let (Some(px), Some(f)) = (px.as_mut(), data.images.as_ref())
            && cfg.random_shift > 0
        {
            // Its own stream: the batch draw and the diffusion noise stay what they were.
            let mut rs = rng(derive(derive(seed, step as u64), u64::MAX));
            let [h, w, c] = f.hwc;
            random_shift(px, [idx.len(), to, c, h, w], cfg.random_shift, &mut rs);
        }
        let aux = data.gather_aux(&idx);
        let aux_dim = data.aux.as_ref().map_or(0, |a| a.dim);
        let b = idx.len();
        // [rows] of the batch's auxiliary targets as [n, A].
        let aux_rows = |rows: std::ops::Range<usize>| {
            let v = aux.as_ref()?;
            Some(Tensor::<B, 2>::from_data(
                TensorData::new(
                    v[rows.start * aux_dim..rows.end * aux_dim].to_vec(),
                    [rows.len(), aux_dim],
                ),
                &device,
            ))
        };
        // [rows] of the batch's images as [n, To, C, H, W].
        let images = |rows: std::ops::Range<usize>| {
            let (f, px) = (data.images.as_ref()?, px.as_ref()?);
            let [h, w, c] = f.hwc;
            let per = to * c * h * w;
            Some(Tensor::<B, 5>::from_data(
                TensorData::new(
                    px[rows.start * per..rows.end * per].to_vec(),
                    [rows.len(), to, c, h, w],
                ),
                &device,
            ))
        };
        let (grads, loss_v) = if cfg.threads <= 1 {
            let obs = ObsTensors {
                state: Tensor::<B, 3>::from_data(TensorData::new(o, [b, to, ds]), &device),
                image: images(0..b),
                text: data.gather_text(&idx, &device),
            };
            let actions = Tensor::<B, 3>::from_data(TensorData::new(a, [b, tp, da]), &device);
            let loss = policy.bc_loss_aux(&obs, actions, aux_rows(0..b), &mut r);
            let loss_v = loss.clone().into_scalar().elem::<f64>();
            (
                GradientsParams::from_grads(loss.backward(), &policy.model),
                loss_v,
            )
        } else {
            // Each shard draws its diffusion noise from its own stream.
            sharded_grads(&policy.model, b, cfg.threads, |i, rows, model| {
                let n = rows.len();
                let obs = ObsTensors {
                    state: Tensor::<B, 3>::from_data(
                        TensorData::new(
                            o[rows.start * to * ds..rows.end * to * ds].to_vec(),
                            [n, to, ds],
                        ),
                        &device,
                    ),
                    image: images(rows.clone()),
                    text: data.gather_text(&idx[rows.clone()], &device),
                };
                let actions = Tensor::<B, 3>::from_data(
                    TensorData::new(
                        a[rows.start * tp * da..rows.end * tp * da].to_vec(),
                        [n, tp, da],
                    ),
                    &device,
                );
                let mut r = rng(derive(derive(seed, step as u64), 1 + i as u64));
                Ok(policy.with_model(model.clone()).bc_loss_aux(
                    &obs,
                    actions,
                    aux_rows(rows),
                    &mut r,
                ))
            })?
        };
        if !loss_v.is_finite() {
            return Err(LearnError::Diverged { step, loss: loss_v });
        }
        let gn = grad_norm(&policy.model, &grads);
        let lr = lr_at(step, cfg.steps, cfg.warmup_steps, cfg.lr, cfg.min_lr_ratio);
        // The model itself, not a clone: parameters nothing else holds are updated in place.
        policy.model = optim.step(
            lr,
            policy.model,
            grads,
            clip_factor(gn, cfg.grad_clip),
            Some(ema_decay(step, cfg.ema_decay)),
        )?;
        step += 1;
        window.0 += loss_v;
        window.1 += gn;
        window.2 += 1;
        if step % cfg.log_every == 0 || step == cfg.steps {
            let dt = window.3.elapsed().as_secs_f64().max(1e-9);
            hooks.log(&BcLog {
                step,
                loss: window.0 / window.2 as f64,
                lr,
                grad_norm: window.1 / window.2 as f64,
                steps_per_sec: window.2 as f64 / dt,
                elapsed_s: t0.elapsed().as_secs_f64(),
            });
            window = (0.0, 0.0, 0, Instant::now());
        }
        let stop = hooks.should_stop();
        let evaluate = cfg.eval_every > 0 && step % cfg.eval_every == 0 && step < cfg.steps;
        if evaluate {
            last_eval =
                hooks.evaluate(step, &policy.valid().with_model(ema_of(&optim, &policy)?))?;
        }
        if step % cfg.checkpoint_every == 0 || step == cfg.steps || stop {
            save_state(
                &policy,
                &ema_of(&optim, &policy)?,
                &optim,
                cfg,
                seed,
                data.len,
                step,
                out,
                last_eval.clone(),
            )?;
        }
        if stop {
            interrupted = step < cfg.steps;
            break;
        }
    }
    let ema_policy = policy.valid().with_model(ema_of(&optim, &policy)?);
    Ok(BcOutcome {
        policy: ema_policy,
        steps: step,
        interrupted,
    })
}

/// The EMA of the weights `optim` keeps.
fn ema_of<B: AutodiffBackend>(
    optim: &Adam<B, PolicyModel<B>>,
    policy: &Policy<B>,
) -> Result<PolicyModel<B::InnerBackend>, LearnError> {
    optim
        .ema(&policy.model)
        .ok_or_else(|| LearnError::Data("the optimiser keeps no EMA of the weights".into()))
}

fn policy_device<B: Backend>(policy: &Policy<B>) -> B::Device {
    let mut devices = policy.model.devices();
    devices.pop().unwrap_or_default()
}

#[allow(clippy::too_many_arguments)]
fn save_state<B: AutodiffBackend>(
    policy: &Policy<B>,
    ema: &PolicyModel<B::InnerBackend>,
    optim: &Adam<B, PolicyModel<B>>,
    cfg: &BcConfig,
    seed: u64,
    dataset_len: usize,
    step: usize,
    out: &Path,
    eval: Option<serde_json::Value>,
) -> Result<(), LearnError> {
    let online = state::bytes::<B, _>(policy.model.clone().into_record(), "online.mpk")?;
    let ema_bytes = state::bytes::<B::InnerBackend, _>(ema.clone().into_record(), "ema.mpk")?;
    let opt = state::bytes::<B, _>(optim.to_record(&policy.model), "optim.mpk")?;
    let state = serde_json::to_vec_pretty(&TrainState {
        step,
        seed,
        config: cfg.clone(),
        policy: policy.config.clone(),
        dataset_len,
    })
    .expect("train state serialises");
    // The exported EMA policy first: a crash between the two writes leaves a policy that is at
    // most one checkpoint ahead of the resumable state, never a broken one.
    let info = serde_json::json!({ "step": step, "seed": seed, "eval": eval });
    checkpoint::save(
        &policy.valid().with_model(ema.clone()),
        &out.join(POLICY_DIR),
        info,
    )?;
    write_dir_atomic(
        &out.join(STATE_DIR),
        &[
            ("online.mpk", &online),
            ("ema.mpk", &ema_bytes),
            ("optim.mpk", &opt),
            ("state.json", &state),
        ],
    )?;
    Ok(())
}
