//! A Markovian pushing expert: its action is a function of the observed state alone.
//!
//! The MPPI expert ([`crate::expert`]) plans well but its target depends on a warm-started
//! plan, a noise stream and a stall mode that the observation does not hold, so a policy that
//! imitates it sees a wide, time-correlated action distribution for each state (docs/policy.md).
//! This expert keeps no memory: every step it
//! 1. predicts, for each candidate contact on the T's outline (points on each face that the
//!    agent's disk can touch), what a push there along the face's inward normal does to the
//!    block: every contact is frictionless, so the force is along the normal, and the block
//!    moves quasi-statically (it stops when the push stops). The push is integrated in small
//!    increments; the best reduction of the mean keypoint error along it, per step spent
//!    reaching the contact and pushing, scores the contact;
//! 2. pushes at the best contact when the agent is already lined up with it (as deep as the
//!    predicted useful push length, so it slows down where the push stops helping), or else
//!    moves towards the point just outside it, going around the block when the straight way
//!    is blocked.
//!
//! A push increment follows from the impulse that keeps a frictionless contact closed: a unit
//! impulse along the pushing direction u at lever arm r (from the centre of gravity) gives the
//! block velocity u / m and angular velocity (r x u) / I, and moves the contact point along u by
//! kappa = 1 / m + (r x u)^2 / I, so per pixel of the agent's advance the block's twist is
//! (u / m, (r x u) / I) / kappa.

use serde::{Deserialize, Serialize};

use diffrl_core::config::{Invalid, Validate, ensure};

use crate::expert::keypoint_error;
use crate::geometry::{self, BOUNDING_RADIUS, COG, Pose};
use crate::physics::AGENT_RADIUS;

/// Settings of the pushing expert (`[expert]` with `kind = "pusher"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PusherConfig {
    /// Spacing (px) of candidate contact points along each face.
    pub contact_spacing: f64,
    /// Push depth (px: how far inside the face the target lies) = the predicted useful push
    /// length, clamped to [push_min, push_max].
    pub push_min: f64,
    /// Largest push depth (px).
    pub push_max: f64,
    /// Increment (px) of the simulated push.
    pub push_increment: f64,
    /// Longest simulated push (px).
    pub push_length: f64,
    /// Pixels the agent advances per step while pushing (converts push lengths to steps).
    pub push_speed: f64,
    /// Gap (px) between the disk and the face at the approach point.
    pub approach_gap: f64,
    /// Clearance (px) kept from the T while moving around it.
    pub clearance: f64,
    /// Largest distance (px) between the agent and its target while moving.
    pub move_step: f64,
    /// Distance (px) the agent covers per step while travelling (converts paths to steps).
    pub travel_speed: f64,
    /// Lateral tolerance (px) for "lined up with the contact".
    pub line_up_tolerance: f64,
}

impl Default for PusherConfig {
    fn default() -> Self {
        Self {
            contact_spacing: 5.0,
            push_min: 2.0,
            push_max: 25.0,
            push_increment: 4.0,
            push_length: 80.0,
            push_speed: 10.0,
            approach_gap: 8.0,
            clearance: 6.0,
            move_step: 40.0,
            travel_speed: 20.0,
            line_up_tolerance: 4.0,
        }
    }
}

impl Validate for PusherConfig {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            self.contact_spacing > 0.5,
            "contact_spacing",
            "must be > 0.5",
        )?;
        ensure(
            self.push_min > 0.0 && self.push_min <= self.push_max,
            "push_min",
            "must be > 0 and <= push_max",
        )?;
        ensure(self.move_step > 0.0, "move_step", "must be > 0")?;
        ensure(self.travel_speed > 0.0, "travel_speed", "must be > 0")?;
        ensure(self.push_speed > 0.0, "push_speed", "must be > 0")?;
        ensure(
            self.push_increment > 0.1 && self.push_increment <= self.push_length,
            "push_increment",
            "must be > 0.1 and <= push_length",
        )
    }
}

/// A face of the T in the block frame: the segment the disk's contact point may slide along
/// and the face's outward normal.
struct Face {
    from: [f64; 2],
    to: [f64; 2],
    normal: [f64; 2],
}

