//! The Rapier world of Push-T: four static walls, a kinematic disk agent under PD control, and
//! the T block. Units are pixels and seconds, as in gym-pusht.
//!
//! Two gym-pusht behaviours shape this file:
//! - The agent is kinematic: nothing pushes it, so its PD dynamics are integrated here in f64
//!   (pymunk's order: v += a dt, then p += v dt) and Rapier only moves the collider along.
//! - Space damping 0: the block keeps no velocity between substeps. Its velocity is zeroed
//!   before every substep, so it moves only while something pushes it.

use rapier2d::prelude::*;

use crate::geometry::{BOUNDING_RADIUS, COG, OUTLINE, Pose, distance_to_t};

/// Physics constants a user may randomise. Defaults equal gym-pusht 0.1.8.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PhysicsParams {
    /// Block mass.
    pub block_mass: f32,
    /// Block moment of inertia about its centre of gravity (gym-pusht: 3000).
    pub block_inertia: f32,
    /// Friction coefficient of block, agent and walls (gym-pusht: 0).
    pub friction: f32,
    /// PD proportional gain.
    pub kp: f64,
    /// PD derivative gain.
    pub kv: f64,
}

impl Default for PhysicsParams {
    fn default() -> Self {
        Self {
            block_mass: 1.0,
            block_inertia: 3000.0,
            friction: 0.0,
            kp: 100.0,
            kv: 20.0,
        }
    }
}

/// Physics substep (s).
pub const DT: f64 = 0.01;
/// Substeps per control step (10 Hz control).
pub const SUBSTEPS: usize = 10;
/// Agent disk radius.
pub const AGENT_RADIUS: f64 = 15.0;
/// Extra clearance (px) under which the agent and block are treated as possibly in contact.
const CONTACT_MARGIN: f64 = 2.0;

thread_local! {
    static PIPELINE: std::cell::RefCell<PhysicsPipeline> = std::cell::RefCell::new(PhysicsPipeline::new());
}

/// Every Rapier set of the world; cloning it is a snapshot.
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
    params: IntegrationParameters,
    agent: RigidBodyHandle,
    block: RigidBodyHandle,
    /// Agent position (f64, authoritative).
    pub agent_pos: [f64; 2],
    /// Agent velocity (f64).
    pub agent_vel: [f64; 2],
    /// Physics constants in force.
    pub physics: PhysicsParams,
}

impl World {
    /// A world with the agent at (256, 400) and the block at (256, 300), angle 0 (gym-pusht's
    /// `_setup`).
    pub fn new(physics: PhysicsParams) -> Self {
        let mut bodies = RigidBodySet::new();
        let mut colliders = ColliderSet::new();
        let ground = bodies.insert(RigidBodyBuilder::fixed().build());
        let walls = [
            ((5.0, 506.0), (5.0, 5.0)),
            ((5.0, 5.0), (506.0, 5.0)),
            ((506.0, 5.0), (506.0, 506.0)),
            ((5.0, 506.0), (506.0, 506.0)),
        ];
        for ((ax, ay), (bx, by)) in walls {
            let c =
                ColliderBuilder::capsule_from_endpoints(Vec2::new(ax, ay), Vec2::new(bx, by), 2.0)
                    .friction(physics.friction)
                    .restitution(0.0)
                    .build();
            colliders.insert_with_parent(c, ground, &mut bodies);
        }
        let agent = bodies.insert(
            RigidBodyBuilder::kinematic_position_based()
                .translation(Vec2::new(256.0, 400.0))
                .build(),
        );
        colliders.insert_with_parent(
            ColliderBuilder::ball(AGENT_RADIUS as f32)
                .friction(physics.friction)
                .restitution(0.0)
                .build(),
            agent,
            &mut bodies,
        );
        let block = bodies.insert(
            RigidBodyBuilder::dynamic()
                .translation(Vec2::new(256.0, 300.0))
                .additional_mass_properties(MassProperties::new(
                    Vec2::new(COG[0] as f32, COG[1] as f32),
                    physics.block_mass,
                    physics.block_inertia,
                ))
                .build(),
        );
        for (hx, hy, cy) in [(60.0, 15.0, 15.0), (15.0, 45.0, 75.0)] {
            let c = ColliderBuilder::cuboid(hx, hy)
                .translation(Vec2::new(0.0, cy))
                .density(0.0)
                .friction(physics.friction)
                .restitution(0.0)
                .build();
            colliders.insert_with_parent(c, block, &mut bodies);
        }
        let params = IntegrationParameters {
            dt: DT as f32,
            length_unit: 30.0,
            ..IntegrationParameters::default()
        };
        Self {
            bodies,
            colliders,
            islands: IslandManager::new(),
            broad_phase: BroadPhaseBvh::new(),
            narrow_phase: NarrowPhase::new(),
            impulse_joints: ImpulseJointSet::new(),
            multibody_joints: MultibodyJointSet::new(),
            soft_bodies: SoftBodySet::new(),
            ccd: CCDSolver::new(),
            params,
            agent,
            block,
            agent_pos: [256.0, 400.0],
            agent_vel: [0.0, 0.0],
            physics,
        }
    }

