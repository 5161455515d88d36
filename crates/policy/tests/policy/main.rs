//! The policy crate's integration tests, in one test binary: each module would otherwise build
//! and link its own copy of the generic model code.

mod aux;
mod chain;
mod checkpoint;
mod common;
mod diffusers;
mod gradient;
mod language;
mod saliency;
