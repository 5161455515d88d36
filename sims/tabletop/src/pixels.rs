//! Camera observations of the tabletop tasks (`obs = "pixels"`): a fixed front camera drawn
//! with [`crate::camera`], and the bodies it draws, computed from a flat state
//! ([`Tabletop::true_state`](crate::env::Tabletop::true_state)'s layout) alone, so a recorded
//! state draws exactly as the environment drew it ([`draw_state`]).
//!
//! **The default camera** ([`default_camera`]) sits at [`CAMERA_EYE`] = (0.35, 0.4, 0.5) m,
//! in front of the table's work area (the arm's base is at x = -0.615, facing +x), to its +y
//! side and above it, and looks at [`CAMERA_TARGET`] = (-0.1, 0, 0.1) with world z up in the
//! image and a vertical (and horizontal) field of view of [`CAMERA_FOV_Y_DEG`] = 60 degrees:
//! a front three-quarter view from 34 degrees above the table. The spawn region, goals up to
//! 0.3 m high, the gripper and the arm's elbow are in view; seen this way the hand's bounding
//! box hides less of a cube beneath it than from straight ahead (ManiSkill3's `base_camera`,
//! eye (0.3, 0, 0.6)) or above.

//! **What is drawn**: the table, each arm link and finger as its collision hulls' bounding box
//! (as [`crate::scene`] draws them for viewers), the cubes, and the goal marker: for reach-goal
//! and pick-cube a green sphere of [`GOAL_MARKER_RADIUS`] (1 cm, smaller than a cube, so a cube
//! at the goal covers the marker rather than hiding in it; the viewers' translucent 2.5 cm
//! sphere would be opaque here); for push-cube the goal region as a flat red disc of radius
//! [`PUSH_GOAL_RADIUS`](crate::env::PUSH_GOAL_RADIUS) 1 mm thick on the table; for stack-cube a
//! 5 mm green sphere where cube A's centre belongs.
//!
//! **Per-episode randomisation** (`[env.randomize]`, drawn at reset from the episode seed):
//! `camera_pos_jitter` moves the eye by a uniform offset per world axis, `camera_rot_jitter`
//! turns the camera by a rotation vector with uniform components about its own axes (x right:
//! pitch, y down: yaw, z forward: roll), and `color_jitter` multiplies each RGB channel of the
//! image by its own factor ([`tint`]).

use std::sync::{Arc, OnceLock};

use diffrl_core::scene::{Body, Scene, Shape3d, Transform3d};
use rapier3d::na::{Isometry3, Quaternion, Translation3, UnitQuaternion, Vector3};

use crate::camera::{Camera, CameraError, Frame, Renderer};
use crate::env::{TaskKind, layout};
use crate::robot::{HOME_Q, PandaModel};
use crate::world::{BodyPose, PhysicsParams, World};

/// Where the default camera is (m, world frame).
pub const CAMERA_EYE: [f32; 3] = [0.35, 0.4, 0.5];
/// The point the default camera looks at.
pub const CAMERA_TARGET: [f32; 3] = [-0.1, 0.0, 0.1];
/// The world direction that points up in the default camera's image.
pub const CAMERA_UP: [f32; 3] = [0.0, 0.0, 1.0];
/// The default camera's vertical (and, square, horizontal) field of view.
pub const CAMERA_FOV_Y_DEG: f32 = 60.0;
/// `image_size` when `[env]` does not set it.
pub const DEFAULT_IMAGE_SIZE: u32 = 64;
/// Image sides `[env] image_size` accepts.
pub const IMAGE_SIZES: std::ops::RangeInclusive<u32> = 16..=256;
/// Radius of the reach and pick goal marker in camera images (m).
pub const GOAL_MARKER_RADIUS: f64 = 0.01;

/// The default front camera with `size` x `size` pixels.
pub fn default_camera(size: u32) -> Result<Camera, CameraError> {
    Camera::look_at(
        CAMERA_EYE,
        CAMERA_TARGET,
        CAMERA_UP,
        CAMERA_FOV_Y_DEG,
        size,
        size,
    )
}

/// `camera` moved by `jitter[..3]` (m, world axes) and turned by the rotation vector
/// `jitter[3..]` (rad, about the camera's own axes: x right, y down, z forward).
pub fn jittered(camera: Camera, jitter: [f64; 6]) -> Camera {
    if jitter == [0.0; 6] {
        return camera;
    }
    let [x, y, z, w] = camera.pose.rotation.map(f64::from);
    let base = UnitQuaternion::from_quaternion(Quaternion::new(w, x, y, z));
    let turn = UnitQuaternion::from_scaled_axis(Vector3::new(jitter[3], jitter[4], jitter[5]));
    let r = (base * turn).into_inner().coords;
    let t = camera.pose.translation;
    Camera {
        pose: Transform3d {
            translation: [0, 1, 2].map(|i| (f64::from(t[i]) + jitter[i]) as f32),
            rotation: [r.x, r.y, r.z, r.w].map(|v| v as f32),
        },
        ..camera
    }
}

