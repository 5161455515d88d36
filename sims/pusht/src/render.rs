//! Top-view rendering of the scene with tiny-skia (anti-aliased), in gym-pusht's colours:
//! white background, light-green goal T, slate-grey block, royal-blue agent, grey walls.
//! Drawn straight at the target size (gym-pusht draws at 512 and resizes with OpenCV).

use tiny_skia::{Color, FillRule, Paint, PathBuilder, Pixmap, Stroke, Transform};

use crate::geometry::{GOAL, OUTLINE, Pose};
use crate::physics::AGENT_RADIUS;

/// What to draw.
#[derive(Debug, Clone, Copy)]
pub struct Scene {
    /// Agent centre.
    pub agent: [f64; 2],
    /// Block pose.
    pub block: Pose,
    /// Goal pose.
    pub goal: Pose,
    /// RGB multipliers applied to every colour (image domain randomisation; 1 = none).
    pub tint: [f32; 3],
}

fn paint(rgb: [u8; 3], tint: [f32; 3]) -> Paint<'static> {
    let mut p = Paint::default();
    let c = |i: usize| ((rgb[i] as f32 * tint[i]).round().clamp(0.0, 255.0)) as u8;
    p.set_color_rgba8(c(0), c(1), c(2), 255);
    p.anti_alias = true;
    p
}

fn t_path(pose: &Pose) -> Option<tiny_skia::Path> {
    let mut pb = PathBuilder::new();
    for (i, &p) in OUTLINE.iter().enumerate() {
        let [x, y] = pose.apply(p);
        if i == 0 {
            pb.move_to(x as f32, y as f32);
        } else {
            pb.line_to(x as f32, y as f32);
        }
    }
    pb.close();
    pb.finish()
}

/// The untinted image of an observed state `[agent_x, agent_y, block_x, block_y, block_angle]`
/// (`obs = "state"`), as the environment renders it in that state: gives states recorded
/// without images (datasets, state rollouts) the pixels an image model reads. None unless the
/// state has 5 values.
pub fn render_state(state: &[f32], size: u32) -> Option<Vec<u8>> {
    let [ax, ay, bx, by, angle] = <[f32; 5]>::try_from(state).ok()?;
    let scene = Scene {
        agent: [f64::from(ax), f64::from(ay)],
        block: Pose::new(f64::from(bx), f64::from(by), f64::from(angle)),
        goal: GOAL,
        tint: [1.0; 3],
    };
    Some(render_rgb(&scene, size))
}

/// Renders `scene` as a `size x size` RGB8 image (row-major, HWC).
pub fn render_rgb(scene: &Scene, size: u32) -> Vec<u8> {
    let mut pm = Pixmap::new(size, size).expect("image size is positive");
    let t = scene.tint;
    pm.fill(Color::from_rgba8(
        (255.0 * t[0]).min(255.0) as u8,
        (255.0 * t[1]).min(255.0) as u8,
        (255.0 * t[2]).min(255.0) as u8,
        255,
    ));
    let s = size as f32 / 512.0;
    let tf = Transform::from_scale(s, s);

    let mut walls = PathBuilder::new();
    walls.move_to(5.0, 5.0);
    walls.line_to(506.0, 5.0);
    walls.line_to(506.0, 506.0);
    walls.line_to(5.0, 506.0);
    walls.close();
    if let Some(path) = walls.finish() {
        let stroke = Stroke {
            width: 4.0,
            ..Stroke::default()
        };
        pm.stroke_path(&path, &paint([211, 211, 211], t), &stroke, tf, None);
    }
    if let Some(goal) = t_path(&scene.goal) {
        pm.fill_path(
            &goal,
            &paint([144, 238, 144], t),
            FillRule::Winding,
            tf,
            None,
        );
    }
    if let Some(block) = t_path(&scene.block) {
        pm.fill_path(
            &block,
            &paint([142, 163, 183], t),
            FillRule::Winding,
            tf,
            None,
        );
        let stroke = Stroke {
            width: 2.0,
            ..Stroke::default()
        };
        pm.stroke_path(&block, &paint([119, 136, 153], t), &stroke, tf, None);
    }
    let [ax, ay] = scene.agent;
    for (r, rgb) in [
        (AGENT_RADIUS, [65, 105, 225]),
        (AGENT_RADIUS - 4.0, [78, 126, 255]),
    ] {
        if let Some(c) = PathBuilder::from_circle(ax as f32, ay as f32, r as f32) {
            pm.fill_path(&c, &paint(rgb, t), FillRule::Winding, tf, None);
        }
    }
    // Opaque pixmap: premultiplied RGBA equals RGBA; drop alpha.
    pm.data()
        .chunks_exact(4)
        .flat_map(|p| [p[0], p[1], p[2]])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::GOAL;

    #[test]
    fn renders_agent_block_and_goal_where_they_are() {
        let scene = Scene {
            agent: [100.0, 400.0],
            block: Pose::new(380.0, 120.0, 0.0),
            goal: GOAL,
            tint: [1.0; 3],
        };
        let img = render_rgb(&scene, 96);
        assert_eq!(img.len(), 96 * 96 * 3);
        let px = |x: f64, y: f64| {
            let (c, r) = ((x * 96.0 / 512.0) as usize, (y * 96.0 / 512.0) as usize);
            let i = (r * 96 + c) * 3;
            [img[i], img[i + 1], img[i + 2]]
        };
        assert_eq!(px(100.0, 400.0), [78, 126, 255], "agent centre");
        let [gx, gy] = GOAL.apply([0.0, 70.0]);
        assert_eq!(px(gx, gy), [144, 238, 144], "goal T stem");
        assert_eq!(px(380.0, 135.0), [142, 163, 183], "block bar");
        assert_eq!(px(200.0, 460.0), [255, 255, 255], "background");
    }
}
