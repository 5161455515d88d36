//! Policy-gradient fine-tuning over diffusion chains (the two-level MDP of
//! docs/algorithms.md §2–3): every fine-tuned denoising step of every policy call is an action
//! whose likelihood ratio is recomputed under the current parameters. What a caller of the two
//! learners sees: their settings (the `[grpo]` table), the metrics of an iteration, the hooks
//! and the outcome.
//!
//! - GRPO ([`crate::grpo`]): G rollouts per initial state; group-relative advantages
//!   ([`crate::advantages`]: GRPO, Dr.GRPO, VG-GRPO, process, GiGPO; optional DAPO resampling
//!   and an implicit process reward model).
//! - PPO ([`crate::ppo`]): the DPPO-style baseline; independent rollouts, a state-only critic
//!   and GAE over action-chunk steps, the same chain likelihoods and clipped objective
//!   (`surrogate`).
//!
//! One iteration = collect rollouts -> score them -> advantages -> `epochs` passes of
//! minibatches over (environment step, fine-tuned denoising step) pairs -> metrics ->
//! checkpoint. An iteration depends only on (seed, iteration, state at its start), so a run
//! resumed from a checkpoint continues exactly.
//!
//! Output folder: `policy/` (the current policy, loadable by `diffrl eval`) and `train_state/`
//! (weights, optimiser state, critic or implicit PRM, `state.json`), both written atomically.

use burn::tensor::backend::Backend;
use diffrl_core::config::{Invalid, Validate, ensure};
use diffrl_core::record::{NoRecorder, Recorder};
use diffrl_policy::Policy;
use diffrl_reward::implicit::{DpoStats, ImplicitPrmConfig};
use serde::{Deserialize, Serialize};

use crate::LearnError;
use crate::advantages::{AdvantageConfig, Estimator};
use crate::ppo::PpoConfig;

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

impl Algorithm {
    /// The learner's name as configs and commands spell it: "grpo" or "ppo".
    pub fn name(self) -> &'static str {
        match self {
            Self::Grpo => "grpo",
            Self::Ppo => "ppo",
        }
    }
}

/// What DAPO dynamic sampling compares within a group (`[grpo] dynamic_sampling_by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DynamicSamplingBy {
    /// Keep a group whose outcomes are not all equal (DAPO's rule).
    #[default]
    Outcome,
    /// Keep a group in which some rollouts succeed and some fail: with a graded outcome (the
    /// best coverage, say) groups that all succeed, or all fail, are dropped too.
    Success,
    /// Keep a group in which some rollout fails and whose outcomes are not all equal: groups
    /// that all succeed are dropped, groups that all fail stay (their graded outcomes rank
    /// the failures).
    Failure,
}

impl DynamicSamplingBy {
    fn is_outcome(&self) -> bool {
        *self == Self::Outcome
    }
}

/// How the surrogate weighs the chain steps of one decision (`[grpo] step_weights`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepWeights {
    /// Every fine-tuned step carries the decision's advantage (times `denoise_gamma`'s
    /// discount).
    #[default]
    Uniform,
    /// Step k's advantage is also scaled by the noise target's output gain over the
    /// denoiser's (`DiffusionProcess::epsilon_gain_ratio`), normalised to mean 1 over the
    /// fine-tuned steps: a network that predicts the chunk or the velocity then spreads its
    /// policy gradient over the chain as a noise-predicting one does. 1 for every step of a
    /// noise-predicting policy and of a Gaussian one.
    Epsilon,
}

