//! The CPU camera against closed forms: analytic depths, pinhole silhouettes, occlusion,
//! camera roll, determinism, and errors for cameras that cannot render.

use diffrl_core::scene::{Body, Shape3d, Transform3d};
use diffrl_tabletop::camera::{
    AMBIENT, Camera, CameraError, DIFFUSE, Frame, HEADLIGHT, Renderer, render,
};

/// A camera at the origin looking along world +x, world z up in the image.
fn ahead(size: u32) -> Camera {
    Camera::look_at([0.0; 3], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], 60.0, size, size).unwrap()
}

fn body(shape: Shape3d, translation: [f32; 3], color: [u8; 4]) -> Body {
    Body {
        name: "body",
        shape,
        pose: Transform3d::from_translation(translation),
        color,
    }
}

fn cube(half: f32, translation: [f32; 3], color: [u8; 4]) -> Body {
    body(
        Shape3d::Box {
            half_extents: [half; 3],
        },
        translation,
        color,
    )
}

/// The pixel whose centre is nearest the projection of world point `p`.
fn pixel_of(camera: &Camera, p: [f32; 3]) -> (u32, u32) {
    let ([u, v], _) = camera.project(p).expect("in front of the camera");
    (u.floor() as u32, v.floor() as u32)
}

fn hits(frame: &Frame) -> usize {
    frame.depth.iter().filter(|d| d.is_finite()).count()
}

#[test]
fn a_cube_straight_ahead_has_its_analytic_depth_and_shaded_colour() {
    let camera = ahead(64);
    let color = [200, 100, 50, 255];
    let frame = render(&[cube(0.5, [2.0, 0.0, 0.0], color)], &camera).unwrap();
    // The face at x = 1.5 faces the camera: depth 1.5 across it, whatever the pixel.
    for (x, y) in [(32, 32), (31, 31), (28, 36)] {
        let depth = frame.depth_at(x, y);
        assert!((depth - 1.5).abs() < 1e-4, "depth {depth} at ({x}, {y})");
    }
    // Lambert: the face's normal is the camera's -z.
    let [lx, ly, lz] = HEADLIGHT;
    let cos = -lz / (lx * lx + ly * ly + lz * lz).sqrt();
    let shade = AMBIENT + DIFFUSE * cos;
    let want = [0, 1, 2].map(|i| (f32::from(color[i]) * shade).round() as u8);
    assert_eq!(frame.pixel(32, 32), want);
    assert_ne!(frame.pixel(32, 32), [200, 100, 50], "shaded, not flat");
    assert_eq!(
        frame.pixel(0, 0),
        camera.background,
        "corner misses the cube"
    );
}

#[test]
fn a_cube_seen_from_a_corner_shows_three_different_faces() {
    let camera =
        Camera::look_at([2.0, -2.0, 2.0], [0.0; 3], [0.0, 0.0, 1.0], 40.0, 96, 96).unwrap();
    let frame = render(&[cube(0.5, [0.0; 3], [180, 180, 180, 255])], &camera).unwrap();
    let faces = [[0.0, 0.0, 0.5], [0.5, 0.0, 0.0], [0.0, -0.5, 0.0]].map(|p| {
        let (x, y) = pixel_of(&camera, p);
        frame.pixel(x, y)
    });
    assert!(faces.iter().all(|&f| f != camera.background), "{faces:?}");
    assert!(
        faces[0] != faces[1] && faces[1] != faces[2] && faces[0] != faces[2],
        "top, +x and -y faces alike: {faces:?}"
    );
}

#[test]
fn an_empty_scene_is_background_at_infinite_depth() {
    let camera = ahead(32).with_background([1, 2, 3]);
    // Line strips are not drawn either.
    let strip = body(
        Shape3d::LineStrip {
            points: vec![[1.0, 0.0, 0.0], [2.0, 0.0, 0.0]],
        },
        [0.0; 3],
        [255; 4],
    );
    for bodies in [vec![], vec![strip]] {
        let frame = render(&bodies, &camera).unwrap();
        assert!(frame.rgb.chunks_exact(3).all(|p| p == [1, 2, 3]));
        assert!(frame.depth.iter().all(|&d| d == f32::INFINITY));
    }
}

