//! Vehicles on a [`Road`] and the driver models of highway-env 1.12.1 that move the background
//! traffic: lane following by `ControlledVehicle.steering_control`, speed by the IDM
//! (`IDMVehicle.act`: the current lane's leader, and the target lane's during a change, clipped
//! to `ACC_MAX`), lane changes by MOBIL (`IDMVehicle.change_lane_policy` and `mobil`, decided
//! once per `LANE_CHANGE_DELAY`), collisions between oriented boxes (parry2d) that stop both
//! vehicles as highway-env does. Leaders are searched on the lane and its connected lanes
//! (highway-env's `neighbour_vehicles_connected_lanes = True`), and a lane that [`ends`] acts
//! as a standing vehicle at its end. On junctions vehicles drive routes ([`Vehicle::route`])
//! and give way by highway-env's `RegulatedRoad` rules ([`Traffic::regulate`]).
//!
//! [`ends`]: crate::road::Lane::ends

use parry2d::math::{Pose, Vector};
use parry2d::query::intersection_test;
use parry2d::shape::Cuboid;

use crate::idm::{Idm, Leader, not_zero};
use crate::kinematics::{LENGTH, VehicleState, WIDTH};
use crate::road::{Road, wrap_to_pi};

/// `ControlledVehicle.TAU_PURSUIT` (s).
pub const TAU_PURSUIT: f64 = 0.5 * 0.2;
/// `ControlledVehicle.KP_HEADING` (1/s).
pub const KP_HEADING: f64 = 1.0 / 0.2;
/// `ControlledVehicle.KP_LATERAL` (1/s).
pub const KP_LATERAL: f64 = 1.0 / 0.6;
/// `ControlledVehicle.MAX_STEERING_ANGLE` (rad).
pub const MAX_STEERING_ANGLE: f64 = std::f64::consts::FRAC_PI_3;
/// `IDMVehicle.POLITENESS`.
pub const POLITENESS: f64 = 0.0;
/// `IDMVehicle.LANE_CHANGE_MIN_ACC_GAIN` (m/s^2).
pub const LANE_CHANGE_MIN_ACC_GAIN: f64 = 0.2;
/// `IDMVehicle.LANE_CHANGE_MAX_BRAKING_IMPOSED` (m/s^2).
pub const LANE_CHANGE_MAX_BRAKING_IMPOSED: f64 = 2.0;
/// `IDMVehicle.LANE_CHANGE_DELAY` (s).
pub const LANE_CHANGE_DELAY: f64 = 1.0;

/// Who drives a vehicle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// IDM + MOBIL background traffic.
    Idm,
    /// Controlled agent `i`: its actions come from outside.
    Agent(usize),
}

/// One vehicle (highway-env's `Vehicle` box, 5 x 2 m).
#[derive(Debug, Clone, PartialEq)]
pub struct Vehicle {
    /// Position, heading, speed.
    pub state: VehicleState,
    /// The lane it is on (closest in distance and heading, updated after every step).
    pub lane: usize,
    /// The lane it steers towards.
    pub target_lane: usize,
    /// IDM's desired speed (m/s).
    pub target_speed: f64,
    /// IDM parameters.
    pub idm: Idm,
    /// Time since its last lane-change decision (s).
    pub timer: f64,
    /// Whether it has collided (it then brakes to a stop, straight).
    pub crashed: bool,
    /// Who drives it.
    pub driver: Driver,
    /// Physics steps between a background driver's acceleration command and its effect (a
    /// reaction time; 0: none). See [`Traffic::react`].
    pub reaction_delay: usize,
    /// Commands waiting for their effect, oldest first.
    pub pending: std::collections::VecDeque<f64>,
    /// The lanes it means to drive, in order (empty: the first successor at each lane's end,
    /// as on the merge road). Its lane is taken from these while it is on one of them
    /// ([`Road::closest_lane_among`]), and leaders are searched along them.
    pub route: Vec<usize>,
    /// The speed it cruises at when not yielding (m/s): `target_speed` returns to it.
    pub cruise_speed: f64,
    /// Whether it is yielding at a junction ([`Traffic::regulate`]; target speed 0).
    pub yielding: bool,
}

