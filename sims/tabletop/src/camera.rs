//! RGB and depth images of a scene's bodies, rendered on the CPU: the camera observations of
//! the tabletop tasks (64x64 to 128x128), with no GPU and no display.
//!
//! A [`Camera`] is a pinhole: a vertical field of view, an image size, near and far clip planes
//! and a pose in the world. Its pose follows the convention of
//! [`CameraImage`](diffrl_core::scene::CameraImage) (OpenCV's): the camera looks along its +z,
//! image x points right and image y down. [`render`] (or a reusable [`Renderer`], which keeps
//! its buffers between frames) turns the [`Body`]s of a
//! [`Scene`](diffrl_core::scene::Scene) into a [`Frame`]: RGB8 pixels and the depth of each
//! pixel along the optical axis, in metres.
//!
//! **Technique: one ray per pixel, cast against each body's analytic shape with parry3d's
//! [`RayCast`]** (boxes, spheres, capsules, cylinders; line strips are not drawn). Each body is
//! culled to the screen rectangle of its bounding sphere and, per pixel, to rays that pass
//! through that sphere; bodies are drawn nearest first, and a pixel skips every body that starts
//! behind the depth it already holds. We measured it against a z-buffered triangle rasteriser
//! over primitives tessellated once (3484 triangles, `benches/camera.rs`) on the bench's
//! tabletop scene (table, an 11-capsule arm, two fingers, two cubes, a goal sphere), one core:
//!
//! | frames/s | 64x64 | 96x96 | 128x128 |
//! |----------|-------|-------|---------|
//! | ray cast | 2900  | 1400  | 800     |
//! | raster   | 2200  | 1800  | 1700    |
//!
//! Ray casting costs per pixel, rasterising mostly per triangle: the rasteriser wins from about
//! 96x96 up. We ship ray casting all the same: it is fast enough for observations (under 1.3 ms a
//! frame at 128x128, 0.35 ms at 64x64), its silhouettes and depths are the analytic ones (a
//! sphere is round at any size, a capsule needs no tessellation level, a depth is exact rather
//! than interpolated over facets), it clips at the near plane for free (a wrist camera close to
//! a cube), and parry does the geometry instead of code of ours. The rasteriser in the bench is
//! where to start should 128x128 frames ever dominate a training step.
//!
//! Shading is Lambert with one directional light plus ambient ([`AMBIENT`], [`DIFFUSE`]). The
//! light is a *headlight* fixed to the camera (as MuJoCo's default light): it comes from above,
//! left of and behind the camera ([`HEADLIGHT`]), so a face turned towards the camera is lit,
//! and faces turned differently (a cube's top, front and side) get different brightness from
//! any viewpoint, a wrist camera's included. Faces are two-sided. Rendering is deterministic:
//! the same bodies and camera give the same bytes.

use std::path::{Path, PathBuf};

use diffrl_core::scene::{Body, Shape3d, Transform3d};
use diffrl_core::space::ImageObs;
use image::{ImageBuffer, Luma, RgbImage};
use rapier3d::parry::math::{Mat3, Rot3, Vec3};
use rapier3d::parry::query::{Ray, RayCast, RayIntersection};
use rapier3d::parry::shape::{Ball, Capsule, Cuboid, Cylinder};
use serde::{Deserialize, Serialize};

/// Direction *towards* the light in the camera frame (x right, y down, z forward): up, a little
/// left, and behind the camera. Not normalised; [`Renderer`] normalises it.
pub const HEADLIGHT: [f32; 3] = [-0.3, -0.6, -1.0];
/// Share of a body's colour it shows in shadow.
pub const AMBIENT: f32 = 0.35;
/// Share of a body's colour added by the light on a face turned straight at it.
pub const DIFFUSE: f32 = 0.65;
/// The largest image side [`Camera::validate`] accepts.
pub const MAX_SIDE: u32 = 4096;

