//! Reward-model errors.

use std::path::PathBuf;

/// What can go wrong training, loading or applying a reward model.
#[derive(Debug, thiserror::Error)]
pub enum RewardError {
    /// Training data that cannot train the model.
    #[error("data: {0}")]
    Data(String),
    /// Observations of the wrong width or kind for the model.
    #[error("{what}: the reward model expects {expected}, got {got}")]
    Shape {
        /// What was checked.
        what: String,
        /// Expected size or kind.
        expected: String,
        /// What came.
        got: String,
    },
    /// The model produced a non-finite value.
    #[error("the reward model output {value} for batch element {index} ({what})")]
    NonFinite {
        /// Which call.
        what: String,
        /// Offending batch index.
        index: usize,
        /// The value.
        value: f32,
    },
    /// An invalid setting.
    #[error("invalid setting {field}: {message}")]
    Config {
        /// The setting.
        field: String,
        /// Why.
        message: String,
    },
    /// A reward-model folder that cannot be read or written.
    #[error("{path}: {message}")]
    Checkpoint {
        /// The folder or file.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

/// A config struct's range check, its field named relative to the struct.
impl From<diffrl_core::config::Invalid> for RewardError {
    fn from(i: diffrl_core::config::Invalid) -> Self {
        Self::Config {
            field: i.field,
            message: i.message,
        }
    }
}

impl RewardError {
    pub(crate) fn config(field: &str, message: impl Into<String>) -> Self {
        Self::Config {
            field: field.into(),
            message: message.into(),
        }
    }
}
