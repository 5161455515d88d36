//! Push-T as a task of the tools (`task = "pusht"`): `[env]` is [`PushTConfig`], `[expert]` is
//! [`ExpertConfig`], `[env.randomize]` holds the domain randomisation that robustness sweeps
//! vary. The CLI registers [`PushTTask`] in its task list (docs/adding-a-task.md).

use diffrl_core::seeding::Rng;
use diffrl_core::stages::StagePredicates;
use diffrl_core::task::{DatasetInfo, Task, TaskEnv};
use diffrl_core::{EnvError, Observation, StepResult};
use rand::Rng as _;

use crate::env::{ObsMode, PushT, PushTConfig, TASK, keypoint_observation, state_from_keypoints};
use crate::expert::{Expert, ExpertConfig};
use crate::stages::PushTStages;

/// Push-T, gym-pusht 0.1.8's task.
#[derive(Debug, Clone, Copy, Default)]
pub struct PushTTask;

/// The recorded state's components ([`PushT::true_state`]).
pub const STATE_NAMES: [&str; 5] = ["agent_x", "agent_y", "block_x", "block_y", "block_angle"];

impl Task for PushTTask {
    type Config = PushTConfig;
    type ExpertConfig = ExpertConfig;
    type Env = PushT;

    fn name(&self) -> &'static str {
        "pusht"
    }

    fn dataset(&self) -> DatasetInfo {
        DatasetInfo {
            fps: 10,
            robot_type: "2d pointer".into(),
            state_names: STATE_NAMES.map(String::from).to_vec(),
            action_names: ["x", "y"].map(String::from).to_vec(),
            instruction: TASK.into(),
        }
    }

    fn build(&self, config: &PushTConfig) -> PushT {
        PushT::builder().config(config.clone()).build()
    }

    fn observation(&self, config: &PushTConfig) -> String {
        match config.obs {
            ObsMode::State => "state",
            ObsMode::Keypoints => "keypoints",
            ObsMode::Pixels => "pixels",
        }
        .into()
    }

    /// Keypoint policies see the keypoints of the recorded 5-d states; pixel policies the
    /// agent's position beside their image (the first two values of a 5-d state; a 2-d state,
    /// as in LeRobot's image datasets, is that position already); state policies the states
    /// themselves. Pixel policies still need the dataset's camera frames.
    fn observe_recorded(&self, config: &PushTConfig, state: &[f32]) -> Result<Vec<f32>, String> {
        match config.obs {
            ObsMode::State => Ok(state.to_vec()),
            ObsMode::Pixels => match state {
                [ax, ay, _, _, _] | [ax, ay] => Ok(vec![*ax, *ay]),
                _ => Err(format!(
                    "holds {}-d states; pixel policies read the agent position [agent_x, \
                     agent_y] of Push-T's 5-d states (or 2-d agent positions)",
                    state.len()
                )),
            },
            ObsMode::Keypoints => keypoint_observation(state).ok_or_else(|| {
                format!(
                    "holds {}-d states; keypoints are computed from Push-T's 5-d states \
                     [agent_x, agent_y, block_x, block_y, angle]",
                    state.len()
                )
            }),
        }
    }

    fn image_size(&self, config: &PushTConfig) -> Option<u32> {
        Some(config.image_size)
    }

    fn randomization_key(&self) -> Option<&'static str> {
        Some("randomize")
    }

    /// Image tint only reaches pixel policies; angle noise only policies that observe the angle.
    fn unobserved(&self, config: &PushTConfig, fields: &[String]) -> Option<String> {
        let obs = config.obs;
        let why = |field: &str| match field {
            "image_tint" if obs != ObsMode::Pixels => {
                Some("image_tint only changes pixel observations")
            }
            "obs_noise_rad" if obs == ObsMode::Pixels => {
                Some("obs_noise_rad only changes the observed block angle")
            }
            _ => None,
        };
        if fields.is_empty() {
            return None;
        }
        let mut reasons = fields
            .iter()
            .map(|f| why(f))
            .collect::<Option<Vec<&str>>>()?;
        reasons.dedup();
        let observes = match obs {
            ObsMode::State => "states",
            ObsMode::Keypoints => "keypoints",
            ObsMode::Pixels => "pixels",
        };
        Some(format!(
            "{} (the policy observes {observes})",
            reasons.join("; ")
        ))
    }

    fn expert(
        &self,
        config: &ExpertConfig,
        seed: u64,
    ) -> Option<Box<dyn diffrl_core::task::Expert<PushT>>> {
        Some(Box::new(Expert::new(config.clone(), seed)))
    }

    fn expert_name(&self, config: &ExpertConfig) -> String {
        format!("{:?}", config.kind)
    }

    fn stages(&self, _config: &PushTConfig) -> Option<Box<dyn StagePredicates>> {
        Some(Box::new(PushTStages::default()))
    }

    /// Draws 5-d states, and keypoint observations through the state behind them.
    fn render_state(&self, state: &[f32], size: u32) -> Result<Vec<u8>, String> {
        let s = state_from_keypoints(state);
        let s = s.as_ref().map_or(state, |s| &s[..]);
        crate::render::render_state(s, size).ok_or_else(|| {
            format!(
                "Push-T images are drawn from 5-value states [agent_x, agent_y, block_x, \
                 block_y, block_angle], this one has {}",
                state.len()
            )
        })
    }

    /// A target at the block's position plus uniform noise of +-20 px (constant pushing).
    fn scripted_action(&self, env: &PushT, rng: &mut Rng) -> Option<Vec<f32>> {
        let b = env.block_pose();
        Some(vec![
            (b.x + rng.random_range(-20.0..20.0)) as f32,
            (b.y + rng.random_range(-20.0..20.0)) as f32,
        ])
    }
}

impl TaskEnv for PushT {
    fn true_state(&self) -> Vec<f64> {
        PushT::true_state(self).to_vec()
    }

    /// `state` is `[ax, ay, bx, by, angle]` with gym-pusht's `reset_to_state` meaning.
    fn reset_to_state(&mut self, state: &[f64], seed: u64) -> Result<Observation, EnvError> {
        let s: [f64; 5] = state.try_into().map_err(|_| {
            EnvError::InvalidState(format!(
                "needs 5 comma-separated numbers ax,ay,bx,by,angle, got {}",
                state.len()
            ))
        })?;
        PushT::reset_to_state(self, s, seed)
    }

    fn describe_step(&self, action: &[f32], r: &StepResult) -> String {
        let s = PushT::true_state(self);
        format!(
            "target ({:6.1}, {:6.1})  agent ({:6.1}, {:6.1})  block ({:6.1}, {:6.1}, {:5.3} rad)  coverage {:.3}{}",
            action[0],
            action[1],
            s[0],
            s[1],
            s[2],
            s[3],
            s[4],
            r.info.score,
            if r.info.success { "  SUCCESS" } else { "" }
        )
    }
}

impl diffrl_core::task::Expert<PushT> for Expert {
    fn reset(&mut self, seed: u64) {
        Expert::reset(self, seed);
    }

    fn act(&mut self, env: &PushT) -> Vec<f32> {
        Expert::act(self, env).to_vec()
    }
}