/// Multiplies each channel of the RGB8 pixels `rgb` by its factor in `scale`, rounding and
/// saturating at 255.
pub fn tint(rgb: &mut [u8], scale: [f64; 3]) {
    if scale == [1.0; 3] {
        return;
    }
    let s = scale.map(|v| v as f32);
    for px in rgb.chunks_exact_mut(3) {
        for (c, f) in px.iter_mut().zip(s) {
            *c = (f32::from(*c) * f).round().clamp(0.0, 255.0) as u8;
        }
    }
}

/// What drawing an arm from its joint positions needs: its kinematics and each drawn link's
/// bounding box in the link's frame.
#[derive(Debug, Clone)]
pub struct ArmDrawing {
    model: PandaModel,
    boxes: Vec<([f64; 3], [f64; 3])>,
}

static SHIPPED: OnceLock<Result<Arc<ArmDrawing>, String>> = OnceLock::new();

impl ArmDrawing {
    /// The arm of `world`.
    pub fn new(world: &World) -> Self {
        Self {
            model: world.model().clone(),
            boxes: world.link_local_boxes().to_vec(),
        }
    }

    /// The shipped Panda's, built once per process.
    pub fn shipped() -> Result<Arc<Self>, String> {
        SHIPPED
            .get_or_init(|| {
                let panda = crate::env::default_panda()?;
                let world = World::new(&panda, PhysicsParams::default(), 0, HOME_Q);
                Ok(Arc::new(Self::new(&world)))
            })
            .clone()
    }

    /// Each drawn link's box at joint positions `q`: the box centre's world pose and its
    /// half-extents ([`crate::robot::ARM_LINKS`], then the fingers).
    pub fn link_boxes(&self, q: &[f64; 9]) -> Vec<(Isometry3<f64>, [f64; 3])> {
        self.model
            .link_poses(q)
            .into_iter()
            .zip(&self.boxes)
            .map(|(pose, (c, half))| (pose * Translation3::new(c[0], c[1], c[2]), *half))
            .collect()
    }
}

/// The bodies the camera draws at the flat state `state` ([`TaskKind::state_names`]).
pub fn state_bodies(kind: TaskKind, state: &[f64], arm: &ArmDrawing) -> Result<Vec<Body>, String> {
    if state.len() != kind.state_dim() {
        return Err(format!(
            "{} images are drawn from {}-value states ({}), this one has {}",
            kind.name(),
            kind.state_dim(),
            kind.state_names().join(", "),
            state.len()
        ));
    }
    if let Some(i) = state.iter().position(|v| !v.is_finite()) {
        return Err(format!(
            "state component {i} ({}) is {}, not finite",
            kind.state_names()[i],
            state[i]
        ));
    }
    let mut q = [0.0; 9];
    q.copy_from_slice(&state[layout::Q..layout::Q + 9]);
    let cubes: Vec<BodyPose> = (0..kind.cubes())
        .map(|c| {
            let o = layout::CUBES + 7 * c;
            BodyPose {
                position: [state[o], state[o + 1], state[o + 2]],
                rotation: [state[o + 3], state[o + 4], state[o + 5], state[o + 6]],
            }
        })
        .collect();
    let g = state.len() - 3;
    let goal = [state[g], state[g + 1], state[g + 2]];
    let mut s = Scene::default();
    crate::scene::push_table(&mut s);
    crate::scene::push_links(&mut s, &arm.link_boxes(&q));
    crate::scene::push_cubes(&mut s, kind, &cubes);
    push_goal_marker(&mut s, kind, goal);
    Ok(s.bodies)
}

/// The goal as the camera draws it (see the module documentation).
fn push_goal_marker(s: &mut Scene, kind: TaskKind, goal: [f64; 3]) {
    let at = |z: f64| Transform3d::from_translation([goal[0], goal[1], z].map(|v| v as f32));
    match kind {
        TaskKind::PushCube => s.push_body(
            "goal",
            Shape3d::Cylinder {
                half_length: 0.0005,
                radius: crate::env::PUSH_GOAL_RADIUS as f32,
            },
            at(0.0005),
            [220, 40, 40, 255],
        ),
        TaskKind::StackCube => s.push_body(
            "goal",
            Shape3d::Sphere { radius: 0.005 },
            at(goal[2]),
            [30, 180, 30, 255],
        ),
        TaskKind::ReachGoal | TaskKind::PickCube => s.push_body(
            "goal",
            Shape3d::Sphere {
                radius: GOAL_MARKER_RADIUS as f32,
            },
            at(goal[2]),
            [30, 200, 30, 255],
        ),
    };
}

/// Draws the flat state `state` with `renderer`'s camera.
pub fn draw_state<'a>(
    renderer: &'a mut Renderer,
    kind: TaskKind,
    state: &[f64],
    arm: &ArmDrawing,
) -> Result<&'a Frame, String> {
    let bodies = state_bodies(kind, state, arm)?;
    Ok(renderer.render(&bodies))
}
