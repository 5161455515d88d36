//! Progress shaping of per-step rewards (Ng, Harada & Russell 1999; docs/algorithms.md §4).
//!
//! Policy-invariant (potential-based) shaping: r'_t = r_t + gamma * Phi(s_{t+1}) - Phi(s_t), with
//! Phi of the final state kept and gamma applied (our choice for terminal states). Over an
//! episode the shaping terms telescope: sum_t gamma^t r'_t = sum_t gamma^t r_t
//! + gamma^T Phi(s_T) - Phi(s_0), so the optimal policy does not change.
//!
//! The ablation `progress-as-reward`, r'_t = r_t + Phi(s_{t+1}), is not potential-based: an
//! agent paid for being at high progress learns to linger there instead of finishing (the
//! "semantic trap"); the tests below show both on a chain MDP.

use std::sync::Arc;

use diffrl_core::config::{Invalid, Validate};
use diffrl_core::episode::Episode;
use diffrl_core::reward::{EpisodeRewards, RewardFailure, RewardModule};
use diffrl_core::space::Observation;
use serde::{Deserialize, Serialize};

use crate::error::RewardError;

/// How progress enters the step rewards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShapingKind {
    /// r + gamma Phi(s') - Phi(s): policy-invariant.
    #[default]
    Potential,
    /// r + Phi(s'): NOT policy-invariant; for the ablation only.
    ProgressAsReward,
}

/// Shaping settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Shaping {
    /// Discount of the potential term (use the learner's discount).
    pub gamma: f64,
    /// Potential-based (default) or the non-invariant ablation.
    pub kind: ShapingKind,
}

impl Default for Shaping {
    fn default() -> Self {
        Self {
            gamma: 0.99,
            kind: ShapingKind::Potential,
        }
    }
}

impl Validate for Shaping {
    /// Checks gamma.
    fn validate(&self) -> Result<(), Invalid> {
        if !(self.gamma.is_finite() && self.gamma > 0.0 && self.gamma <= 1.0) {
            return Err(Invalid::new(
                "gamma",
                format!("must be in (0, 1], got {}", self.gamma),
            ));
        }
        Ok(())
    }
}

/// Shaped step rewards: `rewards[t]` is the reward of the transition s_t -> s_{t+1} and `phi`
/// holds Phi(s_0) .. Phi(s_T) (one more entry than `rewards`).
pub fn shape(rewards: &[f64], phi: &[f64], s: &Shaping) -> Vec<f64> {
    assert_eq!(
        phi.len(),
        rewards.len() + 1,
        "Phi of every state, final included"
    );
    rewards
        .iter()
        .enumerate()
        .map(|(t, r)| match s.kind {
            ShapingKind::Potential => r + s.gamma * phi[t + 1] - phi[t],
            ShapingKind::ProgressAsReward => r + phi[t + 1],
        })
        .collect()
}

/// Progress of observations, in [0, 1].
pub trait ProgressFn: Send + Sync {
    /// A short name for logs.
    fn name(&self) -> String;
    /// Phi of each observation of one episode, given in order (a model may read earlier
    /// observations of the sequence, never later ones), clamped into [0, 1]; errors name the
    /// offending index.
    fn progress(&self, obs: &[&Observation]) -> Result<Vec<f64>, RewardError>;
}

/// A reward module with progress shaping on top of another module's step rewards (the
/// outcome is left as it is).
pub struct ShapedReward {
    base: Box<dyn RewardModule>,
    progress: Arc<dyn ProgressFn>,
    shaping: Shaping,
}

impl ShapedReward {
    /// Shapes `base`'s step rewards with `progress`.
    pub fn new(
        base: Box<dyn RewardModule>,
        progress: Arc<dyn ProgressFn>,
        shaping: Shaping,
    ) -> Result<Self, RewardError> {
        shaping.validate().map_err(|e| e.within("shaping"))?;
        Ok(Self {
            base,
            progress,
            shaping,
        })
    }
}

impl RewardModule for ShapedReward {
    fn name(&self) -> String {
        let kind = match self.shaping.kind {
            ShapingKind::Potential => "shaped",
            ShapingKind::ProgressAsReward => "progress-as-reward",
        };
        format!(
            "{}+{kind}({}, gamma {})",
            self.base.name(),
            self.progress.name(),
            self.shaping.gamma
        )
    }

    fn refine_group(
        &self,
        episodes: &[&Episode],
        rewards: &mut [EpisodeRewards],
    ) -> Result<(), RewardFailure> {
        self.base.refine_group(episodes, rewards)
    }