/// What is wrong with a camera, or what failed writing a frame.
#[derive(Debug, thiserror::Error)]
pub enum CameraError {
    /// Width or height is zero or above [`MAX_SIDE`].
    #[error("camera image size {width}x{height}: each side must be in 1..={MAX_SIDE} pixels")]
    Size {
        /// Requested width.
        width: u32,
        /// Requested height.
        height: u32,
    },
    /// The vertical field of view is not strictly between 0 and 180 degrees.
    #[error("camera vertical field of view {0} degrees: must be strictly between 0 and 180")]
    FieldOfView(f32),
    /// The clip planes are not `0 < near < far`.
    #[error("camera clip planes near {near} m, far {far} m: need 0 < near < far")]
    ClipPlanes {
        /// Near plane distance.
        near: f32,
        /// Far plane distance.
        far: f32,
    },
    /// The pose has a non-finite value or its rotation is not a unit quaternion.
    #[error(
        "camera pose {0:?}: translation must be finite and rotation a unit quaternion [x, y, z, w]"
    )]
    Pose(Transform3d),
    /// [`Camera::look_at`] got points and an up vector that define no view.
    #[error(
        "camera look_at eye {eye:?}, target {target:?}, up {up:?}: need finite values, eye != \
         target and up not parallel to the view direction"
    )]
    LookAt {
        /// Camera position.
        eye: [f32; 3],
        /// Point looked at.
        target: [f32; 3],
        /// World direction that should appear up in the image.
        up: [f32; 3],
    },
    /// Encoding or writing an image file failed.
    #[error("writing camera image {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: image::ImageError,
    },
}

/// Serde mirror of [`Transform3d`] (which lives in diffrl-core without serde derives).
#[derive(Serialize, Deserialize)]
#[serde(remote = "Transform3d")]
struct Transform3dDef {
    translation: [f32; 3],
    rotation: [f32; 4],
}

/// A pinhole camera: intrinsics (vertical field of view, image size, clip planes), extrinsics
/// (its pose in the world) and the background colour.
///
/// The pose places the camera frame in the world: the camera looks along its +z, image x is its
/// +x (right) and image y its +y (down), as OpenCV and
/// [`CameraImage`](diffrl_core::scene::CameraImage). Square pixels; the principal point is the
/// image centre. Serialises as a config table (`width`, `height`, `fov_y_deg`, `near`, `far`,
/// `pose = { translation, rotation }`, `background`); missing fields take [`Camera::default`]'s.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Camera {
    /// Image columns.
    pub width: u32,
    /// Image rows.
    pub height: u32,
    /// Vertical field of view in degrees, strictly between 0 and 180.
    pub fov_y_deg: f32,
    /// Distance of the near clip plane along the optical axis, in metres (> 0): nearer surfaces
    /// are cut away.
    pub near: f32,
    /// Distance of the far clip plane along the optical axis, in metres (> near): farther
    /// surfaces are not drawn.
    pub far: f32,
    /// Where the camera is and where it looks (its +z), in the world frame.
    #[serde(with = "Transform3dDef")]
    pub pose: Transform3d,
    /// RGB of pixels where no body is hit.
    pub background: [u8; 3],
}

impl Default for Camera {
    /// 96x96, 60 degrees, clip planes at 1 cm and 10 m, at the world origin looking along world
    /// +z, on a dark grey background.
    fn default() -> Self {
        Self {
            width: 96,
            height: 96,
            fov_y_deg: 60.0,
            near: 0.01,
            far: 10.0,
            pose: Transform3d::IDENTITY,
            background: [40, 40, 48],
        }
    }
}

impl Camera {
    /// A camera at `eye` looking at `target`, turned so that the world direction `up` points up
    /// in the image; clip planes and background as [`Camera::default`]'s.
    pub fn look_at(
        eye: [f32; 3],
        target: [f32; 3],
        up: [f32; 3],
        fov_y_deg: f32,
        width: u32,
        height: u32,
    ) -> Result<Self, CameraError> {
        let err = || CameraError::LookAt { eye, target, up };
        let forward = (Vec3::from(target) - Vec3::from(eye)).try_normalize();
        let forward = forward.ok_or_else(err)?;
        // Image x (right) is forward x up; image y (down) completes the right-handed frame.
        let right = forward
            .cross(Vec3::from(up))
            .try_normalize()
            .ok_or_else(err)?;
        let down = forward.cross(right);
        let rotation = Rot3::from_mat3(&Mat3::from_cols(right, down, forward)).normalize();
        let camera = Self {
            width,
            height,
            fov_y_deg,
            pose: Transform3d {
                translation: eye,
                rotation: rotation.to_array(),
            },
            ..Self::default()
        };
        camera.validate()?;
        Ok(camera)
    }

    /// The same camera with clip planes at `near` and `far` metres.
    pub fn with_clip_planes(self, near: f32, far: f32) -> Self {
        Self { near, far, ..self }
    }

    /// The same camera on a `background` colour.
    pub fn with_background(self, background: [u8; 3]) -> Self {
        Self { background, ..self }
    }

