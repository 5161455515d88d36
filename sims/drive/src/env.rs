//! The driving scenarios: N cooperative controlled agents among background traffic.
//!
//! - `highway-merge`: IDM + MOBIL traffic on a highway with an on-ramp (highway-env's merge-v0
//!   road, [`MergeLayout`]). Agent 0 (and 3) start on the ramp and must merge before the merge
//!   lane's barrier; agents 1 and 2 start on the main road upstream and must let them in. The
//!   episode succeeds when every agent has passed `goal_x` without a collision or leaving the
//!   road, and ends at once when an agent that has not arrived yet collides or leaves the road
//!   (docs/driving.md, "The merge scenario").
//! - `intersection` and `roundabout` ([`Scenario::junction`]): every vehicle drives a route
//!   through a four-way junction with a priority road ([`IntersectionLayout`]) or a single-lane
//!   roundabout ([`RoundaboutLayout`]); background drivers give way by highway-env's
//!   right-of-way rule ([`Traffic::regulate`], every half second). Agents arrive `exit` m
//!   along their exit lane; progress is measured along the route (docs/driving.md, "The
//!   junctions").
//!
//! - Actions: per agent `[acceleration, steering]` in [-1, 1], mapped linearly to +-5 m/s^2
//!   and +-pi/4 rad (highway-env's `ContinuousAction` ranges and order), held for the
//!   `sim_hz / policy_hz` physics steps of a control step (highway-env's 15 Hz physics); or,
//!   with `[env] actions = "waypoints"` ([`DriveActions`]), per agent `[dx, dy]`: where to be
//!   at the end of the control step, turned into those commands by a tracker.
//! - Observations: one agent-centric block per agent ([`AGENT_OBS`] + 6 x `neighbours`
//!   values), stacked in agent order; `ObservationSpace::agents` says how many.
//! - Reward per step ([`DriveReward`] weights, `[env.reward]`): the mean over agents of the
//!   fraction of its route covered in the step (the episode's sum is the mean
//!   progress), minus `collision` at the step an agent collides (else `off_road` if one leaves
//!   the road), minus `jerk` x the agents' mean |change of commanded acceleration| per second.
//!   Defaults 1, 1, 1, 0. Score: the mean route progress; success as above.
//! - Metrics at the end of each episode (`Info::metrics`): `collision` and `off_road` (1 when an
//!   agent that had not arrived collided / left the road), `collision_agents` and
//!   `collision_traffic` (the collision was between two agents / with a background vehicle),
//!   `progress` (the score), `speed`
//!   (agents' mean speed over the control steps, m/s) and `jerk` (mean |change of commanded
//!   acceleration| per second, m/s^3); with `expert_reference`, `ade` and `fde` (m: distance
//!   to the expert's drive of the same scene, [`Drive::expert_displacement`]).
//! - Background drivers may react late: `[env.randomize] reaction_delay` delays each one's
//!   acceleration commands ([`Traffic::react`]).

use diffrl_core::EnvError;
use diffrl_core::config::{Invalid, Validate, ensure, ensure_range};
use diffrl_core::env::{Env, Info, StepResult};
use diffrl_core::scene::{ActionPaths2d, Scene2d, Shape2d};
use diffrl_core::seeding::{self, Rng};
use diffrl_core::space::{
    BoxSpace, EntityGroup, ImageObs, ImageSpace, Observation, ObservationSpace,
};
use rand::Rng as _;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, LazyLock};

use crate::kinematics::{VehicleState, body_displacement, rollout, track};
use crate::raster::RoadMask;
use crate::road::{IntersectionLayout, MergeLayout, Road, RoundaboutLayout, Turn, wrap_to_pi};
use crate::scene::{CheckedScene, RoadScene};
use crate::traffic::{Driver, Traffic, Vehicle};

/// Largest acceleration command (m/s^2): highway-env's `ContinuousAction.acceleration_range`.
pub const ACCELERATION_RANGE: f64 = 5.0;
/// Largest steering command (rad): highway-env's `ContinuousAction.steering_range`.
pub const STEERING_RANGE: f64 = std::f64::consts::FRAC_PI_4;
/// Values per agent before its neighbours: speed / 30, heading error to the lane, lateral
/// offset / lane width, distance to the goal / 100 (to `goal_x` on the highway, along the
/// route on a junction), distance to the end of a lane that ends (/ 100, capped at 1; 1 on
/// lanes that go on), then for the lanes left of, at and right of the vehicle: present, and the
/// lateral offset (/ 10) of their centre lines at 0, 20 and 40 m ahead in the vehicle's frame
/// (on a junction the lane's points ahead follow the agent's route, so they show its turn).
pub const AGENT_OBS: usize = 5 + 3 * 4;
/// Values per observed neighbour: present, dx / 50, dy / 10, dvx / 10, dvy / 10 (in the
/// agent's frame), and whether it is a controlled agent.
pub const NEIGHBOUR_OBS: usize = 6;
/// Neighbours beyond this distance (m) are not observed.
pub const OBS_RANGE: f64 = 80.0;

/// Longitudinal waypoint range (m): `dx` = +-1 is this far ahead of (behind) the agent at the
/// end of the control step: 40 m/s, highway-env's speed limit, over 0.2 s (5 Hz control).
pub const WAYPOINT_DX: f64 = 8.0;
/// Lateral waypoint range (m): `dy` = +-1 is this far to the left (right): about the most full
/// steering moves a car sideways in 0.2 s at 25 m/s.
pub const WAYPOINT_DY: f64 = 4.0;

/// The `[steering (rad), acceleration (m/s^2)]` agent `a`'s part of a controls `action`
/// commands.
fn command(action: &[f32], a: usize) -> [f64; 2] {
    [
        f64::from(action[2 * a + 1]) * STEERING_RANGE,
        f64::from(action[2 * a]) * ACCELERATION_RANGE,
    ]
}

/// The `[steering (rad), acceleration (m/s^2)]` held over a control step of `substeps` physics
/// steps of `dt` s for the action `row` (one agent's two components, in [-1, 1]) of a vehicle
/// in `state`: the controls themselves, or the tracker's command for the waypoint `horizon`
/// control steps ahead (the constant command that would reach it then, held for this step
/// only).
fn agent_command(
    mode: DriveActions,
    horizon: usize,
    state: VehicleState,
    row: [f32; 2],
    substeps: usize,
    dt: f64,
) -> [f64; 2] {
    match mode {
        DriveActions::Controls => command(&row, 0),
        DriveActions::Waypoints => {
            let h = horizon.max(1);
            let target = [
                f64::from(row[0]) * WAYPOINT_DX * h as f64,
                f64::from(row[1]) * WAYPOINT_DY * h as f64,
            ];
            // Actions are checked finite before they get here; a non-finite state (never
            // reached from a reset) coasts.
            track(
                state,
                target,
                substeps * h,
                dt,
                [STEERING_RANGE, ACCELERATION_RANGE],
            )
            .unwrap_or([0.0, 0.0])
        }
    }
}

/// What the agents' actions command (`[env] actions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriveActions {
    /// Per agent `[acceleration, steering]` in [-1, 1]: +-5 m/s^2 and +-pi/4 rad, highway-env's
    /// `ContinuousAction`.
    #[default]
    Controls,
    /// Per agent `[dx, dy]` in [-1, 1]: the waypoint where the agent should be at the end of
    /// the control step, in its frame at the step's start (+-[`WAYPOINT_DX`] m ahead,
    /// +-[`WAYPOINT_DY`] m to the left), so that a chunk of actions is a planned trajectory.
    /// A tracker turns each waypoint into the steering and acceleration that reach it
    /// ([`crate::kinematics::track`], within the controls' ranges).
    Waypoints,
}

/// Domain randomisation of the traffic, drawn at every reset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DriveRandomization {
    /// Background vehicles' IDM target speed range (m/s).
    pub target_speed: [f64; 2],
    /// Background vehicles' IDM time gap range (s); highway-env: 1.5.
    pub time_wanted: [f64; 2],
    /// Background vehicles' IDM exponent range; highway-env's `DELTA_RANGE` is [3.5, 4.5].
    pub delta: [f64; 2],
    /// Background spawn density: gaps between vehicles are divided by it.
    pub density: [f64; 2],
    /// Standard deviation of Gaussian noise on every observed value (0 = none).
    pub obs_noise: f64,
    /// Background drivers' reaction time range (s): each draws one, and its acceleration
    /// commands take effect that much later (rounded to physics steps). [0, 0]: none.
    pub reaction_delay: [f64; 2],
}

impl Default for DriveRandomization {
    fn default() -> Self {
        Self {
            target_speed: [23.0, 30.0],
            time_wanted: [1.5, 1.5],
            delta: [4.0, 4.0],
            density: [1.0, 1.0],
            obs_noise: 0.0,
            reaction_delay: [0.0, 0.0],
        }
    }
}

impl Validate for DriveRandomization {
    fn validate(&self) -> Result<(), Invalid> {
        ensure_range(self.target_speed, "target_speed", 1.0, 40.0)?;
        ensure_range(self.time_wanted, "time_wanted", 0.1, 10.0)?;
        ensure_range(self.delta, "delta", 1.0, 10.0)?;
        ensure_range(self.density, "density", 0.0, 3.0)?;
        ensure_range(self.reaction_delay, "reaction_delay", 0.0, 2.0)?;
        ensure(
            self.obs_noise.is_finite() && self.obs_noise >= 0.0,
            "obs_noise",
            format!("must be a finite number >= 0, got {}", self.obs_noise),
        )
    }
}

/// Weights of the step reward's terms (Multi-ORFT's dense trajectory reward: progress,
/// collision, off-road, comfort).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DriveReward {
    /// Times the agents' mean share of their route covered in the step.
    pub progress: f64,
    /// Subtracted at the step an agent that has not arrived collides.
    pub collision: f64,
    /// Subtracted at the step an agent that has not arrived leaves the road (not added again
    /// when it collides at the same step).
    pub off_road: f64,
    /// Times the agents' mean |change of commanded acceleration| per second (m/s^3),
    /// subtracted.
    pub jerk: f64,
}

