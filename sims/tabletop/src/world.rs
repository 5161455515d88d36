//! The Rapier world of the tabletop tasks: a static table (top at z = 0), the Panda as one
//! multibody with a fixed base, and dynamic cubes. Units are metres, kilograms and seconds.
//!
//! - Physics runs at [`PHYSICS_HZ`] (dt = 5 ms), [`SUBSTEPS`] substeps per 20 Hz control step
//!   (ManiSkill's tabletop tasks simulate at 100 Hz; 200 Hz keeps grasps of 2 cm cubes stiff).
//! - Every arm joint has a force-based position motor (PD) with ManiSkill's Panda gains
//!   (stiffness 1000, damping 100, force limit 100, all scaled by `gain_scale`); the two
//!   finger joints the same. Gravity is off on the arm's links (`gravity_scale` 0), which is
//!   ManiSkill's `balance_passive_force` (ideal gravity compensation).
//! - Contacts between the arm's own links are disabled (`DISABLE_SELF_CONTACTS`): adjacent
//!   convex hulls overlap at the joints, and such contacts NaN in the motor constraints.
//! - Nothing sleeps, so targets set on a motor always move the arm.
//!
//! [`World`] is `Clone`; a clone is an exact snapshot (every Rapier set and the motor targets).

use std::sync::Arc;

use rapier3d::na::{Isometry3, Translation3, UnitQuaternion, Vector3};
use rapier3d::prelude::*;
use rapier3d_urdf::UrdfMultibodyOptions;

use crate::robot::{ARM_DOF, ARM_LINKS, FINGER_LINKS, JOINT_NAMES, LoadedPanda, PandaModel};

/// Physics steps per second.
pub const PHYSICS_HZ: f64 = 200.0;
/// Control steps per second.
pub const CONTROL_HZ: f64 = 20.0;
/// Physics substeps per control step.
pub const SUBSTEPS: usize = 10;
/// Cube half-size (m).
pub const CUBE_HALF: f64 = 0.02;
/// Table half-extents; its top is at z = 0 and its centre at (TABLE_CENTER_X, 0, -half z).
pub const TABLE_HALF: [f64; 3] = [0.7, 0.7, 0.05];
/// x of the table's centre (the arm stands at x = -0.615 near the table's back edge).
pub const TABLE_CENTER_X: f64 = -0.2;
/// Gravity (m/s^2), along -z.
pub const GRAVITY: f64 = 9.81;
/// ManiSkill Panda arm PD stiffness (N m / rad) and damping (N m s / rad).
pub const ARM_STIFFNESS: f64 = 1000.0;
/// See [`ARM_STIFFNESS`].
pub const ARM_DAMPING: f64 = 100.0;
/// Motor force limit of every joint (ManiSkill: 100 for arm and gripper).
pub const FORCE_LIMIT: f64 = 100.0;
/// Finger PD stiffness (N/m) and damping (N s/m), ManiSkill's gripper gains.
pub const FINGER_STIFFNESS: f64 = 1000.0;
/// See [`FINGER_STIFFNESS`].
pub const FINGER_DAMPING: f64 = 100.0;
/// Friction of the arm's colliders (fingers included) and of the table.
pub const ROBOT_FRICTION: f32 = 1.0;
/// Minimum contact force (N) of each finger on a cube for it to count as grasped (ManiSkill's
/// `is_grasping(min_force=0.5)`).
pub const GRASP_MIN_FORCE: f64 = 0.5;

/// An arm joint's position limit is a constraint only while the joint is within this (rad,
/// plus two substeps of its speed and of its target's speed) of the limit. Rapier builds every
/// enabled limit as a constraint (a mass-matrix solve, then solver iterations) even when it is
/// inactive (zero impulse bounds inside the limits, and the motor's target speed is only
/// clamped to reach the limit within one substep): far from the limit it does nothing, so
/// switching it off there changes no result and saves 7 of the 16 joint constraints.
const LIMIT_MARGIN: f64 = 0.05;

/// Physical constants drawn per episode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PhysicsParams {
    /// Mass of each cube (kg); ManiSkill: density 1000 -> 0.064 kg.
    pub cube_mass: f64,
    /// Friction coefficient of the cubes (Rapier averages it with the other surface's).
    pub cube_friction: f64,
    /// Multiplier on every motor's stiffness and damping.
    pub gain_scale: f64,
}

impl Default for PhysicsParams {
    fn default() -> Self {
        Self {
            cube_mass: 0.064,
            cube_friction: 1.0,
            gain_scale: 1.0,
        }
    }
}

/// How the arm's joints are simulated (`[env] arm_joints`).
///
/// Both give the same motor gains, limits, contacts and gravity compensation, and pass the
/// same physics checks (`sims/tabletop/tests/physics.rs` runs them on both); docs/tabletop.md
/// compares their speed and learning results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ArmJoints {
    /// One Rapier multibody in reduced coordinates: the joints cannot separate. Rapier
    /// rebuilds the arm's mass matrix in every solver iteration.
    #[default]
    Multibody,
    /// Impulse joints between the links as free bodies, solved with the contacts; about 1.9x
    /// the multibody's control steps per second on pick-cube.
    Impulse,
}

