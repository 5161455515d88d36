//! `lang-cubes`: the language-conditioned suite on the tabletop arm. Three cubes (red, green,
//! blue; the tabletop tasks' 2 cm half-size cube) lie apart on the table; each reset draws one
//! of the 21 instructions of [`crate::language`] from the active set and one of its
//! paraphrases, and every observation carries that paraphrase as its text.
//!
//! The arm, its control, physics, domain randomisation and camera are [`Tabletop`]'s (an inner
//! [`Tabletop`] with three cubes drives them); this environment draws its own scene, observes,
//! scores and judges success ([`crate::language::success`], [`crate::language::score`]).
//!
//! - **State** ([`state_names`], 45 values): the tabletop proprioception (joint positions and
//!   velocities, TCP position, gripper opening: 22), the cubes' poses in colour order red,
//!   green, blue (7 each: 21), then the instruction's index in
//!   [`INSTRUCTIONS`] and the paraphrase's index (2). Those
//!   two make a recorded state restore the episode's instruction
//!   ([`LangCubes::reset_to_state`]); observations drop them, so there is no goal in the state
//!   and a policy has to read the text.
//! - **Observations**: `obs = "state"`: the first 43 values; `obs = "pixels"`: the front
//!   camera's image (cubes in their colours, no goal marker) plus the proprioception (joint
//!   positions, TCP, gripper opening: 13 values). Text: always the instruction's paraphrase.
//! - **Resets** (seeded): the instruction (uniform over the active set) and paraphrase
//!   (uniform), the arm's joints as the tabletop tasks draw them, then the cubes: a common
//!   offset uniform in [-4, 4] cm^2, each cube's centre uniform in [-8, 8] x [-14, 14] cm
//!   around it with a uniform yaw, at least [`MIN_SEPARATION`] apart (StackCube-v1's scheme,
//!   kept further apart so that open fingers fit beside a cube), redrawn when the drawn
//!   instruction already holds (a cube already beside its reference) or cannot be done (the
//!   third cube within [`TARGET_CLEARANCE`] of the point 10 cm beside the reference).
//! - **Episodes** last [`MAX_EPISODE_STEPS`] = 80 control steps (4 s) and end on success: the
//!   scripted expert stacks in about 40 steps and places beside in about 45.

use std::sync::Arc;

use diffrl_core::config::{Invalid, Validate};
use diffrl_core::scene::{ActionPoints3d, Body, Scene, Shape3d, Transform3d};
use diffrl_core::seeding::{self, Rng};
use diffrl_core::space::ImageObs;
use diffrl_core::stages::StagePredicates;
use diffrl_core::task::{DatasetInfo, Expert, Task, TaskEnv};
use diffrl_core::{BoxSpace, Env, EnvError, Info, Observation, ObservationSpace, StepResult};
use rand::Rng as _;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};

use crate::camera::Renderer;
use crate::env::{
    ACTION_SCALE, OVERLAP_TOLERANCE, ObsMode, Randomization, Snapshot, Tabletop, TabletopConfig,
    TabletopError, TaskKind, layout,
};
use crate::expert::{
    CARRY_CLEARANCE, CARRY_SPEED, CLOSE, ExpertConfig, View, grasp, place_at, stack_on,
    toward_capped, xy_dist,
};
use crate::language::{
    Color, CubeFacts, GOAL_DIM, INSTRUCTIONS, Instruction, InstructionSet, PARAPHRASES, PICK_LIFT,
    SceneFacts, Side, beside, beside_point, on_top,
};
use crate::pixels::ArmDrawing;
use crate::robot::ARM_DOF;
use crate::world::{ArmJoints, BodyPose, CUBE_HALF};

/// The task's name.
pub const NAME: &str = "lang-cubes";
/// Episode length (control steps): about twice what the expert needs to stack or place.
pub const MAX_EPISODE_STEPS: usize = 80;
/// Length of the true state.
pub const STATE_DIM: usize = layout::CUBES + 7 * 3 + 2;
/// Length of a state observation (the true state without the instruction indices).
pub const OBSERVED_STATE_DIM: usize = layout::CUBES + 7 * 3;
/// Index of the instruction's index (into [`INSTRUCTIONS`]) in the true state.
pub const INSTRUCTION_INDEX: usize = OBSERVED_STATE_DIM;
/// Index of the paraphrase's index in the true state.
pub const PARAPHRASE_INDEX: usize = OBSERVED_STATE_DIM + 1;
/// Smallest distance between cube centres at reset (m): two cubes' xy bounding radii (5.7 cm)
/// plus room for an open finger between them. At 8 cm the fingers, which close along world y,
/// landed on a neighbour 8-9 cm away along y and the pick expert fell to 97%.
pub const MIN_SEPARATION: f64 = 0.10;
/// Stream of the reset seed that draws the told instruction under `shuffle_text`.
const TOLD_STREAM: u64 = 0x7e11;
/// The common offset of the cubes is uniform in +- this along x and y (m).
const SPAWN_OFFSET: f64 = 0.04;
/// Each cube's centre is uniform in +- this around the common offset (m, x then y): the
/// beside targets 10 cm further along y stay within the arm's reach.
const SPAWN_HALF: [f64; 2] = [0.08, 0.14];
/// Pick: the expert lifts the cube's centre this far above its resting height (m), 3 cm over
/// the success height.
const PICK_HOLD: f64 = PICK_LIFT + 0.03;
/// Beside: the expert's target keeps at least this from the third cube's centre (m), and
/// resets keep the third cube this far from the point 10 cm beside the reference.
pub const TARGET_CLEARANCE: f64 = 0.08;

