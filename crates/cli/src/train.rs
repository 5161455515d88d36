//! Behaviour cloning ([`pretrain`]) and seeded evaluation ([`run_eval`]) of the configured
//! policy, with the arguments and helpers (environments, progress bars, reports) the subcommands
//! in `commands/`, the pipeline and the other stages share.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use burn::tensor::backend::{AutodiffBackend, Backend};
use clap::{Args, ValueEnum};
use diffrl_core::Episode;
use diffrl_core::dyn_env::DynEnv;
use diffrl_core::dyn_task::EnvSection;
use diffrl_core::env::Env;
use diffrl_core::fs::write_atomic;
use diffrl_core::lerobot::read_dataset;
use diffrl_core::record::{Level, Recorder, Timeline, Topic};
use diffrl_core::vec_env::{AutoReset, VecEnv};
use diffrl_learn::LearnError;
use diffrl_learn::bc::{self, BcHooks, BcLog};
use diffrl_learn::data::{ChunkDataset, fit_normalizers};
use diffrl_learn::eval::{EvalReport, evaluate};
use diffrl_policy::{Policy, PolicySpec, SampleMode, checkpoint};
use indicatif::{ProgressBar, ProgressStyle};

use crate::config::RunConfig;

/// Where models run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum DeviceArg {
    /// Pure-Rust CPU backend (Burn Flex).
    #[default]
    Cpu,
    /// NVIDIA GPU through burn-cuda (needs a build with `--features cuda`).
    Cuda,
}

/// `diffrl pretrain`.
#[derive(Debug, Args)]
pub struct PretrainArgs {
    /// Run config (TOML); without it, the embedded Push-T config.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// LeRobot dataset folder (default: [demos].dataset, else runs/<name>/demos).
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// Output folder (default: runs/<name>/pretrain).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Continue from the output folder's train_state (exactly where it stopped).
    #[arg(long)]
    pub resume: bool,
    /// Override [pretrain].steps.
    #[arg(long)]
    pub steps: Option<usize>,
    /// Start from this policy checkpoint's weights and normalisers instead of a new network
    /// (a fresh optimiser and learning-rate schedule), e.g. a DAgger round on aggregated data.
    #[arg(long, value_name = "POLICY", conflicts_with = "resume")]
    pub init: Option<PathBuf>,
    /// Override [eval].episodes for the final evaluation (0 = skip it).
    #[arg(long)]
    pub eval_episodes: Option<usize>,
    /// Device.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    pub device: DeviceArg,
}

/// `diffrl eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Policy checkpoint folder (model.safetensors + policy.json); not needed with --remote.
    #[arg(long, required_unless_present = "remote")]
    pub policy: Option<PathBuf>,
    /// Episodes (default: [eval].episodes).
    #[arg(long)]
    pub episodes: Option<usize>,
    /// Root seed (default: [eval].seed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run config whose [env] and [eval] tables apply.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Where eval.json goes (default: <policy>/../eval.json). With --randomize: the folder
    /// that receives robustness.json, robustness.md and report.md (default: <policy>/..).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Sweep file of domain-randomisation settings (e.g. configs/pusht_randomize.toml): every
    /// setting plays the same seeded episodes; writes a robustness table (success, 95% CI,
    /// mean max score, change against the nominal [env.randomize]).
    #[arg(long, value_name = "FILE.toml")]
    pub randomize: Option<PathBuf>,
    /// Play the episodes through a policy server (`diffrl serve`, or any openpi-protocol
    /// server) instead of loading --policy: the simulator stands in for the robot.
    #[arg(long, value_name = "ws://HOST:PORT", conflicts_with = "randomize")]
    pub remote: Option<String>,
    /// With --remote: the server's API key (also read from DIFFRL_API_KEY).
    #[arg(
        long,
        env = "DIFFRL_API_KEY",
        hide_env_values = true,
        requires = "remote"
    )]
    pub api_key: Option<String>,
    /// With --remote: network round-trip latency to inject per request (ms, wall clock).
    #[arg(long, default_value_t = 0.0, requires = "remote")]
    pub latency_ms: f64,
    /// Control steps between an observation and its actions taking effect (sets
    /// [env.randomize].action_delay to [N, N]; what latency costs a robot at its control rate).
    #[arg(long)]
    pub action_delay: Option<u32>,
    /// Stochastic chains (eta, min std) instead of deterministic DDIM.
    #[arg(long)]
    pub stochastic: bool,
    /// Device.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    pub device: DeviceArg,
}

