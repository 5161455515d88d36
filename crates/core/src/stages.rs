//! Subtask stages of a task, for stage-budget progress labels (docs/algorithms.md §4): an
//! environment says, from one state observation, how many of its ordered stages are complete.

/// Ordered subtasks of a task, judged from a state observation.
pub trait StagePredicates: Send + Sync {
    /// Stage names, in order (e.g. Push-T: reach the block, align orientation, align position).
    fn names(&self) -> Vec<String>;
    /// How many leading stages `state` completes (0..=names().len()).
    fn completed(&self, state: &[f32]) -> usize;
}

/// Stages completed along a trajectory of states, made monotone (a stage once completed stays
/// completed; a later stage is never counted before the earlier ones).
pub fn stage_sequence(stages: &dyn StagePredicates, states: &[Vec<f32>]) -> Vec<usize> {
    let mut best = 0;
    states
        .iter()
        .map(|s| {
            best = best.max(stages.completed(s));
            best
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Threshold;
    impl StagePredicates for Threshold {
        fn names(&self) -> Vec<String> {
            vec!["a".into(), "b".into()]
        }
        fn completed(&self, s: &[f32]) -> usize {
            usize::from(s[0] > 1.0) + usize::from(s[0] > 1.0 && s[1] > 1.0)
        }
    }

    #[test]
    fn stages_never_go_back() {
        let states = [[0.0, 0.0], [2.0, 0.0], [0.0, 0.0], [2.0, 2.0], [0.0, 0.0]];
        let v: Vec<Vec<f32>> = states.iter().map(|s| s.to_vec()).collect();
        assert_eq!(stage_sequence(&Threshold, &v), vec![0, 1, 1, 2, 2]);
    }
}
