//! Roads as networks of lanes: each lane a polyline centre line with a width, its successors
//! (where a vehicle goes at its end) and its side neighbours (where it may change lane), in
//! highway-env's frame (x along the road, y growing to the right of travel, so lane 1 lies at
//! larger y than lane 0). Local coordinates `(s, r)` follow highway-env's lanes: `s` the arc
//! length along the centre line, `r` the signed offset to its right; before the first point and
//! after the last one the end segments extend in straight lines.
//!
//! A road is built from [`LaneSpec`]s (what a scenario file or generator gives), checked once by
//! [`Road::new`]: every error names the lane and the item.

use serde::{Deserialize, Serialize};

use crate::kinematics::LENGTH;

/// One lane as a scenario describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaneSpec {
    /// Unique name (`"main-0"`, `"ramp"`).
    pub name: String,
    /// Centre line, in driving order, at least two points, consecutive points apart.
    pub points: Vec<[f64; 2]>,
    /// Width (m), > 0.
    pub width: f64,
    /// Lanes a vehicle continues on at this lane's end; each must start where this one ends.
    #[serde(default)]
    pub next: Vec<String>,
    /// The lane beside this one towards smaller y (highway-env's "left"), if vehicles may
    /// change into it.
    #[serde(default)]
    pub left: Option<String>,
    /// The lane beside this one towards larger y, if vehicles may change into it.
    #[serde(default)]
    pub right: Option<String>,
    /// The lane ends in a barrier (a merge lane): drivers treat its end as a standing vehicle,
    /// and past it there is no road.
    #[serde(default)]
    pub ends: bool,
    /// Right of way where lanes cross (highway-env's lane `priority`): where two vehicles'
    /// predicted paths conflict, the one on the lower-priority lane yields, and on equal
    /// priorities the one behind ([`crate::traffic::Traffic::regulate`]). Default 0.
    #[serde(default)]
    pub priority: i32,
}

/// Why a set of lanes is not a road.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RoadError {
    /// No lanes at all.
    #[error("the road has no lanes")]
    Empty,
    /// Two lanes share a name.
    #[error("two lanes are called {0:?}")]
    DuplicateName(String),
    /// A centre line with fewer than two points.
    #[error("lane {lane:?} has {points} centre-line point(s); it needs at least 2")]
    TooFewPoints {
        /// The lane.
        lane: String,
        /// How many it has.
        points: usize,
    },
    /// A non-finite coordinate.
    #[error("lane {lane:?}: point {index} is {point:?} (not finite)")]
    NonFinitePoint {
        /// The lane.
        lane: String,
        /// Index of the point.
        index: usize,
        /// The point.
        point: [f64; 2],
    },
    /// Two consecutive points (nearly) coincide.
    #[error("lane {lane:?}: points {index} and {} coincide (segments must be longer than 1 cm)", index + 1)]
    RepeatedPoint {
        /// The lane.
        lane: String,
        /// Index of the first point.
        index: usize,
    },
    /// A width that is not finite and > 0.
    #[error("lane {lane:?} has width {width}; it must be a finite number > 0")]
    BadWidth {
        /// The lane.
        lane: String,
        /// The width.
        width: f64,
    },
    /// A reference to a lane that does not exist.
    #[error("lane {lane:?}: its {field} {target:?} is not a lane of the road")]
    UnknownLane {
        /// The lane holding the reference.
        lane: String,
        /// `next`, `left` or `right`.
        field: &'static str,
        /// The missing name.
        target: String,
    },
    /// A successor that does not start where the lane ends.
    #[error(
        "lane {lane:?} ends {gap:.2} m from the start of its successor {next:?} (they must meet within 0.5 m)"
    )]
    Disconnected {
        /// The lane.
        lane: String,
        /// Its successor.
        next: String,
        /// Distance between the end and the successor's start (m).
        gap: f64,
    },
    /// A lane given as its own neighbour or successor.
    #[error("lane {lane:?} names itself as its {field}")]
    SelfReference {
        /// The lane.
        lane: String,
        /// `next`, `left` or `right`.
        field: &'static str,
    },
}

/// A checked lane with precomputed arc lengths.
#[derive(Debug, Clone, PartialEq)]
pub struct Lane {
    /// Its name.
    pub name: String,
    /// Centre line.
    pub points: Vec<[f64; 2]>,
    /// Width (m).
    pub width: f64,
    /// Indices of the successor lanes.
    pub next: Vec<usize>,
    /// Index of the neighbour towards smaller y.
    pub left: Option<usize>,
    /// Index of the neighbour towards larger y.
    pub right: Option<usize>,
    /// Whether the lane ends in a barrier.
    pub ends: bool,
    /// Right of way where lanes cross ([`LaneSpec::priority`]).
    pub priority: i32,
    /// Arc length at each point.
    cumulative: Vec<f64>,
    /// Unit direction of each segment.
    directions: Vec<[f64; 2]>,
    /// Heading of each segment (rad).
    headings: Vec<f64>,
    /// Bounding box of the centre line: [min x, min y, max x, max y].
    bounds: [f64; 4],
    /// 1 / cos of the sharpest turn between segments, None at 84 degrees or more
    /// ([`Lane::local_on_lane`]).
    corner_reach: Option<f64>,
}

impl Lane {
    /// Length of the centre line (m).
    pub fn length(&self) -> f64 {
        self.cumulative[self.cumulative.len() - 1]
    }

    fn segment(&self, i: usize) -> ([f64; 2], [f64; 2], f64) {
        let len = self.cumulative[i + 1] - self.cumulative[i];
        (self.points[i], self.directions[i], len)
    }

