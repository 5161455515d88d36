//! A 3-D tabletop manipulation suite on rapier3d: a Franka Panda arm loaded from the URDF under
//! assets/panda, a table, cubes, CPU-rendered cameras and scripted experts.
//!
//! - [`robot`]: the Panda URDF loaded with rapier3d-urdf; f64 kinematics and IK.
//! - [`world`]: the Rapier world (table, arm multibody with PD joint motors, cubes).
//! - [`camera`]: RGB and depth images of the scene's bodies, rendered on the CPU.
#![warn(missing_docs)]

pub mod camera;
pub mod env;
pub mod expert;
pub mod robot;
pub mod scene;
pub mod stages;
pub mod task;
pub mod world;