impl EvalArgs {
    /// The checkpoint folder (clap requires it unless --remote is given).
    pub fn policy_dir(&self) -> &Path {
        self.policy.as_deref().unwrap_or(Path::new(""))
    }
}

/// Replaces the recorded states of `episodes` by what an environment of `env` observes there
/// (Push-T keypoint policies: the keypoints of the 5-d states), in place.
pub(crate) fn observe_recorded(env: &EnvSection, episodes: &mut [Episode]) -> anyhow::Result<()> {
    for (i, ep) in episodes.iter_mut().enumerate() {
        for o in ep
            .observations
            .iter_mut()
            .chain(ep.final_observation.as_mut())
        {
            o.state = env
                .observe_recorded(&o.state)
                .map_err(|m| anyhow::anyhow!("episode {i} {m}"))?;
        }
    }
    Ok(())
}

/// The policy spec the configured environment produces.
pub fn env_spec(cfg: &RunConfig) -> anyhow::Result<PolicySpec> {
    let env = cfg.env.build();
    let space = env.observation_space();
    let state_dim = space.state.as_ref().map_or(0, |s| s.dim());
    Ok(PolicySpec {
        state_dim,
        action_dim: env.action_space().dim(),
        image: space
            .image
            .map(|im| [3, im.height as usize, im.width as usize]),
    })
}

pub(crate) fn check_spec(policy: &PolicySpec, env: &PolicySpec, what: &str) -> anyhow::Result<()> {
    if policy != env {
        bail!(
            "{what} expects state dim {}, action dim {}, image {:?}, but the configured \
             environment gives {}, {}, {:?} (check [env].obs)",
            policy.state_dim,
            policy.action_dim,
            policy.image,
            env.state_dim,
            env.action_dim,
            env.image
        );
    }
    Ok(())
}

pub(crate) fn vec_env(cfg: &RunConfig, envs: usize) -> VecEnv<DynEnv> {
    let worlds = (0..envs).map(|_| cfg.env.build()).collect();
    VecEnv::new(worlds, AutoReset::SameStep, cfg.run.threads)
}

pub(crate) fn bar(len: u64, template: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb
}

/// Evaluates `policy` on the configured environment, recording environment 0's episodes and
/// every episode's end into `rec` (`&NoRecorder` for none), then a summary line.
pub fn run_eval<B: Backend>(
    cfg: &RunConfig,
    policy: &Policy<B>,
    device: &B::Device,
    episodes: usize,
    seed: u64,
    mode: SampleMode,
    rec: &dyn Recorder,
) -> Result<EvalReport, LearnError> {
    let mut venv = vec_env(cfg, cfg.eval.envs.min(episodes.max(1)));
    let pb = bar(
        episodes as u64,
        "  eval [{bar:30}] {pos}/{len} episodes {elapsed_precise} (eta {eta})",
    );
    let report = evaluate(
        &mut venv,
        policy,
        device,
        episodes,
        seed,
        mode,
        &mut |d, _| pb.set_position(d as u64),
        rec,
    );
    pb.finish_and_clear();
    if let Ok(r) = &report
        && rec.enabled()
    {
        rec.text(
            diffrl_viz::paths::EVAL_SUMMARY,
            Level::Info,
            &format!(
                "evaluation (seed {seed}): success {:.1}% ({}/{}; Wilson 95% CI {:.1}-{:.1}%),                  mean max score {:.3}, mean length {:.1}",
                100.0 * r.success_rate,
                r.successes,
                r.episodes,
                100.0 * r.ci95[0],
                100.0 * r.ci95[1],
                r.mean_max_score,
                r.mean_length
            ),
        );
        rec.flush();
    }
    report
}

/// Appends one JSON line to a metrics.jsonl (best effort: a full disk must not stop training).
pub(crate) fn append_metrics(path: &Path, v: &serde_json::Value) {
    use std::io::Write as _;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{v}");
    }
}

