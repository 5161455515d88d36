//! The T block's shape, keypoints and goal coverage (exact polygon intersection, as gym-pusht
//! does with shapely).

use geo::{Area, BooleanOps, Coord, LineString, Polygon};

/// Block pose: position of the body origin (pixels) and angle (radians).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pose {
    /// Body origin x.
    pub x: f64,
    /// Body origin y.
    pub y: f64,
    /// Angle.
    pub angle: f64,
}

impl Pose {
    /// A pose.
    pub const fn new(x: f64, y: f64, angle: f64) -> Self {
        Self { x, y, angle }
    }

    /// Maps a point from the block frame to the world.
    pub fn apply(&self, p: [f64; 2]) -> [f64; 2] {
        let (s, c) = self.angle.sin_cos();
        [self.x + c * p[0] - s * p[1], self.y + s * p[0] + c * p[1]]
    }
}

/// The goal pose of gym-pusht.
pub const GOAL: Pose = Pose::new(256.0, 256.0, std::f64::consts::FRAC_PI_4);

/// The 8 keypoints in the block frame, in the order gym-pusht's `get_keypoints` returns them
/// (pymunk's vertex order of the bar (-60, 0)-(60, 30), then of the stem (-15, 30)-(15, 120)).
pub const KEYPOINTS: [[f64; 2]; 8] = [
    [-60.0, 0.0],
    [60.0, 0.0],
    [60.0, 30.0],
    [-60.0, 30.0],
    [-15.0, 30.0],
    [15.0, 30.0],
    [15.0, 120.0],
    [-15.0, 120.0],
];
/// The T outline as one simple polygon (counter-clockwise in a y-up frame).
pub const OUTLINE: [[f64; 2]; 8] = [
    [-60.0, 0.0],
    [60.0, 0.0],
    [60.0, 30.0],
    [15.0, 30.0],
    [15.0, 120.0],
    [-15.0, 120.0],
    [-15.0, 30.0],
    [-60.0, 30.0],
];
/// Area of the T (120 x 30 + 30 x 90).
pub const AREA: f64 = 6300.0;
/// Centre of gravity in the block frame (gym-pusht: mean of the two boxes' centroids).
pub const COG: [f64; 2] = [0.0, 45.0];
/// Radius around the centre of gravity that contains the whole T (the stem's far corners).
pub const BOUNDING_RADIUS: f64 = 76.5;

/// The T outline placed at `pose`.
pub fn t_polygon(pose: &Pose) -> Polygon<f64> {
    let ring: Vec<Coord<f64>> = OUTLINE
        .iter()
        .map(|&p| {
            let [x, y] = pose.apply(p);
            Coord { x, y }
        })
        .collect();
    Polygon::new(LineString::new(ring), vec![])
}

/// Fraction of the goal T covered by the block T: area(block ∩ goal) / area(T).
pub fn coverage(block: &Pose, goal: &Pose) -> f64 {
    // Disjoint bounding circles: no intersection, skip the polygon clipping.
    let [bx, by] = block.apply(COG);
    let [gx, gy] = goal.apply(COG);
    if (bx - gx).hypot(by - gy) >= 2.0 * BOUNDING_RADIUS {
        return 0.0;
    }
    let inter = t_polygon(block).intersection(&t_polygon(goal));
    (inter.unsigned_area() / AREA).clamp(0.0, 1.0)
}

/// Distance from point `p` to the T at `pose` (0 inside). The T is the union of the bar
/// (-60, 0)-(60, 30) and the stem (-15, 30)-(15, 120) in the block frame.
pub fn distance_to_t(pose: &Pose, p: [f64; 2]) -> f64 {
    let (s, c) = pose.angle.sin_cos();
    let (dx, dy) = (p[0] - pose.x, p[1] - pose.y);
    let (lx, ly) = (c * dx + s * dy, -s * dx + c * dy);
    let rect = |x0: f64, y0: f64, x1: f64, y1: f64| {
        let ex = (x0 - lx).max(0.0).max(lx - x1);
        let ey = (y0 - ly).max(0.0).max(ly - y1);
        ex.hypot(ey)
    };
    rect(-60.0, 0.0, 60.0, 30.0).min(rect(-15.0, 30.0, 15.0, 120.0))
}

/// The 8 corner keypoints in gym-pusht's order, flattened as [x0, y0, x1, y1, ...].
pub fn keypoints(pose: &Pose) -> [f64; 16] {
    let mut out = [0.0; 16];
    for (i, p) in KEYPOINTS.iter().enumerate() {
        let [x, y] = pose.apply(*p);
        out[2 * i] = x;
        out[2 * i + 1] = y;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_of_goal_is_one_and_far_is_zero() {
        let c = coverage(&GOAL, &GOAL);
        assert!((c - 1.0).abs() < 1e-9, "{c}");
        assert_eq!(coverage(&Pose::new(50.0, 50.0, 0.0), &GOAL), 0.0);
        let shifted = Pose::new(GOAL.x + 1.0, GOAL.y, GOAL.angle);
        let c = coverage(&shifted, &GOAL);
        assert!(c > 0.97 && c < 1.0, "{c}");
    }

    #[test]
    fn distance_to_t_is_zero_inside_and_exact_outside() {
        let p = Pose::new(200.0, 200.0, 0.0);
        assert_eq!(distance_to_t(&p, [200.0, 210.0]), 0.0);
        assert_eq!(distance_to_t(&p, [200.0, 150.0]), 50.0);
        assert_eq!(distance_to_t(&p, [200.0, 330.0]), 10.0);
        assert!(
            (distance_to_t(&p, [263.0, 234.0]) - 5.0).abs() < 1e-12,
            "(3, 4) off the bar corner"
        );
        let rotated = Pose::new(0.0, 0.0, std::f64::consts::FRAC_PI_2);
        assert!(
            (distance_to_t(&rotated, [-130.0, 0.0]) - 10.0).abs() < 1e-9,
            "stem tip points along -x"
        );
    }

    #[test]
    fn outline_area_matches_the_boxes() {
        assert!((t_polygon(&Pose::new(10.0, 20.0, 1.0)).unsigned_area() - AREA).abs() < 1e-9);
        for p in OUTLINE {
            assert!((p[0] - COG[0]).hypot(p[1] - COG[1]) <= BOUNDING_RADIUS);
        }
    }
}