#[test]
fn a_spheres_silhouette_has_the_pinhole_radius() {
    let (radius, distance) = (0.3_f32, 2.0_f32);
    let camera = ahead(128);
    let sphere = body(
        Shape3d::Sphere { radius },
        [distance, 0.0, 0.0],
        [0, 200, 0, 255],
    );
    let frame = render(&[sphere], &camera).unwrap();
    // The silhouette cone has half-angle asin(r / d): radius f * r / sqrt(d^2 - r^2) pixels.
    let want = camera.focal_px() * radius / (distance * distance - radius * radius).sqrt();
    let row = (0..128)
        .filter(|&x| frame.depth_at(x, 64).is_finite())
        .count();
    let column = (0..128)
        .filter(|&y| frame.depth_at(64, y).is_finite())
        .count();
    for (what, n) in [("row", row), ("column", column)] {
        let got = n as f32 / 2.0;
        assert!(
            (got - want).abs() <= 1.0,
            "{what} radius {got} px, pinhole {want} px"
        );
    }
    let area = hits(&frame) as f32;
    let disc = std::f32::consts::PI * want * want;
    assert!(
        (area - disc).abs() / disc < 0.03,
        "area {area} px, disc {disc} px"
    );
    // The nearest point of the sphere is on the axis.
    let depth = frame.depth_at(64, 64);
    assert!((depth - (distance - radius)).abs() < 1e-3, "depth {depth}");
}

#[test]
fn capsules_and_cylinders_stand_along_the_body_z_axis() {
    let camera = ahead(128);
    for shape in [
        Shape3d::Capsule {
            half_length: 0.2,
            radius: 0.1,
        },
        Shape3d::Cylinder {
            half_length: 0.3,
            radius: 0.1,
        },
    ] {
        // Both reach z = +-0.3 and y = +-0.1.
        let frame = render(&[body(shape.clone(), [2.0, 0.0, 0.0], [255; 4])], &camera).unwrap();
        let seen = |p: [f32; 3]| {
            let (x, y) = pixel_of(&camera, p);
            frame.depth_at(x, y)
        };
        let depth = seen([2.0, 0.0, 0.0]);
        assert!(
            (depth - 1.9).abs() < 1e-3,
            "{shape:?}: depth {depth} at the centre"
        );
        assert!(seen([2.0, 0.0, 0.27]).is_finite(), "{shape:?}: top missing");
        assert!(
            seen([2.0, 0.0, -0.27]).is_finite(),
            "{shape:?}: bottom missing"
        );
        assert!(seen([2.0, 0.0, 0.34]).is_infinite(), "{shape:?}: too tall");
        assert!(seen([2.0, 0.14, 0.0]).is_infinite(), "{shape:?}: too wide");
    }
}

#[test]
fn the_nearer_body_wins_whatever_the_order() {
    let camera = ahead(64);
    let near = cube(0.1, [1.0, 0.0, 0.0], [255, 0, 0, 255]);
    let far = cube(0.5, [3.0, 0.0, 0.0], [0, 255, 0, 255]);
    let a = render(&[near.clone(), far.clone()], &camera).unwrap();
    let b = render(&[far, near], &camera).unwrap();
    assert_eq!(a, b);
    let centre = a.pixel(32, 32);
    assert!(
        centre[0] > 0 && centre[1] == 0,
        "centre {centre:?} is not the red cube"
    );
    assert!((a.depth_at(32, 32) - 0.9).abs() < 1e-4);
    // Around the small cube, the big one.
    let (x, y) = pixel_of(&camera, [2.5, 0.3, 0.0]);
    assert!(a.pixel(x, y)[1] > 0 && (a.depth_at(x, y) - 2.5).abs() < 1e-4);
}

#[test]
fn bodies_nearer_than_the_near_plane_are_cut_away() {
    let camera = ahead(32).with_clip_planes(0.5, 10.0);
    let frame = render(&[cube(0.1, [0.3, 0.0, 0.0], [255; 4])], &camera).unwrap();
    assert_eq!(hits(&frame), 0);
    // A body cut by the near plane shows its inside, beyond the plane.
    let frame = render(&[cube(0.3, [0.5, 0.0, 0.0], [255; 4])], &camera).unwrap();
    let depth = frame.depth_at(16, 16);
    assert!((depth - 0.8).abs() < 1e-4, "inside back face at {depth}");
}

