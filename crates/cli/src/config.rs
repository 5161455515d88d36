//! The run configuration (`configs/pusht.toml`, embedded as the default).

use std::path::{Path, PathBuf};

use diffrl_core::ConfigError;
use diffrl_core::config::{self, Invalid, Validate, ensure};
use diffrl_core::reward::Outcome;
use diffrl_learn::bc::BcConfig;
use diffrl_learn::grpo::GrpoConfig;
use diffrl_policy::PolicyConfig;
use diffrl_pusht::{ExpertConfig, PushTConfig};
use serde::{Deserialize, Serialize};

/// The embedded default config.
pub const DEFAULT_CONFIG: &str = include_str!("../../../configs/pusht.toml");

/// A whole run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Simulator: only "pusht" so far.
    #[serde(default = "default_task")]
    pub task: String,
    /// Run folder, seed, threads.
    #[serde(default)]
    pub run: RunSection,
    /// Environment settings (a config without an [env] table gets the main job's: keypoint
    /// observations; inside an [env] table an omitted `obs` is the simulator's "state").
    #[serde(default = "run_env")]
    pub env: PushTConfig,
    /// Expert settings.
    #[serde(default)]
    pub expert: ExpertConfig,
    /// Demonstration settings.
    #[serde(default)]
    pub demos: DemosSection,
    /// Policy architecture and diffusion settings.
    #[serde(default)]
    pub policy: PolicyConfig,
    /// Behaviour cloning.
    #[serde(default)]
    pub pretrain: BcConfig,
    /// DAgger rounds after behaviour cloning.
    #[serde(default)]
    pub dagger: DaggerSection,
    /// Evaluation episodes.
    #[serde(default)]
    pub eval: EvalSection,
    /// Fine-tuning with GRPO (and the PPO baseline, which reads the same table).
    #[serde(default)]
    pub grpo: GrpoConfig,
    /// The rewards fine-tuning optimises.
    #[serde(default)]
    pub reward: RewardSection,
}

/// `[dagger]`: rounds of DAgger (Ross et al. 2011) after behaviour cloning, in `diffrl run`'s
/// pretrain stage: roll out the current policy, label every state it visits with the expert,
/// add those episodes to the training data, and continue training the policy on the aggregate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaggerSection {
    /// Rounds (0 = behaviour cloning alone).
    pub rounds: usize,
    /// Policy episodes rolled out and labelled per round.
    pub episodes: usize,
    /// Behaviour-cloning steps per round, continuing from the previous round's policy with a
    /// fresh optimiser and the [pretrain] schedule shortened to this many steps.
    pub steps: usize,
    /// Probability per step of executing the expert's label instead of the policy's action.
    pub beta: f64,
    /// Roll out with stochastic chains (false: the deterministic chains evaluation uses).
    pub stochastic: bool,
}

impl Default for DaggerSection {
    fn default() -> Self {
        Self {
            rounds: 0,
            episodes: 200,
            steps: 10000,
            beta: 0.0,
            stochastic: false,
        }
    }
}

/// The main job's environment: Push-T observed through keypoints (docs/policy.md).
fn run_env() -> PushTConfig {
    PushTConfig {
        obs: diffrl_pusht::ObsMode::Keypoints,
        ..PushTConfig::default()
    }
}

/// `[reward]`: what the learner optimises.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardSection {
    /// The episode statistic used as outcome: "score" (max coverage), "success" or "return".
    pub outcome: Outcome,
    /// Added to the outcome of successful episodes.
    pub success_bonus: f64,
    /// Progress shaping of the per-step rewards (`{ model = "DIR", gamma = 0.99 }`); absent =
    /// the environment's step rewards as they are.
    pub shaping: Option<ShapingSection>,
    /// How `diffrl reward train` trains the progress model.
    pub progress: diffrl_reward::progress::ProgressConfig,
    /// SRPO-style outcomes for failed rollouts, ranked by how close they ended to a successful
    /// member of their group (`{ length_scale = 50.0, cap = 0.5 }`); absent = off.
    pub srpo: Option<diffrl_reward::process::SrpoConfig>,
    /// SPA attribution: the per-step rewards become the contributions of a model from
    /// `diffrl reward train --kind spa` (`{ model = "DIR", weight = 1.0 }`); absent = off.
    pub spa: Option<SpaSection>,
    /// How `diffrl reward train --kind spa` trains it.
    pub spa_train: diffrl_reward::spa::SpaConfig,
}

/// `[reward.spa]`: per-step rewards from an SPA attribution model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpaSection {
    /// Model folder written by `diffrl reward train --kind spa`.
    pub model: std::path::PathBuf,
    /// Scale of the contributions.
    #[serde(default = "default_weight")]
    pub weight: f64,
}

fn default_weight() -> f64 {
    1.0
}

