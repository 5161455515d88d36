//! Learning on top of diffrl's policies in any environment that implements core's `Env` (the
//! CLI wires concrete simulators in).
//!
//! - Behaviour cloning: [`data`] (chunked datasets), [`bc`] (the training loop).
//! - Rollouts: `runner` (the one receding-horizon loop), [`eval`] (seeded evaluation),
//!   [`rollout`] (group rollouts that keep their chains).
//! - Fine-tuning: [`finetune`] (settings, metrics, hooks), [`grpo`] and [`ppo`] (the two
//!   learners, each a loop of collect -> score -> advantages -> update -> checkpoint),
//!   [`advantages`] (the estimators, pure functions), `surrogate` (the clipped objective they
//!   share), `batch` and `session` (an iteration's scored rollouts; the run's state and
//!   checkpoints).

pub mod adamw;
pub mod advantages;
mod batch;
pub mod bc;
pub mod data;
pub mod error;
pub mod eval;
pub mod finetune;
pub mod grpo;
pub mod optim;
pub mod parallel;
pub mod ppo;
pub mod rollout;
mod runner;
mod session;
mod state;
mod surrogate;

pub use error::LearnError;