    /// Checks the camera can render: size in 1..=[`MAX_SIDE`], field of view in (0, 180)
    /// degrees, `0 < near < far` (far may be infinite), a finite pose with a unit rotation
    /// quaternion (norm within 1e-3 of 1).
    pub fn validate(&self) -> Result<(), CameraError> {
        let side_ok = |s: u32| (1..=MAX_SIDE).contains(&s);
        if !side_ok(self.width) || !side_ok(self.height) {
            return Err(CameraError::Size {
                width: self.width,
                height: self.height,
            });
        }
        if !(self.fov_y_deg > 0.0 && self.fov_y_deg < 180.0) {
            return Err(CameraError::FieldOfView(self.fov_y_deg));
        }
        if !(self.near > 0.0 && self.near < self.far) || self.near.is_infinite() {
            return Err(CameraError::ClipPlanes {
                near: self.near,
                far: self.far,
            });
        }
        let Transform3d {
            translation,
            rotation,
        } = self.pose;
        let unit = (Rot3::from_array(rotation).length() - 1.0).abs() <= 1e-3;
        if !(unit && translation.iter().all(|v| v.is_finite())) {
            return Err(CameraError::Pose(self.pose));
        }
        Ok(())
    }

    /// Focal length in pixels (the same along x and y).
    pub fn focal_px(&self) -> f32 {
        self.height as f32 / 2.0 / (self.fov_y_deg.to_radians() / 2.0).tan()
    }

    /// Where the world point `p` lands in the image, in pixels (`[0, 0]` is the top-left
    /// corner of the top-left pixel, whose centre is `[0.5, 0.5]`), and its depth along the
    /// optical axis; None when it is not in front of the camera.
    pub fn project(&self, p: [f32; 3]) -> Option<([f32; 2], f32)> {
        let (rotation, translation) = self.world_from_camera();
        let c = rotation.inverse() * (Vec3::from(p) - translation);
        if c.z <= 0.0 {
            return None;
        }
        let f = self.focal_px();
        let (cx, cy) = (self.width as f32 / 2.0, self.height as f32 / 2.0);
        Some(([cx + f * c.x / c.z, cy + f * c.y / c.z], c.z))
    }

    /// The camera's rotation (normalised) and position in the world.
    fn world_from_camera(&self) -> (Rot3, Vec3) {
        (
            Rot3::from_array(self.pose.rotation).normalize(),
            Vec3::from(self.pose.translation),
        )
    }
}

/// One rendered image: RGB8 pixels and per-pixel depth.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// Image columns.
    pub width: u32,
    /// Image rows.
    pub height: u32,
    /// `height * width * 3` bytes, row-major (HWC), top row first.
    pub rgb: Vec<u8>,
    /// `height * width` depths in metres along the optical axis (the camera-frame z of the
    /// surface seen, not the distance along the ray), row-major; `f32::INFINITY` where no body
    /// lies between the near and far planes.
    pub depth: Vec<f32>,
}

impl Frame {
    /// The RGB of pixel (`x`, `y`), x the column and y the row from the top.
    ///
    /// # Panics
    /// When the pixel is outside the image.
    pub fn pixel(&self, x: u32, y: u32) -> [u8; 3] {
        let i = self.index(x, y) * 3;
        [self.rgb[i], self.rgb[i + 1], self.rgb[i + 2]]
    }

    /// The depth of pixel (`x`, `y`) in metres (`f32::INFINITY` for background).
    ///
    /// # Panics
    /// When the pixel is outside the image.
    pub fn depth_at(&self, x: u32, y: u32) -> f32 {
        self.depth[self.index(x, y)]
    }

    fn index(&self, x: u32, y: u32) -> usize {
        assert!(
            x < self.width && y < self.height,
            "pixel ({x}, {y}) outside the image"
        );
        y as usize * self.width as usize + x as usize
    }

    /// The RGB pixels as an [`image`] buffer.
    pub fn rgb_image(&self) -> RgbImage {
        RgbImage::from_raw(self.width, self.height, self.rgb.clone())
            .expect("a frame holds width * height * 3 bytes")
    }

