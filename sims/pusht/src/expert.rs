//! Push-T's experts: [`Expert`] runs the one `[expert].kind` names, MPPI (below) or the
//! stateless [`Pusher`](crate::pusher::Pusher).
//!
//! MPPI (model-predictive path integral control) plans over cloned worlds.
//!
//! Every control step, `samples` plans of `horizon` waypoint increments are rolled out on
//! copies of the environment (an exact snapshot: Rapier sets are `Clone`), scored by how close
//! the T's corners come to the goal's, and averaged with weights `exp(-(C - min) / std / T)`.
//! The first waypoint is executed and the plan is shifted to warm-start the next step.
//!
//! Findings that shaped the defaults (from a prototype on gym-pusht, see ENVIRONMENTS.md):
//! exploration noise shrinks with the keypoint error (success needs ~3 px), the cost counts
//! the best error reached along a rollout (an episode ends when coverage first passes 0.95),
//! and a stalled plan is kicked out of its local minimum by a short burst of wide exploration.

use diffrl_core::config::{Invalid, Validate, ensure};
use diffrl_core::seeding::{self, Rng};
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::env::PushT;
use crate::geometry::{self, GOAL, Pose};
use crate::physics::AGENT_RADIUS;
use crate::pusher::{Pusher, PusherConfig};

/// Which expert acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExpertKind {
    /// Sampling-based MPC on cloned worlds: strong, but its action depends on a warm-started
    /// plan, a noise stream and a stall mode the observation lacks.
    Mppi,
    /// The stateless pusher: its action is a function of the observed state.
    #[default]
    Pusher,
}

/// Expert settings (`[expert]` in configs): the kind, MPPI's settings (the flat keys, whose
/// defaults are the prototype's except 64 samples and 3 iterations, tuned on 40 seeds:
/// 62.5% -> 92.5% success; docs/pusht.md) and the pusher's (`[expert.pusher]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExpertConfig {
    /// Which expert acts.
    pub kind: ExpertKind,
    /// The stateless pusher's settings.
    pub pusher: PusherConfig,
    /// Plan length in control steps.
    pub horizon: usize,
    /// Sampled plans per MPPI iteration (sample 0 is the current mean plan).
    pub samples: usize,
    /// MPPI iterations per control step.
    pub iterations: usize,
    /// Temperature of the weights on normalised costs.
    pub temperature: f64,
    /// Largest waypoint increment per step (px).
    pub max_increment: f64,
    /// Weight of the agent-to-block surface distance (keeps the agent near the block).
    pub proximity_weight: f64,
    /// Weight of the last step in the horizon-averaged cost.
    pub terminal_weight: f64,
    /// Weight of the smallest keypoint error reached along the rollout.
    pub best_error_weight: f64,
    /// Noise std per step = clamp(noise_gain * keypoint error, noise_min, noise_max).
    pub noise_gain: f64,
    /// Smallest noise std (px).
    pub noise_min: f64,
    /// Largest noise std (px).
    pub noise_max: f64,
    /// Steps without `stall_improvement` px of progress that count as a stall.
    pub stall_window: usize,
    /// Progress (px of keypoint error) that resets the stall counter.
    pub stall_improvement: f64,
    /// Steps of wide exploration after a stall.
    pub recovery_steps: usize,
    /// Plan length during recovery.
    pub recovery_horizon: usize,
}

impl Default for ExpertConfig {
    fn default() -> Self {
        Self {
            kind: ExpertKind::default(),
            pusher: PusherConfig::default(),
            horizon: 15,
            samples: 64,
            iterations: 3,
            temperature: 0.1,
            max_increment: 60.0,
            proximity_weight: 0.1,
            terminal_weight: 5.0,
            best_error_weight: 1.0,
            noise_gain: 0.5,
            noise_min: 2.0,
            noise_max: 25.0,
            stall_window: 25,
            stall_improvement: 1.0,
            recovery_steps: 10,
            recovery_horizon: 20,
        }
    }
}

