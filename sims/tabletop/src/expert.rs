//! Scripted experts: IK-based motion primitives (approach above, descend, close, lift, move to
//! the goal, place, release) whose phase is read from the state alone, so the action is a
//! function of the observed state ([`expert_action`]) and a Markovian policy can imitate it.
//!
//! Phases are decided by geometric tests on the state: "holding" means the cube sits between
//! the fingers (TCP within 1.5 cm of its centre in xy, 2 cm in z) with the gripper closed onto
//! it (opening below 7 cm and fingers no longer moving); a missed grasp (fingers closed on
//! nothing) falls back to approaching with the gripper open.

use diffrl_core::seeding::{self, Rng};
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};

use diffrl_core::config::{Invalid, Validate, ensure};

use crate::env::{ACTION_SCALE, GRIPPER_CLOSED, GRIPPER_OPEN, Tabletop, TaskKind, layout};
use crate::world::CUBE_HALF;

/// `[expert]` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExpertConfig {
    /// Standard deviation of Gaussian noise added to the motion components of every action
    /// (DART-style noise injection; 0 = the clean expert).
    pub action_noise: f64,
    /// Fraction of the remaining TCP error commanded per step (1 = all of it, up to the
    /// action scale).
    pub gain: f64,
}

impl Default for ExpertConfig {
    fn default() -> Self {
        Self {
            action_noise: 0.0,
            gain: 0.5,
        }
    }
}

impl Validate for ExpertConfig {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            self.action_noise.is_finite() && (0.0..=1.0).contains(&self.action_noise),
            "action_noise",
            format!("must be in [0, 1], got {}", self.action_noise),
        )?;
        ensure(
            self.gain.is_finite() && self.gain > 0.0 && self.gain <= 1.0,
            "gain",
            format!("must be in (0, 1], got {}", self.gain),
        )
    }
}

/// Height of the approach point above a cube's centre (m): fingertips clear its top.
pub(crate) const HOVER: f64 = 0.07;
/// Lateral tolerance for descending onto a cube (m).
pub(crate) const ALIGN_XY: f64 = 0.008;
/// TCP height above the cube's centre at which the gripper closes (m): the finger pads then
/// span the cube's centre, so it does not pivot in the grasp.
pub(crate) const GRASP_DZ: f64 = -0.005;
/// Largest motion command while carrying a cube (a fraction of the action scale).
pub(crate) const CARRY_SPEED: f64 = 0.8;
/// Gripper opening below which a closed gripper holds a cube (m; a cube is 4 to 5.7 cm wide
/// across the fingers, the open gripper 8 cm).
pub(crate) const HOLD_OPENING: f64 = 0.07;
/// Gripper action that lets go of a placed cube.
pub(crate) const RELEASE: f64 = 1.0;
/// TCP height while pushing (m): the fingertips 8 mm above the table, below the cube's
/// centre so a friction-1 cube slides rather than tips.
const PUSH_Z: f64 = 0.015;
/// TCP advance per step while pushing (m; slower than the 2.5 cm maximum, which kicks the
/// cube).
const PUSH_SPEED: f64 = 0.015;
/// Clearance kept above cube B while carrying cube A to it (m).
pub(crate) const CARRY_CLEARANCE: f64 = 0.02;

/// Named reads of a flat state ([`TaskKind::state_names`]'s layout up to the cubes).
pub(crate) struct View<'a> {
    pub(crate) s: &'a [f64],
}

