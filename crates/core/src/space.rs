//! Observation and action spaces. An observation may hold a state vector, an RGB image and a
//! text instruction; multi-agent tasks stack per-agent blocks along the state vector and say so
//! in [`ObservationSpace::agents`].

use serde::{Deserialize, Serialize};

/// A box of real vectors with per-component bounds (gymnasium's `Box`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BoxSpace {
    /// Lower bound per component.
    pub low: Vec<f32>,
    /// Upper bound per component.
    pub high: Vec<f32>,
    /// Component names (same length as the bounds), e.g. `["x", "y"]`.
    pub names: Vec<String>,
}

impl BoxSpace {
    /// A space with the same bounds for every named component.
    pub fn uniform(names: &[&str], low: f32, high: f32) -> Self {
        Self {
            low: vec![low; names.len()],
            high: vec![high; names.len()],
            names: names.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Number of components.
    pub fn dim(&self) -> usize {
        self.low.len()
    }

    /// Checks length and finiteness; clamps into the bounds in place and returns how many
    /// components were out of range.
    pub fn check_and_clamp(&self, v: &mut [f32]) -> Result<usize, crate::EnvError> {
        if v.len() != self.dim() {
            return Err(crate::EnvError::ActionShape {
                expected: self.dim(),
                got: v.len(),
            });
        }
        if let Some((index, &value)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
            return Err(crate::EnvError::NonFiniteAction { index, value });
        }
        let mut clamped = 0;
        for ((x, lo), hi) in v.iter_mut().zip(&self.low).zip(&self.high) {
            if *x < *lo || *x > *hi {
                *x = x.clamp(*lo, *hi);
                clamped += 1;
            }
        }
        Ok(clamped)
    }

    /// Whether `v` has the right length and lies inside the bounds.
    pub fn contains(&self, v: &[f32]) -> bool {
        v.len() == self.dim()
            && v.iter()
                .zip(&self.low)
                .zip(&self.high)
                .all(|((x, lo), hi)| *x >= *lo && *x <= *hi)
    }
}

/// An RGB image observation space (height x width x 3, u8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageSpace {
    /// Rows.
    pub height: u32,
    /// Columns.
    pub width: u32,
}

/// What an environment observes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObservationSpace {
    /// The state vector (proprioception, object poses, keypoints), if any.
    pub state: Option<BoxSpace>,
    /// The camera image, if any.
    pub image: Option<ImageSpace>,
    /// Whether a text instruction comes with each observation.
    pub text: bool,
    /// Number of agents whose blocks are stacked in the state vector (1 for single-agent tasks).
    pub agents: usize,
    /// Runs of equal-width records inside each agent's block (lanes, neighbouring vehicles,
    /// objects) that a token-based policy may read as one token each; empty when the block is
    /// one flat vector. Every agent's block has the same layout.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entities: Vec<EntityGroup>,
}

/// `count` consecutive records of `width` values each, starting at `offset` inside an agent's
/// block of the state vector: the K nearest vehicles, the lanes around an agent. The values of
/// a block outside every group describe the agent itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntityGroup {
    /// What the records are ("lanes", "neighbours"); shown in errors.
    pub name: String,
    /// Index of the first value of the first record inside the agent's block.
    pub offset: usize,
    /// Values per record.
    pub width: usize,
    /// Records.
    pub count: usize,
}

impl EntityGroup {
    /// A group of `count` records of `width` values from `offset`.
    pub fn new(name: &str, offset: usize, width: usize, count: usize) -> Self {
        Self {
            name: name.to_string(),
            offset,
            width,
            count,
        }
    }

    /// One past the group's last value inside the block.
    pub fn end(&self) -> usize {
        self.offset + self.width * self.count
    }
}

/// Checks that `groups` tile part of an agent block of `block` values: every group non-empty,
/// inside the block, and no two overlapping. The error names the group.
pub fn check_entity_groups(groups: &[EntityGroup], block: usize) -> Result<(), String> {
    for (i, g) in groups.iter().enumerate() {
        if g.width == 0 || g.count == 0 {
            return Err(format!(
                "entity group {:?} has {} records of {} values: both must be > 0",
                g.name, g.count, g.width
            ));
        }
        if g.end() > block {
            return Err(format!(
                "entity group {:?} ends at value {} of an agent block of {block}",
                g.name,
                g.end()
            ));
        }
        if let Some(o) = groups[..i]
            .iter()
            .find(|o| g.offset < o.end() && o.offset < g.end())
        {
            return Err(format!(
                "entity groups {:?} ({}..{}) and {:?} ({}..{}) overlap",
                o.name,
                o.offset,
                o.end(),
                g.name,
                g.offset,
                g.end()
            ));
        }
    }
    Ok(())
}

/// An RGB8 image in row-major HWC order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageObs {
    /// Rows.
    pub height: u32,
    /// Columns.
    pub width: u32,
    /// `height * width * 3` bytes.
    pub data: Vec<u8>,
}

/// One observation. Fields absent from the environment's [`ObservationSpace`] are empty.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Observation {
    /// State vector (empty when the space has no state).
    pub state: Vec<f32>,
    /// Camera image.
    pub image: Option<ImageObs>,
    /// Language instruction.
    pub text: Option<String>,
}

impl Observation {
    /// A state-only observation.
    pub fn state(state: Vec<f32>) -> Self {
        Self {
            state,
            image: None,
            text: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamp_counts_and_rejects_nan() {
        let s = BoxSpace::uniform(&["x", "y"], 0.0, 512.0);
        let mut a = [-3.0, 600.0];
        assert_eq!(s.check_and_clamp(&mut a).unwrap(), 2);
        assert_eq!(a, [0.0, 512.0]);
        let mut ok = [1.0, 2.0];
        assert_eq!(s.check_and_clamp(&mut ok).unwrap(), 0);
        let mut bad = [1.0, f32::NAN];
        let e = s.check_and_clamp(&mut bad).unwrap_err().to_string();
        assert!(e.contains("component 1"), "{e}");
        let mut inf = [f32::INFINITY, 0.0];
        assert!(s.check_and_clamp(&mut inf).is_err());
        assert!(s.check_and_clamp(&mut [1.0]).is_err());
        assert!(s.contains(&[0.0, 512.0]) && !s.contains(&[0.0, 513.0]));
    }

    #[test]
    fn entity_groups_must_fit_and_not_overlap() {
        let lanes = EntityGroup::new("lanes", 5, 4, 3);
        let near = EntityGroup::new("neighbours", 17, 6, 6);
        assert!(check_entity_groups(&[lanes.clone(), near.clone()], 53).is_ok());
        let e = check_entity_groups(&[lanes.clone(), near.clone()], 52).unwrap_err();
        assert!(e.contains("\"neighbours\" ends at value 53"), "{e}");
        let e =
            check_entity_groups(&[lanes.clone(), EntityGroup::new("x", 16, 2, 1)], 53).unwrap_err();
        assert!(e.contains("overlap") && e.contains("\"x\""), "{e}");
        let e = check_entity_groups(&[EntityGroup::new("x", 0, 0, 1)], 53).unwrap_err();
        assert!(e.contains("both must be > 0"), "{e}");
    }
}
