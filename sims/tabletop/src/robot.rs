//! The Franka Panda: its URDF loaded with rapier3d-urdf into Rapier objects (collision shapes
//! are convex hulls of the collision OBJs), and its kinematic chain from the base to the tool
//! centre point (TCP) in f64 for forward kinematics, the geometric Jacobian and damped
//! least-squares inverse kinematics.
//!
//! The kinematics here are our own rather than `Multibody::inverse_kinematics`: they run on
//! joint *targets* (not on the simulated joint positions), in f64, without touching the
//! physics sets, and add a null-space pull towards the home posture that keeps the redundant
//! elbow where ManiSkill's home pose puts it.
//!
//! rapier3d-urdf 0.36.1 gaps worked around here:
//! - `package://` mesh URIs are not resolved: the URDF text is read here and `package://`
//!   stripped, so mesh paths are relative to the URDF's folder (the asset is not modified).
//! - A mesh that fails to load is skipped silently (no collider, no error): every collision
//!   mesh is checked to exist before loading, and every link with `<collision>` elements to
//!   have colliders after, each failure an error naming the file.
//! - Joint effort and velocity limits are not applied: the efforts are kept in
//!   [`ChainJoint::effort`] and [`FingerJoint::effort`], and [`crate::world`] limits every
//!   motor to ManiSkill's 100 instead.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rapier3d::na::{self, Isometry3, Matrix6, SMatrix, Translation3, UnitQuaternion, Vector3};
use rapier3d::prelude::*;
use rapier3d_urdf::urdf_rs;
use rapier3d_urdf::{UrdfLoaderOptions, UrdfRobot};

/// Number of arm (revolute) joints.
pub const ARM_DOF: usize = 7;
/// Arm joints then the two finger joints, in observation order.
pub const JOINT_NAMES: [&str; 9] = [
    "panda_joint1",
    "panda_joint2",
    "panda_joint3",
    "panda_joint4",
    "panda_joint5",
    "panda_joint6",
    "panda_joint7",
    "panda_finger_joint1",
    "panda_finger_joint2",
];
/// The link the arm is bolted to.
pub const BASE_LINK: &str = "panda_link0";
/// The tool centre point: between the finger pads, 0.105 m below the hand flange (the URDF's
/// `panda_grasptarget`; ManiSkill's `panda_hand_tcp` sits at 0.1034 m).
pub const TCP_LINK: &str = "panda_grasptarget";
/// The finger links, left then right.
pub const FINGER_LINKS: [&str; 2] = ["panda_leftfinger", "panda_rightfinger"];
/// Links drawn in scenes, in order.
pub const ARM_LINKS: [&str; 9] = [
    "panda_link0",
    "panda_link1",
    "panda_link2",
    "panda_link3",
    "panda_link4",
    "panda_link5",
    "panda_link6",
    "panda_link7",
    "panda_hand",
];
/// Where the base sits in the world: ManiSkill's TableSceneBuilder puts the Panda at
/// (-0.615, 0, 0), the table top at z = 0.
pub const BASE_POSITION: [f64; 3] = [-0.615, 0.0, 0.0];
/// ManiSkill's TableSceneBuilder rest pose (arm joints, gripper open at 0.04 per finger).
pub const HOME_Q: [f64; 9] = [
    0.0,
    std::f64::consts::PI / 8.0,
    0.0,
    -5.0 * std::f64::consts::PI / 8.0,
    0.0,
    3.0 * std::f64::consts::PI / 4.0,
    std::f64::consts::PI / 4.0,
    0.04,
    0.04,
];

