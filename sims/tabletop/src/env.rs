//! The tabletop environment: one [`Tabletop`] type whose `kind` picks the task (reach-goal,
//! push-cube, pick-cube, stack-cube), after ManiSkill3's PushCube-v1, PickCube-v1 and
//! StackCube-v1 (mani_skill 3.0.1, source read).
//!
//! Control (20 Hz): an action is `[dx, dy, dz, gripper]` in [-1, 1]. The TCP target is the
//! TCP pose of the current *joint targets* moved by `[dx, dy, dz] * ACTION_SCALE` (2.5 cm per
//! step at most, 0.5 m/s; ManiSkill's `pd_ee_delta_pos` allows 10 cm), clamped into
//! [`WORKSPACE`], with the gripper held pointing down at the home yaw; damped least-squares IK
//! turns it into arm joint targets. The gripper component maps linearly onto a finger target
//! in [-0.01, 0.04] m (ManiSkill's `pd_joint_pos` gripper: -1 closes, squeezing, +1 opens).
//!
//! Differences from ManiSkill, all deliberate:
//! - The arm moves by IK on joint targets (`use_target`), so the TCP does not sag or drift
//!   while the action is zero; the targets are clamped into a workspace box.
//! - `is_grasping` checks both fingers press with >= 0.5 N, without ManiSkill's angle test.
//! - Reach-goal has no ManiSkill twin: reward `1 - tanh(5 d)`, 1 on success.
//! - Episodes end (terminated) on success, as Push-T's do; ManiSkill keeps running.
//! - Scores are ManiSkill's normalised dense rewards (in [0, 1]).

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use diffrl_core::config::{Invalid, Validate, ensure, ensure_range};
use diffrl_core::seeding::{self, Rng};
use diffrl_core::space::{ImageObs, ImageSpace};
use diffrl_core::{BoxSpace, Env, EnvError, Info, Observation, ObservationSpace, StepResult};
use rand::Rng as _;
use rand_distr::{Distribution, Normal};
use rapier3d::na::{Isometry3, Translation3, UnitQuaternion, Vector3};
use serde::{Deserialize, Serialize};

use crate::camera::{Camera, Renderer};
use crate::pixels::ArmDrawing;
use crate::robot::{ARM_DOF, HOME_Q, LoadedPanda, RobotError, default_urdf_path, load_panda};
use crate::world::{ArmJoints, BodyPose, CUBE_HALF, PhysicsParams, ROBOT_FRICTION, World};

/// ManiSkill's episode length for these tasks.
pub const MAX_EPISODE_STEPS: usize = 50;
/// Largest TCP move per control step (m), for an action component of +-1.
pub const ACTION_SCALE: f64 = 0.025;
/// Finger target (m) at gripper action -1 (beyond the 0 limit: closing squeezes).
pub const GRIPPER_CLOSED: f64 = -0.01;
/// Finger target (m) at gripper action +1 (fully open).
pub const GRIPPER_OPEN: f64 = 0.04;
/// The box the TCP target is clamped into, `[[x, y, z]_min, [x, y, z]_max]` (m, world frame;
/// the arm's base is at x = -0.615). The floor keeps the fingertips (7 mm below the TCP) off
/// the table.
pub const WORKSPACE: [[f64; 3]; 2] = [[-0.35, -0.4, 0.015], [0.35, 0.4, 0.5]];
/// Robot joint positions are drawn around [`HOME_Q`] with this standard deviation (rad),
/// ManiSkill's `robot_init_qpos_noise`.
pub const INIT_QPOS_NOISE: f64 = 0.02;
/// Reach success radius (m).
pub const REACH_THRESHOLD: f64 = 0.05;
/// Push success: xy distance to the goal below this (m), ManiSkill's goal radius.
pub const PUSH_GOAL_RADIUS: f64 = 0.1;
/// Pick success: cube within this of the goal (m), ManiSkill's goal_thresh.
pub const PICK_GOAL_THRESHOLD: f64 = 0.025;
/// The arm counts as static when every arm joint speed is at most this (rad/s).
pub const STATIC_QVEL: f64 = 0.2;
/// Overlap (m) beyond which a state given to `reset_to_state` is refused.
pub const OVERLAP_TOLERANCE: f64 = 0.002;

/// Which task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum TaskKind {
    /// Move the TCP to a goal point.
    ReachGoal,
    /// Push the cube 0.2 m along +x onto a goal region.
    PushCube,
    /// Pick the cube up and hold it at a goal point.
    #[default]
    PickCube,
    /// Put cube A on cube B.
    StackCube,
}

impl TaskKind {
    /// All kinds.
    pub const ALL: [TaskKind; 4] = [
        TaskKind::ReachGoal,
        TaskKind::PushCube,
        TaskKind::PickCube,
        TaskKind::StackCube,
    ];