/// The faces of the T, trimmed where the disk would hit the neighbouring face first (it cannot
/// reach within one radius of the two inner corners at (+-15, 30)).
const FACES: [Face; 8] = {
    let r = AGENT_RADIUS;
    [
        Face {
            from: [-60.0, 0.0],
            to: [60.0, 0.0],
            normal: [0.0, -1.0],
        },
        Face {
            from: [60.0, 0.0],
            to: [60.0, 30.0],
            normal: [1.0, 0.0],
        },
        Face {
            from: [15.0 + r, 30.0],
            to: [60.0, 30.0],
            normal: [0.0, 1.0],
        },
        Face {
            from: [15.0, 30.0 + r],
            to: [15.0, 120.0],
            normal: [1.0, 0.0],
        },
        Face {
            from: [-15.0, 120.0],
            to: [15.0, 120.0],
            normal: [0.0, 1.0],
        },
        Face {
            from: [-15.0, 30.0 + r],
            to: [-15.0, 120.0],
            normal: [-1.0, 0.0],
        },
        Face {
            from: [-60.0, 30.0],
            to: [-15.0 - r, 30.0],
            normal: [0.0, 1.0],
        },
        Face {
            from: [-60.0, 0.0],
            to: [-60.0, 30.0],
            normal: [-1.0, 0.0],
        },
    ]
};

/// Block mass and moment of inertia the expert assumes (gym-pusht's).
const MASS: f64 = 1.0;
const INERTIA: f64 = 3000.0;
/// Where the agent's centre can go: the walls' inner faces (7 and 504 px) less its radius.
const ARENA: [f64; 2] = [7.0 + AGENT_RADIUS, 504.0 - AGENT_RADIUS];

/// A candidate contact in the world frame.
#[derive(Debug, Clone, Copy)]
struct Contact {
    /// Contact point on the T.
    point: [f64; 2],
    /// Outward normal of the face.
    normal: [f64; 2],
    /// Largest reduction of the mean keypoint error along the simulated push (px).
    gain: f64,
    /// Push length (px) at which that reduction is reached.
    length: f64,
}

/// The stateless pushing expert.
#[derive(Debug, Clone, Default)]
pub struct Pusher {
    config: PusherConfig,
}

impl Pusher {
    /// An expert with `config`.
    pub fn new(config: PusherConfig) -> Self {
        Self { config }
    }

    /// The target for an agent at `agent` and a block at `block` (a function of these alone).
    pub fn act(&self, agent: [f64; 2], block: &Pose) -> [f32; 2] {
        let cfg = &self.config;
        let cog = block.apply(COG);
        let mut best: Option<(f64, Contact)> = None;
        for c in self.contacts(block) {
            if c.gain <= 0.0 {
                continue;
            }
            let travel = if self.lined_up(agent, &c) {
                0.0
            } else {
                let approach = self.approach_point(&c);
                self.path_length(agent, approach, block, cog) / cfg.travel_speed
            };
            let score = c.gain / (1.0 + travel + c.length / cfg.push_speed);
            if best.is_none_or(|(s, _)| score > s) {
                best = Some((score, c));
            }
        }
        // No push helps only at the goal itself; hold still there.
        let Some((_, c)) = best else {
            return to_f32(agent);
        };
        let target = if self.lined_up(agent, &c) {
            // Into the face, sliding sideways onto the contact point.
            let depth = c.length.clamp(cfg.push_min, cfg.push_max);
            add(c.point, scale(c.normal, AGENT_RADIUS - depth))
        } else {
            let approach = self.approach_point(&c);
            if self.segment_clear(agent, approach, block) {
                approach
            } else {
                self.around(agent, approach, block, cog)
            }
        };
        to_f32(limit_step(agent, target, cfg.move_step))
    }

