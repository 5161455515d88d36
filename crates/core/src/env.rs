//! The environment trait every simulator implements. Learners and tools see environments only
//! through this trait; the CLI wires concrete simulators in.

use crate::EnvError;
use crate::scene::Scene2d;
use crate::space::{BoxSpace, Observation, ObservationSpace};

/// Diagnostics returned with every step.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Info {
    /// The task's score in [0, 1] (Push-T: coverage of the goal). Learners use it as the
    /// default outcome.
    pub score: f32,
    /// Whether the task is solved at this step.
    pub success: bool,
    /// Number of action components clamped into the action bounds at this step.
    pub clamped: usize,
    /// Episode-level measurements a task reports on the step that ends an episode (driving:
    /// `collision`, `off_road`, `progress`, `speed`), each a number per episode; evaluations
    /// average them (0/1 values as rates with Wilson intervals). Empty on other steps, and for
    /// tasks that report none.
    pub metrics: Vec<(&'static str, f64)>,
}

/// The outcome of one control step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepResult {
    /// Observation after the step.
    pub obs: Observation,
    /// Reward of the step.
    pub reward: f32,
    /// The episode ended inside the MDP (success or failure state).
    pub terminated: bool,
    /// The episode was cut by the step limit.
    pub truncated: bool,
    /// Diagnostics.
    pub info: Info,
}

/// A simulated task with seeded resets and exact snapshots.
///
/// Implementations must be deterministic: the same seed and actions give bit-identical
/// observations on the same machine, and `restore(snapshot())` continues identically.
pub trait Env: Send {
    /// Everything needed to continue the episode exactly (physics, step counter, RNG).
    type Snapshot: Clone + Send + Sync;

    /// What [`Env::reset`] and [`Env::step`] return.
    fn observation_space(&self) -> ObservationSpace;
    /// What [`Env::step`] accepts. Out-of-bounds actions are clamped and counted.
    fn action_space(&self) -> BoxSpace;
    /// Steps after which an episode is truncated.
    fn max_episode_steps(&self) -> usize;
    /// Starts a new episode drawn from the task's initial-state distribution with `seed`.
    fn reset(&mut self, seed: u64) -> Observation;
    /// Applies one control action. Non-finite actions are rejected without changing the state.
    fn step(&mut self, action: &[f32]) -> Result<StepResult, EnvError>;
    /// Captures the full state.
    fn snapshot(&self) -> Self::Snapshot;
    /// Returns to a captured state and gives its observation.
    fn restore(&mut self, snapshot: &Self::Snapshot) -> Observation;
    /// The current observation, without stepping.
    fn observe(&mut self) -> Observation;
    /// Number of steps taken in the current episode.
    fn elapsed_steps(&self) -> usize;
    /// A top view of the current state for a viewer (None: the task draws nothing). Called
    /// only while a recorder is on, so it may allocate.
    fn scene(&self) -> Option<Scene2d> {
        None
    }
    /// Cell size of each state dimension on the grid that groups states into GiGPO anchors
    /// (None: the learner's `gigpo_grid` must give one).
    fn anchor_cells(&self) -> Option<Vec<f32>> {
        None
    }
}
