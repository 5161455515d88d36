//! highway-env's kinematic bicycle (`highway_env/vehicle/kinematics.py`, `Vehicle.step` and
//! `Vehicle.clip_actions` of 1.12.1), for a vehicle that has not crashed.
//!
//! With steering angle delta (rad) and acceleration a (m/s^2) held over dt seconds:
//! beta = atan(tan(delta) / 2) is the slip angle at the centre of mass; the position moves by
//! speed * (cos(heading + beta), sin(heading + beta)) * dt, the heading by
//! speed * sin(beta) / (LENGTH / 2) * dt and the speed by a * dt, all from the state at the
//! start of the step (explicit Euler). Before that the acceleration is clipped as
//! highway-env does: above `MAX_SPEED` to at most MAX_SPEED - speed, below `MIN_SPEED` to at
//! least MIN_SPEED - speed (so speed is pulled back, not hard-limited).

use crate::{BadValue, finite};

/// Vehicle length (m): the bicycle's wheelbase is LENGTH / 2 from the centre to each axle.
pub const LENGTH: f64 = 5.0;
/// Vehicle width (m).
pub const WIDTH: f64 = 2.0;
/// Above this speed (m/s) accelerations are clipped towards it.
pub const MAX_SPEED: f64 = 40.0;
/// Below this speed (m/s) accelerations are clipped towards it.
pub const MIN_SPEED: f64 = -40.0;

/// Position (m), heading (rad, from the x axis) and speed (m/s, along the heading).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VehicleState {
    /// x (m).
    pub x: f64,
    /// y (m).
    pub y: f64,
    /// Heading (rad).
    pub heading: f64,
    /// Speed (m/s); negative drives backwards.
    pub speed: f64,
}

impl VehicleState {
    /// `[x, y, heading, speed]`.
    pub fn to_array(self) -> [f64; 4] {
        [self.x, self.y, self.heading, self.speed]
    }

    /// The state of `[x, y, heading, speed]`, every value finite.
    pub fn from_array(v: [f64; 4]) -> Result<Self, BadValue> {
        let names = ["x", "y", "heading", "speed"];
        for (name, &value) in names.iter().zip(&v) {
            finite(|| format!("state {name}"), value)?;
        }
        Ok(Self {
            x: v[0],
            y: v[1],
            heading: v[2],
            speed: v[3],
        })
    }

    /// The acceleration highway-env applies for the commanded `acceleration` at this speed.
    pub fn clipped_acceleration(&self, acceleration: f64) -> f64 {
        if self.speed > MAX_SPEED {
            acceleration.min(MAX_SPEED - self.speed)
        } else if self.speed < MIN_SPEED {
            acceleration.max(MIN_SPEED - self.speed)
        } else {
            acceleration
        }
    }

    /// The state after holding `steering` (rad) and `acceleration` (m/s^2) for `dt` s.
    pub fn step(&self, steering: f64, acceleration: f64, dt: f64) -> Self {
        let acceleration = self.clipped_acceleration(acceleration);
        let beta = (0.5 * steering.tan()).atan();
        let direction = self.heading + beta;
        Self {
            x: self.x + self.speed * direction.cos() * dt,
            y: self.y + self.speed * direction.sin() * dt,
            heading: self.heading + self.speed * beta.sin() / (LENGTH / 2.0) * dt,
            speed: self.speed + acceleration * dt,
        }
    }
}

/// `start` and the state after each `[steering, acceleration]` of `actions`, held `dt` s each;
/// an error names the first non-finite action component or a `dt` that is not finite and > 0.
pub fn rollout(
    start: VehicleState,
    actions: &[[f64; 2]],
    dt: f64,
) -> Result<Vec<VehicleState>, BadValue> {
    if finite(|| "dt".into(), dt)? <= 0.0 {
        return Err(BadValue {
            what: "dt".into(),
            value: dt,
            reason: "must be > 0",
        });
    }
    let mut states = vec![start];
    for (i, a) in actions.iter().enumerate() {
        let steering = finite(|| format!("steering of action {i}"), a[0])?;
        let acceleration = finite(|| format!("acceleration of action {i}"), a[1])?;
        let next = states[states.len() - 1].step(steering, acceleration, dt);
        states.push(next);
    }
    Ok(states)
}