impl Vehicle {
    /// A vehicle at `state` on `road`, heading for `target_speed`, on its closest lane;
    /// highway-env's initial lane-change timer (sum of the position x pi, modulo the delay).
    pub fn new(road: &Road, state: VehicleState, target_speed: f64, driver: Driver) -> Self {
        let lane = road.closest_lane([state.x, state.y], state.heading);
        Self {
            state,
            lane,
            target_lane: lane,
            target_speed,
            idm: Idm::default(),
            timer: ((state.x + state.y) * std::f64::consts::PI).rem_euclid(LANE_CHANGE_DELAY),
            crashed: false,
            driver,
            reaction_delay: 0,
            pending: std::collections::VecDeque::new(),
            route: Vec::new(),
            cruise_speed: target_speed,
            yielding: false,
        }
    }

    /// The lane after `lane` on this vehicle's route, if `lane` is on it and not its last.
    pub fn route_next(&self, lane: usize) -> Option<usize> {
        let k = self.route.iter().position(|&l| l == lane)?;
        self.route.get(k + 1).copied()
    }

    /// Position (m).
    pub fn position(&self) -> [f64; 2] {
        [self.state.x, self.state.y]
    }

    /// Velocity (m/s).
    pub fn velocity(&self) -> [f64; 2] {
        let (s, c) = self.state.heading.sin_cos();
        [self.state.speed * c, self.state.speed * s]
    }

    /// The box's corners, counter-clockwise from the front right.
    pub fn corners(&self) -> [[f64; 2]; 4] {
        let (s, c) = self.state.heading.sin_cos();
        let (hl, hw) = (LENGTH / 2.0, WIDTH / 2.0);
        [(hl, -hw), (hl, hw), (-hl, hw), (-hl, -hw)]
            .map(|(a, b)| [self.state.x + a * c - b * s, self.state.y + a * s + b * c])
    }
}

/// A vehicle ahead or behind on a lane: its index, or the barrier where a lane ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Neighbour {
    /// Vehicle `i` of the traffic.
    Vehicle(usize),
    /// The end of a lane that [`ends`](crate::road::Lane::ends), at arc length `s` of the
    /// searched lane.
    Barrier(f64),
}

/// Whether two predicted paths (points and headings at the same instants) bring the vehicles
/// within a vehicle length of each other with boxes of 1.5 x their length and 0.9 x their
/// width overlapping at some instant (highway-env's `is_conflict_possible` test).
pub fn paths_conflict(a: &[([f64; 2], f64)], b: &[([f64; 2], f64)]) -> bool {
    let half = Cuboid::new(Vector::new(
        (1.5 * LENGTH / 2.0) as f32,
        (0.9 * WIDTH / 2.0) as f32,
    ));
    a.iter().zip(b).any(|(&(pa, ha), &(pb, hb))| {
        let d = [pb[0] - pa[0], pb[1] - pa[1]];
        if d[0].hypot(d[1]) > LENGTH {
            return false;
        }
        let posa = Pose::new(Vector::ZERO, ha as f32);
        let posb = Pose::new(Vector::new(d[0] as f32, d[1] as f32), hb as f32);
        intersection_test(&posa, &half, &posb, &half).is_ok_and(|r| r.intersecting)
    })
}

/// The vehicles of a road and their drivers.
#[derive(Debug, Clone, PartialEq)]
pub struct Traffic {
    /// All vehicles, agents included.
    pub vehicles: Vec<Vehicle>,
}

/// IDM acceleration of vehicle `ego` behind `front` (None: free road), highway-env's
/// `IDMVehicle.acceleration` with the projected closing speed of `desired_gap` and the gap
/// `lane_distance_to` measures on `lane`.
fn idm_towards(
    road: &Road,
    vehicles: &[Vehicle],
    ego: &Vehicle,
    lane: usize,
    front: Option<Neighbour>,
) -> f64 {
    let leader = front.map(|f| {
        let l = &road.lanes[lane];
        let s_ego = l.local(ego.position()).0;
        match f {
            Neighbour::Vehicle(j) => {
                let o = &vehicles[j];
                let dir = [ego.state.heading.cos(), ego.state.heading.sin()];
                let (ve, vo) = (ego.velocity(), o.velocity());
                let dv = (ve[0] - vo[0]) * dir[0] + (ve[1] - vo[1]) * dir[1];
                Leader {
                    speed: ego.state.speed - dv,
                    gap: l.local(o.position()).0 - s_ego,
                }
            }
            Neighbour::Barrier(s) => Leader {
                speed: 0.0,
                gap: s - s_ego,
            },
        }
    });
    ego.idm
        .acceleration(ego.state.speed, ego.target_speed, leader)
}