impl Default for DriveReward {
    fn default() -> Self {
        Self {
            progress: 1.0,
            collision: 1.0,
            off_road: 1.0,
            jerk: 0.0,
        }
    }
}

impl Validate for DriveReward {
    fn validate(&self) -> Result<(), Invalid> {
        for (name, v) in [
            ("progress", self.progress),
            ("collision", self.collision),
            ("off_road", self.off_road),
            ("jerk", self.jerk),
        ] {
            ensure(
                v.is_finite() && (0.0..=1000.0).contains(&v),
                name,
                format!("must be a number in 0..=1000, got {v}"),
            )?;
        }
        Ok(())
    }
}

/// The `[env]` table of the driving tasks (`highway-merge`, `intersection`, `roundabout`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DriveConfig {
    /// Controlled agents (1..=4). On the highway 0 on the ramp, 1 on the outer main lane, 2 on
    /// the next main lane (or the same with one lane), 3 on the ramp behind 0; on a junction
    /// they enter from the south, east, north and west arm.
    pub agents: usize,
    /// Main lanes of the highway (1..=4).
    pub lanes: usize,
    /// Step limit (control steps).
    pub max_episode_steps: usize,
    /// Control steps per second.
    pub policy_hz: u32,
    /// Physics steps per second (a multiple of `policy_hz`); highway-env: 15.
    pub sim_hz: u32,
    /// Where agents' routes end on the highway (m along the road; the merge lane ends at 310).
    pub goal_x: f64,
    /// Nearest vehicles each agent observes.
    pub neighbours: usize,
    /// What an agent's action commands: `"controls"` (acceleration and steering) or
    /// `"waypoints"` (where to be at the end of the control step, tracked by a controller).
    pub actions: DriveActions,
    /// With waypoints: how many control steps ahead each waypoint lies (1..=10; the ranges
    /// scale with it). The tracker steers for the constant command that would reach it then
    /// and holds that for one control step, so a waypoint further ahead makes the commands
    /// less sensitive to its errors (the acceleration's gain falls with the square).
    pub waypoint_steps: usize,
    /// Domain randomisation.
    pub randomize: DriveRandomization,
    /// Weights of the step reward.
    pub reward: DriveReward,
    /// Report `ade` and `fde` at each episode's end: the agents' mean and final distance to
    /// where the expert (default `[expert]` settings) drove them in the same scene. Costs one
    /// expert episode per episode (about 0.1 ms per step on one core), so it is off by
    /// default and on in the shipped configs.
    pub expert_reference: bool,
    /// Side (pixels) of the bird's-eye raster observed beside the vectors, as the observation's
    /// camera image (0: none; else 16..=128; [`crate::raster`]).
    pub raster: u32,
    /// Side (m) of the raster's square window: centred a quarter of it ahead of the agents'
    /// mean position on the highway (at the junction's centre on the intersection), axes
    /// along the road frame's x and y.
    pub raster_m: f64,
    /// The scenes of the `intersection`, `roundabout` and `custom-road` tasks (ignored by
    /// `highway-merge`).
    pub junction: JunctionConfig,
    /// The road and routes of the `custom-road` task ([`RoadScene`]; ignored by the others).
    /// Absent: the built-in T-junction's first `agents` agents.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub road: Option<RoadScene>,
}

/// Which road a [`Drive`] scenario runs on; the task chooses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// `highway-merge`: the highway with an on-ramp ([`MergeLayout`]).
    Merge,
    /// `intersection`: a four-way junction with a priority road ([`IntersectionLayout`]).
    Intersection,
    /// `roundabout`: a single-lane roundabout with four arms ([`RoundaboutLayout`]).
    Roundabout,
    /// `custom-road`: the road and routes of `[env.road]` ([`RoadScene`]).
    Custom,
}

impl Scenario {
    /// Whether vehicles drive routes through a junction under right-of-way rules (the
    /// intersection and the roundabout).
    pub fn junction(self) -> bool {
        matches!(
            self,
            Scenario::Intersection | Scenario::Roundabout | Scenario::Custom
        )
    }
}

/// The `[env.junction]` table: how the `intersection` and `roundabout` tasks fill their
/// scenes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JunctionConfig {
    /// Agents start this far (m, drawn in the range) before the end of their incoming lane (the
    /// intersection's junction box, the roundabout's entry).
    pub start: [f64; 2],
    /// Agents' initial speed (m/s, drawn in the range).
    pub agent_speed: [f64; 2],
    /// Background drivers' IDM target (and initial) speed (m/s, drawn per driver).
    pub target_speed: [f64; 2],
    /// An agent has arrived once it is this far (m) along its exit lane.
    pub exit: f64,
    /// Agents' turns, one per agent (`"right"`, `"straight"`, `"left"`: on the roundabout the
    /// first, second or third exit); empty: drawn uniformly at every reset.
    pub turns: Vec<Turn>,
}

impl Default for JunctionConfig {
    fn default() -> Self {
        Self {
            start: [15.0, 45.0],
            agent_speed: [6.0, 10.0],
            target_speed: [8.0, 11.0],
            exit: 25.0,
            turns: Vec::new(),
        }
    }
}

impl Validate for JunctionConfig {
    fn validate(&self) -> Result<(), Invalid> {
        let approach = IntersectionLayout::default().approach;
        ensure_range(self.start, "start", 0.0, approach - 10.0)?;
        ensure_range(self.agent_speed, "agent_speed", 0.0, 20.0)?;
        ensure_range(self.target_speed, "target_speed", 1.0, 20.0)?;
        ensure(
            self.exit.is_finite() && (5.0..=approach - 10.0).contains(&self.exit),
            "exit",
            format!("must be in 5..={} m, got {}", approach - 10.0, self.exit),
        )
    }
}

impl Default for DriveConfig {
    fn default() -> Self {
        Self {
            agents: 2,
            lanes: 2,
            max_episode_steps: 100,
            policy_hz: 5,
            sim_hz: 15,
            goal_x: 370.0,
            neighbours: 6,
            actions: DriveActions::Controls,
            waypoint_steps: 1,
            randomize: DriveRandomization::default(),
            reward: DriveReward::default(),
            expert_reference: false,
            raster: 0,
            raster_m: 100.0,
            junction: JunctionConfig::default(),
            road: None,
        }
    }
}

impl Validate for DriveConfig {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            (1..=4).contains(&self.agents),
            "agents",
            format!("must be in 1..=4, got {}", self.agents),
        )?;
        ensure(
            (1..=4).contains(&self.lanes),
            "lanes",
            format!("must be in 1..=4, got {}", self.lanes),
        )?;
        ensure(
            (1..=10).contains(&self.waypoint_steps),
            "waypoint_steps",
            format!("must be in 1..=10, got {}", self.waypoint_steps),
        )?;
        ensure(
            (1..=100_000).contains(&self.max_episode_steps),
            "max_episode_steps",
            format!("must be in 1..=100000, got {}", self.max_episode_steps),
        )?;
        ensure(
            (1..=100).contains(&self.policy_hz),
            "policy_hz",
            format!("must be in 1..=100, got {}", self.policy_hz),
        )?;
        ensure(
            self.sim_hz >= self.policy_hz
                && self.sim_hz.is_multiple_of(self.policy_hz)
                && self.sim_hz <= 1000,
            "sim_hz",
            format!(
                "must be a multiple of policy_hz ({}) up to 1000, got {}",
                self.policy_hz, self.sim_hz
            ),
        )?;
        let layout = MergeLayout::default();
        ensure(
            self.goal_x.is_finite()
                && self.goal_x > layout.merge_end()
                && self.goal_x <= layout.length - 20.0,
            "goal_x",
            format!(
                "must lie past the merge lane's end ({}) and 20 m before the road's ({}), got {}",
                layout.merge_end(),
                layout.length,
                self.goal_x
            ),
        )?;
        ensure(
            (1..=16).contains(&self.neighbours),
            "neighbours",
            format!("must be in 1..=16, got {}", self.neighbours),
        )?;
        ensure(
            self.raster == 0 || (16..=128).contains(&self.raster),
            "raster",
            format!(
                "must be 0 (no raster) or a side in 16..=128 pixels, got {}",
                self.raster
            ),
        )?;
        ensure(
            self.raster_m.is_finite() && (20.0..=400.0).contains(&self.raster_m),
            "raster_m",
            format!("must be in 20..=400 m, got {}", self.raster_m),
        )?;
        self.randomize
            .validate()
            .map_err(|e| e.within("randomize"))?;
        self.junction.validate().map_err(|e| e.within("junction"))?;
        if let Some(road) = &self.road {
            road.check(self.agents).map_err(|e| e.within("road"))?;
        }
        ensure(
            self.junction.turns.is_empty() || self.junction.turns.len() == self.agents,
            "junction.turns",
            format!(
                "must be empty (drawn) or give one turn per agent ({}), got {}",
                self.agents,
                self.junction.turns.len()
            ),
        )?;
        self.reward.validate().map_err(|e| e.within("reward"))
    }
}

impl DriveConfig {
    /// Observed values per agent.
    pub fn agent_obs_dim(&self) -> usize {
        AGENT_OBS + NEIGHBOUR_OBS * self.neighbours
    }

    /// Names of one agent's observed values (`a0.speed`, `a0.n1.dx`, ...).
    pub fn obs_names(&self) -> Vec<String> {
        let own = [
            "speed",
            "heading_error",
            "lateral",
            "to_goal",
            "to_lane_end",
        ];
        let lane = ["present", "dy0", "dy20", "dy40"];
        let nb = ["present", "dx", "dy", "dvx", "dvy", "agent"];
        let mut names = Vec::new();
        for a in 0..self.agents {
            names.extend(own.iter().map(|n| format!("a{a}.{n}")));
            for side in ["left", "lane", "right"] {
                names.extend(lane.iter().map(|n| format!("a{a}.{side}.{n}")));
            }
            for k in 0..self.neighbours {
                names.extend(nb.iter().map(|n| format!("a{a}.n{k}.{n}")));
            }
        }
        names
    }

