//! Group rollouts for GRPO (docs/algorithms.md §3): G rollouts start from one initial state (the
//! first environment of the group is reset with a seed, the others restore its snapshot), the
//! policy is called in batch for every environment that needs a new action chunk, and each call
//! keeps the observation history, the chain x_K..x_0 and its log-probs.

use std::time::Instant;

use burn::tensor::backend::Backend;
use diffrl_core::env::Env;
use diffrl_core::episode::Episode;
use diffrl_core::record::{PolicyCall, Recorder};
use diffrl_core::seeding::{Rng, derive};
use diffrl_core::space::Observation;
use diffrl_core::vec_env::{VecEnv, VecStep};
use diffrl_policy::{ObsBatch, Policy, PolicyModel, SampleMode};

use crate::LearnError;
use crate::eval::Actor;
use crate::runner;

/// One policy call of a rollout: what it saw and the chain it sampled.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// [To, Ds] raw state history the call saw.
    pub state: Vec<f32>,
    /// [To, H, W, C] images, for pixel policies.
    pub image: Option<Vec<u8>>,
    /// The instruction the call read, for language-conditioned tasks.
    pub text: Option<String>,
    /// x_K..x_0 of the chain: [K + 1, Tp, Da], normalised.
    pub chain: Vec<f32>,
    /// log pi(x_{i+1} | x_i, s) of every chain step under the behaviour policy: [K].
    pub logp: Vec<f32>,
    /// Environment step at which the chunk started executing.
    pub env_step: usize,
    /// Actions of the chunk that were executed (Ta, fewer when the episode ended).
    pub executed: usize,
}

/// One rollout of a group.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupRollout {
    /// Index of its group in the batch.
    pub group: usize,
    /// The environment-level trajectory.
    pub episode: Episode,
    /// The policy calls, in order.
    pub decisions: Vec<Decision>,
}

impl GroupRollout {
    /// Sums per-environment-step values over the steps each decision's chunk executed.
    pub fn per_decision(&self, per_step: &[f64]) -> Vec<f64> {
        self.decisions
            .iter()
            .map(|d| per_step[d.env_step..d.env_step + d.executed].iter().sum())
            .collect()
    }

    /// The state each decision was taken in (the newest frame of its history).
    pub fn anchors(&self, state_dim: usize) -> Vec<Vec<f32>> {
        self.decisions
            .iter()
            .map(|d| d.state[d.state.len() - state_dim..].to_vec())
            .collect()
    }
}

/// Where collection time went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CollectStats {
    /// Seconds stepping environments.
    pub env_s: f64,
    /// Seconds in policy calls.
    pub policy_s: f64,
    /// Environment steps taken by live rollouts.
    pub env_steps: usize,
    /// Policy decisions (chains sampled) for live rollouts.
    pub decisions: usize,
    /// `env_step` of rollout 0's first state when it was recorded (its step s is at
    /// `first + 1 + s`).
    pub recorded_env_step: Option<i64>,
}

/// Row `row` of a recorded chain sample in environment units: x_K..x_0 `[K + 1, Tp, Da]` and
/// the log-probs `[K]`.
pub(crate) fn chain_row<B: Backend>(
    policy: &Policy<B>,
    sample: &diffrl_policy::diffusion::ChainSample<B>,
    row: usize,
) -> Result<(Vec<f32>, Vec<f32>), LearnError> {
    let (Some(chain), Some(logp)) = (&sample.chain, &sample.logp) else {
        return Ok((Vec::new(), Vec::new()));
    };
    let chain = to_vec(chain.clone())?;
    let logp = to_vec(logp.clone())?;
    let b = sample.actions.dims()[0].max(1);
    let (per_chain, per_logp) = (chain.len() / b, logp.len() / b);
    Ok((
        denormalized_chain(policy, &chain[row * per_chain..(row + 1) * per_chain]),
        logp[row * per_logp..(row + 1) * per_logp].to_vec(),
    ))
}