    /// The task's name (`reach-goal`, ...).
    pub fn name(self) -> &'static str {
        match self {
            TaskKind::ReachGoal => "reach-goal",
            TaskKind::PushCube => "push-cube",
            TaskKind::PickCube => "pick-cube",
            TaskKind::StackCube => "stack-cube",
        }
    }

    /// Number of cubes.
    pub fn cubes(self) -> usize {
        match self {
            TaskKind::ReachGoal => 0,
            TaskKind::PushCube | TaskKind::PickCube => 1,
            TaskKind::StackCube => 2,
        }
    }

    /// The instruction stored in datasets.
    pub fn instruction(self) -> &'static str {
        match self {
            TaskKind::ReachGoal => "move the gripper to the goal",
            TaskKind::PushCube => "push the cube to the goal region",
            TaskKind::PickCube => "pick up the cube and move it to the goal",
            TaskKind::StackCube => "stack the red cube on the green cube",
        }
    }

    /// Length of the state vector.
    pub fn state_dim(self) -> usize {
        STATE_BASE + 7 * self.cubes() + 3
    }

    /// Names of the state vector's components.
    pub fn state_names(self) -> Vec<String> {
        let mut n: Vec<String> = crate::robot::JOINT_NAMES
            .iter()
            .map(|j| format!("q_{j}"))
            .collect();
        n.extend(crate::robot::JOINT_NAMES.iter().map(|j| format!("qd_{j}")));
        n.extend(["tcp_x", "tcp_y", "tcp_z", "gripper_opening"].map(String::from));
        for c in 0..self.cubes() {
            let name = ["cube_a", "cube_b"][c];
            n.extend(
                ["x", "y", "z", "qx", "qy", "qz", "qw"]
                    .iter()
                    .map(|s| format!("{name}_{s}")),
            );
        }
        n.extend(["goal_x", "goal_y", "goal_z"].map(String::from));
        n
    }
}

/// Offsets into the state vector.
pub mod layout {
    /// Joint positions (9).
    pub const Q: usize = 0;
    /// Joint velocities (9).
    pub const QD: usize = 9;
    /// TCP position (3).
    pub const TCP: usize = 18;
    /// Gripper opening (1).
    pub const GRIPPER: usize = 21;
    /// First cube's pose (7), the second's follows.
    pub const CUBES: usize = 22;
}
const STATE_BASE: usize = layout::CUBES;

/// What the policy observes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ObsMode {
    /// The flat state vector ([`TaskKind::state_names`]).
    #[default]
    State,
    /// The front camera's RGB image ([`crate::pixels`]) plus proprioception as the state
    /// part ([`proprio_indices`]): the 9 joint positions, the TCP position, the gripper
    /// opening and, for reach-goal and pick-cube, the goal position (ManiSkill's `goal_pos`:
    /// a point in the air is hard to judge from one image).
    Pixels,
}

/// A closed range `[lo, hi]` drawn uniformly at every reset.
pub type Range = [f64; 2];

/// Domain randomisation (`[env.randomize]`). Defaults are the unrandomised task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Randomization {
    /// Cube mass (kg); ManiSkill: 0.064 (density 1000).
    pub cube_mass: Range,
    /// Cube friction coefficient.
    pub cube_friction: Range,
    /// Multiplier on every joint motor's stiffness and damping.
    pub gain_scale: Range,
    /// Control steps between choosing an action and applying it (inclusive integer range);
    /// until the first delayed action arrives the arm holds its targets.
    pub action_delay: [u32; 2],
    /// Standard deviation of Gaussian noise on every observed position (joint positions in
    /// rad and m, TCP, cube and goal positions in m).
    pub obs_noise: f64,
    /// Camera position jitter (m, per world axis uniform in +-), drawn at reset.
    pub camera_pos_jitter: f64,
    /// Camera orientation jitter (rad, a rotation vector about the camera's own axes, each
    /// component uniform in +-), drawn at reset.
    pub camera_rot_jitter: f64,
    /// Range of the per-channel multiplier applied to camera images, one factor per RGB channel
    /// drawn at reset.
    pub color_jitter: Range,
}

impl Default for Randomization {
    fn default() -> Self {
        Self {
            cube_mass: [0.064, 0.064],
            cube_friction: [1.0, 1.0],
            gain_scale: [1.0, 1.0],
            action_delay: [0, 0],
            obs_noise: 0.0,
            camera_pos_jitter: 0.0,
            camera_rot_jitter: 0.0,
            color_jitter: [1.0, 1.0],
        }
    }
}

impl Validate for Randomization {
    fn validate(&self) -> Result<(), Invalid> {
        ensure_range(self.cube_mass, "cube_mass", 1e-3, 10.0)?;
        ensure_range(self.cube_friction, "cube_friction", 0.0, 5.0)?;
        ensure_range(self.gain_scale, "gain_scale", 0.05, 20.0)?;
        ensure_range(self.color_jitter, "color_jitter", 0.0, 4.0)?;
        ensure(
            self.action_delay[0] <= self.action_delay[1] && self.action_delay[1] <= 10,
            "action_delay",
            format!(
                "must be [lo, hi] with lo <= hi <= 10 steps, got {:?}",
                self.action_delay
            ),
        )?;
        let scalar = |name: &str, v: f64, hi: f64| {
            ensure(
                v.is_finite() && (0.0..=hi).contains(&v),
                name,
                format!("must be in [0, {hi}], got {v}"),
            )
        };
        scalar("obs_noise", self.obs_noise, 1.0)?;
        scalar("camera_pos_jitter", self.camera_pos_jitter, 0.5)?;
        scalar("camera_rot_jitter", self.camera_rot_jitter, 1.0)
    }
}

/// Tabletop settings as they appear in a config's `[env]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TabletopConfig {
    /// Which task. Not a key of `[env]`: a config's `task = "push-cube"` decides it
    /// (`TabletopTask::build` in [`crate::task`] sets it), so it has one source only.
    #[serde(skip)]
    pub kind: TaskKind,
    /// Observation mode.
    pub obs: ObsMode,
    /// Side of the camera images in pixels (16..=256), for pixels observations and
    /// `render_state`.
    pub image_size: u32,
    /// Step limit.
    pub max_episode_steps: usize,
    /// How the arm's joints are simulated: `"multibody"` (the default) or `"impulse"`.
    pub arm_joints: ArmJoints,
    /// Domain randomisation.
    pub randomize: Randomization,
}