    /// Local coordinates `(s, r)` of `p`: arc length of its projection on the centre line and
    /// signed offset (positive towards larger y for a lane along +x), on the nearest segment;
    /// past either end the end segment extends.
    pub fn local(&self, p: [f64; 2]) -> (f64, f64) {
        // The nearest segment is the first with the smallest `hypot`, the costly part. The
        // squared distance, a few roundings from the exact one, finds it cheaply: a segment
        // whose squared distance exceeds the smallest by more than 1e-9 relative (far above
        // those roundings) cannot be the nearest, so only the others are measured with
        // `hypot`, in order, and the result is that of measuring every segment.
        let n = self.points.len() - 1;
        let nearest = (0..n)
            .map(|i| self.offsets(i, p).0)
            .fold(f64::INFINITY, f64::min);
        let bound = nearest * (1.0 + 1e-9);
        let mut best = (f64::INFINITY, 0.0, 0.0);
        for i in 0..n {
            let (q, off, t, r) = self.offsets(i, p);
            if q > bound {
                continue;
            }
            let dist = off.abs().hypot(r);
            if dist < best.0 {
                best = (dist, self.cumulative[i] + t, r);
            }
        }
        (best.1, best.2)
    }

    /// For `p` and segment `i` of [`Lane::local`]: the squared distance, the distance along
    /// the line past the segment's end (0 within it), the clamped arc length within the
    /// segment and the signed offset. The first segment extends backwards, the last forwards.
    fn offsets(&self, i: usize, p: [f64; 2]) -> (f64, f64, f64, f64) {
        let n = self.points.len() - 1;
        let (a, d, len) = self.segment(i);
        let (dx, dy) = (p[0] - a[0], p[1] - a[1]);
        let along = dx * d[0] + dy * d[1];
        let r = -dx * d[1] + dy * d[0];
        let lo = if i == 0 { f64::NEG_INFINITY } else { 0.0 };
        let hi = if i + 1 == n { f64::INFINITY } else { len };
        let t = along.clamp(lo, hi);
        let off = along - t;
        (off * off + r * r, off, t, r)
    }

    fn segment_at(&self, s: f64) -> usize {
        let n = self.points.len() - 1;
        match self.cumulative.partition_point(|&c| c <= s) {
            0 => 0,
            k => (k - 1).min(n - 1),
        }
    }

    /// The world point at local coordinates `(s, r)`.
    pub fn position(&self, s: f64, r: f64) -> [f64; 2] {
        let i = self.segment_at(s);
        let (a, d, _) = self.segment(i);
        let t = s - self.cumulative[i];
        [a[0] + d[0] * t - d[1] * r, a[1] + d[1] * t + d[0] * r]
    }

    /// Heading of the centre line at arc length `s` (rad).
    pub fn heading_at(&self, s: f64) -> f64 {
        self.headings[self.segment_at(s)]
    }

    /// highway-env's `on_lane`: within half the width plus `margin` of the centre line and
    /// between one vehicle length before the start and one after the end.
    pub fn on_lane(&self, s: f64, r: f64, margin: f64) -> bool {
        r.abs() <= self.width / 2.0 + margin && (-LENGTH..self.length() + LENGTH).contains(&s)
    }

    /// `local(p)` where `on_lane` holds for it with `margin`, else None, answered without
    /// projecting `p` when it lies too far from the centre line's bounding box to be on the
    /// lane. A point on the lane lies within |r| <= `width / 2 + margin` of a segment, within
    /// `hypot(LENGTH, |r|)` of an end (past it, on the extension), or, where its nearest point
    /// is a corner between two segments, within |r| / cos(turn) of that corner: its nearest
    /// segment's line passes within |r| of it, and a point of the corner's outer wedge is at
    /// least cos(turn) times its distance from the corner away from that line. Lanes with a
    /// turn of 84 degrees or more, and points with a coordinate that is not finite, are always
    /// projected.
    pub fn local_on_lane(&self, p: [f64; 2], margin: f64) -> Option<(f64, f64)> {
        if let Some(per_offset) = self
            .corner_reach
            .filter(|_| p.iter().all(|v| v.is_finite()))
        {
            let r = self.width / 2.0 + margin;
            let m = (LENGTH + r).max(r * per_offset) + 1.0;
            let [x0, y0, x1, y1] = self.bounds;
            if p[0] < x0 - m || p[0] > x1 + m || p[1] < y0 - m || p[1] > y1 + m {
                return None;
            }
        }
        let (s, r) = self.local(p);
        self.on_lane(s, r, margin).then_some((s, r))
    }

    /// Whether `(s, r)` lies on the lane's surface (within half the width, between its ends).
    pub fn covers(&self, s: f64, r: f64) -> bool {
        r.abs() <= self.width / 2.0 && (0.0..=self.length()).contains(&s)
    }

    /// highway-env's `distance_with_heading`: |r| plus how far `s` lies outside the lane, plus
    /// the heading difference (rad).
    pub fn distance_with_heading(&self, p: [f64; 2], heading: f64) -> f64 {
        let (s, r) = self.local(p);
        self.distance_with_heading_at(s, r, heading)
    }

    /// [`Lane::distance_with_heading`] from the local coordinates `(s, r)` of the point.
    fn distance_with_heading_at(&self, s: f64, r: f64, heading: f64) -> f64 {
        let angle = wrap_to_pi(heading - self.heading_at(s)).abs();
        r.abs() + (s - self.length()).max(0.0) + (-s).max(0.0) + angle
    }
}

/// `x` wrapped into [-pi, pi).
pub fn wrap_to_pi(x: f64) -> f64 {
    use std::f64::consts::PI;
    (x + PI).rem_euclid(2.0 * PI) - PI
}

/// A checked lane network.
#[derive(Debug, Clone, PartialEq)]
pub struct Road {
    /// The lanes, in the order of their specs.
    pub lanes: Vec<Lane>,
}

