//! The run configuration (`configs/pusht.toml`, embedded as the default). `task = "NAME"` is
//! the tag that selects which task (crates/cli/src/tasks.rs) reads the `[env]` and `[expert]`
//! tables; every other table is the same for all tasks.

use std::path::{Path, PathBuf};

use diffrl_core::ConfigError;
use diffrl_core::config::{self, Invalid, Validate, ensure};
use diffrl_core::dyn_task::{EnvSection, ExpertSection};
use diffrl_core::reward::Outcome;
use diffrl_learn::bc::BcConfig;
use diffrl_learn::grpo::{Algorithm, GrpoConfig};
use diffrl_policy::PolicyConfig;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

use crate::tasks;

/// A whole run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunConfig {
    /// The task (crates/cli/src/tasks.rs lists them); it reads `[env]` and `[expert]`.
    pub task: String,
    /// Run folder, seed, threads.
    pub run: RunSection,
    /// Environment settings: the task's `[env]` table (an omitted table or key means the
    /// task's default, the same either way).
    pub env: EnvSection,
    /// Expert settings: the task's `[expert]` table.
    pub expert: ExpertSection,
    /// Demonstration settings.
    pub demos: DemosSection,
    /// Policy architecture and diffusion settings.
    pub policy: PolicyConfig,
    /// Behaviour cloning.
    pub pretrain: BcConfig,
    /// DAgger rounds after behaviour cloning.
    pub dagger: DaggerSection,
    /// Evaluation episodes.
    pub eval: EvalSection,
    /// Fine-tuning with GRPO (and the PPO baseline, which reads the same table).
    pub grpo: GrpoConfig,
    /// The rewards fine-tuning optimises.
    pub reward: RewardSection,
}

/// The tables every task shares, as a config file holds them (`[env]` and `[expert]` are read
/// by the task, [`parse`]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SharedSections {
    #[serde(default = "default_task")]
    task: String,
    #[serde(default)]
    run: RunSection,
    #[serde(default, rename = "env")]
    _env: IgnoredAny,
    #[serde(default, rename = "expert")]
    _expert: IgnoredAny,
    #[serde(default)]
    demos: DemosSection,
    #[serde(default)]
    policy: PolicyConfig,
    #[serde(default)]
    pretrain: BcConfig,
    #[serde(default)]
    dagger: DaggerSection,
    #[serde(default)]
    eval: EvalSection,
    #[serde(default)]
    grpo: GrpoConfig,
    #[serde(default)]
    reward: RewardSection,
}

impl Validate for SharedSections {
    fn validate(&self) -> Result<(), Invalid> {
        Ok(())
    }
}

/// What is read first: which task the document is for, and whether it names its run.
#[derive(Deserialize)]
struct Header {
    #[serde(default = "default_task")]
    task: String,
    #[serde(default)]
    run: toml::Table,
    #[serde(default)]
    demos: toml::Table,
}

impl Validate for Header {
    fn validate(&self) -> Result<(), Invalid> {
        Ok(())
    }
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

/// `[reward]`: what the learner optimises.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardSection {
    /// The episode statistic used as outcome: "score" (max coverage), "success" or "return".
    pub outcome: Outcome,
    /// Added to the outcome of successful episodes.
    pub success_bonus: f64,
    /// Subtracted from the outcome per environment step (0 = off): successes that came sooner
    /// rank higher; failures that all ran to the time limit keep their order.
    pub time_cost: f64,
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
    /// Stochastic rollouts of the BC policy that `diffrl run`'s reward stage adds to the
    /// held-out demonstrations to score the progress model on the policy's own failures
    /// (summary.json `reward.vs_policy`).
    pub vs_policy_episodes: usize,
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
            time_cost: 0.0,
            shaping: None,
            progress: Default::default(),
            srpo: None,
            spa: None,
            spa_train: Default::default(),
            vs_policy_episodes: 200,
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
    tasks::DEFAULT_TASK.into()
}

