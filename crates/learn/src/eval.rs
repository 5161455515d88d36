//! Seeded evaluation of a policy on a vector of environments, played by the receding-horizon
//! loop of `runner`.
//!
//! Episode seeds: environment i plays its k-th episode with `derive(derive(seed, i), k)` (see
//! `VecEnv`), and the N episodes are split evenly over the environments, so a result depends on
//! (seed, N, number of environments) only, never on thread timing.

use std::collections::BTreeMap;

use burn::tensor::backend::Backend;
use diffrl_core::env::Env;
use diffrl_core::record::{EpisodeEnd, FrameSaliency, PolicyCall, Recorder};
use diffrl_core::seeding::{Rng, derive, rng};
use diffrl_core::space::Observation;
use diffrl_core::stats::{Z95, wilson_interval};
use diffrl_core::vec_env::{VecEnv, VecStep};
use diffrl_policy::{ObsBatch, Policy, SampleMode};
use serde::{Deserialize, Serialize};

use crate::LearnError;
use crate::runner;

/// One evaluated episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeStats {
    /// Environment that played it.
    pub env: usize,
    /// Its index in that environment's seed stream.
    pub episode: u64,
    /// Whether the task succeeded.
    pub success: bool,
    /// Highest score reached (Push-T: coverage).
    pub max_score: f32,
    /// Highest step reward reached (Push-T: gym-pusht's reward, clip(coverage / 0.95, 0, 1),
    /// whose episode maximum LeRobot reports as `avg_max_reward`). None in reports written
    /// before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_reward: Option<f32>,
    /// Sum of rewards.
    pub total_reward: f32,
    /// Steps taken.
    pub length: usize,
    /// The episode-level metrics the task reported at its end ([`Info::metrics`]).
    ///
    /// [`Info::metrics`]: diffrl_core::env::Info::metrics
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, f64>,
}

/// One task metric over the evaluated episodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricSummary {
    /// Mean over the episodes that reported it.
    pub mean: f64,
    /// 95% interval of the mean: Wilson's when every value is 0 or 1 (a rate), else the normal
    /// approximation mean +- 1.96 sd / sqrt(n).
    pub ci95: [f64; 2],
    /// Episodes that reported it.
    pub episodes: usize,
    /// Whether every value was 0 or 1 (the mean is a rate).
    pub rate: bool,
}