impl Road {
    /// Checks `specs` and builds the road; the first problem found is the error.
    pub fn new(specs: &[LaneSpec]) -> Result<Self, RoadError> {
        if specs.is_empty() {
            return Err(RoadError::Empty);
        }
        let index = |lane: &LaneSpec, field: &'static str, target: &str| {
            if target == lane.name {
                return Err(RoadError::SelfReference {
                    lane: lane.name.clone(),
                    field,
                });
            }
            specs
                .iter()
                .position(|s| s.name == target)
                .ok_or_else(|| RoadError::UnknownLane {
                    lane: lane.name.clone(),
                    field,
                    target: target.into(),
                })
        };
        let mut lanes = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            if specs[..i].iter().any(|s| s.name == spec.name) {
                return Err(RoadError::DuplicateName(spec.name.clone()));
            }
            let lane_err = || spec.name.clone();
            if spec.points.len() < 2 {
                return Err(RoadError::TooFewPoints {
                    lane: lane_err(),
                    points: spec.points.len(),
                });
            }
            if let Some((index, &point)) = spec
                .points
                .iter()
                .enumerate()
                .find(|(_, p)| !p.iter().all(|v| v.is_finite()))
            {
                return Err(RoadError::NonFinitePoint {
                    lane: lane_err(),
                    index,
                    point,
                });
            }
            if !(spec.width.is_finite() && spec.width > 0.0) {
                return Err(RoadError::BadWidth {
                    lane: lane_err(),
                    width: spec.width,
                });
            }
            let mut cumulative = vec![0.0];
            let mut directions = Vec::with_capacity(spec.points.len());
            for (k, w) in spec.points.windows(2).enumerate() {
                let len = (w[1][0] - w[0][0]).hypot(w[1][1] - w[0][1]);
                if len < 0.01 {
                    return Err(RoadError::RepeatedPoint {
                        lane: lane_err(),
                        index: k,
                    });
                }
                cumulative.push(cumulative[k] + len);
                // As the arc lengths give it: the length of segment k is their difference.
                let len = cumulative[k + 1] - cumulative[k];
                directions.push([(w[1][0] - w[0][0]) / len, (w[1][1] - w[0][1]) / len]);
            }
            let cos = directions
                .windows(2)
                .map(|d| d[0][0] * d[1][0] + d[0][1] * d[1][1])
                .fold(1.0, f64::min);
            let corner_reach = (cos > 0.1).then(|| 1.0 / cos);
            let bounds = spec.points.iter().fold(
                [
                    f64::INFINITY,
                    f64::INFINITY,
                    f64::NEG_INFINITY,
                    f64::NEG_INFINITY,
                ],
                |b, q| {
                    [
                        b[0].min(q[0]),
                        b[1].min(q[1]),
                        b[2].max(q[0]),
                        b[3].max(q[1]),
                    ]
                },
            );
            let side = |field, name: &Option<String>| {
                name.as_deref().map(|n| index(spec, field, n)).transpose()
            };
            lanes.push(Lane {
                name: spec.name.clone(),
                points: spec.points.clone(),
                width: spec.width,
                next: spec
                    .next
                    .iter()
                    .map(|n| index(spec, "next", n))
                    .collect::<Result<_, _>>()?,
                left: side("left", &spec.left)?,
                right: side("right", &spec.right)?,
                ends: spec.ends,
                priority: spec.priority,
                cumulative,
                headings: directions.iter().map(|d| d[1].atan2(d[0])).collect(),
                directions,
                corner_reach,
                bounds,
            });
        }
        for lane in &lanes {
            let end = lane.points[lane.points.len() - 1];
            for &n in &lane.next {
                let start = lanes[n].points[0];
                let gap = (start[0] - end[0]).hypot(start[1] - end[1]);
                if gap > 0.5 {
                    return Err(RoadError::Disconnected {
                        lane: lane.name.clone(),
                        next: lanes[n].name.clone(),
                        gap,
                    });
                }
            }
        }
        Ok(Self { lanes })
    }

    /// highway-env's `get_closest_lane_index`: the lane nearest `p` in distance plus heading
    /// difference (the first one on ties).
    pub fn closest_lane(&self, p: [f64; 2], heading: f64) -> usize {
        let mut best = (f64::INFINITY, 0);
        for (i, lane) in self.lanes.iter().enumerate() {
            let d = lane.distance_with_heading(p, heading);
            if d < best.0 {
                best = (d, i);
            }
        }
        best.1
    }

    /// Whether `p` lies on the surface of some lane.
    pub fn on_road(&self, p: [f64; 2]) -> bool {
        self.lanes.iter().any(|l| {
            let (s, r) = l.local(p);
            l.covers(s, r)
        })
    }

    /// Lanes that lead into `lane`.
    pub fn previous(&self, lane: usize) -> impl Iterator<Item = usize> + '_ {
        self.lanes
            .iter()
            .enumerate()
            .filter(move |(_, l)| l.next.contains(&lane))
            .map(|(i, _)| i)
    }

    /// The index of the lane called `name`.
    pub fn lane_named(&self, name: &str) -> Option<usize> {
        self.lanes.iter().position(|l| l.name == name)
    }

    /// The point and heading at arc length `s` along `route` (lanes in driving order, each
    /// starting where the previous one ends): past the last lane its end segment extends.
    pub fn along_route(&self, route: &[usize], s: f64) -> ([f64; 2], f64) {
        let mut s = s;
        for (k, &lane) in route.iter().enumerate() {
            let l = &self.lanes[lane];
            if s <= l.length() || k + 1 == route.len() {
                return (l.position(s, 0.0), l.heading_at(s));
            }
            s -= l.length();
        }
        ([0.0; 2], 0.0)
    }

    /// Arc length along `route` at which its `k`-th lane starts.
    pub fn route_offset(&self, route: &[usize], k: usize) -> f64 {
        route[..k.min(route.len())]
            .iter()
            .map(|&l| self.lanes[l].length())
            .sum()
    }

    /// The lane of `lanes` nearest `p` in highway-env's distance plus heading difference, if
    /// `p` lies on it (within half its width plus 1 m, between one vehicle length before its
    /// start and one after its end); else the closest lane of the road. Vehicles on a route
    /// take their lane from it, so that near a junction, where several lanes leave the same
    /// point with the same heading, they stay on the one they follow.
    pub fn closest_lane_among(&self, lanes: &[usize], p: [f64; 2], heading: f64) -> usize {
        let mut best = (f64::INFINITY, None);
        for &i in lanes {
            let lane = &self.lanes[i];
            let (s, r) = lane.local(p);
            let d = lane.distance_with_heading_at(s, r, heading);
            if lane.on_lane(s, r, 1.0) && d < best.0 {
                best = (d, Some(i));
            }
        }
        best.1.unwrap_or_else(|| self.closest_lane(p, heading))
    }
}