impl Traffic {
    /// highway-env's `Road.neighbour_vehicles` with connected lanes: the nearest vehicle at or
    /// ahead of `ego`'s projection on `lane` and the nearest behind it, among vehicles on the
    /// lane (1 m margin), its successors (arc length shifted by the lane's length; only the
    /// next lane of `ego`'s route when it has one there) and its predecessors; a lane that
    /// ends contributes its barrier as a leader.
    pub fn neighbours(
        &self,
        road: &Road,
        ego: usize,
        lane: usize,
    ) -> (Option<Neighbour>, Option<Neighbour>) {
        let l = &road.lanes[lane];
        let s = l.local(self.vehicles[ego].position()).0;
        let mut search: Vec<(usize, f64)> = vec![(lane, 0.0)];
        match self.vehicles[ego].route_next(lane) {
            Some(n) => search.push((n, l.length())),
            None => search.extend(l.next.iter().map(|&n| (n, l.length()))),
        }
        search.extend(road.previous(lane).map(|p| (p, -road.lanes[p].length())));
        let mut front: Option<(f64, Neighbour)> = None;
        let mut rear: Option<(f64, Neighbour)> = None;
        if l.ends && s <= l.length() {
            front = Some((l.length(), Neighbour::Barrier(l.length())));
        }
        for (j, v) in self.vehicles.iter().enumerate() {
            if j == ego {
                continue;
            }
            for &(k, offset) in &search {
                let lk = &road.lanes[k];
                let Some((sv, _)) = lk.local_on_lane(v.position(), 1.0) else {
                    continue;
                };
                let sv = sv + offset;
                if s <= sv && front.is_none_or(|(f, _)| sv <= f) {
                    front = Some((sv, Neighbour::Vehicle(j)));
                }
                if sv < s && rear.is_none_or(|(r, _)| sv > r) {
                    rear = Some((sv, Neighbour::Vehicle(j)));
                }
                break;
            }
        }
        (front.map(|f| f.1), rear.map(|r| r.1))
    }

    /// IDM acceleration of `ego` behind `front` on `lane` (m/s^2, not clipped).
    pub fn acceleration(
        &self,
        road: &Road,
        ego: usize,
        lane: usize,
        front: Option<Neighbour>,
    ) -> f64 {
        idm_towards(road, &self.vehicles, &self.vehicles[ego], lane, front)
    }

    /// IDM acceleration of vehicle `follower` if vehicle `ego` (or the barrier) led it.
    fn acceleration_of(
        &self,
        road: &Road,
        follower: Option<Neighbour>,
        front: Option<Neighbour>,
    ) -> f64 {
        match follower {
            Some(Neighbour::Vehicle(f)) => {
                let lane = self.vehicles[f].lane;
                idm_towards(road, &self.vehicles, &self.vehicles[f], lane, front)
            }
            _ => 0.0,
        }
    }

    /// highway-env's `ControlledVehicle.steering_control` of vehicle `ego` towards the centre
    /// of `lane` (rad, clipped to +-`MAX_STEERING_ANGLE`).
    pub fn steering_control(&self, road: &Road, ego: usize, lane: usize) -> f64 {
        let v = &self.vehicles[ego];
        let l = &road.lanes[lane];
        let (s, r) = l.local(v.position());
        let future_heading = l.heading_at(s + v.state.speed * TAU_PURSUIT);
        let lateral_speed = -KP_LATERAL * r;
        let heading_command = (lateral_speed / not_zero(v.state.speed))
            .clamp(-1.0, 1.0)
            .asin();
        let heading_ref = future_heading
            + heading_command.clamp(-std::f64::consts::FRAC_PI_4, std::f64::consts::FRAC_PI_4);
        let heading_rate = KP_HEADING * wrap_to_pi(heading_ref - v.state.heading);
        let slip = (LENGTH / 2.0 / not_zero(v.state.speed) * heading_rate)
            .clamp(-1.0, 1.0)
            .asin();
        (2.0 * slip.tan())
            .atan()
            .clamp(-MAX_STEERING_ANGLE, MAX_STEERING_ANGLE)
    }