impl View<'_> {
    pub(crate) fn tcp(&self) -> [f64; 3] {
        let o = layout::TCP;
        [self.s[o], self.s[o + 1], self.s[o + 2]]
    }
    pub(crate) fn opening(&self) -> f64 {
        self.s[layout::GRIPPER]
    }
    pub(crate) fn finger_speed(&self) -> f64 {
        self.s[layout::QD + 7].abs() + self.s[layout::QD + 8].abs()
    }
    pub(crate) fn arm_speed(&self) -> f64 {
        self.s[layout::QD..layout::QD + 7]
            .iter()
            .fold(0.0, |m, v| m.max(v.abs()))
    }
    /// Width of cube `i` along the fingers' closing axis (world y), from its yaw.
    pub(crate) fn cube_width(&self, i: usize) -> f64 {
        let o = layout::CUBES + 7 * i + 3;
        let [x, y, z, w] = [self.s[o], self.s[o + 1], self.s[o + 2], self.s[o + 3]];
        let yaw = (2.0 * (w * z + x * y)).atan2(1.0 - 2.0 * (y * y + z * z));
        2.0 * CUBE_HALF * (yaw.sin().abs() + yaw.cos().abs())
    }
    pub(crate) fn cube(&self, i: usize) -> [f64; 3] {
        let o = layout::CUBES + 7 * i;
        [self.s[o], self.s[o + 1], self.s[o + 2]]
    }
    fn goal(&self) -> [f64; 3] {
        let o = self.s.len() - 3;
        [self.s[o], self.s[o + 1], self.s[o + 2]]
    }
    /// The cube sits between the closed fingers.
    pub(crate) fn holding(&self, cube: [f64; 3]) -> bool {
        let t = self.tcp();
        (t[0] - cube[0]).hypot(t[1] - cube[1]) < 0.015
            && (t[2] - cube[2]).abs() < 0.02
            && self.opening() < HOLD_OPENING
            && self.opening() > 0.03
            && self.finger_speed() < 0.02
    }
}

pub(crate) fn xy_dist(a: [f64; 3], b: [f64; 3]) -> f64 {
    (a[0] - b[0]).hypot(a[1] - b[1])
}

/// Motion towards `target` for the TCP at `tcp`: `gain` of the error per step, in action units.
pub(crate) fn toward(tcp: [f64; 3], target: [f64; 3], gain: f64) -> [f64; 3] {
    toward_capped(tcp, target, gain, 1.0)
}

/// [`toward`] with each component capped at `cap`.
pub(crate) fn toward_capped(tcp: [f64; 3], target: [f64; 3], gain: f64, cap: f64) -> [f64; 3] {
    [0, 1, 2].map(|i| (gain * (target[i] - tcp[i]) / ACTION_SCALE).clamp(-cap, cap))
}

pub(crate) const OPEN: f64 = 1.0;
pub(crate) const CLOSE: f64 = -1.0;

/// The gripper action that opens the fingers to `opening` (m).
fn gripper_for(opening: f64) -> f64 {
    ((opening / 2.0 - GRIPPER_CLOSED) / (GRIPPER_OPEN - GRIPPER_CLOSED) * 2.0 - 1.0)
        .clamp(-1.0, 1.0)
}

/// Approach, descend onto and close on cube `index`; None once it is held. The fingers open
/// only 1 cm wider than the cube, to fit between it and a neighbour where they can.
pub(crate) fn grasp(v: &View, index: usize, gain: f64) -> Option<([f64; 3], f64)> {
    let cube = v.cube(index);
    if v.holding(cube) {
        return None;
    }
    let width = v.cube_width(index);
    let open = gripper_for(width + 0.010);
    let tcp = v.tcp();
    let grasp_point = [cube[0], cube[1], cube[2] + GRASP_DZ];
    let hover = [cube[0], cube[1], cube[2] + HOVER];
    let xy = xy_dist(tcp, cube);
    let near = xy < ALIGN_XY && (tcp[2] - grasp_point[2]).abs() < 0.008;
    // Closing: at the grasp point with the fingers still open enough to close on the cube.
    if near && v.opening() > 0.03 {
        return Some(([0.0; 3], CLOSE));
    }
    if xy < ALIGN_XY || (xy < 0.02 && tcp[2] < cube[2] + HOVER - 0.01) {
        // Above the cube: descend (keeping xy aligned) with the gripper open.
        let open_enough = v.opening() > 0.065;
        let target = if open_enough {
            grasp_point
        } else {
            [cube[0], cube[1], tcp[2]]
        };
        return Some((toward(tcp, target, gain), OPEN));
    }
    // Far: fly to the hover point, rising first when low so the fingers clear the cube.
    let mut target = hover;
    if tcp[2] < cube[2] + HOVER - 0.02 && xy < 0.06 {
        target = [tcp[0], tcp[1], hover[2]];
    }
    Some((toward(tcp, target, gain), open))
}