/// `[run]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunSection {
    /// Folder name under `runs_dir` (default: the task's name).
    pub name: String,
    /// Parent folder of runs.
    pub runs_dir: PathBuf,
    /// Root seed.
    pub seed: u64,
    /// Simulation threads (0 = one per core).
    pub threads: usize,
    /// The learner of the main job's fine-tuning stage: "grpo" or "ppo" (`diffrl ppo`'s
    /// learned critic and GAE, on the same `[grpo]` table). The stage, its folder and the
    /// summary.json keys keep the name `grpo` either way; report.md names the learner.
    pub finetune: Algorithm,
}

/// The default run name is the task's ([`parse`] gives a config without `[run].name` its
/// task's name).
impl Default for RunSection {
    fn default() -> Self {
        Self {
            name: tasks::DEFAULT_TASK.into(),
            runs_dir: "runs".into(),
            seed: 0,
            threads: 0,
            finetune: Algorithm::Grpo,
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
    /// Default: the shipped Push-T dataset for the default task, none for other tasks.
    pub dataset: PathBuf,
}

impl Default for DemosSection {
    fn default() -> Self {
        Self {
            episodes: 200,
            only_successful: false,
            noise_px: 10.0,
            dataset: crate::tasks::SHIPPED_DATASET.into(),
        }
    }
}

impl Validate for RunConfig {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            self.env.task().name() == self.task && self.expert.task().name() == self.task,
            "task",
            format!(
                "is {:?}, but [env] and [expert] were read by {:?} and {:?}",
                self.task,
                self.env.task().name(),
                self.expert.task().name()
            ),
        )?;
        self.run.validate().map_err(|e| e.within("run"))?;
        self.demos.validate().map_err(|e| e.within("demos"))?;
        self.dagger.validate().map_err(|e| e.within("dagger"))?;
        self.eval.validate().map_err(|e| e.within("eval"))?;
        self.policy.validate().map_err(|e| e.within("policy"))?;
        self.pretrain.validate().map_err(|e| e.within("pretrain"))?;
        self.grpo.validate().map_err(|e| e.within("grpo"))?;
        self.reward.validate().map_err(|e| e.within("reward"))?;
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
        Ok(())
    }
}

impl Validate for RunSection {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            !self.name.is_empty() && !self.name.contains(['/', '\\']),
            "name",
            "must be a plain folder name",
        )?;
        ensure(self.threads <= 1024, "threads", "must be at most 1024")
    }
}

impl Validate for DemosSection {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(self.episodes >= 1, "episodes", "must be at least 1")?;
        ensure(
            self.noise_px.is_finite() && self.noise_px >= 0.0,
            "noise_px",
            "must be a finite number of pixels >= 0",
        )
    }
}

impl Validate for DaggerSection {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(self.episodes >= 1, "episodes", "must be at least 1")?;
        ensure(self.steps >= 1, "steps", "must be at least 1")?;
        ensure(
            (0.0..=1.0).contains(&self.beta),
            "beta",
            format!("must be a probability in [0, 1], got {}", self.beta),
        )
    }
}

impl Validate for EvalSection {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(self.episodes >= 1, "episodes", "must be at least 1")?;
        ensure(
            (1..=1024).contains(&self.envs),
            "envs",
            "must be in 1..=1024",
        )
    }
}

impl Validate for RewardSection {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            self.success_bonus.is_finite(),
            "success_bonus",
            "must be finite",
        )?;
        ensure(
            self.time_cost.is_finite() && self.time_cost >= 0.0,
            "time_cost",
            "must be finite and >= 0",
        )?;
        if let Some(sh) = &self.shaping {
            sh.validate().map_err(|e| e.within("shaping"))?;
        }
        if let Some(spa) = &self.spa {
            spa.validate().map_err(|e| e.within("spa"))?;
        }
        self.progress.validate().map_err(|e| e.within("progress"))?;
        if let Some(srpo) = &self.srpo {
            srpo.validate().map_err(|e| e.within("srpo"))?;
        }
        ensure(
            self.vs_policy_episodes >= 2,
            "vs_policy_episodes",
            "must be at least 2 (successes and failures to rank)",
        )?;
        self.spa_train.validate().map_err(|e| e.within("spa_train"))
    }
}

impl Validate for ShapingSection {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            self.gamma.is_finite() && self.gamma > 0.0 && self.gamma <= 1.0,
            "gamma",
            format!("must be in (0, 1], got {}", self.gamma),
        )
    }
}