    /// highway-env's `IDMVehicle.mobil` without a route: whether vehicle `ego` should move to
    /// `lane` (the new follower brakes no harder than `LANE_CHANGE_MAX_BRAKING_IMPOSED`, and
    /// the change gains at least `LANE_CHANGE_MIN_ACC_GAIN`).
    pub fn mobil(&self, road: &Road, ego: usize, lane: usize) -> bool {
        let (new_front, new_rear) = self.neighbours(road, ego, lane);
        let me = Some(Neighbour::Vehicle(ego));
        let new_rear_a = self.acceleration_of(road, new_rear, new_front);
        let new_rear_pred_a = self.acceleration_of(road, new_rear, me);
        if new_rear_pred_a < -LANE_CHANGE_MAX_BRAKING_IMPOSED {
            return false;
        }
        let self_pred_a = self.acceleration(road, ego, lane, new_front);
        let current = self.vehicles[ego].lane;
        let (old_front, old_rear) = self.neighbours(road, ego, current);
        let self_a = self.acceleration(road, ego, current, old_front);
        let old_rear_a = self.acceleration_of(road, old_rear, me);
        let old_rear_pred_a = self.acceleration_of(road, old_rear, old_front);
        let gain = self_pred_a - self_a
            + POLITENESS * (new_rear_pred_a - new_rear_a + old_rear_pred_a - old_rear_a);
        gain >= LANE_CHANGE_MIN_ACC_GAIN
    }

    /// Whether a lane change of vehicle `ego` into `lane` that its route requires is safe:
    /// neither it nor its new follower would brake harder than `max_braking` (m/s^2) under
    /// the IDM (highway-env's route case of `mobil`, whose limit is
    /// `LANE_CHANGE_MAX_BRAKING_IMPOSED`).
    pub fn safe_change(&self, road: &Road, ego: usize, lane: usize, max_braking: f64) -> bool {
        let (new_front, new_rear) = self.neighbours(road, ego, lane);
        let me = Some(Neighbour::Vehicle(ego));
        self.acceleration_of(road, new_rear, me) >= -max_braking
            && self.acceleration(road, ego, lane, new_front) >= -max_braking
    }

    /// Lanes beside `lane` that a vehicle at `p` may change into (highway-env's `side_lanes`
    /// and `is_reachable_from`: within two lane widths and not past its end).
    pub fn side_lanes(road: &Road, lane: usize, p: [f64; 2]) -> Vec<usize> {
        let l = &road.lanes[lane];
        [l.left, l.right]
            .into_iter()
            .flatten()
            .filter(|&k| {
                let lk = &road.lanes[k];
                let (s, r) = lk.local(p);
                r.abs() <= 2.0 * lk.width && (0.0..lk.length() + LENGTH).contains(&s)
            })
            .collect()
    }

    /// highway-env's `follow_road`: past the end of its target lane (half a length before it),
    /// a vehicle targets the next lane of its route, or without one the lane's first
    /// successor.
    pub fn follow_road(&mut self, road: &Road, ego: usize) {
        let v = &mut self.vehicles[ego];
        if let Some(n) = Self::next_target(road, v, v.target_lane) {
            v.target_lane = n;
        }
    }

    /// The lane vehicle `v` should target instead of `target` once it is half a length from
    /// `target`'s end ([`Traffic::follow_road`]); None: keep `target`.
    pub fn next_target(road: &Road, v: &Vehicle, target: usize) -> Option<usize> {
        let l = &road.lanes[target];
        if l.local(v.position()).0 > l.length() - LENGTH / 2.0 {
            v.route_next(target).or_else(|| l.next.first().copied())
        } else {
            None
        }
    }

