//! Push-T on rapier2d, matching gym-pusht 0.1.8.
//!
//! - [`PushT`]: the environment (observation modes `state`, `keypoints`, `pixels`; domain
//!   randomisation of block mass/inertia, friction, PD gains, action delay, observation noise).
//! - [`geometry`]: the T shape, keypoints and exact goal coverage.
//! - [`physics`]: the Rapier world.
//! - [`render`]: top-view images.
//! - [`scene`]: the state as a 2-D scene for viewers (`Env::scene`).
//! - [`expert`]: a sampling-based MPC (MPPI) expert that plans on cloned worlds.
//! - [`task`]: [`PushTTask`], Push-T as a task of the tools (`task = "pusht"` in configs).
#![warn(missing_docs)]

pub mod env;
pub mod expert;
pub mod geometry;
pub mod physics;
pub mod pusher;
pub mod render;
pub mod scene;
pub mod stages;
pub mod task;

pub use env::{
    MAX_EPISODE_STEPS, ObsMode, PushT, PushTBuilder, PushTConfig, Randomization, SUCCESS_THRESHOLD,
    Snapshot, TASK, keypoint_observation, state_from_keypoints,
};
pub use expert::{Expert, ExpertConfig, ExpertKind};
pub use pusher::{Pusher, PusherConfig};
pub use task::PushTTask;