/// Sizes of the highway-with-on-ramp scenario (highway-env's `merge-v0` road, generalised):
/// `lanes` straight main lanes `lane_width` apart from x = 0 to `length`; an on-ramp that runs
/// parallel `ramp_offset` m beyond the outermost lane for `approach` m, bends in over
/// `converge` m (highway-env's sine lane), then runs beside the outermost main lane for `merge`
/// m and ends in a barrier.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MergeLayout {
    /// Main lanes (>= 1).
    pub lanes: usize,
    /// Lane width (m).
    pub lane_width: f64,
    /// Main road length (m).
    pub length: f64,
    /// Straight ramp before it bends in (m).
    pub approach: f64,
    /// Length of the bend (m).
    pub converge: f64,
    /// Length of the merge lane beside the main road (m).
    pub merge: f64,
    /// Lateral distance of the straight ramp from the merge lane's centre (m).
    pub ramp_offset: f64,
}

impl Default for MergeLayout {
    /// highway-env's merge-v0 sizes: 2 lanes of 4 m, 150 m approach, 80 m bend, 80 m merge,
    /// the ramp 6.5 m out (2 x the 3.25 m sine amplitude).
    fn default() -> Self {
        Self {
            lanes: 2,
            lane_width: 4.0,
            length: 460.0,
            approach: 150.0,
            converge: 80.0,
            merge: 80.0,
            ramp_offset: 6.5,
        }
    }
}

impl MergeLayout {
    /// Where the merge lane ends (x, m).
    pub fn merge_end(&self) -> f64 {
        self.approach + self.converge + self.merge
    }

    /// The lanes: `main-0` .. `main-{lanes-1}` (y = 0, lane_width, ...), then `ramp` (straight
    /// and bend, one polyline sampled every 2 m in the bend) and `merge` (beside the outermost
    /// main lane, ending in a barrier).
    pub fn specs(&self) -> Vec<LaneSpec> {
        let w = self.lane_width;
        let n = self.lanes;
        let mut specs: Vec<LaneSpec> = (0..n)
            .map(|i| LaneSpec {
                name: format!("main-{i}"),
                points: vec![[0.0, i as f64 * w], [self.length, i as f64 * w]],
                width: w,
                next: Vec::new(),
                left: (i > 0).then(|| format!("main-{}", i - 1)),
                right: (i + 1 < n).then(|| format!("main-{}", i + 1)),
                ends: false,
                priority: 0,
            })
            .collect();
        // highway-env's SineLane from the end of the straight ramp: offset
        // a * sin(pi * t / (2 * converge) + pi / 2) - a from the merge lane's line, so it
        // leaves the straight part level and meets the merge lane level.
        let y_merge = n as f64 * w;
        let amplitude = self.ramp_offset / 2.0;
        let mut ramp = vec![[0.0, y_merge + self.ramp_offset]];
        let steps = (self.converge / 2.0).ceil().max(1.0) as usize;
        for k in 0..=steps {
            let t = self.converge * k as f64 / steps as f64;
            let phase = std::f64::consts::PI * t / self.converge + std::f64::consts::FRAC_PI_2;
            ramp.push([
                self.approach + t,
                y_merge + amplitude + amplitude * phase.sin(),
            ]);
        }
        specs.push(LaneSpec {
            name: "ramp".into(),
            points: ramp,
            width: w,
            next: vec!["merge".into()],
            left: None,
            right: None,
            ends: false,
            priority: 0,
        });
        let x0 = self.approach + self.converge;
        specs.push(LaneSpec {
            name: "merge".into(),
            points: vec![[x0, y_merge], [self.merge_end(), y_merge]],
            width: w,
            next: Vec::new(),
            left: Some(format!("main-{}", n - 1)),
            right: None,
            ends: true,
            priority: 0,
        });
        specs
    }
}

/// [`arm_point`]'s side of an incoming lane (travelling towards the centre).
const IN: bool = true;
/// [`arm_point`]'s side of an outgoing lane (travelling away from the centre).
const OUT: bool = false;

/// The centre-line point `along` m from a junction's centre on the arm with unit vector `u`, on
/// the lane of `width` m that travels in (`IN`) or out (`OUT`): right-hand traffic keeps to the
/// right of travel, which for a direction d is (-d_y, d_x) in this frame.
fn arm_point(u: [f64; 2], along: f64, width: f64, incoming: bool) -> [f64; 2] {
    let side = if incoming {
        [u[1], -u[0]]
    } else {
        [-u[1], u[0]]
    };
    [
        u[0] * along + side[0] * width / 2.0,
        u[1] * along + side[1] * width / 2.0,
    ]
}

/// A junction lane: no side neighbours, no barrier.
fn junction_lane(
    name: String,
    points: Vec<[f64; 2]>,
    width: f64,
    priority: i32,
    next: Vec<String>,
) -> LaneSpec {
    LaneSpec {
        name,
        points,
        width,
        next,
        left: None,
        right: None,
        ends: false,
        priority,
    }
}

/// A cubic Bezier curve from `p0`, leaving along the unit direction `d0`, to `p3`, arriving
/// along `d3`, with handles `handle` m long; sampled at one point per metre of chord (at least
/// 5 points).
fn bezier(p0: [f64; 2], d0: [f64; 2], p3: [f64; 2], d3: [f64; 2], handle: f64) -> Vec<[f64; 2]> {
    let p1 = [p0[0] + d0[0] * handle, p0[1] + d0[1] * handle];
    let p2 = [p3[0] - d3[0] * handle, p3[1] - d3[1] * handle];
    let n = (p3[0] - p0[0]).hypot(p3[1] - p0[1]).ceil().max(4.0) as usize;
    (0..=n)
        .map(|i| {
            let t = i as f64 / n as f64;
            let m = 1.0 - t;
            let b = [m * m * m, 3.0 * m * m * t, 3.0 * m * t * t, t * t * t];
            [
                b[0] * p0[0] + b[1] * p1[0] + b[2] * p2[0] + b[3] * p3[0],
                b[0] * p0[1] + b[1] * p1[1] + b[2] * p2[1] + b[3] * p3[1],
            ]
        })
        .collect()
}

