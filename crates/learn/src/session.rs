//! What a GRPO or PPO run carries from one iteration to the next: the policy being fine-tuned
//! and its optimiser, the counters, and the checkpoint (`policy/` + `train_state/`) that lets a
//! resumed run continue exactly.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::AutodiffBackend;
use diffrl_core::config::Validate;
use diffrl_policy::checkpoint::{self, write_dir_atomic};
use diffrl_policy::{Policy, PolicyModel};
use diffrl_reward::implicit::DpoStats;
use serde::{Deserialize, Serialize};

use crate::LearnError;
use crate::adamw::Adam;
use crate::batch::Batch;
use crate::finetune::{Algorithm, GrpoConfig, GrpoHooks, GrpoLog, GrpoOutcome};
use crate::state::{self, STATE_DIR};
use crate::surrogate::UpdateAcc;

/// `train_state/state.json`: what must match for a run to resume, and its counters.
#[derive(Debug, Serialize, Deserialize)]
struct TrainState {
    iteration: usize,
    seed: u64,
    algorithm: Algorithm,
    config: GrpoConfig,
    policy: diffrl_policy::PolicyConfig,
    env_steps: usize,
    episodes: usize,
}

const POLICY_DIR: &str = "policy";
/// With `[grpo] ema_decay`, the online weights' policy (`policy/` holds the EMA's).
const ONLINE_POLICY_DIR: &str = "policy-online";
/// The EMA of the weights in `train_state/` (with `[grpo] ema_decay`).
const EMA_FILE: &str = "ema.mpk";

/// A fine-tuning run between iterations.
pub(crate) struct Session<'a, B: AutodiffBackend> {
    /// The policy being fine-tuned.
    pub policy: Policy<B>,
    /// Its AdamW state.
    pub optim: Adam<B, PolicyModel<B>>,
    /// The frozen pretrained policy: runs the chain steps before the fine-tuned ones during
    /// rollouts, and anchors the k3 KL.
    pub reference: &'a Policy<B::InnerBackend>,
    /// Where the policy's parameters live.
    pub device: B::Device,
    /// The `[grpo]` table.
    pub cfg: &'a GrpoConfig,
    /// Iterations done.
    pub iteration: usize,
    /// Environment steps collected so far.
    pub env_steps: usize,
    /// Episodes collected so far.
    pub episodes: usize,
    /// Non-finite losses or gradients skipped so far.
    pub nan_updates: usize,
    /// The run's root seed.
    pub seed: u64,
    algorithm: Algorithm,
    out: &'a Path,
    started: Instant,
    last: Option<GrpoLog>,
    last_eval: Option<serde_json::Value>,
    stopped: bool,
}

impl<'a, B: AutodiffBackend> Session<'a, B> {
    /// Checks `cfg`, gives `policy` the configured K' and checks it against `reference`.
    pub fn new(
        policy: Policy<B>,
        reference: &'a Policy<B::InnerBackend>,
        cfg: &'a GrpoConfig,
        algorithm: Algorithm,
        seed: u64,
        out: &'a Path,
    ) -> Result<Self, LearnError> {
        // Both learners read the [grpo] table.
        cfg.validate()
            .map_err(|e| LearnError::Data(format!("grpo.{}: {}", e.field, e.message)))?;
        let policy = policy.with_fine_tuned_steps(cfg.ft_denoising_steps)?;
        if policy.config.kind != reference.config.kind
            || policy.spec != reference.spec
            || policy.chain_len() != reference.chain_len()
        {
            return Err(LearnError::Data(
                "the fine-tuned policy and the reference policy have different architectures"
                    .into(),
            ));
        }
        let device = policy
            .model
            .devices()
            .pop()
            .ok_or_else(|| LearnError::Data("the policy has no parameters".into()))?;
        let mut optim = Adam::new(cfg.weight_decay as f32, cfg.threads, &device);
        if cfg.ema_decay > 0.0 {
            optim = optim.with_ema(&policy.model.valid())?;
        }
        Ok(Self {
            policy,
            optim,
            reference,
            device,
            cfg,
            iteration: 0,
            env_steps: 0,
            episodes: 0,
            nan_updates: 0,
            seed,
            algorithm,
            out,
            started: Instant::now(),
            last: None,
            last_eval: None,
            stopped: false,
        })
    }

