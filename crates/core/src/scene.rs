//! Drawing primitives a simulator hands to a [`Recorder`](crate::record::Recorder): a 2-D scene
//! of named polygons, circles and line strips, with an optional camera image. Sims build a
//! [`Scene2d`] from their state ([`Env::scene`](crate::env::Env::scene)); the recorder decides
//! where it goes (Rerun, nowhere). Coordinates are the sim's own 2-D frame; `y_down` says which
//! way its y axis points so a viewer can show it upright.

use crate::space::ImageObs;

/// An RGBA colour, 8 bits per channel.
pub type Rgba = [u8; 4];

/// One drawable shape.
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

/// A named shape; the name becomes the last part of its entity path (`scene/<name>`).
#[derive(Debug, Clone, PartialEq)]
pub struct SceneItem {
    /// Stable name (`block`, `goal`, `agent`, ...): the same name in every step so a viewer
    /// sees one object moving rather than new ones appearing.
    pub name: &'static str,
    /// What to draw.
    pub shape: Shape2d,
}

/// A top view of a simulator's state.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scene2d {
    /// Shapes, drawn in order (later ones on top).
    pub items: Vec<SceneItem>,
    /// The region worth showing: `[[x_min, y_min], [x_max, y_max]]`.
    pub bounds: [[f32; 2]; 2],
    /// Whether y grows downwards (image convention, as Push-T's pixels) or upwards.
    pub y_down: bool,
    /// The camera image the policy sees, when the observation mode has one.
    pub image: Option<ImageObs>,
    /// Whether the first two components of an action are a point in this scene's frame (Push-T:
    /// the agent's target), so action chunks can be drawn over the scene.
    pub actions_are_points: bool,
}

impl Scene2d {
    /// An empty scene over `bounds`.
    pub fn new(bounds: [[f32; 2]; 2], y_down: bool) -> Self {
        Self {
            bounds,
            y_down,
            ..Self::default()
        }
    }

    /// Adds a shape named `name`.
    pub fn push(&mut self, name: &'static str, shape: Shape2d) -> &mut Self {
        self.items.push(SceneItem { name, shape });
        self
    }
}