/// The four arms of a [`IntersectionLayout`], counter-clockwise on screen (y grows
/// downwards): east, north, west, south. Each arm's unit vector points from the centre out.
pub const ARMS: [(&str, [f64; 2]); 4] = [
    ("e", [1.0, 0.0]),
    ("n", [0.0, -1.0]),
    ("w", [-1.0, 0.0]),
    ("s", [0.0, 1.0]),
];

/// Where a route through an intersection turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Turn {
    /// To the arm on the right.
    Right,
    /// To the opposite arm.
    Straight,
    /// To the arm on the left.
    Left,
}

impl Turn {
    /// All three, in this order.
    pub const ALL: [Turn; 3] = [Turn::Right, Turn::Straight, Turn::Left];

    /// Quarter turns round a roundabout before the exit: 1, 2 or 3.
    pub fn quarters(self) -> usize {
        self as usize + 1
    }

    /// The arm (index into [`ARMS`]) a vehicle entering from arm `from` leaves by.
    pub fn exit_arm(self, from: usize) -> usize {
        // Entering from the east (driving west), the arm on the right is the north one: the
        // next in ARMS' counter-clockwise order.
        match self {
            Turn::Right => (from + 1) % 4,
            Turn::Straight => (from + 2) % 4,
            Turn::Left => (from + 3) % 4,
        }
    }
}

/// A four-way intersection of two roads with one lane each way (right-hand traffic), in the
/// road frame of the other scenarios (y grows to the right of travel along +x, so downwards on
/// screen): arms east, north, west and south (`ARMS`), each with an incoming lane `{arm}-in`
/// that ends at the junction box and an outgoing lane `{arm}-out` that starts there, and a
/// connector `{from}>{to}` from every incoming lane to the outgoing lanes of the three other
/// arms (cubic Bezier curves tangent to both, sampled every ~1 m). The east-west road has
/// priority: its incoming lanes and connectors priority 2, the north-south road's 1, and the
/// outgoing lanes 3 (a vehicle leaving the junction never yields).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IntersectionLayout {
    /// Lane width (m).
    pub lane_width: f64,
    /// Half the side of the junction box (m): incoming lanes end and outgoing lanes start this
    /// far from the centre.
    pub half: f64,
    /// Length of each arm's lanes outside the box (m).
    pub approach: f64,
}

impl Default for IntersectionLayout {
    /// Lanes 4 m wide, a 24 m junction box (right turns of radius ~10 m, left ones ~14 m),
    /// arms 120 m long.
    fn default() -> Self {
        Self {
            lane_width: 4.0,
            half: 12.0,
            approach: 120.0,
        }
    }
}

impl IntersectionLayout {
    /// Name of the incoming lane of arm `arm`.
    pub fn incoming(arm: usize) -> String {
        format!("{}-in", ARMS[arm].0)
    }

    /// Name of the outgoing lane of arm `arm`.
    pub fn outgoing(arm: usize) -> String {
        format!("{}-out", ARMS[arm].0)
    }

    /// Name of the connector from arm `from` to arm `to`.
    pub fn connector(from: usize, to: usize) -> String {
        format!("{}>{}", ARMS[from].0, ARMS[to].0)
    }

    /// Whether arm `arm` belongs to the priority (east-west) road.
    pub fn major(arm: usize) -> bool {
        arm.is_multiple_of(2)
    }

    /// The lanes of a route from arm `from` turning `turn`: incoming, connector, outgoing.
    pub fn route(road: &Road, from: usize, turn: Turn) -> Vec<usize> {
        let to = turn.exit_arm(from);
        [
            Self::incoming(from),
            Self::connector(from, to),
            Self::outgoing(to),
        ]
        .iter()
        .map(|n| {
            road.lane_named(n)
                .expect("the intersection has every route")
        })
        .collect()
    }

    /// The lanes (module docs of [`IntersectionLayout`]).
    pub fn specs(&self) -> Vec<LaneSpec> {
        let (w, h, l) = (self.lane_width, self.half, self.approach);
        let lane = |name, points, priority, next| junction_lane(name, points, w, priority, next);
        let mut specs = Vec::new();
        for (arm, &(_, u)) in ARMS.iter().enumerate() {
            let priority = if Self::major(arm) { 2 } else { 1 };
            let next = Turn::ALL
                .iter()
                .map(|t| Self::connector(arm, t.exit_arm(arm)))
                .collect();
            specs.push(lane(
                Self::incoming(arm),
                vec![arm_point(u, h + l, w, IN), arm_point(u, h, w, IN)],
                priority,
                next,
            ));
            specs.push(lane(
                Self::outgoing(arm),
                vec![arm_point(u, h, w, OUT), arm_point(u, h + l, w, OUT)],
                3,
                Vec::new(),
            ));
        }
        for (from, &(_, u)) in ARMS.iter().enumerate() {
            let priority = if Self::major(from) { 2 } else { 1 };
            for turn in Turn::ALL {
                let to = turn.exit_arm(from);
                let v = ARMS[to].1;
                let p0 = arm_point(u, h, w, IN);
                let p3 = arm_point(v, h, w, OUT);
                let chord = (p3[0] - p0[0]).hypot(p3[1] - p0[1]);
                let points = if turn == Turn::Straight {
                    vec![p0, p3]
                } else {
                    // A quarter circle of radius chord / sqrt 2, approximated by the usual
                    // cubic with handles 0.5523 x the radius along the end headings.
                    let k = 0.5523 * chord / std::f64::consts::SQRT_2;
                    bezier(p0, [-u[0], -u[1]], p3, v, k)
                };
                specs.push(lane(
                    Self::connector(from, to),
                    points,
                    priority,
                    vec![Self::outgoing(to)],
                ));
            }
        }
        specs
    }
}

