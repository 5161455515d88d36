//! Self-referential rewards for failed rollouts (SRPO-style; docs/algorithms.md §4): inside a group
//! of rollouts from the same initial state, a failed rollout's outcome becomes
//! f(d) = max_outcome_of_failures_allowed * exp(-d / length_scale), d = distance of its final
//! state to the nearest successful rollout's final state, so near misses are ranked above far
//! misses while every failure stays below every success. Groups without a success are left as
//! they are.

use diffrl_core::config::{Invalid, Validate};
use diffrl_core::episode::Episode;
use diffrl_core::reward::{EpisodeRewards, RewardFailure, RewardModule};
use serde::{Deserialize, Serialize};

use crate::error::RewardError;

/// SRPO settings (`[reward.srpo]`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SrpoConfig {
    /// Distance (state units) at which a failure's reward falls to 1/e of the cap.
    pub length_scale: f64,
    /// The reward of a failure that ends exactly where a success ended, as a fraction of the
    /// lowest successful outcome in the group (in (0, 1)).
    pub cap: f64,
}

impl Default for SrpoConfig {
    fn default() -> Self {
        Self {
            length_scale: 50.0,
            cap: 0.5,
        }
    }
}

impl Validate for SrpoConfig {
    /// Checks the settings.
    fn validate(&self) -> Result<(), Invalid> {
        if !(self.length_scale.is_finite() && self.length_scale > 0.0) {
            return Err(Invalid::new("length_scale", "must be > 0"));
        }
        if !(self.cap > 0.0 && self.cap < 1.0) {
            return Err(Invalid::new("cap", "must be in (0, 1)"));
        }
        Ok(())
    }
}

/// f(d) for each member: `finals[i]` is rollout i's final state, `success[i]` its outcome flag,
/// `outcomes[i]` its current outcome. Returns the new outcomes.
pub fn srpo_outcomes(
    finals: &[&[f32]],
    success: &[bool],
    outcomes: &[f64],
    cfg: &SrpoConfig,
) -> Vec<f64> {
    let wins: Vec<usize> = (0..finals.len()).filter(|&i| success[i]).collect();
    if wins.is_empty() {
        return outcomes.to_vec();
    }
    let floor = wins
        .iter()
        .map(|&i| outcomes[i])
        .fold(f64::INFINITY, f64::min);
    (0..finals.len())
        .map(|i| {
            if success[i] {
                return outcomes[i];
            }
            let d = wins
                .iter()
                .map(|&j| {
                    finals[i]
                        .iter()
                        .zip(finals[j])
                        .map(|(a, b)| f64::from(a - b).powi(2))
                        .sum::<f64>()
                        .sqrt()
                })
                .fold(f64::INFINITY, f64::min);
            cfg.cap * floor * (-d / cfg.length_scale).exp()
        })
        .collect()
}

/// Another module's rewards with SRPO outcomes for failed group members.
pub struct SrpoReward {
    base: Box<dyn RewardModule>,
    cfg: SrpoConfig,
}

impl SrpoReward {
    /// Wraps `base`.
    pub fn new(base: Box<dyn RewardModule>, cfg: SrpoConfig) -> Result<Self, RewardError> {
        cfg.validate().map_err(|e| e.within("srpo"))?;
        Ok(Self { base, cfg })
    }
}

fn final_state(ep: &Episode) -> &[f32] {
    ep.final_observation
        .as_ref()
        .or(ep.observations.last())
        .map_or(&[], |o| o.state.as_slice())
}

impl RewardModule for SrpoReward {
    fn name(&self) -> String {
        format!("{}+srpo", self.base.name())
    }

    fn rewards(&self, ep: &Episode) -> Result<EpisodeRewards, RewardFailure> {
        self.base.rewards(ep)
    }

    fn refine_group(
        &self,
        episodes: &[&Episode],
        rewards: &mut [EpisodeRewards],
    ) -> Result<(), RewardFailure> {
        self.base.refine_group(episodes, rewards)?;
        let finals: Vec<&[f32]> = episodes.iter().map(|e| final_state(e)).collect();
        let success: Vec<bool> = episodes.iter().map(|e| e.success()).collect();
        let outcomes: Vec<f64> = rewards.iter().map(|r| r.outcome).collect();
        for (r, o) in rewards
            .iter_mut()
            .zip(srpo_outcomes(&finals, &success, &outcomes, &self.cfg))
        {
            r.outcome = o;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_misses_outrank_far_misses_and_never_a_success() {
        let cfg = SrpoConfig {
            length_scale: 10.0,
            cap: 0.5,
        };
        let finals: [&[f32]; 4] = [&[0.0, 0.0], &[3.0, 4.0], &[30.0, 40.0], &[100.0, 0.0]];
        let out = srpo_outcomes(
            &finals,
            &[true, false, false, false],
            &[2.0, 0.9, 0.9, 0.9],
            &cfg,
        );
        assert_eq!(out[0], 2.0);
        assert!((out[1] - 0.5 * 2.0 * (-0.5f64).exp()).abs() < 1e-12);
        assert!(out[1] > out[2] && out[2] > out[3] && out[3] > 0.0);
        assert!(out[1..].iter().all(|&o| o < 2.0));
        // No success in the group: unchanged.
        let same = srpo_outcomes(&finals, &[false; 4], &[0.1, 0.2, 0.3, 0.4], &cfg);
        assert_eq!(same, vec![0.1, 0.2, 0.3, 0.4]);
        assert!(SrpoConfig { cap: 1.0, ..cfg }.validate().is_err());
    }
}