/// One impulse joint of the arm, in the order that places every body after its parent.
#[derive(Debug, Clone, Copy)]
struct ChainJoint {
    handle: ImpulseJointHandle,
    parent: RigidBodyHandle,
    child: RigidBodyHandle,
    /// Whether the joint slides along its local x (else it turns about it, or is fixed).
    prismatic: bool,
    /// Its index in [`JOINT_NAMES`], if it is driven.
    driven: Option<usize>,
}

/// The arm's joints in the Rapier sets.
#[derive(Debug, Clone)]
enum JointIds {
    Multibody {
        index: MultibodyIndex,
        /// Multibody link id of each joint in [`JOINT_NAMES`] order.
        links: [usize; 9],
    },
    Impulse {
        /// Every joint of the arm, parents first.
        chain: Vec<ChainJoint>,
        /// Position in `chain` of each joint in [`JOINT_NAMES`] order.
        driven: [usize; 9],
    },
}

/// Where the arm's parts live in the Rapier sets.
#[derive(Debug, Clone)]
struct ArmHandles {
    joints: JointIds,
    /// Body of each link in [`ARM_LINKS`] order, then the two fingers.
    link_bodies: Vec<RigidBodyHandle>,
    /// Colliders of the two fingers.
    finger_colliders: [Vec<ColliderHandle>; 2],
    /// Every collider of the arm.
    all_colliders: Vec<ColliderHandle>,
    /// Local bounding box (centre, half-extents) of each body in `link_bodies`.
    link_boxes: Vec<([f64; 3], [f64; 3])>,
}

/// The physics world. Cloning it is a snapshot.
#[derive(Clone)]
pub struct World {
    bodies: RigidBodySet,
    colliders: ColliderSet,
    islands: IslandManager,
    broad_phase: BroadPhaseBvh,
    narrow_phase: NarrowPhase,
    impulse_joints: ImpulseJointSet,
    multibody_joints: MultibodyJointSet,
    soft_bodies: SoftBodySet,
    ccd: CCDSolver,
    integration: IntegrationParameters,
    arm: ArmHandles,
    cubes: Vec<RigidBodyHandle>,
    cube_colliders: Vec<ColliderHandle>,
    table: ColliderHandle,
    model: Arc<PandaModel>,
    q_target: [f64; 9],
    /// The targets of the previous control step, where this step's interpolation starts.
    q_start: [f64; 9],
    params: PhysicsParams,
}

/// Rapier's contact settings for 2 cm cubes held in a gripper:
/// - contact springs: the defaults (30 Hz, 60 Hz against fixed bodies, damping ratio 10) let
///   a resting cube sink 2.7 mm into the table; 200 Hz (500 Hz against fixed bodies) with
///   damping ratio 5 leave 0.05 mm. (`length_unit` 0.1 was tried and made resting cubes
///   jitter.)
/// - 4 internal PGS iterations (default 1): with 1, a cube squeezed with 30 N between the
///   fingers creeps out of the grasp (2 cm in 10 s); with 4 it moves less than 1 mm.
/// - Coulomb friction per contact point rather than the default simplified model.
/// - Contacts are predicted 1 cm ahead and rebuilt every substep: with Rapier's contact
///   recycling a finger that slid off a cube's top edge kept the edge's stale diagonal
///   normal and was held 1 cm off the cube by it.
/// - No CCD (`max_ccd_substeps` 0): Rapier 0.36 sweeps every fast-moving dynamic body against
///   the fixed colliders, and each sweep of an arm link recomputes its convex hull's mass
///   properties: that was 27% of a control step. Nothing here moves fast enough to tunnel at
///   200 Hz (a cube at 1 m/s moves 5 mm per substep, a quarter of its half-size; the table is
///   10 cm thick).
fn integration_parameters() -> IntegrationParameters {
    IntegrationParameters {
        dt: (1.0 / PHYSICS_HZ) as f32,
        normalized_prediction_distance: 0.01,
        friction_model: FrictionModel::Coulomb,
        contact_recycling: false,
        max_ccd_substeps: 0,
        num_internal_pgs_iterations: 4,
        contact_softness: SpringCoefficients {
            natural_frequency: 200.0,
            damping_ratio: 5.0,
        },
        static_contact_softness: SpringCoefficients {
            natural_frequency: 500.0,
            damping_ratio: 5.0,
        },
        ..IntegrationParameters::default()
    }
}

thread_local! {
    static PIPELINE: std::cell::RefCell<PhysicsPipeline> =
        std::cell::RefCell::new(PhysicsPipeline::new());
}

fn iso_of(p: &Pose) -> Isometry3<f64> {
    let t = p.translation;
    let r = p.rotation;
    Isometry3::from_parts(
        Translation3::new(t.x as f64, t.y as f64, t.z as f64),
        UnitQuaternion::new_normalize(rapier3d::na::Quaternion::new(
            r.w as f64, r.x as f64, r.y as f64, r.z as f64,
        )),
    )
}

fn pose_of(p: [f64; 3], q: [f64; 4]) -> Pose {
    Pose::from_parts(
        Vector::new(p[0] as f32, p[1] as f32, p[2] as f32),
        Rotation::from_xyzw(q[0] as f32, q[1] as f32, q[2] as f32, q[3] as f32).normalize(),
    )
}