/// A single-lane roundabout (right-hand traffic: vehicles circle counter-clockwise on screen)
/// with four arms, in the frame of [`IntersectionLayout`] and with its arms ([`ARMS`]): each
/// arm's incoming lane `{arm}-in` ends `entry_start` m from the centre, where the entry
/// `{arm}-entry` curves onto the ring `spread` radians past the arm's axis; the exit
/// `{arm}-exit` leaves the ring `spread` radians before it and curves onto the outgoing lane
/// `{arm}-out`. The ring is cut at those points into `ring-{arm}` (from the arm's exit to its
/// entry, past the arm) and `ring-{arm}>{next}` (from its entry to the next arm's exit), arcs
/// sampled every ~2 m. Ring lanes have priority 2 (vehicles on the ring go first), entries and
/// incoming lanes 1, exits and outgoing lanes 3.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundaboutLayout {
    /// Lane width (m).
    pub lane_width: f64,
    /// Radius of the ring's centre line (m).
    pub radius: f64,
    /// Angle (rad) between an arm's axis and where its entry joins (and its exit leaves) the
    /// ring.
    pub spread: f64,
    /// Distance from the centre where incoming lanes end and outgoing lanes start (m).
    pub entry_start: f64,
    /// Length of each arm's lanes outside that (m).
    pub approach: f64,
}

impl Default for RoundaboutLayout {
    /// A 20 m ring (highway-env's roundabout-v0 has 20 and 24 m lanes), entries 25 degrees off
    /// the axes, arms from 36 m out and 120 m long.
    fn default() -> Self {
        Self {
            lane_width: 4.0,
            radius: 20.0,
            spread: 15f64.to_radians(),
            entry_start: 28.0,
            approach: 120.0,
        }
    }
}

impl RoundaboutLayout {
    /// The arm after `arm` going round (counter-clockwise on screen).
    pub fn next_arm(arm: usize) -> usize {
        (arm + 1) % 4
    }

    /// The lanes of a route from arm `from` leaving `quarters` arms later (1: the arm on the
    /// right, 2: straight on, 3: the arm on the left).
    pub fn route(road: &Road, from: usize, quarters: usize) -> Vec<usize> {
        let arm = |k: usize| ARMS[k].0;
        let mut names = vec![format!("{}-in", arm(from)), format!("{}-entry", arm(from))];
        let mut at = from;
        for q in 0..quarters.clamp(1, 3) {
            let next = Self::next_arm(at);
            names.push(format!("ring-{}>{}", arm(at), arm(next)));
            if q + 1 < quarters.clamp(1, 3) {
                names.push(format!("ring-{}", arm(next)));
            }
            at = next;
        }
        names.push(format!("{}-exit", arm(at)));
        names.push(format!("{}-out", arm(at)));
        names
            .iter()
            .map(|n| road.lane_named(n).expect("the roundabout has every route"))
            .collect()
    }

