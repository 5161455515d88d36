//! Diffusion and Gaussian policies written in Burn, with the exact Gaussian log-likelihood of
//! every reverse denoising step (the two-level MDP of docs/algorithms.md §2), and their
//! checkpoints.
//!
//! Nothing here knows about a particular task: dimensions come from [`PolicySpec`], which the
//! caller fills from an environment's spaces or a dataset.
//!
//! Language-conditioned policies (`PolicySpec::text`) read a task instruction through a
//! word-level [`tokenizer`] and a Transformer [`text_encoder`] whose features join the
//! observation condition (docs/policy.md, "Language conditioning").

pub mod checkpoint;
pub mod config;
pub mod denoiser;
pub mod diffusion;
pub mod encoder;
mod erff;
pub mod error;
mod expf;
mod fused;
pub mod gaussian;
pub mod nn;
pub mod patches;
pub mod planner;
pub mod policy;
pub mod saliency;
pub mod schedule;
mod tanhf;
pub mod text_encoder;
pub mod tokenizer;
pub mod unet;
pub mod vision;

pub use config::PolicyConfig;
pub use diffusion::{ChainSample, DiffusionProcess, Noise, SampleMode};
pub use error::{CheckpointError, PolicyError};
pub use policy::{Act, Normalizers, ObsBatch, Policy, PolicyModel, PolicySpec, seeded_init};
pub use saliency::Saliency;
pub use tokenizer::{Strictness, TextError, Tokenizer, Vocabulary};

/// The CPU backend used by default (pure-Rust Flex).
pub type CpuBackend = burn::backend::Flex;
/// The CPU backend with autodiff, for training.
pub type CpuAutodiff = burn::backend::Autodiff<burn::backend::Flex>;