    /// Physics steps per control step and their length (s).
    pub fn physics_steps(&self) -> (usize, f64) {
        (
            (self.sim_hz / self.policy_hz) as usize,
            1.0 / f64::from(self.sim_hz),
        )
    }

    /// Names of the action components (`a0.acceleration`, `a0.steering`, ...; with waypoints
    /// `a0.dx`, `a0.dy`, ...).
    pub fn action_names(&self) -> Vec<String> {
        let [x, y] = match self.actions {
            DriveActions::Controls => ["acceleration", "steering"],
            DriveActions::Waypoints => ["dx", "dy"],
        };
        (0..self.agents)
            .flat_map(|a| [format!("a{a}.{x}"), format!("a{a}.{y}")])
            .collect()
    }
}

/// Everything [`Drive::restore`] needs to continue an episode exactly.
#[derive(Debug, Clone)]
pub struct DriveSnapshot {
    traffic: Traffic,
    episode: Episode,
    rng: Rng,
}

#[derive(Debug, Clone, PartialEq)]
struct Episode {
    /// Indices of the agents' vehicles in the traffic.
    agents: Vec<usize>,
    /// Agents' x at the start.
    start_x: Vec<f64>,
    /// On the intersection: each agent's arc length along its route now, at the start, and
    /// where it arrives.
    route_s: Vec<f64>,
    start_s: Vec<f64>,
    goal_s: Vec<f64>,
    /// Physics steps taken (the intersection's right-of-way rules run every half second).
    sim_steps: usize,
    /// Agents that have passed `goal_x` (their route is done; what happens to them after no
    /// longer counts).
    arrived: Vec<bool>,
    steps: usize,
    done: bool,
    /// An agent collided or left the road.
    failed: bool,
    /// Per-episode sums for the metrics: agents' speeds (one per agent and step), commanded
    /// acceleration changes per second, and the last commands.
    speed_sum: f64,
    jerk_sum: f64,
    last_acceleration: Vec<Option<f64>>,
    collided: bool,
    /// Of the collisions: one between two agents, one of an agent with background traffic.
    collided_agents: bool,
    collided_traffic: bool,
    left_road: bool,
    /// The traffic at the episode's start, for the expert's reference drive (None when
    /// `expert_reference` is off).
    initial: Option<Arc<Traffic>>,
    /// Agents' positions after each control step (agent-major within a step), for ADE/FDE.
    trace: Vec<[f64; 2]>,
}

impl Episode {
    fn empty() -> Self {
        Self {
            agents: Vec::new(),
            start_x: Vec::new(),
            route_s: Vec::new(),
            start_s: Vec::new(),
            goal_s: Vec::new(),
            sim_steps: 0,
            arrived: Vec::new(),
            steps: 0,
            done: false,
            failed: false,
            speed_sum: 0.0,
            jerk_sum: 0.0,
            last_acceleration: Vec::new(),
            collided: false,
            collided_agents: false,
            collided_traffic: false,
            left_road: false,
            initial: None,
            trace: Vec::new(),
        }
    }

    /// A fresh episode of the agents `agents` (vehicle indices) starting at `start_x`.
    fn start(agents: Vec<usize>, start_x: Vec<f64>) -> Self {
        Self {
            start_x,
            arrived: vec![false; agents.len()],
            last_acceleration: vec![None; agents.len()],
            agents,
            ..Self::empty()
        }
    }
}

/// A driving scenario (module docs).
#[derive(Debug, Clone)]
pub struct Drive {
    config: DriveConfig,
    /// [`Env::action_space`], built once (step checks every action against it).
    actions: BoxSpace,
    road: Arc<Road>,
    /// The road's drivable-area mask, when the raster is on.
    mask: Option<Arc<RoadMask>>,
    scenario: Scenario,
    /// `custom-road`'s checked scene.
    scene: Option<Arc<CheckedScene>>,
    layout: MergeLayout,
    traffic: Traffic,
    episode: Episode,
    rng: Rng,
}

static VEHICLE_NAMES: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    (0..256)
        .map(|i| &*Box::leak(format!("vehicle-{i:03}").into_boxed_str()))
        .collect()
});
static LANE_NAMES: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    (0..64)
        .map(|i| &*Box::leak(format!("lane-{i:02}").into_boxed_str()))
        .collect()
});

/// A uniform draw from `range` ([lo, hi]; lo when the range is empty).
fn draw(rng: &mut Rng, range: [f64; 2]) -> f64 {
    if range[1] > range[0] {
        rng.random_range(range[0]..range[1])
    } else {
        range[0]
    }
}

/// The vehicles of a scene on routes (the junctions and `custom-road`) as they are placed.
struct RoutedScene<'a> {
    road: &'a Road,
    randomize: &'a DriveRandomization,
    sim_hz: f64,
    vehicles: Vec<Vehicle>,
    agents: Vec<usize>,
    start_s: Vec<f64>,
    goal_s: Vec<f64>,
}

impl<'a> RoutedScene<'a> {
    fn new(road: &'a Road, config: &'a DriveConfig) -> Self {
        Self {
            road,
            randomize: &config.randomize,
            sim_hz: f64::from(config.sim_hz),
            vehicles: Vec::new(),
            agents: Vec::new(),
            start_s: Vec::new(),
            goal_s: Vec::new(),
        }
    }

    /// A vehicle of `driver` at arc length `s` along `route` (on its centre line, heading
    /// along it) at `speed`, on the route's first lane.
    fn on_route(&self, route: &[usize], s: f64, speed: f64, driver: Driver) -> Vehicle {
        let (p, heading) = self.road.along_route(route, s);
        let state = VehicleState {
            x: p[0],
            y: p[1],
            heading,
            speed,
        };
        let target_speed = match driver {
            Driver::Agent(_) => 10.0,
            Driver::Idm => speed,
        };
        let mut v = Vehicle::new(self.road, state, target_speed, driver);
        v.lane = route[0];
        v.target_lane = route[0];
        v.route = route.to_vec();
        v
    }

    /// Agent `a` at `s` along `route`; it arrives `exit` m along the route's last lane.
    fn agent(&mut self, a: usize, route: &[usize], s: f64, speed: f64, exit: f64) {
        let v = self.on_route(route, s, speed, Driver::Agent(a));
        self.goal_s
            .push(self.road.route_offset(route, route.len() - 1) + exit);
        self.agents.push(self.vehicles.len());
        self.start_s.push(s);
        self.vehicles.push(v);
    }

    /// A background driver cruising at `speed` at `s` along `route`, unless it would start
    /// within 15 m of a vehicle already placed; its IDM time gap, exponent and reaction delay
    /// are drawn from `[env.randomize]`.
    fn background(&mut self, rng: &mut Rng, route: &[usize], s: f64, speed: f64) {
        let mut v = self.on_route(route, s, speed, Driver::Idm);
        let clear = self
            .vehicles
            .iter()
            .all(|o| (o.state.x - v.state.x).hypot(o.state.y - v.state.y) > 15.0);
        if clear {
            let r = self.randomize;
            v.idm.time_wanted = draw(rng, r.time_wanted);
            v.idm.delta = draw(rng, r.delta);
            v.reaction_delay = (draw(rng, r.reaction_delay) * self.sim_hz).round() as usize;
            self.vehicles.push(v);
        }
    }

    /// The episode and the traffic.
    fn finish(self) -> (Episode, Traffic) {
        let start_x = self
            .agents
            .iter()
            .map(|&i| self.vehicles[i].state.x)
            .collect();
        let mut episode = Episode::start(self.agents, start_x);
        episode.route_s = self.start_s.clone();
        episode.start_s = self.start_s;
        episode.goal_s = self.goal_s;
        (
            episode,
            Traffic {
                vehicles: self.vehicles,
            },
        )
    }
}

/// `custom-road`'s checked scene: `[env.road]`, or without it the built-in T-junction's first
/// `agents` agents. A scene that fails its checks (a config that was not validated) falls back
/// to the T-junction.
fn custom_scene(config: &DriveConfig) -> CheckedScene {
    let n = config.agents.clamp(1, 4);
    let builtin = || {
        let mut t = RoadScene::t_junction();
        t.agents.truncate(n);
        t.check(n)
            .expect("the built-in T-junction is valid for 1..=4 agents")
    };
    match &config.road {
        Some(road) => road.check(config.agents).unwrap_or_else(|_| builtin()),
        None => builtin(),
    }
}

impl Drive {
    /// The merge scenario of `config` (checked by [`Validate`]; an invalid one is clamped
    /// where it would not make sense, callers validate first), reset with seed 0.
    pub fn new(config: DriveConfig) -> Self {
        Self::with_scenario(Scenario::Merge, config)
    }

    /// Scenario `scenario` of `config`, reset with seed 0 (as [`Drive::new`]).
    pub fn with_scenario(scenario: Scenario, config: DriveConfig) -> Self {
        let layout = MergeLayout {
            lanes: config.lanes.clamp(1, 4),
            ..MergeLayout::default()
        };
        let scene = (scenario == Scenario::Custom).then(|| Arc::new(custom_scene(&config)));
        let road = Arc::new(match &scene {
            Some(scene) => scene.road.clone(),
            None => Road::new(&match scenario {
                Scenario::Intersection => IntersectionLayout::default().specs(),
                Scenario::Roundabout => RoundaboutLayout::default().specs(),
                _ => layout.specs(),
            })
            .expect("the built-in layouts are valid roads"),
        });
        let names = config.action_names();
        let actions = BoxSpace {
            low: vec![-1.0; names.len()],
            high: vec![1.0; names.len()],
            names,
        };
        let mask = (config.raster > 0).then(|| Arc::new(RoadMask::new(&road)));
        let mut env = Self {
            config,
            actions,
            road,
            mask,
            scenario,
            scene,
            layout,
            traffic: Traffic {
                vehicles: Vec::new(),
            },
            episode: Episode::empty(),
            rng: seeding::rng(0),
        };
        env.reset(0);
        env
    }