/// Removes the arm's massless links that hang on a fixed joint (the Panda's `panda_link8`
/// and grasp target) and attaches their children to their parents: a dynamic body of zero
/// mass has a zero inverse mass, so the impulse solver would hold it, and the whole arm fixed
/// to it, still. Returns `urdf_joints` with each removed joint's handle set to None and each
/// moved joint's handle and parent updated.
fn splice_massless_links(
    bodies: &mut RigidBodySet,
    colliders: &mut ColliderSet,
    joints: &mut ImpulseJointSet,
    multibody_joints: &mut MultibodyJointSet,
    mut urdf_joints: Vec<(Option<ImpulseJointHandle>, RigidBodyHandle, RigidBodyHandle)>,
) -> Vec<(Option<ImpulseJointHandle>, RigidBodyHandle, RigidBodyHandle)> {
    // Mass properties are otherwise first computed by the first physics step.
    for &(_, _, child) in &urdf_joints {
        if let Some(b) = bodies.get_mut(child) {
            b.recompute_mass_properties_from_colliders(colliders);
        }
    }
    loop {
        let massless = urdf_joints.iter().position(|&(h, _, child)| {
            let fixed = h
                .and_then(|h| joints.get(h))
                .is_some_and(|j| j.data.locked_axes == JointAxesMask::LOCKED_FIXED_AXES);
            fixed && bodies.get(child).is_some_and(|b| b.mass() == 0.0)
        });
        let Some(k) = massless else {
            return urdf_joints;
        };
        let (Some(h), parent, child) = urdf_joints[k] else {
            return urdf_joints;
        };
        let Some(removed) = joints.remove(h, false) else {
            return urdf_joints;
        };
        // The child's frame in the parent's: local_frame1 * local_frame2^-1.
        let offset = removed.data.local_frame1 * removed.data.local_frame2.inverse();
        urdf_joints[k].0 = None;
        for entry in &mut urdf_joints {
            let (Some(hj), p, c) = *entry else {
                continue;
            };
            if p != child {
                continue;
            }
            let Some(old) = joints.remove(hj, false) else {
                continue;
            };
            let mut data = old.data;
            data.local_frame1 = offset * data.local_frame1;
            *entry = (Some(joints.insert(parent, c, data, false)), parent, c);
        }
        let mut islands = IslandManager::new();
        bodies.remove(
            child,
            &mut islands,
            colliders,
            joints,
            multibody_joints,
            &mut SoftBodySet::new(),
            true,
        );
    }
}

/// The arm's impulse joints ordered so that each joint's parent body is placed before it
/// (the URDF's root first). `urdf_joints` holds (joint, parent, child) in the URDF's order;
/// `driven[k]` is the URDF index of [`JOINT_NAMES`]`[k]`.
fn impulse_chain(
    bodies: &RigidBodySet,
    joints: &ImpulseJointSet,
    urdf_joints: &[(Option<ImpulseJointHandle>, RigidBodyHandle, RigidBodyHandle)],
    driven: &[usize; 9],
) -> Vec<ChainJoint> {
    let mut placed: Vec<RigidBodyHandle> = urdf_joints
        .iter()
        .map(|j| j.1)
        .filter(|b| bodies.get(*b).is_some_and(|b| b.is_fixed()))
        .collect();
    let mut chain = Vec::new();
    let mut left: Vec<usize> = (0..urdf_joints.len()).collect();
    while !left.is_empty() {
        let before = left.len();
        left.retain(|&j| {
            let (Some(handle), parent, child) = urdf_joints[j] else {
                return false;
            };
            if !placed.contains(&parent) {
                return true;
            }
            let prismatic = joints
                .get(handle)
                .is_some_and(|jt| !jt.data.locked_axes.contains(JointAxesMask::LIN_X));
            chain.push(ChainJoint {
                handle,
                parent,
                child,
                prismatic,
                driven: driven.iter().position(|&d| d == j),
            });
            placed.push(child);
            false
        });
        if left.len() == before {
            panic!("the arm's joints form a tree rooted at its fixed base");
        }
    }
    chain
}

/// A rigid pose as position and unit quaternion `[x, y, z, w]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BodyPose {
    /// Position (m).
    pub position: [f64; 3],
    /// Orientation `[x, y, z, w]`.
    pub rotation: [f64; 4],
}

impl World {
    /// A world with the table, the arm at `q` (arm joints, then fingers; motor targets = `q`)
    /// and `cubes` cubes parked off the table (place them with [`World::set_cube_pose`]).
    pub fn new(panda: &LoadedPanda, params: PhysicsParams, cubes: usize, q: [f64; 9]) -> Self {
        Self::with_joints(panda, params, cubes, q, ArmJoints::default())
    }