/// Names of the true state's components.
pub fn state_names() -> Vec<String> {
    let mut n = TaskKind::ReachGoal.state_names();
    n.truncate(layout::CUBES);
    for c in Color::ALL {
        n.extend(
            ["x", "y", "z", "qx", "qy", "qz", "qw"]
                .iter()
                .map(|s| format!("{}_cube_{s}", c.name())),
        );
    }
    n.extend(["instruction_index", "paraphrase_index"].map(String::from));
    n
}

/// Indices into the true state of the state part of `config`'s observations.
pub fn observed_indices(config: &LangCubesConfig) -> Vec<usize> {
    match config.obs {
        ObsMode::State => (0..OBSERVED_STATE_DIM)
            .filter(|i| config.joint_velocities || !(layout::QD..layout::TCP).contains(i))
            .collect(),
        ObsMode::Pixels => (layout::Q..layout::Q + 9)
            .chain(layout::TCP..layout::GRIPPER + 1)
            .collect(),
    }
}

/// Names of the goal values `goal_in_state` appends ([`Instruction::one_hot`]).
pub fn goal_names() -> Vec<String> {
    let mut n: Vec<String> = ["pick", "stack", "left_of", "right_of"]
        .iter()
        .map(|f| format!("goal_{f}"))
        .collect();
    for role in ["cube", "reference"] {
        n.extend(
            Color::ALL
                .iter()
                .map(|c| format!("goal_{role}_{}", c.name())),
        );
    }
    n
}

/// Positions (noised by `obs_noise`): joint positions, TCP, cube centres.
fn is_position(i: usize) -> bool {
    i < layout::QD
        || (layout::TCP..layout::TCP + 3).contains(&i)
        || (layout::CUBES..OBSERVED_STATE_DIM).contains(&i) && (i - layout::CUBES) % 7 < 3
}

/// The instruction and paraphrase a true state records, if they are valid indices.
pub fn recorded_instruction(state: &[f64]) -> Option<(Instruction, usize)> {
    let index =
        |v: f64, n: usize| (v.fract() == 0.0 && v >= 0.0 && v < n as f64).then_some(v as usize);
    let i = index(*state.get(INSTRUCTION_INDEX)?, INSTRUCTIONS.len())?;
    let p = index(*state.get(PARAPHRASE_INDEX)?, PARAPHRASES)?;
    Some((INSTRUCTIONS[i], p))
}

/// The instruction a recorded state (f32, as datasets store it) holds; an error names the two
/// invalid indices.
fn recorded_goal(state: &[f32]) -> Result<Instruction, String> {
    let s: Vec<f64> = state.iter().map(|&v| f64::from(v)).collect();
    recorded_instruction(&s).map(|(i, _)| i).ok_or_else(|| {
        format!(
            "records instruction_index {} and paraphrase_index {}, not valid indices",
            s.get(INSTRUCTION_INDEX).copied().unwrap_or(f64::NAN),
            s.get(PARAPHRASE_INDEX).copied().unwrap_or(f64::NAN)
        )
    })
}

/// `[env]` of `lang-cubes`. `Default` is what an omitted table or key means.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LangCubesConfig {
    /// Observation mode (the tabletop tasks' `obs`).
    pub obs: ObsMode,
    /// Side of the camera images in pixels (16..=256).
    pub image_size: u32,
    /// Step limit ([`MAX_EPISODE_STEPS`]).
    pub max_episode_steps: usize,
    /// Which instructions resets draw from: `"train"` (all but the held-out combinations),
    /// `"held-out"` (only them) or `"all"`.
    pub instructions: InstructionSet,
    /// One instruction every reset uses, in its canonical form (`"stack red on green"`,
    /// [`Instruction::canonical`]), for per-instruction evaluation; it overrides
    /// `instructions`. Empty: draw from `instructions`.
    pub instruction: String,
    /// Language ablation: when true, every observation's text is a paraphrase of an
    /// instruction drawn uniformly from the `instructions` set (ignoring `instruction`) by a
    /// stream of the reset seed of its own, independent of the instruction the episode is
    /// scored on (they coincide with probability 1 / the set's size). Success and score still
    /// follow the real instruction, and recorded states still hold it.
    pub shuffle_text: bool,
    /// Oracle ablation: when true, the observed state ends with the told instruction's
    /// one-hot form ([`Instruction::one_hot`]: family, moved cube, reference cube; 10 values),
    /// so a policy can follow the goal without reading the text. It measures what the text
    /// path costs; the text is still in every observation.
    pub goal_in_state: bool,
    /// Whether state observations hold the joint velocities (pixels observations never do).
    pub joint_velocities: bool,
    /// How the arm's joints are simulated (the tabletop tasks' `arm_joints`).
    pub arm_joints: ArmJoints,
    /// Domain randomisation (the tabletop tasks' `[env.randomize]`).
    pub randomize: Randomization,
}

impl Default for LangCubesConfig {
    fn default() -> Self {
        Self {
            obs: ObsMode::State,
            image_size: crate::pixels::DEFAULT_IMAGE_SIZE,
            max_episode_steps: MAX_EPISODE_STEPS,
            instructions: InstructionSet::Train,
            instruction: String::new(),
            shuffle_text: false,
            goal_in_state: false,
            joint_velocities: true,
            arm_joints: ArmJoints::default(),
            randomize: Randomization::default(),
        }
    }
}

impl LangCubesConfig {
    /// The settings of the arm that drives the scene.
    fn arm_config(&self) -> TabletopConfig {
        TabletopConfig {
            kind: TaskKind::PickCube,
            obs: ObsMode::State,
            image_size: self.image_size,
            max_episode_steps: self.max_episode_steps,
            arm_joints: self.arm_joints,
            randomize: self.randomize.clone(),
        }
    }

    /// The instructions resets draw from.
    pub fn active(&self) -> Vec<Instruction> {
        match Instruction::parse(&self.instruction) {
            Some(i) => vec![i],
            None => self.instructions.members(),
        }
    }
}

