//! GRPO over diffusion chains (docs/algorithms.md §3): G stochastic rollouts from each of B
//! initial states, group-relative advantages from their outcomes ([`crate::advantages`]), then
//! the clipped surrogate over (decision, fine-tuned denoising step) pairs
//! (`surrogate`). Optional: DAPO dynamic sampling (groups whose outcomes are all equal
//! are dropped and more are collected) and OPRL's implicit process reward model (step rewards
//! from a policy copy trained with trajectory DPO on each batch). The settings, metrics and
//! hooks shared with PPO are in [`crate::finetune`].

use std::path::Path;
use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;
use diffrl_core::env::Env;
use diffrl_core::record::{NoRecorder, Recorder, Timeline};
use diffrl_core::reward::{EpisodeRewards, RewardModule};
use diffrl_core::seeding::derive;
use diffrl_core::vec_env::VecEnv;
use diffrl_policy::Policy;
use diffrl_reward::implicit::{ChainCall, DpoStats, ImplicitPrm};

use crate::LearnError;
use crate::advantages::{
    AdvantageConfig, Estimator, GroupRewards, LambdaRollout, anchor_cells, dapo_keep,
    group_advantages, grpo_lambda, mixed_success, some_failure,
};
use crate::batch::{Batch, Round, collect_round};
pub use crate::finetune::{
    Algorithm, DynamicSamplingBy, GrpoConfig, GrpoHooks, GrpoLog, GrpoOutcome, NoHooks, StepWeights,
};
pub use crate::ppo::{Critic, CriticInput, PpoConfig};
use crate::rollout::GroupRollout;
use crate::session::Session;
use crate::state::STATE_DIR;
pub use crate::surrogate::{SurrogateStats, surrogate_loss};
use crate::surrogate::{UpdateAcc, exceeds_target_kl, policy_epoch, update_batch};

/// Fine-tunes `policy` (initialised from `reference`, the frozen pretrained policy) on `venv`
/// with rewards from `reward`: GRPO, or PPO with [`Algorithm::Ppo`] ([`crate::ppo::train`]).
/// `venv` must hold `groups * group_size` environments that reset in the same step.
/// Checkpoints go to `out`; with `resume`, continues from `out/train_state`.
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
    if algorithm == Algorithm::Ppo {
        return crate::ppo::train(
            policy, reference, venv, reward, cfg, seed, out, resume, hooks,
        );
    }
    let mut run = Session::new(policy, reference, cfg, Algorithm::Grpo, seed, out)?;
    let mut prm = implicit_prm(&run)?;
    if let Some(dir) = run.resume(resume)?
        && let Some(p) = prm.as_mut()
    {
        load_implicit_prm(p, &dir)?;
    }
    let state_dim = run.policy.spec.state_dim;
    let cells = gigpo_anchor_cells(venv, &cfg.advantage, state_dim)?;
    while run.iteration < cfg.iterations {
        let it_seed = derive(seed, run.iteration as u64);
        // 1. Collect B groups of G rollouts, scored by the reward module.
        let rec = hooks.recorder();
        rec.set_time(Timeline::TrainStep, run.iteration as i64 + 1);
        let mut batch = collect_with_dynamic_sampling(&mut run, venv, reward, rec, it_seed)?;
        rec.group_stats(&batch.outcomes, cfg.group_size);
        // 2. The implicit PRM learns from this batch, then gives its step rewards.
        let t_prm = Instant::now();
        let prm_stats = prm
            .as_mut()
            .map(|p| implicit_step_rewards(p, &batch.kept, &mut batch.rewards, cfg.group_size))
            .transpose()?;
        let prm_s = t_prm.elapsed().as_secs_f64();
        // 3. Group-relative advantages per (rollout, decision).
        let BatchAdvantages {
            advantages,
            zero_var,
            value_fit,
        } = grpo_advantages(
            &batch.kept,
            &batch.rewards,
            cfg.group_size,
            state_dim,
            cells.as_deref(),
            &cfg.advantage,
        )?;
        batch.record_series(hooks.recorder(), &advantages);
        // 4. Update: `epochs` passes of clipped-surrogate minibatches over the chain pairs.
        let update = update_policy(&mut run, &batch.kept, &advantages, it_seed)?;
        // 5. Log, evaluate, checkpoint.
        run.iteration += 1;
        let frac_zero_var = zero_var as f64 / cfg.groups.max(1) as f64;
        let mut line = run.log_line(&batch, &update, frac_zero_var, prm_stats, prm_s);
        line.value_fit = value_fit;
        if run.end_iteration(line, hooks, || implicit_prm_files(prm.as_ref()))? {
            break;
        }
    }
    Ok(run.outcome())
}

/// Files of the implicit PRM in `train_state/`: pi_phi's weights and its optimiser.
const PRM_FILES: [&str; 2] = ["prm.mpk", "prm_optim.mpk"];

