//! Errors of training and evaluation.

use std::path::PathBuf;

use diffrl_core::EnvError;
use diffrl_policy::{CheckpointError, PolicyError};

/// What went wrong while learning or evaluating.
#[derive(Debug, thiserror::Error)]
pub enum LearnError {
    /// The dataset cannot train this policy.
    #[error("dataset: {0}")]
    Data(String),
    /// A policy input or configuration problem.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A checkpoint could not be written or read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The source of actions failed (e.g. a remote policy server).
    #[error("actor: {0}")]
    Actor(String),
    /// The environment refused a step.
    #[error("environment: {0}")]
    Env(#[from] EnvError),
    /// File-system error.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Training diverged.
    #[error("training diverged at step {step}: loss is {loss}")]
    Diverged {
        /// Optimiser step.
        step: usize,
        /// The loss value.
        loss: f64,
    },
    /// A resume point belongs to another run.
    #[error("{0}")]
    Resume(String),
    /// A training worker thread could not start, or one of its jobs panicked.
    #[error("worker thread: {0}")]
    Worker(String),
}