impl Validate for LangCubesConfig {
    fn validate(&self) -> Result<(), Invalid> {
        self.arm_config().validate()?;
        if !self.instruction.is_empty() && Instruction::parse(&self.instruction).is_none() {
            let valid: Vec<String> = INSTRUCTIONS
                .iter()
                .map(|i| format!("{:?}", i.canonical()))
                .collect();
            return Err(Invalid::new(
                "instruction",
                format!(
                    "unknown instruction {:?}; valid: {}",
                    self.instruction,
                    valid.join(", ")
                ),
            ));
        }
        Ok(())
    }
}

/// Everything needed to continue an episode exactly.
#[derive(Clone)]
pub struct LangSnapshot {
    arm: Snapshot,
    instruction: Instruction,
    paraphrase: usize,
    told: Option<(Instruction, usize)>,
    done: bool,
}

/// The `lang-cubes` environment.
#[derive(Clone)]
pub struct LangCubes {
    config: LangCubesConfig,
    arm: Tabletop,
    instruction: Instruction,
    paraphrase: usize,
    /// The instruction and paraphrase the observations tell instead (`shuffle_text`).
    told: Option<(Instruction, usize)>,
    done: bool,
    drawing: Arc<ArmDrawing>,
    /// Kept between observations in pixels mode.
    renderer: Option<Renderer>,
}

