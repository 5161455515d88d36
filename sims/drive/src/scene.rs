//! Roads and scenes given as data: the `[env.road]` table of the `custom-road` task (its
//! embedded default is the T-junction of `t_junction.toml`, spelled out in
//! configs/custom-road.toml). Lanes are [`LaneSpec`]s; agents and background streams name the
//! lanes of their routes. [`RoadScene::check`] refuses a bad scene with the item named: a lane
//! error from [`Road::new`], an unknown or disconnected route, a start off its lane, agents
//! overlapping at the start, a count of agents that differs from `[env] agents`, lanes that do
//! not fit in a [`MAX_EXTENT`] square.

use diffrl_core::config::{Invalid, ensure};
use serde::{Deserialize, Serialize};

use crate::kinematics::LENGTH;
use crate::road::{LaneSpec, Road};

/// The largest side (m) of the square a scene's lanes must fit in.
pub const MAX_EXTENT: f64 = 2_000.0;

/// A road and who drives on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoadScene {
    /// The lanes.
    #[serde(default)]
    pub lanes: Vec<LaneSpec>,
    /// One entry per controlled agent, in agent order.
    #[serde(default)]
    pub agents: Vec<AgentSpawn>,
    /// Background streams.
    #[serde(default)]
    pub traffic: Vec<TrafficStream>,
}

/// Where a controlled agent starts and where it drives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpawn {
    /// Lane names in driving order, each a successor (`next`) of the one before.
    pub route: Vec<String>,
    /// Start, m along the route's first lane.
    pub start: f64,
    /// Initial speed (m/s).
    pub speed: f64,
}

/// Background drivers following one route.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficStream {
    /// Lane names in driving order, each a successor of the one before.
    pub route: Vec<String>,
    /// How many drivers (0..=50).
    pub count: usize,
    /// The first one's start, m along the first lane.
    pub start: f64,
    /// Spacing of the others behind it (m, x U(1, 1.5) at each reset), >= 2 vehicle lengths.
    pub gap: f64,
}

/// A scene checked against its road: routes as lane indices.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedScene {
    /// The scene as given.
    pub scene: RoadScene,
    /// The road.
    pub road: Road,
    /// Each agent's route (lane indices).
    pub agent_routes: Vec<Vec<usize>>,
    /// Each stream's route (lane indices).
    pub traffic_routes: Vec<Vec<usize>>,
}

impl RoadScene {
    /// The built-in T-junction (`t_junction.toml`), the scene of `custom-road` without an
    /// `[env.road]` table.
    pub fn t_junction() -> Self {
        toml::from_str(include_str!("t_junction.toml")).expect("t_junction.toml is a valid scene")
    }

    /// Checks the scene for `agents` controlled agents; the error names the item (fields
    /// relative to the table: `lanes`, `agents[1].route`, `traffic[0].start`, ...).
    pub fn check(&self, agents: usize) -> Result<CheckedScene, Invalid> {
        let road = Road::new(&self.lanes).map_err(|e| Invalid::new("lanes", e.to_string()))?;
        // The raster's drivable-area mask covers the road's bounding box in 0.25 m cells.
        let (mut lo, mut hi) = ([f64::INFINITY; 2], [f64::NEG_INFINITY; 2]);
        for p in self.lanes.iter().flat_map(|l| &l.points) {
            for k in 0..2 {
                lo[k] = lo[k].min(p[k]);
                hi[k] = hi[k].max(p[k]);
            }
        }
        let extent = (hi[0] - lo[0]).max(hi[1] - lo[1]);
        ensure(
            extent <= MAX_EXTENT,
            "lanes",
            format!(
                "span {extent:.0} m from x {:.0} to {:.0}, y {:.0} to {:.0}; a scene must fit in \
                 a {MAX_EXTENT} m square",
                lo[0], hi[0], lo[1], hi[1]
            ),
        )?;
        ensure(
            self.agents.len() == agents,
            "agents",
            format!(
                "gives {} agent(s), but [env] agents is {agents}",
                self.agents.len()
            ),
        )?;
        let mut agent_routes = Vec::new();
        for (i, a) in self.agents.iter().enumerate() {
            let field = format!("agents[{i}]");
            let route = route_from(&road, &field, &a.route, a.start)?;
            ensure(
                a.speed.is_finite() && (0.0..=40.0).contains(&a.speed),
                &format!("{field}.speed"),
                format!("must be in 0..=40 m/s, got {}", a.speed),
            )?;
            agent_routes.push(route);
        }
        let starts: Vec<[f64; 2]> = self
            .agents
            .iter()
            .zip(&agent_routes)
            .map(|(a, r)| road.along_route(r, a.start).0)
            .collect();
        for i in 0..starts.len() {
            for j in i + 1..starts.len() {
                let d = (starts[i][0] - starts[j][0]).hypot(starts[i][1] - starts[j][1]);
                ensure(
                    d > LENGTH + 1.0,
                    &format!("agents[{j}]"),
                    format!(
                        "starts {d:.1} m from agents[{i}]: they overlap (keep more than {} m \
                         between centres)",
                        LENGTH + 1.0
                    ),
                )?;
            }
        }
        let mut traffic_routes = Vec::new();
        for (i, t) in self.traffic.iter().enumerate() {
            let field = format!("traffic[{i}]");
            let route = route_from(&road, &field, &t.route, t.start)?;
            ensure(
                t.count <= 50,
                &format!("{field}.count"),
                format!("must be at most 50, got {}", t.count),
            )?;
            ensure(
                t.gap.is_finite() && t.gap >= 2.0 * LENGTH,
                &format!("{field}.gap"),
                format!("must be at least {} m, got {}", 2.0 * LENGTH, t.gap),
            )?;
            traffic_routes.push(route);
        }
        Ok(CheckedScene {
            scene: self.clone(),
            road,
            agent_routes,
            traffic_routes,
        })
    }
}

