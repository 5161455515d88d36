//! Policy-gradient fine-tuning over diffusion chains (the two-level MDP of
//! docs/algorithms.md §2–3): every fine-tuned denoising step of every policy call is an action
//! whose likelihood ratio is recomputed under the current parameters.
//!
//! - [`Algorithm::Grpo`]: G rollouts per initial state; group-relative advantages
//!   ([`crate::advantages`]: GRPO, Dr.GRPO, VG-GRPO, process, GiGPO; optional DAPO resampling).
//! - [`Algorithm::Ppo`]: the DPPO-style baseline; independent rollouts, a state-only critic and
//!   GAE over action-chunk steps, the same chain likelihoods and clipped objective.
//!
//! One iteration = collect rollouts -> advantages -> `epochs` passes of minibatches over
//! (environment step, fine-tuned denoising step) pairs -> metrics -> checkpoint. An iteration
//! depends only on (seed, iteration, state at its start), so a run resumed from a checkpoint
//! continues exactly.
//!
//! Output folder: `policy/` (the current policy, loadable by `diffrl eval`) and `train_state/`
//! (weights, optimiser state, critic, `state.json`), both written atomically.

use std::path::Path;
use std::time::Instant;

use burn::module::{AutodiffModule, Module};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use diffrl_core::config::{Invalid, Validate, ensure};
use diffrl_core::env::Env;
use diffrl_core::episode::Episode;
use diffrl_core::record::{NoRecorder, Recorder, Timeline};
use diffrl_core::reward::RewardModule;
use diffrl_core::seeding::{derive, rng};
use diffrl_core::vec_env::VecEnv;
use diffrl_policy::checkpoint::{self, write_dir_atomic};
use diffrl_policy::config::Activation;
use diffrl_policy::encoder::ObsTensors;
use diffrl_policy::nn::Mlp;
use diffrl_policy::{ObsBatch, Policy, PolicyModel, seeded_init};
use diffrl_reward::implicit::{ChainCall, DpoStats, ImplicitPrm, ImplicitPrmConfig};
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::LearnError;
use crate::advantages::{AdvantageConfig, Estimator, GroupRewards, dapo_keep, group_advantages};
use crate::optim::clip_grad_norm;
use crate::rollout::{CollectStats, GroupRollout, collect_groups_recorded, record_rollout_series};
use crate::state::{self, STATE_DIR};

/// Which learner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    /// Group-relative policy optimisation.
    #[default]
    Grpo,
    /// PPO with a learned critic (DPPO).
    Ppo,
}

/// PPO's critic and return settings (`[grpo.ppo]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PpoConfig {
    /// Discount per action-chunk step.
    pub gamma: f64,
    /// GAE lambda.
    pub lambda: f64,
    /// Critic learning rate.
    pub critic_lr: f64,
    /// Critic hidden width (two hidden layers).
    pub critic_hidden: usize,
    /// Normalise advantages over the batch.
    pub normalize_advantages: bool,
}

impl Default for PpoConfig {
    fn default() -> Self {
        Self {
            gamma: 0.99,
            lambda: 0.95,
            critic_lr: 1e-3,
            critic_hidden: 256,
            normalize_advantages: true,
        }
    }
}

/// Fine-tuning settings (`[grpo]` in a run config; `diffrl ppo` reads the same table).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpoConfig {
    /// Iterations (collect + update).
    pub iterations: usize,
    /// Initial states per iteration (B).
    pub groups: usize,
    /// Rollouts per initial state (G); PPO plays B x G independent rollouts instead.
    pub group_size: usize,
    /// Fine-tuned denoising steps K' (0 = keep the checkpoint's setting).
    pub ft_denoising_steps: usize,
    /// Floor on the sampling standard deviation of the rollouts' chains (normalised action
    /// units; 0 = keep the checkpoint's `min_sampling_std`). The exploration noise: Push-T needs
    /// a few pixels of precision, and the behaviour-cloning default of 0.1 (about 26 px) drops
    /// a 58% policy to 16% in stochastic rollouts (docs/grpo.md).
    pub min_sampling_std: f64,
    /// Floor on the standard deviation of the chains' log-likelihoods (0 = the checkpoint's
    /// `min_logprob_std`); set it with `min_sampling_std` so likelihoods are the sampler's.
    pub min_logprob_std: f64,
    /// Passes over the batch per iteration.
    pub epochs: usize,
    /// (environment step, denoising step) pairs per minibatch.
    pub minibatch: usize,
    /// Actor learning rate (AdamW, constant).
    pub lr: f64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f64,
    /// Lower ratio clip epsilon.
    pub clip_low: f64,
    /// Upper ratio clip epsilon.
    pub clip_high: f64,
    /// Weight of the k3 KL to the frozen pretrained policy.
    pub beta: f64,
    /// Denoising discount: fine-tuned step i of K' has its advantage scaled by
    /// gamma^(K' - i - 1).
    pub denoise_gamma: f64,
    /// Global gradient-norm clip (0 = off).
    pub grad_clip: f64,
    /// Stop the epochs of an iteration once the approximate KL exceeds this (0 = off).
    pub target_kl: f64,
    /// Advantage estimator.
    pub advantage: AdvantageConfig,
    /// DAPO dynamic sampling: drop groups whose rewards are all equal and collect more.
    pub dynamic_sampling: bool,
    /// Extra collection rounds dynamic sampling may use per iteration.
    pub max_resample_rounds: usize,
    /// Non-finite losses skipped before the run stops with an error.
    pub max_nan_updates: usize,
    /// Iterations between checkpoints.
    pub checkpoint_every: usize,
    /// Iterations between evaluations (0 = only at the end, by the caller).
    pub eval_every: usize,
    /// PPO settings.
    pub ppo: PpoConfig,
    /// OPRL implicit process reward model (`[grpo.implicit_prm]`): a policy copy trained with
    /// trajectory DPO on each batch; its log-ratio to the behaviour policy becomes the step
    /// rewards (replacing the reward module's), read by the `process`, `grpo-process` and
    /// `gigpo` estimators. Absent = off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub implicit_prm: Option<ImplicitPrmConfig>,
}

