//! Tasks: what a simulator crate implements, once, so that every tool (`diffrl sim`, `demos`,
//! `run`, `eval --randomize`, ...) can use it without naming it.
//!
//! A task is one [`Task`] implementation: the schema of its `[env]` and `[expert]` config
//! tables, how to build its environment from `[env]`, its expert, its stage predicates, how it
//! draws a recorded state and which part of `[env]` is its domain randomisation. Tools hold
//! tasks type-erased ([`DynTask`](crate::dyn_task::DynTask), [`DynEnv`](crate::dyn_env::DynEnv))
//! and find them by name in a [`TaskRegistry`](crate::dyn_task::TaskRegistry).
//! docs/adding-a-task.md walks through adding one.

use std::fmt::Debug;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::Validate;
use crate::env::{Env, StepResult};
use crate::error::EnvError;
use crate::seeding::Rng;
use crate::space::Observation;
use crate::stages::StagePredicates;

/// A config table of a task (`[env]`, `[expert]`): read from and written back to TOML, checked
/// by [`Validate`]. `Default` is what an omitted table means, and (with `#[serde(default)]` on
/// the struct) what an omitted key inside the table means: one meaning per setting.
pub trait Section:
    Serialize
    + DeserializeOwned
    + Validate
    + Default
    + Clone
    + PartialEq
    + Debug
    + Send
    + Sync
    + 'static
{
}

impl<T> Section for T where
    T: Serialize
        + DeserializeOwned
        + Validate
        + Default
        + Clone
        + PartialEq
        + Debug
        + Send
        + Sync
        + 'static
{
}

/// A task without an expert uses this as its `[expert]` table (no keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoExpert {}

impl Validate for NoExpert {
    fn validate(&self) -> Result<(), crate::config::Invalid> {
        Ok(())
    }
}

/// How a task's episodes are described in datasets (LeRobot `meta/info.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct DatasetInfo {
    /// Control steps per second.
    pub fps: u32,
    /// LeRobot's `robot_type`.
    pub robot_type: String,
    /// Names of the recorded state's components ([`TaskEnv::true_state`]).
    pub state_names: Vec<String>,
    /// Names of the action's components.
    pub action_names: Vec<String>,
    /// The instruction stored with every episode.
    pub instruction: String,
}

