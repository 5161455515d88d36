//! Drawing primitives a simulator hands to a [`Recorder`](crate::record::Recorder): a
//! [`Scene`] of named 2-D shapes (polygons, circles, line strips: a top view) and/or named 3-D
//! bodies (boxes, spheres, capsules, cylinders, line strips, each placed by a [`Transform3d`]),
//! with the camera image the policy sees and further named camera images. Sims build a
//! [`Scene`] from their state ([`Env::scene`](crate::env::Env::scene)); the recorder decides
//! where it goes (Rerun, nowhere).
//!
//! 2-D coordinates are the sim's own plane frame; `y_down` says which way its y axis points so a
//! viewer can show it upright. 3-D coordinates are the sim's world frame, z up, in metres.

use std::sync::Arc;

use crate::space::ImageObs;

/// An RGBA colour, 8 bits per channel.
pub type Rgba = [u8; 4];

/// One drawable 2-D shape.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape2d {
    /// A closed polygon (the last point connects back to the first).
    Polygon {
        /// Vertices in order.
        points: Vec<[f32; 2]>,
        /// Outline colour.
        color: Rgba,
        /// Whether the viewer should shade its inside (a solid body) or draw only the outline
        /// (a target region).
        filled: bool,
    },
    /// A disc.
    Circle {
        /// Centre.
        center: [f32; 2],
        /// Radius in scene units.
        radius: f32,
        /// Colour.
        color: Rgba,
    },
    /// An open polyline.
    LineStrip {
        /// Points in order.
        points: Vec<[f32; 2]>,
        /// Colour.
        color: Rgba,
    },
}

/// A named 2-D shape; the name becomes the last part of its entity path (`scene/<name>`).
#[derive(Debug, Clone, PartialEq)]
pub struct SceneItem {
    /// Stable name (`block`, `goal`, `agent`, ...): the same name in every step so a viewer
    /// sees one object moving rather than new ones appearing.
    pub name: &'static str,
    /// What to draw.
    pub shape: Shape2d,
}

/// A rigid placement in 3-D: rotate by `rotation`, then move by `translation`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transform3d {
    /// Position of the body's origin in the world frame.
    pub translation: [f32; 3],
    /// Orientation as a unit quaternion `[x, y, z, w]`.
    pub rotation: [f32; 4],
}

impl Transform3d {
    /// No rotation, no translation.
    pub const IDENTITY: Self = Self {
        translation: [0.0; 3],
        rotation: [0.0, 0.0, 0.0, 1.0],
    };

    /// A translation without rotation.
    pub fn from_translation(translation: [f32; 3]) -> Self {
        Self {
            translation,
            ..Self::IDENTITY
        }
    }

    /// A rotation by `angle` radians about the unit `axis`, then a translation.
    pub fn from_axis_angle(translation: [f32; 3], axis: [f32; 3], angle: f32) -> Self {
        let (s, c) = (angle / 2.0).sin_cos();
        Self {
            translation,
            rotation: [axis[0] * s, axis[1] * s, axis[2] * s, c],
        }
    }

    /// Where the point `p` of the body's frame lies in the world frame.
    pub fn apply(&self, p: [f32; 3]) -> [f32; 3] {
        let [x, y, z, w] = self.rotation;
        // v' = v + 2 w (q x v) + 2 q x (q x v) with q = (x, y, z).
        let cross = |a: [f32; 3], b: [f32; 3]| {
            [
                a[1] * b[2] - a[2] * b[1],
                a[2] * b[0] - a[0] * b[2],
                a[0] * b[1] - a[1] * b[0],
            ]
        };
        let q = [x, y, z];
        let t = cross(q, p).map(|v| 2.0 * v);
        let u = cross(q, t);
        [0, 1, 2].map(|i| p[i] + w * t[i] + u[i] + self.translation[i])
    }
}

/// A 3-D primitive in its body's frame, centred at the body's origin.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape3d {
    /// A box (cuboid).
    Box {
        /// Half its size along x, y and z.
        half_extents: [f32; 3],
    },
    /// A sphere.
    Sphere {
        /// Radius.
        radius: f32,
    },
    /// A cylinder with hemispherical caps along the body's z axis.
    Capsule {
        /// Half the distance between the caps' centres.
        half_length: f32,
        /// Radius.
        radius: f32,
    },
    /// A cylinder along the body's z axis.
    Cylinder {
        /// Half its length.
        half_length: f32,
        /// Radius.
        radius: f32,
    },
    /// An open polyline (a path, an outline of a target region).
    LineStrip {
        /// Points in order, in the body's frame.
        points: Vec<[f32; 3]>,
    },
}