    /// The `[steering, acceleration]` background vehicle `ego` commands now (highway-env's
    /// `IDMVehicle.act`), updating its target lane (the lane-change timer advances in `step`).
    pub fn idm_action(&mut self, road: &Road, ego: usize) -> [f64; 2] {
        if self.vehicles[ego].crashed {
            return [0.0, 0.0];
        }
        self.follow_road(road, ego);
        self.change_lane_policy(road, ego);
        let v = &self.vehicles[ego];
        let steering = self.steering_control(road, ego, v.target_lane);
        let (front, _) = self.neighbours(road, ego, v.lane);
        let mut a = self.acceleration(road, ego, v.lane, front);
        if v.lane != v.target_lane {
            let (front, _) = self.neighbours(road, ego, v.target_lane);
            a = a.min(self.acceleration(road, ego, v.target_lane, front));
        }
        [steering, a.clamp(-v.idm.acc_max, v.idm.acc_max)]
    }

    /// The acceleration vehicle `ego` applies now, given the one it commands now: with a
    /// `reaction_delay` of d physics steps, the command of d steps ago. Until its first
    /// command takes effect a driver holds its speed (acceleration 0).
    pub fn react(&mut self, ego: usize, acceleration: f64) -> f64 {
        let v = &mut self.vehicles[ego];
        if v.reaction_delay == 0 {
            return acceleration;
        }
        v.pending.push_back(acceleration);
        if v.pending.len() > v.reaction_delay {
            v.pending.pop_front().unwrap_or(0.0)
        } else {
            0.0
        }
    }

    /// highway-env's `IDMVehicle.change_lane_policy` (without its abort of changes into a lane
    /// another vehicle is also changing into).
    fn change_lane_policy(&mut self, road: &Road, ego: usize) {
        let v = &self.vehicles[ego];
        if v.lane != v.target_lane || v.timer <= LANE_CHANGE_DELAY {
            return;
        }
        let (lane, position, speed) = (v.lane, v.position(), v.state.speed);
        self.vehicles[ego].timer = 0.0;
        if speed.abs() < 1.0 {
            return;
        }
        for lane in Self::side_lanes(road, lane, position) {
            if self.mobil(road, ego, lane) {
                self.vehicles[ego].target_lane = lane;
            }
        }
    }

    /// Moves every vehicle by `dt` s under `actions` (one `[steering, acceleration]` per
    /// vehicle; crashed vehicles brake to a stop, straight), updates lanes and timers, then
    /// marks colliding pairs crashed with both speeds set to the smaller one (highway-env's
    /// `handle_collisions` for solid vehicles, without its impact displacement). Returns the
    /// overlapping pairs `(i, j)`, i < j.
    pub fn step(&mut self, road: &Road, actions: &[[f64; 2]], dt: f64) -> Vec<(usize, usize)> {
        for (v, a) in self.vehicles.iter_mut().zip(actions) {
            let (steering, acceleration) = if v.crashed {
                (0.0, -v.state.speed)
            } else if v.driver == Driver::Idm && !v.route.is_empty() {
                // Background drivers on a route (through a junction) stop instead of
                // reversing when the IDM brakes them at a standstill.
                (a[0], a[1].max(-v.state.speed.max(0.0) / dt))
            } else {
                (a[0], a[1])
            };
            v.state = v.state.step(steering, acceleration, dt);
            v.lane = if v.route.is_empty() {
                road.closest_lane(v.position(), v.state.heading)
            } else {
                road.closest_lane_among(&v.route, v.position(), v.state.heading)
            };
            v.timer += dt;
        }
        let n = self.vehicles.len();
        let mut pairs = Vec::new();
        for i in 0..n {
            for j in i + 1..n {
                if self.colliding(i, j) {
                    pairs.push((i, j));
                    let speed = {
                        let (a, b) = (self.vehicles[i].state.speed, self.vehicles[j].state.speed);
                        if a.abs() <= b.abs() { a } else { b }
                    };
                    for k in [i, j] {
                        self.vehicles[k].crashed = true;
                        self.vehicles[k].state.speed = speed;
                    }
                }
            }
        }
        pairs
    }

    /// Where vehicle `i` will be after each of `times` (s) at its current speed along its
    /// route (or its lane), on the centre line: highway-env's
    /// `predict_trajectory_constant_speed`. Points and headings.
    pub fn predict_constant_speed(
        &self,
        road: &Road,
        i: usize,
        times: &[f64],
    ) -> Vec<([f64; 2], f64)> {
        self.predict_at_speed(road, i, self.vehicles[i].state.speed, times)
    }

