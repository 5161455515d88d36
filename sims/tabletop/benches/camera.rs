//! Frames per second of the CPU camera at 64x64, 96x96 and 128x128 on a tabletop scene: a
//! 1.5 x 1 m table, an arm of 11 capsules reaching over it, two finger boxes, two 2 cm cubes and
//! a goal sphere, seen from 0.6 m in front of and above the table centre.
//!
//! Two techniques: `raycast` is [`Renderer`] (one parry ray per pixel, the one the crate
//! ships); `raster` is the alternative it was measured against, a small z-buffered triangle
//! rasteriser over primitives tessellated once (kept here, not in the crate). Run with
//! `DIFFRL_CAMERA_PNG=dir` to also write both techniques' images of the scene to `dir`, and
//! print how many pixels they disagree on.

use std::f32::consts::{PI, TAU};
use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use diffrl_core::scene::{Body, Shape3d, Transform3d};
use diffrl_tabletop::camera::{AMBIENT, Camera, DIFFUSE, Frame, HEADLIGHT, Renderer};
use rapier3d::parry::math::{Rot3, Vec3};

/// The benchmark scene: table, arm, fingers, cubes, goal.
fn tabletop() -> Vec<Body> {
    let mut bodies = vec![Body {
        name: "table",
        shape: Shape3d::Box {
            half_extents: [0.75, 0.5, 0.025],
        },
        pose: Transform3d::from_translation([0.0, 0.0, -0.025]),
        color: [150, 110, 70, 255],
    }];
    // An arm from a base at the table's far edge, up and over to a point above the cubes: 12
    // joints, 11 links.
    let joints: [[f32; 3]; 12] = [
        [-0.55, 0.0, 0.0],
        [-0.55, 0.0, 0.12],
        [-0.55, 0.0, 0.30],
        [-0.50, 0.02, 0.42],
        [-0.42, 0.04, 0.50],
        [-0.30, 0.06, 0.52],
        [-0.18, 0.07, 0.48],
        [-0.08, 0.08, 0.40],
        [0.00, 0.09, 0.30],
        [0.05, 0.10, 0.20],
        [0.08, 0.10, 0.14],
        [0.10, 0.10, 0.10],
    ];
    for (i, pair) in joints.windows(2).enumerate() {
        let (a, b) = (Vec3::from(pair[0]), Vec3::from(pair[1]));
        let axis = b - a;
        let rotation = Rot3::from_rotation_arc(Vec3::Z, axis.normalize());
        bodies.push(Body {
            name: "arm/link",
            shape: Shape3d::Capsule {
                half_length: axis.length() / 2.0,
                radius: 0.055 - 0.0025 * i as f32,
            },
            pose: Transform3d {
                translation: ((a + b) / 2.0).to_array(),
                rotation: rotation.to_array(),
            },
            color: if i % 2 == 0 {
                [235, 235, 235, 255]
            } else {
                [60, 60, 70, 255]
            },
        });
    }
    for side in [-1.0, 1.0] {
        bodies.push(Body {
            name: "gripper/finger",
            shape: Shape3d::Box {
                half_extents: [0.01, 0.008, 0.025],
            },
            pose: Transform3d::from_translation([0.10, 0.10 + side * 0.03, 0.05]),
            color: [80, 80, 90, 255],
        });
    }
    for (translation, angle, color) in [
        ([0.10, 0.10, 0.02], 0.3, [210, 40, 40, 255]),
        ([-0.05, -0.15, 0.02], -0.5, [40, 90, 210, 255]),
    ] {
        bodies.push(Body {
            name: "cube",
            shape: Shape3d::Box {
                half_extents: [0.02; 3],
            },
            pose: Transform3d::from_axis_angle(translation, [0.0, 0.0, 1.0], angle),
            color,
        });
    }
    bodies.push(Body {
        name: "goal",
        shape: Shape3d::Sphere { radius: 0.03 },
        pose: Transform3d::from_translation([0.2, -0.2, 0.03]),
        color: [60, 200, 90, 255],
    });
    bodies
}

fn camera(size: u32) -> Camera {
    Camera::look_at(
        [0.6, 0.0, 0.45],
        [0.0, 0.0, 0.0],
        [0.0, 0.0, 1.0],
        60.0,
        size,
        size,
    )
    .expect("the bench camera is valid")
}

/// A triangle mesh in a body's frame, with one normal per triangle.
struct Mesh {
    triangles: Vec<[Vec3; 3]>,
    color: Vec3,
    pose: Transform3d,
}

