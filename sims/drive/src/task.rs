//! `highway-merge` as a task of the tools, and its expert: every agent driven as highway-env's
//! `IDMVehicle` would be (IDM speed, `steering_control` lane keeping), with two changes for a
//! merge among agents:
//!
//! - an agent on a lane that ends moves over as soon as the change is safe (neither it nor the
//!   new follower brakes harder than `max_braking`; highway-env's route-driven case of MOBIL,
//!   whose limit is 2 m/s^2), and agents make no other lane changes;
//! - an agent yields to a merging agent: another agent on a lane beside its own that ends,
//!   ahead of it, counts as a leader for its IDM (a virtual vehicle projected on its lane).
//!
//! Commands are clipped to the action ranges.

use diffrl_core::config::{Invalid, Validate};
use diffrl_core::env::Env as _;
use diffrl_core::seeding::Rng;
use diffrl_core::task::{DatasetInfo, Expert, Task, TaskEnv};
use serde::{Deserialize, Serialize};

use crate::env::{ACCELERATION_RANGE, Drive, DriveActions, DriveConfig, STEERING_RANGE, Scenario};
use crate::kinematics::{LENGTH, VehicleState, body_displacement};
use crate::road::Road;
use crate::traffic::{Driver, Neighbour, Traffic, paths_conflict};

/// The `[expert]` table of `highway-merge` and `intersection`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DriveExpertConfig {
    /// The agents' IDM target speed on the highway (m/s).
    pub target_speed: f64,
    /// Hardest braking (m/s^2) a merge may impose on the merging agent or its new follower.
    pub max_braking: f64,
    /// The agents' IDM target speed on the intersection (m/s).
    pub junction_speed: f64,
}

impl Default for DriveExpertConfig {
    fn default() -> Self {
        Self {
            target_speed: 28.0,
            max_braking: 4.0,
            junction_speed: 10.0,
        }
    }
}

impl Validate for DriveExpertConfig {
    fn validate(&self) -> Result<(), Invalid> {
        diffrl_core::config::ensure(
            self.target_speed.is_finite() && (1.0..=40.0).contains(&self.target_speed),
            "target_speed",
            format!("must be in 1..=40 m/s, got {}", self.target_speed),
        )?;
        diffrl_core::config::ensure(
            self.max_braking.is_finite() && (0.5..=10.0).contains(&self.max_braking),
            "max_braking",
            format!("must be in 0.5..=10 m/s^2, got {}", self.max_braking),
        )?;
        diffrl_core::config::ensure(
            self.junction_speed.is_finite() && (1.0..=20.0).contains(&self.junction_speed),
            "junction_speed",
            format!("must be in 1..=20 m/s, got {}", self.junction_speed),
        )
    }
}

/// The expert (module docs). It remembers each agent's target lane between steps, as
/// highway-env's vehicles do.
#[derive(Debug, Clone)]
pub struct DriveExpert {
    config: DriveExpertConfig,
    targets: Vec<Option<usize>>,
}

impl DriveExpert {
    /// The expert of `config`.
    pub fn new(config: DriveExpertConfig) -> Self {
        Self {
            config,
            targets: Vec::new(),
        }
    }

    /// Each agent's `[acceleration, steering]` in action units, remembering target lanes.
    fn controls(&mut self, env: &Drive) -> Vec<f32> {
        let n = env.config().agents;
        self.targets.resize(n, None);
        let mut out = Vec::with_capacity(2 * n);
        for a in 0..n {
            out.extend(match env.scenario() {
                Scenario::Merge => agent_action(env, a, &mut self.targets[a], &self.config),
                Scenario::Intersection | Scenario::Roundabout | Scenario::Custom => {
                    junction_action(env, a, &mut self.targets[a], &self.config)
                }
            });
        }
        out
    }
}

