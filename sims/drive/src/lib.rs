//! Driving (docs/driving.md): the vehicle models of highway-env 1.12.1 that the driving
//! simulator is built from, each checked against the PyPI package by
//! `tools/highway_check.sh`.
//!
//! - [`kinematics`]: highway-env's `Vehicle.step`, a kinematic bicycle with its speed clipping.
//! - [`idm`]: `IDMVehicle.acceleration`, the Intelligent Driver Model with its default
//!   constants.
//!
//! The scenarios, agents, observations, planner and learning loop of the driving issue are not
//! built yet.

pub mod idm;
pub mod kinematics;

/// A value that is not a finite number, named.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{what} is {value} (not a finite number)")]
pub struct NotFinite {
    /// What the value is ("steering of action 3").
    pub what: String,
    /// The value.
    pub value: f64,
}

/// `Ok(value)` when finite, else the error naming `what`.
pub fn finite(what: impl FnOnce() -> String, value: f64) -> Result<f64, NotFinite> {
    if value.is_finite() {
        Ok(value)
    } else {
        Err(NotFinite {
            what: what(),
            value,
        })
    }
}