    /// [`World::new`] with the arm's joints simulated as `joints`.
    pub fn with_joints(
        panda: &LoadedPanda,
        params: PhysicsParams,
        cubes: usize,
        q: [f64; 9],
        joints: ArmJoints,
    ) -> Self {
        let mut bodies = RigidBodySet::new();
        let mut colliders = ColliderSet::new();
        let mut multibody_joints = MultibodyJointSet::new();
        let mut impulse_joints = ImpulseJointSet::new();
        let table_body = bodies.insert(
            RigidBodyBuilder::fixed()
                .translation(Vector::new(
                    TABLE_CENTER_X as f32,
                    0.0,
                    -TABLE_HALF[2] as f32,
                ))
                .build(),
        );
        let table = colliders.insert_with_parent(
            ColliderBuilder::cuboid(
                TABLE_HALF[0] as f32,
                TABLE_HALF[1] as f32,
                TABLE_HALF[2] as f32,
            )
            .friction(ROBOT_FRICTION)
            .build(),
            table_body,
            &mut bodies,
        );
        let (links, urdf_joints): (Vec<_>, Vec<_>) = match joints {
            ArmJoints::Multibody => {
                let h = panda.rapier.clone().insert_using_multibody_joints(
                    &mut bodies,
                    &mut colliders,
                    &mut multibody_joints,
                    UrdfMultibodyOptions::DISABLE_SELF_CONTACTS,
                );
                let js = h.joints.iter().map(|j| (None, j.link1, j.link2)).collect();
                (h.links, js)
            }
            ArmJoints::Impulse => {
                let h = panda.rapier.clone().insert_using_impulse_joints(
                    &mut bodies,
                    &mut colliders,
                    &mut impulse_joints,
                );
                let js = h
                    .joints
                    .iter()
                    .map(|j| (Some(j.joint), j.link1, j.link2))
                    .collect();
                (h.links, js)
            }
        };
        let body_of = |name: &str| {
            let i = panda
                .link_names
                .iter()
                .position(|n| n == name)
                .unwrap_or_else(|| panic!("link {name} checked by load_panda"));
            links[i].body
        };
        let mut link_bodies: Vec<RigidBodyHandle> = ARM_LINKS.iter().map(|n| body_of(n)).collect();
        link_bodies.extend(FINGER_LINKS.iter().map(|n| body_of(n)));
        let finger_colliders: [Vec<ColliderHandle>; 2] = FINGER_LINKS.map(|name| {
            let i = panda.link_names.iter().position(|n| n == name).unwrap_or(0);
            links[i].colliders.iter().map(|c| c.handle).collect()
        });
        // Each finger's convex hull touches a cube along an edge, about which the cube pivots
        // and creeps out of the grasp (1 cm in 10 s): the fingers collide as the box
        // bounding their hull instead, whose flat inner face holds the cube face to face.
        for fs in &finger_colliders {
            for &c in fs {
                if let Some(col) = colliders.get_mut(c) {
                    let local = col.position_wrt_parent().copied().unwrap_or_default();
                    let aabb = col.shape().compute_aabb(&local);
                    let half = (aabb.maxs - aabb.mins) / 2.0;
                    let centre = (aabb.maxs + aabb.mins) / 2.0;
                    col.set_shape(SharedShape::cuboid(half.x, half.y, half.z));
                    col.set_position_wrt_parent(Pose::from_translation(centre));
                }
            }
        }
        let all_colliders: Vec<ColliderHandle> = links
            .iter()
            .flat_map(|l| l.colliders.iter().map(|c| c.handle))
            .collect();
        for h in &link_bodies {
            if let Some(b) = bodies.get_mut(*h) {
                b.set_gravity_scale(0.0, false);
                b.enable_ccd(false);
            }
        }
        let link_boxes = link_bodies
            .iter()
            .map(|&h| {
                let mut lo = [f64::INFINITY; 3];
                let mut hi = [f64::NEG_INFINITY; 3];
                for &c in bodies[h].colliders() {
                    let col = &colliders[c];
                    let local = col.position_wrt_parent().copied().unwrap_or_default();
                    let aabb = col.shape().compute_aabb(&local);
                    for i in 0..3 {
                        lo[i] = lo[i].min(aabb.mins[i] as f64);
                        hi[i] = hi[i].max(aabb.maxs[i] as f64);
                    }
                }
                if lo[0] > hi[0] {
                    ([0.0; 3], [0.01; 3])
                } else {
                    (
                        [0, 1, 2].map(|i| (lo[i] + hi[i]) / 2.0),
                        [0, 1, 2].map(|i| (hi[i] - lo[i]) / 2.0),
                    )
                }
            })
            .collect();
        let joint_index = JOINT_NAMES.map(|name| {
            panda
                .joint_names
                .iter()
                .position(|n| n == name)
                .unwrap_or_else(|| panic!("joint {name} checked by PandaModel::from_urdf"))
        });
        let joint_ids = match joints {
            ArmJoints::Multibody => JointIds::Multibody {
                index: multibody_joints
                    .rigid_body_link(link_bodies[1])
                    .map(|l| l.multibody)
                    .unwrap_or_else(|| panic!("the arm is a multibody")),
                links: joint_index.map(|j| {
                    multibody_joints
                        .rigid_body_link(urdf_joints[j].2)
                        .map(|l| l.id)
                        .unwrap_or_else(|| panic!("joint {j} is in the multibody"))
                }),
            },
            ArmJoints::Impulse => {
                // The links collide with the world but not with each other, as the
                // multibody's DISABLE_SELF_CONTACTS.
                let arm_group = InteractionGroups::new(
                    Group::GROUP_1,
                    Group::ALL ^ Group::GROUP_1,
                    InteractionTestMode::And,
                );
                for &c in &all_colliders {
                    if let Some(col) = colliders.get_mut(c) {
                        col.set_collision_groups(arm_group);
                    }
                }
                for l in &links {
                    if let Some(b) = bodies.get_mut(l.body) {
                        *b.activation_mut() = RigidBodyActivation::cannot_sleep();
                    }
                }
                let urdf_joints = splice_massless_links(
                    &mut bodies,
                    &mut colliders,
                    &mut impulse_joints,
                    &mut multibody_joints,
                    urdf_joints,
                );
                let chain = impulse_chain(&bodies, &impulse_joints, &urdf_joints, &joint_index);
                let driven = joint_index.map(|j| {
                    chain
                        .iter()
                        .position(|c| c.driven.is_some_and(|d| joint_index[d] == j))
                        .unwrap_or_else(|| panic!("joint {j} is in the chain"))
                });
                JointIds::Impulse { chain, driven }
            }
        };
        let cube_handles: Vec<RigidBodyHandle> = (0..cubes)
            .map(|i| {
                bodies.insert(
                    RigidBodyBuilder::dynamic()
                        .translation(Vector::new(2.0 + i as f32, 0.0, 0.5))
                        .can_sleep(false)
                        .build(),
                )
            })
            .collect();
        let cube_colliders = cube_handles
            .iter()
            .map(|&b| {
                let h = CUBE_HALF as f32;
                colliders.insert_with_parent(
                    ColliderBuilder::cuboid(h, h, h)
                        .mass(params.cube_mass as f32)
                        .build(),
                    b,
                    &mut bodies,
                )
            })
            .collect();
        let mut world = Self {
            bodies,
            colliders,
            islands: IslandManager::new(),
            broad_phase: BroadPhaseBvh::new(),
            narrow_phase: NarrowPhase::new(),
            impulse_joints,
            multibody_joints,
            soft_bodies: SoftBodySet::new(),
            ccd: CCDSolver::new(),
            integration: integration_parameters(),
            arm: ArmHandles {
                joints: joint_ids,
                link_bodies,
                finger_colliders,
                all_colliders,
                link_boxes,
            },
            cubes: cube_handles,
            cube_colliders,
            table,
            model: Arc::new(panda.model.clone()),
            q_target: q,
            q_start: q,
            params,
        };
        world.set_params(params);
        world.set_joint_positions(q);
        world
    }