/// A named 3-D body; the name becomes the last part of its entity path (`scene3d/<name>`).
#[derive(Debug, Clone, PartialEq)]
pub struct Body {
    /// Stable name (`table`, `cube`, `gripper/left_finger`, ...), the same in every step.
    pub name: &'static str,
    /// What to draw, in the body's frame.
    pub shape: Shape3d,
    /// Where the body is.
    pub pose: Transform3d,
    /// Colour.
    pub color: Rgba,
}

/// A named camera image beyond the policy's own ([`Scene::image`]): a wrist camera, a second
/// viewpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct CameraImage {
    /// Stable name (`wrist`, `front`); entity path `cameras/<name>`.
    pub name: &'static str,
    /// The RGB image.
    pub image: ImageObs,
    /// Where the camera is (looking along its +z, image x right and y down), when known.
    pub pose: Option<Transform3d>,
}

/// What a simulator's state looks like: a 2-D top view, a 3-D world, or both.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scene {
    /// 2-D shapes, drawn in order (later ones on top).
    pub items: Vec<SceneItem>,
    /// The region of the 2-D view worth showing: `[[x_min, y_min], [x_max, y_max]]`.
    pub bounds: [[f32; 2]; 2],
    /// Whether 2-D y grows downwards (image convention, as Push-T's pixels) or upwards.
    pub y_down: bool,
    /// 3-D bodies (empty for a 2-D task).
    pub bodies: Vec<Body>,
    /// The region of the 3-D world worth showing, `[[x, y, z]_min, [x, y, z]_max]`.
    pub bounds3d: Option<[[f32; 3]; 2]>,
    /// The camera image the policy sees, when the observation mode has one.
    pub image: Option<ImageObs>,
    /// Further camera images.
    pub cameras: Vec<CameraImage>,
    /// Whether the first two components of an action are a point in the 2-D frame (Push-T:
    /// the agent's target), so action chunks can be drawn over the scene.
    pub actions_are_points: bool,
    /// The point of a 3-D scene whose path the viewer traces through an episode (an arm's end
    /// effector), in the world frame.
    pub tool: Option<[f32; 3]>,
    /// How actions draw in the 3-D world (None: they do not).
    pub actions_3d: Option<ActionPoints3d>,
    /// Where a chunk of actions would take the task's agents in the 2-D frame, when actions
    /// are not points (None: they draw from their first two components, or not at all).
    pub action_paths: Option<ActionPaths2d>,
}

/// Paths in a 2-D scene's frame of a chunk of actions, one per agent, for a task whose actions
/// are commands rather than points: the simulator predicts where its agents would go under
/// them (a vehicle's accelerations and steering through its motion model, other bodies held
/// still), starting from the state the scene shows. The viewer draws action chunks and
/// denoising chains with it.
#[derive(Clone)]
pub struct ActionPaths2d(Arc<PathsFn>);

type PathsFn = dyn Fn(&[f32]) -> Vec<Vec<[f32; 2]>> + Send + Sync;

impl ActionPaths2d {
    /// Paths of `f`: it maps a chunk (rows of the action space's length, row-major) to one
    /// path per agent.
    pub fn new(f: impl Fn(&[f32]) -> Vec<Vec<[f32; 2]>> + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// One path per agent of the chunk `actions`.
    pub fn paths(&self, actions: &[f32]) -> Vec<Vec<[f32; 2]>> {
        (self.0)(actions)
    }
}

impl std::fmt::Debug for ActionPaths2d {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ActionPaths2d(..)")
    }
}

/// Two path maps are equal when they are the same closure (one scene's clone).
impl PartialEq for ActionPaths2d {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// How the actions of a 3-D task map to points of its world, so action chunks and denoising
/// chains can be drawn over the scene: the first three components of an action, scaled per
/// axis by `scale`, are either a displacement of the tool (`cumulative`: a chunk is a path from
/// `origin`, each action moving on from where the last one ended; end-effector delta control)
/// or a position `origin + scale * a` (absolute targets).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActionPoints3d {
    /// Where a chunk starts (displacements) or the offset of positions.
    pub origin: [f32; 3],
    /// Metres per unit of each of the first three action components.
    pub scale: [f32; 3],
    /// Whether actions are displacements that add up along a chunk.
    pub cumulative: bool,
}

