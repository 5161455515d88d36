//! Error types shared by diffrl crates. Each carries what a user needs to fix the input.

use std::path::PathBuf;

/// Errors raised by an environment step or reset.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// An action contained NaN or infinity; the environment was left untouched.
    #[error(
        "action component {index} is {value} (not finite); the environment state was not changed"
    )]
    NonFiniteAction {
        /// Index of the offending component in the flat action.
        index: usize,
        /// The offending value.
        value: f32,
    },
    /// An action had the wrong number of components.
    #[error("action has {got} components, the action space expects {expected}")]
    ActionShape {
        /// Expected length.
        expected: usize,
        /// Received length.
        got: usize,
    },
    /// A reset state was malformed.
    #[error("invalid reset state: {0}")]
    InvalidState(String),
    /// `step` was called on an environment whose episode has ended.
    #[error("step called after the episode ended; call reset first")]
    EpisodeOver,
    /// A vectorised call received a batch of the wrong size.
    #[error("batch has {got} entries, the vector holds {expected} environments")]
    BatchSize {
        /// Number of environments.
        expected: usize,
        /// Entries received.
        got: usize,
    },
    /// The error of environment `index` inside a [`crate::VecEnv`].
    #[error("environment {index}: {source}")]
    InVector {
        /// Index of the environment in the vector.
        index: usize,
        /// The underlying error.
        #[source]
        source: Box<EnvError>,
    },
}

/// Errors loading or validating a configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Io {
        /// The config file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The TOML did not parse or did not match the schema (unknown key, wrong type).
    #[error("{path}: {key}: {message}")]
    Parse {
        /// The config file (or `<embedded>` for built-in configs).
        path: PathBuf,
        /// Dotted path of the offending key, `.` for the document root.
        key: String,
        /// What is wrong, with line and column where known.
        message: String,
    },
    /// A value parsed but is out of its allowed range.
    #[error("{path}: {field}: {message}")]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// Dotted path of the offending field.
        field: String,
        /// What is wrong and what is allowed.
        message: String,
    },
}

/// Errors reading or writing a dataset folder.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// File system error on a given file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file exists but its content is not what the layout requires.
    #[error("{path}: {message}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Data handed to the writer is inconsistent.
    #[error("invalid dataset content: {0}")]
    Invalid(String),
}
