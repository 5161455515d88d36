//! Seeded evaluation of a policy on a vector of environments with receding-horizon execution:
//! the policy predicts Tp actions, the first Ta are executed, then it is called again. Every
//! environment that needs a new chunk is served by one batched policy call.
//!
//! Episode seeds: environment i plays its k-th episode with `derive(derive(seed, i), k)` (see
//! `VecEnv`), and the N episodes are split evenly over the environments, so a result depends on
//! (seed, N, number of environments) only, never on thread timing.

use std::collections::VecDeque;

use burn::tensor::backend::Backend;
use diffrl_core::env::Env;
use diffrl_core::episode::wilson_interval;
use diffrl_core::record::{EpisodeEnd, NoRecorder, PolicyCall, Recorder, StepSeries, Timeline};
use diffrl_core::seeding::{Rng, derive, rng};
use diffrl_core::space::Observation;
use diffrl_core::vec_env::VecEnv;
use diffrl_policy::{ObsBatch, Policy, SampleMode};
use serde::{Deserialize, Serialize};

use crate::LearnError;

/// One evaluated episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeStats {
    /// Environment that played it.
    pub env: usize,
    /// Its index in that environment's seed stream.
    pub episode: u64,
    /// Whether the task succeeded.
    pub success: bool,
    /// Highest score reached (Push-T: coverage reward).
    pub max_score: f32,
    /// Sum of rewards.
    pub total_reward: f32,
    /// Steps taken.
    pub length: usize,
}

/// Aggregate results (docs/algorithms.md §5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    /// Episodes played.
    pub episodes: usize,
    /// Successful episodes.
    pub successes: usize,
    /// successes / episodes.
    pub success_rate: f64,
    /// Wilson 95% interval of the success rate.
    pub ci95: [f64; 2],
    /// Mean over episodes of the highest score.
    pub mean_max_score: f64,
    /// Mean episode length.
    pub mean_length: f64,
    /// Root seed.
    pub seed: u64,
    /// Environments run in parallel.
    pub envs: usize,
    /// Per-episode results.
    pub per_episode: Vec<EpisodeStats>,
}

impl EvalReport {
    /// Aggregates per-episode results.
    pub fn from_episodes(per_episode: Vec<EpisodeStats>, seed: u64, envs: usize) -> Self {
        let n = per_episode.len();
        let successes = per_episode.iter().filter(|e| e.success).count();
        let mean = |f: &dyn Fn(&EpisodeStats) -> f64| {
            if n == 0 {
                0.0
            } else {
                per_episode.iter().map(f).sum::<f64>() / n as f64
            }
        };
        let (lo, hi) = wilson_interval(successes, n, 1.96);
        Self {
            episodes: n,
            successes,
            success_rate: if n == 0 {
                0.0
            } else {
                successes as f64 / n as f64
            },
            ci95: [lo, hi],
            mean_max_score: mean(&|e| f64::from(e.max_score)),
            mean_length: mean(&|e| e.length as f64),
            seed,
            envs,
            per_episode,
        }
    }
}

/// Observation history of one environment (the last To observations, oldest first).
pub(crate) struct History {
    pub(crate) frames: VecDeque<Observation>,
    horizon: usize,
}

impl History {
    pub(crate) fn new(first: Observation, horizon: usize) -> Self {
        Self {
            frames: std::iter::repeat_n(first, horizon).collect(),
            horizon,
        }
    }

    pub(crate) fn push(&mut self, o: Observation) {
        self.frames.push_back(o);
        while self.frames.len() > self.horizon {
            self.frames.pop_front();
        }
    }
}

/// Builds the policy's batch from the histories of environments `idx`.
pub(crate) fn batch(histories: &[History], idx: &[usize], images: bool) -> ObsBatch {
    let mut state = Vec::new();
    let mut image = images.then(Vec::new);
    for &i in idx {
        for f in &histories[i].frames {
            state.extend_from_slice(&f.state);
            if let (Some(buf), Some(img)) = (image.as_mut(), f.image.as_ref()) {
                buf.extend_from_slice(&img.data);
            }
        }
    }
    ObsBatch {
        batch: idx.len(),
        state,
        image,
    }
}