impl MetricSummary {
    /// The summary of `values` (None when empty).
    pub fn of(values: &[f64]) -> Option<Self> {
        let n = values.len();
        if n == 0 {
            return None;
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let rate = values.iter().all(|&v| v == 0.0 || v == 1.0);
        let ci95 = if rate {
            let (lo, hi) = wilson_interval(values.iter().filter(|&&v| v == 1.0).count(), n, Z95);
            [lo, hi]
        } else {
            let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>()
                / (n.saturating_sub(1).max(1)) as f64;
            let half = Z95 * (var / n as f64).sqrt();
            [mean - half, mean + half]
        };
        Some(Self {
            mean,
            ci95,
            episodes: n,
            rate,
        })
    }

    /// `4.2% (2.8-6.3%)` for a rate, `0.912 (0.905-0.919)` otherwise.
    /// The mean alone: `2.8%` for a rate, `6.085` otherwise.
    pub fn mean_text(&self) -> String {
        if self.rate {
            format!("{:.1}%", 100.0 * self.mean)
        } else {
            format!("{:.3}", self.mean)
        }
    }

    /// The mean and its interval: `2.8% (1.7-4.6%)`, `6.085 (5.478-6.692)`.
    pub fn text(&self) -> String {
        if self.rate {
            format!(
                "{:.1}% ({:.1}-{:.1}%)",
                100.0 * self.mean,
                100.0 * self.ci95[0],
                100.0 * self.ci95[1]
            )
        } else {
            format!("{:.3} ({:.3}-{:.3})", self.mean, self.ci95[0], self.ci95[1])
        }
    }
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
    /// Mean over episodes of the highest step reward (LeRobot's `avg_max_reward`); None when
    /// an episode lacks it (a report written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_max_reward: Option<f64>,
    /// Mean episode length.
    pub mean_length: f64,
    /// Root seed.
    pub seed: u64,
    /// Environments run in parallel.
    pub envs: usize,
    /// The task's episode metrics (driving: collision and off-road rates, progress, speed), by
    /// name; empty for tasks that report none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, MetricSummary>,
    /// Per-episode results.
    pub per_episode: Vec<EpisodeStats>,
}

impl EvalReport {
    /// The task metrics as `name value (interval)` pairs joined by commas; empty when none.
    pub fn metrics_text(&self) -> String {
        self.metrics
            .iter()
            .map(|(k, m)| format!("{k} {}", m.text()))
            .collect::<Vec<_>>()
            .join(", ")
    }

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
        let (lo, hi) = wilson_interval(successes, n, Z95);
        let mut values: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for e in &per_episode {
            for (k, &v) in &e.metrics {
                values.entry(k.clone()).or_default().push(v);
            }
        }
        let metrics = values
            .into_iter()
            .filter_map(|(k, v)| MetricSummary::of(&v).map(|m| (k, m)))
            .collect();
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
            mean_max_reward: per_episode
                .iter()
                .all(|e| e.max_reward.is_some())
                .then(|| mean(&|e| e.max_reward.map_or(0.0, f64::from))),
            mean_length: mean(&|e| e.length as f64),
            seed,
            envs,
            metrics,
            per_episode,
        }
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
    /// one window per entry of `envs`, in that order). When `rec` is on and environment 0 (the
    /// recorded one) is among `envs`, an actor that can show its chunk and chain logs them as
    /// a [`PolicyCall`]; the actions must not depend on whether it does.
    fn act(
        &mut self,
        envs: &[usize],
        obs: &ObsBatch,
        rec: &dyn Recorder,
    ) -> Result<Vec<f32>, LearnError>;
}

/// A policy evaluated in-process: one noise stream for the run, seeded from the root seed.
pub struct PolicyActor<'a, B: Backend> {
    policy: &'a Policy<B>,
    device: &'a B::Device,
    mode: SampleMode,
    rng: Rng,
    threads: usize,
}

impl<'a, B: Backend> PolicyActor<'a, B> {
    /// `policy` on `device`, its noise drawn from a stream derived from `seed`.
    pub fn new(policy: &'a Policy<B>, device: &'a B::Device, mode: SampleMode, seed: u64) -> Self {
        Self {
            policy,
            device,
            mode,
            rng: rng(derive(seed, u64::from(u32::MAX))),
            threads: 1,
        }
    }

    /// Cuts each policy call's batch over `threads` threads ([`Policy::act_threads`]: the same
    /// actions for any count).
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
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
    fn act(
        &mut self,
        envs: &[usize],
        obs: &ObsBatch,
        rec: &dyn Recorder,
    ) -> Result<Vec<f32>, LearnError> {
        let recorded_row = envs.iter().position(|&e| e == 0).filter(|_| rec.enabled());
        // Recording the chain draws the same noise, so the actions are the same either way.
        let act = self.policy.act_threads(
            None,
            obs,
            self.mode,
            recorded_row.is_some(),
            &mut self.rng,
            self.device,
            self.threads,
        )?;
        let [tp, da] = self.policy.chunk();
        let ta = self.action_horizon();
        if let Some(row) = recorded_row {
            let (chain, logp) = crate::rollout::chain_row(self.policy, &act.sample, row)?;
            // Pixel policies: where the policy looked, in squares of its patch size (its own
            // deterministic chains, so the actions above do not change).
            let saliency = match (self.policy.spec.image, &obs.image) {
                (Some([c, h, w]), Some(px)) => {
                    let square = self.policy.config.encoder.image.patch_size;
                    let s = self
                        .policy
                        .occlusion_saliency(obs, row, square, 0, self.device)?;
                    let (to, per) = (self.obs_horizon(), h * w * c);
                    let start = (row * to + to - 1) * per;
                    Some((s, &px[start..start + per], h, w))
                }
                _ => None,
            };
            rec.policy_call(&PolicyCall {
                action_dim: da,
                predicted: &act.actions[row * tp * da..(row + 1) * tp * da],
                executed: ta,
                chain: &chain,
                logp: &logp,
                saliency: saliency.as_ref().map(|(s, frame, h, w)| FrameSaliency {
                    frame,
                    height: *h as u32,
                    width: *w as u32,
                    square: s.square,
                    rows: s.rows,
                    cols: s.cols,
                    values: &s.values,
                }),
            });
        }
        Ok(act
            .actions
            .chunks(tp * da)
            .flat_map(|c| c[..ta * da].iter().copied())
            .collect())
    }
}

