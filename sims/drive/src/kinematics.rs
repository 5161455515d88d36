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