/// The route `names` of item `field` (an agent or a traffic stream) as lane indices, its
/// `start` (m along the first lane) checked to lie on that lane.
fn route_from(
    road: &Road,
    field: &str,
    names: &[String],
    start: f64,
) -> Result<Vec<usize>, Invalid> {
    let route = route(road, names).map_err(|e| e.within(field))?;
    let len = road.lanes[route[0]].length();
    ensure(
        start.is_finite() && (0.0..=len).contains(&start),
        &format!("{field}.start"),
        format!(
            "must lie on lane {:?} (0..={len:.1} m), got {start}",
            names[0]
        ),
    )?;
    Ok(route)
}

/// The lane indices of `names`, each a successor of the one before; errors name `route`.
fn route(road: &Road, names: &[String]) -> Result<Vec<usize>, Invalid> {
    ensure(!names.is_empty(), "route", "must name at least one lane")?;
    let mut out: Vec<usize> = Vec::with_capacity(names.len());
    for name in names {
        let Some(i) = road.lane_named(name) else {
            return Err(Invalid::new(
                "route",
                format!("{name:?} is not a lane of the road"),
            ));
        };
        if let Some(&prev) = out.last() {
            let p = &road.lanes[prev];
            ensure(
                p.next.contains(&i),
                "route",
                format!(
                    "lane {:?} does not lead to {name:?} (its next: {:?})",
                    p.name,
                    p.next
                        .iter()
                        .map(|&n| road.lanes[n].name.as_str())
                        .collect::<Vec<_>>()
                ),
            )?;
        }
        out.push(i);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The built-in T-junction passes its checks; each kind of bad scene is refused naming the
    /// item.
    #[test]
    fn bad_scenes_are_refused_naming_the_item() {
        let good = RoadScene::t_junction();
        let checked = good.check(4).unwrap();
        assert_eq!(checked.road.lanes.len(), 12);
        assert_eq!(checked.agent_routes.len(), 4);
        let err = |f: &dyn Fn(&mut RoadScene)| {
            let mut s = good.clone();
            f(&mut s);
            s.check(4).unwrap_err().to_string()
        };
        let e = err(&|s| s.lanes[0].width = 0.0);
        assert!(
            e.starts_with("lanes:") && e.contains("\"w-in\"") && e.contains("width"),
            "{e}"
        );
        let e = err(&|s| s.lanes[3].points[0] = [-10.0, 9.0]);
        assert!(e.contains("\"w-in\"") && e.contains("\"w>e\""), "{e}");
        let e = err(&|s| s.agents[1].route[1] = "w>x".into());
        assert!(
            e.starts_with("agents[1].route:") && e.contains("\"w>x\""),
            "{e}"
        );
        let e = err(&|s| s.agents[0].route[1] = "s-out".into());
        assert!(
            e.contains("does not lead to \"s-out\"") && e.contains("s>w"),
            "{e}"
        );
        let e = err(&|s| s.agents[0].start = 500.0);
        assert!(e.starts_with("agents[0].start:"), "{e}");
        let e = err(&|s| {
            s.agents[1].route = s.agents[0].route.clone();
            s.agents[1].start = s.agents[0].start + 2.0;
        });
        assert!(e.starts_with("agents[1]:") && e.contains("overlap"), "{e}");
        let e = err(&|s| s.lanes[9].points[1] = [5_000.0, 2.0]);
        assert!(
            e.starts_with("lanes:") && e.contains("2000 m square"),
            "{e}"
        );
        let e = err(&|s| s.traffic[2].gap = 1.0);
        assert!(e.starts_with("traffic[2].gap:"), "{e}");
        let e = good.check(2).unwrap_err().to_string();
        assert!(e.contains("gives 4 agent(s)"), "{e}");
    }

    /// configs/custom-road.toml spells out the built-in T-junction with its first two agents.
    #[test]
    fn the_shipped_config_holds_the_built_in_scene() {
        let text = include_str!("../../../configs/custom-road.toml");
        let value: toml::Table = toml::from_str(text).unwrap();
        let env: crate::env::DriveConfig = value["env"].clone().try_into().unwrap();
        let mut builtin = RoadScene::t_junction();
        builtin.agents.truncate(2);
        assert_eq!(env.road, Some(builtin));
    }
}