/// A periodic evaluation during training on `n` episodes: prints a line above the progress bar
/// and returns the summary stored with the checkpoint (None when off).
pub(crate) fn periodic_eval<B: Backend>(
    cfg: &RunConfig,
    pb: &ProgressBar,
    policy: &Policy<B>,
    at: (&str, usize),
    n: usize,
    rec: &dyn Recorder,
) -> Result<Option<serde_json::Value>, LearnError> {
    if n == 0 {
        return Ok(None);
    }
    let device = policy_device(policy);
    rec.set_time(Timeline::TrainStep, at.1 as i64);
    let r = pb.suspend(|| {
        run_eval(
            cfg,
            policy,
            &device,
            n,
            cfg.eval.seed,
            SampleMode::Deterministic,
            rec,
        )
    })?;
    rec.train_scalars(
        at.1 as i64,
        &[
            (Topic::Success, "eval", r.success_rate),
            (Topic::Reward, "eval_mean_max_score", r.mean_max_score),
        ],
    );
    pb.println(format!(
        "  {} {}: success {:.1}% (95% CI {:.1}-{:.1}%), mean max score {:.3} over {n} episodes",
        at.0,
        at.1,
        100.0 * r.success_rate,
        100.0 * r.ci95[0],
        100.0 * r.ci95[1],
        r.mean_max_score
    ));
    Ok(Some(serde_json::json!({
        at.0: at.1,
        "success_rate": r.success_rate,
        "ci95": r.ci95,
        "mean_max_score": r.mean_max_score,
        "mean_length": r.mean_length,
        "episodes": r.episodes
    })))
}

struct Hooks<'a> {
    cfg: &'a RunConfig,
    pb: ProgressBar,
    metrics: PathBuf,
    rec: &'a dyn Recorder,
}

impl<B: Backend> BcHooks<B> for Hooks<'_> {
    fn log(&mut self, l: &BcLog) {
        self.rec.train_scalars(
            l.step as i64,
            &[
                (Topic::Loss, "bc", l.loss),
                (Topic::Lr, "lr", l.lr),
                (Topic::Grad, "norm", l.grad_norm),
                (Topic::Speed, "steps_per_s", l.steps_per_sec),
            ],
        );
        self.pb.set_position(l.step as u64);
        self.pb.set_message(format!(
            "loss {:.4} lr {:.1e} {:.0} steps/s",
            l.loss, l.lr, l.steps_per_sec
        ));
        append_metrics(
            &self.metrics,
            &serde_json::json!({"stage": "pretrain", "train": l}),
        );
    }

    fn evaluate(
        &mut self,
        step: usize,
        policy: &Policy<B>,
    ) -> Result<Option<serde_json::Value>, LearnError> {
        let n = self.cfg.pretrain.eval_episodes;
        let summary = periodic_eval(self.cfg, &self.pb, policy, ("step", step), n, self.rec)?;
        if let Some(s) = &summary {
            append_metrics(
                &self.metrics,
                &serde_json::json!({"stage": "pretrain", "eval": s}),
            );
        }
        Ok(summary)
    }
}

pub(crate) fn policy_device<B: Backend>(policy: &Policy<B>) -> B::Device {
    use burn::module::Module;
    policy.model.devices().pop().unwrap_or_default()
}

/// Resolves the dataset folder of a run.
pub fn dataset_dir(cfg: &RunConfig, arg: Option<&Path>) -> PathBuf {
    match arg {
        Some(p) => p.to_path_buf(),
        None if !cfg.demos.dataset.as_os_str().is_empty() => cfg.demos.dataset.clone(),
        None => cfg.run.runs_dir.join(&cfg.run.name).join("demos"),
    }
}