impl LangCubes {
    /// The environment of `config` with the shipped Panda, reset to seed 0. Panics only if
    /// the config is invalid or the shipped asset is broken ([`LangCubes::try_new`] returns
    /// that as an error).
    pub fn new(config: LangCubesConfig) -> Self {
        Self::try_new(config).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The environment of `config`, reset to seed 0.
    pub fn try_new(config: LangCubesConfig) -> Result<Self, TabletopError> {
        config.validate()?;
        let arm = Tabletop::arm_with_cubes(config.arm_config(), Color::ALL.len())?;
        let drawing = Arc::new(ArmDrawing::new(arm.world()));
        let renderer = (config.obs == ObsMode::Pixels)
            .then(|| Renderer::new(arm.camera()).unwrap_or_else(|e| panic!("{e}")));
        let mut env = Self {
            config,
            arm,
            instruction: INSTRUCTIONS[0],
            paraphrase: 0,
            told: None,
            done: false,
            drawing,
            renderer,
        };
        env.reset(0);
        Ok(env)
    }

    /// The settings.
    pub fn config(&self) -> &LangCubesConfig {
        &self.config
    }

    /// This episode's instruction.
    pub fn instruction(&self) -> Instruction {
        self.instruction
    }

    /// This episode's paraphrase index.
    pub fn paraphrase(&self) -> usize {
        self.paraphrase
    }

    /// This episode's text, as every observation carries it.
    pub fn text(&self) -> String {
        match self.told {
            Some((i, p)) => i.text(p),
            None => self.instruction.text(self.paraphrase),
        }
    }

    /// How many goal values end the observed state (`goal_in_state`).
    fn goal_len(&self) -> usize {
        if self.config.goal_in_state {
            GOAL_DIM
        } else {
            0
        }
    }

    /// The instruction the observations tell: the real one, or the shuffled one under
    /// `shuffle_text`.
    pub fn told_instruction(&self) -> Instruction {
        self.told.map_or(self.instruction, |(i, _)| i)
    }

    /// The instruction the observations tell under `shuffle_text`, drawn from its own stream
    /// of `seed`; None without `shuffle_text`.
    fn draw_told(&self, seed: u64) -> Option<(Instruction, usize)> {
        if !self.config.shuffle_text {
            return None;
        }
        let mut rng = seeding::rng(seeding::derive(seed, TOLD_STREAM));
        let set = self.config.instructions.members();
        let i = set[rng.random_range(0..set.len())];
        Some((i, rng.random_range(0..PARAPHRASES)))
    }

    /// The arm, physics and camera.
    pub fn arm(&self) -> &Tabletop {
        &self.arm
    }

    /// What success and score read of the current scene.
    pub fn facts(&self) -> SceneFacts {
        let w = self.arm.world();
        let norm = |v: [f64; 3]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let tcp = w.tcp_pose().translation.vector;
        let qd = w.joint_velocities();
        SceneFacts {
            tcp: [tcp.x, tcp.y, tcp.z],
            opening: w.gripper_opening(),
            arm_speed: qd[..ARM_DOF].iter().map(|v| v * v).sum::<f64>().sqrt(),
            cubes: [0, 1, 2].map(|i| {
                let (v, av) = w.cube_velocity(i);
                CubeFacts {
                    position: w.cube_pose(i).position,
                    speed: norm(v),
                    spin: norm(av),
                    grasped: w.is_grasping(i),
                }
            }),
        }
    }

    /// Whether the instruction is accomplished now.
    pub fn is_success(&self) -> bool {
        crate::language::success(self.instruction, &self.facts())
    }

    /// The current score in [0, 1].
    pub fn score(&self) -> f64 {
        crate::language::score(self.instruction, &self.facts())
    }

    /// The full noise-free state ([`state_names`]).
    pub fn true_state(&self) -> Vec<f64> {
        let w = self.arm.world();
        let mut s = Vec::with_capacity(STATE_DIM);
        s.extend(w.joint_positions());
        s.extend(w.joint_velocities());
        let tcp = w.tcp_pose().translation.vector;
        s.extend([tcp.x, tcp.y, tcp.z, w.gripper_opening()]);
        for i in 0..Color::ALL.len() {
            let p = w.cube_pose(i);
            s.extend(p.position);
            s.extend(p.rotation);
        }
        s.extend([self.instruction.index() as f64, self.paraphrase as f64]);
        s
    }

    /// Starts an episode from a full state ([`LangCubes::true_state`]'s layout): joint
    /// positions and velocities, cube poses, and the instruction and paraphrase from their
    /// indices (whatever `instructions` allows: a recorded episode keeps its instruction);
    /// TCP and gripper opening follow from the joints; cubes start at rest. `seed` seeds the
    /// episode's domain randomisation.
    pub fn reset_to_state(&mut self, state: &[f64], seed: u64) -> Result<Observation, EnvError> {
        let names = state_names();
        if state.len() != STATE_DIM {
            return Err(EnvError::InvalidState(format!(
                "{NAME} states have {STATE_DIM} values ({}), got {}",
                names.join(","),
                state.len()
            )));
        }
        if let Some(i) = state.iter().position(|v| !v.is_finite()) {
            return Err(EnvError::InvalidState(format!(
                "component {i} ({}) is {} (not finite)",
                names[i], state[i]
            )));
        }
        let (instruction, paraphrase) = recorded_instruction(state).ok_or_else(|| {
            EnvError::InvalidState(format!(
                "instruction_index {} must be an integer in 0..{} and paraphrase_index {} one \
                 in 0..{PARAPHRASES}",
                state[INSTRUCTION_INDEX],
                INSTRUCTIONS.len(),
                state[PARAPHRASE_INDEX]
            ))
        })?;
        let mut q = [0.0; 9];
        q.copy_from_slice(&state[layout::Q..layout::Q + 9]);
        self.arm.check_joint_limits(&q)?;
        let mut cubes = Vec::new();
        for c in Color::ALL {
            let o = layout::CUBES + 7 * c.index();
            let r = [state[o + 3], state[o + 4], state[o + 5], state[o + 6]];
            let norm = r.iter().map(|x| x * x).sum::<f64>().sqrt();
            if !(0.5..=2.0).contains(&norm) {
                return Err(EnvError::InvalidState(format!(
                    "the {} cube's quaternion {r:?} is not a rotation (norm {norm})",
                    c.name()
                )));
            }
            cubes.push(BodyPose {
                position: [state[o], state[o + 1], state[o + 2]],
                rotation: r.map(|x| x / norm),
            });
        }
        let before = self.snapshot();
        self.arm.start(seeding::rng(seed), q, &cubes, [0.0; 3]);
        if let Some((cube, what, depth)) = self.arm.world().cube_overlap(OVERLAP_TOLERANCE) {
            self.put_back(&before);
            let name = |i: usize| Color::ALL.get(i).map_or("?", |c| c.name());
            let what = match what.strip_prefix("cube ") {
                Some(j) => format!("the {} cube", j.parse().map_or("?", name)),
                None => what,
            };
            return Err(EnvError::InvalidState(format!(
                "the {} cube overlaps {what} by {:.1} mm",
                name(cube),
                depth * 1000.0
            )));
        }
        let mut qd = [0.0; 9];
        qd.copy_from_slice(&state[layout::QD..layout::QD + 9]);
        self.arm.world_mut().set_joint_velocities(qd);
        self.instruction = instruction;
        self.paraphrase = paraphrase;
        self.told = self.draw_told(seed);
        self.done = false;
        Ok(self.observe())
    }

    fn put_back(&mut self, s: &LangSnapshot) {
        self.arm.set_snapshot(&s.arm);
        self.instruction = s.instruction;
        self.paraphrase = s.paraphrase;
        self.told = s.told;
        self.done = s.done;
    }

    /// The camera image of the current state (this episode's camera and tint).
    pub fn render_image(&self) -> ImageObs {
        let mut renderer = Renderer::new(self.arm.camera())
            .unwrap_or_else(|e| panic!("image_size is validated: {e}"));
        self.draw(&mut renderer)
    }

    fn draw(&self, renderer: &mut Renderer) -> ImageObs {
        let camera = self.arm.camera();
        if *renderer.camera() != camera {
            renderer
                .set_camera(camera)
                .unwrap_or_else(|e| panic!("a jittered valid camera is valid: {e}"));
        }
        // Rounded to f32 as datasets record it, so `render_state` gives the same bytes.
        let state: Vec<f64> = self
            .true_state()
            .into_iter()
            .map(|v| f64::from(v as f32))
            .collect();
        let bodies = state_bodies(&state, &self.drawing)
            .unwrap_or_else(|e| panic!("the env's own state draws: {e}"));
        let mut image = renderer.render(&bodies).image_obs();
        crate::pixels::tint(&mut image.data, self.arm.color_scale());
        image
    }
}

/// Draws the cubes' poses: see the module docs. Redraws (up to 100 times) while a beside
/// instruction already holds or the third cube blocks its target ([`beside_point`]: within
/// [`TARGET_CLEARANCE`] of it).
fn draw_cubes(rng: &mut Rng, instruction: Instruction) -> Vec<BodyPose> {
    let mut centres = [[0.0; 2]; 3];
    for _ in 0..100 {
        let (ox, oy) = (
            rng.random_range(-SPAWN_OFFSET..SPAWN_OFFSET),
            rng.random_range(-SPAWN_OFFSET..SPAWN_OFFSET),
        );
        for c in 0..centres.len() {
            let mut draw = || {
                [
                    ox + rng.random_range(-SPAWN_HALF[0]..SPAWN_HALF[0]),
                    oy + rng.random_range(-SPAWN_HALF[1]..SPAWN_HALF[1]),
                ]
            };
            let mut p = draw();
            for _ in 0..100 {
                let apart = centres[..c]
                    .iter()
                    .all(|q| (p[0] - q[0]).hypot(p[1] - q[1]) > MIN_SEPARATION);
                if apart {
                    break;
                }
                p = draw();
            }
            centres[c] = p;
        }
        let at = |c: Color| [centres[c.index()][0], centres[c.index()][1], CUBE_HALF];
        let redraw = match instruction {
            Instruction::Beside(x, side, y) => {
                let third = at(Color::ALL[3 - x.index() - y.index()]);
                beside(at(x), side, at(y))
                    || xy_dist(third, beside_point(side, at(y))) < TARGET_CLEARANCE
            }
            Instruction::Pick(_) | Instruction::Stack(..) => false,
        };
        if !redraw {
            break;
        }
    }
    centres
        .into_iter()
        .map(|[x, y]| {
            let yaw = rng.random_range(0.0..2.0 * std::f64::consts::PI);
            let (s, c) = (yaw / 2.0).sin_cos();
            BodyPose {
                position: [x, y, CUBE_HALF],
                rotation: [0.0, 0.0, s, c],
            }
        })
        .collect()
}

/// The bodies the camera draws at the flat state `state` ([`state_names`]; the instruction
/// indices may be left off): table, arm, cubes in their colours.
pub fn state_bodies(state: &[f64], arm: &ArmDrawing) -> Result<Vec<Body>, String> {
    if state.len() != STATE_DIM && state.len() != OBSERVED_STATE_DIM {
        return Err(format!(
            "{NAME} images are drawn from {STATE_DIM}-value states ({}), this one has {}",
            state_names().join(", "),
            state.len()
        ));
    }
    if let Some(i) = state.iter().position(|v| !v.is_finite()) {
        return Err(format!(
            "state component {i} ({}) is {}, not finite",
            state_names()[i],
            state[i]
        ));
    }
    let mut q = [0.0; 9];
    q.copy_from_slice(&state[layout::Q..layout::Q + 9]);
    let cubes: Vec<BodyPose> = Color::ALL
        .iter()
        .map(|c| {
            let o = layout::CUBES + 7 * c.index();
            BodyPose {
                position: [state[o], state[o + 1], state[o + 2]],
                rotation: [state[o + 3], state[o + 4], state[o + 5], state[o + 6]],
            }
        })
        .collect();
    let mut s = Scene::default();
    crate::scene::push_table(&mut s);
    crate::scene::push_links(&mut s, &arm.link_boxes(&q));
    push_cubes(&mut s, &cubes);
    Ok(s.bodies)
}

fn push_cubes(s: &mut Scene, cubes: &[BodyPose]) {
    let names = ["red_cube", "green_cube", "blue_cube"];
    for ((c, name), p) in Color::ALL.into_iter().zip(names).zip(cubes) {
        s.push_body(
            name,
            Shape3d::Box {
                half_extents: [CUBE_HALF as f32; 3],
            },
            Transform3d {
                translation: p.position.map(|v| v as f32),
                rotation: p.rotation.map(|v| v as f32),
            },
            c.rgba(),
        );
    }
}

impl Env for LangCubes {
    type Snapshot = LangSnapshot;