/// The implicit PRM when `[grpo.implicit_prm]` is set: pi_phi starts as a copy of the policy
/// being fine-tuned.
fn implicit_prm<B: AutodiffBackend>(
    run: &Session<'_, B>,
) -> Result<Option<ImplicitPrm<B>>, LearnError> {
    let Some(c) = &run.cfg.implicit_prm else {
        return Ok(None);
    };
    ImplicitPrm::<B>::new(&run.policy.valid(), c.clone())
        .map(Some)
        .map_err(|e| LearnError::Data(format!("grpo.implicit_prm: {e}")))
}

/// Restores pi_phi and its optimiser from the `train_state/` folder `dir`.
fn load_implicit_prm<B: AutodiffBackend>(
    prm: &mut ImplicitPrm<B>,
    dir: &Path,
) -> Result<(), LearnError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|source| LearnError::Io { path, source })
    };
    prm.load_state(read(PRM_FILES[0])?, read(PRM_FILES[1])?)
        .map_err(|e| LearnError::Resume(format!("{STATE_DIR}: {e}")))
}

/// The implicit PRM's files for a checkpoint (none without one).
fn implicit_prm_files<B: AutodiffBackend>(
    prm: Option<&ImplicitPrm<B>>,
) -> Result<Vec<(&'static str, Vec<u8>)>, LearnError> {
    let Some(p) = prm else {
        return Ok(Vec::new());
    };
    let [model, optim] = p
        .state_bytes()
        .map_err(|e| LearnError::Data(e.to_string()))?;
    Ok(vec![(PRM_FILES[0], model), (PRM_FILES[1], optim)])
}

/// GiGPO's anchor grid, one cell size per state dimension ([`anchor_cells`]: `gigpo_grid` when
/// set, else the environment's); None for the other estimators. Checked before anything is
/// collected.
fn gigpo_anchor_cells<E: Env>(
    venv: &VecEnv<E>,
    cfg: &AdvantageConfig,
    state_dim: usize,
) -> Result<Option<Vec<f64>>, LearnError> {
    if cfg.estimator != Estimator::Gigpo {
        return Ok(None);
    }
    let env_cells = venv.envs().next().and_then(Env::anchor_cells);
    anchor_cells(cfg, env_cells.as_deref(), state_dim)
        .map(Some)
        .map_err(|e| LearnError::Data(format!("grpo.advantage: {e}")))
}

/// Collects `groups` groups of `group_size` rollouts. With DAPO dynamic sampling (Yu et al.
/// 2025; docs/algorithms.md §3) a group is kept only when its outcomes are not all equal (with
/// `dynamic_sampling_by = "success"`: when it holds both successes and failures; `"failure"`:
/// when some rollout fails and the outcomes differ), and up
/// to `max_resample_rounds` more rounds are collected until `groups` are kept; the last round
/// keeps whatever fills the batch. Only round 0 is recorded.
fn collect_with_dynamic_sampling<E: Env, B: AutodiffBackend>(
    run: &mut Session<'_, B>,
    venv: &mut VecEnv<E>,
    reward: &dyn RewardModule,
    rec: &dyn Recorder,
    it_seed: u64,
) -> Result<Batch, LearnError> {
    let cfg = run.cfg;
    let t = Instant::now();
    let rounds = cfg.collection_rounds();
    let mut batch = Batch::default();
    for round in 0..rounds {
        let rec = if round == 0 { rec } else { &NoRecorder };
        let Round {
            rollouts,
            rewards,
            stats,
        } = collect_round(
            run,
            venv,
            reward,
            it_seed,
            round,
            cfg.groups,
            cfg.group_size,
            rec,
        )?;
        batch.add_round(&stats);
        for (g, (members, rewards)) in rollouts.chunks(cfg.group_size).zip(rewards).enumerate() {
            let outcomes = || rewards.iter().map(|r| r.outcome).collect::<Vec<f64>>();
            let successes = || {
                members
                    .iter()
                    .map(|m| m.episode.success())
                    .collect::<Vec<_>>()
            };
            let informative = match cfg.dynamic_sampling_by {
                DynamicSamplingBy::Outcome => dapo_keep(&outcomes()),
                DynamicSamplingBy::Success => mixed_success(&successes()),
                DynamicSamplingBy::Failure => some_failure(&successes()) && dapo_keep(&outcomes()),
            };
            let keep = batch.groups < cfg.groups
                && (!cfg.dynamic_sampling || informative || round + 1 == rounds);
            let recorded = stats.recorded_env_step.filter(|_| g == 0);
            batch.add_group(members, rewards, keep, recorded);
        }
        if batch.groups >= cfg.groups {
            break;
        }
    }
    batch.collect_s = t.elapsed().as_secs_f64();
    run.env_steps += batch.stats.env_steps;
    run.episodes += batch.outcomes.len();
    Ok(batch)
}