/// Why the robot could not be loaded. Every variant names the URDF file.
#[derive(Debug, thiserror::Error)]
pub enum RobotError {
    /// The URDF could not be read or parsed.
    #[error("cannot load the robot description {path}: {message}")]
    Urdf {
        /// The URDF file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A link or joint the tasks need is missing or of the wrong kind.
    #[error("robot description {path}: {message}")]
    Structure {
        /// The URDF file.
        path: PathBuf,
        /// What is missing.
        message: String,
    },
    /// A collision mesh is missing or could not be turned into a collider.
    #[error("robot description {path}: link {link}: collision mesh {mesh}: {message}")]
    Mesh {
        /// The URDF file.
        path: PathBuf,
        /// The link whose collision mesh failed.
        link: String,
        /// The mesh file.
        mesh: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// The shipped Panda URDF (assets/panda/panda.urdf, resolved from this crate's folder).
pub fn default_urdf_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/panda/panda.urdf")
}

/// A revolute joint of the chain: the fixed transform from the previous joint's frame
/// (composed URDF origins of the joints in between), then a rotation about `axis`.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainJoint {
    /// URDF joint name.
    pub name: String,
    /// Transform from the previous joint's moving frame (or the base) to this joint's frame.
    pub origin: Isometry3<f64>,
    /// Unit rotation axis in this joint's frame.
    pub axis: Vector3<f64>,
    /// Lower position limit (rad).
    pub lower: f64,
    /// Upper position limit (rad).
    pub upper: f64,
    /// Effort limit (N m), the motor's force limit.
    pub effort: f64,
}

/// A finger joint: prismatic, its limits and effort.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FingerJoint {
    /// Lower position limit (m, closed).
    pub lower: f64,
    /// Upper position limit (m, open).
    pub upper: f64,
    /// Effort limit (N).
    pub effort: f64,
}

/// The Panda's kinematics from base to TCP, read from the URDF.
#[derive(Debug, Clone, PartialEq)]
pub struct PandaModel {
    /// The 7 arm joints, base to wrist.
    pub chain: Vec<ChainJoint>,
    /// Transform from the last arm joint's moving frame to the TCP.
    pub tcp_offset: Isometry3<f64>,
    /// The base's pose in the world.
    pub base: Isometry3<f64>,
    /// The two finger joints.
    pub fingers: [FingerJoint; 2],
    /// How each drawn link ([`ARM_LINKS`], then [`FINGER_LINKS`]) hangs off the base, for
    /// [`PandaModel::link_poses`].
    pub links: Vec<LinkChain>,
}

/// The motion of one URDF joint on the way from the base to a link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum JointMotion {
    /// A fixed joint.
    Fixed,
    /// A rotation by joint position `q[index]` ([`JOINT_NAMES`] order) about the unit `axis`.
    Revolute {
        /// Index into the joint positions.
        index: usize,
        /// Unit axis in the joint's frame.
        axis: Vector3<f64>,
    },
    /// A translation by `q[index]` along the unit `axis`.
    Prismatic {
        /// Index into the joint positions.
        index: usize,
        /// Unit axis in the joint's frame.
        axis: Vector3<f64>,
    },
}

/// The joints from the base to one link: each its URDF origin, then its motion.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkChain {
    /// Joints, base first.
    pub joints: Vec<(Isometry3<f64>, JointMotion)>,
}

/// Damped least-squares settings.
const IK_DAMPING: f64 = 0.02;
const IK_ITERS: usize = 30;
const IK_MAX_STEP: f64 = 0.3;
const IK_NULLSPACE_GAIN: f64 = 0.05;

fn pose_of(origin: &urdf_rs::Pose) -> Isometry3<f64> {
    let [x, y, z] = *origin.xyz;
    let [r, p, yaw] = *origin.rpy;
    Isometry3::from_parts(
        Translation3::new(x, y, z),
        UnitQuaternion::from_euler_angles(r, p, yaw),
    )
}