/// The expert's `[acceleration, steering]` for agent `a` of `env`, given its remembered target
/// lane (updated), in action units.
fn agent_action(
    env: &Drive,
    a: usize,
    target: &mut Option<usize>,
    config: &DriveExpertConfig,
) -> [f32; 2] {
    let road = env.road();
    let (mut traffic, ego, mut t) = expert_view(env, a, *target, config.target_speed);
    let v = &traffic.vehicles[ego];
    let mut gap_acc = None;
    let (on, position) = (v.lane, v.position());
    let lane = &road.lanes[on];
    if t == on && lane.ends {
        for side in Traffic::side_lanes(road, on, position) {
            if safe_merge(&traffic, road, ego, side, config.max_braking) {
                t = side;
                break;
            }
        }
        // The barrier is a stop line, not a leader to keep a time gap to.
        traffic.vehicles[ego].idm.time_wanted = 0.0;
    }
    // Until it has moved over, an agent bound for a lane that ends lines up with a gap of the
    // lane beside it, from the ramp on.
    let ending = if lane.ends {
        Some(lane)
    } else {
        lane.next
            .first()
            .map(|&n| &road.lanes[n])
            .filter(|l| l.ends)
    };
    if t == on
        && let Some(side) = ending.and_then(|l| l.left.or(l.right))
    {
        gap_acc = Some(gap_seeking(&traffic, road, ego, side));
    }
    *target = Some(t);
    traffic.vehicles[ego].target_lane = t;
    let v = &traffic.vehicles[ego];
    let (steering, mut acc) = follow(&traffic, road, ego, t);
    if let Some(g) = gap_acc {
        acc = acc.min(g);
    }
    let lane = &road.lanes[v.lane];
    let s_ego = lane.local(v.position()).0;
    for side in [lane.left, lane.right].into_iter().flatten() {
        if !road.lanes[side].ends {
            continue;
        }
        for (j, o) in traffic.vehicles.iter().enumerate() {
            let merging = j != ego
                && matches!(o.driver, Driver::Agent(_))
                && o.lane == side
                && lane.local(o.position()).0 > s_ego;
            if merging {
                acc = acc.min(traffic.acceleration(road, ego, v.lane, Some(Neighbour::Vehicle(j))));
            }
        }
    }
    command(acc, steering, v.state.speed, env.config().policy_hz)
}

/// What the expert plans agent `a` on: a copy of `env`'s traffic in which the agent cruises at
/// `speed`, the agent's vehicle index, and the lane it targets now: the remembered `target`
/// (or its lane), moved on to the next lane of its route (or the first successor) past its end,
/// as highway-env's `follow_road`. A lane change under way ends once the vehicle is on the
/// target lane.
fn expert_view(
    env: &Drive,
    a: usize,
    target: Option<usize>,
    speed: f64,
) -> (Traffic, usize, usize) {
    let ego = env.agent_vehicle(a);
    let mut traffic: Traffic = env.traffic().clone();
    traffic.vehicles[ego].target_speed = speed;
    let v = &traffic.vehicles[ego];
    let t = target.unwrap_or(v.lane);
    let t = Traffic::next_target(env.road(), v, t).unwrap_or(t);
    (traffic, ego, t)
}

/// highway-env's `IDMVehicle` commands for vehicle `ego` steering towards lane `t`: lane
/// keeping by `steering_control`, and the IDM behind the leader of its lane (and of `t`
/// during a change), not clipped. `(steering, acceleration)`.
fn follow(traffic: &Traffic, road: &Road, ego: usize, t: usize) -> (f64, f64) {
    let lane = traffic.vehicles[ego].lane;
    let steering = traffic.steering_control(road, ego, t);
    let (front, _) = traffic.neighbours(road, ego, lane);
    let mut acc = traffic.acceleration(road, ego, lane, front);
    if t != lane {
        let (front, _) = traffic.neighbours(road, ego, t);
        acc = acc.min(traffic.acceleration(road, ego, t, front));
    }
    (steering, acc)
}

