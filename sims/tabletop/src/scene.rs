//! The 3-D scene a viewer draws ([`Env::scene`](diffrl_core::Env::scene)): the table, each
//! arm link as its collision hulls' bounding box, the fingers, the cubes and the goal; the
//! TCP (the path the viewer traces), how actions map to TCP displacements, and in pixels mode
//! the policy's camera image ([`crate::pixels`]).

use diffrl_core::scene::{ActionPoints3d, Scene, Shape3d, Transform3d};
use rapier3d::na::Isometry3;

use crate::env::{ACTION_SCALE, Tabletop, TaskKind};
use crate::world::{BodyPose, CUBE_HALF, TABLE_CENTER_X, TABLE_HALF};

/// Entity names of the drawn links ([`crate::robot::ARM_LINKS`], then the fingers).
pub const LINK_NAMES: [&str; 11] = [
    "arm/link0",
    "arm/link1",
    "arm/link2",
    "arm/link3",
    "arm/link4",
    "arm/link5",
    "arm/link6",
    "arm/link7",
    "arm/hand",
    "arm/left_finger",
    "arm/right_finger",
];

fn transform(p: &Isometry3<f64>) -> Transform3d {
    let t = p.translation.vector;
    let r = p.rotation.coords;
    Transform3d {
        translation: [t.x as f32, t.y as f32, t.z as f32],
        rotation: [r.x as f32, r.y as f32, r.z as f32, r.w as f32],
    }
}

/// Adds the table.
pub(crate) fn push_table(s: &mut Scene) {
    s.push_body(
        "table",
        Shape3d::Box {
            half_extents: TABLE_HALF.map(|v| v as f32),
        },
        Transform3d::from_translation([TABLE_CENTER_X as f32, 0.0, -TABLE_HALF[2] as f32]),
        [180, 160, 130, 255],
    );
}

/// Adds the arm's links and fingers, each its box's centre pose and half-extents
/// ([`LINK_NAMES`] order).
pub(crate) fn push_links(s: &mut Scene, links: &[(Isometry3<f64>, [f64; 3])]) {
    for (i, (pose, half)) in links.iter().enumerate() {
        let color = if i >= 9 {
            [60, 60, 60, 255]
        } else {
            [235, 235, 235, 255]
        };
        s.push_body(
            LINK_NAMES[i],
            Shape3d::Box {
                half_extents: half.map(|v| v as f32),
            },
            transform(pose),
            color,
        );
    }
}

/// Adds the cubes of a `kind` task at `cubes`.
pub(crate) fn push_cubes(s: &mut Scene, kind: TaskKind, cubes: &[BodyPose]) {
    let (names, colors): (&[&str], &[[u8; 4]]) = match kind {
        TaskKind::StackCube => (
            &["cube_a", "cube_b"],
            &[[220, 30, 30, 255], [30, 180, 30, 255]],
        ),
        _ => (&["cube"], &[[12, 42, 160, 255]]),
    };
    for (i, p) in cubes.iter().enumerate() {
        s.push_body(
            names[i],
            Shape3d::Box {
                half_extents: [CUBE_HALF as f32; 3],
            },
            Transform3d {
                translation: p.position.map(|v| v as f32),
                rotation: p.rotation.map(|v| v as f32),
            },
            colors[i],
        );
    }
}

/// The scene of `env`'s current state: its bodies (links where the physics has them), the
/// TCP as the viewer's tool, actions as TCP displacements from the TCP target, and in pixels
/// mode the policy's camera image.
pub fn scene(env: &Tabletop) -> Scene {
    let w = env.world();
    let mut s = Scene::new_3d([[-0.7, -0.5, -0.1], [0.5, 0.5, 0.9]]);
    push_table(&mut s);
    push_links(&mut s, &w.link_boxes());
    let cubes: Vec<BodyPose> = (0..w.cube_count()).map(|i| w.cube_pose(i)).collect();
    push_cubes(&mut s, env.kind(), &cubes);
    let (radius, color) = match env.kind() {
        TaskKind::PushCube => (crate::env::PUSH_GOAL_RADIUS, [220, 40, 40, 120]),
        TaskKind::StackCube => (0.005, [30, 180, 30, 200]),
        _ => (0.025, [30, 200, 30, 160]),
    };
    s.push_body(
        "goal",
        Shape3d::Sphere {
            radius: radius as f32,
        },
        Transform3d::from_translation(env.goal().map(|v| v as f32)),
        color,
    );
    let tcp = w.tcp_pose().translation.vector;
    s.tool = Some([tcp.x, tcp.y, tcp.z].map(|v| v as f32));
    let target = w.target_tcp_pose().translation.vector;
    s.actions_3d = Some(ActionPoints3d {
        origin: [target.x, target.y, target.z].map(|v| v as f32),
        scale: [ACTION_SCALE as f32; 3],
        cumulative: true,
    });
    s.image = env.camera_image();
    s
}
