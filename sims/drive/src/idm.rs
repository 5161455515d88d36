//! The Intelligent Driver Model as highway-env 1.12.1 computes it
//! (`highway_env/vehicle/behavior.py`, `IDMVehicle.acceleration` and `desired_gap` with the
//! class's default constants), for a vehicle on a lane without a speed limit and a leader ahead
//! on the same straight lane, both heading along it:
//!
//! a = A * (1 - (max(v, 0) / |nz(v0)|)^DELTA) - A * (d* / nz(d))^2 (the second term only with a
//! leader), d* = D0 + v * T + v * (v - v_front) / (2 * sqrt(A * B)),
//!
//! where A = `COMFORT_ACC_MAX`, B = -`COMFORT_ACC_MIN`, D0 = `DISTANCE_WANTED`, T =
//! `TIME_WANTED`, d the centre-to-centre gap along the lane (highway-env's
//! `lane_distance_to`), and nz(x) replaces |x| <= 0.01 by +-0.01 (highway-env's `not_zero`).
//! The command is not clipped to `ACC_MAX` here (`IDMVehicle.act` does that).

/// IDM parameters; `Default` is highway-env's `IDMVehicle` constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Idm {
    /// Largest acceleration `IDMVehicle.act` commands (m/s^2).
    pub acc_max: f64,
    /// Desired maximum acceleration A (m/s^2).
    pub comfort_acc_max: f64,
    /// Desired maximum deceleration, negative (m/s^2).
    pub comfort_acc_min: f64,
    /// Jam distance D0 (m): 5 m plus a vehicle length.
    pub distance_wanted: f64,
    /// Desired time gap T (s).
    pub time_wanted: f64,
    /// Velocity exponent.
    pub delta: f64,
}

impl Default for Idm {
    fn default() -> Self {
        Self {
            acc_max: 6.0,
            comfort_acc_max: 3.0,
            comfort_acc_min: -5.0,
            distance_wanted: 5.0 + crate::kinematics::LENGTH,
            time_wanted: 1.5,
            delta: 4.0,
        }
    }
}

/// A leader ahead on the same lane.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Leader {
    /// Its speed (m/s).
    pub speed: f64,
    /// Centre-to-centre distance along the lane (m).
    pub gap: f64,
}

/// highway-env's `not_zero`: x, or +-0.01 when |x| <= 0.01 (the sign of x, + for 0).
pub(crate) fn not_zero(x: f64) -> f64 {
    const EPS: f64 = 1e-2;
    if x.abs() > EPS {
        x
    } else if x >= 0.0 {
        EPS
    } else {
        -EPS
    }
}

impl Idm {
    /// The desired gap d* to a leader at `front_speed` (m).
    pub fn desired_gap(&self, speed: f64, front_speed: f64) -> f64 {
        let ab = -self.comfort_acc_max * self.comfort_acc_min;
        self.distance_wanted
            + speed * self.time_wanted
            + speed * (speed - front_speed) / (2.0 * ab.sqrt())
    }

    /// The IDM acceleration at `speed` towards `target_speed`, behind `leader` if any (m/s^2).
    pub fn acceleration(&self, speed: f64, target_speed: f64, leader: Option<Leader>) -> f64 {
        let free = (speed.max(0.0) / not_zero(target_speed).abs()).powf(self.delta);
        let mut a = self.comfort_acc_max * (1.0 - free);
        if let Some(l) = leader {
            a -=
                self.comfort_acc_max * (self.desired_gap(speed, l.speed) / not_zero(l.gap)).powi(2);
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_road_accelerates_towards_the_target_speed() {
        let idm = Idm::default();
        assert_eq!(idm.acceleration(0.0, 25.0, None), 3.0);
        assert!(idm.acceleration(25.0, 25.0, None).abs() < 1e-12);
        assert!(idm.acceleration(30.0, 25.0, None) < 0.0);
        // Reversing counts as standing still; a zero target is taken as 0.01 m/s.
        assert_eq!(idm.acceleration(-3.0, 25.0, None), 3.0);
        assert!(idm.acceleration(1.0, 0.0, None) < -1e6);
    }

    #[test]
    fn a_leader_brakes_by_the_squared_gap_ratio() {
        let idm = Idm::default();
        let (v, v0, vf, gap) = (20.0, 25.0, 15.0, 30.0);
        let d_star = 10.0 + v * 1.5 + v * (v - vf) / (2.0 * 15f64.sqrt());
        let want = 3.0 * (1.0 - (v / v0).powi(4)) - 3.0 * (d_star / gap).powi(2);
        let got = idm.acceleration(v, v0, Some(Leader { speed: vf, gap }));
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        // Closer and faster-closing leaders brake harder.
        let closer = idm.acceleration(
            v,
            v0,
            Some(Leader {
                speed: vf,
                gap: 20.0,
            }),
        );
        assert!(closer < got);
        // A gap of zero is taken as 0.01 m, not a division by zero.
        assert!(
            idm.acceleration(
                v,
                v0,
                Some(Leader {
                    speed: vf,
                    gap: 0.0
                })
            )
            .is_finite()
        );
    }
}