impl StepWeights {
    fn is_uniform(&self) -> bool {
        *self == Self::Uniform
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
    /// Fine-tuned denoising steps K': the last K' steps of the chain are trained, the earlier
    /// ones run the frozen pretrained copy; 0 = all K. The same meaning as
    /// `[policy.diffusion].ft_denoising_steps`, whose value it replaces for fine-tuning.
    pub ft_denoising_steps: usize,
    /// Floor on the sampling standard deviation of the rollouts' chains (normalised action
    /// units). It replaces the checkpoint's `[policy.diffusion].min_sampling_std` and means the
    /// same (0 = no floor). The exploration noise: Push-T needs a few pixels of precision, and
    /// the behaviour-cloning default of 0.1 (about 26 px) drops a 58% policy to 16% in
    /// stochastic rollouts (docs/grpo.md).
    pub min_sampling_std: f64,
    /// Floor on the standard deviation of the chains' log-likelihoods (> 0), replacing the
    /// checkpoint's `[policy.diffusion].min_logprob_std`. Set it with `min_sampling_std` so
    /// likelihoods are the sampler's.
    pub min_logprob_std: f64,
    /// Passes over the batch per iteration.
    pub epochs: usize,
    /// (environment step, denoising step) pairs per minibatch.
    pub minibatch: usize,
    /// Threads sharing each minibatch's gradient (data-parallel shards averaged in a fixed
    /// order, as `[pretrain].threads`): the same seed and thread count give the same bits, and
    /// another count the same update up to rounding. 1 on a GPU.
    pub threads: usize,
    /// Actor learning rate (AdamW) at the first iteration.
    pub lr: f64,
    /// The actor's learning rate falls from `lr` to `lr * min_lr_ratio` on a cosine over the
    /// iterations (the schedule of `[pretrain]`, without warmup); 1 = constant. The schedule
    /// spans `iterations`, so extending a finished run with `--resume --iterations N` follows
    /// the longer schedule from the iteration it resumes at.
    pub min_lr_ratio: f64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f64,
    /// Decay per optimiser step of an exponential moving average of the fine-tuned weights
    /// (0 = off, the default). When on, the EMA (starting from the pretrained weights) is the
    /// policy that evaluations, `policy/` and the run's result use; the rollouts and the
    /// update keep the online weights, which go to `policy-online/`.
    #[serde(skip_serializing_if = "is_zero")]
    pub ema_decay: f64,
    /// Random-shift augmentation of the update's camera frames (DPPO's for pixel fine-tuning;
    /// `[pretrain] random_shift` is the same shift in behaviour cloning): before the update,
    /// every policy call's frames are shifted by up to this many pixels (edges repeated, one
    /// draw per call, seeded by the iteration), and the old log-likelihoods of the ratio are
    /// recomputed on the shifted frames under the weights that collected the batch. A
    /// correction learnt from one start must then also hold for slightly moved images. 0 = off
    /// (the default; the rollouts' own likelihoods); policies without pixels ignore it.
    #[serde(skip_serializing_if = "is_zero_usize")]
    pub random_shift: usize,
    /// Keep the observation encoder (state, image and instruction features) at its pretrained
    /// weights and fine-tune only the denoiser (false, the default: both). Pixel policies'
    /// encoders then keep the features behaviour cloning learnt, whatever the few rollouts'
    /// gradients would do to them, and the update skips their backward pass.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub freeze_encoder: bool,
    /// Keep the denoiser's FiLM layers (the products by which the condition modulates each
    /// block) at their pretrained weights (false, the default: fine-tune them). The condition
    /// then selects the denoiser's features as behaviour cloning taught it, and fine-tuning
    /// moves only the path those features take. Policies without FiLM layers refuse it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub freeze_film: bool,
    /// Initial states from a fixed pool: 0 = fresh ones every iteration (the default); N > 0 =
    /// the groups start from N states drawn once from the run's seed, taken in order and
    /// wrapping, so N = `groups` trains on the same starts at every iteration. PPO's
    /// independent rollouts take one member each.
    #[serde(skip_serializing_if = "is_zero_usize")]
    pub start_pool: usize,
    /// Lower ratio clip epsilon.
    pub clip_low: f64,
    /// Upper ratio clip epsilon.
    pub clip_high: f64,
    /// Weight of the k3 KL to the frozen pretrained policy.
    pub beta: f64,
    /// Denoising discount: fine-tuned step i of K' has its advantage scaled by
    /// gamma^(K' - i - 1).
    pub denoise_gamma: f64,
    /// How the chain steps of a decision share its advantage (docs/algorithms.md §3).
    #[serde(skip_serializing_if = "StepWeights::is_uniform")]
    pub step_weights: StepWeights,
    /// Global gradient-norm clip (0 = off).
    pub grad_clip: f64,
    /// Stop the epochs of an iteration once the approximate KL exceeds this (0 = off).
    pub target_kl: f64,
    /// Advantage estimator.
    pub advantage: AdvantageConfig,
    /// DAPO dynamic sampling: drop groups whose rewards are all equal and collect more.
    pub dynamic_sampling: bool,
    /// What dynamic sampling compares within a group: outcomes (DAPO, the default) or
    /// successes.
    #[serde(skip_serializing_if = "DynamicSamplingBy::is_outcome")]
    pub dynamic_sampling_by: DynamicSamplingBy,
    /// Extra collection rounds dynamic sampling may use per iteration.
    pub max_resample_rounds: usize,
    /// Non-finite losses skipped before the run stops with an error.
    pub max_nan_updates: usize,
    /// Iterations between checkpoints.
    pub checkpoint_every: usize,
    /// Iterations between evaluations (0 = only at the end, by the caller).
    pub eval_every: usize,
    /// Episodes of each of those evaluations (0 = none).
    pub eval_episodes: usize,
    /// PPO settings.
    pub ppo: PpoConfig,
    /// OPRL implicit process reward model (`[grpo.implicit_prm]`): a policy copy trained with
    /// trajectory DPO on each batch; its log-ratio to the behaviour policy becomes the step
    /// rewards (replacing the reward module's), read by the `process`, `grpo-process` and
    /// `gigpo` estimators. Absent = off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub implicit_prm: Option<ImplicitPrmConfig>,
}

impl GrpoConfig {
    /// Collection rounds an iteration may take: 1, or with DAPO dynamic sampling 1 +
    /// `max_resample_rounds`.
    pub fn collection_rounds(&self) -> usize {
        if self.dynamic_sampling {
            1 + self.max_resample_rounds
        } else {
            1
        }
    }
}

impl Default for GrpoConfig {
    fn default() -> Self {
        Self {
            iterations: 30,
            groups: 8,
            group_size: 8,
            ft_denoising_steps: 0,
            min_sampling_std: 0.03,
            min_logprob_std: 0.03,
            epochs: 4,
            minibatch: 2048,
            threads: 2,
            lr: 3e-5,
            min_lr_ratio: 1.0,
            weight_decay: 0.0,
            ema_decay: 0.0,
            random_shift: 0,
            freeze_encoder: false,
            freeze_film: false,
            start_pool: 0,
            clip_low: 0.01,
            clip_high: 0.01,
            beta: 0.0,
            denoise_gamma: 1.0,
            step_weights: StepWeights::Uniform,
            grad_clip: 1.0,
            target_kl: 0.0,
            advantage: AdvantageConfig::default(),
            dynamic_sampling: false,
            dynamic_sampling_by: DynamicSamplingBy::Outcome,
            max_resample_rounds: 2,
            max_nan_updates: 3,
            checkpoint_every: 1,
            eval_every: 5,
            eval_episodes: 100,
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
        ensure(
            self.min_sampling_std.is_finite() && self.min_sampling_std >= 0.0,
            "min_sampling_std",
            "must be >= 0 (0 = no floor)",
        )?;
        ensure(
            self.min_logprob_std.is_finite() && self.min_logprob_std > 0.0,
            "min_logprob_std",
            "must be > 0",
        )?;
        ensure(self.minibatch >= 1, "minibatch", "must be >= 1")?;
        ensure(
            (1..=256).contains(&self.threads),
            "threads",
            "must be in 1..=256",
        )?;
        ensure(self.lr > 0.0 && self.lr.is_finite(), "lr", "must be > 0")?;
        ensure(
            (0.0..=1.0).contains(&self.min_lr_ratio),
            "min_lr_ratio",
            "must be in [0, 1] (1 = constant)",
        )?;
        ensure(self.weight_decay >= 0.0, "weight_decay", "must be >= 0")?;
        ensure(
            (0.0..1.0).contains(&self.ema_decay),
            "ema_decay",
            "must be in [0, 1) (0 = off)",
        )?;
        ensure(
            self.random_shift <= 16,
            "random_shift",
            format!("must be at most 16 pixels, got {}", self.random_shift),
        )?;
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
            self.dynamic_sampling || self.dynamic_sampling_by.is_outcome(),
            "dynamic_sampling_by",
            "chooses dynamic sampling's rule, which is off: set dynamic_sampling = true to \
             use it, or dynamic_sampling_by = \"outcome\" (the default) to leave it off",
        )?;
        self.ppo.validate().map_err(|e| e.within("ppo"))?;
        self.advantage
            .validate()
            .map_err(|e| e.within("advantage"))?;
        if let Some(prm) = &self.implicit_prm {
            prm.validate().map_err(|e| e.within("implicit_prm"))?;
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

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn is_zero_usize(x: &usize) -> bool {
    *x == 0
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
    /// The exploration at the groups' shared starts: the standard deviation across a group's
    /// rollouts of their first policy call's clean chunk (normalised action units), averaged
    /// over the chunk and the groups (none for groups of one rollout, PPO's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_spread: Option<f64>,
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
    /// grpo-lambda's value fit: the (mean) slope of the value in progress, and the fraction of
    /// the returns' variance about their group's start value that it explains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_fit: Option<[f64; 2]>,
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