impl Default for RewardSection {
    fn default() -> Self {
        Self {
            outcome: Outcome::Score,
            success_bonus: 1.0,
            shaping: None,
            progress: Default::default(),
            srpo: None,
            spa: None,
            spa_train: Default::default(),
        }
    }
}

/// `[reward.shaping]`: r' = r + gamma Phi(s') - Phi(s) with a trained progress model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShapingSection {
    /// Progress-model folder written by `diffrl reward train`.
    pub model: std::path::PathBuf,
    /// Discount of the potential term.
    #[serde(default = "default_gamma")]
    pub gamma: f64,
    /// "potential" (policy-invariant, default) or "progress-as-reward" (the non-invariant
    /// ablation).
    #[serde(default)]
    pub kind: diffrl_reward::shaping::ShapingKind,
}

fn default_gamma() -> f64 {
    0.99
}

/// `[eval]`: seeded evaluation episodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalSection {
    /// Episodes per evaluation.
    pub episodes: usize,
    /// Environments stepped in parallel (fixes which seeds are played; see diffrl_learn::eval).
    pub envs: usize,
    /// Root seed of evaluation episodes (distinct from training seeds).
    pub seed: u64,
}

impl Default for EvalSection {
    fn default() -> Self {
        Self {
            episodes: 500,
            envs: 10,
            seed: 1_000_000,
        }
    }
}

fn default_task() -> String {
    "pusht".into()
}

/// `[run]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunSection {
    /// Folder name under `runs_dir`.
    pub name: String,
    /// Parent folder of runs.
    pub runs_dir: PathBuf,
    /// Root seed.
    pub seed: u64,
    /// Simulation threads (0 = one per core).
    pub threads: usize,
}

impl Default for RunSection {
    fn default() -> Self {
        Self {
            name: "pusht".into(),
            runs_dir: "runs".into(),
            seed: 0,
            threads: 0,
        }
    }
}

/// `[demos]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DemosSection {
    /// Expert episodes to record.
    pub episodes: usize,
    /// Keep only successful episodes.
    pub only_successful: bool,
    /// DART noise injection: the executed action is the expert's plus Gaussian noise of this
    /// standard deviation (px, clipped to the arena); the recorded label stays the expert's
    /// own action, so the data covers states just off the expert's path (0 = off).
    pub noise_px: f64,
    /// A LeRobot dataset folder to train on instead of recording demos (empty = record).
    pub dataset: PathBuf,
}

impl Default for DemosSection {
    fn default() -> Self {
        Self {
            episodes: 200,
            only_successful: false,
            noise_px: 10.0,
            dataset: crate::pipeline::SHIPPED_DATASET.into(),
        }
    }
}

impl Validate for RunConfig {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            self.task == "pusht",
            "task",
            format!("unknown task {:?}; available: pusht", self.task),
        )?;
        ensure(
            !self.run.name.is_empty() && !self.run.name.contains(['/', '\\']),
            "run.name",
            "must be a plain folder name",
        )?;
        ensure(
            self.run.threads <= 1024,
            "run.threads",
            "must be at most 1024",
        )?;
        ensure(
            self.demos.episodes >= 1,
            "demos.episodes",
            "must be at least 1",
        )?;
        ensure(
            self.demos.noise_px.is_finite() && self.demos.noise_px >= 0.0,
            "demos.noise_px",
            "must be a finite number of pixels >= 0",
        )?;
        ensure(
            self.dagger.episodes >= 1,
            "dagger.episodes",
            "must be at least 1",
        )?;
        ensure(self.dagger.steps >= 1, "dagger.steps", "must be at least 1")?;
        ensure(
            (0.0..=1.0).contains(&self.dagger.beta),
            "dagger.beta",
            format!("must be a probability in [0, 1], got {}", self.dagger.beta),
        )?;
        ensure(
            self.eval.episodes >= 1,
            "eval.episodes",
            "must be at least 1",
        )?;
        ensure(
            (1..=1024).contains(&self.eval.envs),
            "eval.envs",
            "must be in 1..=1024",
        )?;
        self.env.validate().map_err(|e| e.within("env"))?;
        self.policy.validate().map_err(|e| e.within("policy"))?;
        self.pretrain.validate().map_err(|e| e.within("pretrain"))?;
        self.grpo.validate().map_err(|e| e.within("grpo"))?;
        ensure(
            self.reward.success_bonus.is_finite(),
            "reward.success_bonus",
            "must be finite",
        )?;
        if let Some(sh) = &self.reward.shaping {
            ensure(
                sh.gamma.is_finite() && sh.gamma > 0.0 && sh.gamma <= 1.0,
                "reward.shaping.gamma",
                format!("must be in (0, 1], got {}", sh.gamma),
            )?;
        }
        if let Some(spa) = &self.reward.spa {
            ensure(
                spa.weight.is_finite() && spa.weight > 0.0,
                "reward.spa.weight",
                format!("must be > 0, got {}", spa.weight),
            )?;
        }
        // The implicit PRM's step rewards replace the reward module's: a configured source of
        // step rewards would be dropped without a word.
        for (set, table) in [
            (self.reward.shaping.is_some(), "[reward.shaping]"),
            (self.reward.spa.is_some(), "[reward.spa]"),
        ] {
            ensure(
                !(set && self.grpo.implicit_prm.is_some()),
                "grpo.implicit_prm",
                format!(
                    "its step rewards replace those of {table}, which would be ignored; \
                     remove one of the two"
                ),
            )?;
        }
        if let Err(diffrl_reward::RewardError::Config { field, message }) = self
            .reward
            .progress
            .validate()
            .and_then(|()| self.reward.srpo.map_or(Ok(()), |s| s.validate()))
            .and_then(|()| self.reward.spa_train.validate())
        {
            return Err(Invalid::new(format!("reward.{field}"), message));
        }
        self.expert.validate().map_err(|e| e.within("expert"))
    }
}