impl Validate for SpaSection {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            self.weight.is_finite() && self.weight > 0.0,
            "weight",
            format!("must be > 0, got {}", self.weight),
        )
    }
}

/// Parses and validates a run config from TOML `text`; `origin` names it in errors. The `task`
/// key (default: [`tasks::DEFAULT_TASK`]) selects the task that reads `[env]` and `[expert]`.
pub fn parse(text: &str, origin: &Path) -> Result<RunConfig, ConfigError> {
    let header: Header = config::from_toml_str(text, origin)?;
    let task = tasks::get(&header.task).map_err(|message| ConfigError::Invalid {
        path: origin.to_path_buf(),
        field: "task".into(),
        message,
    })?;
    let (env, expert) = task.parse_sections(text, origin)?;
    let s: SharedSections = config::from_toml_str(text, origin)?;
    let mut run = s.run;
    if !header.run.contains_key("name") {
        run.name = s.task.clone();
    }
    // The shipped dataset is the default task's: other tasks record their demonstrations.
    let mut demos = s.demos;
    if s.task != tasks::DEFAULT_TASK && !header.demos.contains_key("dataset") {
        demos.dataset = PathBuf::new();
    }
    let cfg = RunConfig {
        task: s.task,
        run,
        env,
        expert,
        demos,
        policy: s.policy,
        pretrain: s.pretrain,
        dagger: s.dagger,
        eval: s.eval,
        grpo: s.grpo,
        reward: s.reward,
    };
    cfg.validate().map_err(|i| ConfigError::Invalid {
        path: origin.to_path_buf(),
        field: i.field,
        message: i.message,
    })?;
    Ok(cfg)
}

/// Reads `path`.
fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Loads `path`, or the embedded default of `diffrl run` ([`tasks::DEFAULT_TASK`]'s) when
/// `None`. Returns the config and its text.
pub fn load(path: Option<&Path>) -> Result<(RunConfig, String), ConfigError> {
    match path {
        Some(p) => {
            let text = read(p)?;
            Ok((parse(&text, p)?, text))
        }
        None => load_default(tasks::DEFAULT_TASK),
    }
}

/// The default run config of `task`: its embedded configs/<task>.toml, or every table's
/// defaults when it has none.
pub fn load_default(task: &str) -> Result<(RunConfig, String), ConfigError> {
    let (text, origin) = match tasks::default_config(task) {
        Some(c) => (c.text.to_string(), config::embedded(c.origin)),
        None => (
            format!("task = {task:?}\n"),
            config::embedded(&format!("defaults of task {task}")),
        ),
    };
    Ok((parse(&text, &origin)?, text))
}

/// The run config of a command that names its task (`diffrl sim TASK --config C`): `path`,
/// which must be for `task`, or the task's default config.
pub fn load_for(task: &str, path: Option<&Path>) -> anyhow::Result<(RunConfig, String)> {
    if tasks::get(task).is_err() {
        anyhow::bail!(
            "unknown simulator {task:?}; available: {}",
            tasks::names().join(", ")
        );
    }
    let Some(p) = path else {
        return Ok(load_default(task)?);
    };
    let (cfg, text) = load(Some(p))?;
    anyhow::ensure!(
        cfg.task == task,
        "{} is a config for task {:?}, not {task:?}",
        p.display(),
        cfg.task
    );
    Ok((cfg, text))
}

/// Reads a run config from any self-describing format by way of its TOML text: what
/// `toml::from_str::<RunConfig>` does (e.g. reading a run folder's config.toml).
impl<'de> Deserialize<'de> for RunConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let table = toml::Table::deserialize(d)?;
        let text = toml::to_string(&table).map_err(serde::de::Error::custom)?;
        parse(&text, Path::new("<deserialized config>")).map_err(serde::de::Error::custom)
    }
}

/// Sets `[env.randomize].action_delay` to `[steps, steps]` (`--action-delay`): control steps
/// between an observation and its actions taking effect. The task validates it.
pub fn set_action_delay(cfg: &mut RunConfig, steps: u32) -> anyhow::Result<()> {
    let mut patch = toml::Table::new();
    let d = toml::Value::Integer(i64::from(steps));
    patch.insert(
        "action_delay".into(),
        toml::Value::Array(vec![d.clone(), d]),
    );
    cfg.env = cfg
        .env
        .with_randomization(&patch)
        .map_err(|i| anyhow::anyhow!("--action-delay {steps}: {}", i.message))?;
    Ok(())
}