/// Logs what the learner computed for a recorded rollout at `env_step` `first + 1 + s` for
/// step s (the runner logged its scenes and environment rewards there while it played): the
/// reward module's per-step rewards (shaped) when it gives them, and the advantage of the
/// decision whose chunk executed the step.
pub(crate) fn record_rollout_series(
    rec: &dyn Recorder,
    first: i64,
    rollout: &GroupRollout,
    rewards: &diffrl_core::reward::EpisodeRewards,
    advantages: &[f64],
) {
    use diffrl_core::record::StepSeries;
    let t0 = first + 1;
    if let Some(shaped) = &rewards.per_step {
        rec.step_series(StepSeries::Shaped, t0, shaped);
    }
    let per_step: Vec<f64> = rollout
        .decisions
        .iter()
        .zip(advantages)
        .flat_map(|(d, &a)| std::iter::repeat_n(a, d.executed))
        .collect();
    rec.step_series(StepSeries::Advantage, t0, &per_step);
}

/// A normalised chain (rows of Da) in environment units.
fn denormalized_chain<B: Backend>(policy: &Policy<B>, chain: &[f32]) -> Vec<f32> {
    let mut out = chain.to_vec();
    for a in out.chunks_mut(policy.spec.action_dim.max(1)) {
        policy.norm.action.denormalize(a);
    }
    out
}

/// Fresh initial states for `groups` groups of `group_size` rollouts drawn from `seed`: group
/// g's seed stream is the one [`VecEnv::reset`]`(seed)` gives environment `g * group_size`.
pub fn fresh_starts(seed: u64, groups: usize, group_size: usize) -> Vec<u64> {
    (0..groups)
        .map(|g| derive(seed, (g * group_size) as u64))
        .collect()
}

/// Plays `groups` groups of `group_size` rollouts on `venv` (which must hold exactly
/// `groups * group_size` environments and reset in the same step). The first environment of
/// group g starts the first episode of the seed stream `starts[g]` ([`fresh_starts`], or
/// members of a fixed pool); the group's other environments restore its state.
/// Rollouts are stochastic (the rollout chain, with `frozen` running the chain steps before
/// the fine-tuned ones) and record their chains. With `rec` on, rollout 0 is recorded: its
/// scene and reward at every step and its policy calls (chunks, chains, log-probs); the
/// rollouts are the same. Each policy call cuts its batch over as many threads as `venv` has
/// workers ([`Policy::act_threads`]: the same actions for any count).
#[allow(clippy::too_many_arguments)]
pub fn collect_groups<E: Env, B: Backend>(
    venv: &mut VecEnv<E>,
    policy: &Policy<B>,
    frozen: Option<&PolicyModel<B>>,
    groups: usize,
    group_size: usize,
    starts: &[u64],
    rng: &mut Rng,
    device: &B::Device,
    rec: &dyn Recorder,
) -> Result<(Vec<GroupRollout>, CollectStats), LearnError> {
    let n = groups * group_size;
    if venv.len() != n {
        return Err(LearnError::Data(format!(
            "group rollouts need {groups} x {group_size} = {n} environments, the vector has {}",
            venv.len()
        )));
    }
    if starts.len() != groups {
        return Err(LearnError::Data(format!(
            "group rollouts need one initial state per group ({groups}), got {}",
            starts.len()
        )));
    }
    let t = Instant::now();
    let streams: Vec<u64> = (0..n)
        .map(|i| match i % group_size {
            0 => starts[i / group_size],
            j => derive(starts[i / group_size], j as u64),
        })
        .collect();
    let mut first = venv.reset_streams(&streams);
    for g in 0..groups {
        let snap = venv.snapshot(g * group_size);
        for j in 1..group_size {
            first[g * group_size + j] = venv.restore(g * group_size + j, &snap);
        }
    }
    let reset_s = t.elapsed().as_secs_f64();
    let mut collector = GroupCollector {
        policy,
        frozen,
        rng,
        device,
        threads: venv.threads(),
        rollouts: (0..n)
            .map(|i| GroupRollout {
                group: i / group_size,
                episode: Episode::default(),
                decisions: Vec::new(),
            })
            .collect(),
    };
    let played = runner::play(venv, first, vec![1; n], &mut collector, rec)?;
    let stats = CollectStats {
        env_s: reset_s + played.env_s,
        policy_s: played.policy_s,
        env_steps: played.env_steps,
        decisions: played.decisions,
        recorded_env_step: played.first_env_step,
    };
    Ok((collector.rollouts, stats))
}