    /// The depth as a 16-bit image in millimetres (rounded, saturating at 65535 mm); 0 where
    /// nothing was hit, as depth cameras write missing depth.
    pub fn depth_image_mm(&self) -> ImageBuffer<Luma<u16>, Vec<u16>> {
        let mm = self
            .depth
            .iter()
            .map(|&d| {
                if d.is_finite() {
                    (d * 1000.0).round().clamp(0.0, 65535.0) as u16
                } else {
                    0
                }
            })
            .collect();
        ImageBuffer::from_raw(self.width, self.height, mm)
            .expect("a frame holds width * height depths")
    }

    /// The RGB pixels as the observation type policies read.
    pub fn image_obs(&self) -> ImageObs {
        ImageObs {
            height: self.height,
            width: self.width,
            data: self.rgb.clone(),
        }
    }

    /// Writes the RGB pixels to `path` as a PNG.
    pub fn to_png(&self, path: impl AsRef<Path>) -> Result<(), CameraError> {
        let path = path.as_ref();
        self.rgb_image()
            .save_with_format(path, image::ImageFormat::Png)
            .map_err(|source| CameraError::Write {
                path: path.to_owned(),
                source,
            })
    }

    /// Writes the depth to `path` as a 16-bit greyscale PNG in millimetres
    /// ([`Frame::depth_image_mm`]).
    pub fn depth_png(&self, path: impl AsRef<Path>) -> Result<(), CameraError> {
        let path = path.as_ref();
        self.depth_image_mm()
            .save_with_format(path, image::ImageFormat::Png)
            .map_err(|source| CameraError::Write {
                path: path.to_owned(),
                source,
            })
    }
}

/// Renders `bodies` as `camera` sees them. Allocates a new [`Frame`]; a [`Renderer`] reuses its
/// buffers from frame to frame.
pub fn render(bodies: &[Body], camera: &Camera) -> Result<Frame, CameraError> {
    let mut renderer = Renderer::new(*camera)?;
    renderer.render(bodies);
    Ok(renderer.frame)
}

/// A parry shape in its own frame.
#[derive(Debug, Clone, Copy)]
enum Primitive {
    Cuboid(Cuboid),
    Ball(Ball),
    Capsule(Capsule),
    Cylinder(Cylinder),
}

impl Primitive {
    fn cast(&self, ray: &Ray, max_toi: f32) -> Option<RayIntersection> {
        // Not solid: a ray starting inside a body (cut by the near plane) sees its inside.
        match self {
            Self::Cuboid(s) => s.cast_local_ray_and_get_normal(ray, max_toi, false),
            Self::Ball(s) => s.cast_local_ray_and_get_normal(ray, max_toi, false),
            Self::Capsule(s) => s.cast_local_ray_and_get_normal(ray, max_toi, false),
            Self::Cylinder(s) => s.cast_local_ray_and_get_normal(ray, max_toi, false),
        }
    }
}

/// A body ready to draw this frame: its shape, the camera frame seen from the shape's frame,
/// the pixels it may cover and the nearest depth it may have.
#[derive(Debug, Clone, Copy)]
struct Visible {
    primitive: Primitive,
    /// Shape-from-camera rotation (columns: camera x, y, z axes in the shape frame).
    rotation: Mat3,
    /// Camera centre in the shape frame.
    eye: Vec3,
    /// Direction towards the light, in the shape frame.
    light: Vec3,
    /// Linear RGB in 0..=255.
    color: Vec3,
    /// Centre of the bounding sphere in the camera frame.
    center: Vec3,
    /// Squared radius of the bounding sphere.
    radius_squared: f32,
    /// Inclusive pixel bounds `[x0, y0, x1, y1]`.
    rect: [u32; 4],
    /// No point of the body is nearer than this along the optical axis.
    z_min: f32,
}

/// Renders frames for one camera, reusing its buffers: the frame it returns and its per-body
/// scratch. For a moving camera (a wrist camera), [`Renderer::set_camera`] each step.
#[derive(Debug, Clone)]
pub struct Renderer {
    camera: Camera,
    visible: Vec<Visible>,
    frame: Frame,
}

impl Renderer {
    /// A renderer for `camera`, once it [validates](Camera::validate).
    pub fn new(camera: Camera) -> Result<Self, CameraError> {
        camera.validate()?;
        let pixels = camera.width as usize * camera.height as usize;
        Ok(Self {
            camera,
            visible: Vec::new(),
            frame: Frame {
                width: camera.width,
                height: camera.height,
                rgb: vec![0; pixels * 3],
                depth: vec![f32::INFINITY; pixels],
            },
        })
    }

    /// The camera frames are rendered from.
    pub fn camera(&self) -> &Camera {
        &self.camera
    }

