//! diffrl-core: what every other diffrl crate agrees on, and nothing task specific.
//!
//! - [`space`]: observation and action spaces with bounds (state vectors, images, text).
//! - [`env`]: the [`Env`] trait (seeded reset, step, snapshot/restore) every simulator implements.
//! - [`task`]: the [`task::Task`] trait a simulator crate implements once to become a task of the
//!   tools (config tables, expert, stages, rendering, randomisation axes).
//! - [`dyn_task`]: tasks held by name ([`dyn_task::TaskRegistry`]) and their type-erased config
//!   tables ([`dyn_task::EnvSection`], [`dyn_task::ExpertSection`]).
//! - [`dyn_env`]: any task's environment and expert behind one type ([`dyn_env::DynEnv`]).
//! - [`vec_env`]: [`VecEnv`], N environments stepped in parallel with autoreset.
//! - [`episode`]: episode and rollout storage.
//! - [`normalize`]: running statistics and normalisers stored with models.
//! - [`reward`]: the [`reward::RewardModule`] trait learners optimise, and the env outcome.
//! - [`config`]: TOML loading with unknown-key rejection and validation errors naming field and file.
//! - [`run_dir`]: `runs/<name>/` folders with a config copy and an append-only `metrics.jsonl`.
//! - [`lerobot`]: LeRobot v3.0 dataset folders (write and read).
//! - [`seeding`]: deterministic seed derivation.
//! - [`shards`]: a batch cut into near-equal runs of rows, one per thread.
//! - [`stats`]: the statistics reports quote (Wilson intervals, exact McNemar, paired intervals,
//!   quantiles), each with its formula.
//! - [`fs`]: atomic file writes (temp file + rename).
//! - [`scene`]: what a simulator hands to a recorder to be drawn ([`scene::Scene`]): 2-D shapes,
//!   3-D bodies with transforms, camera images.
//! - [`record`]: the [`record::Recorder`] trait (viewer logging) and its no-op.
#![warn(missing_docs)]

pub mod config;
pub mod dyn_env;
pub mod dyn_task;
pub mod env;
pub mod episode;
pub mod error;
pub mod fs;
pub mod lerobot;
pub mod normalize;
pub mod record;
pub mod reward;
pub mod run_dir;
pub mod scene;
pub mod seeding;
pub mod shards;
pub mod space;
pub mod stages;
pub mod stats;
pub mod task;
pub mod vec_env;

pub use env::{Env, Info, StepResult};
pub use episode::{Episode, Rollout};
pub use error::{ConfigError, DatasetError, EnvError};
pub use space::{
    BoxSpace, EntityGroup, ImageObs, ImageSpace, Observation, ObservationSpace, check_entity_groups,
};
pub use vec_env::{AutoReset, VecEnv, VecStep};