    /// The arm's kinematics.
    pub fn model(&self) -> &PandaModel {
        &self.model
    }

    /// This episode's physical constants.
    pub fn params(&self) -> PhysicsParams {
        self.params
    }

    /// Applies cube mass and friction and the motor gains of `params`.
    pub fn set_params(&mut self, params: PhysicsParams) {
        self.params = params;
        for &c in &self.cube_colliders {
            if let Some(col) = self.colliders.get_mut(c) {
                col.set_mass(params.cube_mass as f32);
                col.set_friction(params.cube_friction as f32);
            }
        }
        self.apply_targets(1.0);
    }

    fn multibody(&self, index: MultibodyIndex) -> &Multibody {
        self.multibody_joints
            .get_multibody(index)
            .unwrap_or_else(|| panic!("the arm's multibody exists"))
    }

    fn multibody_mut(&mut self, index: MultibodyIndex) -> &mut Multibody {
        self.multibody_joints
            .get_multibody_mut(index)
            .unwrap_or_else(|| panic!("the arm's multibody exists"))
    }

    /// The description (motor, limits) of joint `i` of [`JOINT_NAMES`].
    fn joint_data_mut(&mut self, i: usize) -> Option<&mut GenericJoint> {
        match &self.arm.joints {
            JointIds::Multibody { index, links } => {
                let (index, id) = (*index, links[i]);
                self.multibody_mut(index)
                    .link_mut(id)
                    .map(|l| &mut l.joint.data)
            }
            JointIds::Impulse { chain, driven } => {
                let h = chain[driven[i]].handle;
                self.impulse_joints.get_mut(h, false).map(|j| &mut j.data)
            }
        }
    }

    /// World frames of an impulse joint's two anchors (on its parent, on its child).
    fn joint_frames(&self, c: &ChainJoint) -> (Isometry3<f64>, Isometry3<f64>) {
        let Some(j) = self.impulse_joints.get(c.handle) else {
            return (Isometry3::identity(), Isometry3::identity());
        };
        (
            iso_of(self.bodies[c.parent].position()) * iso_of(&j.data.local_frame1),
            iso_of(self.bodies[c.child].position()) * iso_of(&j.data.local_frame2),
        )
    }

    /// Writes the motor targets (and gains) of every joint: `fraction` of the way from the
    /// previous control step's targets to the current ones, with the ramp's velocity as
    /// feed-forward.
    ///
    /// An arm joint's limit is only switched on near the limit (see [`LIMIT_MARGIN`]).
    fn apply_targets(&mut self, fraction: f64) {
        let g = self.params.gain_scale;
        let period = SUBSTEPS as f64 / PHYSICS_HZ;
        let (start, end) = (self.q_start, self.q_target);
        let targets: [f64; 9] = std::array::from_fn(|i| start[i] + (end[i] - start[i]) * fraction);
        let speeds: [f64; 9] = std::array::from_fn(|i| (end[i] - start[i]) / period);
        let (q, qd) = (self.joint_positions(), self.joint_velocities());
        let chain: [(f64, f64); ARM_DOF] =
            std::array::from_fn(|i| (self.model.chain[i].lower, self.model.chain[i].upper));
        for i in 0..JOINT_NAMES.len() {
            let Some(data) = self.joint_data_mut(i) else {
                continue;
            };
            let (axis, k, d) = if i < ARM_DOF {
                (JointAxis::AngX, ARM_STIFFNESS, ARM_DAMPING)
            } else {
                (JointAxis::LinX, FINGER_STIFFNESS, FINGER_DAMPING)
            };
            data.set_motor_model(axis, MotorModel::ForceBased);
            data.set_motor(
                axis,
                targets[i] as f32,
                speeds[i] as f32,
                (k * g) as f32,
                (d * g) as f32,
            );
            data.set_motor_max_force(axis, FORCE_LIMIT as f32);
            if i < ARM_DOF {
                let (lo, hi) = chain[i];
                let room = (q[i] - lo).min(hi - q[i]);
                let reach = LIMIT_MARGIN + 2.0 * (qd[i].abs() + speeds[i].abs()) / PHYSICS_HZ;
                data.limit_axes.set(JointAxesMask::ANG_X, room < reach);
            }
        }
    }

