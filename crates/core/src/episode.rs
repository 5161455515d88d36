//! Episode and rollout storage: what a policy saw, did and got, one entry per control step.

use crate::space::Observation;

/// One episode. `observations[t]` is the observation the action `actions[t]` was chosen from;
/// `rewards[t]`, `scores[t]` and `successes[t]` are what that action produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Episode {
    /// The seed of the reset that started the episode, when known.
    pub seed: Option<u64>,
    /// Observations before each action (length = number of steps).
    pub observations: Vec<Observation>,
    /// Actions taken.
    pub actions: Vec<Vec<f32>>,
    /// Rewards received.
    pub rewards: Vec<f32>,
    /// Task score after each step.
    pub scores: Vec<f32>,
    /// Success flag after each step.
    pub successes: Vec<bool>,
    /// The episode ended by termination (not truncation).
    pub terminated: bool,
    /// The episode was truncated by the step limit.
    pub truncated: bool,
    /// Task instruction, for language-conditioned tasks.
    pub task: Option<String>,
    /// The observation after the last action, when recorded (progress shaping needs
    /// Phi(s_T)).
    pub final_observation: Option<Observation>,
}

impl Episode {
    /// Number of steps.
    pub fn len(&self) -> usize {
        self.actions.len()
    }

    /// Whether no step was recorded.
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }

    /// Appends one transition.
    pub fn push(
        &mut self,
        obs: Observation,
        action: Vec<f32>,
        reward: f32,
        score: f32,
        success: bool,
    ) {
        self.observations.push(obs);
        self.actions.push(action);
        self.rewards.push(reward);
        self.scores.push(score);
        self.successes.push(success);
    }

    /// Whether the task was solved at any step.
    pub fn success(&self) -> bool {
        self.successes.iter().any(|&s| s)
    }

    /// The best score reached (gym-pusht's "max reward" metric uses the reward instead).
    pub fn max_score(&self) -> f32 {
        self.scores.iter().copied().fold(0.0, f32::max)
    }

    /// The best reward reached.
    pub fn max_reward(&self) -> f32 {
        self.rewards.iter().copied().fold(0.0, f32::max)
    }

    /// Sum of rewards.
    pub fn total_reward(&self) -> f32 {
        self.rewards.iter().sum()
    }
}

/// A batch of finished episodes, e.g. one iteration of rollouts.
#[derive(Debug, Clone, Default)]
pub struct Rollout {
    /// The episodes, in completion order.
    pub episodes: Vec<Episode>,
}

impl Rollout {
    /// Fraction of successful episodes.
    pub fn success_rate(&self) -> f64 {
        if self.episodes.is_empty() {
            return 0.0;
        }
        self.episodes.iter().filter(|e| e.success()).count() as f64 / self.episodes.len() as f64
    }

    /// Total number of steps.
    pub fn steps(&self) -> usize {
        self.episodes.iter().map(Episode::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn episode_metrics() {
        let mut e = Episode::default();
        e.push(Observation::state(vec![0.0]), vec![1.0], 0.2, 0.19, false);
        e.push(Observation::state(vec![1.0]), vec![1.0], 1.0, 0.96, true);
        assert_eq!(e.len(), 2);
        assert!(e.success());
        assert_eq!(e.max_score(), 0.96);
        assert!((e.total_reward() - 1.2).abs() < 1e-6);
        let r = Rollout {
            episodes: vec![e, Episode::default()],
        };
        assert_eq!(r.success_rate(), 0.5);
        assert_eq!(r.steps(), 2);
    }
}