impl ActionPoints3d {
    /// The points of the actions in `actions` (rows of `action_dim` >= 3 values); for
    /// displacements the path starts at `origin`, so it has one point more than there are
    /// actions. Empty when actions have fewer than three components.
    pub fn points(&self, actions: &[f32], action_dim: usize) -> Vec<[f32; 3]> {
        if action_dim < 3 {
            return Vec::new();
        }
        let step = |a: &[f32]| [0, 1, 2].map(|i| self.scale[i] * a[i]);
        let rows = actions.chunks_exact(action_dim);
        if !self.cumulative {
            return rows
                .map(|a| {
                    let d = step(a);
                    [0, 1, 2].map(|i| self.origin[i] + d[i])
                })
                .collect();
        }
        let mut at = self.origin;
        let mut path = vec![at];
        for a in rows {
            let d = step(a);
            at = [0, 1, 2].map(|i| at[i] + d[i]);
            path.push(at);
        }
        path
    }
}

/// The name of [`Scene`] from when scenes were 2-D only; the same type.
pub type Scene2d = Scene;

impl Scene {
    /// An empty 2-D scene over `bounds`.
    pub fn new(bounds: [[f32; 2]; 2], y_down: bool) -> Self {
        Self {
            bounds,
            y_down,
            ..Self::default()
        }
    }

    /// An empty 3-D scene over `bounds`.
    pub fn new_3d(bounds: [[f32; 3]; 2]) -> Self {
        Self {
            bounds3d: Some(bounds),
            ..Self::default()
        }
    }

    /// Adds a 2-D shape named `name`.
    pub fn push(&mut self, name: &'static str, shape: Shape2d) -> &mut Self {
        self.items.push(SceneItem { name, shape });
        self
    }

    /// Adds a 3-D body named `name` at `pose`.
    pub fn push_body(
        &mut self,
        name: &'static str,
        shape: Shape3d,
        pose: Transform3d,
        color: Rgba,
    ) -> &mut Self {
        self.bodies.push(Body {
            name,
            shape,
            pose,
            color,
        });
        self
    }

    /// Whether the scene has a 3-D part.
    pub fn is_3d(&self) -> bool {
        !self.bodies.is_empty() || self.bounds3d.is_some()
    }
}

#[cfg(test)]
mod tests {
    use std::f32::consts::FRAC_PI_2;

    use super::*;

    #[test]
    fn transforms_rotate_then_translate() {
        let quarter = Transform3d::from_axis_angle([1.0, 2.0, 3.0], [0.0, 0.0, 1.0], FRAC_PI_2);
        let p = quarter.apply([1.0, 0.0, 0.5]);
        for (got, want) in p.iter().zip([1.0, 3.0, 3.5]) {
            assert!((got - want).abs() < 1e-6, "{p:?}");
        }
        assert_eq!(
            Transform3d::IDENTITY.apply([4.0, 5.0, 6.0]),
            [4.0, 5.0, 6.0]
        );
    }

    #[test]
    fn a_scene_can_be_flat_solid_or_both() {
        let mut flat = Scene::new([[0.0, 0.0], [1.0, 1.0]], true);
        flat.push(
            "dot",
            Shape2d::Circle {
                center: [0.5, 0.5],
                radius: 0.1,
                color: [0, 0, 0, 255],
            },
        );
        assert!(!flat.is_3d());
        let mut solid = Scene::new_3d([[-1.0; 3], [1.0; 3]]);
        solid.push_body(
            "cube",
            Shape3d::Box {
                half_extents: [0.02; 3],
            },
            Transform3d::from_translation([0.1, 0.0, 0.02]),
            [200, 0, 0, 255],
        );
        assert!(solid.is_3d() && solid.items.is_empty());
    }

    #[test]
    fn displacement_chunks_add_up_and_positions_do_not() {
        let chunk = [1.0, 0.0, 0.0, 9.0, 0.0, 2.0, 0.0, 9.0];
        let mut a = ActionPoints3d {
            origin: [0.5, 0.0, 0.1],
            scale: [0.1, 0.1, 0.05],
            cumulative: true,
        };
        let path = a.points(&chunk, 4);
        let want = [[0.5, 0.0, 0.1], [0.6, 0.0, 0.1], [0.6, 0.2, 0.1]];
        assert_eq!(path.len(), 3);
        for (p, w) in path.iter().zip(want) {
            assert!(
                p.iter().zip(w).all(|(a, b)| (a - b).abs() < 1e-6),
                "{path:?}"
            );
        }
        a.cumulative = false;
        let points = a.points(&chunk, 4);
        assert_eq!(points.len(), 2);
        assert!((points[1][1] - 0.2).abs() < 1e-6 && (points[1][0] - 0.5).abs() < 1e-6);
        assert!(a.points(&chunk[..4], 2).is_empty());
    }
}