    /// The config.
    pub fn config(&self) -> &DriveConfig {
        &self.config
    }

    /// The road.
    pub fn road(&self) -> &Road {
        &self.road
    }

    /// The vehicles (agents included).
    pub fn traffic(&self) -> &Traffic {
        &self.traffic
    }

    /// Index in [`Drive::traffic`] of agent `i`'s vehicle.
    pub fn agent_vehicle(&self, i: usize) -> usize {
        self.episode.agents[i]
    }

    /// Where every agent's route ends on the merge road (m).
    pub fn goal_x(&self) -> f64 {
        self.config.goal_x
    }

    /// The road this scenario runs on.
    pub fn scenario(&self) -> Scenario {
        self.scenario
    }

    /// The bounding box of the lanes' centre lines.
    fn road_bounds(&self) -> ([f64; 2], [f64; 2]) {
        let (mut lo, mut hi) = ([f64::INFINITY; 2], [f64::NEG_INFINITY; 2]);
        for p in self.road.lanes.iter().flat_map(|l| &l.points) {
            for k in 0..2 {
                lo[k] = lo[k].min(p[k]);
                hi[k] = hi[k].max(p[k]);
            }
        }
        (lo, hi)
    }

    fn spawn(&mut self) {
        match self.scenario {
            Scenario::Merge => self.spawn_merge(),
            Scenario::Intersection | Scenario::Roundabout => self.spawn_junction(),
            Scenario::Custom => self.spawn_custom(),
        }
        if self.config.expert_reference {
            self.episode.initial = Some(Arc::new(self.traffic.clone()));
        }
    }

    /// The route from arm `from` turning `turn` on this junction.
    fn junction_route(&self, from: usize, turn: Turn) -> Vec<usize> {
        match self.scenario {
            Scenario::Roundabout => RoundaboutLayout::route(&self.road, from, turn.quarters()),
            _ => IntersectionLayout::route(&self.road, from, turn),
        }
    }

    /// `custom-road`'s scene: the agents where `[env.road]` puts them; each stream's drivers
    /// from its `start` backwards at `gap` x U(1, 1.5) / density, cruising at
    /// `[env.junction] target_speed`, none behind its lane's start or within 15 m of another
    /// vehicle.
    fn spawn_custom(&mut self) {
        let Some(scene) = self.scene.clone() else {
            return;
        };
        let rng = &mut self.rng;
        let c = &self.config.junction;
        let mut routed = RoutedScene::new(&self.road, &self.config);
        for (a, (spawn, route)) in scene
            .scene
            .agents
            .iter()
            .zip(&scene.agent_routes)
            .enumerate()
        {
            let last = self.road.lanes[route[route.len() - 1]].length();
            routed.agent(a, route, spawn.start, spawn.speed, c.exit.min(last));
        }
        let density = draw(rng, self.config.randomize.density);
        if density > 0.0 {
            for (stream, route) in scene.scene.traffic.iter().zip(&scene.traffic_routes) {
                let mut s = stream.start;
                for _ in 0..stream.count {
                    let speed = draw(rng, c.target_speed);
                    if s >= 0.0 {
                        routed.background(rng, route, s, speed);
                    }
                    s -= stream.gap * rng.random_range(1.0..1.5) / density;
                }
            }
        }
        (self.episode, self.traffic) = routed.finish();
    }

    /// The scene of a junction: agent `a` enters from the south, east, north and west arm (in
    /// this order: on the intersection the first is on the minor road), `start` m before the
    /// end of its incoming lane at `agent_speed`, turning as `turns` says or uniformly at
    /// random. Background drivers enter from every arm from 8-20 m before that end on, at
    /// gaps of (10 m + speed x 2 s) x U(1, 3) / density up to 90 m out, each on a uniformly
    /// drawn turn, none within 15 m of another vehicle.
    fn spawn_junction(&mut self) {
        const AGENT_ARMS: [usize; 4] = [3, 0, 1, 2];
        let routes: Vec<Vec<Vec<usize>>> = (0..4)
            .map(|arm| {
                Turn::ALL
                    .iter()
                    .map(|&t| self.junction_route(arm, t))
                    .collect()
            })
            .collect();
        let rng = &mut self.rng;
        let c = &self.config.junction;
        let length = |route: &[usize]| self.road.lanes[route[0]].length();
        let mut routed = RoutedScene::new(&self.road, &self.config);
        for (a, &arm) in AGENT_ARMS.iter().enumerate().take(self.config.agents) {
            let turn = match c.turns.get(a) {
                Some(&t) => t as usize,
                None => rng.random_range(0..3),
            };
            let route = &routes[arm][turn];
            let s = length(route) - draw(rng, c.start);
            let speed = draw(rng, c.agent_speed);
            routed.agent(a, route, s, speed, c.exit);
        }
        let density = draw(rng, self.config.randomize.density);
        if density > 0.0 {
            for arm_routes in &routes {
                let mut d = rng.random_range(8.0..20.0);
                while d < 90.0 {
                    let speed = draw(rng, c.target_speed);
                    let route = &arm_routes[rng.random_range(0..3)];
                    routed.background(rng, route, length(route) - d, speed);
                    d += (10.0 + 2.0 * speed) * rng.random_range(1.0..3.0) / density;
                }
            }
        }
        (self.episode, self.traffic) = routed.finish();
    }

    fn spawn_merge(&mut self) {
        let rng = &mut self.rng;
        let road = &*self.road;
        let r = &self.config.randomize;
        let sim_hz = f64::from(self.config.sim_hz);
        let ramp = road.lane_named("ramp").expect("the merge road has a ramp");
        let outer = self.layout.lanes - 1;
        let inner = outer.saturating_sub(1);
        let mut vehicles: Vec<Vehicle> = Vec::new();
        let on = |lane: usize, s: f64, speed: f64| {
            let l = &road.lanes[lane];
            let p = l.position(s, 0.0);
            VehicleState {
                x: p[0],
                y: p[1],
                heading: l.heading_at(s),
                speed,
            }
        };
        let mut agents = Vec::new();
        let ramp_s = rng.random_range(90.0..120.0);
        for a in 0..self.config.agents {
            let (lane, s, speed) = match a {
                0 => (ramp, ramp_s, rng.random_range(18.0..24.0)),
                1 => (
                    outer,
                    rng.random_range(20.0..60.0),
                    rng.random_range(24.0..30.0),
                ),
                2 => (
                    inner,
                    rng.random_range(70.0..110.0),
                    rng.random_range(24.0..30.0),
                ),
                _ => (
                    ramp,
                    ramp_s - rng.random_range(20.0..35.0),
                    rng.random_range(18.0..24.0),
                ),
            };
            agents.push(vehicles.len());
            vehicles.push(Vehicle::new(
                road,
                on(lane, s, speed),
                28.0,
                Driver::Agent(a),
            ));
        }
        let density = draw(rng, r.density);
        let clear = |vehicles: &[Vehicle], p: VehicleState| {
            vehicles
                .iter()
                .all(|v| (v.state.x - p.x).hypot(v.state.y - p.y) > 15.0)
        };
        let background = |rng: &mut Rng, state: VehicleState, vehicles: &mut Vec<Vehicle>| {
            if !clear(vehicles, state) {
                return;
            }
            let mut v = Vehicle::new(road, state, draw(rng, r.target_speed), Driver::Idm);
            v.idm.time_wanted = draw(rng, r.time_wanted);
            v.idm.delta = draw(rng, r.delta);
            v.reaction_delay = (draw(rng, r.reaction_delay) * sim_hz).round() as usize;
            vehicles.push(v);
        };
        if density > 0.0 {
            for lane in 0..self.layout.lanes {
                let mut s = rng.random_range(0.0..15.0);
                while s < self.layout.length - 80.0 {
                    let speed = rng.random_range(22.0..30.0);
                    background(rng, on(lane, s, speed), &mut vehicles);
                    s += (12.0 + speed) * rng.random_range(1.0..2.0) / density;
                }
            }
            if rng.random_bool(0.5) {
                let s = rng.random_range(0.0..60.0);
                let speed = rng.random_range(18.0..24.0);
                background(rng, on(ramp, s, speed), &mut vehicles);
            }
        }
        let start_x = agents.iter().map(|&i| vehicles[i].state.x).collect();
        self.episode = Episode::start(agents, start_x);
        self.traffic = Traffic { vehicles };
    }

    /// Share of agent `agent`'s route covered, in [0, 1]: along x to `goal_x` on the merge
    /// road, along its route's lanes to its exit on the intersection.
    fn progress(&self, agent: usize) -> f64 {
        let e = &self.episode;
        match self.scenario {
            Scenario::Merge => {
                let x = self.traffic.vehicles[e.agents[agent]].state.x;
                let x0 = e.start_x[agent];
                ((x - x0) / (self.config.goal_x - x0)).clamp(0.0, 1.0)
            }
            Scenario::Intersection | Scenario::Roundabout | Scenario::Custom => {
                let (s, s0, goal) = (e.route_s[agent], e.start_s[agent], e.goal_s[agent]);
                ((s - s0) / (goal - s0)).clamp(0.0, 1.0)
            }
        }
    }