/// Group collection as a [`runner::Agent`]: stochastic chains, every call kept as a
/// [`Decision`] of its rollout.
struct GroupCollector<'a, B: Backend> {
    policy: &'a Policy<B>,
    frozen: Option<&'a PolicyModel<B>>,
    rng: &'a mut Rng,
    device: &'a B::Device,
    threads: usize,
    rollouts: Vec<GroupRollout>,
}

impl<B: Backend> runner::Agent for GroupCollector<'_, B> {
    fn actor(&mut self) -> &mut dyn Actor {
        self
    }

    fn observe(&mut self, env: usize, before: &Observation, action: &[f32], step: &VecStep) {
        let r = &mut self.rollouts[env];
        r.episode.push(
            before.clone(),
            action.to_vec(),
            step.rewards[env],
            step.infos[env].score,
            step.infos[env].success,
        );
        if let Some(d) = r.decisions.last_mut() {
            d.executed += 1;
        }
        if step.terminated[env] || step.truncated[env] {
            r.episode.terminated = step.terminated[env];
            r.episode.truncated = step.truncated[env];
            r.episode.final_observation = step.final_obs[env].clone();
        }
    }
}

/// The stochastic policy, keeping every call as a [`Decision`] of its rollout.
impl<B: Backend> Actor for GroupCollector<'_, B> {
    fn obs_horizon(&self) -> usize {
        self.policy.config.obs_horizon
    }
    fn action_horizon(&self) -> usize {
        self.policy.config.action_horizon
    }
    fn action_dim(&self) -> usize {
        self.policy.spec.action_dim
    }
    fn images(&self) -> bool {
        self.policy.spec.image.is_some()
    }

    fn act(
        &mut self,
        envs: &[usize],
        obs: &ObsBatch,
        rec: &dyn Recorder,
    ) -> Result<Vec<f32>, LearnError> {
        let (policy, ta) = (self.policy, self.action_horizon());
        let [tp, da] = policy.chunk();
        let k = policy.chain_len();
        let act = policy.act_threads(
            self.frozen,
            obs,
            SampleMode::Stochastic,
            true,
            self.rng,
            self.device,
            self.threads,
        )?;
        let chain = to_vec(act.sample.chain.expect("recorded chain"))?;
        let logp = to_vec(act.sample.logp.expect("recorded log-probs"))?;
        let per_chain = (k + 1) * tp * da;
        let per_state = obs.state.len() / envs.len();
        let per_image = obs.image.as_ref().map(|v| v.len() / envs.len());
        if rec.enabled() && envs[0] == 0 {
            rec.policy_call(&PolicyCall {
                action_dim: da,
                predicted: &act.actions[..tp * da],
                executed: ta,
                chain: &denormalized_chain(policy, &chain[..per_chain]),
                logp: &logp[..k],
                saliency: None,
            });
        }
        for (j, &i) in envs.iter().enumerate() {
            let rollout = &mut self.rollouts[i];
            rollout.decisions.push(Decision {
                state: obs.state[j * per_state..(j + 1) * per_state].to_vec(),
                image: obs
                    .image
                    .as_ref()
                    .zip(per_image)
                    .map(|(v, p)| v[j * p..(j + 1) * p].to_vec()),
                text: obs.text.as_ref().map(|t| t[j].clone()),
                chain: chain[j * per_chain..(j + 1) * per_chain].to_vec(),
                logp: logp[j * k..(j + 1) * k].to_vec(),
                env_step: rollout.episode.len(),
                executed: 0,
            });
        }
        Ok(act
            .actions
            .chunks(tp * da)
            .flat_map(|c| c[..ta * da].iter().copied())
            .collect())
    }
}

/// A tensor's values as f32 (read back from its device).
pub(crate) fn to_vec<B: Backend, const D: usize>(
    t: burn::tensor::Tensor<B, D>,
) -> Result<Vec<f32>, LearnError> {
    t.into_data()
        .convert::<f32>()
        .into_vec()
        .map_err(|e| LearnError::Data(format!("reading a tensor back: {e:?}")))
}