/// The action for `acc` and `steering` (m/s^2, rad) of a vehicle at `speed`, in action units:
/// it stops rather than reverses (no more braking than ends the control step at rest).
fn command(acc: f64, steering: f64, speed: f64, policy_hz: u32) -> [f32; 2] {
    let acc = acc.max(-speed * f64::from(policy_hz));
    [
        (acc / ACCELERATION_RANGE).clamp(-1.0, 1.0) as f32,
        (steering / STEERING_RANGE).clamp(-1.0, 1.0) as f32,
    ]
}

/// Whether agent `ego` may move into `lane`: it would not brake harder than `max_braking`
/// behind its new leader, and a new follower that is not an agent would not either (agents
/// already yield to a merging agent, module docs).
fn safe_merge(traffic: &Traffic, road: &Road, ego: usize, lane: usize, max_braking: f64) -> bool {
    let (front, rear) = traffic.neighbours(road, ego, lane);
    let follower_ok = match rear {
        Some(Neighbour::Vehicle(f)) if matches!(traffic.vehicles[f].driver, Driver::Idm) => {
            let fl = traffic.vehicles[f].lane;
            traffic.acceleration(road, f, fl, Some(Neighbour::Vehicle(ego))) >= -max_braking
        }
        _ => true,
    };
    follower_ok && traffic.acceleration(road, ego, lane, front) >= -max_braking
}

/// Acceleration (m/s^2) that brings vehicle `ego` alongside the middle of the nearest gap of
/// `lane` long enough to merge into (two lengths plus 8 m on each side), at the speed of the
/// vehicles around it: 0.3 (m - s) + (u - v), clipped to +-3, for a gap middle `m` at arc
/// length `s` of the ego and gap speed `u`.
fn gap_seeking(traffic: &Traffic, road: &Road, ego: usize, lane: usize) -> f64 {
    let l = &road.lanes[lane];
    let me = &traffic.vehicles[ego];
    let s_ego = l.local(me.position()).0;
    let mut others: Vec<(f64, f64)> = traffic
        .vehicles
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != ego)
        .filter_map(|(_, o)| {
            l.local_on_lane(o.position(), 1.0)
                .map(|(s, _)| (s, o.state.speed))
        })
        .collect();
    others.sort_by(|a, b| a.0.total_cmp(&b.0));
    let far = 1e3;
    let mut bounds = vec![(s_ego - far, me.state.speed)];
    bounds.extend(others);
    bounds.push((s_ego + far, me.state.speed));
    let need = 2.0 * (LENGTH + 8.0);
    let best = bounds
        .windows(2)
        .filter(|w| w[1].0 - w[0].0 >= need)
        .map(|w| {
            let (rear, front) = (w[0], w[1]);
            // Open-ended gaps: aim one safe distance from the vehicle that bounds them.
            let middle = if rear.0 < s_ego - far / 2.0 {
                front.0 - need / 2.0
            } else if front.0 > s_ego + far / 2.0 {
                rear.0 + need / 2.0
            } else {
                0.5 * (rear.0 + front.0)
            };
            let speed = if rear.0 < s_ego - far / 2.0 {
                front.1
            } else if front.0 > s_ego + far / 2.0 {
                rear.1
            } else {
                0.5 * (rear.1 + front.1)
            };
            (middle, speed)
        })
        .min_by(|a, b| (a.0 - s_ego).abs().total_cmp(&(b.0 - s_ego).abs()));
    let a = match best {
        Some((middle, speed)) => {
            (0.3 * (middle - s_ego) + (speed - me.state.speed)).clamp(-3.0, 3.0)
        }
        None => 0.0,
    };
    // Never slower than 5 m/s for a gap: a standing car finds none.
    if me.state.speed < 5.0 { a.max(0.0) } else { a }
}