    /// Where agent `a` is along its route (m): the route's arc length at its projection on
    /// the lane of its route it is on; unchanged while it is on none.
    fn update_route_s(&mut self, a: usize) {
        let v = &self.traffic.vehicles[self.episode.agents[a]];
        if let Some(k) = v.route.iter().position(|&l| l == v.lane) {
            let lane = &self.road.lanes[v.lane];
            let s = lane.local(v.position()).0.clamp(0.0, lane.length());
            self.episode.route_s[a] = self.road.route_offset(&v.route, k) + s;
        }
    }

    /// Whether agent `a` has reached the end of its route.
    fn reached_goal(&self, a: usize) -> bool {
        match self.scenario {
            Scenario::Merge => {
                self.traffic.vehicles[self.episode.agents[a]].state.x >= self.config.goal_x
            }
            Scenario::Intersection | Scenario::Roundabout | Scenario::Custom => {
                self.episode.route_s[a] >= self.episode.goal_s[a]
            }
        }
    }

    /// Mean route progress of the agents, in [0, 1].
    pub fn score(&self) -> f64 {
        let n = self.config.agents;
        (0..n).map(|a| self.progress(a)).sum::<f64>() / n as f64
    }

    /// Whether agent `a` has collided.
    pub fn crashed(&self, a: usize) -> bool {
        self.traffic.vehicles[self.episode.agents[a]].crashed
    }

    /// Whether agent `a`'s centre lies off every lane.
    pub fn off_road(&self, a: usize) -> bool {
        !self
            .road
            .on_road(self.traffic.vehicles[self.episode.agents[a]].position())
    }

    fn observe_agent(&self, a: usize, out: &mut Vec<f32>) {
        let road = &*self.road;
        let me = &self.traffic.vehicles[self.episode.agents[a]];
        let lane = &road.lanes[me.lane];
        let (s, r) = lane.local(me.position());
        let (sin, cos) = me.state.heading.sin_cos();
        let to_frame = |d: [f64; 2]| [d[0] * cos + d[1] * sin, -d[0] * sin + d[1] * cos];
        let to_end = if lane.ends {
            ((lane.length() - s) / 100.0).clamp(0.0, 1.0)
        } else {
            1.0
        };
        out.extend(
            [
                me.state.speed / 30.0,
                wrap_to_pi(me.state.heading - lane.heading_at(s)),
                r / lane.width,
                match self.scenario {
                    Scenario::Merge => (self.config.goal_x - me.state.x) / 100.0,
                    Scenario::Intersection | Scenario::Roundabout | Scenario::Custom => {
                        (self.episode.goal_s[a] - self.episode.route_s[a]) / 100.0
                    }
                },
                to_end,
            ]
            .map(|v| v as f32),
        );
        for side in [lane.left, Some(me.lane), lane.right] {
            // On a route, the lane's points ahead follow the route through junctions.
            if side == Some(me.lane) && !me.route.is_empty() {
                out.push(1.0);
                let k = me.route.iter().position(|&l| l == me.lane);
                let s0 = match k {
                    Some(k) => self.road.route_offset(&me.route, k) + s,
                    None => self.episode.route_s[a],
                };
                for ahead in [0.0, 20.0, 40.0] {
                    let (p, _) = road.along_route(&me.route, s0 + ahead);
                    let d = to_frame([p[0] - me.state.x, p[1] - me.state.y]);
                    out.push((d[1] / 10.0) as f32);
                }
                continue;
            }
            let covered = side.filter(|&k| {
                let lk = &road.lanes[k];
                let (sk, _) = lk.local(me.position());
                (0.0..=lk.length()).contains(&sk)
            });
            match covered {
                Some(k) => {
                    let lk = &road.lanes[k];
                    let sk = lk.local(me.position()).0;
                    out.push(1.0);
                    for ahead in [0.0, 20.0, 40.0] {
                        let p = lk.position((sk + ahead).min(lk.length()), 0.0);
                        let d = to_frame([p[0] - me.state.x, p[1] - me.state.y]);
                        out.push((d[1] / 10.0) as f32);
                    }
                }
                None => out.extend([0.0; 4]),
            }
        }
        let mut near: Vec<(f64, usize)> = self
            .traffic
            .vehicles
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != self.episode.agents[a])
            .map(|(j, v)| ((v.state.x - me.state.x).hypot(v.state.y - me.state.y), j))
            .filter(|(d, _)| *d <= OBS_RANGE)
            .collect();
        near.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
        let (vme, k) = (me.velocity(), self.config.neighbours);
        for slot in 0..k {
            match near.get(slot) {
                Some(&(_, j)) => {
                    let o = &self.traffic.vehicles[j];
                    let d = to_frame([o.state.x - me.state.x, o.state.y - me.state.y]);
                    let vo = o.velocity();
                    let dv = to_frame([vo[0] - vme[0], vo[1] - vme[1]]);
                    out.extend(
                        [
                            1.0,
                            d[0] / 50.0,
                            d[1] / 10.0,
                            dv[0] / 10.0,
                            dv[1] / 10.0,
                            f64::from(matches!(o.driver, Driver::Agent(_))),
                        ]
                        .map(|v| v as f32),
                    );
                }
                None => out.extend([0.0; NEIGHBOUR_OBS]),
            }
        }
    }

    /// The noise-free observation (every agent's block).
    pub fn true_observation(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.config.agents * self.config.agent_obs_dim());
        for a in 0..self.config.agents {
            self.observe_agent(a, &mut out);
        }
        out
    }

    fn observation(&mut self) -> Observation {
        let mut state = self.true_observation();
        let noise = self.config.randomize.obs_noise;
        if noise > 0.0 {
            let normal = rand_distr::Normal::new(0.0, noise as f32).expect("noise >= 0");
            for v in &mut state {
                *v += rand_distr::Distribution::sample(&normal, &mut self.rng);
            }
        }
        Observation {
            image: self.raster(),
            ..Observation::state(state)
        }
    }

    /// The bird's-eye raster of the current state (None when `raster` is 0): the square window
    /// of `raster_m` m centred a quarter of its side ahead of the agents' mean position.
    pub fn raster(&self) -> Option<ImageObs> {
        let mask = self.mask.as_ref()?;
        let n = self.episode.agents.len().max(1) as f64;
        let mut center = [0.0; 2];
        for &i in &self.episode.agents {
            let p = self.traffic.vehicles[i].position();
            center[0] += p[0] / n;
            center[1] += p[1] / n;
        }
        match self.scenario {
            Scenario::Merge => center[0] += self.config.raster_m / 4.0,
            Scenario::Intersection | Scenario::Roundabout => center = [0.0, 0.0],
            Scenario::Custom => {
                let (lo, hi) = self.road_bounds();
                center = [(lo[0] + hi[0]) / 2.0, (lo[1] + hi[1]) / 2.0];
            }
        }
        let side = self.config.raster;
        Some(ImageObs {
            height: side,
            width: side,
            data: crate::raster::raster(mask, &self.traffic, center, self.config.raster_m, side),
        })
    }

    /// ADE and FDE (m) of this episode against the expert's drive of the same scene (Waymax's
    /// displacement metrics with the expert's trajectories as the log): the distance between
    /// each agent's position and the expert's after each control step, averaged over agents
    /// and over the steps both episodes lasted (ADE), and at the last of those steps (FDE).
    /// The expert drives the episode's initial traffic again, background drivers included, so
    /// the two scenes part where the agents drive differently. None when the reference is off
    /// or no step was taken.
    pub fn expert_displacement(&self) -> Option<(f64, f64)> {
        use diffrl_core::task::Expert as _;
        let initial = self.episode.initial.as_ref()?;
        let n = self.config.agents;
        let steps = self.episode.trace.len() / n;
        if steps == 0 {
            return None;
        }
        let mut config = self.config.clone();
        config.expert_reference = false;
        config.randomize.obs_noise = 0.0;
        config.raster = 0;
        let mut sim = Drive {
            config,
            actions: self.actions.clone(),
            road: Arc::clone(&self.road),
            mask: None,
            scenario: self.scenario,
            scene: self.scene.clone(),
            layout: self.layout,
            traffic: (**initial).clone(),
            episode: Episode {
                route_s: self.episode.start_s.clone(),
                start_s: self.episode.start_s.clone(),
                goal_s: self.episode.goal_s.clone(),
                ..Episode::start(self.episode.agents.clone(), self.episode.start_x.clone())
            },
            rng: seeding::rng(0),
        };
        let mut expert = crate::task::DriveExpert::new(crate::task::DriveExpertConfig::default());
        let (mut sum, mut last, mut t) = (0.0, 0.0, 0);
        while t < steps {
            let action = expert.act(&sim);
            let r = sim.step(&action).ok()?;
            let ours = &self.episode.trace[t * n..(t + 1) * n];
            last = (0..n)
                .map(|a| {
                    let p = sim.traffic.vehicles[sim.episode.agents[a]].position();
                    (p[0] - ours[a][0]).hypot(p[1] - ours[a][1])
                })
                .sum::<f64>()
                / n as f64;
            sum += last;
            t += 1;
            if r.terminated || r.truncated {
                break;
            }
        }
        Some((sum / t as f64, last))
    }

    /// Where a chunk of actions would take each agent from here: its kinematic bicycle under
    /// the chunk's commands (clamped to the action space, held for each control step's physics
    /// steps), with no other vehicle and no collision; one path per agent, from its position
    /// through its position after each action.
    pub fn action_paths(&self) -> ActionPaths2d {
        let starts: Vec<VehicleState> = self
            .episode
            .agents
            .iter()
            .map(|&i| self.traffic.vehicles[i].state)
            .collect();
        let (substeps, dt) = self.config.physics_steps();
        let per = 2 * starts.len();
        let (mode, horizon) = (self.config.actions, self.config.waypoint_steps);
        ActionPaths2d::new(move |chunk: &[f32]| {
            starts
                .iter()
                .enumerate()
                .map(|(a, &start)| {
                    let mut path = vec![[start.x as f32, start.y as f32]];
                    let mut state = start;
                    for row in chunk.chunks_exact(per) {
                        let row = [row[2 * a], row[2 * a + 1]];
                        // Non-finite components (never in a chain) end the path.
                        if !row.iter().all(|v| v.is_finite()) {
                            break;
                        }
                        let row = row.map(|v| v.clamp(-1.0, 1.0));
                        let held = agent_command(mode, horizon, state, row, substeps, dt);
                        let Some(&end) = rollout(state, &vec![held; substeps], dt)
                            .ok()
                            .as_ref()
                            .and_then(|states| states.last())
                        else {
                            break;
                        };
                        state = end;
                        path.push([state.x as f32, state.y as f32]);
                    }
                    path
                })
                .collect()
        })
    }

    /// Agent `a`'s action for the controls `row` (`[acceleration, steering]` in action units)
    /// in this env's action mode: the row itself, or with waypoints the point the agent's
    /// bicycle reaches under the held controls by the end of the control step (in action units,
    /// clamped to [-1, 1]), which the tracker turns back into the same controls. How the
    /// expert drives a waypoint env with `waypoint_steps = 1` (further ahead it plans on a
    /// [`Drive::controls_copy`]).
    pub fn action_for_controls(&self, a: usize, row: [f32; 2]) -> [f32; 2] {
        match self.config.actions {
            DriveActions::Controls => row,
            DriveActions::Waypoints => {
                let start = self.traffic.vehicles[self.episode.agents[a]].state;
                let (substeps, dt) = self.config.physics_steps();
                let held = command(&row, 0);
                let end = rollout(start, &vec![held; substeps], dt)
                    .ok()
                    .and_then(|states| states.last().copied())
                    .unwrap_or(start);
                self.waypoint_action(body_displacement(start, end))
            }
        }
    }

    /// A copy of this scene driven by controls, for planning ahead: no expert reference, no
    /// raster.
    pub fn controls_copy(&self) -> Drive {
        let mut sim = self.clone();
        sim.config.actions = DriveActions::Controls;
        sim.config.expert_reference = false;
        sim.config.raster = 0;
        sim.mask = None;
        sim
    }

    /// Agent `a`'s action in units for a waypoint at `displacement` (m, in its frame, from
    /// [`body_displacement`]) [`DriveConfig::waypoint_steps`] control steps ahead, clamped to
    /// [-1, 1].
    pub fn waypoint_action(&self, displacement: [f64; 2]) -> [f32; 2] {
        let h = self.config.waypoint_steps.max(1) as f64;
        [
            (displacement[0] / (WAYPOINT_DX * h)).clamp(-1.0, 1.0) as f32,
            (displacement[1] / (WAYPOINT_DY * h)).clamp(-1.0, 1.0) as f32,
        ]
    }

    /// Agents' `[x, y, heading, speed]`, concatenated.
    pub fn agent_states(&self) -> Vec<f64> {
        self.episode
            .agents
            .iter()
            .flat_map(|&i| self.traffic.vehicles[i].state.to_array())
            .collect()
    }
}

