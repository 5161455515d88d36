//! The bird's-eye raster: an RGB image of a square window of the road, the option of
//! `[env] raster` beside the agent-centric vectors (docs/driving.md, "The bird's-eye raster").
//! Red marks the drivable area (the lanes' polygons), green the controlled agents' boxes and
//! blue the background vehicles' boxes; image rows follow the road frame's y (to the right of
//! travel), columns its x.

use crate::kinematics::{LENGTH, WIDTH};
use crate::road::Road;
use crate::traffic::{Driver, Traffic};

/// Metres per cell of the drivable-area mask sampled by the raster.
const MASK_CELL: f64 = 0.25;

/// Which points of a road's bounding box lie on a lane, on a grid of [`MASK_CELL`] cells, built
/// once per road so a raster costs a lookup per pixel.
#[derive(Debug, Clone)]
pub struct RoadMask {
    origin: [f64; 2],
    columns: usize,
    rows: usize,
    on: Vec<bool>,
}

impl RoadMask {
    /// The mask of `road` (the centre of each cell tested with [`Road::on_road`]).
    pub fn new(road: &Road) -> Self {
        let (mut lo, mut hi) = ([f64::INFINITY; 2], [f64::NEG_INFINITY; 2]);
        for lane in &road.lanes {
            let n = (lane.length() / 2.0).ceil().max(1.0) as usize;
            for i in 0..=n {
                for side in [-0.5, 0.5] {
                    let p = lane.position(lane.length() * i as f64 / n as f64, side * lane.width);
                    for k in 0..2 {
                        lo[k] = lo[k].min(p[k]);
                        hi[k] = hi[k].max(p[k]);
                    }
                }
            }
        }
        let origin = [lo[0] - 1.0, lo[1] - 1.0];
        let columns = ((hi[0] - lo[0] + 2.0) / MASK_CELL).ceil() as usize;
        let rows = ((hi[1] - lo[1] + 2.0) / MASK_CELL).ceil() as usize;
        let mut on = Vec::with_capacity(rows * columns);
        for r in 0..rows {
            for c in 0..columns {
                let p = [
                    origin[0] + (c as f64 + 0.5) * MASK_CELL,
                    origin[1] + (r as f64 + 0.5) * MASK_CELL,
                ];
                on.push(road.on_road(p));
            }
        }
        Self {
            origin,
            columns,
            rows,
            on,
        }
    }

    /// Whether the cell holding `p` lies on a lane (false outside the road's bounding box).
    pub fn on(&self, p: [f64; 2]) -> bool {
        let c = (p[0] - self.origin[0]) / MASK_CELL;
        let r = (p[1] - self.origin[1]) / MASK_CELL;
        if c < 0.0 || r < 0.0 {
            return false;
        }
        let (c, r) = (c as usize, r as usize);
        c < self.columns && r < self.rows && self.on[r * self.columns + c]
    }
}