    /// Candidate contacts with their predicted pushes.
    fn contacts(&self, block: &Pose) -> Vec<Contact> {
        let cfg = &self.config;
        let start = keypoint_error(block);
        let mut out = Vec::new();
        for face in &FACES {
            let len = norm(sub(face.to, face.from));
            let n = (len / cfg.contact_spacing).ceil().max(1.0) as usize;
            let normal = rotate(face.normal, block.angle);
            for i in 0..=n {
                let local = add(
                    face.from,
                    scale(sub(face.to, face.from), i as f64 / n as f64),
                );
                let point = block.apply(local);
                if !in_arena(add(point, scale(normal, AGENT_RADIUS))) {
                    continue;
                }
                let (gain, length) = self.simulate_push(block, local, face.normal, start);
                out.push(Contact {
                    point,
                    normal,
                    gain,
                    length,
                });
            }
        }
        out
    }

    /// Pushes the block at `local` (block frame) along the face's inward normal in increments
    /// of `push_increment` up to `push_length`; returns the largest reduction of the keypoint
    /// error from `start` and the push length that reaches it.
    fn simulate_push(
        &self,
        block: &Pose,
        local: [f64; 2],
        normal: [f64; 2],
        start: f64,
    ) -> (f64, f64) {
        let cfg = &self.config;
        let steps = (cfg.push_length / cfg.push_increment).round() as usize;
        let r_local = sub(local, COG);
        let mut pose = *block;
        let (mut gain, mut length) = (0.0, 0.0);
        for i in 1..=steps {
            let u = rotate(scale(normal, -1.0), pose.angle);
            let r = rotate(r_local, pose.angle);
            let torque = cross(r, u);
            let kappa = 1.0 / MASS + torque * torque / INERTIA;
            let v = scale(u, cfg.push_increment / (MASS * kappa));
            let w = torque * cfg.push_increment / (INERTIA * kappa);
            // Move the centre of gravity by v and turn about it by w.
            let cog = add(pose.apply(COG), v);
            let angle = pose.angle + w;
            let offset = rotate(COG, angle);
            pose = Pose::new(cog[0] - offset[0], cog[1] - offset[1], angle);
            let g = start - keypoint_error(&pose);
            if g > gain {
                gain = g;
                length = i as f64 * cfg.push_increment;
            }
        }
        (gain, length)
    }

    /// Whether the agent sits on the contact's normal line, outside the face and close to it.
    fn lined_up(&self, agent: [f64; 2], c: &Contact) -> bool {
        let touch = add(c.point, scale(c.normal, AGENT_RADIUS));
        let along = dot(sub(agent, c.point), c.normal);
        lateral_offset(agent, touch, c.normal) <= self.config.line_up_tolerance
            && along >= AGENT_RADIUS - 4.0
            && along <= AGENT_RADIUS + self.config.approach_gap + 12.0
    }

    /// The point on the contact's normal line `approach_gap` px outside touching.
    fn approach_point(&self, c: &Contact) -> [f64; 2] {
        add(
            c.point,
            scale(c.normal, AGENT_RADIUS + self.config.approach_gap),
        )
    }

    /// Whether the disk can move straight from `a` to `b` without touching the block: every
    /// point keeps `clearance` from the T, or, near the start (an agent that is touching the
    /// block), at least moves away from it.
    fn segment_clear(&self, a: [f64; 2], b: [f64; 2], block: &Pose) -> bool {
        let len = norm(sub(b, a));
        let n = (len / 3.0).ceil().max(1.0) as usize;
        let gap = AGENT_RADIUS + self.config.clearance.min(self.config.approach_gap) - 1.0;
        let start = geometry::distance_to_t(block, a);
        (1..=n).all(|i| {
            let f = i as f64 / n as f64;
            let p = add(a, scale(sub(b, a), f));
            geometry::distance_to_t(block, p) >= gap.min(start + 0.5 * f * len)
        })
    }

    /// Radius of the circle around the centre of gravity used to go around the block.
    fn orbit_radius(&self) -> f64 {
        BOUNDING_RADIUS + AGENT_RADIUS + self.config.clearance
    }