/// The expert's `[acceleration, steering]` for agent `a` on a junction: highway-env's
/// `IDMVehicle` along its route at `junction_speed`, yielding more cautiously than the
/// background's right-of-way rule ([`Traffic::regulate`]). On its incoming lane it predicts
/// its own path at no less than `junction_speed` (a car about to set off from a stop line is
/// not standing still for the next 3 s, which highway-env's constant-speed prediction assumes)
/// over 3.5 s, others' at their speed and at the speed they
/// cruise at, and brakes to a stop (IDM towards a standing target speed, no harder than stops
/// it within the control step) while that path conflicts with a vehicle the rule gives way to
/// or, except on the roundabout, one already in the junction. Past that it drives on: stopping
/// in the junction would block the others.
fn junction_action(
    env: &Drive,
    a: usize,
    target: &mut Option<usize>,
    config: &DriveExpertConfig,
) -> [f32; 2] {
    let road = env.road();
    let (mut traffic, ego, t) = expert_view(env, a, *target, config.junction_speed);
    let v = &traffic.vehicles[ego];
    // It yields on its incoming lane; except on the roundabout (whose ring has priority anyway)
    // it also gives way to anyone already in the junction (past the first lane of its route,
    // not yet on the last).
    let scenario = env.scenario();
    let in_junction = |v: &crate::traffic::Vehicle| {
        scenario != Scenario::Roundabout
            && v.route
                .iter()
                .position(|&l| l == v.lane)
                .is_some_and(|k| k > 0 && k + 1 < v.route.len())
    };
    let entering = v.route.first() == Some(&v.lane);
    // Its own path once (only on its incoming lane, where it yields); the others' at both of
    // their speeds below.
    let times = Traffic::conflict_times(14);
    let own = if entering {
        let speed = v.state.speed.max(config.junction_speed);
        traffic.predict_at_speed(road, ego, speed, &times)
    } else {
        Vec::new()
    };
    let k = v.route.iter().position(|&l| l == v.lane).unwrap_or(0);
    let ahead = v.route[k.min(v.route.len())..].to_vec();
    *target = Some(t);
    traffic.vehicles[ego].target_lane = t;
    let must_yield = entering
        && (0..traffic.vehicles.len()).any(|j| {
            let o = &traffic.vehicles[j];
            // The other may keep its speed or speed up to what it cruises at.
            let cruise = match o.driver {
                Driver::Idm => o.cruise_speed,
                Driver::Agent(_) => config.junction_speed,
            };
            // Vehicles on the lanes of its route ahead of it or behind it on its lane are
            // leaders and followers: the IDM keeps the distance to those.
            let on_route = ahead.contains(&o.lane);
            j != ego
                && !o.crashed
                && !on_route
                && [o.state.speed, o.state.speed.max(cruise)]
                    .iter()
                    .any(|&speed| {
                        paths_conflict(&own, &traffic.predict_at_speed(road, j, speed, &times))
                    })
                && (in_junction(o) || traffic.yielding_of(road, ego, j) == ego)
        });
    if must_yield {
        traffic.vehicles[ego].target_speed = 0.0;
    }
    let v = &traffic.vehicles[ego];
    let (steering, acc) = follow(&traffic, road, ego, t);
    command(acc, steering, v.state.speed, env.config().policy_hz)
}

impl Expert<Drive> for DriveExpert {
    fn reset(&mut self, _seed: u64) {
        self.targets.clear();
    }

    /// Controls, or with waypoint actions where the expert's controls take each agent: at the
    /// end of the control step, or with `waypoint_steps` = H > 1 after H steps of the expert
    /// driving a [`Drive::controls_copy`] of the scene (its last position if the copy's
    /// episode ends first).
    fn act(&mut self, env: &Drive) -> Vec<f32> {
        let controls = self.controls(env);
        let config = env.config();
        let h = config.waypoint_steps;
        if config.actions == DriveActions::Controls || h <= 1 {
            return controls
                .chunks_exact(2)
                .enumerate()
                .flat_map(|(a, row)| env.action_for_controls(a, [row[0], row[1]]))
                .collect();
        }
        let starts: Vec<VehicleState> = (0..config.agents)
            .map(|a| env.traffic().vehicles[env.agent_vehicle(a)].state)
            .collect();
        let mut sim = env.controls_copy();
        let mut ahead = self.clone();
        let mut action = controls;
        for _ in 0..h {
            match sim.step(&action) {
                Ok(r) if !(r.terminated || r.truncated) => action = ahead.controls(&sim),
                _ => break,
            }
        }
        starts
            .iter()
            .enumerate()
            .flat_map(|(a, &start)| {
                let end = sim.traffic().vehicles[sim.agent_vehicle(a)].state;
                env.waypoint_action(body_displacement(start, end))
            })
            .collect()
    }
}