impl Validate for ExpertConfig {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            self.horizon >= 1 && self.horizon <= 200,
            "horizon",
            "must be in 1..=200",
        )?;
        ensure(
            self.recovery_horizon >= 1 && self.recovery_horizon <= 200,
            "recovery_horizon",
            "must be in 1..=200",
        )?;
        ensure(self.samples >= 2, "samples", "must be at least 2")?;
        ensure(self.iterations >= 1, "iterations", "must be at least 1")?;
        ensure(self.temperature > 0.0, "temperature", "must be > 0")?;
        ensure(self.max_increment > 0.0, "max_increment", "must be > 0")?;
        ensure(
            self.noise_min > 0.0 && self.noise_min <= self.noise_max,
            "noise_min",
            "must be > 0 and <= noise_max",
        )?;
        self.pusher.validate().map_err(|e| e.within("pusher"))
    }
}

/// Mean distance between the T's corners at `block` and at the goal (px).
pub fn keypoint_error(block: &Pose) -> f64 {
    let a = geometry::keypoints(block);
    let b = geometry::keypoints(&GOAL);
    (0..8)
        .map(|i| (a[2 * i] - b[2 * i]).hypot(a[2 * i + 1] - b[2 * i + 1]))
        .sum::<f64>()
        / 8.0
}

/// Distance from the agent disk's surface to the T (0 when touching).
pub fn agent_block_distance(agent: [f64; 2], block: &Pose) -> f64 {
    (geometry::distance_to_t(block, agent) - AGENT_RADIUS).max(0.0)
}

/// The configured expert. Deterministic for a given seed and environment state.
pub enum Expert {
    /// MPPI (boxed: its RNG and plan make it much larger than the pusher).
    Mppi(Box<Mppi>),
    /// The stateless pusher.
    Pusher(Pusher),
}

impl Expert {
    /// A fresh expert of `config.kind` (call [`Expert::reset`] at every episode start).
    pub fn new(config: ExpertConfig, seed: u64) -> Self {
        match config.kind {
            ExpertKind::Mppi => Self::Mppi(Box::new(Mppi::new(config, seed))),
            ExpertKind::Pusher => Self::Pusher(Pusher::new(config.pusher)),
        }
    }

    /// Forgets any state kept between steps (MPPI: plan and stall state; reseeds its noise).
    pub fn reset(&mut self, seed: u64) {
        if let Self::Mppi(m) = self {
            m.reset(seed);
        }
    }

    /// The next action (a target position) for `env`'s current state.
    pub fn act(&mut self, env: &PushT) -> [f32; 2] {
        match self {
            Self::Mppi(m) => m.act(env),
            Self::Pusher(p) => p.act(env.agent_pos(), &env.block_pose()),
        }
    }
}

/// The MPPI expert. Deterministic for a given seed and environment state.
pub struct Mppi {
    config: ExpertConfig,
    plan: Vec<[f64; 2]>,
    rng: Rng,
    best_error: f64,
    since_improvement: usize,
    recovery_left: usize,
}

impl Mppi {
    /// A fresh expert (call [`Mppi::reset`] at every episode start).
    pub fn new(config: ExpertConfig, seed: u64) -> Self {
        let plan = vec![[0.0; 2]; config.horizon];
        Self {
            config,
            plan,
            rng: seeding::rng(seed),
            best_error: f64::INFINITY,
            since_improvement: 0,
            recovery_left: 0,
        }
    }

    /// Forgets the plan and stall state; reseeds the noise.
    pub fn reset(&mut self, seed: u64) {
        *self = Self::new(self.config.clone(), seed);
    }