    /// Length of the way from `a` to `b`: straight when clear, else out to the orbit, along it
    /// (the shorter way unless a wall blocks it) and in again; infinite when walls block both.
    fn path_length(&self, a: [f64; 2], b: [f64; 2], block: &Pose, cog: [f64; 2]) -> f64 {
        if self.segment_clear(a, b, block) {
            return norm(sub(b, a));
        }
        let r = self.orbit_radius();
        match self.orbit_turn(a, b, block, cog) {
            Some(turn) => {
                (r - norm(sub(a, cog))).abs() + r * turn.abs() + (r - norm(sub(b, cog))).abs()
            }
            None => f64::INFINITY,
        }
    }

    /// The signed angle to travel on the orbit from `a`'s bearing to `b`'s: the shorter way
    /// unless a wall pushes part of that arc against the T, then the longer; `None` when both
    /// are blocked.
    fn orbit_turn(&self, a: [f64; 2], b: [f64; 2], block: &Pose, cog: [f64; 2]) -> Option<f64> {
        let da = sub(a, cog);
        let phi = da[1].atan2(da[0]);
        let short = angle_between(da, sub(b, cog));
        let long = short - 2.0 * std::f64::consts::PI * short.signum();
        [short, long].into_iter().find(|&turn| {
            let n = (turn.abs() / 0.1).ceil().max(1.0) as usize;
            (1..n).all(|i| {
                let p = self.on_orbit(cog, phi + turn * i as f64 / n as f64);
                geometry::distance_to_t(block, p) >= AGENT_RADIUS + 1.0
            })
        })
    }

    /// The orbit's point at bearing `phi`, pulled inside the arena.
    fn on_orbit(&self, cog: [f64; 2], phi: f64) -> [f64; 2] {
        let r = self.orbit_radius();
        let p = add(cog, [r * phi.cos(), r * phi.sin()]);
        [
            p[0].clamp(ARENA[0], ARENA[1]),
            p[1].clamp(ARENA[0], ARENA[1]),
        ]
    }

    /// A waypoint on the orbit, ahead of `a` on the way towards `b`; straight out first when
    /// the way to it is not clear.
    fn around(&self, a: [f64; 2], b: [f64; 2], block: &Pose, cog: [f64; 2]) -> [f64; 2] {
        let r = self.orbit_radius();
        let da = sub(a, cog);
        let phi = da[1].atan2(da[0]);
        let turn = self
            .orbit_turn(a, b, block, cog)
            .unwrap_or_else(|| angle_between(da, sub(b, cog)));
        let step = (self.config.move_step / r).min(turn.abs()) * turn.signum();
        let ahead = self.on_orbit(cog, phi + step);
        // The orbit clears the T by construction; from inside it, go out first if need be.
        if norm(da) >= r - 3.0 || self.segment_clear(a, ahead, block) {
            ahead
        } else {
            self.on_orbit(cog, phi)
        }
    }
}