    /// Sets the joint motor targets (arm joints, then fingers).
    /// The next control step moves them linearly from the previous targets.
    pub fn set_targets(&mut self, q: [f64; 9]) {
        self.q_start = self.q_target;
        self.q_target = q;
    }

    /// The current joint motor targets.
    pub fn targets(&self) -> [f64; 9] {
        self.q_target
    }

    /// Teleports the joints to `q` at rest and sets the targets there.
    pub fn set_joint_positions(&mut self, q: [f64; 9]) {
        match self.arm.joints.clone() {
            JointIds::Multibody { index, links } => {
                let current = self.joint_positions();
                let mb = self.multibody_mut(index);
                let mut disp = vec![0.0f32; mb.ndofs()];
                for (i, &id) in links.iter().enumerate() {
                    if let Some(link) = mb.link(id) {
                        disp[link.assembly_id()] = (q[i] - current[i]) as f32;
                    }
                }
                mb.apply_displacements(&disp);
                mb.generalized_velocity_mut().fill(0.0);
                // `true`: the first call turns the root (created free) into a fixed joint at
                // the base body's pose; with `false` it would be fixed at the origin.
                let mb = self
                    .multibody_joints
                    .get_multibody_mut(index)
                    .unwrap_or_else(|| panic!("the arm's multibody exists"));
                mb.forward_kinematics(&self.bodies, true);
                mb.update_rigid_bodies(&mut self.bodies, true);
            }
            JointIds::Impulse { chain, .. } => {
                // Forward kinematics through the joint frames, parents first.
                for c in &chain {
                    let Some(j) = self.impulse_joints.get(c.handle) else {
                        continue;
                    };
                    let (f1, f2) = (iso_of(&j.data.local_frame1), iso_of(&j.data.local_frame2));
                    let v = c.driven.map_or(0.0, |i| q[i]);
                    let motion = if c.driven.is_none() {
                        Isometry3::identity()
                    } else if c.prismatic {
                        Isometry3::translation(v, 0.0, 0.0)
                    } else {
                        Isometry3::rotation(Vector3::x() * v)
                    };
                    let child =
                        iso_of(self.bodies[c.parent].position()) * f1 * motion * f2.inverse();
                    let r = child.rotation;
                    let t = child.translation.vector;
                    self.bodies[c.child]
                        .set_position(pose_of([t.x, t.y, t.z], [r.i, r.j, r.k, r.w]), true);
                }
            }
        }
        for &h in &self.arm.link_bodies {
            if let Some(b) = self.bodies.get_mut(h) {
                b.set_linvel(Vector::ZERO, false);
                b.set_angvel(Vector::ZERO, false);
            }
        }
        self.q_start = q;
        self.q_target = q;
        self.apply_targets(1.0);
    }

    /// Sets the joint velocities ([`JOINT_NAMES`] order) and the link velocities they imply.
    pub fn set_joint_velocities(&mut self, qd: [f64; 9]) {
        match self.arm.joints.clone() {
            JointIds::Multibody { index, links } => {
                let mb = self.multibody_mut(index);
                let ids: Vec<usize> = links
                    .iter()
                    .map(|&id| mb.link(id).map_or(usize::MAX, |l| l.assembly_id()))
                    .collect();
                let mut v = mb.generalized_velocity_mut();
                for (i, a) in ids.into_iter().enumerate() {
                    if a < v.len() {
                        v[a] = qd[i] as f32;
                    }
                }
            }
            JointIds::Impulse { chain, .. } => {
                // Velocity kinematics through the joints, parents first.
                for c in &chain {
                    let (f1, _) = self.joint_frames(c);
                    let axis = f1.rotation * Vector3::x();
                    let rate = c.driven.map_or(0.0, |i| qd[i]);
                    let parent = &self.bodies[c.parent];
                    let com = self.bodies[c.child].center_of_mass();
                    let mut v = parent.velocity_at_point(com);
                    let mut w = parent.angvel();
                    let a = Vector::new(axis.x as f32, axis.y as f32, axis.z as f32);
                    if c.prismatic {
                        v += a * rate as f32;
                    } else {
                        w += a * rate as f32;
                        let anchor = f1.translation.vector;
                        let r =
                            com - Vector::new(anchor.x as f32, anchor.y as f32, anchor.z as f32);
                        v += (a * rate as f32).cross(r);
                    }
                    let b = &mut self.bodies[c.child];
                    b.set_linvel(v, false);
                    b.set_angvel(w, false);
                }
            }
        }
    }

