//! Push-T as a [`Scene2d`] for viewers: the walls, the goal T (outline), the block T (filled)
//! and the agent disc, in the arena's pixel frame (512 x 512, y down) and gym-pusht's colours
//! (the same as [`render`](crate::render)). With pixel observations the scene carries the
//! image the policy sees. Actions are target points in this frame.

use diffrl_core::ImageObs;
use diffrl_core::scene::{Rgba, Scene2d, Shape2d};

use crate::env::{ObsMode, PushT};
use crate::geometry::{GOAL, OUTLINE, Pose};
use crate::physics::AGENT_RADIUS;

/// Arena side in pixels.
const ARENA: f32 = 512.0;
const WALL: Rgba = [211, 211, 211, 255];
const GOAL_GREEN: Rgba = [144, 238, 144, 255];
const BLOCK_GREY: Rgba = [119, 136, 153, 255];
const AGENT_BLUE: Rgba = [65, 105, 225, 255];

fn t_outline(pose: &Pose) -> Vec<[f32; 2]> {
    OUTLINE
        .iter()
        .map(|&p| {
            let [x, y] = pose.apply(p);
            [x as f32, y as f32]
        })
        .collect()
}

/// The scene of `env`'s current state.
pub fn scene(env: &PushT) -> Scene2d {
    let mut s = Scene2d::new([[0.0, 0.0], [ARENA, ARENA]], true);
    s.actions_are_points = true;
    s.push(
        "walls",
        Shape2d::LineStrip {
            points: vec![
                [5.0, 5.0],
                [506.0, 5.0],
                [506.0, 506.0],
                [5.0, 506.0],
                [5.0, 5.0],
            ],
            color: WALL,
        },
    )
    .push(
        "goal",
        Shape2d::Polygon {
            points: t_outline(&GOAL),
            color: GOAL_GREEN,
            filled: false,
        },
    )
    .push(
        "block",
        Shape2d::Polygon {
            points: t_outline(&env.block_pose()),
            color: BLOCK_GREY,
            filled: true,
        },
    );
    let [ax, ay] = env.agent_pos();
    s.push(
        "agent",
        Shape2d::Circle {
            center: [ax as f32, ay as f32],
            radius: AGENT_RADIUS as f32,
            color: AGENT_BLUE,
        },
    );
    if env.config().obs == ObsMode::Pixels {
        let size = env.config().image_size;
        s.image = Some(ImageObs {
            height: size,
            width: size,
            data: env.render(size),
        });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use diffrl_core::Env;

    #[test]
    fn scene_places_block_agent_and_goal() {
        let mut env = PushT::builder().build();
        env.reset_to_state([100.0, 400.0, 300.0, 200.0, 0.0], 0)
            .unwrap();
        let s = env.scene().expect("Push-T draws a scene");
        let names: Vec<_> = s.items.iter().map(|i| i.name).collect();
        assert_eq!(names, ["walls", "goal", "block", "agent"]);
        assert!(s.y_down && s.actions_are_points && s.image.is_none());
        match &s.items[3].shape {
            Shape2d::Circle { center, radius, .. } => {
                assert_eq!(*center, [100.0, 400.0]);
                assert_eq!(*radius, 15.0);
            }
            other => panic!("agent is {other:?}"),
        }
        match &s.items[2].shape {
            Shape2d::Polygon { points, filled, .. } => {
                assert!(*filled);
                assert_eq!(points.len(), 8);
                let [bx, by] = env.block_pose().apply(OUTLINE[0]);
                assert_eq!(points[0], [bx as f32, by as f32]);
            }
            other => panic!("block is {other:?}"),
        }
        let px = PushT::builder().obs(ObsMode::Pixels).build();
        let img = px
            .scene()
            .unwrap()
            .image
            .expect("pixels mode carries its image");
        assert_eq!(
            (img.width, img.height, img.data.len()),
            (96, 96, 96 * 96 * 3)
        );
    }
}
