//! Progress and process reward models (docs/algorithms.md §4) that plug into the GRPO learner
//! through core's `RewardModule`:
//!
//! - [`labels`]: time-normalised and stage-budget progress labels.
//! - [`progress`]: the progress model Phi(s) in [0, 1] (Burn), its training and checkpoints.
//! - [`hop`]: the pairwise hop model H(s_p, s_q) and fused progress.
//! - [`shaping`]: policy-invariant shaping r + gamma Phi(s') - Phi(s) (and the non-invariant
//!   ablation).
//! - [`process`]: SRPO-style self-referential rewards for failed rollouts (within a group).
//! - [`spa`]: SPA-style stepwise attribution: per-step contributions that sum to the outcome.
//! - [`implicit`]: the OPRL implicit PRM, a policy copy trained with trajectory DPO whose
//!   log-ratio to the behaviour policy is the step reward.
//! - [`metrics`]: VOC, pairwise accuracy, success AUROC, monotonicity.
#![warn(missing_docs)]

pub mod error;
pub mod folder;
pub mod hop;
pub mod implicit;
pub mod labels;
pub mod metrics;
pub mod process;
pub mod progress;
pub mod shaping;
pub mod spa;

pub use error::RewardError;

/// The trunk every reward network here uses: a Mish MLP from `inputs` through `hidden` to one
/// output (each model adds its own head: sigmoid, tanh or none).
pub(crate) fn scalar_mlp<B: burn::tensor::backend::Backend>(
    inputs: usize,
    hidden: &[usize],
    device: &B::Device,
) -> diffrl_policy::nn::Mlp<B> {
    let mut widths = vec![inputs];
    widths.extend(hidden);
    widths.push(1);
    diffrl_policy::nn::Mlp::new(&widths, diffrl_policy::config::Activation::Mish, device)
}
