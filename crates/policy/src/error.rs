//! Errors of policy construction, inputs and checkpoints.

use std::path::PathBuf;

/// What went wrong building or querying a policy.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The configuration is out of range.
    #[error("invalid policy config: {field}: {message}")]
    Config {
        /// Dotted field path.
        field: String,
        /// What is allowed.
        message: String,
    },
    /// An input has the wrong size.
    #[error("{what}: expected {expected} values, got {got}")]
    Shape {
        /// Which input.
        what: String,
        /// Expected length.
        expected: usize,
        /// Actual length.
        got: usize,
    },
    /// An input holds NaN or infinity.
    #[error("{what}: non-finite value {value} at batch index {index}")]
    NonFinite {
        /// Which input.
        what: String,
        /// Batch element.
        index: usize,
        /// The value.
        value: f32,
    },
    /// The policy needs an input the observation lacks.
    #[error("{0}")]
    Missing(String),
    /// The instruction of a batch row cannot be read by the policy.
    #[error("observation.text of batch row {row}: {source}")]
    Text {
        /// Batch row.
        row: usize,
        /// What is wrong with it.
        source: crate::tokenizer::TextError,
    },
}

/// What went wrong saving or loading a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// File-system error.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The metadata JSON does not parse or has an unknown format.
    #[error("{path}: not a diffrl policy checkpoint: {message}")]
    Meta {
        /// The metadata file.
        path: PathBuf,
        /// The parse error.
        message: String,
    },
    /// The stored config is invalid.
    #[error("{path}: {source}")]
    Policy {
        /// The metadata file.
        path: PathBuf,
        /// The cause.
        source: PolicyError,
    },
    /// The weights do not fit the architecture the config describes.
    #[error("{path}: weights do not match the checkpoint's architecture: {message}")]
    Mismatch {
        /// The weights file.
        path: PathBuf,
        /// Which tensors differ.
        message: String,
    },
    /// The vocabulary of a language-conditioned policy is missing, unreadable or does not fit
    /// its token embedding.
    #[error("{path}: {message}")]
    Vocabulary {
        /// The vocabulary file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The weights file is not valid safetensors.
    #[error("{path}: corrupt weights file: {message}")]
    Corrupt {
        /// The weights file.
        path: PathBuf,
        /// The decoder's message.
        message: String,
    },
}