impl Env for Drive {
    type Snapshot = DriveSnapshot;

    fn observation_space(&self) -> ObservationSpace {
        let names = self.config.obs_names();
        ObservationSpace {
            state: Some(BoxSpace {
                low: vec![f32::NEG_INFINITY; names.len()],
                high: vec![f32::INFINITY; names.len()],
                names,
            }),
            image: (self.config.raster > 0).then_some(ImageSpace {
                height: self.config.raster,
                width: self.config.raster,
            }),
            text: false,
            agents: self.config.agents,
            entities: vec![
                EntityGroup::new("lanes", 5, 4, 3),
                EntityGroup::new(
                    "neighbours",
                    AGENT_OBS,
                    NEIGHBOUR_OBS,
                    self.config.neighbours,
                ),
            ],
        }
    }

    fn action_space(&self) -> BoxSpace {
        self.actions.clone()
    }

    fn max_episode_steps(&self) -> usize {
        self.config.max_episode_steps
    }

    fn reset(&mut self, seed: u64) -> Observation {
        self.rng = seeding::rng(seed);
        self.spawn();
        self.observation()
    }

    fn step(&mut self, action: &[f32]) -> Result<StepResult, EnvError> {
        if self.episode.done {
            return Err(EnvError::EpisodeOver);
        }
        let mut action = action.to_vec();
        let clamped = self.actions.check_and_clamp(&mut action)?;
        let before: Vec<f64> = (0..self.config.agents).map(|a| self.progress(a)).collect();
        let (substeps, dt) = self.config.physics_steps();
        let road = Arc::clone(&self.road);
        let (mut failed, mut collided, mut left_road) = (false, false, false);
        // highway-env's RegulatedRoad enforces its rules every int(sim_hz / 2) physics steps.
        let regulation_period = (self.config.sim_hz / 2).max(1) as usize;
        let held: Vec<[f64; 2]> = (0..self.config.agents)
            .map(|a| {
                let state = self.traffic.vehicles[self.episode.agents[a]].state;
                let row = [action[2 * a], action[2 * a + 1]];
                agent_command(
                    self.config.actions,
                    self.config.waypoint_steps,
                    state,
                    row,
                    substeps,
                    dt,
                )
            })
            .collect();
        for _ in 0..substeps {
            if self.scenario.junction() {
                self.episode.sim_steps += 1;
                if self.episode.sim_steps.is_multiple_of(regulation_period) {
                    self.traffic.regulate(&road);
                }
            }
            let mut commands = Vec::with_capacity(self.traffic.vehicles.len());
            for i in 0..self.traffic.vehicles.len() {
                commands.push(match self.traffic.vehicles[i].driver {
                    Driver::Idm => {
                        let [steering, acceleration] = self.traffic.idm_action(&road, i);
                        [steering, self.traffic.react(i, acceleration)]
                    }
                    Driver::Agent(a) => held[a],
                });
            }
            for (i, j) in self.traffic.step(&road, &commands, dt) {
                let agent = |k: usize| match self.traffic.vehicles[k].driver {
                    Driver::Agent(a) => Some(!self.episode.arrived[a]),
                    Driver::Idm => None,
                };
                match (agent(i), agent(j)) {
                    (Some(true), Some(_)) | (Some(_), Some(true)) => {
                        self.episode.collided_agents = true;
                    }
                    (Some(true), None) | (None, Some(true)) => {
                        self.episode.collided_traffic = true;
                    }
                    _ => {}
                }
            }
            for a in 0..self.config.agents {
                if !self.episode.arrived[a] {
                    let (crashed, off) = (self.crashed(a), self.off_road(a));
                    collided |= crashed;
                    left_road |= off;
                    failed |= crashed || off;
                }
            }
            if failed {
                break;
            }
            for a in 0..self.config.agents {
                if self.scenario.junction() {
                    self.update_route_s(a);
                }
                self.episode.arrived[a] |= self.reached_goal(a);
            }
        }
        self.episode.collided |= collided;
        self.episode.left_road |= left_road;
        self.episode.steps += 1;
        if self.episode.initial.is_some() {
            for &i in &self.episode.agents {
                self.episode.trace.push(self.traffic.vehicles[i].position());
            }
        }
        let hz = f64::from(self.config.policy_hz);
        let mut jerk = 0.0;
        for (a, &[_, acc]) in held.iter().enumerate() {
            let v = &self.traffic.vehicles[self.episode.agents[a]];
            self.episode.speed_sum += v.state.speed;
            if let Some(last) = self.episode.last_acceleration[a] {
                jerk += (acc - last).abs() * hz;
            }
            self.episode.last_acceleration[a] = Some(acc);
        }
        self.episode.jerk_sum += jerk;
        let n = self.config.agents as f64;
        let gained: f64 = (0..self.config.agents)
            .map(|a| self.progress(a) - before[a])
            .sum::<f64>()
            / n;
        let success = self.episode.arrived.iter().all(|&a| a) && !failed;
        self.episode.failed |= failed;
        let terminated = failed || success;
        let truncated = !terminated && self.episode.steps >= self.config.max_episode_steps;
        self.episode.done = terminated || truncated;
        let w = &self.config.reward;
        let reward = w.progress * gained
            - if collided {
                w.collision
            } else if left_road {
                w.off_road
            } else {
                0.0
            }
            - w.jerk * jerk / n;
        let metrics = if self.episode.done {
            let e = &self.episode;
            let agent_steps = (e.steps * self.config.agents) as f64;
            let jerk_steps = (e.steps.saturating_sub(1) * self.config.agents).max(1) as f64;
            let mut metrics = vec![
                ("collision", f64::from(u8::from(e.collided))),
                ("collision_agents", f64::from(u8::from(e.collided_agents))),
                ("collision_traffic", f64::from(u8::from(e.collided_traffic))),
                ("off_road", f64::from(u8::from(e.left_road))),
                ("progress", self.score()),
                ("speed", e.speed_sum / agent_steps),
                ("jerk", e.jerk_sum / jerk_steps),
            ];
            if let Some((ade, fde)) = self.expert_displacement() {
                metrics.extend([("ade", ade), ("fde", fde)]);
            }
            metrics
        } else {
            Vec::new()
        };
        Ok(StepResult {
            obs: self.observation(),
            reward: reward as f32,
            terminated,
            truncated,
            info: Info {
                score: self.score() as f32,
                success,
                clamped,
                metrics,
            },
        })
    }

    fn snapshot(&self) -> DriveSnapshot {
        DriveSnapshot {
            traffic: self.traffic.clone(),
            episode: self.episode.clone(),
            rng: self.rng.clone(),
        }
    }

    fn restore(&mut self, snapshot: &DriveSnapshot) -> Observation {
        self.traffic = snapshot.traffic.clone();
        self.episode = snapshot.episode.clone();
        self.rng = snapshot.rng.clone();
        self.observe()
    }

    fn observe(&mut self) -> Observation {
        Observation::state(self.true_observation())
    }

    fn elapsed_steps(&self) -> usize {
        self.episode.steps
    }