/// A driving task (crate docs): its scenario picks the road.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriveTask(pub Scenario);

impl DriveTask {
    /// `highway-merge`: agents merge from an on-ramp.
    pub const HIGHWAY_MERGE: Self = Self(Scenario::Merge);
    /// `intersection`: agents cross a four-way junction with a priority road.
    pub const INTERSECTION: Self = Self(Scenario::Intersection);
    /// `roundabout`: agents drive through a single-lane roundabout.
    pub const ROUNDABOUT: Self = Self(Scenario::Roundabout);
    /// `custom-road`: agents drive the routes of a road given in the config (`[env.road]`).
    pub const CUSTOM_ROAD: Self = Self(Scenario::Custom);
}

impl Task for DriveTask {
    type Config = DriveConfig;
    type ExpertConfig = DriveExpertConfig;
    type Env = Drive;

    fn name(&self) -> &'static str {
        match self.0 {
            Scenario::Merge => "highway-merge",
            Scenario::Intersection => "intersection",
            Scenario::Roundabout => "roundabout",
            Scenario::Custom => "custom-road",
        }
    }

    /// The default config's layout (2 agents); [`Task::dataset_for`] gives a config's own.
    fn dataset(&self) -> DatasetInfo {
        self.dataset_for(&DriveConfig::default())
    }

    /// Datasets record the observation (every agent's block) as the state.
    fn dataset_for(&self, c: &DriveConfig) -> DatasetInfo {
        DatasetInfo {
            fps: c.policy_hz,
            robot_type: "car".into(),
            state_names: c.obs_names(),
            action_names: c.action_names(),
            instruction: match self.0 {
                Scenario::Merge => "merge onto the highway without collisions",
                Scenario::Intersection => "cross the intersection without collisions",
                Scenario::Roundabout => "drive through the roundabout without collisions",
                Scenario::Custom => "drive the given routes without collisions",
            }
            .into(),
        }
    }

    fn build(&self, config: &DriveConfig) -> Drive {
        Drive::with_scenario(self.0, config.clone())
    }

    /// `state`, or `state+raster` with the bird's-eye raster as the camera image.
    fn observation(&self, config: &DriveConfig) -> String {
        if config.raster > 0 {
            "state+raster".into()
        } else {
            "state".into()
        }
    }

    /// The raster's side when it is on. Rasters cannot be drawn from recorded states (they are
    /// agent-centric vectors): datasets record them as camera frames.
    fn image_size(&self, config: &DriveConfig) -> Option<u32> {
        (config.raster > 0).then_some(config.raster)
    }

    fn randomization_key(&self) -> Option<&'static str> {
        Some("randomize")
    }

    fn expert(&self, config: &DriveExpertConfig, _seed: u64) -> Option<Box<dyn Expert<Drive>>> {
        Some(Box::new(DriveExpert::new(config.clone())))
    }

    fn expert_name(&self, _config: &DriveExpertConfig) -> String {
        match self.0 {
            Scenario::Merge => "IdmMerge",
            Scenario::Intersection | Scenario::Roundabout | Scenario::Custom => "IdmYield",
        }
        .into()
    }

    /// The expert's action with uniform noise of +-0.2 on every component.
    fn scripted_action(&self, env: &Drive, rng: &mut Rng) -> Option<Vec<f32>> {
        use rand::Rng as _;
        let mut e = DriveExpert::new(DriveExpertConfig::default());
        let mut a = e.act(env);
        for x in &mut a {
            *x = (*x + rng.random_range(-0.2..0.2)).clamp(-1.0, 1.0);
        }
        Some(a)
    }
}

