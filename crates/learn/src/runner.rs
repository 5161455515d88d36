//! Receding-horizon execution on a vector of environments, the one rollout loop of the crate:
//! the policy predicts Tp actions, the first Ta are executed, then it is called again; every
//! environment that needs a new chunk is served by one batched call. Evaluation
//! ([`crate::eval`]) and group rollouts for fine-tuning ([`crate::rollout`]) are two
//! [`Agent`]s driving [`play`].

use std::collections::VecDeque;
use std::time::Instant;

use diffrl_core::env::Env;
use diffrl_core::record::{Recorder, StepSeries, Timeline};
use diffrl_core::space::Observation;
use diffrl_core::vec_env::{VecEnv, VecStep};
use diffrl_policy::ObsBatch;

use crate::LearnError;
use crate::eval::Actor;

/// Observation history of one environment (the last To observations, oldest first; the first
/// observation of an episode is repeated before it).
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

/// Builds the policy's batch from the histories of environments `idx`. Observations that carry
/// a text instruction give each row the newest one (a row without one gets an empty
/// instruction, which a language-conditioned policy refuses by name).
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
    let newest = |i: usize| histories[i].frames.back().and_then(|f| f.text.as_ref());
    let text = idx.iter().any(|&i| newest(i).is_some()).then(|| {
        idx.iter()
            .map(|&i| newest(i).cloned().unwrap_or_default())
            .collect()
    });
    ObsBatch {
        batch: idx.len(),
        state,
        image,
        text,
    }
}

/// What drives [`play`]: an [`Actor`] that chooses the actions, and the record of what came
/// of them.
pub(crate) trait Agent {
    /// The actor that chooses the actions.
    fn actor(&mut self) -> &mut dyn Actor;
    /// Environment `env` executed `action` from observation `before`; row `env` of `step` is
    /// what came of it. Called only for environments that still had episodes to play.
    fn observe(&mut self, env: usize, before: &Observation, action: &[f32], step: &VecStep);
}

/// Where the time of a [`play`] went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct PlayStats {
    /// Seconds stepping environments.
    pub env_s: f64,
    /// Seconds in the agent's action calls.
    pub policy_s: f64,
    /// Environment steps of environments that still had episodes to play.
    pub env_steps: usize,
    /// Windows sent to the agent (one per action chunk).
    pub decisions: usize,
    /// `env_step` at which environment 0's first scene was logged, when `rec` is on.
    pub first_env_step: Option<i64>,
}

/// Logs environment 0's scene at a new `env_step`; returns that step.
pub(crate) fn record_scene<E: Env>(venv: &VecEnv<E>, rec: &dyn Recorder) -> i64 {
    let t = rec.tick(Timeline::EnvStep);
    if let Some(scene) = venv.envs().next().and_then(Env::scene) {
        rec.scene(&scene);
    }
    t
}

/// Logs environment 0's step: its scene at a new `env_step` (when the step ended its
/// `last_episode`, the environment has reset already and the clock only ticks, keeping the last
/// scene on screen) and its reward there.
fn record_step<E: Env>(venv: &VecEnv<E>, step: &VecStep, last_episode: bool, rec: &dyn Recorder) {
    let ended = step.terminated[0] || step.truncated[0];
    let t = if ended && last_episode {
        rec.tick(Timeline::EnvStep)
    } else {
        record_scene(venv, rec)
    };
    rec.step_series(StepSeries::Reward, t, &[f64::from(step.rewards[0])]);
}

/// Plays on `venv` (which must auto-reset in the same step), starting from the observations
/// `first`, until environment i has ended `quota[i]` episodes; an environment that is done
/// idles on its last action and its steps are ignored.
///
/// With `rec` on, environment 0 is the recorded one: its scene after every step it plays
/// (after its last episode ends, the clock only ticks: the environment has reset already) and
/// its step rewards ([`StepSeries::Reward`]) on the `env_step` timeline, and its policy calls
/// through [`Actor::act`].
pub(crate) fn play<E: Env>(
    venv: &mut VecEnv<E>,
    first: Vec<Observation>,
    mut quota: Vec<usize>,
    agent: &mut dyn Agent,
    rec: &dyn Recorder,
) -> Result<PlayStats, LearnError> {
    let recording = rec.enabled();
    let n = venv.len();
    let actor = agent.actor();
    let (to, ta, da) = (
        actor.obs_horizon(),
        actor.action_horizon(),
        actor.action_dim(),
    );
    let images = actor.images();
    let mut stats = PlayStats {
        first_env_step: recording.then(|| record_scene(venv, rec)),
        ..PlayStats::default()
    };
    let mut histories: Vec<History> = first.into_iter().map(|o| History::new(o, to)).collect();
    let mut queues: Vec<VecDeque<Vec<f32>>> = vec![VecDeque::new(); n];
    let mut last: Vec<Vec<f32>> = vec![vec![0.0; da]; n];
    while quota.iter().any(|&q| q > 0) {
        let need: Vec<usize> = (0..n)
            .filter(|&i| quota[i] > 0 && queues[i].is_empty())
            .collect();
        if !need.is_empty() {
            let t = Instant::now();
            let obs = batch(&histories, &need, images);
            let chunks = agent.actor().act(&need, &obs, rec)?;
            if chunks.len() != need.len() * ta * da {
                return Err(LearnError::Actor(format!(
                    "it returned {} action values for {} windows of {ta} x {da}",
                    chunks.len(),
                    need.len()
                )));
            }
            for (&i, chunk) in need.iter().zip(chunks.chunks(ta * da)) {
                queues[i].extend(chunk.chunks(da).map(<[f32]>::to_vec));
            }
            stats.decisions += need.len();
            stats.policy_s += t.elapsed().as_secs_f64();
        }
        // Environments that are done idle on their last action.
        let actions: Vec<Vec<f32>> = queues
            .iter_mut()
            .zip(&mut last)
            .map(|(q, last)| {
                if let Some(a) = q.pop_front() {
                    *last = a;
                }
                last.clone()
            })
            .collect();
        let t = Instant::now();
        let step = venv.step(&actions)?;
        stats.env_s += t.elapsed().as_secs_f64();
        if recording && quota[0] > 0 {
            record_step(venv, &step, quota[0] == 1, rec);
        }
        for i in 0..n {
            if quota[i] == 0 {
                continue;
            }
            let before = histories[i]
                .frames
                .back()
                .expect("histories are never empty");
            agent.observe(i, before, &actions[i], &step);
            stats.env_steps += 1;
            if step.terminated[i] || step.truncated[i] {
                quota[i] -= 1;
                queues[i].clear();
                if quota[i] > 0 {
                    histories[i] = History::new(step.obs[i].clone(), to);
                }
            } else {
                histories[i].push(step.obs[i].clone());
            }
        }
    }
    Ok(stats)
}