/// The joints from [`BASE_LINK`] to `link`, base first; movable joints must be in
/// [`JOINT_NAMES`].
fn link_chain(
    robot: &urdf_rs::Robot,
    by_child: &HashMap<&str, &urdf_rs::Joint>,
    link: &str,
) -> Result<LinkChain, String> {
    let mut joints = Vec::new();
    let mut at = link;
    while at != BASE_LINK {
        let j = by_child.get(at).ok_or_else(|| {
            format!("link {at:?} has no parent joint on the way to {BASE_LINK:?}")
        })?;
        let axis = || {
            let a = Vector3::from(*j.axis.xyz);
            let n = a.norm();
            (n > 0.0 && n.is_finite())
                .then(|| a / n)
                .ok_or_else(|| format!("joint {:?} has no axis", j.name))
        };
        let index = || {
            JOINT_NAMES
                .iter()
                .position(|n| *n == j.name)
                .ok_or_else(|| {
                    format!(
                        "joint {:?} moves link {link:?} but is not an arm or finger joint",
                        j.name
                    )
                })
        };
        let motion = match j.joint_type {
            urdf_rs::JointType::Fixed => JointMotion::Fixed,
            urdf_rs::JointType::Revolute => JointMotion::Revolute {
                index: index()?,
                axis: axis()?,
            },
            urdf_rs::JointType::Prismatic => JointMotion::Prismatic {
                index: index()?,
                axis: axis()?,
            },
            ref other => return Err(format!("joint {:?} is {other:?}", j.name)),
        };
        joints.push((pose_of(&j.origin), motion));
        at = j.parent.link.as_str();
        if joints.len() > robot.joints.len() {
            return Err("the joints form a cycle".into());
        }
    }
    joints.reverse();
    Ok(LinkChain { joints })
}