/// A task: one implementation per simulator crate, registered by name in the CLI's task list.
///
/// Only [`Task::name`], [`Task::dataset`] and [`Task::build`] are required; the rest default to
/// "this task does not have it" (no expert, no stages, no images, no randomisation).
pub trait Task: Send + Sync + 'static {
    /// The `[env]` table: everything that decides how an environment is built (observation
    /// mode, step limit, domain randomisation).
    type Config: Section;
    /// The `[expert]` table ([`NoExpert`] for a task without one).
    type ExpertConfig: Section;
    /// The environment.
    type Env: TaskEnv;

    /// The name configs and commands use (`task = "pusht"`, `diffrl sim pusht`).
    fn name(&self) -> &'static str;
    /// How episodes are stored in datasets.
    fn dataset(&self) -> DatasetInfo;
    /// How episodes of an environment of `config` are stored, where the layout depends on it
    /// (a driving scene's agent count); default: [`Task::dataset`].
    fn dataset_for(&self, config: &Self::Config) -> DatasetInfo {
        let _ = config;
        self.dataset()
    }
    /// A fresh environment for `config`.
    fn build(&self, config: &Self::Config) -> Self::Env;

    /// What the environment observes, in a word (`"state"`, `"keypoints"`, `"pixels"`): shown
    /// in messages and part of the fingerprints of stages that depend on it.
    fn observation(&self, config: &Self::Config) -> String {
        let _ = config;
        "state".into()
    }
    /// The observation the environment would give at a recorded state ([`TaskEnv::true_state`]
    /// as stored in datasets), so policies and reward models train on what they will observe.
    /// An error says why this state cannot be converted.
    fn observe_recorded(&self, config: &Self::Config, state: &[f32]) -> Result<Vec<f32>, String> {
        let _ = config;
        Ok(state.to_vec())
    }
    /// Values of a recorded state that the observation shows but does not spell out (the
    /// objects' positions in a camera image, the goal an instruction names), which behaviour
    /// cloning can ask the encoders to recover as an auxiliary target (`[policy.encoder]
    /// aux_weight`). Empty (the default): the task names none. Used only in training: the
    /// policy never reads them.
    fn privileged_recorded(
        &self,
        config: &Self::Config,
        state: &[f32],
    ) -> Result<Vec<f32>, String> {
        let _ = (config, state);
        Ok(Vec::new())
    }
    /// Side of the images [`Task::render_state`] draws for `config` (None: no images).
    fn image_size(&self, config: &Self::Config) -> Option<u32> {
        let _ = config;
        None
    }
    /// The key of the sub-table of `[env]` that holds the domain randomisation (`"randomize"`),
    /// whose fields robustness sweeps vary one at a time; None: nothing to randomise.
    fn randomization_key(&self) -> Option<&'static str> {
        None
    }
    /// Why changing only the randomisation `fields` cannot change what an environment of
    /// `config` shows its policy (e.g. image tint for a state policy), or None if it can.
    fn unobserved(&self, config: &Self::Config, fields: &[String]) -> Option<String> {
        let _ = (config, fields);
        None
    }

    /// The expert of `config`, seeded with `seed` (reset at every episode start); None: the task
    /// has no expert.
    fn expert(&self, config: &Self::ExpertConfig, seed: u64) -> Option<Box<dyn Expert<Self::Env>>> {
        let _ = (config, seed);
        None
    }
    /// The expert's name in reports (`Pusher`, `Mppi`).
    fn expert_name(&self, config: &Self::ExpertConfig) -> String {
        let _ = config;
        "none".into()
    }
    /// Ordered subtasks of an environment of `config`, for stage-budget progress labels
    /// (docs/algorithms.md §4), judged from recorded states or observations.
    fn stages(&self, config: &Self::Config) -> Option<Box<dyn StagePredicates>> {
        let _ = config;
        None
    }
    /// Every instruction an observation of an environment of `config` can carry as its text
    /// (all paraphrases): a language-conditioned policy's vocabulary holds their words beside
    /// those of its training episodes, so evaluation and serving understand every instruction
    /// the task says, also when the demonstrations did not show each paraphrase. Empty: the
    /// task observes no text.
    fn texts(&self, config: &Self::Config) -> Vec<String> {
        let _ = config;
        Vec::new()
    }
    /// An RGB image (`size` x `size`, row-major) of a recorded state or observation, for image
    /// reward models trained on state datasets. An error says why it cannot be drawn.
    fn render_state(&self, state: &[f32], size: u32) -> Result<Vec<u8>, String> {
        let _ = (state, size);
        Err(format!("task {} draws no images", self.name()))
    }
    /// A cheap scripted action for `diffrl bench --workload push` (Push-T: at the block, with
    /// noise from `rng`); None: the task has no such workload.
    fn scripted_action(&self, env: &Self::Env, rng: &mut Rng) -> Option<Vec<f32>> {
        let _ = (env, rng);
        None
    }
}

/// What tools need from a task's environment beyond [`Env`].
pub trait TaskEnv: Env + 'static {
    /// The full, noise-free state that datasets record as `observation.state` and
    /// `diffrl sim --json` prints (Push-T: agent x, y, block x, y, angle).
    fn true_state(&self) -> Vec<f64>;

    /// Starts an episode from a full state (`diffrl sim --init-state`), seeding what else the
    /// episode draws with `seed`.
    fn reset_to_state(&mut self, state: &[f64], seed: u64) -> Result<Observation, EnvError> {
        let _ = (state, seed);
        Err(EnvError::InvalidState(
            "this task cannot start from a given state".into(),
        ))
    }

    /// Named parts of the current state that `diffrl sim --json` prints beside `state` (an
    /// arm: `ee_pose`, `cube_pose`), each a flat list of numbers; empty: none.
    fn named_state(&self) -> Vec<(&'static str, Vec<f64>)> {
        Vec::new()
    }

    /// One line about the step that executed `action` and gave `result` (`diffrl sim` without
    /// --json), after the state it led to.
    fn describe_step(&self, action: &[f32], result: &StepResult) -> String {
        format!(
            "action {action:?}  state {:?}  score {:.3}{}",
            self.true_state(),
            result.info.score,
            if result.info.success { "  SUCCESS" } else { "" }
        )
    }
}

/// A scripted demonstrator for environments of type `E`.
pub trait Expert<E>: Send {
    /// Forgets what it kept from the last episode; reseeds its noise with `seed`.
    fn reset(&mut self, seed: u64);
    /// Its action at `env`'s current state.
    fn act(&mut self, env: &E) -> Vec<f32>;
}
