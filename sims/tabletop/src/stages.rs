//! Ordered subtasks of the tabletop tasks for stage-budget progress labels
//! (docs/algorithms.md §4), judged from a recorded state ([`TaskKind::state_names`]). A state
//! completes as many stages as its furthest satisfied predicate (a cube resting on the goal
//! completes "grasp" and "lift" too).

use diffrl_core::stages::StagePredicates;

use crate::env::{PICK_GOAL_THRESHOLD, PUSH_GOAL_RADIUS, REACH_THRESHOLD, TaskKind, layout};
use crate::world::CUBE_HALF;

/// The stage predicates of a `kind` task.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TabletopStages {
    /// Which task.
    pub kind: TaskKind,
    /// The TCP counts as at a cube within this distance of its centre (m).
    pub reach: f64,
    /// A cube counts as lifted this far above resting on the table (m).
    pub lift: f64,
}

impl TabletopStages {
    /// The default thresholds for `kind`: reach within 2 cm, lift by 1 cm.
    pub fn new(kind: TaskKind) -> Self {
        Self {
            kind,
            reach: 0.02,
            lift: 0.01,
        }
    }
}

fn get3(s: &[f32], o: usize) -> [f64; 3] {
    [s[o], s[o + 1], s[o + 2]].map(f64::from)
}

fn dist(a: [f64; 3], b: [f64; 3]) -> f64 {
    ((a[0] - b[0]).powi(2) + (a[1] - b[1]).powi(2) + (a[2] - b[2]).powi(2)).sqrt()
}

impl StagePredicates for TabletopStages {
    fn names(&self) -> Vec<String> {
        match self.kind {
            TaskKind::ReachGoal => vec!["reach the goal"],
            TaskKind::PushCube => vec!["reach the cube", "push it onto the goal"],
            TaskKind::PickCube => vec!["reach the cube", "grasp", "lift", "hold it at the goal"],
            TaskKind::StackCube => vec!["reach cube A", "grasp A", "lift A", "place A on B"],
        }
        .into_iter()
        .map(String::from)
        .collect()
    }

    fn completed(&self, s: &[f32]) -> usize {
        if s.len() != self.kind.state_dim() {
            return 0;
        }
        let tcp = get3(s, layout::TCP);
        let opening = f64::from(s[layout::GRIPPER]);
        let goal = get3(s, s.len() - 3);
        if self.kind == TaskKind::ReachGoal {
            return usize::from(dist(tcp, goal) < REACH_THRESHOLD);
        }
        let cube = get3(s, layout::CUBES);
        let reached = dist(tcp, cube) < self.reach;
        // Closed onto the cube: narrower than the open gripper, wider than an empty grip.
        let grasped = reached && opening > 0.03 && opening < 0.07;
        let lifted = grasped && cube[2] > CUBE_HALF + self.lift;
        let predicates: Vec<bool> = match self.kind {
            TaskKind::ReachGoal => unreachable!("handled above"),
            TaskKind::PushCube => {
                let d = (cube[0] - goal[0]).hypot(cube[1] - goal[1]);
                let behind = dist(tcp, [cube[0] - CUBE_HALF - 0.01, cube[1], cube[2]]) < 0.03;
                vec![behind, d < PUSH_GOAL_RADIUS && cube[2] < CUBE_HALF + 0.005]
            }
            TaskKind::PickCube => vec![
                reached,
                grasped,
                lifted,
                dist(cube, goal) <= PICK_GOAL_THRESHOLD,
            ],
            TaskKind::StackCube => {
                let b = get3(s, layout::CUBES + 7);
                let xy = (cube[0] - b[0]).hypot(cube[1] - b[1]);
                let on_b = xy <= (2.0 * CUBE_HALF * CUBE_HALF).sqrt() + 0.005
                    && (cube[2] - b[2] - 2.0 * CUBE_HALF).abs() <= 0.005;
                vec![reached, grasped, lifted, on_b && !grasped]
            }
        };
        predicates.iter().rposition(|&p| p).map_or(0, |i| i + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(
        kind: TaskKind,
        tcp: [f32; 3],
        opening: f32,
        cubes: &[[f32; 3]],
        goal: [f32; 3],
    ) -> Vec<f32> {
        let mut s = vec![0.0; kind.state_dim()];
        s[layout::TCP..layout::TCP + 3].copy_from_slice(&tcp);
        s[layout::GRIPPER] = opening;
        for (i, c) in cubes.iter().enumerate() {
            let o = layout::CUBES + 7 * i;
            s[o..o + 3].copy_from_slice(c);
            s[o + 6] = 1.0;
        }
        let n = s.len();
        s[n - 3..].copy_from_slice(&goal);
        s
    }

    #[test]
    fn pick_stages_follow_the_cube() {
        let st = TabletopStages::new(TaskKind::PickCube);
        let goal = [0.0, 0.0, 0.2];
        let far = state(
            TaskKind::PickCube,
            [0.1, 0.1, 0.2],
            0.08,
            &[[0.0, 0.0, 0.02]],
            goal,
        );
        assert_eq!(st.completed(&far), 0);
        let at = state(
            TaskKind::PickCube,
            [0.0, 0.0, 0.025],
            0.08,
            &[[0.0, 0.0, 0.02]],
            goal,
        );
        assert_eq!(st.completed(&at), 1);
        let closed = state(
            TaskKind::PickCube,
            [0.0, 0.0, 0.025],
            0.045,
            &[[0.0, 0.0, 0.02]],
            goal,
        );
        assert_eq!(st.completed(&closed), 2);
        let up = state(
            TaskKind::PickCube,
            [0.0, 0.0, 0.105],
            0.045,
            &[[0.0, 0.0, 0.1]],
            goal,
        );
        assert_eq!(st.completed(&up), 3);
        let there = state(
            TaskKind::PickCube,
            [0.0, 0.0, 0.205],
            0.045,
            &[[0.0, 0.0, 0.2]],
            goal,
        );
        assert_eq!(st.completed(&there), 4);
        assert_eq!(st.completed(&[0.0; 3]), 0);
    }

    #[test]
    fn stack_needs_a_released_cube_on_b() {
        let st = TabletopStages::new(TaskKind::StackCube);
        let b = [0.1, 0.0, 0.02];
        let held = state(
            TaskKind::StackCube,
            [0.1, 0.0, 0.065],
            0.045,
            &[[0.1, 0.0, 0.06], b],
            [0.0; 3],
        );
        assert_eq!(st.completed(&held), 3);
        let released = state(
            TaskKind::StackCube,
            [0.1, 0.0, 0.15],
            0.08,
            &[[0.1, 0.0, 0.06], b],
            [0.0; 3],
        );
        assert_eq!(st.completed(&released), 4);
    }
}
