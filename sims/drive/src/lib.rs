//! Driving (docs/driving.md): a closed-loop multi-agent traffic simulator on highway-env
//! 1.12.1's vehicle and driver models.
//!
//! - [`kinematics`]: highway-env's `Vehicle.step`, a kinematic bicycle with its speed clipping.
//! - [`idm`]: `IDMVehicle.acceleration`, the Intelligent Driver Model with its default
//!   constants. Both are checked against the PyPI package by `tools/highway_check.sh`.
//! - [`road`]: lane networks from polylines with widths, successors, neighbours and right of
//!   way, checked when built; the highway-with-on-ramp, four-way intersection and roundabout
//!   layouts.
//! - [`traffic`]: vehicles on routes, IDM + MOBIL background drivers, lane keeping,
//!   highway-env's right-of-way rules at junctions, collisions.
//! - [`scene`]: roads, routes and traffic given as data (`custom-road`'s `[env.road]`),
//!   checked with the item named.
//! - [`env`]: the scenarios `highway-merge`, `intersection`, `roundabout` and `custom-road`: N
//!   controlled agents among the traffic.
//! - [`task`]: the tasks the tools see, and their experts.
//!
//! Not built yet: plans over waypoints tracked by a controller (policies command accelerations
//! and steering).

pub mod env;
pub mod idm;
pub mod kinematics;
pub mod raster;
pub mod road;
pub mod scene;
pub mod task;
pub mod traffic;

/// An input value the models refuse, named, with the reason.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{what} is {value}: {reason}")]
pub struct BadValue {
    /// What the value is ("steering of action 3").
    pub what: String,
    /// The value.
    pub value: f64,
    /// What it should be ("not a finite number", "must be > 0").
    pub reason: &'static str,
}

/// `Ok(value)` when finite, else the error naming `what`.
pub fn finite(what: impl FnOnce() -> String, value: f64) -> Result<f64, BadValue> {
    if value.is_finite() {
        Ok(value)
    } else {
        Err(BadValue {
            what: what(),
            value,
            reason: "not a finite number",
        })
    }
}