    /// The lanes (module docs of [`RoundaboutLayout`]).
    pub fn specs(&self) -> Vec<LaneSpec> {
        let (w, r) = (self.lane_width, self.radius);
        // Arm k's axis angle, and the ring's point and travel direction at angle t: going
        // round counter-clockwise on screen (y down) means decreasing t.
        let axis = |k: usize| ARMS[k].1[1].atan2(ARMS[k].1[0]);
        let ring_point = |t: f64| [r * t.cos(), r * t.sin()];
        let ring_dir = |t: f64| [t.sin(), -t.cos()];
        let arc = |from: f64, to: f64| {
            // from > to, decreasing.
            let n = ((from - to) * r / 2.0).ceil().max(2.0) as usize;
            (0..=n)
                .map(|i| ring_point(from + (to - from) * i as f64 / n as f64))
                .collect::<Vec<_>>()
        };
        // Entries and exits: cubics with handles a third of the chord.
        let curve = |p0: [f64; 2], d0: [f64; 2], p3: [f64; 2], d3: [f64; 2]| {
            bezier(p0, d0, p3, d3, (p3[0] - p0[0]).hypot(p3[1] - p0[1]) / 3.0)
        };
        let lane = |name, points, priority, next| junction_lane(name, points, w, priority, next);
        let mut specs = Vec::new();
        for (k, &(name, u)) in ARMS.iter().enumerate() {
            let next = ARMS[Self::next_arm(k)].0;
            let at = |along: f64, side: bool| arm_point(u, along, w, side);
            let (a, l) = (self.entry_start, self.approach);
            let (t_entry, t_exit) = (axis(k) - self.spread, axis(k) + self.spread);
            specs.push(lane(
                format!("{name}-in"),
                vec![at(a + l, IN), at(a, IN)],
                1,
                vec![format!("{name}-entry")],
            ));
            specs.push(lane(
                format!("{name}-entry"),
                curve(
                    at(a, IN),
                    [-u[0], -u[1]],
                    ring_point(t_entry),
                    ring_dir(t_entry),
                ),
                1,
                vec![format!("ring-{name}>{next}")],
            ));
            specs.push(lane(
                format!("ring-{name}"),
                arc(t_exit, t_entry),
                2,
                vec![format!("ring-{name}>{next}")],
            ));
            // The next arm's exit lies a quarter turn on (decreasing angle).
            let t_next_exit = axis(k) - std::f64::consts::FRAC_PI_2 + self.spread;
            specs.push(lane(
                format!("ring-{name}>{next}"),
                arc(t_entry, t_next_exit),
                2,
                vec![format!("ring-{next}"), format!("{next}-exit")],
            ));
            specs.push(lane(
                format!("{name}-exit"),
                curve(ring_point(t_exit), ring_dir(t_exit), at(a, OUT), u),
                3,
                vec![format!("{name}-out")],
            ));
            specs.push(lane(
                format!("{name}-out"),
                vec![at(a, OUT), at(a + l, OUT)],
                3,
                Vec::new(),
            ));
        }
        specs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn straight(name: &str, from: [f64; 2], to: [f64; 2]) -> LaneSpec {
        LaneSpec {
            name: name.into(),
            points: vec![from, to],
            width: 4.0,
            next: vec![],
            left: None,
            right: None,
            ends: false,
            priority: 0,
        }
    }

    /// [`Lane::local`] measuring every segment with `hypot`, as it was first written.
    fn local_measuring_every_segment(lane: &Lane, p: [f64; 2]) -> (f64, f64) {
        let n = lane.points.len() - 1;
        let mut best = (f64::INFINITY, 0.0, 0.0);
        for i in 0..n {
            let (a, b) = (lane.points[i], lane.points[i + 1]);
            let len = lane.cumulative[i + 1] - lane.cumulative[i];
            let d = [(b[0] - a[0]) / len, (b[1] - a[1]) / len];
            let (dx, dy) = (p[0] - a[0], p[1] - a[1]);
            let along = dx * d[0] + dy * d[1];
            let r = -dx * d[1] + dy * d[0];
            let lo = if i == 0 { f64::NEG_INFINITY } else { 0.0 };
            let hi = if i + 1 == n { f64::INFINITY } else { len };
            let t = along.clamp(lo, hi);
            let dist = (along - t).abs().hypot(r);
            if dist < best.0 {
                best = (dist, lane.cumulative[i] + t, r);
            }
        }
        (best.1, best.2)
    }

    /// The shortcuts of the projection change no result: `local` (the squared distance
    /// picking the segments to measure) equals measuring every segment, bit for bit, and
    /// `local_on_lane` (the bounding box) equals `on_lane` of `local`, on the shipped roads
    /// and on lanes with sharp corners (80 degrees, under the box's limit; 90 and 150, over
    /// it), at points scattered around each lane and on segment ends, corners and ties.
    #[test]
    fn projection_shortcuts_equal_measuring_every_segment() {
        use rand::Rng as _;
        let mut sharp = Vec::new();
        for (k, deg) in [80.0f64, 90.0, 150.0].into_iter().enumerate() {
            let a = deg.to_radians();
            let mut spec = straight(&format!("sharp{k}"), [0.0, 0.0], [10.0, 0.0]);
            spec.points.push([10.0 + 8.0 * a.cos(), 8.0 * a.sin()]);
            spec.points
                .push([10.0 + 8.0 * a.cos() + 6.0, 8.0 * a.sin() + 1.0]);
            sharp.push(spec);
        }
        let roads = [
            Road::new(&MergeLayout::default().specs()).unwrap(),
            Road::new(&IntersectionLayout::default().specs()).unwrap(),
            Road::new(&RoundaboutLayout::default().specs()).unwrap(),
            Road::new(&sharp).unwrap(),
        ];
        assert_eq!(
            roads[3]
                .lanes
                .iter()
                .map(|l| l.corner_reach.is_some())
                .collect::<Vec<_>>(),
            [true, false, false]
        );
        let mut rng = diffrl_core::seeding::rng(7);
        let (mut points, mut on) = (0, 0);
        for road in &roads {
            for lane in &road.lanes {
                let [x0, y0, x1, y1] = lane.bounds;
                let mut probe = |p: [f64; 2]| {
                    let (s, r) = lane.local(p);
                    let (s0, r0) = local_measuring_every_segment(lane, p);
                    assert_eq!(
                        (s.to_bits(), r.to_bits()),
                        (s0.to_bits(), r0.to_bits()),
                        "{} at {p:?}",
                        lane.name
                    );
                    for margin in [0.0, 1.0] {
                        let want = lane.on_lane(s0, r0, margin).then_some((s0, r0));
                        assert_eq!(
                            lane.local_on_lane(p, margin),
                            want,
                            "{} at {p:?}",
                            lane.name
                        );
                        on += usize::from(want.is_some());
                    }
                    points += 1;
                };
                for _ in 0..2_000 {
                    probe([
                        rng.random_range(x0 - 40.0..x1 + 40.0),
                        rng.random_range(y0 - 40.0..y1 + 40.0),
                    ]);
                }
                for (i, q) in lane.points.iter().enumerate() {
                    probe(*q);
                    if let Some(next) = lane.points.get(i + 1) {
                        probe([(q[0] + next[0]) / 2.0, (q[1] + next[1]) / 2.0]);
                    }
                }
                probe([f64::NAN, 0.0]);
                probe([0.0, f64::INFINITY]);
            }
        }
        // The scattered points reach both answers.
        assert!(
            on > points / 20 && on < points,
            "{on} of {points} on a lane"
        );
    }

    #[test]
    fn local_coordinates_round_trip_on_a_bent_lane() {
        let mut spec = straight("a", [0.0, 0.0], [10.0, 0.0]);
        spec.points.push([10.0, 10.0]);
        let road = Road::new(&[spec]).unwrap();
        let lane = &road.lanes[0];
        assert_eq!(lane.length(), 20.0);
        for (s, r) in [(3.0, 1.0), (15.0, -1.5), (-4.0, 0.5), (25.0, 1.0)] {
            let p = lane.position(s, r);
            let (s2, r2) = lane.local(p);
            assert!(
                (s - s2).abs() < 1e-9 && (r - r2).abs() < 1e-9,
                "{s} {r} -> {s2} {r2}"
            );
        }
        // highway-env's sign: on a lane along +x, larger y is a positive offset.
        assert!(lane.local([5.0, 1.0]).1 > 0.0);
        assert!((lane.heading_at(15.0) - std::f64::consts::FRAC_PI_2).abs() < 1e-12);
    }

    #[test]
    fn the_merge_road_connects_and_its_ramp_meets_the_merge_lane() {
        let layout = MergeLayout::default();
        let road = Road::new(&layout.specs()).unwrap();
        let ramp = &road.lanes[road.lane_named("ramp").unwrap()];
        let merge = road.lane_named("merge").unwrap();
        assert_eq!(ramp.next, vec![merge]);
        let end = ramp.points[ramp.points.len() - 1];
        assert!((end[1] - 8.0).abs() < 1e-9, "{end:?}");
        assert!((ramp.points[0][1] - 14.5).abs() < 1e-9);
        assert!(road.on_road([100.0, 14.5]) && !road.on_road([100.0, 10.0]));
        assert!(!road.on_road([layout.merge_end() + 1.0, 8.0]));
        assert_eq!(road.closest_lane([50.0, 3.9], 0.0), 1);
    }

    /// The intersection: 4 incoming, 4 outgoing lanes and 12 connectors, every route there,
    /// lanes meeting their successors and turning smoothly (no kink above 10 degrees between
    /// consecutive segments of a route), right turns the shortest way through.
    #[test]
    fn the_intersection_connects_every_arm_to_the_three_others_smoothly() {
        let layout = IntersectionLayout::default();
        let road = Road::new(&layout.specs()).unwrap();
        assert_eq!(road.lanes.len(), 20);
        for from in 0..4 {
            let mut lengths = Vec::new();
            for turn in Turn::ALL {
                let route = IntersectionLayout::route(&road, from, turn);
                let connector = &road.lanes[route[1]];
                lengths.push(connector.length());
                let mut points: Vec<[f64; 2]> = Vec::new();
                for &l in &route {
                    points.extend(&road.lanes[l].points);
                }
                points.dedup_by(|a, b| (a[0] - b[0]).hypot(a[1] - b[1]) < 1e-9);
                for w in points.windows(3) {
                    let h0 = (w[1][1] - w[0][1]).atan2(w[1][0] - w[0][0]);
                    let h1 = (w[2][1] - w[1][1]).atan2(w[2][0] - w[1][0]);
                    let kink = wrap_to_pi(h1 - h0).abs().to_degrees();
                    assert!(kink < 10.0, "{}: {kink} degrees", connector.name);
                }
                let turned = wrap_to_pi(
                    road.lanes[route[2]].heading_at(0.0) - road.lanes[route[0]].heading_at(0.0),
                );
                let expected = match turn {
                    // y grows downwards on screen: a right (clockwise) turn is a positive
                    // rotation here.
                    Turn::Right => std::f64::consts::FRAC_PI_2,
                    Turn::Straight => 0.0,
                    Turn::Left => -std::f64::consts::FRAC_PI_2,
                };
                assert!((turned - expected).abs() < 1e-9, "{}", connector.name);
            }
            assert!(
                lengths[0] < lengths[2] && lengths[0] < lengths[1],
                "{lengths:?}"
            );
            let major = road.lanes[road
                .lane_named(&IntersectionLayout::incoming(from))
                .unwrap()]
            .priority;
            assert_eq!(major, if from % 2 == 0 { 2 } else { 1 });
        }
        let route = IntersectionLayout::route(&road, 0, Turn::Straight);
        let (p, heading) = road.along_route(&route, road.route_offset(&route, 1) + 12.0);
        assert!(p[0].abs() < 1e-9 && (p[1] + 2.0).abs() < 1e-9, "{p:?}");
        assert!((heading.abs() - std::f64::consts::PI).abs() < 1e-9);
    }

    /// The roundabout: 6 lanes per arm, every route from every arm to the 1st, 2nd and 3rd
    /// exit (the arm on the right, straight on, on the left), each lane starting where the
    /// previous one ends and leaving by the arm it names; the ring lies at its radius.
    #[test]
    fn the_roundabout_routes_every_arm_to_each_exit() {
        let layout = RoundaboutLayout::default();
        let road = Road::new(&layout.specs()).unwrap();
        assert_eq!(road.lanes.len(), 24);
        for from in 0..4 {
            for turn in Turn::ALL {
                let route = RoundaboutLayout::route(&road, from, turn.quarters());
                for w in route.windows(2) {
                    assert!(road.lanes[w[0]].next.contains(&w[1]));
                }
                let exit = &road.lanes[*route.last().unwrap()].name;
                let to = turn.exit_arm(from);
                assert_eq!(exit, &IntersectionLayout::outgoing(to), "{from} {turn:?}");
            }
        }
        for lane in road.lanes.iter().filter(|l| l.name.starts_with("ring")) {
            assert_eq!(lane.priority, 2);
            for p in &lane.points {
                assert!((p[0].hypot(p[1]) - layout.radius).abs() < 1e-9);
            }
        }
    }

    #[test]
    fn bad_roads_are_refused_naming_the_lane() {
        let ok = straight("a", [0.0, 0.0], [10.0, 0.0]);
        let cases: Vec<(Vec<LaneSpec>, &str)> = vec![
            (vec![], "no lanes"),
            (vec![ok.clone(), ok.clone()], "two lanes are called \"a\""),
            (
                vec![LaneSpec {
                    width: 0.0,
                    ..ok.clone()
                }],
                "width 0",
            ),
            (
                vec![LaneSpec {
                    points: vec![[0.0, 0.0]],
                    ..ok.clone()
                }],
                "1 centre-line point",
            ),
            (
                vec![LaneSpec {
                    points: vec![[0.0, 0.0], [0.0, 0.0]],
                    ..ok.clone()
                }],
                "points 0 and 1 coincide",
            ),
            (
                vec![LaneSpec {
                    points: vec![[0.0, f64::NAN], [1.0, 0.0]],
                    ..ok.clone()
                }],
                "point 0 is [0.0, NaN]",
            ),
            (
                vec![LaneSpec {
                    next: vec!["b".into()],
                    ..ok.clone()
                }],
                "its next \"b\" is not a lane",
            ),
            (
                vec![
                    LaneSpec {
                        next: vec!["b".into()],
                        ..ok.clone()
                    },
                    straight("b", [20.0, 0.0], [30.0, 0.0]),
                ],
                "ends 10.00 m from the start of its successor \"b\"",
            ),
            (
                vec![LaneSpec {
                    left: Some("a".into()),
                    ..ok.clone()
                }],
                "names itself as its left",
            ),
        ];
        for (specs, want) in cases {
            let e = Road::new(&specs).unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
    }
}