    fn observation_space(&self) -> ObservationSpace {
        let indices = observed_indices(&self.config);
        let mut space = crate::env::arm_observation_space(
            &state_names(),
            &indices,
            self.config.obs,
            self.config.image_size,
            true,
        );
        if let (Some(state), true) = (space.state.as_mut(), self.config.goal_in_state) {
            state.low.extend([0.0; GOAL_DIM]);
            state.high.extend([1.0; GOAL_DIM]);
            state.names.extend(goal_names());
        }
        space
    }

    fn action_space(&self) -> BoxSpace {
        self.arm.action_space()
    }

    fn max_episode_steps(&self) -> usize {
        self.config.max_episode_steps
    }

    /// The instruction and paraphrase, the arm's joints, then the cubes (module docs).
    fn reset(&mut self, seed: u64) -> Observation {
        let mut rng = seeding::rng(seed);
        let active = self.config.active();
        let instruction = active[rng.random_range(0..active.len())];
        let paraphrase = rng.random_range(0..PARAPHRASES);
        let q = self.arm.initial_joints(&mut rng);
        let cubes = draw_cubes(&mut rng, instruction);
        self.arm.start(rng, q, &cubes, [0.0; 3]);
        self.instruction = instruction;
        self.paraphrase = paraphrase;
        self.told = self.draw_told(seed);
        self.done = false;
        self.observe()
    }

    fn step(&mut self, action: &[f32]) -> Result<StepResult, EnvError> {
        if self.done {
            return Err(EnvError::EpisodeOver);
        }
        let mut a = action.to_vec();
        let clamped = self.action_space().check_and_clamp(&mut a)?;
        self.arm.advance([a[0], a[1], a[2], a[3]]);
        let facts = self.facts();
        let success = crate::language::success(self.instruction, &facts);
        let score = crate::language::score(self.instruction, &facts);
        let truncated = !success && self.arm.elapsed_steps() >= self.config.max_episode_steps;
        self.done = success || truncated;
        Ok(StepResult {
            obs: self.observe(),
            reward: score as f32,
            terminated: success,
            truncated,
            info: Info {
                metrics: Vec::new(),
                score: score as f32,
                success,
                clamped,
            },
        })
    }

    fn snapshot(&self) -> LangSnapshot {
        LangSnapshot {
            arm: self.arm.snapshot(),
            instruction: self.instruction,
            paraphrase: self.paraphrase,
            told: self.told,
            done: self.done,
        }
    }

    fn restore(&mut self, snapshot: &LangSnapshot) -> Observation {
        self.put_back(snapshot);
        self.observe()
    }