/// Where `end` lies in the frame of `start`: `[longitudinal, lateral]` (m, lateral to the left
/// of the heading).
pub fn body_displacement(start: VehicleState, end: VehicleState) -> [f64; 2] {
    let (dx, dy) = (end.x - start.x, end.y - start.y);
    let (s, c) = start.heading.sin_cos();
    [c * dx + s * dy, -s * dx + c * dy]
}

/// The waypoint tracker: the `[steering (rad), acceleration (m/s^2)]` that, held for `substeps`
/// physics steps of `dt` s, bring a vehicle from `start` closest to `target` (`[longitudinal,
/// lateral]` m in its own frame, [`body_displacement`]), within `|steering| <= max[0]` and
/// `|acceleration| <= max[1]`. An exact inverse of the bicycle model over one control step:
/// damped Gauss-Newton on the displacement that [`VehicleState::step`] gives, from the guess of
/// a circular arc through the target at a constant acceleration; a target that the ranges
/// cannot reach gets the reachable command nearest to it. `None` for a non-finite input.
pub fn track(
    start: VehicleState,
    target: [f64; 2],
    substeps: usize,
    dt: f64,
    max: [f64; 2],
) -> Option<[f64; 2]> {
    let finite = |v: &[f64]| v.iter().all(|x| x.is_finite());
    if !finite(&start.to_array()) || !finite(&target) || !finite(&max) || substeps == 0 {
        return None;
    }
    let t = dt * substeps as f64;
    let reach = |u: [f64; 2]| {
        let mut s = start;
        for _ in 0..substeps {
            s = s.step(u[0], u[1], dt);
        }
        body_displacement(start, s)
    };
    let clamp = |u: [f64; 2]| [u[0].clamp(-max[0], max[0]), u[1].clamp(-max[1], max[1])];
    // The guess: the arc through the target tangent to the heading (curvature 2 y / d^2, the
    // bicycle's sin(beta) / (L / 2)), covered at a constant acceleration.
    let [x, y] = target;
    let d2 = x * x + y * y;
    let kappa = if d2 > 1e-12 { 2.0 * y / d2 } else { 0.0 };
    let beta = (kappa * LENGTH / 2.0).clamp(-1.0, 1.0).asin();
    let arc = if kappa.abs() * d2.sqrt() > 1e-9 {
        (2.0 * (kappa * d2.sqrt() / 2.0).clamp(-1.0, 1.0).asin() / kappa).abs()
    } else {
        d2.sqrt()
    } * x.signum();
    let mut u = clamp([(2.0 * beta.tan()).atan(), 2.0 * (arc / t - start.speed) / t]);
    let err = |u: [f64; 2]| {
        let r = reach(u);
        [r[0] - x, r[1] - y]
    };
    let mut e = err(u);
    let norm = |e: [f64; 2]| e[0] * e[0] + e[1] * e[1];
    for _ in 0..12 {
        if norm(e) < 1e-18 {
            break;
        }
        // Jacobian by central differences, then a Levenberg-damped Gauss-Newton step.
        let h = [1e-6, 1e-5];
        let mut j = [[0.0; 2]; 2];
        for k in 0..2 {
            let (mut up, mut dn) = (u, u);
            up[k] += h[k];
            dn[k] -= h[k];
            let (a, b) = (err(up), err(dn));
            for i in 0..2 {
                j[i][k] = (a[i] - b[i]) / (2.0 * h[k]);
            }
        }
        // Normal equations (J^T J + lambda I) delta = J^T e, a 2 x 2 solve.
        let col = |k: usize| [j[0][k], j[1][k]];
        let dot = |a: [f64; 2], b: [f64; 2]| a[0] * b[0] + a[1] * b[1];
        let (a11, a12, a22) = (
            dot(col(0), col(0)),
            dot(col(0), col(1)),
            dot(col(1), col(1)),
        );
        let lambda = 1e-9 * (a11 + a22) + 1e-15;
        let (a11, a22) = (a11 + lambda, a22 + lambda);
        let det = a11 * a22 - a12 * a12;
        if det.abs() < 1e-30 {
            break;
        }
        let (g0, g1) = (dot(col(0), e), dot(col(1), e));
        let delta = [(a22 * g0 - a12 * g1) / det, (a11 * g1 - a12 * g0) / det];
        // Halve the step until the error falls (or give up at the current command).
        let mut step = 1.0;
        let mut improved = false;
        while step > 1e-3 {
            let cand = clamp([u[0] - step * delta[0], u[1] - step * delta[1]]);
            let ce = err(cand);
            if norm(ce) < norm(e) {
                (u, e, improved) = (cand, ce, true);
                break;
            }
            step *= 0.5;
        }
        if !improved {
            break;
        }
    }
    Some(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(heading: f64, speed: f64) -> VehicleState {
        VehicleState {
            x: 1.0,
            y: -2.0,
            heading,
            speed,
        }
    }

    #[test]
    fn straight_driving_moves_along_the_heading() {
        let s = state(0.3, 10.0).step(0.0, 2.0, 0.5);
        assert!((s.x - (1.0 + 5.0 * 0.3f64.cos())).abs() < 1e-12);
        assert!((s.y - (-2.0 + 5.0 * 0.3f64.sin())).abs() < 1e-12);
        assert_eq!(s.heading, 0.3);
        assert_eq!(s.speed, 11.0);
    }

    /// Constant steering at constant speed turns at speed * sin(beta) / (L / 2) rad/s, and the
    /// path bends the way the wheels point.
    #[test]
    fn steering_turns_at_the_bicycle_rate() {
        let delta = 0.2f64;
        let beta = (delta.tan() / 2.0).atan();
        let s = state(0.0, 8.0).step(delta, 0.0, 0.1);
        assert!((s.heading - 8.0 * beta.sin() / 2.5 * 0.1).abs() < 1e-12);
        assert!(s.y > -2.0);
        let r = state(0.0, 8.0).step(-delta, 0.0, 0.1);
        assert!((r.heading + s.heading).abs() < 1e-12);
    }

    #[test]
    fn accelerations_are_clipped_beyond_the_speed_limits() {
        assert_eq!(state(0.0, 45.0).clipped_acceleration(3.0), -5.0);
        assert_eq!(state(0.0, 45.0).clipped_acceleration(-9.0), -9.0);
        assert_eq!(state(0.0, -42.0).clipped_acceleration(-1.0), 2.0);
        assert_eq!(state(0.0, 40.0).clipped_acceleration(3.0), 3.0);
        // Within the limits nothing changes, however hard the command.
        assert_eq!(state(0.0, 20.0).clipped_acceleration(100.0), 100.0);
    }

    /// The tracker inverts the bicycle model over one control step: a target the model reached
    /// under some command in range is reached again (to a micrometre), whatever the speed and
    /// heading; out of range, the command stays in range.
    #[test]
    fn the_tracker_reaches_what_the_model_can_reach() {
        let (n, dt, max) = (3, 1.0 / 15.0, [std::f64::consts::FRAC_PI_4, 5.0]);
        for &(heading, speed) in &[(0.0, 20.0), (1.3, 8.0), (-2.9, 2.0), (0.4, 0.5), (0.0, 0.0)] {
            for &(steering, acc) in &[
                (0.0, 0.0),
                (0.05, -3.0),
                (-0.3, 2.0),
                (0.7, 4.5),
                (-0.02, -5.0),
            ] {
                let start = state(heading, speed);
                let mut end = start;
                for _ in 0..n {
                    end = end.step(steering, acc, dt);
                }
                let target = body_displacement(start, end);
                let u = track(start, target, n, dt, max).unwrap();
                let mut got = start;
                for _ in 0..n {
                    got = got.step(u[0], u[1], dt);
                }
                let miss = ((got.x - end.x).powi(2) + (got.y - end.y).powi(2)).sqrt();
                assert!(
                    miss < 1e-6,
                    "{heading} {speed} {steering} {acc}: missed by {miss} m"
                );
            }
        }
        let u = track(state(0.0, 10.0), [50.0, 30.0], n, dt, max).unwrap();
        assert!(u[0].abs() <= max[0] && u[1].abs() <= max[1]);
        assert!(track(state(0.0, 10.0), [f64::NAN, 0.0], n, dt, max).is_none());
    }

    #[test]
    fn bad_inputs_are_named() {
        let s = state(0.0, 1.0);
        let e = rollout(s, &[[0.0, 1.0], [f64::NAN, 0.0]], 0.1).unwrap_err();
        assert_eq!(e.what, "steering of action 1");
        let e = rollout(s, &[], 0.0).unwrap_err();
        assert_eq!(e.to_string(), "dt is 0: must be > 0");
        let e = VehicleState::from_array([0.0, 0.0, f64::INFINITY, 1.0]).unwrap_err();
        assert_eq!(e.what, "state heading");
        assert_eq!(rollout(s, &[[0.1, 1.0]; 3], 0.1).unwrap().len(), 4);
    }
}