/// The first value of `[env.randomize].action_delay` (0 when the task has none).
pub fn action_delay(cfg: &RunConfig) -> i64 {
    cfg.env
        .randomization()
        .and_then(|r| r.get("action_delay"))
        .and_then(|v| v.as_array())
        .and_then(|a| a.first())
        .and_then(toml::Value::as_integer)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_default_equals_struct_defaults() {
        let (c, _) = load(None).unwrap();
        let task = tasks::get(&c.task).unwrap();
        assert_eq!(c.env, task.default_env());
        // The pusher's push_max, one of the nine settings the Push-T job sets (default 25).
        let patch: toml::Table = "[pusher]\npush_max = 40.0".parse().unwrap();
        assert_ne!(c.expert, task.default_expert());
        assert_eq!(c.expert, task.default_expert().patched(&patch).unwrap());
        // One meaning per setting: no [env] table, an empty one and a partial one all observe
        // what the embedded config does.
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("grpo.toml");
        for text in [
            "[grpo]\niterations = 3\n",
            "[env]\n",
            "[env]\nmax_episode_steps = 300\n",
        ] {
            std::fs::write(&p, text).unwrap();
            assert_eq!(load(Some(&p)).unwrap().0.env, c.env, "{text}");
        }
        // Its dataset: the push_max 40 recording (default: the push_max 25 one).
        assert_eq!(
            c.demos,
            DemosSection {
                dataset: tasks::SHIPPED_DATASETS[1].into(),
                ..DemosSection::default()
            }
        );
        assert_eq!(
            DemosSection::default().dataset,
            Path::new(tasks::SHIPPED_DATASET)
        );
        assert_eq!(c.run, RunSection::default());
        assert_eq!(c.policy, PolicyConfig::default());
        assert_eq!(c.pretrain, BcConfig::default());
        assert_eq!(c.eval, EvalSection::default());
        // The six [grpo] settings the job sets, each naming its default in the file.
        let mut grpo = GrpoConfig {
            iterations: 160,
            eval_every: 10,
            lr: 6e-5,
            dynamic_sampling: true,
            dynamic_sampling_by: diffrl_learn::grpo::DynamicSamplingBy::Success,
            ..GrpoConfig::default()
        };
        grpo.advantage.estimator = diffrl_learn::advantages::Estimator::GrpoLambda;
        assert_eq!(c.grpo, grpo);
        assert_eq!(GrpoConfig::default().iterations, 30);
        assert_eq!(GrpoConfig::default().eval_every, 5);
        assert_eq!(GrpoConfig::default().lr, 3e-5);
        assert!(!GrpoConfig::default().dynamic_sampling);
        assert_eq!(
            GrpoConfig::default().dynamic_sampling_by,
            diffrl_learn::grpo::DynamicSamplingBy::Outcome
        );
        assert_eq!(
            GrpoConfig::default().advantage.estimator,
            diffrl_learn::advantages::Estimator::Grpo
        );
        // The progress model's context (default 4).
        let mut reward = RewardSection::default();
        assert_eq!(reward.progress.context, 4);
        reward.progress.context = 1;
        assert_eq!(c.reward, reward);
    }

    /// Every shipped run config loads (the `*_randomize.toml` files are `--randomize` sweeps,
    /// not run configs), configs/pusht-push25.toml is the embedded job with exactly the
    /// defaults' demonstrations and progress context and the 100 GRPO iterations of the job
    /// until 2026-12-02 (the embedded one runs 160 since 2026-12-07), and
    /// configs/pusht-90.toml is that job with exactly its longer BC and GRPO, so the measured
    /// settings carry over to both.
    #[test]
    fn shipped_configs_load_and_the_push_t_variants_differ_only_where_named() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
        let mut loaded = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if !name.ends_with(".toml") || name.ends_with("_randomize.toml") {
                continue;
            }
            load(Some(&p)).unwrap_or_else(|e| panic!("{e}"));
            loaded += 1;
        }
        assert!(loaded >= 17, "{loaded} configs in {}", dir.display());
        let (job, _) = load(None).unwrap();
        let mut before = job.clone();
        before.demos.dataset = tasks::SHIPPED_DATASET.into();
        let patch: toml::Table = "[pusher]\npush_max = 25.0".parse().unwrap();
        before.expert = before.expert.patched(&patch).unwrap();
        before.reward.progress.context = 4;
        before.grpo.iterations = 100;
        assert_ne!(before, job);
        let (push25, _) = load(Some(&dir.join("pusht-push25.toml"))).unwrap();
        assert_eq!(push25.expert, tasks::get("pusht").unwrap().default_expert());
        before.run.name = "pusht-push25".into();
        assert_eq!(push25, before);
        let (long, _) = load(Some(&dir.join("pusht-90.toml"))).unwrap();
        before.run.name = "pusht-90".into();
        before.pretrain.steps = 90_000;
        before.grpo.iterations = 160;
        assert_eq!(long, before);
    }

    #[test]
    fn written_config_reads_back_equal() {
        let (mut c, _) = load(None).unwrap();
        set_action_delay(&mut c, 3).unwrap();
        assert_eq!(action_delay(&c), 3);
        let text = toml::to_string(&c).unwrap();
        assert_eq!(toml::from_str::<RunConfig>(&text).unwrap(), c);
        assert_eq!(parse(&text, Path::new("x.toml")).unwrap(), c);
        let e = set_action_delay(&mut c, 11).unwrap_err().to_string();
        assert!(e.starts_with("--action-delay 11: "), "{e}");
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
        std::fs::write(&p, "[reward]\nvs_policy_episodes = 1\n").unwrap();
        let e = load(Some(&p)).unwrap_err().to_string();
        assert!(
            e.ends_with(
                "reward.vs_policy_episodes: must be at least 2 (successes and failures to rank)"
            ),
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

    /// Every nested table's error names the file and the full TOML key path, however deep the
    /// struct that found it (each struct names its own fields, each parent prefixes its key).
    #[test]
    fn nested_errors_name_file_and_full_key_path() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("nested.toml");
        for (text, key) in [
            ("[grpo.advantage]\nvg_tau = -1\n", "grpo.advantage.vg_tau"),
            (
                "[grpo.advantage]\ngigpo_grid = 0.0\n",
                "grpo.advantage.gigpo_grid",
            ),
            ("[grpo.ppo]\nlambda = 2.0\n", "grpo.ppo.lambda"),
            ("[grpo.advantage]\nlambda = 2.0\n", "grpo.advantage.lambda"),
            (
                "[grpo.advantage]\nestimator = \"process\"\n[grpo.implicit_prm]\nbeta = 0.0\n",
                "grpo.implicit_prm.beta",
            ),
            ("[policy.diffusion]\neta = 2.0\n", "policy.diffusion.eta"),
            ("[reward.progress]\nlr = 0.0\n", "reward.progress.lr"),
            ("[reward.srpo]\ncap = 1.0\n", "reward.srpo.cap"),
            // Reported as `reward.spa.lr` before, the key of a different table.
            ("[reward.spa_train]\nlr = 0.0\n", "reward.spa_train.lr"),
            (
                "[reward.shaping]\nmodel = \"m\"\ngamma = 0.0\n",
                "reward.shaping.gamma",
            ),
            (
                "[reward.spa]\nmodel = \"m\"\nweight = 0.0\n",
                "reward.spa.weight",
            ),
            ("[eval]\nenvs = 0\n", "eval.envs"),
            ("[run]\nname = \"a/b\"\n", "run.name"),
        ] {
            std::fs::write(&p, text).unwrap();
            let e = load(Some(&p)).unwrap_err().to_string();
            let at = format!("{}: {key}: ", p.display());
            assert!(e.starts_with(&at), "{text:?}: {e}");
        }
    }

    /// The reward tables validate to the one error type, so none of their errors can be
    /// dropped on the way up (a reward crate error other than a range check used to be).
    #[test]
    fn reward_errors_are_reported() {
        let mut c = load(None).unwrap().0;
        c.reward.progress.hidden = vec![0];
        let e = c.validate().unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("reward.progress.hidden", "widths must be at least 1")
        );
    }
}