    fn rewards(&self, ep: &Episode) -> Result<EpisodeRewards, RewardFailure> {
        let base = self.base.rewards(ep)?;
        let n = ep.len();
        let steps = base
            .per_step
            .clone()
            .unwrap_or_else(|| ep.rewards.iter().map(|&r| f64::from(r)).collect());
        if steps.len() != n {
            return Err(RewardFailure(format!(
                "{} gave {} step rewards for {n} steps",
                self.base.name(),
                steps.len()
            )));
        }
        // s_0 .. s_{T-1}, then s_T (the last observation stands in when none was recorded).
        let mut obs: Vec<&Observation> = ep.observations.iter().collect();
        match (&ep.final_observation, ep.observations.last()) {
            (Some(f), _) => obs.push(f),
            (None, Some(last)) => obs.push(last),
            (None, None) => {}
        }
        let phi = self
            .progress
            .progress(&obs)
            .map_err(|e| RewardFailure(format!("progress model {}: {e}", self.progress.name())))?;
        let per_step = if n == 0 {
            Vec::new()
        } else {
            shape(&steps, &phi, &self.shaping)
        };
        Ok(EpisodeRewards {
            outcome: base.outcome,
            per_step: Some(per_step),
            potential: Some(phi),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn shaping_telescopes() {
        let mut rng = diffrl_core::seeding::rng(3);
        for gamma in [0.9, 0.99, 1.0] {
            let n = 37;
            let r: Vec<f64> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
            let phi: Vec<f64> = (0..=n).map(|_| rng.random_range(0.0..1.0)).collect();
            let s = Shaping {
                gamma,
                kind: ShapingKind::Potential,
            };
            let shaped = shape(&r, &phi, &s);
            let disc = |v: &[f64]| -> f64 {
                v.iter()
                    .enumerate()
                    .map(|(t, x)| gamma.powi(t as i32) * x)
                    .sum()
            };
            let want = disc(&r) + gamma.powi(n as i32) * phi[n] - phi[0];
            assert!((disc(&shaped) - want).abs() < 1e-9, "gamma {gamma}");
        }
    }

    /// A chain 0..=N: actions left / stay / right; entering N ends the episode with reward 1.
    /// Returns the greedy action per non-terminal state after value iteration, with the
    /// transition reward given by `shape` for Phi(s) = s / N.
    fn optimal_actions(n: usize, gamma: f64, shaping: Option<Shaping>) -> Vec<i32> {
        let phi = |s: usize| s as f64 / n as f64;
        let reward = |s: usize, s2: usize| {
            let r = if s2 == n { 1.0 } else { 0.0 };
            match &shaping {
                None => r,
                Some(sh) => shape(&[r], &[phi(s), phi(s2)], sh)[0],
            }
        };
        let step = |s: usize, a: i32| (s as i32 + a).clamp(0, n as i32) as usize;
        let mut v = vec![0.0; n + 1];
        for _ in 0..5000 {
            let mut next = v.clone();
            for (s, slot) in next.iter_mut().enumerate().take(n) {
                *slot = [-1, 0, 1]
                    .iter()
                    .map(|&a| {
                        let s2 = step(s, a);
                        let cont = if s2 == n { 0.0 } else { gamma * v[s2] };
                        reward(s, s2) + cont
                    })
                    .fold(f64::NEG_INFINITY, f64::max);
            }
            v = next;
        }
        (0..n)
            .map(|s| {
                let q = |a: i32| {
                    let s2 = step(s, a);
                    reward(s, s2) + if s2 == n { 0.0 } else { gamma * v[s2] }
                };
                // Ties go to moving right (the order of preference below).
                *[1, 0, -1]
                    .iter()
                    .max_by(|&&a, &&b| q(a).partial_cmp(&q(b)).unwrap().then(a.cmp(&b)))
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn potential_shaping_keeps_the_optimum_and_progress_as_reward_lingers() {
        let (n, gamma) = (5, 0.95);
        let plain = optimal_actions(n, gamma, None);
        assert_eq!(plain, vec![1; n], "unshaped: always move towards the goal");
        let invariant = optimal_actions(
            n,
            gamma,
            Some(Shaping {
                gamma,
                kind: ShapingKind::Potential,
            }),
        );
        assert_eq!(
            invariant, plain,
            "potential-based shaping keeps the optimal policy"
        );
        let trap = optimal_actions(
            n,
            gamma,
            Some(Shaping {
                gamma,
                kind: ShapingKind::ProgressAsReward,
            }),
        );
        // Being paid Phi every step, the agent stays next to the goal instead of finishing.
        assert_eq!(trap[n - 1], 0, "progress-as-reward lingers: {trap:?}");
        assert!(trap.iter().all(|&a| a != -1));
    }

    #[test]
    fn bad_gamma_is_refused() {
        for gamma in [0.0, 1.5, f64::NAN] {
            let s = Shaping {
                gamma,
                kind: ShapingKind::Potential,
            };
            assert!(s.validate().is_err());
        }
    }
}