impl Default for GrpoConfig {
    fn default() -> Self {
        Self {
            iterations: 30,
            groups: 8,
            group_size: 8,
            ft_denoising_steps: 2,
            min_sampling_std: 0.03,
            min_logprob_std: 0.03,
            epochs: 4,
            minibatch: 2048,
            lr: 3e-5,
            weight_decay: 0.0,
            clip_low: 0.01,
            clip_high: 0.01,
            beta: 0.0,
            denoise_gamma: 1.0,
            grad_clip: 1.0,
            target_kl: 0.0,
            advantage: AdvantageConfig::default(),
            dynamic_sampling: false,
            max_resample_rounds: 2,
            max_nan_updates: 3,
            checkpoint_every: 1,
            eval_every: 0,
            ppo: PpoConfig::default(),
            implicit_prm: None,
        }
    }
}

impl Validate for GrpoConfig {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(self.iterations >= 1, "iterations", "must be >= 1")?;
        ensure(self.groups >= 1, "groups", "must be >= 1")?;
        ensure(
            self.group_size >= 2,
            "group_size",
            "must be >= 2: group-relative advantages compare rollouts of one initial state",
        )?;
        ensure(self.epochs >= 1, "epochs", "must be >= 1")?;
        for (v, key) in [
            (self.min_sampling_std, "min_sampling_std"),
            (self.min_logprob_std, "min_logprob_std"),
        ] {
            ensure(
                v.is_finite() && v >= 0.0,
                key,
                "must be >= 0 (0 = the checkpoint's)",
            )?;
        }
        ensure(self.minibatch >= 1, "minibatch", "must be >= 1")?;
        ensure(self.lr > 0.0 && self.lr.is_finite(), "lr", "must be > 0")?;
        ensure(self.weight_decay >= 0.0, "weight_decay", "must be >= 0")?;
        ensure(
            self.clip_low > 0.0 && self.clip_low < 1.0,
            "clip_low",
            "must be in (0, 1)",
        )?;
        ensure(self.clip_high > 0.0, "clip_high", "must be > 0")?;
        ensure(self.beta >= 0.0, "beta", "must be >= 0")?;
        ensure(
            self.denoise_gamma > 0.0 && self.denoise_gamma <= 1.0,
            "denoise_gamma",
            "must be in (0, 1]",
        )?;
        ensure(self.grad_clip >= 0.0, "grad_clip", "must be >= 0 (0 = off)")?;
        ensure(self.target_kl >= 0.0, "target_kl", "must be >= 0 (0 = off)")?;
        ensure(
            self.checkpoint_every >= 1,
            "checkpoint_every",
            "must be >= 1",
        )?;
        ensure(
            (0.0..=1.0).contains(&self.ppo.gamma),
            "ppo.gamma",
            "must be in [0, 1]",
        )?;
        ensure(
            (0.0..=1.0).contains(&self.ppo.lambda),
            "ppo.lambda",
            "must be in [0, 1]",
        )?;
        ensure(self.ppo.critic_lr > 0.0, "ppo.critic_lr", "must be > 0")?;
        ensure(
            self.ppo.critic_hidden >= 1,
            "ppo.critic_hidden",
            "must be >= 1",
        )?;
        self.advantage
            .validate()
            .map_err(|e| Invalid::new("advantage", e.to_string()))?;
        if let Some(prm) = &self.implicit_prm {
            prm.validate()
                .map_err(|e| Invalid::new("implicit_prm", e.to_string()))?;
            ensure(
                matches!(
                    self.advantage.estimator,
                    Estimator::Process | Estimator::GrpoProcess | Estimator::Gigpo
                ),
                "implicit_prm",
                "gives step rewards, which only the process, grpo-process and gigpo estimators \
                 read; set [grpo.advantage].estimator to one of them",
            )?;
        }
        Ok(())
    }
}

/// Metrics of one iteration (one line of metrics.jsonl).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GrpoLog {
    /// Iterations done.
    pub iteration: usize,
    /// Environment steps collected so far (live rollouts only).
    pub env_steps: usize,
    /// Episodes collected so far.
    pub episodes: usize,
    /// Mean outcome reward of this iteration's rollouts.
    pub reward_mean: f64,
    /// Its standard deviation.
    pub reward_std: f64,
    /// Success rate of this iteration's rollouts.
    pub success_rate: f64,
    /// Mean of per-rollout max score.
    pub mean_max_score: f64,
    /// Fraction of groups whose rewards are all equal (they carry no GRPO signal).
    pub frac_zero_var_groups: f64,
    /// Groups dropped by dynamic sampling.
    pub dropped_groups: usize,
    /// Mean surrogate loss.
    pub loss: f64,
    /// Mean critic loss (PPO).
    pub value_loss: f64,
    /// Fraction of pairs whose ratio was clipped.
    pub clip_frac: f64,
    /// Approximate KL(old || new), mean of (r - 1) - log r.
    pub approx_kl: f64,
    /// k3 KL to the pretrained policy (when beta > 0).
    pub ref_kl: f64,
    /// Smallest ratio seen.
    pub ratio_min: f64,
    /// Largest ratio seen.
    pub ratio_max: f64,
    /// Mean gradient norm before clipping.
    pub grad_norm: f64,
    /// Smallest new log-prob.
    pub logp_min: f64,
    /// Largest new log-prob.
    pub logp_max: f64,
    /// Epochs run (fewer than configured after a KL early stop).
    pub epochs: usize,
    /// Minibatches skipped for a non-finite loss.
    pub skipped_updates: usize,
    /// Seconds collecting (environment + policy).
    pub collect_s: f64,
    /// Of which stepping environments.
    pub env_s: f64,
    /// Of which in policy calls.
    pub policy_s: f64,
    /// Seconds updating.
    pub update_s: f64,
    /// Seconds training and scoring the implicit PRM (0 without one).
    #[serde(default)]
    pub prm_s: f64,
    /// Environment steps per second of collection.
    pub collect_steps_per_s: f64,
    /// Pairs per second of update (forward + backward + optimiser).
    pub update_pairs_per_s: f64,
    /// Seconds since this process started.
    pub elapsed_s: f64,
    /// The implicit PRM's DPO update, when one is trained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prm: Option<DpoStats>,
}