/// Trains the configured policy, recording training scalars and evaluation episodes into `rec`
/// (`&NoRecorder` for none); returns the EMA policy's final evaluation (if any). With `init`,
/// training starts from that checkpoint's weights and normalisers (a fresh optimiser and
/// schedule) instead of a new network: DAgger's later rounds.
#[allow(clippy::too_many_arguments)]
pub fn pretrain<B: AutodiffBackend>(
    cfg: &RunConfig,
    dataset: &Path,
    init: Option<&Path>,
    out_dir: &Path,
    resume: bool,
    eval_episodes: usize,
    device: &B::Device,
    out: &mut dyn Write,
    rec: &dyn Recorder,
) -> anyhow::Result<Option<EvalReport>> {
    let ds = read_dataset(dataset).with_context(|| {
        format!(
            "reading the training dataset {} (record one with `diffrl demos {} --out DIR` \
             or pass --dataset)",
            dataset.display(),
            cfg.task
        )
    })?;
    let mut episodes = ds.episodes("observation.state")?;
    observe_recorded(&cfg.env, &mut episodes).with_context(|| {
        format!(
            "[env] observes {} with {}",
            cfg.env.observation(),
            dataset.display()
        )
    })?;
    let norm = fit_normalizers(&episodes)
        .with_context(|| format!("checking the dataset {}", dataset.display()))?;
    let env = env_spec(cfg)?;
    if env.image.is_some() {
        bail!(
            "[env].obs = \"pixels\": the dataset {} holds states only; pixel policies need \
             image frames in the dataset, which diffrl does not record yet",
            dataset.display()
        );
    }
    let spec = PolicySpec {
        state_dim: norm.state.dim(),
        action_dim: norm.action.dim(),
        image: None,
    };
    check_spec(&spec, &env, &format!("the dataset {}", dataset.display()))?;
    let policy = match init {
        None => Policy::<B>::new(cfg.policy.clone(), spec, norm, cfg.run.seed, device)?,
        Some(dir) => {
            let (p, _) = checkpoint::load::<B>(dir, device)
                .with_context(|| format!("loading the initial policy {}", dir.display()))?;
            check_spec(
                &p.spec,
                &env,
                &format!("the initial policy {}", dir.display()),
            )?;
            if p.config != cfg.policy {
                bail!(
                    "the initial policy {} was built with other [policy] settings than the \
                     config's; continue training it with its own",
                    dir.display()
                );
            }
            p
        }
    };
    let data = ChunkDataset::build(
        &episodes,
        cfg.policy.obs_horizon,
        cfg.policy.pred_horizon,
        &policy.norm,
    )?;
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    writeln!(
        out,
        "pretrain: {} samples from {} episodes of {}; {:?} policy, {} steps of batch {}",
        data.len,
        episodes.len(),
        dataset.display(),
        cfg.policy.kind,
        cfg.pretrain.steps,
        cfg.pretrain.batch_size
    )?;
    let pb = bar(
        cfg.pretrain.steps as u64,
        "  pretrain [{bar:30}] {pos}/{len} {msg} {elapsed_precise} (eta {eta})",
    );
    let mut hooks = Hooks {
        cfg,
        pb: pb.clone(),
        metrics: out_dir.join("metrics.jsonl"),
        rec,
    };
    let t0 = std::time::Instant::now();
    let outcome = bc::train(
        policy,
        &data,
        &cfg.pretrain,
        cfg.run.seed,
        out_dir,
        resume,
        &mut hooks,
    )?;
    pb.finish_and_clear();
    writeln!(
        out,
        "pretrain: {} steps in {:.1} s; policy in {}",
        outcome.steps,
        t0.elapsed().as_secs_f64(),
        out_dir.join("policy").display()
    )?;
    if eval_episodes == 0 {
        return Ok(None);
    }
    rec.set_time(Timeline::TrainStep, outcome.steps as i64);
    let r = run_eval(
        cfg,
        &outcome.policy,
        &policy_device(&outcome.policy),
        eval_episodes,
        cfg.eval.seed,
        SampleMode::Deterministic,
        rec,
    )?;
    write_report(out_dir.join("eval.json").as_path(), &r)?;
    print_report(out, &r)?;
    Ok(Some(r))
}

pub(crate) fn write_report(path: &Path, r: &EvalReport) -> anyhow::Result<()> {
    let json = serde_json::to_vec_pretty(r)?;
    write_atomic(path, &json).with_context(|| format!("writing {}", path.display()))
}

pub(crate) fn print_report(out: &mut dyn Write, r: &EvalReport) -> anyhow::Result<()> {
    writeln!(
        out,
        "eval: success {:.1}% ({}/{}; Wilson 95% CI {:.1}-{:.1}%), mean max score {:.3}, mean length {:.1}",
        100.0 * r.success_rate,
        r.successes,
        r.episodes,
        100.0 * r.ci95[0],
        100.0 * r.ci95[1],
        r.mean_max_score,
        r.mean_length
    )?;
    Ok(())
}