/// Loads `path`, or the embedded default when `None`. Returns the config and its text.
pub fn load(path: Option<&Path>) -> Result<(RunConfig, String), ConfigError> {
    match path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Io {
                path: p.to_path_buf(),
                source,
            })?;
            Ok((config::from_toml_str(&text, p)?, text))
        }
        None => Ok((
            config::from_toml_str(DEFAULT_CONFIG, &config::embedded("configs/pusht.toml"))?,
            DEFAULT_CONFIG.to_string(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_default_equals_struct_defaults() {
        let (c, _) = load(None).unwrap();
        // One deliberate difference: the main job observes keypoints; the simulator's own
        // default observation (a config without [env].obs) stays gym-pusht's 5-d state.
        assert_eq!(c.env, run_env());
        // A config without [env] observes what the embedded one does.
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("grpo.toml");
        std::fs::write(&p, "[grpo]\niterations = 3\n").unwrap();
        assert_eq!(load(Some(&p)).unwrap().0.env, c.env);
        assert_eq!(c.expert, ExpertConfig::default());
        assert_eq!(c.demos, DemosSection::default());
        assert_eq!(c.run, RunSection::default());
        assert_eq!(c.policy, PolicyConfig::default());
        assert_eq!(c.pretrain, BcConfig::default());
        assert_eq!(c.eval, EvalSection::default());
        assert_eq!(c.grpo, GrpoConfig::default());
        assert_eq!(c.reward, RewardSection::default());
    }

    #[test]
    fn errors_name_file_and_key() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("bad.toml");
        std::fs::write(&p, "[expert]\nhorizn = 3\n").unwrap();
        let e = load(Some(&p)).unwrap_err().to_string();
        assert!(
            e.contains("bad.toml") && e.contains("horizn") && e.contains("expert"),
            "{e}"
        );
        std::fs::write(&p, "[demos]\nepisodes = \"ten\"\n").unwrap();
        let e = load(Some(&p)).unwrap_err().to_string();
        assert!(
            e.contains("bad.toml") && e.contains("demos.episodes"),
            "{e}"
        );
        std::fs::write(&p, "[expert]\nsamples = 1\n").unwrap();
        let e = load(Some(&p)).unwrap_err().to_string();
        assert!(e.ends_with("expert.samples: must be at least 2"), "{e}");
        std::fs::write(&p, "[expert.pusher]\nmove_step = 0.0\n").unwrap();
        let e = load(Some(&p)).unwrap_err().to_string();
        assert!(e.ends_with("expert.pusher.move_step: must be > 0"), "{e}");
        std::fs::write(&p, "[expert]\nkind = \"cem\"\n").unwrap();
        let e = load(Some(&p)).unwrap_err().to_string();
        assert!(e.contains("bad.toml") && e.contains("kind"), "{e}");
        std::fs::write(&p, "[demos]\nnoise_px = -1.0\n").unwrap();
        let e = load(Some(&p)).unwrap_err().to_string();
        assert!(
            e.ends_with("demos.noise_px: must be a finite number of pixels >= 0"),
            "{e}"
        );
        std::fs::write(&p, "[dagger]\nbeta = 2.0\n").unwrap();
        let e = load(Some(&p)).unwrap_err().to_string();
        assert!(
            e.ends_with("dagger.beta: must be a probability in [0, 1], got 2"),
            "{e}"
        );
        std::fs::write(&p, "task = \"arm\"\n").unwrap();
        assert!(
            load(Some(&p))
                .unwrap_err()
                .to_string()
                .contains("unknown task")
        );
        // The implicit PRM next to another source of step rewards.
        std::fs::write(
            &p,
            "[grpo.advantage]\nestimator = \"process\"\n[grpo.implicit_prm]\n\
             [reward.shaping]\nmodel = \"m\"\n",
        )
        .unwrap();
        let e = load(Some(&p)).unwrap_err().to_string();
        assert!(
            e.contains("grpo.implicit_prm") && e.contains("[reward.shaping]"),
            "{e}"
        );
    }
}