    fn observe(&mut self) -> Observation {
        let s = self.true_state();
        let std = self.config.randomize.obs_noise;
        let normal = (std > 0.0).then(|| Normal::new(0.0, std).unwrap_or_else(|_| unreachable!()));
        let indices = observed_indices(&self.config);
        let mut state = Vec::with_capacity(indices.len());
        for i in indices {
            let n = match (&normal, is_position(i)) {
                (Some(d), true) => d.sample(self.arm.rng_mut()),
                _ => 0.0,
            };
            state.push((s[i] + n) as f32);
        }
        if self.config.goal_in_state {
            state.extend(self.told_instruction().one_hot());
        }
        let image = match self.renderer.take() {
            Some(mut renderer) => {
                let image = self.draw(&mut renderer);
                self.renderer = Some(renderer);
                Some(image)
            }
            None => None,
        };
        Observation {
            state,
            image,
            text: Some(self.text()),
        }
    }

    fn elapsed_steps(&self) -> usize {
        self.arm.elapsed_steps()
    }

    fn scene(&self) -> Option<Scene> {
        let w = self.arm.world();
        let mut s = Scene::new_3d([[-0.7, -0.5, -0.1], [0.5, 0.5, 0.9]]);
        crate::scene::push_table(&mut s);
        crate::scene::push_links(&mut s, &w.link_boxes());
        let cubes: Vec<BodyPose> = (0..w.cube_count()).map(|i| w.cube_pose(i)).collect();
        push_cubes(&mut s, &cubes);
        let tcp = w.tcp_pose().translation.vector;
        s.tool = Some([tcp.x, tcp.y, tcp.z].map(|v| v as f32));
        let target = w.target_tcp_pose().translation.vector;
        s.actions_3d = Some(ActionPoints3d {
            origin: [target.x, target.y, target.z].map(|v| v as f32),
            scale: [ACTION_SCALE as f32; 3],
            cumulative: true,
        });
        s.image = self.renderer.as_ref().map(|r| self.draw(&mut r.clone()));
        Some(s)
    }

    /// 1 cm for positions, 0.1 rad for joints, 0.5 for velocities and quaternions (per
    /// observed state component), as the tabletop tasks'.
    fn anchor_cells(&self) -> Option<Vec<f32>> {
        Some(
            observed_indices(&self.config)
                .into_iter()
                .map(|i| {
                    if i < layout::QD {
                        0.1
                    } else if i < layout::TCP {
                        0.5
                    } else if is_position(i) {
                        0.01
                    } else {
                        0.5
                    }
                })
                .chain(std::iter::repeat_n(0.5, self.goal_len()))
                .collect(),
        )
    }
}

impl TaskEnv for LangCubes {
    fn true_state(&self) -> Vec<f64> {
        LangCubes::true_state(self)
    }

    fn reset_to_state(&mut self, state: &[f64], seed: u64) -> Result<Observation, EnvError> {
        LangCubes::reset_to_state(self, state, seed)
    }

    /// `ee_pose` (`[x, y, z, qx, qy, qz, qw]`), `gripper_opening` (m), `red_cube_pose`,
    /// `green_cube_pose`, `blue_cube_pose`, `instruction_index` and `paraphrase_index`.
    fn named_state(&self) -> Vec<(&'static str, Vec<f64>)> {
        let w = self.arm.world();
        let tcp = w.tcp_pose();
        let (t, r) = (tcp.translation.vector, tcp.rotation);
        let mut out = vec![
            ("ee_pose", vec![t.x, t.y, t.z, r.i, r.j, r.k, r.w]),
            ("gripper_opening", vec![w.gripper_opening()]),
        ];
        for (c, name) in
            Color::ALL
                .into_iter()
                .zip(["red_cube_pose", "green_cube_pose", "blue_cube_pose"])
        {
            let p = w.cube_pose(c.index());
            out.push((name, p.position.into_iter().chain(p.rotation).collect()));
        }
        out.push(("instruction_index", vec![self.instruction.index() as f64]));
        out.push(("paraphrase_index", vec![self.paraphrase as f64]));
        out
    }

    fn describe_step(&self, action: &[f32], r: &StepResult) -> String {
        let s = LangCubes::true_state(self);
        let cube = self.instruction.cube();
        let o = layout::CUBES + 7 * cube.index();
        let t = layout::TCP;
        format!(
            "action {action:?}  tcp ({:6.3}, {:6.3}, {:6.3})  gripper {:5.3}  {} cube ({:6.3}, \
             {:6.3}, {:6.3})  score {:.3}{}",
            s[t],
            s[t + 1],
            s[t + 2],
            s[layout::GRIPPER],
            cube.name(),
            s[o],
            s[o + 1],
            s[o + 2],
            r.info.score,
            if r.info.success { "  SUCCESS" } else { "" }
        )
    }
}

/// Where the expert puts the cube for a beside instruction: [`beside_point`] (10 cm beside
/// the reference) unless the third cube is within [`TARGET_CLEARANCE`] of it, else the first
/// clear point of a small grid inside the success band (7.5-12.5 cm along, +-2 cm across).
fn beside_target(v: &View, x: usize, side: Side, y: usize) -> [f64; 3] {
    let reference = v.cube(y);
    let third = v.cube(3 - x - y);
    for along in [0.10, 0.085, 0.115, 0.075, 0.125] {
        for across in [0.0, 0.02, -0.02] {
            let p = [
                reference[0] + across,
                reference[1] + side.sign() * along,
                CUBE_HALF,
            ];
            if xy_dist(p, third) >= TARGET_CLEARANCE {
                return p;
            }
        }
    }
    beside_point(side, reference)
}

/// The expert's action `[dx, dy, dz, gripper]` at the true state `s` ([`state_names`]),
/// which records the instruction: the tabletop experts' phases (approach, descend, grasp,
/// lift, carry, lower, release) with the named cubes. Pick lifts the cube to 8 cm above its
/// resting height and holds it; stack puts it on the reference; beside carries it over the
/// other cubes to 10 cm beside the reference (or the nearest point inside the success band
/// that keeps [`TARGET_CLEARANCE`] from the third cube) and sets it down.
pub fn expert_action(s: &[f64], gain: f64) -> [f32; 4] {
    let Some((instruction, _)) = (s.len() == STATE_DIM)
        .then(|| recorded_instruction(s))
        .flatten()
    else {
        return [0.0, 0.0, 0.0, 1.0];
    };
    let v = View { s };
    let x = instruction.cube().index();
    let (motion, gripper) = match instruction {
        Instruction::Pick(_) => grasp(&v, x, gain).unwrap_or_else(|| {
            let (tcp, cube) = (v.tcp(), v.cube(x));
            let hold = [cube[0], cube[1], CUBE_HALF + PICK_HOLD];
            let target = [0, 1, 2].map(|i| tcp[i] + hold[i] - cube[i]);
            (toward_capped(tcp, target, gain, CARRY_SPEED), CLOSE)
        }),
        Instruction::Stack(_, y) => stack_on(&v, x, y.index(), gain),
        Instruction::Beside(_, side, y) => {
            let target = beside_target(&v, x, side, y.index());
            let cube = v.cube(x);
            let placed = beside(cube, side, v.cube(y.index()))
                && (cube[2] - CUBE_HALF).abs() <= crate::language::ON_TABLE_TOLERANCE;
            let place = [target[0], target[1], CUBE_HALF + 0.004];
            // Carried with its bottom clearing the other cubes' tops, as stacking does.
            let carry_z = CUBE_HALF + 4.0 * CUBE_HALF + CARRY_CLEARANCE;
            place_at(&v, x, place, carry_z, placed, gain)
        }
    };
    [
        motion[0] as f32,
        motion[1] as f32,
        motion[2] as f32,
        gripper as f32,
    ]
}

/// The scripted expert of `lang-cubes` ([`expert_action`] plus the `[expert]` noise).
#[derive(Debug, Clone)]
pub struct LangExpert {
    config: ExpertConfig,
    rng: Rng,
}

impl LangExpert {
    /// An expert seeded with `seed`.
    pub fn new(config: ExpertConfig, seed: u64) -> Self {
        Self {
            config,
            rng: seeding::rng(seed),
        }
    }
}

impl Expert<LangCubes> for LangExpert {
    fn reset(&mut self, seed: u64) {
        self.rng = seeding::rng(seed);
    }