    /// Renders from `camera` from now on (resizing the frame buffers if its size differs);
    /// keeps the previous camera when `camera` does not validate.
    pub fn set_camera(&mut self, camera: Camera) -> Result<(), CameraError> {
        camera.validate()?;
        let pixels = camera.width as usize * camera.height as usize;
        self.camera = camera;
        self.frame.width = camera.width;
        self.frame.height = camera.height;
        self.frame.rgb.resize(pixels * 3, 0);
        self.frame.depth.resize(pixels, f32::INFINITY);
        Ok(())
    }

    /// Renders from the same camera moved to `pose`.
    pub fn set_pose(&mut self, pose: Transform3d) -> Result<(), CameraError> {
        self.set_camera(Camera {
            pose,
            ..self.camera
        })
    }

    /// The last rendered frame.
    pub fn frame(&self) -> &Frame {
        &self.frame
    }

    /// Renders `bodies` into the renderer's frame and returns it. Line strips, bodies with a
    /// non-finite pose and shapes with a non-positive or non-finite size are not drawn.
    pub fn render(&mut self, bodies: &[Body]) -> &Frame {
        let camera = self.camera;
        let (width, height) = (camera.width, camera.height);
        let focal = camera.focal_px();
        let (cx, cy) = (width as f32 / 2.0, height as f32 / 2.0);
        let (cam_rotation, cam_translation) = camera.world_from_camera();
        let camera_from_world = cam_rotation.inverse();
        let headlight = Vec3::from(HEADLIGHT).normalize();

        self.visible.clear();
        for body in bodies {
            let Some((primitive, shape_rotation, bound)) = primitive(body) else {
                continue;
            };
            let Transform3d {
                translation,
                rotation,
            } = body.pose;
            let body_rotation = Rot3::from_array(rotation);
            let norm = body_rotation.length();
            if !(norm.is_finite() && norm > 0.0 && translation.iter().all(|v| v.is_finite())) {
                continue;
            }
            // Camera-from-shape rigid transform.
            let rotation = camera_from_world * (body_rotation / norm) * shape_rotation;
            let center = camera_from_world * (Vec3::from(translation) - cam_translation);
            let Some((rect, z_min)) = screen_rect(center, bound, &camera, focal) else {
                continue;
            };
            let shape_from_camera = Mat3::from_quat(rotation.inverse());
            let color = Vec3::new(
                f32::from(body.color[0]),
                f32::from(body.color[1]),
                f32::from(body.color[2]),
            );
            self.visible.push(Visible {
                primitive,
                rotation: shape_from_camera,
                eye: shape_from_camera * -center,
                light: shape_from_camera * headlight,
                color,
                center,
                // A margin so rounding never skips a ray that grazes a round body.
                radius_squared: (bound * 1.001).powi(2),
                rect,
                z_min,
            });
        }
        // Nearest first, so a pixel skips the bodies behind what it already shows.
        self.visible.sort_by(|a, b| a.z_min.total_cmp(&b.z_min));

        let background = camera.background;
        for px in self.frame.rgb.chunks_exact_mut(3) {
            px.copy_from_slice(&background);
        }
        self.frame.depth.fill(f32::INFINITY);
        let (near, far) = (camera.near, camera.far);
        let width = width as usize;
        for body in &self.visible {
            let [x0, y0, x1, y1] = body.rect;
            let center_squared = body.center.length_squared();
            for y in y0..=y1 {
                let dir_y = (y as f32 + 0.5 - cy) / focal;
                // The shape-frame ray direction of pixel (x, y) is col0 * dir_x + partial.
                let partial = body.rotation.y_axis * dir_y + body.rotation.z_axis;
                let center_dot_row = body.center.y * dir_y + body.center.z;
                let dir_row_squared = dir_y * dir_y + 1.0;
                for x in x0..=x1 {
                    let i = y as usize * width + x as usize;
                    let seen = self.frame.depth[i];
                    if seen <= body.z_min {
                        continue;
                    }
                    let dir_x = (x as f32 + 0.5 - cx) / focal;
                    // Skip rays that miss the bounding sphere: its squared distance from the
                    // ray's line is |c|^2 - (c.d)^2 / |d|^2 with d = (dir_x, dir_y, 1).
                    let along = body.center.x * dir_x + center_dot_row;
                    let dir_squared = dir_x * dir_x + dir_row_squared;
                    if along * along < (center_squared - body.radius_squared) * dir_squared {
                        continue;
                    }
                    // Camera-frame direction (dir_x, dir_y, 1): time of impact t from the near
                    // plane point is at depth near + t.
                    let dir = body.rotation.x_axis * dir_x + partial;
                    let ray = Ray::new(body.eye + dir * near, dir);
                    let Some(hit) = body.primitive.cast(&ray, seen.min(far) - near) else {
                        continue;
                    };
                    let depth = near + hit.time_of_impact;
                    if depth >= seen {
                        continue;
                    }
                    self.frame.depth[i] = depth;
                    // Two-sided: a face seen from inside is lit as if seen from outside.
                    let normal = if hit.normal.dot(dir) > 0.0 {
                        -hit.normal
                    } else {
                        hit.normal
                    };
                    let shade = AMBIENT + DIFFUSE * normal.dot(body.light).max(0.0);
                    let rgb = (body.color * shade)
                        .round()
                        .clamp(Vec3::ZERO, Vec3::splat(255.0));
                    self.frame.rgb[i * 3..i * 3 + 3].copy_from_slice(&[
                        rgb.x as u8,
                        rgb.y as u8,
                        rgb.z as u8,
                    ]);
                }
            }
        }
        &self.frame
    }
}