/// `epochs` passes of [`policy_epoch`] over the batch's chain pairs, stopping early once an
/// epoch's approximate KL exceeds `target_kl`.
fn update_policy<B: AutodiffBackend>(
    run: &mut Session<'_, B>,
    kept: &[GroupRollout],
    advantages: &[Vec<f64>],
    it_seed: u64,
) -> Result<UpdateAcc, LearnError> {
    let t = Instant::now();
    let (kept, pairs) = update_batch(run, kept, advantages, derive(it_seed, 30_000))?;
    let mut acc = UpdateAcc::default();
    let mut order: Vec<usize> = (0..pairs.len()).collect();
    for epoch in 0..run.cfg.epochs {
        let shuffle = derive(it_seed, 10_000 + epoch as u64);
        let kl = policy_epoch(run, &kept, &pairs, &mut order, shuffle, &mut acc)?;
        acc.epochs += 1;
        if exceeds_target_kl(run.cfg, kl) {
            break;
        }
    }
    acc.seconds = t.elapsed().as_secs_f64();
    Ok(acc)
}

/// Trains the implicit PRM on a batch (groups of `group_size` consecutive rollouts, ranked by
/// their outcomes) and replaces every rollout's step rewards by its rewards: a policy call's
/// reward goes to the environment step its chunk started at (zeros elsewhere), so summing
/// over executed steps gives it back per decision.
fn implicit_step_rewards<B: AutodiffBackend>(
    prm: &mut ImplicitPrm<B>,
    kept: &[GroupRollout],
    rewards: &mut [EpisodeRewards],
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
                    text: d.text.as_deref(),
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

/// A batch's advantages and what their estimator reports.
struct BatchAdvantages {
    /// A_{i,j} per rollout, per decision.
    advantages: Vec<Vec<f64>>,
    /// Groups whose outcomes were all equal.
    zero_var: usize,
    /// grpo-lambda's value fit (slope, explained variance).
    value_fit: Option<[f64; 2]>,
}

/// Group-relative advantages per (rollout, decision) ([`group_advantages`] with the configured
/// estimator, group by group; `grpo-lambda` over the batch), only their positive parts with
/// `positive_only`.
fn grpo_advantages(
    kept: &[GroupRollout],
    rewards: &[EpisodeRewards],
    group_size: usize,
    state_dim: usize,
    anchor_cells: Option<&[f64]>,
    cfg: &AdvantageConfig,
) -> Result<BatchAdvantages, LearnError> {
    let mut batch = if cfg.estimator == Estimator::GrpoLambda {
        grpo_lambda_advantages(kept, rewards, group_size, cfg)?
    } else {
        group_relative_advantages(kept, rewards, group_size, state_dim, anchor_cells, cfg)?
    };
    if cfg.positive_only {
        for a in batch.advantages.iter_mut().flatten() {
            *a = a.max(0.0);
        }
    }
    Ok(batch)
}

/// [`group_advantages`] group by group.
fn group_relative_advantages(
    kept: &[GroupRollout],
    rewards: &[EpisodeRewards],
    group_size: usize,
    state_dim: usize,
    anchor_cells: Option<&[f64]>,
    cfg: &AdvantageConfig,
) -> Result<BatchAdvantages, LearnError> {
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
                anchor_cells,
            },
            &lengths,
        )
        .map_err(|e| LearnError::Data(format!("advantages of group {g}: {e}")))?;
        zero += usize::from(adv.zero_variance);
        out.extend(adv.per_step);
    }
    Ok(BatchAdvantages {
        advantages: out,
        zero_var: zero,
        value_fit: None,
    })
}

/// [`grpo_lambda`] over the batch, with Phi of each decision's state from the reward module's
/// potentials (`[reward].shaping`).
fn grpo_lambda_advantages(
    kept: &[GroupRollout],
    rewards: &[EpisodeRewards],
    group_size: usize,
    cfg: &AdvantageConfig,
) -> Result<BatchAdvantages, LearnError> {
    let potentials = kept
        .iter()
        .zip(rewards)
        .enumerate()
        .map(|(i, (r, rw))| {
            let phi = rw.potential.as_deref().ok_or_else(|| {
                LearnError::Data(
                    "the grpo-lambda estimator needs a progress model's potentials: set \
                     [reward].shaping (a model from `diffrl reward train`)"
                        .into(),
                )
            })?;
            r.decisions
                .iter()
                .map(|d| {
                    phi.get(d.env_step).copied().ok_or_else(|| {
                        LearnError::Data(format!(
                            "rollout {i}: the reward module gave {} potentials for {} steps",
                            phi.len(),
                            r.episode.len()
                        ))
                    })
                })
                .collect::<Result<Vec<f64>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let rollouts: Vec<LambdaRollout<'_>> = rewards
        .iter()
        .zip(&potentials)
        .enumerate()
        .map(|(i, (rw, p))| LambdaRollout {
            group: i / group_size,
            outcome: rw.outcome,
            potential: p,
        })
        .collect();
    let adv = grpo_lambda(&rollouts, cfg.gamma, cfg.lambda, cfg.value)
        .map_err(|e| LearnError::Data(format!("grpo-lambda advantages: {e}")))?;
    Ok(BatchAdvantages {
        advantages: adv.per_decision,
        zero_var: adv.zero_variance_groups,
        value_fit: Some([adv.slope, adv.explained]),
    })
}