/// Something that turns observation windows into action chunks: the in-process policy, or a
/// policy server across the network (`diffrl eval --remote`).
pub trait Actor {
    /// Observations per input window (To).
    fn obs_horizon(&self) -> usize;
    /// Actions executed per call (Ta).
    fn action_horizon(&self) -> usize;
    /// Width of one action.
    fn action_dim(&self) -> usize;
    /// Whether windows carry images.
    fn images(&self) -> bool;
    /// Actions `[B, Ta, Da]` (row-major) for the windows of environments `envs` (`obs` holds
    /// one window per entry of `envs`, in that order).
    fn act(&mut self, envs: &[usize], obs: &ObsBatch) -> Result<Vec<f32>, LearnError>;
    /// [`Actor::act`] when environment 0 (the recorded one) is among `envs` and `rec` is on:
    /// an actor that can show its chunk and chain logs them as a [`PolicyCall`]. The actions
    /// must be the ones [`Actor::act`] would return.
    fn act_recorded(
        &mut self,
        envs: &[usize],
        obs: &ObsBatch,
        _rec: &dyn Recorder,
    ) -> Result<Vec<f32>, LearnError> {
        self.act(envs, obs)
    }
}

/// A policy evaluated in-process: one noise stream for the run, seeded from the root seed.
pub struct PolicyActor<'a, B: Backend> {
    policy: &'a Policy<B>,
    device: &'a B::Device,
    mode: SampleMode,
    rng: Rng,
}

impl<'a, B: Backend> PolicyActor<'a, B> {
    /// `policy` on `device`, its noise drawn from a stream derived from `seed`.
    pub fn new(policy: &'a Policy<B>, device: &'a B::Device, mode: SampleMode, seed: u64) -> Self {
        Self {
            policy,
            device,
            mode,
            rng: rng(derive(seed, u64::from(u32::MAX))),
        }
    }
}

impl<B: Backend> Actor for PolicyActor<'_, B> {
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
    fn act(&mut self, _envs: &[usize], obs: &ObsBatch) -> Result<Vec<f32>, LearnError> {
        let act = self
            .policy
            .act(None, obs, self.mode, false, &mut self.rng, self.device)?;
        let [tp, da] = self.policy.chunk();
        let ta = self.action_horizon();
        Ok(act
            .actions
            .chunks(tp * da)
            .flat_map(|c| c[..ta * da].iter().copied())
            .collect())
    }

    fn act_recorded(
        &mut self,
        envs: &[usize],
        obs: &ObsBatch,
        rec: &dyn Recorder,
    ) -> Result<Vec<f32>, LearnError> {
        let Some(row) = envs.iter().position(|&e| e == 0) else {
            return self.act(envs, obs);
        };
        // Recording the chain draws the same noise, so the actions are unchanged.
        let act = self
            .policy
            .act(None, obs, self.mode, true, &mut self.rng, self.device)?;
        let [tp, da] = self.policy.chunk();
        let ta = self.action_horizon();
        let chain = crate::rollout::chain_row(self.policy, &act.sample, row)?;
        rec.policy_call(&PolicyCall {
            action_dim: da,
            predicted: &act.actions[row * tp * da..(row + 1) * tp * da],
            executed: ta,
            chain: &chain.0,
            logp: &chain.1,
        });
        Ok(act
            .actions
            .chunks(tp * da)
            .flat_map(|c| c[..ta * da].iter().copied())
            .collect())
    }
}