/// The raster of `traffic` on `mask`: `pixels` x `pixels` RGB bytes (row-major) of the square
/// window of side `side` m centred at `center`. A pixel is red where its centre is on the road,
/// green where a controlled agent's box covers part of it, blue where a background vehicle's
/// does.
pub fn raster(
    mask: &RoadMask,
    traffic: &Traffic,
    center: [f64; 2],
    side: f64,
    pixels: u32,
) -> Vec<u8> {
    let n = pixels as usize;
    let cell = side / n as f64;
    let corner = [center[0] - side / 2.0, center[1] - side / 2.0];
    let at = |i: usize, k: usize| corner[k] + (i as f64 + 0.5) * cell;
    let mut image = vec![0u8; n * n * 3];
    for r in 0..n {
        for c in 0..n {
            if mask.on([at(c, 0), at(r, 1)]) {
                image[(r * n + c) * 3] = 255;
            }
        }
    }
    // Boxes mark every pixel they cover part of, found by sampling each box at most half a
    // pixel (and half a metre) apart, so a car stays visible at any resolution.
    let step = cell.min(1.0) / 2.0;
    let (along_n, across_n) = (
        (LENGTH / step).ceil() as usize,
        (WIDTH / step).ceil() as usize,
    );
    for v in &traffic.vehicles {
        let channel = match v.driver {
            Driver::Agent(_) => 1,
            Driver::Idm => 2,
        };
        let (s, co) = v.state.heading.sin_cos();
        for i in 0..along_n {
            let a = LENGTH * ((i as f64 + 0.5) / along_n as f64 - 0.5);
            for j in 0..across_n {
                let b = WIDTH * ((j as f64 + 0.5) / across_n as f64 - 0.5);
                let p = [v.state.x + a * co - b * s, v.state.y + a * s + b * co];
                let (c, r) = ((p[0] - corner[0]) / cell, (p[1] - corner[1]) / cell);
                if (0.0..n as f64).contains(&c) && (0.0..n as f64).contains(&r) {
                    image[(r as usize * n + c as usize) * 3 + channel] = 255;
                }
            }
        }
    }
    image
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinematics::VehicleState;
    use crate::road::MergeLayout;
    use crate::traffic::Vehicle;

    fn pixel(image: &[u8], n: usize, r: usize, c: usize) -> [u8; 3] {
        let i = (r * n + c) * 3;
        [image[i], image[i + 1], image[i + 2]]
    }

    /// On the merge road (main lanes at y = 0 and 4, 4 m wide; the ramp's straight part at
    /// y = 14.5, 6.5 m beyond the merge lane's centre): a 40 m window of 40 pixels (1 m each)
    /// centred at (100, 2) shows the main lanes as red rows for y in -2..6 m and the ramp, an agent at (100.2, 0) heading along
    /// x as a green 5 x 2 box, a background car at (110, 4) blue, and nothing off the road.
    #[test]
    fn the_raster_draws_lanes_agents_and_traffic_where_they_are() {
        let layout = MergeLayout::default();
        let road = Road::new(&layout.specs()).unwrap();
        let mask = RoadMask::new(&road);
        let car = |x: f64, y: f64, driver| {
            let state = VehicleState {
                x,
                y,
                heading: 0.0,
                speed: 20.0,
            };
            Vehicle::new(&road, state, 25.0, driver)
        };
        let traffic = Traffic {
            vehicles: vec![
                car(100.2, 0.0, Driver::Agent(0)),
                car(110.0, 4.0, Driver::Idm),
            ],
        };
        let n = 40;
        let image = raster(&mask, &traffic, [100.0, 2.0], 40.0, n as u32);
        assert_eq!(image.len(), n * n * 3);
        // Row r covers y in [-18 + r, -17 + r): the main lanes span y = -2..6, rows 16..24;
        // the ramp y = 12.5..16.5, rows 31..=33 by their centres (30 and 34 touch its edges).
        for r in (0..n).filter(|r| ![30, 34].contains(r)) {
            let on = (16..24).contains(&r) || (31..=33).contains(&r);
            assert_eq!(pixel(&image, n, r, 5)[0] == 255, on, "row {r}");
        }
        // Column c covers x in [80 + c, 81 + c): the agent spans x 97.7..102.7 (columns
        // 17..=22) and y -1..1 (rows 17..=18).
        for (r, c) in [(17, 17), (18, 22), (17, 20)] {
            assert_eq!(pixel(&image, n, r, c), [255, 255, 0], "({r}, {c})");
        }
        for (r, c) in [(16, 20), (19, 20), (17, 16), (17, 23)] {
            assert_eq!(pixel(&image, n, r, c)[1], 0, "({r}, {c})");
        }
        assert_eq!(pixel(&image, n, 21, 30), [255, 0, 255]);
        assert_eq!(pixel(&image, n, 2, 20), [0, 0, 0]);
        let greens = image.chunks(3).filter(|p| p[1] == 255).count();
        assert_eq!(greens, 6 * 2);
        // At 5 m per pixel a car (5 x 2 m) still marks the pixels it touches.
        let coarse = raster(&mask, &traffic, [100.0, 2.0], 80.0, 16);
        let greens = coarse.chunks(3).filter(|p| p[1] == 255).count();
        assert!((1..=4).contains(&greens), "{greens}");
    }
}