/// Callbacks from the loop.
pub trait GrpoHooks<B: Backend> {
    /// One line per iteration.
    fn log(&mut self, _line: &GrpoLog) {}
    /// Evaluates the policy after `iteration`; the JSON is stored with the checkpoint.
    fn evaluate(
        &mut self,
        _iteration: usize,
        _policy: &Policy<B>,
    ) -> Result<Option<serde_json::Value>, LearnError> {
        Ok(None)
    }
    /// Whether to stop after the current iteration (a checkpoint is written first).
    fn should_stop(&self) -> bool {
        false
    }
    /// Where the loop records rollout 0 of every iteration (scenes, chains, per-step rewards
    /// and advantages) and group statistics, on `train_step` = the iteration being collected
    /// for (1-based, as in [`GrpoLog::iteration`]).
    fn recorder(&self) -> &dyn Recorder {
        &NoRecorder
    }
}

/// Hooks that do nothing.
pub struct NoHooks;
impl<B: Backend> GrpoHooks<B> for NoHooks {}

/// How fine-tuning ended.
pub struct GrpoOutcome<B: Backend> {
    /// The fine-tuned policy.
    pub policy: Policy<B>,
    /// Iterations done in total.
    pub iterations: usize,
    /// Whether the loop stopped early.
    pub interrupted: bool,
    /// The last iteration's metrics.
    pub last: Option<GrpoLog>,
}

/// State-value network of PPO: MLP over the normalised, flattened observation history.
#[derive(Module, Debug)]
pub struct Critic<B: Backend> {
    net: Mlp<B>,
}

impl<B: Backend> Critic<B> {
    /// A critic for `input` features.
    pub fn new(input: usize, hidden: usize, device: &B::Device) -> Self {
        Self {
            net: Mlp::new(&[input, hidden, hidden, 1], Activation::Mish, device),
        }
    }

    /// V(s): [B].
    pub fn forward(&self, obs: &ObsTensors<B>) -> Tensor<B, 1> {
        let [b, to, ds] = obs.state.dims();
        self.net
            .forward(obs.state.clone().reshape([b, to * ds]))
            .reshape([b])
    }
}

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

/// A value per (rollout, decision).
type PerDecision = Vec<Vec<f64>>;

/// One (rollout, decision, chain step) sample of an update.
#[derive(Debug, Clone, Copy)]
struct Pair {
    rollout: usize,
    decision: usize,
    step: usize,
    advantage: f32,
    old: f32,
    reference: f32,
}