#[test]
fn rolling_the_camera_about_its_axis_rotates_the_image() {
    let camera = ahead(64);
    // An L of cubes: a rolled camera cannot see the same picture.
    let bodies = [
        cube(0.1, [2.0, 0.0, 0.0], [200, 0, 0, 255]),
        cube(0.1, [2.0, -0.4, 0.0], [0, 200, 0, 255]),
        cube(0.1, [2.0, 0.0, 0.4], [0, 0, 200, 255]),
    ];
    // Roll by +90 degrees about the camera's own z (the optical axis).
    let [x, y, z, w] = camera.pose.rotation;
    let (s, c) = std::f32::consts::FRAC_PI_4.sin_cos();
    let roll = [0.0, 0.0, s, c];
    let rolled_rotation = [
        w * roll[0] + x * roll[3] + y * roll[2] - z * roll[1],
        w * roll[1] - x * roll[2] + y * roll[3] + z * roll[0],
        w * roll[2] + x * roll[1] - y * roll[0] + z * roll[3],
        w * roll[3] - x * roll[0] - y * roll[1] - z * roll[2],
    ];
    let rolled = Camera {
        pose: Transform3d {
            rotation: rolled_rotation,
            ..camera.pose
        },
        ..camera
    };
    let a = render(&bodies, &camera).unwrap();
    let b = render(&bodies, &rolled).unwrap();
    assert_ne!(a.depth, b.depth);
    // A camera-frame point (x, y) of the upright camera is (y, -x) in the rolled one: pixel
    // (xb, yb) of the rolled image is pixel (63 - yb, xb) of the upright one.
    let mut mismatched = 0;
    for yb in 0..64 {
        for xb in 0..64 {
            let (da, db) = (a.depth_at(63 - yb, xb), b.depth_at(xb, yb));
            match (da.is_finite(), db.is_finite()) {
                (true, true) => assert!((da - db).abs() < 1e-4, "depth {da} vs {db}"),
                (false, false) => {}
                _ => mismatched += 1,
            }
        }
    }
    assert!(hits(&a) > 100);
    assert!(mismatched <= 4, "{mismatched} pixels hit in one image only");
}

#[test]
fn identical_inputs_give_identical_bytes_and_sizes_match() {
    let camera =
        Camera::look_at([1.0, -0.6, 0.8], [0.0; 3], [0.0, 0.0, 1.0], 50.0, 80, 48).unwrap();
    let bodies = [
        cube(0.3, [0.0, 0.0, 0.0], [90, 120, 200, 255]),
        body(
            Shape3d::Sphere { radius: 0.2 },
            [0.0, 0.5, 0.1],
            [250, 200, 0, 255],
        ),
    ];
    let once = render(&bodies, &camera).unwrap();
    assert_eq!(once.rgb.len(), 80 * 48 * 3);
    assert_eq!(once.depth.len(), 80 * 48);
    assert_eq!((once.width, once.height), (80, 48));
    assert_eq!(once.rgb_image().dimensions(), (80, 48));
    assert_eq!(once.image_obs().data, once.rgb);
    // A reused renderer, after another scene, gives the same bits.
    let mut renderer = Renderer::new(camera).unwrap();
    renderer.render(&bodies[..1]);
    let again = renderer.render(&bodies);
    assert_eq!(again.rgb, once.rgb);
    let bits = |f: &Frame| f.depth.iter().map(|d| d.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(again), bits(&once));
}