/// Tessellates a body once: a box into 12 triangles, round shapes into `SEGMENTS` around.
fn tessellate(body: &Body) -> Option<Mesh> {
    const SEGMENTS: usize = 16;
    const RINGS: usize = 4;
    let mut triangles = Vec::new();
    let mut quad = |a: Vec3, b: Vec3, c: Vec3, d: Vec3| {
        triangles.push([a, b, c]);
        triangles.push([a, c, d]);
    };
    // A surface of revolution about z through the (radius, z) profile, bottom to top.
    let revolve = |profile: &[(f32, f32)], quad: &mut dyn FnMut(Vec3, Vec3, Vec3, Vec3)| {
        let at = |(r, z): (f32, f32), k: usize| {
            let (s, c) = (TAU * k as f32 / SEGMENTS as f32).sin_cos();
            Vec3::new(r * c, r * s, z)
        };
        for ring in profile.windows(2) {
            for k in 0..SEGMENTS {
                quad(
                    at(ring[0], k),
                    at(ring[0], k + 1),
                    at(ring[1], k + 1),
                    at(ring[1], k),
                );
            }
        }
    };
    let cap = |radius: f32, z0: f32, sign: f32| {
        (0..=RINGS).map(move |i| {
            let angle = PI / 2.0 * i as f32 / RINGS as f32;
            (radius * angle.cos(), z0 + sign * radius * angle.sin())
        })
    };
    match body.shape {
        Shape3d::Box { half_extents } => {
            // Each face: fix one axis at -1 or +1, walk the other two around a square.
            for axis in 0..3 {
                for side in [-1.0, 1.0] {
                    let corner = |a: f32, b: f32| {
                        let mut p = [0.0; 3];
                        p[axis] = side;
                        p[(axis + 1) % 3] = a;
                        p[(axis + 2) % 3] = b;
                        Vec3::from(p) * Vec3::from(half_extents)
                    };
                    quad(
                        corner(-1.0, -1.0),
                        corner(1.0, -1.0),
                        corner(1.0, 1.0),
                        corner(-1.0, 1.0),
                    );
                }
            }
        }
        Shape3d::Sphere { radius } => {
            let profile: Vec<_> = (0..=2 * RINGS)
                .map(|i| {
                    let angle = -PI / 2.0 + PI * i as f32 / (2 * RINGS) as f32;
                    (radius * angle.cos(), radius * angle.sin())
                })
                .collect();
            revolve(&profile, &mut quad);
        }
        Shape3d::Capsule {
            half_length,
            radius,
        } => {
            let mut profile: Vec<_> = cap(radius, -half_length, -1.0).collect();
            profile.reverse();
            profile.extend(cap(radius, half_length, 1.0));
            revolve(&profile, &mut quad);
        }
        Shape3d::Cylinder {
            half_length,
            radius,
        } => {
            let profile = [
                (0.0, -half_length),
                (radius, -half_length),
                (radius, half_length),
                (0.0, half_length),
            ];
            revolve(&profile, &mut quad);
        }
        Shape3d::LineStrip { .. } => return None,
    }
    let color = Vec3::new(
        f32::from(body.color[0]),
        f32::from(body.color[1]),
        f32::from(body.color[2]),
    );
    Some(Mesh {
        triangles,
        color,
        pose: body.pose,
    })
}

/// A z-buffered triangle rasteriser with the camera's shading: flat normals, two-sided.
struct Rasteriser {
    camera: Camera,
    frame: Frame,
}

impl Rasteriser {
    fn new(camera: Camera) -> Self {
        let pixels = (camera.width * camera.height) as usize;
        Self {
            camera,
            frame: Frame {
                width: camera.width,
                height: camera.height,
                rgb: vec![0; pixels * 3],
                depth: vec![f32::INFINITY; pixels],
            },
        }
    }