fn rotate(v: [f64; 2], angle: f64) -> [f64; 2] {
    let (s, c) = angle.sin_cos();
    [c * v[0] - s * v[1], s * v[0] + c * v[1]]
}
fn add(a: [f64; 2], b: [f64; 2]) -> [f64; 2] {
    [a[0] + b[0], a[1] + b[1]]
}
fn sub(a: [f64; 2], b: [f64; 2]) -> [f64; 2] {
    [a[0] - b[0], a[1] - b[1]]
}
fn scale(a: [f64; 2], k: f64) -> [f64; 2] {
    [a[0] * k, a[1] * k]
}
fn dot(a: [f64; 2], b: [f64; 2]) -> f64 {
    a[0] * b[0] + a[1] * b[1]
}
fn cross(a: [f64; 2], b: [f64; 2]) -> f64 {
    a[0] * b[1] - a[1] * b[0]
}
fn norm(a: [f64; 2]) -> f64 {
    a[0].hypot(a[1])
}
/// Signed angle from `a` to `b` in (-pi, pi].
fn angle_between(a: [f64; 2], b: [f64; 2]) -> f64 {
    cross(a, b).atan2(dot(a, b))
}
fn lateral_offset(p: [f64; 2], on_line: [f64; 2], normal: [f64; 2]) -> f64 {
    cross(sub(p, on_line), normal).abs()
}
fn in_arena(p: [f64; 2]) -> bool {
    p.iter().all(|v| (ARENA[0]..=ARENA[1]).contains(v))
}
fn limit_step(from: [f64; 2], to: [f64; 2], max: f64) -> [f64; 2] {
    let d = sub(to, from);
    let len = norm(d);
    let p = if len > max {
        add(from, scale(d, max / len))
    } else {
        to
    };
    [p[0].clamp(0.0, 512.0), p[1].clamp(0.0, 512.0)]
}
fn to_f32(p: [f64; 2]) -> [f32; 2] {
    [p[0] as f32, p[1] as f32]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PushT;
    use crate::geometry::GOAL;
    use diffrl_core::Env;

    /// Runs the pusher from `seed`; returns (success, steps).
    fn episode(seed: u64) -> (bool, usize) {
        let mut env = PushT::builder().build();
        env.reset(seed);
        let pusher = Pusher::default();
        for t in 1..=env.max_episode_steps() {
            let a = pusher.act(env.agent_pos(), &env.block_pose());
            assert!(a.iter().all(|v| (0.0..=512.0).contains(v)), "{a:?}");
            let r = env.step(&a).unwrap();
            if r.info.success {
                return (true, t);
            }
            if r.terminated || r.truncated {
                return (false, t);
            }
        }
        (false, env.max_episode_steps())
    }

    #[test]
    fn solves_seeded_episodes() {
        // 487 of seeds 0..500 succeed (docs/pusht.md); these ten all do.
        let solved = (0..10).filter(|&s| episode(s).0).count();
        assert!(solved >= 9, "{solved}/10");
    }

    #[test]
    fn action_is_a_function_of_the_state() {
        let pusher = Pusher::default();
        let block = Pose::new(300.0, 200.0, 1.0);
        let a = pusher.act([100.0, 100.0], &block);
        assert_eq!(a, Pusher::default().act([100.0, 100.0], &block));
        // A full turn of the angle is the same state.
        let turned = Pose::new(300.0, 200.0, 1.0 + 2.0 * std::f64::consts::PI);
        let b = pusher.act([100.0, 100.0], &turned);
        assert!((a[0] - b[0]).abs() < 1e-3 && (a[1] - b[1]).abs() < 1e-3);
    }

    #[test]
    fn lined_up_agent_pushes_into_the_face() {
        // The goal T shifted 40 px against its own +y axis, the agent just outside the bar's
        // bottom midpoint: the target lies inside the bar, straight ahead.
        let (s, c) = GOAL.angle.sin_cos();
        let block = Pose::new(GOAL.x + 40.0 * s, GOAL.y - 40.0 * c, GOAL.angle);
        let inward = [-s, c];
        let face = block.apply([0.0, 0.0]);
        let agent = add(face, scale(inward, -(AGENT_RADIUS + 3.0)));
        let a = pusher_target(agent, &block);
        let depth = dot(sub(a, face), inward);
        assert!(depth > 1.0, "target {a:?} is {depth} px inside the face");
        assert!(lateral_offset(a, face, inward) < 1.0, "{a:?}");
    }

    fn pusher_target(agent: [f64; 2], block: &Pose) -> [f64; 2] {
        Pusher::default().act(agent, block).map(f64::from)
    }

    #[test]
    fn simulated_push_through_the_centre_of_gravity_translates_onto_the_goal() {
        // The goal T shifted 40 px against its own +y axis; the bar's bottom midpoint lies
        // straight below the centre of gravity, so pushing it is a pure translation that
        // removes the whole error after 40 px.
        let (s, c) = GOAL.angle.sin_cos();
        let block = Pose::new(GOAL.x + 40.0 * s, GOAL.y - 40.0 * c, GOAL.angle);
        let start = keypoint_error(&block);
        assert!((start - 40.0).abs() < 1e-9, "{start}");
        let (gain, length) =
            Pusher::default().simulate_push(&block, [0.0, 0.0], [0.0, -1.0], start);
        assert!((gain - 40.0).abs() < 1e-6, "{gain}");
        assert_eq!(length, 40.0);
    }
}
