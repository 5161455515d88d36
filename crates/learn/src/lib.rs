//! Learning on top of diffrl's policies: behaviour cloning from datasets and evaluation in any
//! environment that implements core's `Env` (the CLI wires concrete simulators in).

pub mod advantages;
pub mod bc;
pub mod data;
pub mod error;
pub mod eval;
pub mod grpo;
pub mod optim;
pub mod parallel;
pub mod rollout;
mod state;

pub use error::LearnError;