    fn act(&mut self, env: &LangCubes) -> Vec<f32> {
        let mut a = expert_action(&env.true_state(), self.config.gain);
        if self.config.action_noise > 0.0
            && let Ok(n) = Normal::new(0.0, self.config.action_noise)
        {
            for x in a.iter_mut().take(3) {
                *x = (*x + n.sample(&mut self.rng) as f32).clamp(-1.0, 1.0);
            }
        }
        a.to_vec()
    }
}

/// Stages for the progress reward model: reach, grasp, lift and place the named cube, with
/// [`crate::stages::TabletopStages`]' thresholds. The named cube and the place test come
/// from the instruction a recorded state holds, or from the goal values a `goal_in_state`
/// observation ends with; a state observation without either is judged on the cube nearest
/// the TCP and never completes "place" (stage labels count a successful episode's last state
/// as complete anyway).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LangStages {
    /// The TCP counts as at a cube within this distance of its centre (m).
    pub reach: f64,
    /// A cube counts as lifted this far above resting on the table (m).
    pub lift: f64,
    /// Whether the state observations it judges hold the joint velocities (`[env]
    /// joint_velocities`); recorded states always do.
    pub joint_velocities: bool,
}

impl Default for LangStages {
    fn default() -> Self {
        Self {
            reach: 0.02,
            lift: 0.01,
            joint_velocities: true,
        }
    }
}

impl StagePredicates for LangStages {
    fn names(&self) -> Vec<String> {
        [
            "reach the named cube",
            "grasp it",
            "lift it",
            "place it as instructed",
        ]
        .map(String::from)
        .to_vec()
    }

    fn completed(&self, state: &[f32]) -> usize {
        let velocities = layout::TCP - layout::QD;
        let without = [OBSERVED_STATE_DIM, OBSERVED_STATE_DIM + GOAL_DIM].map(|n| n - velocities);
        if !self.joint_velocities && without.contains(&state.len()) {
            // Judged in the full layout; no predicate reads the velocities.
            let mut full = state[..layout::QD].to_vec();
            full.extend(std::iter::repeat_n(0.0, velocities));
            full.extend(&state[layout::QD..]);
            return self.completed(&full);
        }
        let with_goal = OBSERVED_STATE_DIM + GOAL_DIM;
        if ![STATE_DIM, OBSERVED_STATE_DIM, with_goal].contains(&state.len()) {
            return 0;
        }
        let s: Vec<f64> = state.iter().map(|&v| f64::from(v)).collect();
        let v = View { s: &s };
        let tcp = v.tcp();
        let instruction = if state.len() == with_goal {
            Instruction::from_one_hot(&state[OBSERVED_STATE_DIM..])
        } else {
            recorded_instruction(&s).map(|(i, _)| i)
        };
        let dist = |c: [f64; 3]| {
            ((c[0] - tcp[0]).powi(2) + (c[1] - tcp[1]).powi(2) + (c[2] - tcp[2]).powi(2)).sqrt()
        };
        let x = match instruction {
            Some(i) => i.cube().index(),
            None => (0..Color::ALL.len())
                .min_by(|&a, &b| dist(v.cube(a)).total_cmp(&dist(v.cube(b))))
                .unwrap_or(0),
        };
        let cube = v.cube(x);
        let reached = dist(cube) < self.reach;
        // Closed onto the cube: narrower than the open gripper, wider than an empty grip.
        let grasped = reached && v.opening() > 0.03 && v.opening() < 0.07;
        let lifted = grasped && cube[2] > CUBE_HALF + self.lift;
        let on_table = (cube[2] - CUBE_HALF).abs() <= crate::language::ON_TABLE_TOLERANCE;
        let placed = match instruction {
            Some(Instruction::Pick(_)) => lifted && cube[2] >= CUBE_HALF + PICK_LIFT,
            Some(Instruction::Stack(_, y)) => on_top(cube, v.cube(y.index())) && !grasped,
            Some(Instruction::Beside(_, side, y)) => {
                beside(cube, side, v.cube(y.index())) && on_table && !grasped
            }
            None => false,
        };
        [reached, grasped, lifted, placed]
            .iter()
            .rposition(|&p| p)
            .map_or(0, |i| i + 1)
    }
}

