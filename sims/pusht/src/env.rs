//! The Push-T environment: gym-pusht 0.1.8's task on Rapier, behind core's [`Env`] trait.

use std::collections::VecDeque;
use std::f64::consts::PI;

use diffrl_core::config::{Invalid, Validate, ensure};
use diffrl_core::seeding::{self, Rng};
use diffrl_core::{
    BoxSpace, Env, EnvError, ImageObs, ImageSpace, Info, Observation, ObservationSpace, StepResult,
};
use rand::Rng as _;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};

use crate::geometry::{self, GOAL, Pose};
use crate::physics::{PhysicsParams, World};
use crate::render::{Scene, render_rgb};

/// Coverage above which the task is solved.
pub const SUCCESS_THRESHOLD: f64 = 0.95;

/// GiGPO anchor cell size of every state dimension: 5 px for positions and keypoints. The block
/// angle of the 5-d state gets 5 as well, i.e. 5 rad, so it hardly splits anchors: 5 in every
/// dimension is the single grid GiGPO used before environments gave their own cells, and keeps
/// its results. A finer angle cell is untested.
pub const ANCHOR_CELL: f32 = 5.0;

/// gym-pusht's TimeLimit.
pub const MAX_EPISODE_STEPS: usize = 300;
/// Target positions in the arena.
static ACTION_SPACE: std::sync::LazyLock<BoxSpace> =
    std::sync::LazyLock::new(|| BoxSpace::uniform(&["x", "y"], 0.0, 512.0));

/// The task instruction stored in datasets.
pub const TASK: &str = "Push the T-shaped block onto the T-shaped target.";

/// What the policy observes (no `Default`: a config's omitted `obs` is [`PushTConfig`]'s,
/// the builder's is gym-pusht's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ObsMode {
    /// `[agent_x, agent_y, block_x, block_y, angle mod 2 pi]`.
    State,
    /// The 8 T corners (16 values) followed by the agent position (2).
    Keypoints,
    /// A 96 x 96 RGB top view plus the agent position as state.
    Pixels,
}

impl std::str::FromStr for ObsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "state" => Ok(Self::State),
            "keypoints" => Ok(Self::Keypoints),
            "pixels" => Ok(Self::Pixels),
            _ => Err(format!(
                "unknown observation mode {s:?} (expected state, keypoints or pixels)"
            )),
        }
    }
}

/// A closed range `[lo, hi]` a parameter is drawn from uniformly at every reset.
pub type Range = [f64; 2];

/// Domain randomisation. Each range is sampled at reset; the defaults are gym-pusht's fixed
/// values (ranges of width zero), so an unrandomised environment is exactly gym-pusht.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Randomization {
    /// Block mass.
    pub block_mass: Range,
    /// Block moment of inertia.
    pub block_inertia: Range,
    /// Friction coefficient of all shapes.
    pub friction: Range,
    /// PD proportional gain.
    pub kp: Range,
    /// PD derivative gain.
    pub kv: Range,
    /// Control steps between choosing an action and applying it (inclusive integer range);
    /// until the first delayed action arrives, the agent holds its position.
    pub action_delay: [u32; 2],
    /// Standard deviation of Gaussian noise on observed positions (pixels).
    pub obs_noise_px: f64,
    /// Standard deviation of Gaussian noise on the observed angle (radians).
    pub obs_noise_rad: f64,
    /// Per-channel brightness multiplier range for pixel observations.
    pub image_tint: Range,
}

impl Default for Randomization {
    fn default() -> Self {
        Self {
            block_mass: [1.0, 1.0],
            block_inertia: [3000.0, 3000.0],
            friction: [0.0, 0.0],
            kp: [100.0, 100.0],
            kv: [20.0, 20.0],
            action_delay: [0, 0],
            obs_noise_px: 0.0,
            obs_noise_rad: 0.0,
            image_tint: [1.0, 1.0],
        }
    }
}