impl PandaModel {
    /// The chain from [`BASE_LINK`] to [`TCP_LINK`] of a parsed URDF.
    pub fn from_urdf(robot: &urdf_rs::Robot, path: &Path) -> Result<Self, RobotError> {
        let structure = |message: String| RobotError::Structure {
            path: path.to_path_buf(),
            message,
        };
        let by_child: HashMap<&str, &urdf_rs::Joint> = robot
            .joints
            .iter()
            .map(|j| (j.child.link.as_str(), j))
            .collect();
        let mut path_joints = Vec::new();
        let mut link = TCP_LINK;
        while link != BASE_LINK {
            let joint = by_child.get(link).ok_or_else(|| {
                structure(format!(
                    "link {link:?} has no parent joint on the way from {TCP_LINK:?} to \
                     {BASE_LINK:?}"
                ))
            })?;
            path_joints.push(*joint);
            link = joint.parent.link.as_str();
            if path_joints.len() > robot.joints.len() {
                return Err(structure("the joints form a cycle".into()));
            }
        }
        path_joints.reverse();
        let mut chain = Vec::new();
        let mut pending = Isometry3::identity();
        for j in path_joints {
            let origin = pending * pose_of(&j.origin);
            match &j.joint_type {
                urdf_rs::JointType::Fixed => pending = origin,
                urdf_rs::JointType::Revolute => {
                    let axis = Vector3::from(*j.axis.xyz);
                    let norm = axis.norm();
                    if !(norm > 0.0 && norm.is_finite()) {
                        return Err(structure(format!("joint {:?} has no axis", j.name)));
                    }
                    if j.limit.lower >= j.limit.upper
                        || j.limit.lower.is_nan()
                        || j.limit.upper.is_nan()
                    {
                        return Err(structure(format!(
                            "joint {:?} has limits [{}, {}]",
                            j.name, j.limit.lower, j.limit.upper
                        )));
                    }
                    chain.push(ChainJoint {
                        name: j.name.clone(),
                        origin,
                        axis: axis / norm,
                        lower: j.limit.lower,
                        upper: j.limit.upper,
                        effort: j.limit.effort,
                    });
                    pending = Isometry3::identity();
                }
                other => {
                    return Err(structure(format!(
                        "joint {:?} between base and TCP is {other:?}; only revolute and fixed \
                         joints are supported there",
                        j.name
                    )));
                }
            }
        }
        for (want, got) in JOINT_NAMES[..ARM_DOF].iter().zip(&chain) {
            if *want != got.name {
                return Err(structure(format!(
                    "expected arm joint {want:?} in chain order, found {:?}",
                    got.name
                )));
            }
        }
        if chain.len() != ARM_DOF {
            return Err(structure(format!(
                "the chain from {BASE_LINK:?} to {TCP_LINK:?} has {} revolute joints, expected \
                 {ARM_DOF}",
                chain.len()
            )));
        }
        let finger = |name: &str| -> Result<FingerJoint, RobotError> {
            let j = robot
                .joints
                .iter()
                .find(|j| j.name == name)
                .ok_or_else(|| structure(format!("finger joint {name:?} is missing")))?;
            if !matches!(j.joint_type, urdf_rs::JointType::Prismatic) {
                return Err(structure(format!("finger joint {name:?} is not prismatic")));
            }
            Ok(FingerJoint {
                lower: j.limit.lower,
                upper: j.limit.upper,
                effort: j.limit.effort,
            })
        };
        let links = ARM_LINKS
            .iter()
            .chain(&FINGER_LINKS)
            .map(|name| link_chain(robot, &by_child, name).map_err(structure))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            chain,
            tcp_offset: pending,
            base: Isometry3::translation(BASE_POSITION[0], BASE_POSITION[1], BASE_POSITION[2]),
            fingers: [finger(JOINT_NAMES[7])?, finger(JOINT_NAMES[8])?],
            links,
        })
    }

    /// World poses of the drawn links ([`ARM_LINKS`], then [`FINGER_LINKS`]) at joint
    /// positions `q` ([`JOINT_NAMES`] order): forward kinematics in f64 over the URDF's
    /// joints, the same frames as the Rapier bodies' ([`crate::world::World::link_poses`]).
    pub fn link_poses(&self, q: &[f64; 9]) -> Vec<Isometry3<f64>> {
        self.links
            .iter()
            .map(|link| {
                let mut t = self.base;
                for (origin, motion) in &link.joints {
                    t *= origin;
                    match *motion {
                        JointMotion::Fixed => {}
                        JointMotion::Revolute { index, axis } => {
                            t *= UnitQuaternion::from_scaled_axis(axis * q[index]);
                        }
                        JointMotion::Prismatic { index, axis } => {
                            t *= Translation3::from(axis * q[index]);
                        }
                    }
                }
                t
            })
            .collect()
    }

    /// The TCP pose in the world at arm joint positions `q`.
    pub fn tcp_pose(&self, q: &[f64; ARM_DOF]) -> Isometry3<f64> {
        self.fk_jacobian(q).0
    }

    /// The TCP pose and the geometric Jacobian (rows: linear velocity, angular velocity, in
    /// the world frame) at `q`.
    pub fn fk_jacobian(&self, q: &[f64; ARM_DOF]) -> (Isometry3<f64>, SMatrix<f64, 6, ARM_DOF>) {
        let mut t = self.base;
        let mut origins = [Vector3::zeros(); ARM_DOF];
        let mut axes = [Vector3::zeros(); ARM_DOF];
        for (i, (j, &qi)) in self.chain.iter().zip(q).enumerate() {
            t *= j.origin;
            origins[i] = t.translation.vector;
            axes[i] = t.rotation * j.axis;
            t *= UnitQuaternion::from_scaled_axis(j.axis * qi);
        }
        let tcp = t * self.tcp_offset;
        let p = tcp.translation.vector;
        let mut jac = SMatrix::<f64, 6, ARM_DOF>::zeros();
        for i in 0..ARM_DOF {
            let lin = axes[i].cross(&(p - origins[i]));
            jac.fixed_view_mut::<3, 1>(0, i).copy_from(&lin);
            jac.fixed_view_mut::<3, 1>(3, i).copy_from(&axes[i]);
        }
        (tcp, jac)
    }

    /// Clamps arm joint positions into their limits.
    pub fn clamp_to_limits(&self, q: &mut [f64; ARM_DOF]) {
        for (qi, j) in q.iter_mut().zip(&self.chain) {
            *qi = qi.clamp(j.lower, j.upper);
        }
    }

    /// Damped least-squares IK from `q_start` towards the TCP pose `target`, with a
    /// null-space pull towards `q_rest`; stays inside the joint limits. Returns the joint
    /// positions and the remaining position error (m).
    ///
    /// Each iteration: `dq = J^T (J J^T + lambda^2 I)^-1 e + (I - J^+ J) k (q_rest - q)`, with
    /// `e` the 6-D pose error (position, rotation vector), its norm capped at 0.3 rad.
    pub fn inverse_kinematics(
        &self,
        q_start: &[f64; ARM_DOF],
        target: &Isometry3<f64>,
        q_rest: &[f64; ARM_DOF],
    ) -> ([f64; ARM_DOF], f64) {
        let mut q = *q_start;
        let mut err = f64::INFINITY;
        for _ in 0..IK_ITERS {
            let (pose, jac) = self.fk_jacobian(&q);
            let e_lin = target.translation.vector - pose.translation.vector;
            let e_ang = (target.rotation * pose.rotation.inverse()).scaled_axis();
            err = e_lin.norm();
            if err < 1e-5 && e_ang.norm() < 1e-4 {
                break;
            }
            let e = na::Vector6::new(e_lin.x, e_lin.y, e_lin.z, e_ang.x, e_ang.y, e_ang.z);
            let jjt = jac * jac.transpose() + Matrix6::identity() * (IK_DAMPING * IK_DAMPING);
            let Some(inv) = jjt.try_inverse() else {
                break;
            };
            let pinv = jac.transpose() * inv;
            let mut dq = pinv * e;
            let rest = na::SVector::<f64, ARM_DOF>::from_fn(|i, _| q_rest[i] - q[i]);
            let null = na::SMatrix::<f64, ARM_DOF, ARM_DOF>::identity() - pinv * jac;
            dq += null * rest * IK_NULLSPACE_GAIN;
            let n = dq.norm();
            if n > IK_MAX_STEP {
                dq *= IK_MAX_STEP / n;
            }
            for (qi, d) in q.iter_mut().zip(dq.iter()) {
                *qi += d;
            }
            self.clamp_to_limits(&mut q);
        }
        let pose = self.tcp_pose(&q);
        err = err.min((target.translation.vector - pose.translation.vector).norm());
        (q, err)
    }
}