    /// Bird's-eye view: lane edges, agents (orange, red once crashed) and background vehicles
    /// (blue) as boxes, the goal line on the highway; y grows downwards as in highway-env's
    /// frame. On the highway the window is the 200 m around agent 0, and lane edges are drawn
    /// inside it only, so a viewer that fits the view to what is drawn follows the agents
    /// down the road; on the intersection it is the 140 m square around the junction.
    fn scene(&self) -> Option<Scene2d> {
        let bounds = match self.scenario {
            Scenario::Merge => {
                let me = self.traffic.vehicles[self.episode.agents[0]].state.x as f32;
                [[me - 60.0, -20.0], [me + 140.0, 30.0]]
            }
            Scenario::Intersection | Scenario::Roundabout => [[-70.0, -70.0], [70.0, 70.0]],
            Scenario::Custom => {
                let (lo, hi) = self.road_bounds();
                [
                    [lo[0] as f32 - 5.0, lo[1] as f32 - 5.0],
                    [hi[0] as f32 + 5.0, hi[1] as f32 + 5.0],
                ]
            }
        };
        let inside = |p: [f32; 2]| {
            (bounds[0][0]..=bounds[1][0]).contains(&p[0])
                && (bounds[0][1]..=bounds[1][1]).contains(&p[1])
        };
        let mut scene = Scene2d::new(bounds, true);
        let mut k = 0;
        for lane in &self.road.lanes {
            for side in [-0.5, 0.5] {
                let n = (lane.length() / 5.0).ceil().max(1.0) as usize;
                let points = (0..=n)
                    .map(|i| {
                        let p =
                            lane.position(lane.length() * i as f64 / n as f64, side * lane.width);
                        [p[0] as f32, p[1] as f32]
                    })
                    .filter(|&p| inside(p))
                    .collect();
                if let Some(&name) = LANE_NAMES.get(k) {
                    scene.push(
                        name,
                        Shape2d::LineStrip {
                            points,
                            color: [160, 160, 160, 255],
                        },
                    );
                }
                k += 1;
            }
        }
        let g = self.config.goal_x as f32;
        scene.push(
            "goal",
            Shape2d::LineStrip {
                points: if self.scenario == Scenario::Merge && inside([g, 0.0]) {
                    vec![[g, -2.0], [g, 4.0 * self.layout.lanes as f32 - 2.0]]
                } else {
                    Vec::new()
                },
                color: [40, 200, 40, 255],
            },
        );
        for (i, v) in self.traffic.vehicles.iter().enumerate() {
            let color = match (v.driver, v.crashed) {
                (_, true) => [220, 40, 40, 255],
                (Driver::Agent(_), false) => [255, 150, 30, 255],
                (Driver::Idm, false) => [70, 120, 220, 255],
            };
            if let Some(&name) = VEHICLE_NAMES.get(i) {
                scene.push(
                    name,
                    Shape2d::Polygon {
                        points: if inside([v.state.x as f32, v.state.y as f32]) {
                            v.corners().map(|c| [c[0] as f32, c[1] as f32]).to_vec()
                        } else {
                            Vec::new()
                        },
                        color,
                        filled: true,
                    },
                );
            }
        }
        scene.action_paths = Some(self.action_paths());
        scene.image = self.raster();
        Some(scene)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resets_are_seeded_and_snapshots_replay_exactly() {
        let mut env = Drive::new(DriveConfig::default());
        let a = env.reset(7);
        let b = env.reset(7);
        assert_eq!(a, b);
        assert_ne!(a, env.reset(8));
        assert_eq!(a.state.len(), 2 * DriveConfig::default().agent_obs_dim());
        env.reset(3);
        let action = [0.3, 0.0, 0.1, 0.0];
        for _ in 0..5 {
            env.step(&action).unwrap();
        }
        let snap = env.snapshot();
        let first: Vec<_> = (0..10).map(|_| env.step(&action).unwrap()).collect();
        env.restore(&snap);
        let again: Vec<_> = (0..10).map(|_| env.step(&action).unwrap()).collect();
        assert_eq!(first, again);
    }

    #[test]
    fn no_two_vehicles_start_overlapping_and_every_agent_starts_on_the_road() {
        for (agents, lanes) in [(4, 1), (4, 4), (2, 2), (1, 3)] {
            let mut env = Drive::new(DriveConfig {
                agents,
                lanes,
                ..DriveConfig::default()
            });
            for seed in 0..50 {
                env.reset(seed);
                let n = env.traffic().vehicles.len();
                for i in 0..n {
                    for j in i + 1..n {
                        assert!(
                            !env.traffic().colliding(i, j),
                            "{agents}/{lanes} seed {seed}: {i} {j}"
                        );
                    }
                }
                assert!((0..agents).all(|a| !env.off_road(a) && !env.crashed(a)));
            }
        }
    }

    /// The intersection, the roundabout and the custom road: seeded resets, exact replays from
    /// a snapshot (the right-of-way rules' timing included), every agent on the first lane of
    /// its route and nobody overlapping at the start; on the intersection `turns` honoured and
    /// progress along the route.
    #[test]
    fn junction_scenes_are_seeded_replay_exactly_and_follow_the_turns() {
        junction_scenes_are_seeded_and_replay_exactly(Scenario::Intersection);
        junction_scenes_are_seeded_and_replay_exactly(Scenario::Roundabout);
        junction_scenes_are_seeded_and_replay_exactly(Scenario::Custom);
    }

    fn junction_scenes_are_seeded_and_replay_exactly(scenario: Scenario) {
        let mut env = Drive::with_scenario(scenario, DriveConfig::default());
        assert_eq!(env.reset(7), env.reset(7));
        assert_ne!(env.reset(7), env.reset(8));
        for seed in 0..50 {
            env.reset(seed);
            let n = env.traffic().vehicles.len();
            assert!(n > 4, "seed {seed}: only {n} vehicles");
            for i in 0..n {
                for j in i + 1..n {
                    assert!(!env.traffic().colliding(i, j), "seed {seed}: {i} {j}");
                }
            }
            for a in 0..2 {
                let v = &env.traffic().vehicles[env.agent_vehicle(a)];
                assert!(v.route.len() >= 3);
                assert_eq!(v.lane, v.route[0], "seed {seed} agent {a}");
                assert!(!env.off_road(a));
            }
        }
        use diffrl_core::task::Expert as _;
        let mut expert = crate::task::DriveExpert::new(Default::default());
        env.reset(3);
        for _ in 0..5 {
            env.step(&expert.act(&env)).unwrap();
        }
        // The expert remembers its target lanes: each replay starts from a copy of it.
        let (snap, at_snap) = (env.snapshot(), expert.clone());
        let drive = |env: &mut Drive| {
            let (mut expert, mut steps) = (at_snap.clone(), Vec::new());
            while steps.len() < 20 && !steps.last().is_some_and(|r: &StepResult| r.terminated) {
                steps.push(env.step(&expert.act(env)).unwrap());
            }
            steps
        };
        let first = drive(&mut env);
        env.restore(&snap);
        assert_eq!(first, drive(&mut env));
        if scenario != Scenario::Intersection {
            return;
        }

        // Agent 0 enters from the south, agent 1 from the east; their exits follow the turns.
        let config = DriveConfig {
            junction: JunctionConfig {
                turns: vec![Turn::Left, Turn::Right],
                ..JunctionConfig::default()
            },
            ..DriveConfig::default()
        };
        let mut env = Drive::with_scenario(Scenario::Intersection, config);
        let names: Vec<Vec<&str>> = (0..2)
            .map(|a| {
                let v = &env.traffic().vehicles[env.agent_vehicle(a)];
                v.route
                    .iter()
                    .map(|&l| env.road().lanes[l].name.as_str())
                    .collect()
            })
            .collect();
        assert_eq!(names[0], ["s-in", "s>w", "w-out"]);
        assert_eq!(names[1], ["e-in", "e>n", "n-out"]);
        let before = env.score();
        let r = env.step(&[0.5, 0.0, 0.5, 0.0]).unwrap();
        assert!(env.score() > before, "{} -> {}", before, env.score());
        assert!(r.reward > 0.0);
        let bad = DriveConfig {
            junction: JunctionConfig {
                turns: vec![Turn::Left],
                ..JunctionConfig::default()
            },
            ..DriveConfig::default()
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("junction.turns"), "{e}");
    }

    #[test]
    fn bad_actions_and_configs_are_refused() {
        let mut env = Drive::new(DriveConfig::default());
        let obs = env.observe();
        assert!(env.step(&[0.0, f32::NAN, 0.0, 0.0]).is_err());
        assert!(env.step(&[0.0; 3]).is_err());
        assert_eq!(env.observe(), obs, "a refused action changes nothing");
        let bad = DriveConfig {
            sim_hz: 7,
            ..DriveConfig::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("sim_hz"));
        let bad = DriveConfig {
            goal_x: 200.0,
            ..DriveConfig::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("goal_x"));
        let bad = DriveConfig {
            waypoint_steps: 0,
            ..DriveConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("waypoint_steps")
        );
    }

    /// The entity groups the observation space declares sit where the named values are: each
    /// record of a group starts with its `present` flag.
    #[test]
    fn entity_groups_match_the_observation_names() {
        let env = Drive::new(DriveConfig {
            agents: 3,
            neighbours: 4,
            ..DriveConfig::default()
        });
        let space = env.observation_space();
        let names = space.state.unwrap().names;
        let block = names.len() / space.agents;
        diffrl_core::space::check_entity_groups(&space.entities, block).unwrap();
        for a in 0..space.agents {
            for g in &space.entities {
                for r in 0..g.count {
                    let name = &names[a * block + g.offset + r * g.width];
                    assert!(
                        name.starts_with(&format!("a{a}.")) && name.ends_with(".present"),
                        "{} record {r}: {name}",
                        g.name
                    );
                }
            }
        }
        assert_eq!(space.entities[1].end(), block);
    }

    #[test]
    fn steering_off_the_road_ends_the_episode_as_a_failure() {
        let mut env = Drive::new(DriveConfig {
            agents: 1,
            ..DriveConfig::default()
        });
        env.reset(1);
        let mut last = None;
        for _ in 0..50 {
            let r = env.step(&[0.0, 1.0]).unwrap();
            let end = r.terminated;
            last = Some(r);
            if end {
                break;
            }
        }
        let r = last.unwrap();
        assert!(r.terminated && !r.info.success && r.reward < -0.5, "{r:?}");
        assert!(env.off_road(0) || env.crashed(0));
    }

    /// Runs an episode of `env` from `seed` under `act` and returns the metrics of its end.
    fn episode_metrics(
        env: &mut Drive,
        seed: u64,
        mut act: impl FnMut(&Drive) -> Vec<f32>,
    ) -> Vec<(&'static str, f64)> {
        env.reset(seed);
        loop {
            let a = act(env);
            let r = env.step(&a).unwrap();
            if r.terminated || r.truncated {
                return r.info.metrics;
            }
        }
    }

    fn metric(metrics: &[(&'static str, f64)], name: &str) -> Option<f64> {
        metrics.iter().find(|(n, _)| *n == name).map(|m| m.1)
    }

    #[test]
    fn ade_and_fde_measure_the_distance_to_the_experts_drive_of_the_same_scene() {
        use crate::task::{DriveExpert, DriveExpertConfig};
        use diffrl_core::task::Expert as _;
        let mut env = Drive::new(DriveConfig {
            expert_reference: true,
            ..DriveConfig::default()
        });
        // The expert itself drives exactly the reference.
        let mut expert = DriveExpert::new(DriveExpertConfig::default());
        let m = episode_metrics(&mut env, 4, |e| expert.act(e));
        assert_eq!(
            (metric(&m, "ade"), metric(&m, "fde")),
            (Some(0.0), Some(0.0))
        );
        // Braking hard falls behind it: the final gap is the largest.
        let m = episode_metrics(&mut env, 4, |_| vec![-1.0, 0.0, -1.0, 0.0]);
        let (ade, fde) = (metric(&m, "ade").unwrap(), metric(&m, "fde").unwrap());
        assert!(ade > 1.0 && fde > ade, "ade {ade}, fde {fde}");
        // Off (the default): no reference, no metrics.
        let mut env = Drive::new(DriveConfig::default());
        let m = episode_metrics(&mut env, 4, |_| vec![-1.0, 0.0, -1.0, 0.0]);
        assert_eq!((metric(&m, "ade"), metric(&m, "fde")), (None, None));
        assert!(metric(&m, "progress").is_some());
    }

    #[test]
    fn action_paths_follow_the_agents_kinematics() {
        let mut env = Drive::new(DriveConfig::default());
        env.reset(2);
        let chunk = [
            0.5, 0.1, -0.3, -0.05, 0.2, 0.0, 0.0, 0.05, 1.0, -0.1, 0.4, 0.0,
        ];
        let paths = env.action_paths().paths(&chunk);
        assert_eq!(paths.len(), 2);
        assert!(paths.iter().all(|p| p.len() == 4));
        for (k, row) in chunk.chunks(4).enumerate() {
            env.step(row).unwrap();
            for (a, path) in paths.iter().enumerate() {
                assert!(!env.crashed(a));
                let v = &env.traffic().vehicles[env.agent_vehicle(a)];
                let p = path[k + 1];
                let d = (f64::from(p[0]) - v.state.x).hypot(f64::from(p[1]) - v.state.y);
                assert!(d < 1e-3, "agent {a}, step {k}: {p:?} vs {:?}", v.state);
            }
        }
        // The scene carries the map.
        assert!(env.scene().unwrap().action_paths.is_some());

        // With waypoints, a chunk's path passes through its waypoints (the first checked here:
        // from the start pose) and is what stepping gives.
        let mut env = Drive::new(DriveConfig {
            actions: DriveActions::Waypoints,
            ..DriveConfig::default()
        });
        env.reset(2);
        // Each agent keeps about its speed and drifts a few centimetres sideways.
        let cruise: Vec<f32> = (0..2)
            .map(|a| {
                let v = env.traffic().vehicles[env.agent_vehicle(a)].state.speed;
                (v * 0.2 / WAYPOINT_DX) as f32
            })
            .collect();
        let chunk: Vec<f32> = [
            [0.004, 0.0, -0.004, 0.005],
            [0.0, 0.005, 0.0, -0.005],
            [0.003, -0.01, 0.0, 0.0],
        ]
        .iter()
        .flat_map(|&[ax, ay, bx, by]| [cruise[0] + ax, ay, cruise[1] + bx, by])
        .collect();
        let paths = env.action_paths().paths(&chunk);
        for (a, path) in paths.iter().enumerate() {
            let v = env.traffic().vehicles[env.agent_vehicle(a)].state;
            let (s, c) = v.heading.sin_cos();
            let [dx, dy] = [
                f64::from(chunk[2 * a]) * WAYPOINT_DX,
                f64::from(chunk[2 * a + 1]) * WAYPOINT_DY,
            ];
            let want = [v.x + c * dx - s * dy, v.y + s * dx + c * dy];
            let p = path[1];
            let d = (f64::from(p[0]) - want[0]).hypot(f64::from(p[1]) - want[1]);
            assert!(d < 1e-3, "agent {a}: waypoint {want:?}, path {p:?}");
        }
        for (k, row) in chunk.chunks(4).enumerate() {
            env.step(row).unwrap();
            for (a, path) in paths.iter().enumerate() {
                let v = &env.traffic().vehicles[env.agent_vehicle(a)];
                let p = path[k + 1];
                let d = (f64::from(p[0]) - v.state.x).hypot(f64::from(p[1]) - v.state.y);
                assert!(
                    d < 1e-3,
                    "waypoints, agent {a}, step {k}: {p:?} vs {:?}",
                    v.state
                );
            }
        }
    }

    #[test]
    fn a_reaction_delay_changes_the_traffic_and_still_replays_exactly() {
        use crate::task::{DriveExpert, DriveExpertConfig};
        use diffrl_core::task::Expert as _;
        let delayed = DriveConfig {
            randomize: DriveRandomization {
                reaction_delay: [0.5, 1.0],
                ..DriveRandomization::default()
            },
            ..DriveConfig::default()
        };
        let trajectory = |config: &DriveConfig| {
            let mut env = Drive::new(config.clone());
            env.reset(5);
            let mut states = Vec::new();
            for _ in 0..10 {
                let r = env.step(&[0.0; 4]).unwrap();
                states.extend(env.traffic().vehicles.iter().map(|v| v.state.to_array()));
                if r.terminated || r.truncated {
                    break;
                }
            }
            states
        };
        assert_ne!(trajectory(&DriveConfig::default()), trajectory(&delayed));
        let mut env = Drive::new(delayed.clone());
        env.reset(5);
        let delays: Vec<usize> = env
            .traffic()
            .vehicles
            .iter()
            .filter(|v| v.driver == Driver::Idm)
            .map(|v| v.reaction_delay)
            .collect();
        assert!(delays.iter().all(|d| (8..=15).contains(d)), "{delays:?}");
        let mut expert = DriveExpert::new(DriveExpertConfig::default());
        for _ in 0..4 {
            env.step(&expert.act(&env)).unwrap();
        }
        let snap = env.snapshot();
        let run = |env: &mut Drive| {
            let mut expert = DriveExpert::new(DriveExpertConfig::default());
            (0..10)
                .map(|_| env.step(&expert.act(env)).unwrap())
                .collect::<Vec<_>>()
        };
        let first = run(&mut env);
        env.restore(&snap);
        assert_eq!(first, run(&mut env));
        let mut bad = delayed;
        bad.randomize.reaction_delay = [0.0, 3.0];
        let e = bad.validate().unwrap_err();
        assert!(e.to_string().contains("reaction_delay"), "{e}");
    }

    #[test]
    fn the_raster_is_observed_beside_the_vectors_and_shows_the_agents() {
        let config = DriveConfig {
            raster: 32,
            raster_m: 80.0,
            ..DriveConfig::default()
        };
        config.validate().unwrap();
        let mut env = Drive::new(config.clone());
        let space = env.observation_space();
        assert_eq!(space.image.map(|i| (i.height, i.width)), Some((32, 32)));
        let obs = env.reset(3);
        let image = obs.image.as_ref().unwrap();
        assert_eq!(
            (image.height, image.width, image.data.len()),
            (32, 32, 32 * 32 * 3)
        );
        assert_eq!(obs.state, env.true_observation());
        // Both agents (green) and the road (red) are in view; the raster moves with them.
        let green = |im: &ImageObs| im.data.chunks(3).filter(|p| p[1] == 255).count();
        assert!(green(image) >= 2, "{}", green(image));
        assert!(image.data.chunks(3).any(|p| p[0] == 255));
        let mut expert = crate::task::DriveExpert::new(crate::task::DriveExpertConfig::default());
        use diffrl_core::task::Expert as _;
        let later = (0..10).fold(obs.clone(), |_, _| env.step(&expert.act(&env)).unwrap().obs);
        assert_ne!(later.image, obs.image);
        assert!(green(later.image.as_ref().unwrap()) >= 2);
        assert!(env.scene().unwrap().image.is_some());
        // Off by default; bad sizes are refused by name.
        assert!(Drive::new(DriveConfig::default()).reset(3).image.is_none());
        for (raster, raster_m, field) in [(8, 100.0, "raster"), (32, 5.0, "raster_m")] {
            let bad = DriveConfig {
                raster,
                raster_m,
                ..DriveConfig::default()
            };
            assert!(bad.validate().unwrap_err().to_string().contains(field));
        }
    }
}