/// The expert's action `[dx, dy, dz, gripper]` at the (noise-free) state `s` of a `kind` task.
pub fn expert_action(kind: TaskKind, s: &[f64], gain: f64) -> [f32; 4] {
    if s.len() != kind.state_dim() {
        return [0.0, 0.0, 0.0, 1.0];
    }
    let v = View { s };
    let tcp = v.tcp();
    let (motion, gripper) = match kind {
        TaskKind::ReachGoal => (toward(tcp, v.goal(), gain), OPEN),
        TaskKind::PushCube => push(&v, gain),
        TaskKind::PickCube => {
            let cube = v.cube(0);
            match grasp(&v, 0, gain) {
                Some(a) => a,
                None => {
                    // Carry: move the cube's centre to the goal.
                    let goal = v.goal();
                    let target = [0, 1, 2].map(|i| tcp[i] + goal[i] - cube[i]);
                    (toward_capped(tcp, target, gain, CARRY_SPEED), CLOSE)
                }
            }
        }
        TaskKind::StackCube => stack(&v, gain),
    };
    [
        motion[0] as f32,
        motion[1] as f32,
        motion[2] as f32,
        gripper as f32,
    ]
}

fn push(v: &View, gain: f64) -> ([f64; 3], f64) {
    let tcp = v.tcp();
    let cube = v.cube(0);
    let goal = v.goal();
    // Push along +x (the goal lies 0.2 m ahead along x) from behind the cube with the closed
    // fingers (1 cm thick along x), steering the TCP's y onto the cube's.
    let behind_x = cube[0] - CUBE_HALF - 0.025;
    let aligned = (tcp[1] - cube[1]).abs() < 0.01;
    let behind = tcp[0] < cube[0] - CUBE_HALF - 0.007;
    if behind && (tcp[1] - cube[1]).abs() < 0.02 && tcp[2] < PUSH_Z + 0.012 {
        let dy = (goal[1] - cube[1]) * 2.0;
        let target = [tcp[0] + PUSH_SPEED, cube[1] + dy.clamp(-0.01, 0.01), PUSH_Z];
        return (toward(tcp, target, 1.0), CLOSE);
    }
    if tcp[0] < cube[0] - CUBE_HALF - 0.015 && aligned {
        return (toward(tcp, [behind_x, cube[1], PUSH_Z], gain), CLOSE);
    }
    // Get behind the cube at a height that clears it, rising first when low near it.
    let hover_z = cube[2] + HOVER;
    let near = (tcp[0] - cube[0]).abs() < 0.06 && (tcp[1] - cube[1]).abs() < 0.06;
    let target = if tcp[2] < hover_z - 0.02 && near {
        [tcp[0], tcp[1], hover_z]
    } else {
        [behind_x, cube[1], hover_z]
    };
    (toward(tcp, target, gain), CLOSE)
}

fn stack(v: &View, gain: f64) -> ([f64; 3], f64) {
    stack_on(v, 0, 1, gain)
}