/// Plays `episodes` seeded episodes of `policy` on `venv` (which must auto-reset in the same
/// step) and reports success with a Wilson interval. `progress(done, total)` is called as
/// episodes end. With `rec` on, environment 0's scenes, policy calls and rewards and every
/// episode's end are recorded (the results are the same). Policy calls are cut over as many
/// threads as `venv` has workers (the same actions for any count).
#[allow(clippy::too_many_arguments)]
pub fn evaluate<E: Env, B: Backend>(
    venv: &mut VecEnv<E>,
    policy: &Policy<B>,
    device: &B::Device,
    episodes: usize,
    seed: u64,
    mode: SampleMode,
    progress: &mut dyn FnMut(usize, usize),
    rec: &dyn Recorder,
) -> Result<EvalReport, LearnError> {
    let mut actor = PolicyActor::new(policy, device, mode, seed).with_threads(venv.threads());
    evaluate_actor(venv, &mut actor, episodes, seed, progress, rec)
}

/// [`evaluate`] for any [`Actor`]: the N episodes are split evenly over the first
/// min(N, environments) environments.
pub fn evaluate_actor<E: Env>(
    venv: &mut VecEnv<E>,
    actor: &mut dyn Actor,
    episodes: usize,
    seed: u64,
    progress: &mut dyn FnMut(usize, usize),
    rec: &dyn Recorder,
) -> Result<EvalReport, LearnError> {
    let n_env = venv.len().min(episodes.max(1));
    let quota: Vec<usize> = (0..venv.len())
        .map(|i| {
            if i < n_env {
                episodes / n_env + usize::from(i < episodes % n_env)
            } else {
                0
            }
        })
        .collect();
    let first = venv.reset(seed);
    let mut scorer = Scorer {
        actor,
        current: (0..venv.len()).map(|i| EpisodeStats::start(i, 0)).collect(),
        done: Vec::with_capacity(episodes),
        episodes,
        progress,
        rec,
    };
    runner::play(venv, first, quota, &mut scorer, rec)?;
    let mut done = scorer.done;
    done.sort_by_key(|e| (e.env, e.episode));
    Ok(EvalReport::from_episodes(done, seed, n_env))
}

impl EpisodeStats {
    /// Episode `episode` of environment `env`, before its first step.
    fn start(env: usize, episode: u64) -> Self {
        Self {
            env,
            episode,
            success: false,
            max_score: f32::NEG_INFINITY,
            max_reward: Some(f32::NEG_INFINITY),
            total_reward: 0.0,
            length: 0,
            metrics: BTreeMap::new(),
        }
    }
}

/// Evaluation as a [`runner::Agent`]: the actor chooses, the scorer keeps per-episode stats.
struct Scorer<'a> {
    actor: &'a mut dyn Actor,
    /// The episode each environment is playing.
    current: Vec<EpisodeStats>,
    done: Vec<EpisodeStats>,
    episodes: usize,
    progress: &'a mut dyn FnMut(usize, usize),
    rec: &'a dyn Recorder,
}