    /// [`Traffic::predict_constant_speed`] with vehicle `i` driving at `speed` (m/s).
    pub fn predict_at_speed(
        &self,
        road: &Road,
        i: usize,
        speed: f64,
        times: &[f64],
    ) -> Vec<([f64; 2], f64)> {
        let v = &self.vehicles[i];
        let on_route = v.route.iter().position(|&l| l == v.lane);
        let (route, k) = match on_route {
            Some(k) => (&v.route[..], k),
            None => (std::slice::from_ref(&v.lane), 0),
        };
        let s0 = road.route_offset(route, k) + road.lanes[v.lane].local(v.position()).0;
        times
            .iter()
            .map(|t| road.along_route(route, s0 + speed * t))
            .collect()
    }

    /// highway-env's `RegulatedRoad.is_conflict_possible`: whether vehicles `i` and `j`, each
    /// driving on at constant speed along its route, come within a vehicle length of each
    /// other with boxes of 1.5 x their length and 0.9 x their width overlapping, at any of
    /// 0.25, 0.5, ... 2.75 s ahead.
    pub fn conflict_possible(&self, road: &Road, i: usize, j: usize) -> bool {
        let speeds = [i, j].map(|k| self.vehicles[k].state.speed);
        self.conflict_at_speeds(road, [i, j], speeds, 11)
    }

    /// The instants `steps` x 0.25 s apart from 0.25 s on at which conflicts are predicted
    /// (highway-env: 11, to 2.75 s).
    pub fn conflict_times(steps: usize) -> Vec<f64> {
        (1..=steps).map(|k| 0.25 * k as f64).collect()
    }

    /// Whether vehicles `pair`, driving on along their routes at `speeds` (m/s), come within
    /// a vehicle length of each other with boxes of 1.5 x their length and 0.9 x their width
    /// overlapping at any of `steps` instants 0.25 s apart from 0.25 s on
    /// ([`Traffic::conflict_possible`] with 11 steps at their current speeds).
    pub fn conflict_at_speeds(
        &self,
        road: &Road,
        pair: [usize; 2],
        speeds: [f64; 2],
        steps: usize,
    ) -> bool {
        let times = Self::conflict_times(steps);
        let a = self.predict_at_speed(road, pair[0], speeds[0], &times);
        let b = self.predict_at_speed(road, pair[1], speeds[1], &times);
        paths_conflict(&a, &b)
    }

    /// highway-env's `RegulatedRoad.respect_priorities`: which of vehicles `i` and `j` yields
    /// in a conflict. The one on the lane of lower [`priority`](crate::road::Lane::priority);
    /// on equal priorities the one behind (the other lies further ahead along its heading
    /// than it lies ahead along the other's).
    pub fn yielding_of(&self, road: &Road, i: usize, j: usize) -> usize {
        let (a, b) = (&self.vehicles[i], &self.vehicles[j]);
        let (pa, pb) = (road.lanes[a.lane].priority, road.lanes[b.lane].priority);
        if pa != pb {
            return if pa < pb { i } else { j };
        }
        let front = |from: &Vehicle, to: &Vehicle| {
            let (s, c) = from.state.heading.sin_cos();
            (to.state.x - from.state.x) * c + (to.state.y - from.state.y) * s
        };
        if front(a, b) > front(b, a) { i } else { j }
    }

    /// highway-env's `RegulatedRoad.enforce_road_rules` with its default `YIELD_DURATION` of 0:
    /// every background driver that yielded stops yielding (its target speed back to its
    /// cruise speed); then for every pair whose paths may conflict
    /// ([`Traffic::conflict_possible`]), the one that must yield ([`Traffic::yielding_of`]),
    /// if it is a background driver, yields: target speed 0 until the next call. Crashed
    /// vehicles take no part. Controlled agents never yield here (their policy decides).
    pub fn regulate(&mut self, road: &Road) {
        for v in &mut self.vehicles {
            if v.yielding {
                v.yielding = false;
                v.target_speed = v.cruise_speed;
            }
        }
        // Each vehicle's path once, then every pair ([`Traffic::conflict_possible`]).
        let times = Self::conflict_times(11);
        let paths: Vec<_> = (0..self.vehicles.len())
            .map(|i| self.predict_constant_speed(road, i, &times))
            .collect();
        let n = self.vehicles.len();
        for i in 0..n {
            for j in i + 1..n {
                if self.vehicles[i].crashed
                    || self.vehicles[j].crashed
                    || !paths_conflict(&paths[i], &paths[j])
                {
                    continue;
                }
                let y = self.yielding_of(road, i, j);
                let v = &mut self.vehicles[y];
                if v.driver == Driver::Idm {
                    v.yielding = true;
                    v.target_speed = 0.0;
                }
            }
        }
    }