    /// Joint positions (rad for the arm, m for the fingers), [`JOINT_NAMES`] order.
    pub fn joint_positions(&self) -> [f64; 9] {
        match &self.arm.joints {
            JointIds::Multibody { index, links } => {
                let mb = self.multibody(*index);
                links.map(|id| {
                    mb.link(id).map_or(0.0, |l| {
                        let c = l.joint().coords();
                        // Revolute joints rotate about their local x (coordinate 3),
                        // prismatic joints slide along it (coordinate 0).
                        if l.joint().data.locked_axes.contains(JointAxesMask::LIN_X) {
                            c[3] as f64
                        } else {
                            c[0] as f64
                        }
                    })
                })
            }
            JointIds::Impulse { chain, driven } => driven.map(|k| {
                let c = &chain[k];
                let (f1, f2) = self.joint_frames(c);
                let rel = f1.inverse() * f2;
                if c.prismatic {
                    rel.translation.x
                } else {
                    let q = rel.rotation.quaternion();
                    let s = if q.w < 0.0 { -1.0 } else { 1.0 };
                    2.0 * (s * q.i).atan2(s * q.w)
                }
            }),
        }
    }

    /// Joint velocities, [`JOINT_NAMES`] order.
    pub fn joint_velocities(&self) -> [f64; 9] {
        match &self.arm.joints {
            JointIds::Multibody { index, links } => {
                let mb = self.multibody(*index);
                let v = mb.generalized_velocity();
                links.map(|id| mb.link(id).map_or(0.0, |l| v[l.assembly_id()] as f64))
            }
            JointIds::Impulse { chain, driven } => driven.map(|k| {
                let c = &chain[k];
                let (f1, f2) = self.joint_frames(c);
                let axis = f1.rotation * Vector3::x();
                let (p, ch) = (&self.bodies[c.parent], &self.bodies[c.child]);
                let rel = if c.prismatic {
                    let t = f2.translation.vector;
                    let at = Vector::new(t.x as f32, t.y as f32, t.z as f32);
                    ch.velocity_at_point(at) - p.velocity_at_point(at)
                } else {
                    ch.angvel() - p.angvel()
                };
                Vector3::new(rel.x as f64, rel.y as f64, rel.z as f64).dot(&axis)
            }),
        }
    }

    /// The TCP pose from the measured arm joint positions.
    pub fn tcp_pose(&self) -> Isometry3<f64> {
        let q = self.joint_positions();
        let arm: [f64; ARM_DOF] = q[..ARM_DOF].try_into().unwrap_or([0.0; ARM_DOF]);
        self.model.tcp_pose(&arm)
    }

    /// Gripper opening: the sum of both finger positions (m; 0.08 fully open).
    pub fn gripper_opening(&self) -> f64 {
        let q = self.joint_positions();
        q[7] + q[8]
    }

    /// Number of cubes.
    pub fn cube_count(&self) -> usize {
        self.cubes.len()
    }

    /// Pose of cube `i`.
    pub fn cube_pose(&self, i: usize) -> BodyPose {
        let p = self.bodies[self.cubes[i]].position();
        let t = p.translation;
        let r = p.rotation;
        BodyPose {
            position: [t.x as f64, t.y as f64, t.z as f64],
            rotation: [r.x as f64, r.y as f64, r.z as f64, r.w as f64],
        }
    }

    /// Linear and angular velocity of cube `i`.
    pub fn cube_velocity(&self, i: usize) -> ([f64; 3], [f64; 3]) {
        let b = &self.bodies[self.cubes[i]];
        let (v, w) = (b.linvel(), b.angvel());
        (
            [v.x as f64, v.y as f64, v.z as f64],
            [w.x as f64, w.y as f64, w.z as f64],
        )
    }

    /// Teleports cube `i` to `pose` at rest.
    pub fn set_cube_pose(&mut self, i: usize, pose: BodyPose) {
        let b = &mut self.bodies[self.cubes[i]];
        b.set_position(pose_of(pose.position, pose.rotation), true);
        b.set_linvel(Vector::ZERO, true);
        b.set_angvel(Vector::ZERO, true);
    }

    /// World poses of the drawn links ([`ARM_LINKS`], then the two fingers).
    pub fn link_poses(&self) -> Vec<Isometry3<f64>> {
        self.arm
            .link_bodies
            .iter()
            .map(|&h| iso_of(self.bodies[h].position()))
            .collect()
    }

    /// Each drawn link's bounding box in its own frame: centre and half-extents
    /// ([`ARM_LINKS`], then the two fingers).
    pub fn link_local_boxes(&self) -> &[([f64; 3], [f64; 3])] {
        &self.arm.link_boxes
    }

    /// Each drawn link's local bounding box placed in the world: the box centre's pose and
    /// half-extents ([`ARM_LINKS`], then the two fingers).
    pub fn link_boxes(&self) -> Vec<(Isometry3<f64>, [f64; 3])> {
        self.link_poses()
            .into_iter()
            .zip(&self.arm.link_boxes)
            .map(|(pose, (c, half))| (pose * Translation3::new(c[0], c[1], c[2]), *half))
            .collect()
    }