/// Plays `episodes` seeded episodes on `venv` (which must auto-reset in the same step) and
/// reports success with a Wilson interval. `progress(done, total)` is called as episodes end.
pub fn evaluate<E: Env, B: Backend>(
    venv: &mut VecEnv<E>,
    policy: &Policy<B>,
    device: &B::Device,
    episodes: usize,
    seed: u64,
    mode: SampleMode,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<EvalReport, LearnError> {
    let mut actor = PolicyActor::new(policy, device, mode, seed);
    evaluate_actor(venv, &mut actor, episodes, seed, progress)
}

/// [`evaluate`] that records environment 0's scenes, policy calls and rewards and every
/// episode's end into `rec` (nothing changes in the results).
#[allow(clippy::too_many_arguments)]
pub fn evaluate_recorded<E: Env, B: Backend>(
    venv: &mut VecEnv<E>,
    policy: &Policy<B>,
    device: &B::Device,
    episodes: usize,
    seed: u64,
    mode: SampleMode,
    progress: &mut dyn FnMut(usize, usize),
    rec: &dyn Recorder,
) -> Result<EvalReport, LearnError> {
    let mut actor = PolicyActor::new(policy, device, mode, seed);
    evaluate_actor_recorded(venv, &mut actor, episodes, seed, progress, rec)
}

/// [`evaluate`] for any [`Actor`].
pub fn evaluate_actor<E: Env>(
    venv: &mut VecEnv<E>,
    actor: &mut dyn Actor,
    episodes: usize,
    seed: u64,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<EvalReport, LearnError> {
    evaluate_actor_recorded(venv, actor, episodes, seed, progress, &NoRecorder)
}

/// Logs environment 0's scene at a new `env_step`; returns that step.
pub(crate) fn record_scene<E: Env>(venv: &VecEnv<E>, rec: &dyn Recorder) -> i64 {
    let t = rec.tick(Timeline::EnvStep);
    if let Some(scene) = venv.envs().next().and_then(Env::scene) {
        rec.scene(&scene);
    }
    t
}

/// [`evaluate_actor`] recording into `rec` (see [`evaluate_recorded`]).
pub fn evaluate_actor_recorded<E: Env>(
    venv: &mut VecEnv<E>,
    actor: &mut dyn Actor,
    episodes: usize,
    seed: u64,
    progress: &mut dyn FnMut(usize, usize),
    rec: &dyn Recorder,
) -> Result<EvalReport, LearnError> {
    let recording = rec.enabled();
    let n_env = venv.len().min(episodes.max(1));
    let ta = actor.action_horizon();
    let to = actor.obs_horizon();
    let da = actor.action_dim();
    let images = actor.images();
    let mut quota: Vec<usize> = (0..venv.len())
        .map(|i| episodes / n_env + usize::from(i < episodes % n_env))
        .map(|q| q * usize::from(n_env > 0))
        .collect();
    for q in quota.iter_mut().skip(n_env) {
        *q = 0;
    }
    let first = venv.reset(seed);
    if recording {
        record_scene(venv, rec);
    }
    let mut histories: Vec<History> = first.into_iter().map(|o| History::new(o, to)).collect();
    let mut queues: Vec<VecDeque<Vec<f32>>> = vec![VecDeque::new(); venv.len()];
    let mut last: Vec<Vec<f32>> = vec![vec![0.0; da]; venv.len()];
    let mut current: Vec<EpisodeStats> = (0..venv.len())
        .map(|i| EpisodeStats {
            env: i,
            episode: 0,
            success: false,
            max_score: f32::NEG_INFINITY,
            total_reward: 0.0,
            length: 0,
        })
        .collect();
    let mut done = Vec::with_capacity(episodes);
    while quota.iter().any(|&q| q > 0) {
        let need: Vec<usize> = (0..venv.len())
            .filter(|&i| quota[i] > 0 && queues[i].is_empty())
            .collect();
        if !need.is_empty() {
            let obs = batch(&histories, &need, images);
            let actions = if recording && need.first() == Some(&0) {
                actor.act_recorded(&need, &obs, rec)?
            } else {
                actor.act(&need, &obs)?
            };
            if actions.len() != need.len() * ta * da {
                return Err(LearnError::Actor(format!(
                    "it returned {} action values for {} windows of {ta} x {da}",
                    actions.len(),
                    need.len()
                )));
            }
            for (j, &i) in need.iter().enumerate() {
                let chunk = &actions[j * ta * da..(j + 1) * ta * da];
                queues[i].extend(chunk.chunks(da).map(<[f32]>::to_vec));
            }
        }
        let actions: Vec<Vec<f32>> = (0..venv.len())
            .map(|i| match queues[i].pop_front() {
                Some(a) => {
                    last[i] = a.clone();
                    a
                }
                // Finished environments idle on their last action; their steps are ignored.
                None => last[i].clone(),
            })
            .collect();
        let step = venv.step(&actions)?;
        if recording && quota[0] > 0 {
            // After an episode's last step the environment has already reset: the scene
            // shows the next episode's start.
            let t = record_scene(venv, rec);
            rec.step_series(StepSeries::Reward, t, &[f64::from(step.rewards[0])]);
        }
        for i in 0..venv.len() {
            if quota[i] == 0 {
                continue;
            }
            let c = &mut current[i];
            c.length += 1;
            c.total_reward += step.rewards[i];
            c.max_score = c.max_score.max(step.infos[i].score);
            c.success |= step.infos[i].success;
            if step.terminated[i] || step.truncated[i] {
                let next = EpisodeStats {
                    env: i,
                    episode: c.episode + 1,
                    success: false,
                    max_score: f32::NEG_INFINITY,
                    total_reward: 0.0,
                    length: 0,
                };
                if recording {
                    rec.episode_end(&EpisodeEnd {
                        env: c.env,
                        episode: c.episode,
                        success: c.success,
                        max_score: c.max_score,
                        total_reward: c.total_reward,
                        length: c.length,
                    });
                }
                done.push(std::mem::replace(c, next));
                progress(done.len(), episodes);
                quota[i] -= 1;
                queues[i].clear();
                histories[i] = History::new(step.obs[i].clone(), to);
            } else {
                histories[i].push(step.obs[i].clone());
            }
        }
    }
    done.sort_by_key(|e| (e.env, e.episode));
    Ok(EvalReport::from_episodes(done, seed, n_env))
}