/// The parry shape of `body`, the rotation from the shape's frame to the body's, and the
/// radius of a sphere about the body's origin that holds it; None for what is not drawn.
fn primitive(body: &Body) -> Option<(Primitive, Rot3, f32)> {
    let positive = |v: f32| v.is_finite() && v > 0.0;
    let none = Rot3::IDENTITY;
    match body.shape {
        Shape3d::Box { half_extents } if half_extents.iter().all(|&h| positive(h)) => {
            let half = Vec3::from(half_extents);
            Some((Primitive::Cuboid(Cuboid::new(half)), none, half.length()))
        }
        Shape3d::Sphere { radius } if positive(radius) => {
            Some((Primitive::Ball(Ball::new(radius)), none, radius))
        }
        Shape3d::Capsule {
            half_length,
            radius,
        } if positive(radius) && half_length.is_finite() && half_length >= 0.0 => Some((
            Primitive::Capsule(Capsule::new_z(half_length, radius)),
            none,
            half_length + radius,
        )),
        // parry's cylinders lie along their y axis: turn y onto the body's z.
        Shape3d::Cylinder {
            half_length,
            radius,
        } if positive(half_length) && positive(radius) => Some((
            Primitive::Cylinder(Cylinder::new(half_length, radius)),
            Rot3::from_rotation_x(std::f32::consts::FRAC_PI_2),
            half_length.hypot(radius),
        )),
        _ => None,
    }
}

/// The inclusive pixel rectangle `[x0, y0, x1, y1]` that holds the image of the part between
/// the clip planes of a sphere at camera-frame `center` with `radius`, and the nearest depth of
/// that part; None when it is off screen or outside the clip planes.
fn screen_rect(center: Vec3, radius: f32, camera: &Camera, focal: f32) -> Option<([u32; 4], f32)> {
    let z_near = (center.z - radius).max(camera.near);
    let z_far = (center.z + radius).min(camera.far);
    if z_near > z_far {
        return None;
    }
    // Over the box [c - r, c + r] cut to z in [z_near, z_far] (z > 0), x / z is largest at the
    // largest x and, for x > 0, the smallest z; likewise for the other bounds.
    let ratio_bounds = |c: f32| {
        let (lo, hi) = (c - radius, c + radius);
        let max = hi / if hi > 0.0 { z_near } else { z_far };
        let min = lo / if lo < 0.0 { z_near } else { z_far };
        (min, max)
    };
    let pixel_range = |c: f32, centre: f32, side: u32| {
        let (min, max) = ratio_bounds(c);
        // Pixel i samples i + 0.5; widen by one pixel against rounding.
        let first = (centre + focal * min - 0.5).floor() - 1.0;
        let last = (centre + focal * max - 0.5).ceil() + 1.0;
        if last < 0.0 || first > (side - 1) as f32 {
            return None;
        }
        Some((first.max(0.0) as u32, last.min((side - 1) as f32) as u32))
    };
    let (x0, x1) = pixel_range(center.x, camera.width as f32 / 2.0, camera.width)?;
    let (y0, y1) = pixel_range(center.y, camera.height as f32 / 2.0, camera.height)?;
    Some(([x0, y0, x1, y1], z_near))
}