    /// With `resume`, continues from `out/train_state` when it exists: loads the policy, its
    /// optimiser and the counters, and returns the folder for the learner's own files (critic,
    /// implicit PRM). A state written with another config, policy, seed or algorithm is refused,
    /// except for `iterations`: it bounds the loop, schedules the last checkpoint and the
    /// evaluations, and spans `min_lr_ratio`'s schedule (with a constant rate, the default, an
    /// extended run is the longer run exactly), so a run can be extended, though not cut below
    /// the iterations it has done.
    pub fn resume(&mut self, resume: bool) -> Result<Option<PathBuf>, LearnError> {
        let dir = self.out.join(STATE_DIR);
        let saved: Option<TrainState> = if resume {
            state::read_json(&dir)?
        } else {
            None
        };
        let Some(st) = saved else {
            return Ok(None);
        };
        let mut saved_cfg = st.config.clone();
        saved_cfg.iterations = self.cfg.iterations;
        if saved_cfg != *self.cfg
            || st.policy != self.policy.config
            || st.seed != self.seed
            || st.algorithm != self.algorithm
        {
            let section = self.algorithm.name();
            return Err(LearnError::Resume(format!(
                "{} was written by a run with another {section} or policy config, seed or \
                 algorithm; remove it or use another output folder",
                dir.display()
            )));
        }
        if self.cfg.iterations < st.iteration {
            return Err(LearnError::Resume(format!(
                "{} has done {} iterations; resuming it needs iterations >= {} (asked for {})",
                dir.display(),
                st.iteration,
                st.iteration,
                self.cfg.iterations
            )));
        }
        let model = self.policy.model.clone();
        self.policy.model = model.load_record(state::load(&dir, "online.mpk", &self.device)?);
        if self.cfg.ema_decay > 0.0 {
            let ema = self.policy.model.valid();
            let ema = ema.load_record(state::load(&dir, EMA_FILE, &self.device)?);
            self.optim = Adam::new(self.cfg.weight_decay as f32, self.cfg.threads, &self.device)
                .with_ema(&ema)?;
        }
        let record = state::load(&dir, "optim.mpk", &self.device)?;
        self.optim.load_record(&self.policy.model, record)?;
        self.iteration = st.iteration;
        self.env_steps = st.env_steps;
        self.episodes = st.episodes;
        Ok(Some(dir))
    }

