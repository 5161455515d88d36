//! The tabletop tasks as tasks of the tools: `reach-goal`, `push-cube`, `pick-cube` and
//! `stack-cube`, one [`TabletopTask`] each. `[env]` is [`TabletopConfig`] (its `kind` is
//! the task's own: see [`TabletopTask::build`]), `[expert]` is [`ExpertConfig`],
//! `[env.randomize]` holds the domain randomisation. The CLI registers them in its task list.

use diffrl_core::seeding::Rng;
use diffrl_core::stages::StagePredicates;
use diffrl_core::task::{DatasetInfo, Task, TaskEnv};
use diffrl_core::{EnvError, Observation, StepResult};
use rand::Rng as _;

use crate::camera::Renderer;
use crate::env::{ObsMode, Tabletop, TabletopConfig, TaskKind, observed_indices};
use crate::expert::{ExpertConfig, TabletopExpert, expert_action};
use crate::pixels::ArmDrawing;
use crate::stages::TabletopStages;

/// Action component names.
pub const ACTION_NAMES: [&str; 4] = ["dx", "dy", "dz", "gripper"];

/// One tabletop task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TabletopTask {
    kind: TaskKind,
}

impl TabletopTask {
    /// The task of `kind`.
    pub const fn new(kind: TaskKind) -> Self {
        Self { kind }
    }
    /// `reach-goal`.
    pub const REACH_GOAL: Self = Self::new(TaskKind::ReachGoal);
    /// `push-cube`.
    pub const PUSH_CUBE: Self = Self::new(TaskKind::PushCube);
    /// `pick-cube`.
    pub const PICK_CUBE: Self = Self::new(TaskKind::PickCube);
    /// `stack-cube`.
    pub const STACK_CUBE: Self = Self::new(TaskKind::StackCube);

    /// Which task.
    pub fn kind(&self) -> TaskKind {
        self.kind
    }
}

impl Task for TabletopTask {
    type Config = TabletopConfig;
    type ExpertConfig = ExpertConfig;
    type Env = Tabletop;

    fn name(&self) -> &'static str {
        self.kind.name()
    }

    fn dataset(&self) -> DatasetInfo {
        DatasetInfo {
            fps: crate::world::CONTROL_HZ as u32,
            robot_type: "panda".into(),
            state_names: self.kind.state_names(),
            action_names: ACTION_NAMES.map(String::from).to_vec(),
            instruction: self.kind.instruction().into(),
        }
    }

    /// The environment of `config` with the task's own kind (`kind` is not a key of `[env]`;
    /// the config's `task` names it).
    fn build(&self, config: &TabletopConfig) -> Tabletop {
        let mut c = config.clone();
        c.kind = self.kind;
        Tabletop::new(c)
    }

    fn observation(&self, config: &TabletopConfig) -> String {
        match config.obs {
            ObsMode::State => "state",
            ObsMode::Pixels => "pixels",
        }
        .into()
    }

    /// State observations are the recorded state itself (noise-free); pixels observations'
    /// state part is its proprioception ([`crate::env::proprio_indices`]).
    fn observe_recorded(&self, config: &TabletopConfig, state: &[f32]) -> Result<Vec<f32>, String> {
        if state.len() == self.kind.state_dim() {
            Ok(observed_indices(self.kind, config.obs)
                .into_iter()
                .map(|i| state[i])
                .collect())
        } else {
            Err(format!(
                "holds {}-d states; {} records {} values ({})",
                state.len(),
                self.kind.name(),
                self.kind.state_dim(),
                self.kind.state_names().join(", ")
            ))
        }
    }

    /// The cubes' centres (x, y, z of each cube, in order): what a pixel policy has to find in
    /// its frame. Reach-goal has no cube and names none.
    fn privileged_recorded(
        &self,
        _config: &TabletopConfig,
        state: &[f32],
    ) -> Result<Vec<f32>, String> {
        if state.len() != self.kind.state_dim() {
            return Err(format!(
                "holds {}-d states; {} records {} values",
                state.len(),
                self.kind.name(),
                self.kind.state_dim()
            ));
        }
        Ok((0..self.kind.cubes())
            .flat_map(|k| {
                let at = crate::env::layout::CUBES + 7 * k;
                state[at..at + 3].iter().copied()
            })
            .collect())
    }

    /// The configured `image_size` (in either mode: `render_state` draws recorded states).
    fn image_size(&self, config: &TabletopConfig) -> Option<u32> {
        Some(config.image_size)
    }

    /// Draws a recorded full state ([`Tabletop::true_state`]'s layout) with the default front
    /// camera, without jitter or tint ([`crate::pixels`]).
    fn render_state(&self, state: &[f32], size: u32) -> Result<Vec<u8>, String> {
        let camera = crate::pixels::default_camera(size).map_err(|e| e.to_string())?;
        let arm = ArmDrawing::shipped()?;
        let state: Vec<f64> = state.iter().map(|&v| f64::from(v)).collect();
        let mut renderer = Renderer::new(camera).map_err(|e| e.to_string())?;
        let frame = crate::pixels::draw_state(&mut renderer, self.kind, &state, &arm)?;
        Ok(frame.rgb.clone())
    }

    fn randomization_key(&self) -> Option<&'static str> {
        Some("randomize")
    }

    /// Camera jitter and colour jitter only change camera images: unobserved by state
    /// policies; a pixels policy observes every field.
    fn unobserved(&self, config: &TabletopConfig, fields: &[String]) -> Option<String> {
        crate::env::camera_only_unobserved(config.obs, fields)
    }

    fn expert(
        &self,
        config: &ExpertConfig,
        seed: u64,
    ) -> Option<Box<dyn diffrl_core::task::Expert<Tabletop>>> {
        Some(Box::new(TabletopExpert::new(config.clone(), seed)))
    }

    fn expert_name(&self, _config: &ExpertConfig) -> String {
        "Scripted".into()
    }

    fn stages(&self, _config: &TabletopConfig) -> Option<Box<dyn StagePredicates>> {
        Some(Box::new(TabletopStages::new(self.kind)))
    }

    /// The scripted expert's action with uniform noise of +-0.2 on the motion components.
    fn scripted_action(&self, env: &Tabletop, rng: &mut Rng) -> Option<Vec<f32>> {
        let mut a = expert_action(env.kind(), &env.true_state(), ExpertConfig::default().gain);
        for x in a.iter_mut().take(3) {
            *x = (*x + rng.random_range(-0.2..0.2)).clamp(-1.0, 1.0);
        }
        Some(a.to_vec())
    }
}