/// Grasps cube `a_index`, carries it above cube `b_index`, lowers it onto B and lets go.
pub(crate) fn stack_on(v: &View, a_index: usize, b_index: usize, gain: f64) -> ([f64; 3], f64) {
    let a = v.cube(a_index);
    let b = v.cube(b_index);
    // The task's own test: xy within the half-size's xy norm + 5 mm, z within 5 mm.
    let on_b = xy_dist(a, b) <= (2.0 * CUBE_HALF * CUBE_HALF).sqrt() + 0.005
        && (a[2] - b[2] - 2.0 * CUBE_HALF).abs() <= 0.005;
    // Released 4 mm above B's top, carried with A's bottom clearing B's top.
    let place = [b[0], b[1], b[2] + 2.0 * CUBE_HALF + 0.004];
    let carry_z = b[2] + 4.0 * CUBE_HALF + CARRY_CLEARANCE;
    place_at(v, a_index, place, carry_z, on_b, gain)
}

/// Grasps cube `a_index`, carries it at height `carry_z` (its centre) above `place`, lowers
/// it to `place` (slowly at the end) and lets go once it is centred and the arm still; once
/// `placed` (the caller's test of the released cube), backs off upwards.
pub(crate) fn place_at(
    v: &View,
    a_index: usize,
    place: [f64; 3],
    carry_z: f64,
    placed: bool,
    gain: f64,
) -> ([f64; 3], f64) {
    let tcp = v.tcp();
    let a = v.cube(a_index);
    if v.holding(a) {
        let xy = xy_dist(a, place);
        if xy < 0.006 && a[2] - place[2] < 0.004 && v.arm_speed() < 0.05 {
            return ([0.0; 3], RELEASE);
        }
        let (cube_target, g) = if xy > 0.01 {
            if a[2] < carry_z - 0.01 {
                // Lift first, drifting towards the place.
                (
                    [
                        a[0] + (place[0] - a[0]) * 0.3,
                        a[1] + (place[1] - a[1]) * 0.3,
                        carry_z,
                    ],
                    gain,
                )
            } else {
                ([place[0], place[1], carry_z], gain)
            }
        } else {
            (place, if a[2] - place[2] < 0.03 { 0.3 } else { gain })
        };
        let target = [0, 1, 2].map(|i| tcp[i] + cube_target[i] - a[i]);
        return (toward_capped(tcp, target, g, CARRY_SPEED), CLOSE);
    }
    if placed {
        // Placed: finish letting go, then back off upwards once the fingers are apart.
        if v.opening() > 0.075 {
            return (
                toward(tcp, [tcp[0], tcp[1], a[2] + HOVER + 0.03], gain),
                OPEN,
            );
        }
        return ([0.0; 3], RELEASE);
    }
    grasp(v, a_index, gain).unwrap_or(([0.0; 3], CLOSE))
}

/// The scripted expert of every tabletop task.
#[derive(Debug, Clone)]
pub struct TabletopExpert {
    config: ExpertConfig,
    rng: Rng,
}

impl TabletopExpert {
    /// An expert seeded with `seed`.
    pub fn new(config: ExpertConfig, seed: u64) -> Self {
        Self {
            config,
            rng: seeding::rng(seed),
        }
    }

    /// Forgets nothing (it keeps no state) but reseeds its noise.
    pub fn reset(&mut self, seed: u64) {
        self.rng = seeding::rng(seed);
    }

    /// Its action at `env`'s current noise-free state.
    pub fn act(&mut self, env: &Tabletop) -> [f32; 4] {
        let mut a = expert_action(env.kind(), &env.true_state(), self.config.gain);
        if self.config.action_noise > 0.0
            && let Ok(n) = Normal::new(0.0, self.config.action_noise)
        {
            for x in a.iter_mut().take(3) {
                *x = (*x + n.sample(&mut self.rng) as f32).clamp(-1.0, 1.0);
            }
        }
        a
    }
}

impl diffrl_core::task::Expert<Tabletop> for TabletopExpert {
    fn reset(&mut self, seed: u64) {
        TabletopExpert::reset(self, seed);
    }

    fn act(&mut self, env: &Tabletop) -> Vec<f32> {
        TabletopExpert::act(self, env).to_vec()
    }
}