/// `lang-cubes` for the tools' task registry: `[env]` is [`LangCubesConfig`], `[expert]` the
/// tabletop tasks' [`ExpertConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LangCubesTask;

impl Task for LangCubesTask {
    type Config = LangCubesConfig;
    type ExpertConfig = ExpertConfig;
    type Env = LangCubes;

    fn name(&self) -> &'static str {
        NAME
    }

    /// Episodes store their own instruction (the reset observation's text); this one is
    /// only the fallback for an episode without one.
    fn dataset(&self) -> DatasetInfo {
        DatasetInfo {
            fps: crate::world::CONTROL_HZ as u32,
            robot_type: "panda".into(),
            state_names: state_names(),
            action_names: crate::task::ACTION_NAMES.map(String::from).to_vec(),
            instruction: "follow the instruction about the red, green and blue cubes".into(),
        }
    }

    fn build(&self, config: &LangCubesConfig) -> LangCubes {
        LangCubes::new(config.clone())
    }

    fn observation(&self, config: &LangCubesConfig) -> String {
        match config.obs {
            ObsMode::State => "state",
            ObsMode::Pixels => "pixels",
        }
        .into()
    }

    /// The recorded state without the instruction indices (state mode), or its
    /// proprioception (pixels mode); then the recorded instruction's one-hot form under
    /// `goal_in_state`.
    fn observe_recorded(
        &self,
        config: &LangCubesConfig,
        state: &[f32],
    ) -> Result<Vec<f32>, String> {
        if state.len() == STATE_DIM {
            let mut observed: Vec<f32> = observed_indices(config)
                .into_iter()
                .map(|i| state[i])
                .collect();
            if config.goal_in_state {
                observed.extend(recorded_goal(state)?.one_hot());
            }
            Ok(observed)
        } else {
            Err(format!(
                "holds {}-d states; {NAME} records {STATE_DIM} values ({})",
                state.len(),
                state_names().join(", ")
            ))
        }
    }

    /// The three cubes' centres (x, y, z of red, green, blue: what a pixel policy has to find
    /// in its frame), then the recorded instruction's goal ([`Instruction::one_hot`]: what the
    /// words ask, the same 10 values `goal_in_state` shows).
    fn privileged_recorded(
        &self,
        _config: &LangCubesConfig,
        state: &[f32],
    ) -> Result<Vec<f32>, String> {
        if state.len() != STATE_DIM {
            return Err(format!(
                "holds {}-d states; {NAME} records {STATE_DIM} values",
                state.len()
            ));
        }
        let goal = recorded_goal(state)?;
        let mut v: Vec<f32> = (0..Color::ALL.len())
            .flat_map(|k| {
                let at = layout::CUBES + 7 * k;
                state[at..at + 3].iter().copied()
            })
            .collect();
        v.extend(goal.one_hot());
        Ok(v)
    }

    fn image_size(&self, config: &LangCubesConfig) -> Option<u32> {
        Some(config.image_size)
    }

    /// Draws a recorded state with the default front camera, without jitter or tint.
    fn render_state(&self, state: &[f32], size: u32) -> Result<Vec<u8>, String> {
        let camera = crate::pixels::default_camera(size).map_err(|e| e.to_string())?;
        let arm = ArmDrawing::shipped()?;
        let state: Vec<f64> = state.iter().map(|&v| f64::from(v)).collect();
        let bodies = state_bodies(&state, &arm)?;
        let mut renderer = Renderer::new(camera).map_err(|e| e.to_string())?;
        Ok(renderer.render(&bodies).rgb.clone())
    }

    fn randomization_key(&self) -> Option<&'static str> {
        Some("randomize")
    }

    /// Camera and colour jitter only change images: unobserved by state policies.
    fn unobserved(&self, config: &LangCubesConfig, fields: &[String]) -> Option<String> {
        crate::env::camera_only_unobserved(config.obs, fields)
    }

    fn expert(&self, config: &ExpertConfig, seed: u64) -> Option<Box<dyn Expert<LangCubes>>> {
        Some(Box::new(LangExpert::new(config.clone(), seed)))
    }

    fn expert_name(&self, _config: &ExpertConfig) -> String {
        "Scripted".into()
    }

    /// Every paraphrase of every instruction, held-out combinations included (their words are
    /// those of the training instructions).
    fn texts(&self, _config: &LangCubesConfig) -> Vec<String> {
        INSTRUCTIONS
            .iter()
            .flat_map(|i| (0..PARAPHRASES).map(move |k| i.text(k)))
            .collect()
    }

    fn stages(&self, config: &LangCubesConfig) -> Option<Box<dyn StagePredicates>> {
        Some(Box::new(LangStages {
            joint_velocities: config.joint_velocities,
            ..LangStages::default()
        }))
    }

    /// The scripted expert's action with uniform noise of +-0.2 on the motion components.
    fn scripted_action(&self, env: &LangCubes, rng: &mut Rng) -> Option<Vec<f32>> {
        let mut a = expert_action(&env.true_state(), ExpertConfig::default().gain);
        for x in a.iter_mut().take(3) {
            *x = (*x + rng.random_range(-0.2..0.2)).clamp(-1.0, 1.0);
        }
        Some(a.to_vec())
    }
}