    /// The block's pose (body origin and angle, as gym-pusht observes it).
    pub fn block_pose(&self) -> Pose {
        let p = self.bodies[self.block].position();
        Pose::new(
            p.translation.x as f64,
            p.translation.y as f64,
            p.rotation.angle() as f64,
        )
    }

    /// Places the block with its body origin at `pose`.
    pub fn set_block_pose(&mut self, pose: &Pose) {
        let b = &mut self.bodies[self.block];
        b.set_position(
            Pose2::new(Vec2::new(pose.x as f32, pose.y as f32), pose.angle as f32),
            true,
        );
        b.set_linvel(Vec2::ZERO, true);
        b.set_angvel(0.0, true);
    }

    /// gym-pusht's `_set_state`: agent at rest at `agent`, block position then angle (the
    /// legacy order: pymunk keeps the centre of gravity fixed when the angle changes, so the
    /// block origin ends at `pos + cog - R(angle) cog`). gym-pusht then runs one pymunk step,
    /// which moves nothing: bodies are at rest and pymunk applies a step's contact impulses to
    /// positions only in the following step. So no physics runs here.
    pub fn set_state_legacy(&mut self, agent: [f64; 2], block_pos: [f64; 2], angle: f64) {
        self.agent_pos = agent;
        self.agent_vel = [0.0, 0.0];
        let current = self.block_pose();
        // pymunk: setting the position puts the centre of gravity at pos + R(current) cog.
        let c = Pose::new(block_pos[0], block_pos[1], current.angle).apply(COG);
        let rotated = Pose::new(0.0, 0.0, angle).apply(COG);
        self.set_block_pose(&Pose::new(c[0] - rotated[0], c[1] - rotated[1], angle));
        let a = &mut self.bodies[self.agent];
        a.set_position(
            Pose2::from_translation(Vec2::new(agent[0] as f32, agent[1] as f32)),
            true,
        );
    }

    /// One control step: `SUBSTEPS` substeps of PD control toward `target` and physics.
    pub fn control_step(&mut self, target: [f64; 2]) {
        let PhysicsParams { kp, kv, .. } = self.physics;
        for _ in 0..SUBSTEPS {
            let [px, py] = self.agent_pos;
            let [vx, vy] = self.agent_vel;
            let v = [
                vx + (kp * (target[0] - px) - kv * vx) * DT,
                vy + (kp * (target[1] - py) - kv * vy) * DT,
            ];
            let next = [px + v[0] * DT, py + v[1] * DT];
            self.agent_vel = v;
            let may_touch = self.may_touch_block(self.agent_pos, next);
            self.substep_physics(next, may_touch);
        }
    }

    /// Whether the agent sweeping from `a` to `b` can come near the block. Every point of the
    /// segment lies within half its length of an endpoint, so the sweep stays clear when both
    /// endpoints are farther than radius + margin + half the length from the T.
    fn may_touch_block(&self, a: [f64; 2], b: [f64; 2]) -> bool {
        let block = self.block_pose();
        let [cx, cy] = block.apply(COG);
        let half = 0.5 * (b[0] - a[0]).hypot(b[1] - a[1]);
        let reach = AGENT_RADIUS + CONTACT_MARGIN + half;
        // Cheap reject first: both endpoints outside the T's bounding circle by the reach.
        if (cx - a[0]).hypot(cy - a[1]) > BOUNDING_RADIUS + reach
            && (cx - b[0]).hypot(cy - b[1]) > BOUNDING_RADIUS + reach
        {
            return false;
        }
        distance_to_t(&block, a).min(distance_to_t(&block, b)) <= reach
    }

    /// Moves the agent to `next` and, when anything may touch the block, steps Rapier.
    /// With nothing in reach the block cannot move (it has no velocity), so the step is skipped.
    fn substep_physics(&mut self, next: [f64; 2], step_rapier: bool) {
        self.agent_pos = next;
        let next_v = Vec2::new(next[0] as f32, next[1] as f32);
        if !step_rapier && !self.block_penetrates_wall() {
            let a = &mut self.bodies[self.agent];
            a.set_position(Pose2::from_translation(next_v), false);
            return;
        }
        let b = &mut self.bodies[self.block];
        b.set_linvel(Vec2::ZERO, true);
        b.set_angvel(0.0, true);
        self.bodies[self.agent].set_next_kinematic_translation(next_v);
        // The pipeline holds only scratch buffers, so one per thread serves every world (results
        // do not depend on its history; the snapshot and thread-count tests check this).
        PIPELINE.with_borrow_mut(|pipeline| {
            pipeline.step(
                Vec2::ZERO,
                &self.params,
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
            )
        });
        // Space damping 0: no velocity survives the substep.
        let b = &mut self.bodies[self.block];
        b.set_linvel(Vec2::ZERO, false);
        b.set_angvel(0.0, false);
    }

    /// Whether any corner of the T lies beyond a wall's inner face (walls run at 5 and 506 px
    /// with radius 2), i.e. the block penetrates a wall and Rapier would push it out. A block
    /// merely touching a wall has no velocity and nothing pushing it, so it cannot move.
    fn block_penetrates_wall(&self) -> bool {
        let block = self.block_pose();
        let (lo, hi) = (7.0, 504.0);
        OUTLINE.iter().any(|&v| {
            let [x, y] = block.apply(v);
            x < lo || x > hi || y < lo || y > hi
        })
    }
}