impl Validate for Randomization {
    fn validate(&self) -> Result<(), Invalid> {
        let positive = |name: &str, r: Range| {
            ensure(
                r[0].is_finite() && r[1].is_finite() && r[0] > 0.0 && r[0] <= r[1],
                name,
                format!("must be a range [lo, hi] with 0 < lo <= hi, got {r:?}"),
            )
        };
        positive("block_mass", self.block_mass)?;
        positive("block_inertia", self.block_inertia)?;
        positive("kp", self.kp)?;
        positive("image_tint", self.image_tint)?;
        let nonneg = |name: &str, r: Range| {
            ensure(
                r[0].is_finite() && r[1].is_finite() && r[0] >= 0.0 && r[0] <= r[1],
                name,
                format!("must be a range [lo, hi] with 0 <= lo <= hi, got {r:?}"),
            )
        };
        nonneg("friction", self.friction)?;
        nonneg("kv", self.kv)?;
        ensure(
            self.action_delay[0] <= self.action_delay[1] && self.action_delay[1] <= 10,
            "action_delay",
            "must be [lo, hi] with lo <= hi <= 10 steps",
        )?;
        ensure(
            self.obs_noise_px >= 0.0 && self.obs_noise_px.is_finite(),
            "obs_noise_px",
            "must be >= 0",
        )?;
        ensure(
            self.obs_noise_rad >= 0.0 && self.obs_noise_rad.is_finite(),
            "obs_noise_rad",
            "must be >= 0",
        )
    }
}

/// Push-T settings as they appear in a config file's `[env]` table. Its `Default` is what an
/// omitted table or key means there: keypoint observations (the main job's, docs/policy.md),
/// gym-pusht's image size, step limit and physics. [`PushT::builder`] starts from gym-pusht's
/// own defaults instead (5-d state observations).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PushTConfig {
    /// Observation mode.
    pub obs: ObsMode,
    /// Image side for pixel observations.
    pub image_size: u32,
    /// Step limit.
    pub max_episode_steps: usize,
    /// Domain randomisation.
    pub randomize: Randomization,
}

impl Default for PushTConfig {
    fn default() -> Self {
        Self {
            obs: ObsMode::Keypoints,
            image_size: 96,
            max_episode_steps: MAX_EPISODE_STEPS,
            randomize: Randomization::default(),
        }
    }
}

impl Validate for PushTConfig {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            (8..=1024).contains(&self.image_size),
            "image_size",
            "must be in 8..=1024",
        )?;
        ensure(
            self.max_episode_steps >= 1,
            "max_episode_steps",
            "must be at least 1",
        )?;
        self.randomize.validate().map_err(|e| e.within("randomize"))
    }
}

/// Builder for [`PushT`], e.g. `PushT::builder().obs(ObsMode::Pixels).build()`.
#[derive(Debug, Clone)]
pub struct PushTBuilder {
    config: PushTConfig,
}

/// gym-pusht's defaults: 5-d state observations, 96 px images, 300 steps, fixed physics.
impl Default for PushTBuilder {
    fn default() -> Self {
        Self {
            config: PushTConfig {
                obs: ObsMode::State,
                ..PushTConfig::default()
            },
        }
    }
}

impl PushTBuilder {
    /// Observation mode.
    pub fn obs(mut self, obs: ObsMode) -> Self {
        self.config.obs = obs;
        self
    }
    /// Domain randomisation.
    pub fn randomize(mut self, r: Randomization) -> Self {
        self.config.randomize = r;
        self
    }
    /// Step limit.
    pub fn max_episode_steps(mut self, n: usize) -> Self {
        self.config.max_episode_steps = n;
        self
    }
    /// All settings at once.
    pub fn config(mut self, c: PushTConfig) -> Self {
        self.config = c;
        self
    }
    /// The environment (reset to seed 0).
    pub fn build(self) -> PushT {
        PushT::new(self.config)
    }
}

/// Everything needed to continue an episode exactly.
#[derive(Clone)]
pub struct Snapshot {
    world: World,
    steps: usize,
    rng: Rng,
    pending: VecDeque<[f64; 2]>,
    delay: usize,
    tint: [f32; 3],
    done: bool,
}