#[test]
fn cameras_that_cannot_render_are_errors() {
    let good = ahead(32);
    let bad = [
        Camera { width: 0, ..good },
        Camera { height: 0, ..good },
        Camera {
            fov_y_deg: 0.0,
            ..good
        },
        Camera {
            fov_y_deg: 180.0,
            ..good
        },
        Camera {
            fov_y_deg: f32::NAN,
            ..good
        },
        good.with_clip_planes(1.0, 1.0),
        good.with_clip_planes(0.0, 1.0),
        good.with_clip_planes(f32::NAN, 1.0),
        Camera {
            pose: Transform3d::from_translation([f32::NAN, 0.0, 0.0]),
            ..good
        },
        Camera {
            pose: Transform3d {
                rotation: [f32::NAN, 0.0, 0.0, 1.0],
                ..good.pose
            },
            ..good
        },
        Camera {
            pose: Transform3d {
                rotation: [0.0; 4],
                ..good.pose
            },
            ..good
        },
    ];
    for camera in bad {
        let err = render(&[], &camera).expect_err("bad camera rendered");
        assert!(!err.to_string().is_empty());
        assert!(Renderer::new(camera).is_err());
    }
    assert!(matches!(
        render(&[], &Camera { width: 0, ..good }),
        Err(CameraError::Size { width: 0, .. })
    ));
    // A renderer keeps its camera when given a bad one.
    let mut renderer = Renderer::new(good).unwrap();
    assert!(renderer.set_camera(Camera { width: 0, ..good }).is_err());
    assert!(
        renderer
            .set_pose(Transform3d::from_translation([f32::INFINITY; 3]))
            .is_err()
    );
    assert_eq!(renderer.camera(), &good);
    // look_at without a view.
    let up = [0.0, 0.0, 1.0];
    assert!(matches!(
        Camera::look_at([1.0; 3], [1.0; 3], up, 60.0, 8, 8),
        Err(CameraError::LookAt { .. })
    ));
    assert!(Camera::look_at([0.0; 3], [0.0, 0.0, -1.0], up, 60.0, 8, 8).is_err());
    assert!(Camera::look_at([f32::NAN; 3], [0.0; 3], up, 60.0, 8, 8).is_err());
    assert!(Camera::look_at([0.0; 3], [1.0, 0.0, 0.0], up, 0.0, 8, 8).is_err());
}

#[test]
fn bodies_that_cannot_be_drawn_are_skipped() {
    let camera = ahead(16);
    let nan = Body {
        pose: Transform3d::from_translation([f32::NAN; 3]),
        ..cube(0.5, [0.0; 3], [255; 4])
    };
    let flat = cube(0.0, [2.0, 0.0, 0.0], [255; 4]);
    let frame = render(&[nan, flat], &camera).unwrap();
    assert_eq!(hits(&frame), 0);
}

#[test]
fn cameras_serialise_as_config_tables() {
    let camera = Camera::look_at([0.6, 0.0, 0.5], [0.0; 3], [0.0, 0.0, 1.0], 55.0, 96, 64)
        .unwrap()
        .with_background([10, 20, 30]);
    let json = serde_json::to_string(&camera).unwrap();
    assert!(json.contains("\"translation\""), "{json}");
    assert_eq!(serde_json::from_str::<Camera>(&json).unwrap(), camera);
    let partial: Camera = serde_json::from_str(r#"{"width": 64, "height": 64}"#).unwrap();
    assert_eq!(
        partial,
        Camera {
            width: 64,
            height: 64,
            ..Camera::default()
        }
    );
    assert!(serde_json::from_str::<Camera>(r#"{"fov": 60}"#).is_err());
}

#[test]
fn frames_write_rgb_and_millimetre_depth_pngs() {
    let camera = ahead(24);
    let frame = render(&[cube(0.5, [2.0, 0.0, 0.0], [10, 200, 30, 255])], &camera).unwrap();
    let dir = std::env::temp_dir().join(format!("diffrl-camera-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (rgb_path, depth_path) = (dir.join("rgb.png"), dir.join("depth.png"));
    frame.to_png(&rgb_path).unwrap();
    frame.depth_png(&depth_path).unwrap();
    let rgb = image::open(&rgb_path).unwrap().into_rgb8();
    assert_eq!(rgb.into_raw(), frame.rgb);
    let depth = image::open(&depth_path).unwrap().into_luma16();
    assert_eq!(depth.get_pixel(12, 12).0, [1500]);
    assert_eq!(depth.get_pixel(0, 0).0, [0], "no hit is 0 mm");
    std::fs::remove_dir_all(&dir).unwrap();
    let missing = frame.to_png(dir.join("no/such/dir.png"));
    assert!(matches!(missing, Err(CameraError::Write { .. })));
}