    fn render(&mut self, meshes: &[Mesh]) -> &Frame {
        let camera = self.camera;
        let (w, h) = (camera.width as usize, camera.height as usize);
        let focal = camera.focal_px();
        let (cx, cy) = (w as f32 / 2.0, h as f32 / 2.0);
        let cam_rotation = Rot3::from_array(camera.pose.rotation).inverse();
        let cam_translation = Vec3::from(camera.pose.translation);
        let light = Vec3::from(HEADLIGHT).normalize();
        for px in self.frame.rgb.chunks_exact_mut(3) {
            px.copy_from_slice(&camera.background);
        }
        self.frame.depth.fill(f32::INFINITY);
        for mesh in meshes {
            let rotation = cam_rotation * Rot3::from_array(mesh.pose.rotation);
            let translation = cam_rotation * (Vec3::from(mesh.pose.translation) - cam_translation);
            for triangle in &mesh.triangles {
                let v = triangle.map(|p| rotation * p + translation);
                // No near-plane clipping: the bench scene lies well in front of the camera.
                if v.iter().any(|p| p.z < camera.near) {
                    continue;
                }
                let mut normal = (v[1] - v[0]).cross(v[2] - v[0]).normalize_or_zero();
                if normal.dot(v[0]) > 0.0 {
                    normal = -normal;
                }
                let shade = AMBIENT + DIFFUSE * normal.dot(light).max(0.0);
                let rgb = (mesh.color * shade).round();
                let rgb = [rgb.x as u8, rgb.y as u8, rgb.z as u8];
                let s = v.map(|p| [cx + focal * p.x / p.z, cy + focal * p.y / p.z, 1.0 / p.z]);
                let area = (s[1][0] - s[0][0]) * (s[2][1] - s[0][1])
                    - (s[1][1] - s[0][1]) * (s[2][0] - s[0][0]);
                if area == 0.0 {
                    continue;
                }
                let x0 = (s.iter().map(|p| p[0]).fold(f32::INFINITY, f32::min) - 0.5).ceil();
                let x1 = (s.iter().map(|p| p[0]).fold(f32::NEG_INFINITY, f32::max) - 0.5).floor();
                let y0 = (s.iter().map(|p| p[1]).fold(f32::INFINITY, f32::min) - 0.5).ceil();
                let y1 = (s.iter().map(|p| p[1]).fold(f32::NEG_INFINITY, f32::max) - 0.5).floor();
                let (x0, y0) = (x0.max(0.0) as usize, y0.max(0.0) as usize);
                let (x1, y1) = (x1.min(w as f32 - 1.0), y1.min(h as f32 - 1.0));
                if x1 < 0.0 || y1 < 0.0 {
                    continue;
                }
                let (x1, y1) = (x1 as usize, y1 as usize);
                let edge = |a: [f32; 3], b: [f32; 3], x: f32, y: f32| {
                    ((b[0] - a[0]) * (y - a[1]) - (b[1] - a[1]) * (x - a[0])) / area
                };
                for y in y0..=y1 {
                    let py = y as f32 + 0.5;
                    for x in x0..=x1 {
                        let px = x as f32 + 0.5;
                        let (b0, b1, b2) = (
                            edge(s[1], s[2], px, py),
                            edge(s[2], s[0], px, py),
                            edge(s[0], s[1], px, py),
                        );
                        if b0 < 0.0 || b1 < 0.0 || b2 < 0.0 {
                            continue;
                        }
                        // 1/z is linear in screen space.
                        let depth = 1.0 / (b0 * s[0][2] + b1 * s[1][2] + b2 * s[2][2]);
                        let i = y * w + x;
                        if depth < self.frame.depth[i] && depth <= camera.far {
                            self.frame.depth[i] = depth;
                            self.frame.rgb[i * 3..i * 3 + 3].copy_from_slice(&rgb);
                        }
                    }
                }
            }
        }
        &self.frame
    }
}

fn bench(c: &mut Criterion) {
    let bodies = tabletop();
    let meshes: Vec<Mesh> = bodies.iter().filter_map(tessellate).collect();
    let out = std::env::var_os("DIFFRL_CAMERA_PNG").map(std::path::PathBuf::from);
    let mut group = c.benchmark_group("camera");
    group.throughput(Throughput::Elements(1));
    for size in [64, 96, 128] {
        let mut renderer = Renderer::new(camera(size)).expect("valid camera");
        let mut rasteriser = Rasteriser::new(camera(size));
        if let Some(dir) = &out {
            let ray = renderer.render(&bodies).clone();
            let raster = rasteriser.render(&meshes).clone();
            ray.to_png(dir.join(format!("raycast-{size}.png")))
                .expect("png");
            raster
                .to_png(dir.join(format!("raster-{size}.png")))
                .expect("png");
            let coverage = ray
                .depth
                .iter()
                .zip(&raster.depth)
                .filter(|(a, b)| a.is_finite() != b.is_finite())
                .count();
            let depth_gaps = ray
                .depth
                .iter()
                .zip(&raster.depth)
                .filter(|(a, b)| (*a - *b).abs() > 0.01)
                .count();
            println!(
                "{size}x{size}: {} triangles; hit/miss differ at {coverage} pixels, depth by over 1 cm at {depth_gaps}",
                meshes.iter().map(|m| m.triangles.len()).sum::<usize>()
            );
        }
        group.bench_function(format!("raycast/{size}x{size}"), |b| {
            b.iter(|| black_box(renderer.render(black_box(&bodies)).rgb[0]))
        });
        group.bench_function(format!("raster/{size}x{size}"), |b| {
            b.iter(|| black_box(rasteriser.render(black_box(&meshes)).rgb[0]))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