impl TaskEnv for Drive {
    /// The noise-free observation: agent-centric, so it is what a policy sees.
    fn true_state(&self) -> Vec<f64> {
        self.true_observation().into_iter().map(f64::from).collect()
    }

    /// Each agent's position, speed and lane, then the score.
    fn describe_step(&self, action: &[f32], r: &diffrl_core::StepResult) -> String {
        let mut line = format!("action {action:?} ");
        for a in 0..self.config().agents {
            let v = &self.traffic().vehicles[self.agent_vehicle(a)];
            line += &format!(
                " agent {a} ({:6.1}, {:5.2}) {:4.1} m/s {}{}",
                v.state.x,
                v.state.y,
                v.state.speed,
                self.road().lanes[v.lane].name,
                if self.crashed(a) {
                    " CRASHED"
                } else if self.off_road(a) {
                    " OFF ROAD"
                } else {
                    ""
                }
            );
        }
        format!(
            "{line}  score {:.3}{}",
            r.info.score,
            if r.info.success { "  SUCCESS" } else { "" }
        )
    }

    /// `agents`: each agent's `[x, y, heading, speed]`; `vehicles`: how many vehicles are on
    /// the road; `crashed` and `off_road`: per agent, 1 or 0.
    fn named_state(&self) -> Vec<(&'static str, Vec<f64>)> {
        let n = self.config().agents;
        vec![
            ("agents", self.agent_states()),
            ("vehicles", vec![self.traffic().vehicles.len() as f64]),
            (
                "crashed",
                (0..n)
                    .map(|a| f64::from(u8::from(self.crashed(a))))
                    .collect(),
            ),
            (
                "off_road",
                (0..n)
                    .map(|a| f64::from(u8::from(self.off_road(a))))
                    .collect(),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use diffrl_core::env::Env;

    /// The expert merges: over 40 seeded scenes with two agents, at least 34 succeed (36 at the
    /// time of writing; 89.4% of 500 in docs/driving.md).
    #[test]
    fn the_expert_merges_without_collisions() {
        let (successes, _) = expert_outcomes(Scenario::Merge, DriveConfig::default());
        assert!(successes >= 34, "{successes}/40");
    }

    /// With waypoints 5 control steps (1 s) ahead the expert plans on a copy of the scene and
    /// the tracker follows: it still merges, at least 34 of 40 scenes (38 at the time of
    /// writing, against 36 driving its controls directly; 97.0% of 300 in docs/driving.md).
    #[test]
    fn the_expert_merges_through_waypoints_a_second_ahead() {
        let config = DriveConfig {
            actions: DriveActions::Waypoints,
            waypoint_steps: 5,
            ..DriveConfig::default()
        };
        let (successes, _) = expert_outcomes(Scenario::Merge, config);
        assert!(successes >= 34, "{successes}/40");
    }

    /// The expert crosses the intersection: over 40 seeded scenes with two agents (one on the
    /// minor road) and the default 150-step limit, at least 30 succeed (34 at the time of
    /// writing; docs/driving.md has 500), and it never leaves the road.
    #[test]
    fn the_expert_crosses_the_intersection() {
        assert!(expert_successes(Scenario::Intersection, DriveActions::Controls) >= 30);
    }

    /// The same through waypoint actions and the tracker: at least 30 of 40 scenes (33 at the
    /// time of writing, 34 with controls), never off the road.
    #[test]
    fn the_expert_crosses_the_intersection_through_waypoints() {
        assert!(expert_successes(Scenario::Intersection, DriveActions::Waypoints) >= 30);
    }

    /// The expert drives through the roundabout: at least 30 of 40 scenes (35 at the time of
    /// writing; docs/driving.md has 500).
    #[test]
    fn the_expert_drives_through_the_roundabout() {
        assert!(expert_successes(Scenario::Roundabout, DriveActions::Controls) >= 30);
    }

    /// The expert drives the built-in T-junction of `custom-road`: at least 24 of 40 scenes (28
    /// at the time of writing: its left turn from the minor road across both directions of a
    /// 20 m box is where it fails, docs/driving.md).
    #[test]
    fn the_expert_drives_the_custom_road() {
        assert!(expert_successes(Scenario::Custom, DriveActions::Controls) >= 24);
    }

    /// With waypoint actions the expert's commands go through the tracker and come back the
    /// same: on the merge, where agents never stop, every step's agent positions equal those
    /// of the controls env to 1 mm, so outcomes are the same scene by scene. (Where agents
    /// stop, as at junctions, steering at a standstill moves nothing, so the tracker's
    /// micrometre residues can turn the expert's lane keeping another way there; the junction
    /// tests check the expert's success through waypoints instead.)
    #[test]
    fn the_expert_drives_the_same_scenes_through_waypoints() {
        let scenario = Scenario::Merge;
        let config = DriveConfig::default();
        let waypoints = DriveConfig {
            actions: DriveActions::Waypoints,
            ..config.clone()
        };
        let mut envs = [
            Drive::with_scenario(scenario, config),
            Drive::with_scenario(scenario, waypoints),
        ];
        assert_eq!(
            envs[1].action_space().names,
            ["a0.dx", "a0.dy", "a1.dx", "a1.dy"]
        );
        for seed in 0..8 {
            let mut experts = [0, 1].map(|_| DriveExpert::new(DriveExpertConfig::default()));
            for (env, expert) in envs.iter_mut().zip(&mut experts) {
                env.reset(seed);
                expert.reset(seed);
            }
            loop {
                let rs: Vec<_> = envs
                    .iter_mut()
                    .zip(&mut experts)
                    .map(|(env, expert)| {
                        let a = expert.act(env);
                        env.step(&a).unwrap()
                    })
                    .collect();
                let [c, w] = [&envs[0], &envs[1]].map(Drive::agent_states);
                for (i, (x, y)) in c.iter().zip(&w).enumerate() {
                    assert!(
                        (x - y).abs() < 1e-3,
                        "{scenario:?} seed {seed}: state {i} {x} vs {y}"
                    );
                }
                assert_eq!(rs[0].terminated, rs[1].terminated);
                if rs[0].terminated || rs[0].truncated {
                    assert_eq!(rs[0].info.success, rs[1].info.success);
                    break;
                }
            }
        }
    }

    /// Successes of the expert over 40 seeded scenes of `scenario` with two agents, a
    /// 150-step limit and `actions`; it never leaves the road.
    fn expert_successes(scenario: Scenario, actions: DriveActions) -> usize {
        let config = DriveConfig {
            max_episode_steps: 150,
            actions,
            ..DriveConfig::default()
        };
        let (successes, off_road) = expert_outcomes(scenario, config);
        assert!(
            off_road.is_empty(),
            "{scenario:?} seeds {off_road:?} left the road"
        );
        eprintln!("{scenario:?}, {actions:?}: {successes}/40");
        successes
    }

    /// The expert's successes over 40 seeded scenes of `scenario` under `config`, and the seeds
    /// whose episode ended off the road.
    fn expert_outcomes(scenario: Scenario, config: DriveConfig) -> (usize, Vec<u64>) {
        let mut env = Drive::with_scenario(scenario, config);
        let mut expert = DriveExpert::new(DriveExpertConfig::default());
        let (mut successes, mut off_road) = (0, Vec::new());
        for seed in 0..40 {
            env.reset(seed);
            expert.reset(seed);
            loop {
                let a = expert.act(&env);
                let r = env.step(&a).unwrap();
                if r.terminated || r.truncated {
                    successes += usize::from(r.info.success);
                    let off = r.info.metrics.iter().find(|m| m.0 == "off_road").unwrap();
                    if off.1 != 0.0 {
                        off_road.push(seed);
                    }
                    break;
                }
            }
        }
        (successes, off_road)
    }
}