/// Fine-tunes `policy` (initialised from `reference`, the frozen pretrained policy) on `venv`
/// with rewards from `reward`. `venv` must hold `groups * group_size` environments that reset
/// in the same step. Checkpoints go to `out`; with `resume`, continues from `out/train_state`.
#[allow(clippy::too_many_arguments)]
pub fn train<E: Env, B: AutodiffBackend>(
    policy: Policy<B>,
    reference: &Policy<B::InnerBackend>,
    venv: &mut VecEnv<E>,
    reward: &dyn RewardModule,
    cfg: &GrpoConfig,
    algorithm: Algorithm,
    seed: u64,
    out: &Path,
    resume: bool,
    hooks: &mut dyn GrpoHooks<B::InnerBackend>,
) -> Result<GrpoOutcome<B::InnerBackend>, LearnError> {
    let section = match algorithm {
        Algorithm::Grpo => "grpo",
        Algorithm::Ppo => "ppo",
    };
    // Both learners read the [grpo] table.
    cfg.validate()
        .map_err(|e| LearnError::Data(format!("grpo.{}: {}", e.field, e.message)))?;
    let mut policy = match cfg.ft_denoising_steps {
        0 => policy,
        k => policy.with_fine_tuned_steps(k)?,
    };
    if policy.config.kind != reference.config.kind
        || policy.spec != reference.spec
        || policy.chain_len() != reference.chain_len()
    {
        return Err(LearnError::Data(
            "the fine-tuned policy and the reference policy have different architectures".into(),
        ));
    }
    let device = policy
        .model
        .devices()
        .pop()
        .ok_or_else(|| LearnError::Data("the policy has no parameters".into()))?;
    let mut optim = AdamWConfig::new()
        .with_weight_decay(cfg.weight_decay as f32)
        .init::<B, PolicyModel<B>>();
    let [to, ds] = [policy.config.obs_horizon, policy.spec.state_dim];
    let mut critic: Option<Critic<B>> = (algorithm == Algorithm::Ppo).then(|| {
        seeded_init::<B, _>(&device, derive(seed, 0xC817), || {
            Critic::new(to * ds, cfg.ppo.critic_hidden, &device)
        })
    });
    let mut critic_optim = AdamWConfig::new().init::<B, Critic<B>>();
    if cfg.implicit_prm.is_some() && algorithm == Algorithm::Ppo {
        return Err(LearnError::Data(
            "grpo.implicit_prm ranks the rollouts of a group by outcome; PPO plays no groups \
             (use `diffrl grpo`)"
                .into(),
        ));
    }
    let mut prm = match &cfg.implicit_prm {
        Some(c) => Some(
            ImplicitPrm::<B>::new(&policy.valid(), c.clone())
                .map_err(|e| LearnError::Data(format!("grpo.implicit_prm: {e}")))?,
        ),
        None => None,
    };
    let mut start = 0;
    let (mut env_steps, mut episodes) = (0usize, 0usize);
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
            || st.algorithm != algorithm
        {
            return Err(LearnError::Resume(format!(
                "{} was written by a run with another {section} or policy config, seed or \
                 algorithm; remove it or use another output folder",
                state_dir.display()
            )));
        }
        policy.model =
            policy
                .model
                .clone()
                .load_record(state::load(&state_dir, "online.mpk", &device)?);
        optim = optim.load_record(state::load(&state_dir, "optim.mpk", &device)?);
        if let Some(c) = critic.take() {
            critic = Some(c.load_record(state::load(&state_dir, "critic.mpk", &device)?));
            critic_optim =
                critic_optim.load_record(state::load(&state_dir, "critic_optim.mpk", &device)?);
        }
        if let Some(p) = prm.as_mut() {
            let read = |name: &str| {
                let path = state_dir.join(name);
                std::fs::read(&path).map_err(|source| LearnError::Io { path, source })
            };
            p.load_state(read(PRM_FILES[0])?, read(PRM_FILES[1])?)
                .map_err(|e| LearnError::Resume(format!("{STATE_DIR}: {e}")))?;
        }
        start = st.iteration;
        env_steps = st.env_steps;
        episodes = st.episodes;
    }
    let t0 = Instant::now();
    let mut iteration = start;
    let mut nan_total = 0usize;
    let mut last = None;
    let mut last_eval = None;
    let mut interrupted = false;
    let (groups, group_size) = match algorithm {
        Algorithm::Grpo => (cfg.groups, cfg.group_size),
        Algorithm::Ppo => (cfg.groups * cfg.group_size, 1),
    };
    while iteration < cfg.iterations {
        let it_seed = derive(seed, iteration as u64);
        // Collect (with DAPO resampling rounds when asked).
        let t_collect = Instant::now();
        let current = policy.valid();
        let frozen = Some(&reference.model);
        let mut kept: Vec<GroupRollout> = Vec::new();
        let mut stats = CollectStats::default();
        let mut dropped = 0;
        let mut all_outcomes: Vec<f64> = Vec::new();
        let mut successes = 0usize;
        let mut max_scores = 0.0f64;
        let mut rollout_rewards: Vec<diffrl_core::reward::EpisodeRewards> = Vec::new();
        let rounds = if cfg.dynamic_sampling && algorithm == Algorithm::Grpo {
            1 + cfg.max_resample_rounds
        } else {
            1
        };
        let mut kept_groups = 0;
        hooks
            .recorder()
            .set_time(Timeline::TrainStep, iteration as i64 + 1);
        // (env_step of rollout 0's start, its index in `kept`) when it was recorded and kept.
        let mut recorded: Option<(i64, usize)> = None;
        for round in 0..rounds {
            let mut prng = rng(derive(it_seed, 1 + round as u64));
            let (rollouts, s) = collect_groups_recorded(
                venv,
                &current,
                frozen,
                groups,
                group_size,
                derive(it_seed, 100 + round as u64),
                &mut prng,
                &device,
                if round == 0 {
                    hooks.recorder()
                } else {
                    &NoRecorder
                },
            )?;
            stats.env_s += s.env_s;
            stats.policy_s += s.policy_s;
            stats.env_steps += s.env_steps;
            stats.decisions += s.decisions;
            for g in 0..groups {
                let members = &rollouts[g * group_size..(g + 1) * group_size];
                let rewards = members
                    .iter()
                    .enumerate()
                    .map(|(j, r)| {
                        reward.rewards(&r.episode).map_err(|e| {
                            LearnError::Data(format!(
                                "reward module '{}' failed on rollout {j} of group {g} at \
                                 iteration {iteration}: {e}",
                                reward.name()
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let mut rewards = rewards;
                let episodes: Vec<&Episode> = members.iter().map(|r| &r.episode).collect();
                reward.refine_group(&episodes, &mut rewards).map_err(|e| {
                    LearnError::Data(format!(
                        "reward module '{}' failed on group {g} at iteration {iteration}: {e}",
                        reward.name()
                    ))
                })?;
                for (j, r) in rewards.iter().enumerate() {
                    if !r.outcome.is_finite() {
                        return Err(LearnError::Data(format!(
                            "reward module '{}' gave a non-finite outcome ({}) for rollout {j} of \
                             group {g} at iteration {iteration}",
                            reward.name(),
                            r.outcome
                        )));
                    }
                }
                let outcomes: Vec<f64> = rewards.iter().map(|r| r.outcome).collect();
                all_outcomes.extend(&outcomes);
                successes += members.iter().filter(|r| r.episode.success()).count();
                max_scores += members
                    .iter()
                    .map(|r| f64::from(r.episode.max_score()))
                    .sum::<f64>();
                let keep = kept_groups < groups
                    && (!cfg.dynamic_sampling
                        || algorithm == Algorithm::Ppo
                        || dapo_keep(&outcomes)
                        || round + 1 == rounds);
                if keep {
                    if g == 0
                        && let Some(t) = s.recorded_env_step
                    {
                        recorded = Some((t, kept.len()));
                    }
                    kept_groups += 1;
                    for (mut r, rw) in members.iter().cloned().zip(rewards) {
                        r.group = kept_groups - 1;
                        kept.push(r);
                        rollout_rewards.push(rw);
                    }
                } else {
                    dropped += 1;
                }
            }
            if kept_groups >= groups {
                break;
            }
        }
        let collect_s = t_collect.elapsed().as_secs_f64();
        env_steps += stats.env_steps;
        episodes += all_outcomes.len();
        if algorithm == Algorithm::Grpo {
            hooks.recorder().group_stats(&all_outcomes, group_size);
        }

        // The implicit PRM learns from this batch, then scores its policy calls.
        let t_prm = Instant::now();
        let prm_stats = match prm.as_mut() {
            Some(p) => Some(implicit_step_rewards(
                p,
                &kept,
                &mut rollout_rewards,
                group_size,
            )?),
            None => None,
        };
        let prm_s = t_prm.elapsed().as_secs_f64();

        // Advantages per (rollout, decision).
        let mut returns = Vec::new();
        let (advantages, zero_var) = match algorithm {
            Algorithm::Grpo => {
                grpo_advantages(&kept, &rollout_rewards, group_size, ds, &cfg.advantage)?
            }
            Algorithm::Ppo => {
                let c = critic.as_ref().expect("PPO has a critic").valid();
                let (adv, ret) =
                    ppo_advantages(&kept, &rollout_rewards, &current, &c, &cfg.ppo, &device)?;
                returns = ret;
                (adv, 0)
            }
        };
        if let Some((t, ri)) = recorded {
            record_rollout_series(
                hooks.recorder(),
                t,
                &kept[ri],
                &rollout_rewards[ri],
                &advantages[ri],
            );
        }

        // Pairs, with old log-probs from the rollout and reference log-probs when needed.
        let t_update = Instant::now();
        let k = policy.chain_len();
        let ft = policy.process().map_or(1, |p| p.ft_steps());
        let first_ft = k - ft;
        let mut pairs = Vec::new();
        for (ri, r) in kept.iter().enumerate() {
            for (di, d) in r.decisions.iter().enumerate() {
                for step in first_ft..k {
                    let discount = cfg.denoise_gamma.powi((k - 1 - step) as i32);
                    pairs.push(Pair {
                        rollout: ri,
                        decision: di,
                        step,
                        advantage: (advantages[ri][di] * discount) as f32,
                        old: d.logp[step],
                        reference: 0.0,
                    });
                }
            }
        }
        if cfg.beta > 0.0 {
            for chunk in pairs.chunks_mut(cfg.minibatch) {
                let mb = Minibatch::gather(&kept, chunk, reference, &device)?;
                let lp = reference.pair_logprobs(&mb.obs, mb.x, mb.next, &mb.steps);
                for (p, v) in chunk.iter_mut().zip(to_vec(lp)?) {
                    p.reference = v;
                }
            }
        }
        let mut acc = UpdateAcc::default();
        let mut epochs_run = 0;
        let mut order: Vec<usize> = (0..pairs.len()).collect();
        for epoch in 0..cfg.epochs {
            order.shuffle(&mut rng(derive(it_seed, 10_000 + epoch as u64)));
            let mut epoch_kl = (0.0, 0usize);
            for idx in order.chunks(cfg.minibatch) {
                let chunk: Vec<Pair> = idx.iter().map(|&i| pairs[i]).collect();
                let mb = Minibatch::gather(&kept, &chunk, &policy, &device)?;
                let (loss, m) = surrogate(&policy, &mb, cfg)?;
                if !m.loss.is_finite() {
                    acc.skipped += 1;
                    nan_total += 1;
                    if nan_total > cfg.max_nan_updates {
                        return Err(LearnError::Diverged {
                            step: iteration,
                            loss: m.loss,
                        });
                    }
                    continue;
                }
                let mut grads = GradientsParams::from_grads(loss.backward(), &policy.model);
                let gn = clip_grad_norm(&policy.model, &mut grads, cfg.grad_clip);
                if !gn.is_finite() {
                    acc.skipped += 1;
                    nan_total += 1;
                    if nan_total > cfg.max_nan_updates {
                        return Err(LearnError::Diverged {
                            step: iteration,
                            loss: gn,
                        });
                    }
                    continue;
                }
                policy.model = optim.step(cfg.lr, policy.model.clone(), grads);
                acc.add(&m, gn);
                epoch_kl.0 += m.approx_kl * m.n as f64;
                epoch_kl.1 += m.n;
            }
            if let Some(c) = critic.take() {
                let (c, vloss) = critic_epoch(
                    c,
                    &mut critic_optim,
                    &kept,
                    &returns,
                    &policy,
                    cfg,
                    &device,
                    derive(it_seed, 20_000 + epoch as u64),
                )?;
                critic = Some(c);
                acc.value_loss += vloss;
            }
            epochs_run += 1;
            if cfg.target_kl > 0.0
                && epoch_kl.1 > 0
                && epoch_kl.0 / epoch_kl.1 as f64 > cfg.target_kl
            {
                break;
            }
        }
        let update_s = t_update.elapsed().as_secs_f64();
        iteration += 1;
        let n_out = all_outcomes.len().max(1) as f64;
        let mean = all_outcomes.iter().sum::<f64>() / n_out;
        let std = (all_outcomes.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n_out).sqrt();
        let line = GrpoLog {
            iteration,
            env_steps,
            episodes,
            reward_mean: mean,
            reward_std: std,
            success_rate: successes as f64 / n_out,
            mean_max_score: max_scores / n_out,
            frac_zero_var_groups: zero_var as f64 / groups.max(1) as f64,
            dropped_groups: dropped,
            loss: acc.mean(acc.loss),
            value_loss: acc.value_loss / epochs_run.max(1) as f64,
            clip_frac: acc.mean(acc.clipped),
            approx_kl: acc.mean(acc.approx_kl),
            ref_kl: acc.mean(acc.ref_kl),
            ratio_min: acc.ratio_min,
            ratio_max: acc.ratio_max,
            grad_norm: acc.grad_norm / acc.updates.max(1) as f64,
            logp_min: acc.logp_min,
            logp_max: acc.logp_max,
            epochs: epochs_run,
            skipped_updates: acc.skipped,
            collect_s,
            env_s: stats.env_s,
            policy_s: stats.policy_s,
            update_s,
            prm_s,
            collect_steps_per_s: stats.env_steps as f64 / collect_s.max(1e-9),
            update_pairs_per_s: (acc.n as f64) / update_s.max(1e-9),
            elapsed_s: t0.elapsed().as_secs_f64(),
            prm: prm_stats,
        };
        hooks.log(&line);
        last = Some(line);
        let stop = hooks.should_stop();
        if cfg.eval_every > 0 && iteration % cfg.eval_every == 0 && iteration < cfg.iterations {
            last_eval = hooks.evaluate(iteration, &policy.valid())?;
        }
        if iteration % cfg.checkpoint_every == 0 || iteration == cfg.iterations || stop {
            let st = TrainState {
                iteration,
                seed,
                algorithm,
                config: cfg.clone(),
                policy: policy.config.clone(),
                env_steps,
                episodes,
            };
            let prm_state = prm
                .as_ref()
                .map(ImplicitPrm::state_bytes)
                .transpose()
                .map_err(|e| LearnError::Data(e.to_string()))?;
            save_state(
                &policy,
                &optim,
                critic.as_ref(),
                &critic_optim,
                prm_state,
                &st,
                out,
                last_eval.clone(),
            )?;
        }
        if stop {
            interrupted = iteration < cfg.iterations;
            break;
        }
    }
    Ok(GrpoOutcome {
        policy: policy.valid(),
        iterations: iteration,
        interrupted,
        last,
    })
}

/// Files of the implicit PRM in `train_state/`: pi_phi's weights and its optimiser.
const PRM_FILES: [&str; 2] = ["prm.mpk", "prm_optim.mpk"];

/// Trains the implicit PRM on a batch (groups of `group_size` consecutive rollouts, ranked by
/// their outcomes) and replaces every rollout's step rewards by its rewards: a policy call's
/// reward goes to the environment step its chunk started at (zeros elsewhere), so summing
/// over executed steps gives it back per decision.
fn implicit_step_rewards<B: AutodiffBackend>(
    prm: &mut ImplicitPrm<B>,
    kept: &[GroupRollout],
    rewards: &mut [diffrl_core::reward::EpisodeRewards],
    group_size: usize,
) -> Result<DpoStats, LearnError> {
    let err = |e: diffrl_reward::RewardError| LearnError::Data(e.to_string());
    let calls: Vec<Vec<ChainCall<'_>>> = kept
        .iter()
        .map(|r| {
            r.decisions
                .iter()
                .map(|d| ChainCall {
                    state: &d.state,
                    image: d.image.as_deref(),
                    chain: &d.chain,
                    old_logp: &d.logp,
                })
                .collect()
        })
        .collect();
    let views: Vec<&[ChainCall<'_>]> = calls.iter().map(Vec::as_slice).collect();
    let outcomes: Vec<f64> = rewards.iter().map(|r| r.outcome).collect();
    let stats = prm.update(&views, &outcomes, group_size).map_err(err)?;
    for ((r, rw), v) in kept.iter().zip(rewards.iter_mut()).zip(&views) {
        let mut per_step = vec![0.0; r.episode.len()];
        for (d, x) in r.decisions.iter().zip(prm.call_rewards(v).map_err(err)?) {
            if let Some(slot) = per_step.get_mut(d.env_step) {
                *slot += x;
            }
        }
        rw.per_step = Some(per_step);
    }
    Ok(stats)
}

/// Group-relative advantages per (rollout, decision) and the number of zero-variance groups.
fn grpo_advantages(
    kept: &[GroupRollout],
    rewards: &[diffrl_core::reward::EpisodeRewards],
    group_size: usize,
    state_dim: usize,
    cfg: &AdvantageConfig,
) -> Result<(Vec<Vec<f64>>, usize), LearnError> {
    let mut out = Vec::with_capacity(kept.len());
    let mut zero = 0;
    for (g, members) in kept.chunks(group_size).enumerate() {
        let rw = &rewards[g * group_size..(g + 1) * group_size];
        let outcomes: Vec<f64> = rw.iter().map(|r| r.outcome).collect();
        let steps: Option<Vec<Vec<f64>>> = rw
            .iter()
            .zip(members)
            .map(|(r, m)| r.per_step.as_ref().map(|s| m.per_decision(s)))
            .collect();
        let anchors: Vec<Vec<Vec<f32>>> = members.iter().map(|m| m.anchors(state_dim)).collect();
        let lengths: Vec<usize> = members.iter().map(|m| m.decisions.len()).collect();
        let adv = group_advantages(
            cfg,
            &GroupRewards {
                outcomes: &outcomes,
                steps: steps.as_deref(),
                anchors: Some(&anchors),
            },
            &lengths,
        )
        .map_err(|e| LearnError::Data(format!("advantages of group {g}: {e}")))?;
        zero += usize::from(adv.zero_variance);
        out.extend(adv.per_step);
    }
    Ok((out, zero))
}

/// GAE over action-chunk steps with the critic's values; rewards per decision are the reward
/// module's per-step rewards summed over the executed chunk (or the outcome on the last
/// decision when it gives none). An episode cut by the step limit bootstraps from the critic's
/// value of its final observation (the window of the last `To` observations ending there).
/// Returns (advantages, critic targets = GAE advantages + values before normalisation).
fn ppo_advantages<B: Backend>(
    kept: &[GroupRollout],
    rewards: &[diffrl_core::reward::EpisodeRewards],
    policy: &Policy<B>,
    critic: &Critic<B>,
    cfg: &PpoConfig,
    device: &B::Device,
) -> Result<(PerDecision, PerDecision), LearnError> {
    let mut out = Vec::with_capacity(kept.len());
    let mut returns = Vec::with_capacity(kept.len());
    for (r, rw) in kept.iter().zip(rewards) {
        let n = r.decisions.len();
        if n == 0 {
            out.push(Vec::new());
            returns.push(Vec::new());
            continue;
        }
        let per = match &rw.per_step {
            Some(s) => r.per_decision(s),
            None => {
                let mut v = vec![0.0; n];
                v[n - 1] = rw.outcome;
                v
            }
        };
        if let Some((t, v)) = per.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(LearnError::Data(format!(
                "non-finite reward {v} at decision {t} of a rollout"
            )));
        }
        let mut state: Vec<f32> = r.decisions.iter().flat_map(|d| d.state.clone()).collect();
        let final_window = (!r.episode.terminated)
            .then(|| final_window(&r.episode, policy.config.obs_horizon))
            .flatten();
        let rows = n + usize::from(final_window.is_some());
        if let Some(w) = &final_window {
            state.extend_from_slice(w);
        }
        let obs = ObsBatch {
            batch: rows,
            state,
            image: None,
        };
        let values: Vec<f64> = to_vec(critic.forward(&policy.obs_tensors(&obs, device)?))?
            .into_iter()
            .map(f64::from)
            .collect();
        let bootstrap = match (r.episode.terminated, final_window.is_some()) {
            (true, _) => 0.0,
            (false, true) => values[n],
            // No final observation recorded: the last decision's value stands in.
            (false, false) => values[n - 1],
        };
        let adv = crate::advantages::gae(&per, &values[..n], bootstrap, cfg.gamma, cfg.lambda);
        returns.push(adv.iter().zip(&values).map(|(a, v)| a + v).collect());
        out.push(adv);
    }
    if cfg.normalize_advantages {
        let all: Vec<f64> = out.iter().flatten().copied().collect();
        let m = all.iter().sum::<f64>() / all.len().max(1) as f64;
        let s = (all.iter().map(|a| (a - m).powi(2)).sum::<f64>() / all.len().max(1) as f64).sqrt();
        for a in out.iter_mut().flatten() {
            *a = (*a - m) / (s + 1e-8);
        }
    }
    Ok((out, returns))
}

/// The state window (`horizon` frames, oldest first, the first frame repeated before the
/// start as during rollouts) that ends at `ep`'s final observation; `None` without one.
fn final_window(ep: &Episode, horizon: usize) -> Option<Vec<f32>> {
    let last = ep.final_observation.as_ref()?;
    let mut frames: Vec<&[f32]> = ep
        .observations
        .iter()
        .map(|o| o.state.as_slice())
        .chain(std::iter::once(last.state.as_slice()))
        .collect();
    let first = frames[0];
    while frames.len() < horizon {
        frames.insert(0, first);
    }
    Some(frames[frames.len() - horizon..].concat())
}

/// Tensors of one minibatch of pairs.
struct Minibatch<B: Backend> {
    obs: ObsTensors<B>,
    x: Tensor<B, 3>,
    next: Tensor<B, 3>,
    steps: Vec<usize>,
    advantage: Tensor<B, 1>,
    old: Tensor<B, 1>,
    reference: Tensor<B, 1>,
}

impl<B: Backend> Minibatch<B> {
    fn gather(
        kept: &[GroupRollout],
        pairs: &[Pair],
        policy: &Policy<B>,
        device: &B::Device,
    ) -> Result<Self, LearnError> {
        let [tp, da] = policy.chunk();
        let per = tp * da;
        let n = pairs.len();
        let mut state = Vec::new();
        let mut image: Option<Vec<u8>> = None;
        let mut x = Vec::with_capacity(n * per);
        let mut next = Vec::with_capacity(n * per);
        for p in pairs {
            let d = &kept[p.rollout].decisions[p.decision];
            state.extend_from_slice(&d.state);
            if let Some(img) = &d.image {
                image.get_or_insert_with(Vec::new).extend_from_slice(img);
            }
            x.extend_from_slice(&d.chain[p.step * per..(p.step + 1) * per]);
            next.extend_from_slice(&d.chain[(p.step + 1) * per..(p.step + 2) * per]);
        }
        let obs = policy.obs_tensors(
            &ObsBatch {
                batch: n,
                state,
                image,
            },
            device,
        )?;
        let col = |f: &dyn Fn(&Pair) -> f32| {
            Tensor::<B, 1>::from_data(
                TensorData::new(pairs.iter().map(f).collect::<Vec<_>>(), [n]),
                device,
            )
        };
        Ok(Self {
            obs,
            x: Tensor::from_data(TensorData::new(x, [n, tp, da]), device),
            next: Tensor::from_data(TensorData::new(next, [n, tp, da]), device),
            steps: pairs.iter().map(|p| p.step).collect(),
            advantage: col(&|p| p.advantage),
            old: col(&|p| p.old),
            reference: col(&|p| p.reference),
        })
    }
}

/// Scalars of one minibatch.
#[derive(Debug, Clone, Copy, Default)]
pub struct SurrogateStats {
    /// Pairs.
    pub n: usize,
    /// Loss value.
    pub loss: f64,
    /// Fraction of clipped ratios.
    pub clip_frac: f64,
    /// Approximate KL(old || new).
    pub approx_kl: f64,
    /// k3 KL to the reference.
    pub ref_kl: f64,
    /// Ratio range.
    pub ratio: [f64; 2],
    /// New log-prob range.
    pub logp: [f64; 2],
}

/// The loss of a minibatch of (env step, denoising step) pairs (docs/algorithms.md §3):
/// mean of -min(r A, clip(r, 1 - clip[0], 1 + clip[1]) A) with r = exp(new - old), plus
/// beta * mean of the k3 KL exp(ref - new) - (ref - new) - 1 when `reference` is given.
pub fn surrogate_loss<B: Backend>(
    new: Tensor<B, 1>,
    old: Tensor<B, 1>,
    advantage: Tensor<B, 1>,
    reference: Option<Tensor<B, 1>>,
    clip: [f64; 2],
    beta: f64,
) -> Tensor<B, 1> {
    let ratio = (new.clone() - old).exp();
    let s1 = ratio.clone() * advantage.clone();
    let s2 = ratio.clamp(1.0 - clip[0], 1.0 + clip[1]) * advantage;
    let loss = s1.min_pair(s2).neg().mean();
    match reference {
        Some(r) => {
            let d = r - new;
            loss + (d.clone().exp() - d - 1.0).mean() * beta
        }
        None => loss,
    }
}

/// The clipped surrogate + k3 KL of one minibatch, with its statistics.
fn surrogate<B: Backend>(
    policy: &Policy<B>,
    mb: &Minibatch<B>,
    cfg: &GrpoConfig,
) -> Result<(Tensor<B, 1>, SurrogateStats), LearnError> {
    let new = policy.pair_logprobs(&mb.obs, mb.x.clone(), mb.next.clone(), &mb.steps);
    let ratio = (new.clone() - mb.old.clone()).exp();
    let loss = surrogate_loss(
        new.clone(),
        mb.old.clone(),
        mb.advantage.clone(),
        (cfg.beta > 0.0).then(|| mb.reference.clone()),
        [cfg.clip_low, cfg.clip_high],
        cfg.beta,
    );
    let ref_kl = if cfg.beta > 0.0 {
        let d = mb.reference.clone() - new.clone();
        (d.clone().exp() - d - 1.0)
            .mean()
            .into_scalar()
            .elem::<f64>()
    } else {
        0.0
    };
    let r = to_vec(ratio)?;
    let lp = to_vec(new)?;
    let n = r.len();
    let mut s = SurrogateStats {
        n,
        loss: loss.clone().into_scalar().elem::<f64>(),
        ref_kl,
        ratio: [f64::INFINITY, f64::NEG_INFINITY],
        logp: [f64::INFINITY, f64::NEG_INFINITY],
        ..Default::default()
    };
    for (&ri, &li) in r.iter().zip(&lp) {
        let (ri, li) = (f64::from(ri), f64::from(li));
        s.clip_frac += f64::from(u8::from(
            ri < 1.0 - cfg.clip_low || ri > 1.0 + cfg.clip_high,
        ));
        s.approx_kl += (ri - 1.0) - ri.ln();
        s.ratio = [s.ratio[0].min(ri), s.ratio[1].max(ri)];
        s.logp = [s.logp[0].min(li), s.logp[1].max(li)];
    }
    s.clip_frac /= n.max(1) as f64;
    s.approx_kl /= n.max(1) as f64;
    Ok((loss, s))
}

/// Accumulated update statistics of an iteration.
#[derive(Debug, Default)]
struct UpdateAcc {
    n: usize,
    updates: usize,
    skipped: usize,
    loss: f64,
    clipped: f64,
    approx_kl: f64,
    ref_kl: f64,
    grad_norm: f64,
    value_loss: f64,
    ratio_min: f64,
    ratio_max: f64,
    logp_min: f64,
    logp_max: f64,
}

impl UpdateAcc {
    fn add(&mut self, m: &SurrogateStats, grad_norm: f64) {
        if self.updates == 0 {
            self.ratio_min = f64::INFINITY;
            self.ratio_max = f64::NEG_INFINITY;
            self.logp_min = f64::INFINITY;
            self.logp_max = f64::NEG_INFINITY;
        }
        let w = m.n as f64;
        self.n += m.n;
        self.updates += 1;
        self.loss += m.loss * w;
        self.clipped += m.clip_frac * w;
        self.approx_kl += m.approx_kl * w;
        self.ref_kl += m.ref_kl * w;
        self.grad_norm += grad_norm;
        self.ratio_min = self.ratio_min.min(m.ratio[0]);
        self.ratio_max = self.ratio_max.max(m.ratio[1]);
        self.logp_min = self.logp_min.min(m.logp[0]);
        self.logp_max = self.logp_max.max(m.logp[1]);
    }

    fn mean(&self, v: f64) -> f64 {
        v / self.n.max(1) as f64
    }
}

/// One epoch of critic regression on the GAE returns of the iteration.
#[allow(clippy::too_many_arguments)]
fn critic_epoch<B: AutodiffBackend, O: Optimizer<Critic<B>, B>>(
    mut critic: Critic<B>,
    optim: &mut O,
    kept: &[GroupRollout],
    returns: &[Vec<f64>],
    policy: &Policy<B>,
    cfg: &GrpoConfig,
    device: &B::Device,
    seed: u64,
) -> Result<(Critic<B>, f64), LearnError> {
    let rows: Vec<(usize, usize, f32)> = returns
        .iter()
        .enumerate()
        .flat_map(|(ri, r)| r.iter().enumerate().map(move |(di, &v)| (ri, di, v as f32)))
        .collect();
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.shuffle(&mut rng(seed));
    let mb = (cfg.minibatch / policy.process().map_or(1, |p| p.ft_steps())).max(1);
    let mut total = 0.0;
    let mut count = 0usize;
    for idx in order.chunks(mb) {
        let state: Vec<f32> = idx
            .iter()
            .flat_map(|&i| kept[rows[i].0].decisions[rows[i].1].state.clone())
            .collect();
        let obs = policy.obs_tensors(
            &ObsBatch {
                batch: idx.len(),
                state,
                image: None,
            },
            device,
        )?;
        let target = Tensor::<B, 1>::from_data(
            TensorData::new(
                idx.iter().map(|&i| rows[i].2).collect::<Vec<_>>(),
                [idx.len()],
            ),
            device,
        );
        let loss = (critic.forward(&obs) - target).square().mean();
        let v = loss.clone().into_scalar().elem::<f64>();
        if !v.is_finite() {
            continue;
        }
        let grads = GradientsParams::from_grads(loss.backward(), &critic);
        critic = optim.step(cfg.ppo.critic_lr, critic, grads);
        total += v * idx.len() as f64;
        count += idx.len();
    }
    Ok((critic, total / count.max(1) as f64))
}

#[allow(clippy::too_many_arguments)]
fn save_state<B: AutodiffBackend, O: Optimizer<PolicyModel<B>, B>, OC: Optimizer<Critic<B>, B>>(
    policy: &Policy<B>,
    optim: &O,
    critic: Option<&Critic<B>>,
    critic_optim: &OC,
    prm: Option<[Vec<u8>; 2]>,
    st: &TrainState,
    out: &Path,
    eval: Option<serde_json::Value>,
) -> Result<(), LearnError> {
    let state = serde_json::to_vec_pretty(st).expect("train state serialises");
    let mut files: Vec<(&str, Vec<u8>)> = vec![
        (
            "online.mpk",
            state::bytes::<B, _>(policy.model.clone().into_record(), "online.mpk")?,
        ),
        (
            "optim.mpk",
            state::bytes::<B, _>(optim.to_record(), "optim.mpk")?,
        ),
    ];
    if let Some(c) = critic {
        files.push((
            "critic.mpk",
            state::bytes::<B, _>(c.clone().into_record(), "critic.mpk")?,
        ));
        files.push((
            "critic_optim.mpk",
            state::bytes::<B, _>(critic_optim.to_record(), "critic_optim.mpk")?,
        ));
    }
    if let Some([model, optim]) = prm {
        files.push((PRM_FILES[0], model));
        files.push((PRM_FILES[1], optim));
    }
    files.push(("state.json", state));
    let info = serde_json::json!({
        "iteration": st.iteration,
        "seed": st.seed,
        "algorithm": st.algorithm,
        "env_steps": st.env_steps,
        "eval": eval,
    });
    checkpoint::save(&policy.valid(), &out.join(POLICY_DIR), info)?;
    let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (*n, b.as_slice())).collect();
    write_dir_atomic(&out.join(STATE_DIR), &refs)?;
    Ok(())
}

fn to_vec<B: Backend>(t: Tensor<B, 1>) -> Result<Vec<f32>, LearnError> {
    t.into_data()
        .convert::<f32>()
        .into_vec()
        .map_err(|e| LearnError::Data(format!("reading a tensor back: {e:?}")))
}
