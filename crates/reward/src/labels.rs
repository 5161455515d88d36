//! Progress labels for training a progress model Phi(s) (docs/algorithms.md §4).
//!
//! - Time-normalised: p_t = t / (T - 1) over the T states of a successful trajectory.
//! - Stage budgets (ProcVLM-style; our reconstruction): stage j of the task gets a budget b_j
//!   (sum 1); inside stage j progress grows with the state change accumulated in that stage,
//!   p_t = sum_{l<j} b_l + b_j * C_t / C_end. A failed trajectory is labelled up to its last
//!   completed stage: inside the stage it never completed, progress stays at that stage's start.

use diffrl_core::stages::{StagePredicates, stage_sequence};
use serde::{Deserialize, Serialize};

use crate::error::RewardError;

/// Which labels train the progress model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LabelKind {
    /// t / (T - 1) on successful trajectories (failed ones are not used).
    Time,
    /// Stage budgets with within-stage state change; failed trajectories capped.
    #[default]
    Stages,
}

/// p_t = t / (T - 1) for a trajectory of `n` states (a single state gets 1).
pub fn time_labels(n: usize) -> Vec<f32> {
    if n <= 1 {
        return vec![1.0; n];
    }
    (0..n).map(|t| t as f32 / (n - 1) as f32).collect()
}

fn distance(a: &[f32], b: &[f32], scale: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .zip(scale)
        .map(|((x, y), s)| f64::from((x - y) / s).powi(2))
        .sum::<f64>()
        .sqrt()
}

/// Stage-budget labels for one trajectory of `states`. `budgets` has one entry per stage and
/// sums to 1; `scale` divides each state component before distances are taken (so positions
/// and angles count comparably); `success` marks a trajectory that finished the task (its last
/// state is then at progress 1 whatever the predicates say).
pub fn stage_labels(
    stages: &dyn StagePredicates,
    budgets: &[f64],
    states: &[Vec<f32>],
    scale: &[f32],
    success: bool,
) -> Result<Vec<f32>, RewardError> {
    let k = stages.names().len();
    if budgets.len() != k {
        return Err(RewardError::config(
            "stage_budgets",
            format!("{} budgets for {k} stages", budgets.len()),
        ));
    }
    if budgets.iter().any(|b| !b.is_finite() || *b <= 0.0)
        || (budgets.iter().sum::<f64>() - 1.0).abs() > 1e-6
    {
        return Err(RewardError::config(
            "stage_budgets",
            format!("must be positive and sum to 1, got {budgets:?}"),
        ));
    }
    let n = states.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut stage = stage_sequence(stages, states);
    if success {
        // The task is done at the end: whatever threshold a predicate uses, the final state is
        // complete, and stages the predicates missed on the way are treated as passed there.
        stage[n - 1] = k;
    }
    let start: Vec<f64> = (0..=k).map(|j| budgets[..j.min(k)].iter().sum()).collect();
    let mut labels = vec![0f32; n];
    let mut t = 0;
    while t < n {
        // The segment [t, end) spent in stage j (j stages completed).
        let j = stage[t];
        let mut end = t;
        while end < n && stage[end] == j {
            end += 1;
        }
        if j >= k {
            labels[t..end].fill(1.0);
            t = end;
            continue;
        }
        // The stage completes at `end` (if the trajectory gets there): progress grows from
        // start[j] to start[j + 1] in proportion to the state change accumulated until then.
        let completes = end < n;
        let last = if completes { end } else { end - 1 };
        let mut acc = vec![0f64; last - t + 1];
        for i in t..last {
            acc[i - t + 1] = acc[i - t] + distance(&states[i], &states[i + 1], scale);
        }
        let total = acc[last - t];
        for i in t..end {
            let frac = if !completes {
                0.0
            } else if total > 1e-12 {
                acc[i - t] / total
            } else {
                (i - t) as f64 / (end - t) as f64
            };
            labels[i] = (start[j] + budgets[j] * frac) as f32;
        }
        t = end;
    }
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stage 1 when x > 1, stage 2 when also y > 1.
    struct Two;
    impl StagePredicates for Two {
        fn names(&self) -> Vec<String> {
            vec!["x".into(), "y".into()]
        }
        fn completed(&self, s: &[f32]) -> usize {
            usize::from(s[0] > 1.0) + usize::from(s[0] > 1.0 && s[1] > 1.0)
        }
    }

    fn traj(points: &[[f32; 2]]) -> Vec<Vec<f32>> {
        points.iter().map(|p| p.to_vec()).collect()
    }

    #[test]
    fn time_labels_run_from_zero_to_one() {
        assert_eq!(time_labels(5), vec![0.0, 0.25, 0.5, 0.75, 1.0]);
        assert_eq!(time_labels(1), vec![1.0]);
        assert!(time_labels(0).is_empty());
    }

    #[test]
    fn stage_labels_hand_example() {
        // Stage 0 over x 0 -> 2 (steps of 0.5, 1.5: budget 0.4 split 0.25 / 0.75), then stage 1
        // over y 0 -> 2 in equal steps, success at the end.
        let s = traj(&[[0.0, 0.0], [0.5, 0.0], [2.0, 0.0], [2.0, 1.0], [2.0, 2.0]]);
        let l = stage_labels(&Two, &[0.4, 0.6], &s, &[1.0, 1.0], true).unwrap();
        let want = [0.0, 0.1, 0.4, 0.7, 1.0];
        for (a, b) in l.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{l:?}");
        }
    }

    #[test]
    fn failed_trajectories_stop_at_their_last_completed_stage() {
        let s = traj(&[[0.0, 0.0], [2.0, 0.0], [2.0, 0.5], [2.0, 0.9]]);
        let l = stage_labels(&Two, &[0.4, 0.6], &s, &[1.0, 1.0], false).unwrap();
        assert_eq!(l, vec![0.0, 0.4, 0.4, 0.4]);
        // Never leaving stage 0: flat at 0.
        let s = traj(&[[0.0, 0.0], [0.5, 0.0]]);
        assert_eq!(
            stage_labels(&Two, &[0.4, 0.6], &s, &[1.0, 1.0], false).unwrap(),
            vec![0.0, 0.0]
        );
    }

    #[test]
    fn labels_are_monotone_and_bad_budgets_are_refused() {
        let s = traj(&[[0.0, 0.0], [3.0, 0.0], [0.0, 0.0], [2.0, 2.0], [2.0, 2.0]]);
        let l = stage_labels(&Two, &[0.5, 0.5], &s, &[1.0, 1.0], true).unwrap();
        assert!(l.windows(2).all(|w| w[1] >= w[0]), "{l:?}");
        assert!(stage_labels(&Two, &[0.5], &s, &[1.0, 1.0], true).is_err());
        assert!(stage_labels(&Two, &[0.7, 0.7], &s, &[1.0, 1.0], true).is_err());
    }
}