impl TaskEnv for Tabletop {
    fn true_state(&self) -> Vec<f64> {
        Tabletop::true_state(self)
    }

    fn reset_to_state(&mut self, state: &[f64], seed: u64) -> Result<Observation, EnvError> {
        Tabletop::reset_to_state(self, state, seed)
    }

    /// `ee_pose` (the TCP's position and quaternion `[x, y, z, qx, qy, qz, qw]`), the gripper
    /// opening (m), `cube_pose` (and `cube_b_pose` for stack-cube), each
    /// `[x, y, z, qx, qy, qz, qw]`, and `goal` (position).
    fn named_state(&self) -> Vec<(&'static str, Vec<f64>)> {
        let w = self.world();
        let tcp = w.tcp_pose();
        let (t, r) = (tcp.translation.vector, tcp.rotation);
        let mut out = vec![
            ("ee_pose", vec![t.x, t.y, t.z, r.i, r.j, r.k, r.w]),
            ("gripper_opening", vec![w.gripper_opening()]),
        ];
        for (i, name) in ["cube_pose", "cube_b_pose"]
            .into_iter()
            .enumerate()
            .take(w.cube_count())
        {
            let p = w.cube_pose(i);
            out.push((name, p.position.into_iter().chain(p.rotation).collect()));
        }
        out.push(("goal", self.goal().to_vec()));
        out
    }

    fn describe_step(&self, action: &[f32], r: &StepResult) -> String {
        let s = Tabletop::true_state(self);
        let cube = if self.kind() == TaskKind::ReachGoal {
            String::new()
        } else {
            let o = crate::env::layout::CUBES;
            format!("  cube ({:6.3}, {:6.3}, {:6.3})", s[o], s[o + 1], s[o + 2])
        };
        let o = crate::env::layout::TCP;
        format!(
            "action {action:?}  tcp ({:6.3}, {:6.3}, {:6.3})  gripper {:5.3}{cube}  score {:.3}{}",
            s[o],
            s[o + 1],
            s[o + 2],
            s[crate::env::layout::GRIPPER],
            r.info.score,
            if r.info.success { "  SUCCESS" } else { "" }
        )
    }
}