/// The loaded robot: its kinematics and its Rapier bodies, colliders and joints (not yet
/// inserted into a world).
#[derive(Clone)]
pub struct LoadedPanda {
    /// Kinematics.
    pub model: PandaModel,
    /// Rapier objects, in the URDF's link order.
    pub rapier: UrdfRobot,
    /// URDF link names, index-aligned with `rapier.links`.
    pub link_names: Vec<String>,
    /// URDF joint names, index-aligned with `rapier.joints`.
    pub joint_names: Vec<String>,
}

/// Loads the Panda URDF at `path`: meshes relative to its folder (`package://` stripped),
/// collision meshes as convex hulls with friction `finger_friction` on every arm collider,
/// the root fixed at [`BASE_POSITION`], imported masses and inertias.
pub fn load_panda(path: &Path, friction: f32) -> Result<LoadedPanda, RobotError> {
    let urdf_err = |message: String| RobotError::Urdf {
        path: path.to_path_buf(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| urdf_err(e.to_string()))?;
    let text = text.replace("package://", "");
    let mesh_dir = path.parent().unwrap_or(Path::new("."));
    let robot = urdf_rs::read_from_string(&text).map_err(|e| urdf_err(e.to_string()))?;
    // rapier3d-urdf skips meshes it cannot load without a word: check them first.
    for link in &robot.links {
        for c in &link.collision {
            if let urdf_rs::Geometry::Mesh { filename, .. } = &c.geometry {
                let mesh = mesh_dir.join(filename);
                if !mesh.is_file() {
                    return Err(RobotError::Mesh {
                        path: path.to_path_buf(),
                        link: link.name.clone(),
                        mesh,
                        message: "no such file".into(),
                    });
                }
            }
        }
    }
    let model = PandaModel::from_urdf(&robot, path)?;
    let options = UrdfLoaderOptions {
        create_colliders_from_collision_shapes: true,
        create_colliders_from_visual_shapes: false,
        apply_imported_mass_props: true,
        enable_joint_collisions: false,
        make_roots_fixed: true,
        mesh_converter: Some(MeshConverter::ConvexHull),
        collider_blueprint: ColliderBuilder::default().density(0.0).friction(friction),
        rigid_body_blueprint: RigidBodyBuilder::dynamic().gravity_scale(0.0),
        ..UrdfLoaderOptions::default()
    };
    let mut rapier = UrdfRobot::from_robot(&robot, options, mesh_dir);
    // Places every body at the base position; the multibody's fixed root takes its pose from
    // the base body on the first forward-kinematics pass (`World::set_joint_positions`).
    rapier.append_transform(&Pose::from_translation(Vector::new(
        BASE_POSITION[0] as f32,
        BASE_POSITION[1] as f32,
        BASE_POSITION[2] as f32,
    )));
    let mut link_names = Vec::new();
    for link in &rapier.links {
        let urdf_link = &robot.links[link.urdf_link_index];
        let meshes = urdf_link.collision.len();
        if meshes > 0 && link.colliders.is_empty() {
            let mesh = match &urdf_link.collision[0].geometry {
                urdf_rs::Geometry::Mesh { filename, .. } => mesh_dir.join(filename),
                _ => PathBuf::from("(primitive)"),
            };
            return Err(RobotError::Mesh {
                path: path.to_path_buf(),
                link: urdf_link.name.clone(),
                mesh,
                message: "could not be converted to a convex hull".into(),
            });
        }
        link_names.push(urdf_link.name.clone());
    }
    for name in ARM_LINKS.iter().chain(&FINGER_LINKS) {
        if !link_names.iter().any(|n| n == name) {
            return Err(RobotError::Structure {
                path: path.to_path_buf(),
                message: format!("link {name:?} is missing (or has no geometry nor inertia)"),
            });
        }
    }
    let joint_names = rapier
        .joints
        .iter()
        .map(|j| robot.joints[j.urdf_joint_index].name.clone())
        .collect();
    Ok(LoadedPanda {
        model,
        rapier,
        link_names,
        joint_names,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> PandaModel {
        load_panda(&default_urdf_path(), 1.0).unwrap().model
    }

    #[test]
    fn jacobian_matches_finite_differences() {
        let m = model();
        let q: [f64; 7] = HOME_Q[..7].try_into().unwrap();
        let (p0, jac) = m.fk_jacobian(&q);
        for i in 0..7 {
            let mut q1 = q;
            q1[i] += 1e-6;
            let p1 = m.tcp_pose(&q1);
            let d = (p1.translation.vector - p0.translation.vector) / 1e-6;
            for r in 0..3 {
                assert!((d[r] - jac[(r, i)]).abs() < 1e-4, "joint {i} row {r}");
            }
        }
    }

    #[test]
    fn home_pose_points_the_gripper_down() {
        let m = model();
        let q: [f64; 7] = HOME_Q[..7].try_into().unwrap();
        let tcp = m.tcp_pose(&q);
        let down = tcp.rotation * Vector3::z();
        assert!(down.z < -0.99, "{down:?}");
        // In front of the base, above the table.
        assert!(
            tcp.translation.z > 0.05 && tcp.translation.x > -0.2,
            "{tcp:?}"
        );
    }

    #[test]
    fn ik_reaches_a_reachable_target() {
        let m = model();
        let q: [f64; 7] = HOME_Q[..7].try_into().unwrap();
        let mut target = m.tcp_pose(&q);
        target.translation.vector += Vector3::new(0.1, -0.08, -0.1);
        let (q2, err) = m.inverse_kinematics(&q, &target, &q);
        assert!(err < 1e-4, "{err}");
        let got = m.tcp_pose(&q2);
        assert!((got.rotation.angle_to(&target.rotation)) < 1e-3);
    }

    #[test]
    fn missing_files_are_named() {
        let err = load_panda(Path::new("/nonexistent/robot.urdf"), 1.0)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("/nonexistent/robot.urdf"), "{err}");
        let dir = std::env::temp_dir().join(format!("tabletop-urdf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let urdf = dir.join("panda.urdf");
        std::fs::copy(default_urdf_path(), &urdf).unwrap();
        let err = load_panda(&urdf, 1.0).err().unwrap().to_string();
        assert!(
            err.contains("link0.obj") && err.contains("panda_link0"),
            "{err}"
        );
        std::fs::write(&urdf, "<robot name='x'><link name=").unwrap();
        let err = load_panda(&urdf, 1.0).err().unwrap().to_string();
        assert!(err.contains("panda.urdf"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