    /// Whether the boxes of vehicles `i` and `j` overlap.
    pub fn colliding(&self, i: usize, j: usize) -> bool {
        let (a, b) = (&self.vehicles[i], &self.vehicles[j]);
        let d = [b.state.x - a.state.x, b.state.y - a.state.y];
        let diagonal = LENGTH.hypot(WIDTH);
        if d[0].hypot(d[1]) > diagonal {
            return false;
        }
        let half = Cuboid::new(Vector::new((LENGTH / 2.0) as f32, (WIDTH / 2.0) as f32));
        let pa = Pose::new(Vector::ZERO, a.state.heading as f32);
        let pb = Pose::new(
            Vector::new(d[0] as f32, d[1] as f32),
            b.state.heading as f32,
        );
        intersection_test(&pa, &half, &pb, &half).is_ok_and(|r| r.intersecting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::road::MergeLayout;

    fn road() -> Road {
        Road::new(&MergeLayout::default().specs()).unwrap()
    }

    fn car(road: &Road, x: f64, y: f64, speed: f64) -> Vehicle {
        Vehicle::new(
            road,
            VehicleState {
                x,
                y,
                heading: 0.0,
                speed,
            },
            speed,
            Driver::Idm,
        )
    }

    /// highway-env's right of way on the intersection: a minor-road car and a priority-road
    /// car heading for the same spot of the junction at the same time conflict, the minor one
    /// yields (target speed 0) and the other does not; they then cross without colliding, the
    /// minor one after the other. Far apart in time, neither yields.
    #[test]
    fn the_minor_road_yields_to_the_priority_road_and_nobody_collides() {
        use crate::road::{IntersectionLayout, Turn};
        let road = Road::new(&IntersectionLayout::default().specs()).unwrap();
        let on_route = |from: usize, turn: Turn, before: f64, speed: f64| {
            let route = IntersectionLayout::route(&road, from, turn);
            let s = road.lanes[route[0]].length() - before;
            let (p, heading) = road.along_route(&route, s);
            let state = VehicleState {
                x: p[0],
                y: p[1],
                heading,
                speed,
            };
            let mut v = Vehicle::new(&road, state, speed, Driver::Idm);
            v.lane = route[0];
            v.target_lane = route[0];
            v.route = route;
            v
        };
        // South (minor) going straight north, east (major) going straight west: both reach
        // the crossing at x = 2, y = -2 (the east car's lane) after about 14 m at 10 m/s.
        let mut traffic = Traffic {
            vehicles: vec![
                on_route(3, Turn::Straight, 2.0, 10.0),
                on_route(0, Turn::Straight, 0.0, 10.0),
            ],
        };
        assert!(traffic.conflict_possible(&road, 0, 1));
        assert_eq!(traffic.yielding_of(&road, 0, 1), 0);
        traffic.regulate(&road);
        assert!(traffic.vehicles[0].yielding && traffic.vehicles[0].target_speed == 0.0);
        assert!(!traffic.vehicles[1].yielding);
        let dt = 1.0 / 15.0;
        let mut crossed_after = None;
        for step in 1..=300 {
            if step % 7 == 0 {
                traffic.regulate(&road);
            }
            let actions: Vec<[f64; 2]> = (0..2).map(|i| traffic.idm_action(&road, i)).collect();
            assert!(
                traffic.step(&road, &actions, dt).is_empty(),
                "collision at step {step}"
            );
            // The minor car is past the crossing once its y is below the east car's lane.
            if crossed_after.is_none() && traffic.vehicles[0].state.y < -4.0 {
                crossed_after = Some(traffic.vehicles[1].state.x);
            }
        }
        let east_x = crossed_after.expect("the minor car never crossed");
        assert!(
            east_x < 0.0,
            "the minor car crossed before the other (its x {east_x})"
        );
        assert!(
            traffic.vehicles[0].state.y < -30.0,
            "{:?}",
            traffic.vehicles[0].state
        );

        let far = Traffic {
            vehicles: vec![
                on_route(3, Turn::Straight, 2.0, 10.0),
                on_route(0, Turn::Straight, 80.0, 10.0),
            ],
        };
        assert!(!far.conflict_possible(&road, 0, 1));
    }

    #[test]
    fn neighbours_on_the_lane_and_the_barrier_of_a_merge_lane() {
        let road = road();
        let t = Traffic {
            vehicles: vec![
                car(&road, 50.0, 0.0, 25.0),
                car(&road, 80.0, 0.0, 25.0),
                car(&road, 20.0, 0.0, 25.0),
                car(&road, 60.0, 4.0, 25.0),
                car(&road, 250.0, 8.0, 20.0),
            ],
        };
        assert_eq!(
            t.neighbours(&road, 0, 0),
            (Some(Neighbour::Vehicle(1)), Some(Neighbour::Vehicle(2)))
        );
        assert_eq!(
            t.neighbours(&road, 0, 1),
            (Some(Neighbour::Vehicle(3)), None)
        );
        let merge = road.lane_named("merge").unwrap();
        assert_eq!(t.vehicles[4].lane, merge);
        assert_eq!(
            t.neighbours(&road, 4, merge).0,
            Some(Neighbour::Barrier(80.0))
        );
    }

    #[test]
    fn a_vehicle_on_the_merge_lane_changes_into_a_free_main_lane_and_brakes_for_the_barrier() {
        let road = road();
        let mut t = Traffic {
            vehicles: vec![car(&road, 240.0, 8.0, 20.0)],
        };
        t.vehicles[0].timer = 2.0;
        let main = road.lane_named("main-1").unwrap();
        let a = t.idm_action(&road, 0);
        assert_eq!(t.vehicles[0].target_lane, main);
        // Towards the main lane (smaller y): steer left of the heading.
        assert!(a[0] < 0.0, "{a:?}");
        // Alone at the barrier, with a car blocking the main lane alongside: it stays and brakes.
        let mut t = Traffic {
            vehicles: vec![car(&road, 300.0, 8.0, 20.0), car(&road, 300.0, 4.0, 20.0)],
        };
        t.vehicles[0].timer = 2.0;
        let a = t.idm_action(&road, 0);
        assert_eq!(t.vehicles[0].target_lane, t.vehicles[0].lane);
        assert!(a[1] < -5.0, "{a:?}");
    }

    #[test]
    fn lane_keeping_converges_and_collisions_stop_both_vehicles() {
        let road = road();
        let mut t = Traffic {
            vehicles: vec![car(&road, 10.0, 1.0, 25.0)],
        };
        for _ in 0..150 {
            let a = t.idm_action(&road, 0);
            t.step(&road, &[a], 1.0 / 15.0);
        }
        let v = &t.vehicles[0];
        assert!(
            v.state.y.abs() < 0.05 && v.state.heading.abs() < 0.01,
            "{v:?}"
        );
        let mut t = Traffic {
            vehicles: vec![car(&road, 10.0, 0.0, 25.0), car(&road, 15.5, 0.0, 10.0)],
        };
        assert!(!t.colliding(0, 1));
        t.step(&road, &[[0.0, 0.0], [0.0, 0.0]], 0.1);
        assert!(t.colliding(0, 1));
        assert!(
            t.vehicles
                .iter()
                .all(|v| v.crashed && v.state.speed == 10.0)
        );
    }

    #[test]
    fn a_reaction_delay_applies_each_command_that_many_steps_later() {
        let road = road();
        let mut t = Traffic {
            vehicles: vec![car(&road, 10.0, 0.0, 25.0), car(&road, 50.0, 0.0, 25.0)],
        };
        t.vehicles[1].reaction_delay = 3;
        let commands = [1.0, -2.0, 0.5, 3.0, -1.0];
        let applied: Vec<f64> = commands.iter().map(|&a| t.react(1, a)).collect();
        assert_eq!(applied, [0.0, 0.0, 0.0, 1.0, -2.0]);
        // Without a delay the command applies at once.
        assert_eq!(t.react(0, 1.5), 1.5);
        assert!(t.vehicles[0].pending.is_empty());
    }
}