impl runner::Agent for Scorer<'_> {
    fn actor(&mut self) -> &mut dyn Actor {
        &mut *self.actor
    }

    fn observe(&mut self, env: usize, _before: &Observation, _action: &[f32], step: &VecStep) {
        let c = &mut self.current[env];
        c.length += 1;
        c.total_reward += step.rewards[env];
        c.max_score = c.max_score.max(step.infos[env].score);
        c.max_reward = c.max_reward.map(|m| m.max(step.rewards[env]));
        c.success |= step.infos[env].success;
        if step.terminated[env] || step.truncated[env] {
            c.metrics = step.infos[env]
                .metrics
                .iter()
                .map(|&(k, v)| (k.to_string(), v))
                .collect();
            let next = EpisodeStats::start(env, c.episode + 1);
            if self.rec.enabled() {
                self.rec.episode_end(&EpisodeEnd {
                    env: c.env,
                    episode: c.episode,
                    success: c.success,
                    max_score: c.max_score,
                    total_reward: c.total_reward,
                    length: c.length,
                });
            }
            self.done.push(std::mem::replace(c, next));
            (self.progress)(self.done.len(), self.episodes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn episode(metrics: &[(&str, f64)]) -> EpisodeStats {
        let mut e = EpisodeStats::start(0, 0);
        e.metrics = metrics.iter().map(|&(k, v)| (k.to_string(), v)).collect();
        e
    }

    #[test]
    fn the_mean_max_reward_needs_every_episode_and_old_reports_read_without_it() {
        let with = |r: f32| EpisodeStats {
            max_score: 0.5,
            max_reward: Some(r),
            ..episode(&[])
        };
        let r = EvalReport::from_episodes(vec![with(1.0), with(0.5)], 0, 1);
        assert_eq!(r.mean_max_reward, Some(0.75));
        let old = EpisodeStats {
            max_reward: None,
            ..with(0.0)
        };
        let mixed = EvalReport::from_episodes(vec![with(1.0), old], 0, 1);
        assert_eq!(mixed.mean_max_reward, None);
        // A report written before the field existed.
        let mut json = serde_json::to_value(&mixed).unwrap();
        assert!(json.get("mean_max_reward").is_none());
        json["per_episode"][0]
            .as_object_mut()
            .unwrap()
            .remove("max_reward");
        let back: EvalReport = serde_json::from_value(json).unwrap();
        assert_eq!(back.per_episode[0].max_reward, None);
        assert_eq!(back.mean_max_reward, None);
    }

    #[test]
    fn metrics_average_as_rates_or_means_over_the_episodes_that_report_them() {
        let r = EvalReport::from_episodes(
            vec![
                episode(&[("collision", 1.0), ("speed", 20.0)]),
                episode(&[("collision", 0.0), ("speed", 22.0)]),
                episode(&[("collision", 0.0)]),
                episode(&[]),
            ],
            0,
            1,
        );
        let c = &r.metrics["collision"];
        assert!(c.rate && c.episodes == 3 && (c.mean - 1.0 / 3.0).abs() < 1e-12);
        let (lo, hi) = wilson_interval(1, 3, Z95);
        assert_eq!(c.ci95, [lo, hi]);
        let s = &r.metrics["speed"];
        assert!(!s.rate && s.episodes == 2 && s.mean == 21.0);
        // sd = sqrt(2), so the half-width is 1.96 * sqrt(2) / sqrt(2).
        assert!((s.ci95[1] - 21.0 - Z95).abs() < 1e-12, "{s:?}");
        assert_eq!(
            r.metrics_text(),
            format!("collision {}, speed {}", c.text(), s.text())
        );
        assert!(
            EvalReport::from_episodes(vec![episode(&[])], 0, 1)
                .metrics
                .is_empty()
        );
    }
}
