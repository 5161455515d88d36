//! A 3-D tabletop manipulation suite on rapier3d: a Franka Panda arm loaded from the URDF under
//! assets/panda, a table, cubes, scripted experts, and (in [`camera`]) CPU-rendered cameras.
//! Tasks after ManiSkill3's (mani_skill 3.0.1): `reach-goal`, `push-cube`, `pick-cube`,
//! `stack-cube`, 50 control steps at 20 Hz.
//!
//! - [`robot`]: the Panda URDF loaded with rapier3d-urdf (convex-hull colliders); its f64
//!   kinematics (forward kinematics, Jacobian, damped least-squares IK).
//! - [`world`]: the Rapier world: table, arm multibody with PD joint motors, cubes; 200 Hz
//!   physics, 10 substeps per control step; `Clone` is an exact snapshot.
//! - [`mod@env`]: [`env::Tabletop`], the environment (`[env]` = [`env::TabletopConfig`]):
//!   end-effector delta-position + gripper actions, state or pixels observations, ManiSkill's
//!   normalised dense rewards.
//! - [`expert`]: scripted, state-driven experts for the four tasks.
//! - [`stages`]: stage predicates on recorded states.
//! - [`task`]: [`task::TabletopTask`], the four tasks for the tools' task registry.
//! - [`language`]: the instructions of `lang-cubes` (families, paraphrases, held-out
//!   combinations) and their success tests and scores.
//! - [`lang_cubes`]: `lang-cubes`, the language-conditioned three-cube suite: its environment,
//!   expert, stages and task (docs/tabletop.md, "Language suite").
//! - [`scene`]: the 3-D scene a viewer draws.
//! - [`camera`]: RGB and depth images of the scene's bodies, rendered on the CPU.
//! - [`pixels`]: camera observations (`obs = "pixels"`): the default front camera and the
//!   bodies it draws from a flat state.
#![warn(missing_docs)]

pub mod camera;
pub mod env;
pub mod expert;
pub mod lang_cubes;
pub mod language;
pub mod pixels;
pub mod robot;
pub mod scene;
pub mod stages;
pub mod task;
pub mod world;
