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
