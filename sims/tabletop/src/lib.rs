//! A 3-D tabletop manipulation suite on rapier3d: a Franka Panda arm loaded from the URDF under
//! assets/panda, a table, cubes, CPU-rendered cameras and scripted experts.
//!
//! - [`camera`]: RGB and depth images of the scene's bodies, rendered on the CPU.
#![warn(missing_docs)]

pub mod camera;