    /// The next action (a target position) for `env`'s current state.
    pub fn act(&mut self, env: &PushT) -> [f32; 2] {
        let cfg = self.config.clone();
        let err = keypoint_error(&env.block_pose());
        if err < self.best_error - cfg.stall_improvement {
            self.best_error = err;
            self.since_improvement = 0;
        } else {
            self.since_improvement += 1;
        }
        if self.recovery_left == 0 && self.since_improvement >= cfg.stall_window {
            self.recovery_left = cfg.recovery_steps;
            self.since_improvement = 0;
            self.best_error = err;
        }
        let recovering = self.recovery_left > 0;
        self.recovery_left = self.recovery_left.saturating_sub(1);
        let (horizon, sigma, proximity) = if recovering {
            (cfg.recovery_horizon, cfg.noise_max, 0.0)
        } else {
            (
                cfg.horizon,
                (cfg.noise_gain * err).clamp(cfg.noise_min, cfg.noise_max),
                cfg.proximity_weight,
            )
        };
        self.plan.resize(horizon, [0.0; 2]);

        for _ in 0..cfg.iterations {
            // Noise is drawn sequentially so results do not depend on thread scheduling.
            let noise: Vec<Vec<[f64; 2]>> = (0..cfg.samples)
                .map(|k| {
                    (0..horizon)
                        .map(|_| {
                            if k == 0 {
                                [0.0; 2]
                            } else {
                                let n0: f64 = StandardNormal.sample(&mut self.rng);
                                let n1: f64 = StandardNormal.sample(&mut self.rng);
                                [n0 * sigma, n1 * sigma]
                            }
                        })
                        .collect()
                })
                .collect();
            let candidates: Vec<Vec<[f64; 2]>> = noise
                .iter()
                .map(|n| {
                    self.plan
                        .iter()
                        .zip(n)
                        .map(|(p, e)| {
                            [
                                (p[0] + e[0]).clamp(-cfg.max_increment, cfg.max_increment),
                                (p[1] + e[1]).clamp(-cfg.max_increment, cfg.max_increment),
                            ]
                        })
                        .collect()
                })
                .collect();
            let costs: Vec<f64> = candidates
                .par_iter()
                .map(|c| rollout_cost(env, c, proximity, &cfg))
                .collect();
            let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
            let mean = costs.iter().sum::<f64>() / costs.len() as f64;
            let std = (costs.iter().map(|c| (c - mean).powi(2)).sum::<f64>() / costs.len() as f64)
                .sqrt()
                .max(1e-9);
            let weights: Vec<f64> = costs
                .iter()
                .map(|c| (-(c - min) / std / cfg.temperature).exp())
                .collect();
            let total: f64 = weights.iter().sum();
            for (t, p) in self.plan.iter_mut().enumerate() {
                let mut acc = [0.0; 2];
                for (w, c) in weights.iter().zip(&candidates) {
                    acc[0] += w * c[t][0];
                    acc[1] += w * c[t][1];
                }
                *p = [acc[0] / total, acc[1] / total];
            }
        }
        let first = self.plan[0];
        // Warm start: shift the plan by one step.
        self.plan.remove(0);
        self.plan.push([0.0; 2]);
        let [ax, ay] = env.agent_pos();
        [
            (ax + first[0]).clamp(0.0, 512.0) as f32,
            (ay + first[1]).clamp(0.0, 512.0) as f32,
        ]
    }
}

/// Cost of executing waypoint increments `plan` from `env`'s state (on a copy).
fn rollout_cost(env: &PushT, plan: &[[f64; 2]], proximity: f64, cfg: &ExpertConfig) -> f64 {
    let mut sim = env.clone();
    let mut target = sim.agent_pos();
    let (mut total, mut weight_sum, mut best) = (0.0, 0.0, f64::INFINITY);
    let last = plan.len() - 1;
    for (t, inc) in plan.iter().enumerate() {
        target = [
            (target[0] + inc[0]).clamp(0.0, 512.0),
            (target[1] + inc[1]).clamp(0.0, 512.0),
        ];
        sim.advance(target);
        let block = sim.block_pose();
        let err = keypoint_error(&block);
        best = best.min(err);
        let c = err + proximity * agent_block_distance(sim.agent_pos(), &block);
        let w = if t == last { cfg.terminal_weight } else { 1.0 };
        total += w * c;
        weight_sum += w;
    }
    total / weight_sum + cfg.best_error_weight * best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances_are_zero_at_goal_and_contact() {
        assert!(keypoint_error(&GOAL) < 1e-12);
        assert!((keypoint_error(&Pose::new(GOAL.x + 3.0, GOAL.y, GOAL.angle)) - 3.0).abs() < 1e-9);
        let block = Pose::new(200.0, 200.0, 0.0);
        assert_eq!(
            agent_block_distance([200.0, 190.0], &block),
            0.0,
            "overlapping"
        );
        assert_eq!(agent_block_distance([200.0, 150.0], &block), 35.0);
        assert_eq!(agent_block_distance([200.0, 250.0], &block), 0.0);
    }
}