/// The Push-T environment.
#[derive(Clone)]
pub struct PushT {
    config: PushTConfig,
    state: Snapshot,
}

fn draw(rng: &mut Rng, r: Range) -> f64 {
    if r[0] == r[1] {
        r[0]
    } else {
        rng.random_range(r[0]..=r[1])
    }
}

impl PushT {
    /// A builder with gym-pusht's defaults.
    pub fn builder() -> PushTBuilder {
        PushTBuilder::default()
    }

    /// An environment from a validated config, reset with seed 0.
    pub fn new(config: PushTConfig) -> Self {
        let state = Snapshot {
            world: World::new(PhysicsParams::default()),
            steps: 0,
            rng: seeding::rng(0),
            pending: VecDeque::new(),
            delay: 0,
            tint: [1.0; 3],
            done: false,
        };
        let mut env = Self { config, state };
        env.reset(0);
        env
    }

    /// The settings.
    pub fn config(&self) -> &PushTConfig {
        &self.config
    }

    /// Starts an episode in `rng`'s draw of the randomised physics, then applies gym-pusht's
    /// `_set_state` with the legacy order.
    fn start(&mut self, mut rng: Rng, agent: [f64; 2], block: [f64; 2], angle: f64) -> Observation {
        let r = &self.config.randomize;
        let physics = PhysicsParams {
            block_mass: draw(&mut rng, r.block_mass) as f32,
            block_inertia: draw(&mut rng, r.block_inertia) as f32,
            friction: draw(&mut rng, r.friction) as f32,
            kp: draw(&mut rng, r.kp),
            kv: draw(&mut rng, r.kv),
        };
        let delay = rng.random_range(r.action_delay[0]..=r.action_delay[1]) as usize;
        let tint = [0; 3].map(|_| draw(&mut rng, r.image_tint) as f32);
        let mut world = World::new(physics);
        world.set_state_legacy(agent, block, angle);
        self.state = Snapshot {
            world,
            steps: 0,
            rng,
            pending: VecDeque::new(),
            delay,
            tint,
            done: false,
        };
        self.observe()
    }

    /// gym-pusht's `reset(options={"reset_to_state": [ax, ay, bx, by, angle]})`, legacy quirk
    /// included: the observed block position differs from the one passed unless angle = 0.
    pub fn reset_to_state(&mut self, state: [f64; 5], seed: u64) -> Result<Observation, EnvError> {
        if let Some(i) = state.iter().position(|v| !v.is_finite()) {
            return Err(EnvError::InvalidState(format!(
                "component {i} is {} (not finite)",
                state[i]
            )));
        }
        Ok(self.start(
            seeding::rng(seed),
            [state[0], state[1]],
            [state[2], state[3]],
            state[4],
        ))
    }

    /// Block pose.
    pub fn block_pose(&self) -> Pose {
        self.state.world.block_pose()
    }

    /// Agent position.
    pub fn agent_pos(&self) -> [f64; 2] {
        self.state.world.agent_pos
    }

    /// Agent velocity.
    pub fn agent_vel(&self) -> [f64; 2] {
        self.state.world.agent_vel
    }

    /// Coverage of the goal by the block, in [0, 1].
    pub fn coverage(&self) -> f64 {
        geometry::coverage(&self.block_pose(), &GOAL)
    }

    /// gym-pusht's 5-d state (noise free): agent, block origin, angle mod 2 pi.
    pub fn true_state(&self) -> [f64; 5] {
        let b = self.block_pose();
        let [ax, ay] = self.agent_pos();
        [ax, ay, b.x, b.y, b.angle.rem_euclid(2.0 * PI)]
    }

    /// The physics constants drawn for this episode.
    pub fn physics(&self) -> PhysicsParams {
        self.state.world.physics
    }