    /// Ends iteration `self.iteration` (already counted): logs `line`, evaluates every
    /// `eval_every` iterations, and writes a checkpoint every `checkpoint_every` iterations, at
    /// the last one and when the hooks ask to stop, with the learner's own `files` in
    /// `train_state/`. Returns whether to stop.
    pub fn end_iteration(
        &mut self,
        line: GrpoLog,
        hooks: &mut dyn GrpoHooks<B::InnerBackend>,
        files: impl FnOnce() -> Result<Vec<(&'static str, Vec<u8>)>, LearnError>,
    ) -> Result<bool, LearnError> {
        let (it, cfg) = (self.iteration, self.cfg);
        hooks.log(&line);
        self.last = Some(line);
        self.stopped = hooks.should_stop();
        if cfg.eval_every > 0 && it % cfg.eval_every == 0 && it < cfg.iterations {
            self.last_eval = hooks.evaluate(it, &self.deployed())?;
        }
        if it % cfg.checkpoint_every == 0 || it == cfg.iterations || self.stopped {
            self.save_checkpoint(files()?)?;
        }
        Ok(self.stopped)
    }

    /// Writes `policy/` (with the last evaluation in its info) and `train_state/`: the
    /// policy's weights, its optimiser, `files`, then `state.json`.
    fn save_checkpoint(&self, files: Vec<(&'static str, Vec<u8>)>) -> Result<(), LearnError> {
        let st = TrainState {
            iteration: self.iteration,
            seed: self.seed,
            algorithm: self.algorithm,
            config: self.cfg.clone(),
            policy: self.policy.config.clone(),
            env_steps: self.env_steps,
            episodes: self.episodes,
        };
        let state_json = serde_json::to_vec_pretty(&st).expect("train state serialises");
        let mut all: Vec<(&str, Vec<u8>)> = vec![
            (
                "online.mpk",
                state::bytes::<B, _>(self.policy.model.clone().into_record(), "online.mpk")?,
            ),
            (
                "optim.mpk",
                state::bytes::<B, _>(self.optim.to_record(&self.policy.model), "optim.mpk")?,
            ),
        ];
        if let Some(ema) = self.optim.ema(&self.policy.model) {
            all.push((
                EMA_FILE,
                state::bytes::<B::InnerBackend, _>(ema.into_record(), EMA_FILE)?,
            ));
        }
        all.extend(files);
        all.push(("state.json", state_json));
        let info = serde_json::json!({
            "iteration": st.iteration,
            "seed": st.seed,
            "algorithm": st.algorithm,
            "env_steps": st.env_steps,
            "eval": self.last_eval,
        });
        checkpoint::save(&self.deployed(), &self.out.join(POLICY_DIR), info.clone())?;
        if self.cfg.ema_decay > 0.0 {
            let online = self.with_reference_base(self.policy.valid());
            checkpoint::save(&online, &self.out.join(ONLINE_POLICY_DIR), info)?;
        }
        let refs: Vec<(&str, &[u8])> = all.iter().map(|(n, b)| (*n, b.as_slice())).collect();
        write_dir_atomic(&self.out.join(STATE_DIR), &refs)?;
        Ok(())
    }

    /// The metrics of the iteration just counted: its batch, its update, the fraction of its
    /// groups whose outcomes were all equal, and the implicit PRM's update and time.
    pub fn log_line(
        &self,
        batch: &Batch,
        update: &UpdateAcc,
        frac_zero_var_groups: f64,
        prm: Option<DpoStats>,
        prm_s: f64,
    ) -> GrpoLog {
        let n_out = batch.outcomes.len().max(1) as f64;
        let mean = batch.outcomes.iter().sum::<f64>() / n_out;
        let std = (batch
            .outcomes
            .iter()
            .map(|r| (r - mean).powi(2))
            .sum::<f64>()
            / n_out)
            .sqrt();
        GrpoLog {
            iteration: self.iteration,
            env_steps: self.env_steps,
            episodes: self.episodes,
            reward_mean: mean,
            reward_std: std,
            success_rate: batch.successes as f64 / n_out,
            mean_max_score: batch.max_score_sum / n_out,
            frac_zero_var_groups,
            action_spread: (batch.spread.1 > 0).then(|| batch.spread.0 / batch.spread.1 as f64),
            dropped_groups: batch.dropped,
            loss: update.mean(update.loss),
            value_loss: update.value_loss / update.epochs.max(1) as f64,
            clip_frac: update.mean(update.clipped),
            approx_kl: update.mean(update.approx_kl),
            ref_kl: update.mean(update.ref_kl),
            ratio_min: update.ratio_min,
            ratio_max: update.ratio_max,
            grad_norm: update.grad_norm / update.updates.max(1) as f64,
            logp_min: update.logp_min,
            logp_max: update.logp_max,
            epochs: update.epochs,
            skipped_updates: update.skipped,
            collect_s: batch.collect_s,
            env_s: batch.stats.env_s,
            policy_s: batch.stats.policy_s,
            update_s: update.seconds,
            prm_s,
            collect_steps_per_s: batch.stats.env_steps as f64 / batch.collect_s.max(1e-9),
            update_pairs_per_s: (update.n as f64) / update.seconds.max(1e-9),
            elapsed_s: self.started.elapsed().as_secs_f64(),
            prm,
            value_fit: None,
        }
    }

    /// The policy as evaluation, checkpoints and serving see it: the EMA of the weights with
    /// `[grpo] ema_decay`, else the online weights. With K' < K the chain's early steps ran
    /// the frozen reference in every rollout: the policy keeps it as its base, so they sample
    /// the chain the rollouts sampled.
    pub fn deployed(&self) -> Policy<B::InnerBackend> {
        let policy = self.policy.valid();
        let policy = match self.optim.ema(&self.policy.model) {
            Some(ema) => policy.with_model(ema),
            None => policy,
        };
        self.with_reference_base(policy)
    }

    fn with_reference_base(&self, policy: Policy<B::InnerBackend>) -> Policy<B::InnerBackend> {
        if policy.splits_chain() {
            policy.with_base(self.reference.base_or_model().clone())
        } else {
            policy
        }
    }

    /// The fine-tuned policy (as [`Session::deployed`]) and how the run ended.
    pub fn outcome(self) -> GrpoOutcome<B::InnerBackend> {
        GrpoOutcome {
            policy: self.deployed(),
            iterations: self.iteration,
            interrupted: self.stopped && self.iteration < self.cfg.iterations,
            last: self.last,
        }
    }
}