impl Default for TabletopConfig {
    fn default() -> Self {
        Self {
            kind: TaskKind::default(),
            obs: ObsMode::State,
            image_size: crate::pixels::DEFAULT_IMAGE_SIZE,
            max_episode_steps: MAX_EPISODE_STEPS,
            arm_joints: ArmJoints::default(),
            randomize: Randomization::default(),
        }
    }
}

impl Validate for TabletopConfig {
    fn validate(&self) -> Result<(), Invalid> {
        let sizes = crate::pixels::IMAGE_SIZES;
        ensure(
            sizes.contains(&self.image_size),
            "image_size",
            format!(
                "must be in {}..={} pixels, got {}",
                sizes.start(),
                sizes.end(),
                self.image_size
            ),
        )?;
        ensure(
            (1..=100_000).contains(&self.max_episode_steps),
            "max_episode_steps",
            format!("must be in 1..=100000, got {}", self.max_episode_steps),
        )?;
        self.randomize.validate().map_err(|e| e.within("randomize"))
    }
}

/// Why an environment could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TabletopError {
    /// The robot description failed to load.
    #[error(transparent)]
    Robot(#[from] RobotError),
    /// The config is invalid.
    #[error("invalid tabletop config: {0}")]
    Config(#[from] Invalid),
}

/// Builder for [`Tabletop`]: `Tabletop::builder().kind(TaskKind::PushCube).build()`.
#[derive(Debug, Clone, Default)]
pub struct TabletopBuilder {
    config: TabletopConfig,
}

impl TabletopBuilder {
    /// Which task.
    pub fn kind(mut self, kind: TaskKind) -> Self {
        self.config.kind = kind;
        self
    }
    /// Domain randomisation.
    pub fn randomize(mut self, r: Randomization) -> Self {
        self.config.randomize = r;
        self
    }
    /// Observation mode.
    pub fn obs(mut self, obs: ObsMode) -> Self {
        self.config.obs = obs;
        self
    }
    /// How the arm's joints are simulated.
    pub fn arm_joints(mut self, joints: ArmJoints) -> Self {
        self.config.arm_joints = joints;
        self
    }
    /// Camera image side (pixels).
    pub fn image_size(mut self, size: u32) -> Self {
        self.config.image_size = size;
        self
    }
    /// Step limit.
    pub fn max_episode_steps(mut self, n: usize) -> Self {
        self.config.max_episode_steps = n;
        self
    }
    /// All settings at once.
    pub fn config(mut self, c: TabletopConfig) -> Self {
        self.config = c;
        self
    }
    /// The environment with the shipped Panda (reset to seed 0).
    pub fn build(self) -> Result<Tabletop, TabletopError> {
        Tabletop::try_new(self.config)
    }
}

/// Everything needed to continue an episode exactly.
#[derive(Clone)]
pub struct Snapshot {
    world: World,
    goal: [f64; 3],
    steps: usize,
    rng: Rng,
    pending: VecDeque<[f32; 4]>,
    delay: usize,
    done: bool,
    camera_jitter: [f64; 6],
    color: [f64; 3],
}

/// The tabletop environment.
#[derive(Clone)]
pub struct Tabletop {
    config: TabletopConfig,
    panda: Arc<LoadedPanda>,
    down: UnitQuaternion<f64>,
    state: Snapshot,
    /// Cubes in the world: the kind's own ([`TaskKind::cubes`]), or more for an environment
    /// that drives this one's arm with its own scene ([`crate::language`]).
    cubes: usize,
    arm: Arc<ArmDrawing>,
    /// The camera before jitter.
    camera: Camera,
    /// Kept between observations in pixels mode.
    renderer: Option<Renderer>,
}

static DEFAULT_PANDA: OnceLock<Result<Arc<LoadedPanda>, String>> = OnceLock::new();

/// The shipped Panda, loaded once per process.
pub(crate) fn default_panda() -> Result<Arc<LoadedPanda>, String> {
    DEFAULT_PANDA
        .get_or_init(|| {
            load_panda(&default_urdf_path(), ROBOT_FRICTION)
                .map(Arc::new)
                .map_err(|e| e.to_string())
        })
        .clone()
}

fn draw(rng: &mut Rng, r: Range) -> f64 {
    if r[0] == r[1] {
        r[0]
    } else {
        rng.random_range(r[0]..=r[1])
    }
}

fn yaw_quat(yaw: f64) -> [f64; 4] {
    let (s, c) = (yaw / 2.0).sin_cos();
    [0.0, 0.0, s, c]
}

fn dist(a: [f64; 3], b: [f64; 3]) -> f64 {
    ((a[0] - b[0]).powi(2) + (a[1] - b[1]).powi(2) + (a[2] - b[2]).powi(2)).sqrt()
}

fn dist_xy(a: [f64; 3], b: [f64; 3]) -> f64 {
    (a[0] - b[0]).hypot(a[1] - b[1])
}

/// What a step's reward and success are computed from.
struct Evaluation {
    score: f64,
    success: bool,
}

impl Tabletop {
    /// A builder (pick-cube, state observations, no randomisation).
    pub fn builder() -> TabletopBuilder {
        TabletopBuilder::default()
    }

    /// An environment with the shipped Panda. Panics only if the shipped asset
    /// (assets/panda) is missing or broken, with the loader's message; use
    /// [`Tabletop::try_new`] to get that as an error.
    pub fn new(config: TabletopConfig) -> Self {
        Self::try_new(config).unwrap_or_else(|e| panic!("{e}"))
    }

    /// An environment with the shipped Panda, reset to seed 0.
    pub fn try_new(config: TabletopConfig) -> Result<Self, TabletopError> {
        config.validate()?;
        let panda = default_panda().map_err(|message| RobotError::Urdf {
            path: default_urdf_path(),
            message,
        })?;
        let cubes = config.kind.cubes();
        Ok(Self::with_panda(config, panda, cubes))
    }

    /// An environment with the robot described by the URDF at `urdf`.
    pub fn with_urdf(config: TabletopConfig, urdf: &Path) -> Result<Self, TabletopError> {
        config.validate()?;
        let panda = Arc::new(load_panda(urdf, ROBOT_FRICTION)?);
        let cubes = config.kind.cubes();
        Ok(Self::with_panda(config, panda, cubes))
    }

    /// The arm, physics and randomisation of an environment with `cubes` cubes, for an
    /// environment with its own scene, observations and rewards ([`crate::language`]): it
    /// uses [`Tabletop::start`], [`Tabletop::advance`] and the world, never this one's `Env`
    /// methods, whose `kind` describes fewer cubes.
    pub(crate) fn arm_with_cubes(
        config: TabletopConfig,
        cubes: usize,
    ) -> Result<Self, TabletopError> {
        config.validate()?;
        let panda = default_panda().map_err(|message| RobotError::Urdf {
            path: default_urdf_path(),
            message,
        })?;
        Ok(Self::with_panda(config, panda, cubes))
    }

    fn with_panda(config: TabletopConfig, panda: Arc<LoadedPanda>, cubes: usize) -> Self {
        let home: [f64; ARM_DOF] = HOME_Q[..ARM_DOF].try_into().unwrap_or([0.0; ARM_DOF]);
        let down = panda.model.tcp_pose(&home).rotation;
        let world = World::with_joints(
            &panda,
            PhysicsParams::default(),
            cubes,
            HOME_Q,
            config.arm_joints,
        );
        let arm = Arc::new(ArmDrawing::new(&world));
        let camera = crate::pixels::default_camera(config.image_size)
            .unwrap_or_else(|e| panic!("image_size is validated: {e}"));
        let renderer = (config.obs == ObsMode::Pixels)
            .then(|| Renderer::new(camera).unwrap_or_else(|e| panic!("{e}")));
        let state = Snapshot {
            world,
            goal: [0.0; 3],
            steps: 0,
            rng: seeding::rng(0),
            pending: VecDeque::new(),
            delay: 0,
            done: false,
            camera_jitter: [0.0; 6],
            color: [1.0; 3],
        };
        let mut env = Self {
            config,
            panda,
            down,
            state,
            cubes,
            arm,
            camera,
            renderer,
        };
        env.reset(0);
        env
    }

    /// The settings.
    pub fn config(&self) -> &TabletopConfig {
        &self.config
    }

    /// Which task.
    pub fn kind(&self) -> TaskKind {
        self.config.kind
    }

    /// The physics world.
    pub fn world(&self) -> &World {
        &self.state.world
    }

    /// The goal position (reach, pick: a point; push: the goal region's centre on the table;
    /// stack: where cube A's centre belongs, on top of cube B).
    pub fn goal(&self) -> [f64; 3] {
        if self.config.kind == TaskKind::StackCube {
            let b = self.state.world.cube_pose(1).position;
            [b[0], b[1], b[2] + 2.0 * CUBE_HALF]
        } else {
            self.state.goal
        }
    }

    /// The gripper's fixed orientation (pointing down, home yaw).
    pub fn down(&self) -> UnitQuaternion<f64> {
        self.down
    }

    /// Camera pose jitter drawn this episode (position m, then rotation rad), for the camera.
    pub fn camera_jitter(&self) -> [f64; 6] {
        self.state.camera_jitter
    }

    /// Per-channel colour multipliers drawn this episode, for the camera.
    pub fn color_scale(&self) -> [f64; 3] {
        self.state.color
    }

    /// This episode's camera: the default front camera ([`crate::pixels`]) of `image_size`
    /// with this episode's jitter.
    pub fn camera(&self) -> Camera {
        crate::pixels::jittered(self.camera, self.state.camera_jitter)
    }

    /// The state the camera draws: [`Tabletop::true_state`] rounded to f32 as datasets record
    /// it, so `render_state` of a recorded state gives the same bytes.
    fn drawn_state(&self) -> Vec<f64> {
        self.true_state()
            .into_iter()
            .map(|v| f64::from(v as f32))
            .collect()
    }

    fn draw(&self, renderer: &mut Renderer) -> ImageObs {
        let camera = self.camera();
        if *renderer.camera() != camera {
            renderer
                .set_camera(camera)
                .unwrap_or_else(|e| panic!("a jittered valid camera is valid: {e}"));
        }
        let state = self.drawn_state();
        let frame = crate::pixels::draw_state(renderer, self.config.kind, &state, &self.arm)
            .unwrap_or_else(|e| panic!("the env's own state draws: {e}"));
        let mut image = frame.image_obs();
        crate::pixels::tint(&mut image.data, self.state.color);
        image
    }

    /// The policy's camera image of the current state (pixels mode; None for state
    /// observations).
    pub fn camera_image(&self) -> Option<ImageObs> {
        let renderer = self.renderer.as_ref()?;
        Some(self.draw(&mut renderer.clone()))
    }

    /// The camera image of the current state in any mode (this episode's camera and tint).
    pub fn render_image(&self) -> ImageObs {
        let mut renderer =
            Renderer::new(self.camera).unwrap_or_else(|e| panic!("image_size is validated: {e}"));
        self.draw(&mut renderer)
    }

    /// Starts an episode: draws the physics in `rng`, builds a fresh world at joint positions
    /// `q`, places `cubes` and the goal.
    pub(crate) fn start(&mut self, mut rng: Rng, q: [f64; 9], cubes: &[BodyPose], goal: [f64; 3]) {
        let r = &self.config.randomize;
        let params = PhysicsParams {
            cube_mass: draw(&mut rng, r.cube_mass),
            cube_friction: draw(&mut rng, r.cube_friction),
            gain_scale: draw(&mut rng, r.gain_scale),
        };
        let delay = rng.random_range(r.action_delay[0]..=r.action_delay[1]) as usize;
        let (pj, rj) = (r.camera_pos_jitter, r.camera_rot_jitter);
        let camera_jitter = [pj, pj, pj, rj, rj, rj].map(|a| {
            if a > 0.0 {
                rng.random_range(-a..=a)
            } else {
                0.0
            }
        });
        let color = [0; 3].map(|_| draw(&mut rng, r.color_jitter));
        let mut world =
            World::with_joints(&self.panda, params, self.cubes, q, self.config.arm_joints);
        for (i, c) in cubes.iter().enumerate() {
            world.set_cube_pose(i, *c);
        }
        self.state = Snapshot {
            world,
            goal,
            steps: 0,
            rng,
            pending: VecDeque::new(),
            delay,
            done: false,
            camera_jitter,
            color,
        };
    }

    /// Joint positions N(home, [`INIT_QPOS_NOISE`]) within the limits, the gripper open
    /// (ManiSkill's TableSceneBuilder), drawn from `rng`.
    pub(crate) fn initial_joints(&self, rng: &mut Rng) -> [f64; 9] {
        let noise = Normal::new(0.0, INIT_QPOS_NOISE).unwrap_or_else(|_| unreachable!());
        let mut q = HOME_Q;
        for qi in q.iter_mut().take(ARM_DOF) {
            *qi += noise.sample(rng);
        }
        self.panda.model.clamp_to_limits(
            (&mut q[..ARM_DOF])
                .try_into()
                .unwrap_or_else(|_| unreachable!()),
        );
        q
    }

    /// Puts back an episode's state without observing (observing draws noise from its RNG).
    pub(crate) fn set_snapshot(&mut self, snapshot: &Snapshot) {
        self.state = snapshot.clone();
    }

    /// The episode's RNG (observation noise draws from it).
    pub(crate) fn rng_mut(&mut self) -> &mut Rng {
        &mut self.state.rng
    }

    /// The physics world, to set joint velocities of a state being restored.
    pub(crate) fn world_mut(&mut self) -> &mut World {
        &mut self.state.world
    }

    /// Why joint positions `q` (arm, then fingers) cannot be a state, if they are outside the
    /// joint limits.
    pub(crate) fn check_joint_limits(&self, q: &[f64; 9]) -> Result<(), EnvError> {
        for (i, j) in self.panda.model.chain.iter().enumerate() {
            if q[i] < j.lower - 1e-6 || q[i] > j.upper + 1e-6 {
                return Err(EnvError::InvalidState(format!(
                    "joint {} at {} is outside its limits [{}, {}]",
                    j.name, q[i], j.lower, j.upper
                )));
            }
        }
        for (i, f) in self.panda.model.fingers.iter().enumerate() {
            let v = q[ARM_DOF + i];
            if v < f.lower - 1e-6 || v > f.upper + 1e-6 {
                return Err(EnvError::InvalidState(format!(
                    "finger joint {} at {v} is outside its limits [{}, {}]",
                    crate::robot::JOINT_NAMES[ARM_DOF + i],
                    f.lower,
                    f.upper
                )));
            }
        }
        Ok(())
    }

    /// Draws cube poses and the goal after ManiSkill's `_initialize_episode`.
    fn draw_scene(&self, rng: &mut Rng) -> (Vec<BodyPose>, [f64; 3]) {
        let mut u = |lo: f64, hi: f64| rng.random_range(lo..hi);
        let h = CUBE_HALF;
        let on_table = |x: f64, y: f64, yaw: f64| BodyPose {
            position: [x, y, h],
            rotation: yaw_quat(yaw),
        };
        match self.config.kind {
            TaskKind::ReachGoal => {
                let goal = [u(-0.1, 0.1), u(-0.1, 0.1), u(0.05, 0.3)];
                (Vec::new(), goal)
            }
            TaskKind::PushCube => {
                // PushCube-v1: no yaw; goal region 0.1 + radius ahead along +x.
                let (x, y) = (u(-0.1, 0.1), u(-0.1, 0.1));
                (
                    vec![on_table(x, y, 0.0)],
                    [x + 0.1 + PUSH_GOAL_RADIUS, y, 0.0],
                )
            }
            TaskKind::PickCube => {
                let (x, y, yaw) = (
                    u(-0.1, 0.1),
                    u(-0.1, 0.1),
                    u(0.0, 2.0 * std::f64::consts::PI),
                );
                let goal = [u(-0.1, 0.1), u(-0.1, 0.1), h + u(0.0, 0.3)];
                (vec![on_table(x, y, yaw)], goal)
            }
            TaskKind::StackCube => {
                // StackCube-v1: a common offset in [-0.1, 0.1]^2, each cube in
                // [-0.1, 0.1] x [-0.2, 0.2] around it, kept apart by twice the cubes' xy
                // bounding radius (+1 mm), up to 100 tries.
                let (ox, oy) = (u(-0.1, 0.1), u(-0.1, 0.1));
                let radius = (2.0 * h * h).sqrt() + 0.001;
                let a = (u(-0.1, 0.1), u(-0.2, 0.2));
                let mut b = (u(-0.1, 0.1), u(-0.2, 0.2));
                for _ in 0..100 {
                    if (a.0 - b.0).hypot(a.1 - b.1) > 2.0 * radius {
                        break;
                    }
                    b = (u(-0.1, 0.1), u(-0.2, 0.2));
                }
                let (ya, yb) = (
                    u(0.0, 2.0 * std::f64::consts::PI),
                    u(0.0, 2.0 * std::f64::consts::PI),
                );
                (
                    vec![
                        on_table(ox + a.0, oy + a.1, ya),
                        on_table(ox + b.0, oy + b.1, yb),
                    ],
                    [0.0; 3],
                )
            }
        }
    }

    /// The full noise-free state ([`TaskKind::state_names`]).
    pub fn true_state(&self) -> Vec<f64> {
        let w = &self.state.world;
        let mut s = Vec::with_capacity(self.config.kind.state_dim());
        s.extend(w.joint_positions());
        s.extend(w.joint_velocities());
        let tcp = w.tcp_pose().translation.vector;
        s.extend([tcp.x, tcp.y, tcp.z, w.gripper_opening()]);
        for i in 0..w.cube_count() {
            let p = w.cube_pose(i);
            s.extend(p.position);
            s.extend(p.rotation);
        }
        s.extend(self.goal());
        s
    }

    /// Starts an episode from a full state ([`Tabletop::true_state`]'s layout): joint
    /// positions and velocities, cube poses and the goal are taken; TCP and gripper opening
    /// are derived from the joints and ignored; cubes start at rest. For stack-cube the goal
    /// follows cube B and the stored one is ignored.
    pub fn reset_to_state(&mut self, state: &[f64], seed: u64) -> Result<Observation, EnvError> {
        let kind = self.config.kind;
        if state.len() != kind.state_dim() {
            return Err(EnvError::InvalidState(format!(
                "{} states have {} values ({}), got {}",
                kind.name(),
                kind.state_dim(),
                kind.state_names().join(","),
                state.len()
            )));
        }
        if let Some(i) = state.iter().position(|v| !v.is_finite()) {
            return Err(EnvError::InvalidState(format!(
                "component {i} ({}) is {} (not finite)",
                kind.state_names()[i],
                state[i]
            )));
        }
        let mut q = [0.0; 9];
        q.copy_from_slice(&state[layout::Q..layout::Q + 9]);
        self.check_joint_limits(&q)?;
        let mut cubes = Vec::new();
        for c in 0..kind.cubes() {
            let o = layout::CUBES + 7 * c;
            let p = [state[o], state[o + 1], state[o + 2]];
            let r = [state[o + 3], state[o + 4], state[o + 5], state[o + 6]];
            let norm = r.iter().map(|x| x * x).sum::<f64>().sqrt();
            if !(0.5..=2.0).contains(&norm) {
                return Err(EnvError::InvalidState(format!(
                    "cube {c}'s quaternion {r:?} is not a rotation (norm {norm})"
                )));
            }
            cubes.push(BodyPose {
                position: p,
                rotation: r.map(|x| x / norm),
            });
        }
        let g = state.len() - 3;
        let goal = [state[g], state[g + 1], state[g + 2]];
        let snapshot = self.state.clone();
        self.start(seeding::rng(seed), q, &cubes, goal);
        if let Some((cube, what, depth)) = self.state.world.cube_overlap(OVERLAP_TOLERANCE) {
            self.state = snapshot;
            return Err(EnvError::InvalidState(format!(
                "cube {cube} overlaps {what} by {:.1} mm",
                depth * 1000.0
            )));
        }
        let mut qd = [0.0; 9];
        qd.copy_from_slice(&state[layout::QD..layout::QD + 9]);
        self.state.world.set_joint_velocities(qd);
        Ok(self.observe())
    }

    /// The joint targets an action leads to from the current targets: IK for the TCP move,
    /// the finger target from the gripper component. `action` is already clamped.
    pub fn action_targets(&self, action: [f32; 4]) -> [f64; 9] {
        let w = &self.state.world;
        let q_arm = w.arm_targets();
        let model = w.model();
        let current = model.tcp_pose(&q_arm).translation.vector;
        let mut p = [0.0; 3];
        for i in 0..3 {
            p[i] = (current[i] + f64::from(action[i]) * ACTION_SCALE)
                .clamp(WORKSPACE[0][i], WORKSPACE[1][i]);
        }
        let target = Isometry3::from_parts(Translation3::new(p[0], p[1], p[2]), self.down);
        let home: [f64; ARM_DOF] = HOME_Q[..ARM_DOF].try_into().unwrap_or([0.0; ARM_DOF]);
        let (q_new, _) = model.inverse_kinematics(&q_arm, &target, &home);
        let finger =
            GRIPPER_CLOSED + (f64::from(action[3]) + 1.0) / 2.0 * (GRIPPER_OPEN - GRIPPER_CLOSED);
        let mut q = [0.0; 9];
        q[..ARM_DOF].copy_from_slice(&q_new);
        q[7] = finger;
        q[8] = finger;
        q
    }

    /// Advances one control step without episode bookkeeping: the action delay, then the
    /// controller and physics.
    pub fn advance(&mut self, action: [f32; 4]) {
        let applied = if self.state.delay == 0 {
            Some(action)
        } else {
            self.state.pending.push_back(action);
            if self.state.pending.len() > self.state.delay {
                self.state.pending.pop_front()
            } else {
                None
            }
        };
        if let Some(a) = applied {
            let q = self.action_targets(a);
            self.state.world.set_targets(q);
        }
        self.state.world.control_step();
        self.state.steps += 1;
    }

    fn arm_static(&self) -> bool {
        self.state.world.joint_velocities()[..ARM_DOF]
            .iter()
            .all(|v| v.abs() <= STATIC_QVEL)
    }

    /// ManiSkill's normalised dense reward and success of the current state.
    fn evaluate(&self) -> Evaluation {
        let w = &self.state.world;
        let tcp = w.tcp_pose().translation.vector;
        let tcp = [tcp.x, tcp.y, tcp.z];
        let goal = self.goal();
        let shaped = |d: f64| 1.0 - (5.0 * d).tanh();
        match self.config.kind {
            TaskKind::ReachGoal => {
                let d = dist(tcp, goal);
                let success = d < REACH_THRESHOLD;
                Evaluation {
                    score: if success { 1.0 } else { shaped(d) },
                    success,
                }
            }
            TaskKind::PushCube => {
                let cube = w.cube_pose(0).position;
                let success = dist_xy(cube, goal) < PUSH_GOAL_RADIUS && cube[2] < CUBE_HALF + 5e-3;
                let push_pose = [cube[0] - CUBE_HALF - 0.005, cube[1], cube[2]];
                let d_reach = dist(push_pose, tcp);
                let mut r = shaped(d_reach);
                if d_reach < 0.01 {
                    let place = shaped(dist_xy(cube, goal));
                    let z = shaped((cube[2] - CUBE_HALF).abs());
                    r += place + place * z;
                }
                Evaluation {
                    score: if success { 1.0 } else { r / 4.0 },
                    success,
                }
            }
            TaskKind::PickCube => {
                let cube = w.cube_pose(0).position;
                let grasped = w.is_grasping(0);
                let d_goal = dist(cube, goal);
                let placed = d_goal <= PICK_GOAL_THRESHOLD;
                let arm_static = self.arm_static();
                let success = placed && arm_static;
                let mut r = shaped(dist(cube, tcp));
                if grasped {
                    r += 1.0 + shaped(d_goal);
                }
                if placed {
                    let qd = w.joint_velocities();
                    let norm = qd[..ARM_DOF].iter().map(|v| v * v).sum::<f64>().sqrt();
                    r += shaped(norm);
                }
                Evaluation {
                    score: if success { 1.0 } else { r / 5.0 },
                    success,
                }
            }
            TaskKind::StackCube => {
                let a = w.cube_pose(0).position;
                let b = w.cube_pose(1).position;
                let off = [a[0] - b[0], a[1] - b[1], a[2] - b[2]];
                let xy_ok = off[0].hypot(off[1]) <= (2.0 * CUBE_HALF * CUBE_HALF).sqrt() + 0.005;
                let z_ok = (off[2] - 2.0 * CUBE_HALF).abs() <= 0.005;
                let on_b = xy_ok && z_ok;
                let (v, av) = w.cube_velocity(0);
                let speed = v.iter().map(|x| x * x).sum::<f64>().sqrt();
                let spin = av.iter().map(|x| x * x).sum::<f64>().sqrt();
                let a_static = speed <= 1e-2 && spin <= 0.5;
                let grasped = w.is_grasping(0);
                let success = on_b && a_static && !grasped;
                let mut r = 2.0 * shaped(dist(tcp, a));
                if grasped {
                    r = 4.0 + shaped(dist(a, goal));
                }
                if on_b {
                    let ungrasp = if grasped {
                        w.gripper_opening() / (2.0 * GRIPPER_OPEN)
                    } else {
                        1.0
                    };
                    let still = 1.0 - (speed * 10.0 + spin).tanh();
                    r = 6.0 + (ungrasp + still) / 2.0;
                }
                Evaluation {
                    score: if success { 1.0 } else { r / 8.0 },
                    success,
                }
            }
        }
    }

    /// The current success flag.
    pub fn is_success(&self) -> bool {
        self.evaluate().success
    }

    /// The current score (normalised dense reward) in [0, 1].
    pub fn score(&self) -> f64 {
        self.evaluate().score
    }
}

/// The observation space of an arm task: the state components `indices` of `names` (bounded
/// by +-10), the camera image in pixels mode, and `text` when an instruction comes along.
pub(crate) fn arm_observation_space(
    names: &[String],
    indices: &[usize],
    obs: ObsMode,
    image_size: u32,
    text: bool,
) -> ObservationSpace {
    let n = indices.len();
    ObservationSpace {
        state: Some(BoxSpace {
            low: vec![-10.0; n],
            high: vec![10.0; n],
            names: indices.iter().map(|&i| names[i].clone()).collect(),
        }),
        image: (obs == ObsMode::Pixels).then_some(ImageSpace {
            height: image_size,
            width: image_size,
        }),
        text,
        agents: 1,
        entities: Vec::new(),
    }
}

/// `Task::unobserved` of an arm task: camera pose and colour jitter only change camera
/// images, which a state policy does not observe; a pixels policy observes every field.
pub(crate) fn camera_only_unobserved(obs: ObsMode, fields: &[String]) -> Option<String> {
    if fields.is_empty() || obs == ObsMode::Pixels {
        return None;
    }
    let camera_only = fields.iter().all(|f| {
        matches!(
            f.as_str(),
            "camera_pos_jitter" | "camera_rot_jitter" | "color_jitter"
        )
    });
    camera_only.then(|| {
        "camera pose and colour jitter only change camera images (the policy observes states)"
            .into()
    })
}

impl Env for Tabletop {
    type Snapshot = Snapshot;

    fn observation_space(&self) -> ObservationSpace {
        let all = self.config.kind.state_names();
        let indices = observed_indices(self.config.kind, self.config.obs);
        arm_observation_space(
            &all,
            &indices,
            self.config.obs,
            self.config.image_size,
            false,
        )
    }

    fn action_space(&self) -> BoxSpace {
        BoxSpace::uniform(&["dx", "dy", "dz", "gripper"], -1.0, 1.0)
    }

    fn max_episode_steps(&self) -> usize {
        self.config.max_episode_steps
    }

    /// Joint positions N(home, 0.02) with the gripper open (ManiSkill's TableSceneBuilder),
    /// cubes and goal after ManiSkill's spawn ranges.
    fn reset(&mut self, seed: u64) -> Observation {
        let mut rng = seeding::rng(seed);
        let q = self.initial_joints(&mut rng);
        let (cubes, goal) = self.draw_scene(&mut rng);
        self.start(rng, q, &cubes, goal);
        self.observe()
    }

    fn step(&mut self, action: &[f32]) -> Result<StepResult, EnvError> {
        if self.state.done {
            return Err(EnvError::EpisodeOver);
        }
        let mut a = action.to_vec();
        let clamped = self.action_space().check_and_clamp(&mut a)?;
        self.advance([a[0], a[1], a[2], a[3]]);
        let e = self.evaluate();
        let truncated = !e.success && self.state.steps >= self.config.max_episode_steps;
        self.state.done = e.success || truncated;
        Ok(StepResult {
            obs: self.observe(),
            reward: e.score as f32,
            terminated: e.success,
            truncated,
            info: Info {
                metrics: Vec::new(),
                score: e.score as f32,
                success: e.success,
                clamped,
            },
        })
    }

    fn snapshot(&self) -> Snapshot {
        self.state.clone()
    }

    fn restore(&mut self, snapshot: &Snapshot) -> Observation {
        self.state = snapshot.clone();
        self.observe()
    }

    fn observe(&mut self) -> Observation {
        let s = self.true_state();
        let std = self.config.randomize.obs_noise;
        let indices = observed_indices(self.config.kind, self.config.obs);
        let mut out: Vec<f32> = Vec::with_capacity(indices.len());
        let noisy = noisy_components(self.config.kind);
        let normal = (std > 0.0).then(|| Normal::new(0.0, std).unwrap_or_else(|_| unreachable!()));
        for i in indices {
            let n = match (&normal, noisy(i)) {
                (Some(d), true) => d.sample(&mut self.state.rng),
                _ => 0.0,
            };
            out.push((s[i] + n) as f32);
        }
        let image = match self.renderer.take() {
            Some(mut renderer) => {
                let image = self.draw(&mut renderer);
                self.renderer = Some(renderer);
                Some(image)
            }
            None => None,
        };
        Observation {
            state: out,
            image,
            text: None,
        }
    }

    fn elapsed_steps(&self) -> usize {
        self.state.steps
    }

    fn scene(&self) -> Option<diffrl_core::scene::Scene> {
        Some(crate::scene::scene(self))
    }

    /// 1 cm for positions, 0.1 rad for joints, 0.5 for velocities and quaternions (per
    /// observed state component).
    fn anchor_cells(&self) -> Option<Vec<f32>> {
        let kind = self.config.kind;
        Some(
            observed_indices(kind, self.config.obs)
                .into_iter()
                .map(|i| {
                    if i < layout::QD {
                        0.1
                    } else if i < layout::TCP {
                        0.5
                    } else if noisy_components(kind)(i) {
                        0.01
                    } else {
                        0.5
                    }
                })
                .collect(),
        )
    }
}

/// Indices into the state vector ([`TaskKind::state_names`]) of the proprioception that
/// pixels observations carry: the 9 joint positions, the TCP position, the gripper opening,
/// and for reach-goal and pick-cube the goal position (16 values; 13 for push and stack).
pub fn proprio_indices(kind: TaskKind) -> Vec<usize> {
    let mut v: Vec<usize> = (layout::Q..layout::Q + 9)
        .chain(layout::TCP..layout::GRIPPER + 1)
        .collect();
    if matches!(kind, TaskKind::ReachGoal | TaskKind::PickCube) {
        let d = kind.state_dim();
        v.extend(d - 3..d);
    }
    v
}

/// Indices into the state vector of an observation's state part in mode `obs`.
pub fn observed_indices(kind: TaskKind, obs: ObsMode) -> Vec<usize> {
    match obs {
        ObsMode::State => (0..kind.state_dim()).collect(),
        ObsMode::Pixels => proprio_indices(kind),
    }
}

/// Which state components are positions (noised by `obs_noise`): joint positions, TCP, cube
/// positions, goal; not velocities, gripper opening nor quaternions.
fn noisy_components(kind: TaskKind) -> impl Fn(usize) -> bool {
    let dim = kind.state_dim();
    move |i| {
        i < layout::QD
            || (layout::TCP..layout::TCP + 3).contains(&i)
            || i >= dim - 3
            || (i >= layout::CUBES && (i - layout::CUBES) % 7 < 3)
    }
}

/// The TCP position as a vector (for experts).
pub fn vec3(v: [f64; 3]) -> Vector3<f64> {
    Vector3::new(v[0], v[1], v[2])
}