    /// A top-view RGB image of `size` x `size`.
    pub fn render(&self, size: u32) -> Vec<u8> {
        let scene = Scene {
            agent: self.agent_pos(),
            block: self.block_pose(),
            goal: GOAL,
            tint: self.state.tint,
        };
        render_rgb(&scene, size)
    }

    /// Advances physics for one control step without the episode bookkeeping (used by the
    /// expert's look-ahead): applies the action delay, then the PD control and physics.
    pub fn advance(&mut self, target: [f64; 2]) {
        let s = &mut self.state;
        let applied = if s.delay == 0 {
            Some(target)
        } else {
            s.pending.push_back(target);
            if s.pending.len() > s.delay {
                s.pending.pop_front()
            } else {
                None
            }
        };
        // Until a delayed action arrives the agent holds its position (target = where it is).
        let applied = applied.unwrap_or(s.world.agent_pos);
        s.world.control_step(applied);
        s.steps += 1;
    }
}

/// The keypoint observation (gym-pusht's `keypoints` mode: the 8 corners, then the agent) of
/// a recorded 5-d state [agent_x, agent_y, block_x, block_y, angle]; `None` for another width.
/// Datasets record states, so a keypoint policy is trained on their keypoint views.
pub fn keypoint_observation(state: &[f32]) -> Option<Vec<f32>> {
    let &[ax, ay, bx, by, angle] = state else {
        return None;
    };
    let pose = Pose::new(f64::from(bx), f64::from(by), f64::from(angle));
    let mut v: Vec<f32> = geometry::keypoints(&pose)
        .iter()
        .map(|&x| x as f32)
        .collect();
    v.extend([ax, ay]);
    Some(v)
}

/// The 5-d state [agent_x, agent_y, block_x, block_y, angle mod 2 pi] behind a keypoint
/// observation (the inverse of [`keypoint_observation`]: the angle from the bar's two bottom
/// corners, the origin as the mean over the corners); `None` for another width.
pub fn state_from_keypoints(kp: &[f32]) -> Option<[f32; 5]> {
    if kp.len() != 18 {
        return None;
    }
    let p = |i: usize| [f64::from(kp[2 * i]), f64::from(kp[2 * i + 1])];
    let ([x0, y0], [x1, y1]) = (p(0), p(1));
    let local = geometry::KEYPOINTS;
    let angle =
        (y1 - y0).atan2(x1 - x0) - (local[1][1] - local[0][1]).atan2(local[1][0] - local[0][0]);
    let rot = Pose::new(0.0, 0.0, angle);
    let (mut bx, mut by) = (0.0, 0.0);
    for (i, l) in local.iter().enumerate() {
        let [rx, ry] = rot.apply(*l);
        let [x, y] = p(i);
        bx += (x - rx) / local.len() as f64;
        by += (y - ry) / local.len() as f64;
    }
    Some([
        kp[16],
        kp[17],
        bx as f32,
        by as f32,
        angle.rem_euclid(2.0 * PI) as f32,
    ])
}

impl Env for PushT {
    type Snapshot = Snapshot;

    fn observation_space(&self) -> ObservationSpace {
        let (state, image) = match self.config.obs {
            ObsMode::State => (
                BoxSpace {
                    low: vec![0.0; 5],
                    high: vec![512.0, 512.0, 512.0, 512.0, 2.0 * PI as f32],
                    names: ["agent_x", "agent_y", "block_x", "block_y", "block_angle"]
                        .map(String::from)
                        .to_vec(),
                },
                None,
            ),
            ObsMode::Keypoints => {
                let mut names: Vec<String> = (0..8)
                    .flat_map(|i| [format!("kp{i}_x"), format!("kp{i}_y")])
                    .collect();
                names.extend(["agent_x".into(), "agent_y".into()]);
                (
                    BoxSpace {
                        low: vec![0.0; 18],
                        high: vec![512.0; 18],
                        names,
                    },
                    None,
                )
            }
            ObsMode::Pixels => (
                BoxSpace::uniform(&["agent_x", "agent_y"], 0.0, 512.0),
                Some(ImageSpace {
                    height: self.config.image_size,
                    width: self.config.image_size,
                }),
            ),
        };
        ObservationSpace {
            state: Some(state),
            image,
            text: false,
            agents: 1,
            entities: Vec::new(),
        }
    }