    /// Contact force (N) of each finger on cube `i` during the last substep.
    pub fn finger_forces(&self, i: usize) -> [f64; 2] {
        let cube = self.cube_colliders[i];
        let dt = self.integration.dt as f64;
        self.arm.finger_colliders.clone().map(|fs| {
            fs.iter()
                .filter_map(|&f| self.narrow_phase.contact_pair(f, cube))
                .map(|p| p.total_impulse_magnitude() as f64 / dt)
                .sum()
        })
    }

    /// Whether both fingers press on cube `i` with at least [`GRASP_MIN_FORCE`].
    pub fn is_grasping(&self, i: usize) -> bool {
        self.finger_forces(i).iter().all(|&f| f >= GRASP_MIN_FORCE)
    }

    /// Indices (into [`ARM_LINKS`] then the fingers) of the drawn links that touch the table.
    pub fn links_touching_table(&self) -> Vec<usize> {
        (0..self.arm.link_bodies.len())
            .filter(|&i| {
                self.bodies[self.arm.link_bodies[i]]
                    .colliders()
                    .iter()
                    .any(|&c| {
                        self.narrow_phase
                            .contact_pair(c, self.table)
                            .is_some_and(|p| p.has_any_active_contact())
                    })
            })
            .collect()
    }

    /// Whether cube `i` touches the table.
    pub fn cube_on_table(&self, i: usize) -> bool {
        self.narrow_phase
            .contact_pair(self.table, self.cube_colliders[i])
            .is_some_and(|p| p.has_any_active_contact())
    }

    /// The deepest overlap (m, positive) of a cube with the table, another cube or the arm,
    /// with the name of what it overlaps; None when nothing overlaps by more than `tolerance`.
    pub fn cube_overlap(&self, tolerance: f64) -> Option<(usize, String, f64)> {
        let world_pose = |c: ColliderHandle| {
            let col = &self.colliders[c];
            let body = col.parent().map(|b| *self.bodies[b].position());
            body.map_or(*col.position(), |b| {
                b * col.position_wrt_parent().copied().unwrap_or_default()
            })
        };
        let depth = |a: ColliderHandle, b: ColliderHandle| -> f64 {
            let (ca, cb) = (&self.colliders[a], &self.colliders[b]);
            rapier3d::parry::query::contact(
                &world_pose(a),
                ca.shape(),
                &world_pose(b),
                cb.shape(),
                0.0,
            )
            .ok()
            .flatten()
            .map_or(0.0, |c| -c.dist as f64)
        };
        let mut worst: Option<(usize, String, f64)> = None;
        let mut consider = |i: usize, what: String, d: f64| {
            if d > tolerance && worst.as_ref().is_none_or(|w| d > w.2) {
                worst = Some((i, what, d));
            }
        };
        for (i, &c) in self.cube_colliders.iter().enumerate() {
            consider(i, "the table".into(), depth(c, self.table));
            for (j, &other) in self.cube_colliders.iter().enumerate().skip(i + 1) {
                consider(i, format!("cube {j}"), depth(c, other));
            }
            for &a in &self.arm.all_colliders {
                consider(i, "the arm".into(), depth(c, a));
            }
        }
        worst
    }

    /// One physics substep.
    pub fn substep(&mut self) {
        PIPELINE.with_borrow_mut(|pipeline| {
            pipeline.step(
                Vector::new(0.0, 0.0, -GRAVITY as f32),
                &self.integration,
                &mut self.islands,
                &mut self.broad_phase,
                &mut self.narrow_phase,
                &mut self.bodies,
                &mut self.colliders,
                &mut self.impulse_joints,
                &mut self.multibody_joints,
                &mut self.soft_bodies,
                &mut self.ccd,
                &(),
                &(),
            );
        });
    }

    /// One control step: [`SUBSTEPS`] substeps, the motor targets ramping linearly from the
    /// previous control step's targets to the current ones (so the arm tracks smoothly instead
    /// of lagging a step change by ~0.1 s).
    pub fn control_step(&mut self) {
        for i in 1..=SUBSTEPS {
            self.apply_targets(i as f64 / SUBSTEPS as f64);
            self.substep();
        }
        self.q_start = self.q_target;
        self.apply_targets(1.0);
    }

    /// Arm joint targets as an array.
    pub fn arm_targets(&self) -> [f64; ARM_DOF] {
        self.q_target[..ARM_DOF]
            .try_into()
            .unwrap_or([0.0; ARM_DOF])
    }

    /// The TCP pose the arm targets would reach.
    pub fn target_tcp_pose(&self) -> Isometry3<f64> {
        self.model.tcp_pose(&self.arm_targets())
    }

    /// Adds a static box (half-extents `half`, at `pose`) with friction `friction`, e.g. an
    /// incline for tests.
    pub fn add_static_box(&mut self, half: [f64; 3], pose: BodyPose, friction: f64) {
        let body = self.bodies.insert(
            RigidBodyBuilder::fixed()
                .pose(pose_of(pose.position, pose.rotation))
                .build(),
        );
        self.colliders.insert_with_parent(
            ColliderBuilder::cuboid(half[0] as f32, half[1] as f32, half[2] as f32)
                .friction(friction as f32)
                .build(),
            body,
            &mut self.bodies,
        );
    }

    /// The direction of gravity's pull as a unit vector (for tests).
    pub fn gravity_dir() -> Vector3<f64> {
        Vector3::new(0.0, 0.0, -1.0)
    }
}
