//! Rewards a learner optimises, computed from finished episodes. Learners take any
//! [`RewardModule`]; the default is the environment's own outcome ([`OutcomeReward`]), learned
//! progress and process rewards (the reward crate) plug in through the same trait.

use serde::{Deserialize, Serialize};

use crate::episode::Episode;

/// What a reward module says about one episode.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EpisodeRewards {
    /// The outcome R of the episode (one number per rollout).
    pub outcome: f64,
    /// Optional per-step rewards r_t, one per environment step of the episode.
    pub per_step: Option<Vec<f64>>,
    /// Optional progress Phi(s_0) .. Phi(s_T) of a progress model, one more entry than the
    /// episode has steps (the final state last); learners may use it as a value feature.
    pub potential: Option<Vec<f64>>,
}

/// A reward module that could not score an episode (a learned model's NaN output, an
/// observation it was not trained for): the message says what and where.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct RewardFailure(pub String);

/// Turns finished episodes into the rewards a learner optimises.
pub trait RewardModule: Send + Sync {
    /// A short name for logs and metrics.
    fn name(&self) -> String;
    /// Rewards of one finished episode. Non-finite values are the learner's to reject.
    fn rewards(&self, episode: &Episode) -> Result<EpisodeRewards, RewardFailure>;
    /// Adjusts the rewards of a group of rollouts that started from the same state, once each
    /// has been scored (self-referential rewards compare group members); default: unchanged.
    fn refine_group(
        &self,
        _episodes: &[&Episode],
        _rewards: &mut [EpisodeRewards],
    ) -> Result<(), RewardFailure> {
        Ok(())
    }
}

/// Which episode statistic is the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The highest task score reached (Push-T: coverage of the goal), in [0, 1].
    #[default]
    Score,
    /// 1 when the task was solved at any step, else 0.
    Success,
    /// The sum of the environment's rewards.
    Return,
}

/// The environment's verifiable outcome; per-step rewards are the environment's rewards.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OutcomeReward {
    /// The statistic used as outcome.
    pub outcome: Outcome,
    /// Added to the outcome of successful episodes (0 = none).
    pub success_bonus: f64,
    /// Subtracted from the outcome per environment step of the episode (0 = none). Where success
    /// ends the episode it ranks successes by how fast they came, and it leaves the order of
    /// failures that all ran to the time limit unchanged.
    pub time_cost: f64,
}

impl RewardModule for OutcomeReward {
    fn name(&self) -> String {
        format!("{:?}", self.outcome).to_lowercase()
    }

    fn rewards(&self, ep: &Episode) -> Result<EpisodeRewards, RewardFailure> {
        let base = match self.outcome {
            Outcome::Score => f64::from(ep.max_score()),
            Outcome::Success => f64::from(u8::from(ep.success())),
            Outcome::Return => f64::from(ep.total_reward()),
        };
        let bonus = if ep.success() {
            self.success_bonus
        } else {
            0.0
        };
        Ok(EpisodeRewards {
            outcome: base + bonus - self.time_cost * ep.len() as f64,
            per_step: Some(ep.rewards.iter().map(|&r| f64::from(r)).collect()),
            potential: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::Observation;

    fn episode(scores: &[f32], success_at: Option<usize>) -> Episode {
        let mut ep = Episode::default();
        for (t, &s) in scores.iter().enumerate() {
            let obs = Observation {
                state: vec![0.0],
                ..Default::default()
            };
            ep.push(obs, vec![0.0], s / 2.0, s, Some(t) == success_at);
        }
        ep
    }

    #[test]
    fn outcomes_read_the_episode() {
        let ep = episode(&[0.1, 0.7, 0.4], None);
        let r = |outcome, success_bonus| {
            OutcomeReward {
                outcome,
                success_bonus,
                time_cost: 0.0,
            }
            .rewards(&ep)
            .unwrap()
        };
        assert!((r(Outcome::Score, 1.0).outcome - 0.7).abs() < 1e-6);
        assert_eq!(r(Outcome::Success, 1.0).outcome, 0.0);
        assert!((r(Outcome::Return, 0.0).outcome - 0.6).abs() < 1e-6);
        assert_eq!(r(Outcome::Score, 0.0).per_step.unwrap().len(), 3);
        let won = episode(&[0.2, 0.96], Some(1));
        let r = OutcomeReward {
            outcome: Outcome::Success,
            success_bonus: 0.5,
            time_cost: 0.0,
        };
        assert_eq!(r.rewards(&won).unwrap().outcome, 1.5);
        // The time cost charges every step the episode ran: the same success a step later is
        // worth time_cost less, and a failure pays for all of its steps.
        let r = |time_cost, ep: &Episode| {
            OutcomeReward {
                outcome: Outcome::Success,
                success_bonus: 0.0,
                time_cost,
            }
            .rewards(ep)
            .unwrap()
            .outcome
        };
        let slow = episode(&[0.2, 0.5, 0.96], Some(2));
        assert!((r(0.1, &won) - 0.8).abs() < 1e-12);
        assert!((r(0.1, &slow) - 0.7).abs() < 1e-12);
        assert!((r(0.1, &ep) + 0.3).abs() < 1e-12);
        assert_eq!(r(0.0, &slow), 1.0);
    }
}