    fn action_space(&self) -> BoxSpace {
        ACTION_SPACE.clone()
    }

    /// [`ANCHOR_CELL`] in every state dimension.
    fn anchor_cells(&self) -> Option<Vec<f32>> {
        let dims = self.observation_space().state.map_or(0, |s| s.dim());
        Some(vec![ANCHOR_CELL; dims])
    }

    fn max_episode_steps(&self) -> usize {
        self.config.max_episode_steps
    }

    /// Agent and block positions are integers drawn uniformly from [50, 450) and [100, 400)
    /// and the angle from [-pi, pi), as gym-pusht 0.1.8 draws them (with our own RNG stream).
    fn reset(&mut self, seed: u64) -> Observation {
        let mut rng = seeding::rng(seed);
        let agent = [
            rng.random_range(50..450) as f64,
            rng.random_range(50..450) as f64,
        ];
        let block = [
            rng.random_range(100..400) as f64,
            rng.random_range(100..400) as f64,
        ];
        let angle = rng.random_range(-PI..PI);
        self.start(rng, agent, block, angle)
    }

    fn step(&mut self, action: &[f32]) -> Result<StepResult, EnvError> {
        if self.state.done {
            return Err(EnvError::EpisodeOver);
        }
        let mut a = action.to_vec();
        let clamped = ACTION_SPACE.check_and_clamp(&mut a)?;
        self.advance([a[0] as f64, a[1] as f64]);
        let coverage = self.coverage();
        let reward = (coverage / SUCCESS_THRESHOLD).clamp(0.0, 1.0) as f32;
        let success = coverage > SUCCESS_THRESHOLD;
        let truncated = !success && self.state.steps >= self.config.max_episode_steps;
        self.state.done = success || truncated;
        Ok(StepResult {
            obs: self.observe(),
            reward,
            terminated: success,
            truncated,
            info: Info {
                metrics: Vec::new(),
                score: coverage as f32,
                success,
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
        let r = &self.config.randomize;
        let (px, rad) = (r.obs_noise_px, r.obs_noise_rad);
        let mut noise = |std: f64| {
            if std > 0.0 {
                Normal::new(0.0, std)
                    .expect("std validated finite")
                    .sample(&mut self.state.rng)
            } else {
                0.0
            }
        };
        let [ax, ay] = self.state.world.agent_pos;
        let (ax, ay) = (ax + noise(px), ay + noise(px));
        match self.config.obs {
            ObsMode::State => {
                let b = self.state.world.block_pose();
                let angle = (b.angle + noise(rad)).rem_euclid(2.0 * PI);
                Observation::state(vec![
                    ax as f32,
                    ay as f32,
                    (b.x + noise(px)) as f32,
                    (b.y + noise(px)) as f32,
                    angle as f32,
                ])
            }
            ObsMode::Keypoints => {
                let b = self.state.world.block_pose();
                let noisy = Pose::new(b.x + noise(px), b.y + noise(px), b.angle + noise(rad));
                let mut v: Vec<f32> = geometry::keypoints(&noisy)
                    .iter()
                    .map(|&x| x as f32)
                    .collect();
                v.extend([ax as f32, ay as f32]);
                Observation::state(v)
            }
            ObsMode::Pixels => {
                let size = self.config.image_size;
                let data = self.render(size);
                Observation {
                    state: vec![ax as f32, ay as f32],
                    image: Some(ImageObs {
                        height: size,
                        width: size,
                        data,
                    }),
                    text: None,
                }
            }
        }
    }

    fn elapsed_steps(&self) -> usize {
        self.state.steps
    }

    fn scene(&self) -> Option<diffrl_core::scene::Scene2d> {
        Some(crate::scene::scene(self))
    }
}
