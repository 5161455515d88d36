//! `diffrl grpo` and `diffrl ppo`: fine-tune a pretrained policy in the simulator with the
//! GRPO family or the DPPO-style PPO baseline, then evaluate it on the seeded episodes BC was
//! evaluated on.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use burn::tensor::backend::{AutodiffBackend, Backend};
use clap::Args;
use diffrl_core::record::{Recorder, Timeline, Topic};
use diffrl_learn::LearnError;
use diffrl_learn::advantages::Estimator;
use diffrl_learn::eval::EvalReport;
use diffrl_learn::grpo::{self, Algorithm, GrpoHooks, GrpoLog};
use diffrl_learn::ppo::PpoRewards;
use diffrl_policy::{Policy, checkpoint};
use indicatif::ProgressBar;

use crate::config::{self, RunConfig};
use crate::device::DeviceArg;
use crate::envs::{check_spec, env_spec, vec_env};
use crate::evaluation::{final_eval, periodic_eval};
use crate::progress::{append_metrics, bar, trim_metrics};
use crate::viz::Recording;

/// `diffrl grpo` / `diffrl ppo`.
#[derive(Debug, Args)]
pub struct FinetuneArgs {
    /// Run config (TOML); without it, the embedded Push-T config. Its [grpo] and [reward]
    /// tables apply.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The pretrained policy (default: runs/<name>/pretrain/policy).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Output folder (default: runs/<name>/grpo or runs/<name>/ppo).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Continue from the output folder's train_state (exactly where it stopped); with a larger
    /// --iterations, a finished run goes on to the new count.
    #[arg(long)]
    pub resume: bool,
    /// Override [grpo].iterations.
    #[arg(long)]
    pub iterations: Option<usize>,
    /// Override [grpo.advantage].estimator (grpo, dr-grpo, vg-grpo, process, gigpo,
    /// grpo-process, grpo-lambda).
    #[arg(long, value_parser = parse_estimator)]
    pub estimator: Option<Estimator>,
    /// Override [run].seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Episodes of the final evaluation (default: [eval].episodes; 0 = skip).
    #[arg(long)]
    pub eval_episodes: Option<usize>,
    /// Device.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    pub device: DeviceArg,
}

fn parse_estimator(s: &str) -> Result<Estimator, String> {
    serde_json::from_value(serde_json::Value::String(s.into())).map_err(|_| {
        format!("unknown estimator {s:?}; available: grpo, dr-grpo, vg-grpo, process, gigpo, grpo-process, grpo-lambda")
    })
}

struct Hooks<'a> {
    cfg: &'a RunConfig,
    pb: ProgressBar,
    metrics: PathBuf,
    /// Whether the log has been trimmed to the work this run continues (at its first line).
    trimmed: bool,
    stage: &'static str,
    rec: &'a dyn Recorder,
}

impl<B: Backend> GrpoHooks<B> for Hooks<'_> {
    fn recorder(&self) -> &dyn Recorder {
        self.rec
    }

    fn log(&mut self, l: &GrpoLog) {
        self.rec.train_scalars(
            l.iteration as i64,
            &[
                (Topic::Loss, "surrogate", l.loss),
                (Topic::Loss, "value", l.value_loss),
                (Topic::Kl, "approx", l.approx_kl),
                (Topic::Kl, "ref", l.ref_kl),
                (Topic::Clip, "frac", l.clip_frac),
                (Topic::Success, "rollouts", l.success_rate),
                (Topic::Reward, "mean", l.reward_mean),
                (Topic::Reward, "std", l.reward_std),
                (Topic::Reward, "mean_max_score", l.mean_max_score),
                (Topic::Lr, "lr", self.cfg.grpo.lr),
                (Topic::Grad, "norm", l.grad_norm),
                (
                    Topic::Speed,
                    "collect_env_steps_per_s",
                    l.collect_steps_per_s,
                ),
                (Topic::Speed, "update_pairs_per_s", l.update_pairs_per_s),
            ],
        );
        if let Some(p) = &l.prm {
            self.rec.train_scalars(
                l.iteration as i64,
                &[
                    (Topic::Loss, "implicit_prm_dpo", p.loss),
                    (Topic::Reward, "implicit_prm_pair_accuracy", p.accuracy),
                ],
            );
        }
        // The first actions' spread within a group (GRPO's groups; PPO has none).
        let spread = l
            .action_spread
            .map_or(String::new(), |s| format!(" spread {s:.3}"));
        let msg = format!(
            "success {:.0}% reward {:.3} kl {:.1e} clip {:.2}{spread} | {:.0} env steps/s",
            100.0 * l.success_rate,
            l.reward_mean,
            l.approx_kl,
            l.clip_frac,
            l.collect_steps_per_s
        );
        if self.pb.is_hidden() {
            // No terminal (a log file, a batch job, a test reading the pipe): one line per
            // iteration instead of the bar. Printed before the iteration's checkpoint.
            eprintln!(
                "{}: iteration {}/{} {msg}",
                self.stage, l.iteration, self.cfg.grpo.iterations
            );
        }
        self.pb.set_position(l.iteration as u64);
        self.pb.set_message(msg);
        if !self.trimmed {
            // The run's first line: iterations up to l.iteration - 1 are what it continues.
            trim_metrics(&self.metrics, "iteration", l.iteration as u64 - 1);
            self.trimmed = true;
        }
        append_metrics(
            &self.metrics,
            &serde_json::json!({"stage": self.stage, "train": l}),
        );
    }

    fn evaluate(
        &mut self,
        iteration: usize,
        policy: &Policy<B>,
    ) -> Result<Option<serde_json::Value>, LearnError> {
        let summary = periodic_eval(
            self.cfg,
            &self.pb,
            policy,
            ("iteration", iteration),
            self.cfg.grpo.eval_episodes,
            self.rec,
        )?;
        if let Some(s) = &summary {
            append_metrics(
                &self.metrics,
                &serde_json::json!({"stage": self.stage, "eval": s}),
            );
        }
        Ok(summary)
    }
}

/// Fine-tunes the checkpoint at `policy_dir` into `out_dir`, recording rollouts, group
/// statistics, training scalars and the final evaluation into `rec` (`&NoRecorder` for none);
/// returns the final evaluation.
#[allow(clippy::too_many_arguments)]
pub fn finetune<B: AutodiffBackend>(
    cfg: &RunConfig,
    algorithm: Algorithm,
    policy_dir: &Path,
    out_dir: &Path,
    resume: bool,
    eval_episodes: usize,
    device: &B::Device,
    out: &mut dyn Write,
    rec: &dyn Recorder,
) -> anyhow::Result<Option<EvalReport>> {
    let stage = algorithm.name();
    if algorithm == Algorithm::Ppo
        && cfg.grpo.ppo.rewards == PpoRewards::Outcome
        && (cfg.reward.shaping.is_some() || cfg.reward.spa.is_some())
    {
        bail!(
            "[reward.shaping] / [reward.spa] change the per-step rewards, which PPO does not read \
             with [grpo.ppo] rewards = \"outcome\" (the default): set rewards = \"steps\""
        );
    }
    if algorithm == Algorithm::Ppo && cfg.grpo.dynamic_sampling {
        writeln!(
            out,
            "note: [grpo] dynamic_sampling selects GRPO's groups; PPO's independent rollouts \
             are all kept"
        )?;
    }
    if algorithm == Algorithm::Grpo
        && cfg.grpo.advantage.estimator == Estimator::GrpoLambda
        && cfg.reward.shaping.is_none()
    {
        bail!(
            "[grpo.advantage] estimator = \"grpo-lambda\" reads the progress of a model from \
             `diffrl reward train`: name it in [reward.shaping], or train it into {} (where \
             `diffrl run` puts its own)",
            crate::pipeline::progress_model_dir(&cfg.run.runs_dir.join(&cfg.run.name)).display()
        );
    }
    let (reference, _) =
        checkpoint::load::<B::InnerBackend>(policy_dir, device).with_context(|| {
            format!(
                "loading the pretrained policy {} (train one with `diffrl pretrain`, or pass \
                 --policy DIR)",
                policy_dir.display()
            )
        })?;
    check_spec(
        &reference.spec,
        &env_spec(cfg)?,
        &format!("the policy {}", policy_dir.display()),
    )?;
    let g = &cfg.grpo;
    // Fine-tuning chooses its own exploration noise ([grpo]'s floors replace the checkpoint's,
    // which only matter for stochastic sampling).
    let reference = reference
        .with_diffusion(|d| {
            d.min_sampling_std = g.min_sampling_std;
            d.min_logprob_std = g.min_logprob_std;
        })
        .context("grpo.min_sampling_std / grpo.min_logprob_std")?;
    // Checked here, before anything is printed or created, though the session applies it.
    reference
        .with_fine_tuned_steps(g.ft_denoising_steps)
        .with_context(|| {
            format!(
                "[grpo] ft_denoising_steps = {} for the policy {} (a chain of {} steps)",
                g.ft_denoising_steps,
                policy_dir.display(),
                reference.chain_len()
            )
        })?;
    let mut trainable = Policy::<B>::trainable(&reference);
    if g.freeze_encoder {
        trainable = trainable.with_frozen_encoder();
    }
    if g.freeze_film {
        let (frozen, layers) = trainable.with_frozen_film();
        if layers == 0 {
            bail!(
                "[grpo] freeze_film = true, but the policy {} has no FiLM layers to freeze \
                 (a residual MLP denoiser without `[policy.denoiser] film = true`, a joint \
                 planner, or a Gaussian policy)",
                policy_dir.display()
            );
        }
        trainable = frozen;
    }
    let n_env = g.groups * g.group_size;
    let mut venv = vec_env(cfg, n_env);
    let reward = crate::commands::reward::reward_module(cfg)?;
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    writeln!(
        out,
        "{stage}: {} iterations x {} rollouts ({}); advantages {}; K' = {} of K = {}; reward {} + {} x success{}{}{}; from {}",
        g.iterations,
        n_env,
        match algorithm {
            Algorithm::Grpo => format!("{} groups of {}", g.groups, g.group_size),
            Algorithm::Ppo => format!(
                "independent starts, learned critic, returns of the {}",
                match g.ppo.rewards {
                    PpoRewards::Outcome => "outcome",
                    PpoRewards::Steps => "step rewards",
                }
            ),
        },
        match algorithm {
            Algorithm::Grpo if g.advantage.positive_only => {
                format!("{} (positive parts only)", g.advantage.estimator)
            }
            Algorithm::Grpo => g.advantage.estimator.to_string(),
            Algorithm::Ppo => format!("GAE (gamma {}, lambda {})", g.ppo.gamma, g.ppo.lambda),
        },
        match g.ft_denoising_steps {
            0 => reference.chain_len(),
            k => k,
        },
        reference.chain_len(),
        reward.name(),
        cfg.reward.success_bonus,
        match cfg.reward.time_cost {
            0.0 => String::new(),
            c => format!(" - {c} x steps"),
        },
        g.implicit_prm.as_ref().map_or(String::new(), |p| format!(
            "; step rewards from an implicit PRM (trajectory DPO, beta {}, lr {})",
            p.beta, p.lr
        )),
        match (g.freeze_encoder, g.freeze_film) {
            (false, false) => "",
            (true, false) => "; encoder frozen",
            (false, true) => "; FiLM layers frozen",
            (true, true) => "; encoder and FiLM layers frozen",
        },
        policy_dir.display()
    )?;
    let pb = bar(
        g.iterations as u64,
        "  {prefix} [{bar:30}] {pos}/{len} {msg} {elapsed_precise} (eta {eta})",
    );
    pb.set_prefix(stage);
    let mut hooks = Hooks {
        cfg,
        pb: pb.clone(),
        metrics: out_dir.join("metrics.jsonl"),
        trimmed: false,
        stage,
        rec,
    };
    let t0 = std::time::Instant::now();
    let outcome = grpo::train(
        trainable,
        &reference,
        &mut venv,
        reward.as_ref(),
        g,
        algorithm,
        cfg.run.seed,
        out_dir,
        resume,
        &mut hooks,
    )?;
    pb.finish_and_clear();
    if let Some(l) = &outcome.last {
        writeln!(
            out,
            "{stage}: {} iterations in {:.1} s ({} env steps; collect {:.0} env steps/s, update {:.0} pairs/s; \
             last iteration: env {:.1} s, policy {:.1} s, update {:.1} s{}); policy in {}",
            outcome.iterations,
            t0.elapsed().as_secs_f64(),
            l.env_steps,
            l.collect_steps_per_s,
            l.update_pairs_per_s,
            l.env_s,
            l.policy_s,
            l.update_s,
            if l.prm.is_some() {
                format!(", implicit PRM {:.1} s", l.prm_s)
            } else {
                String::new()
            },
            out_dir.join("policy").display()
        )?;
    }
    final_eval(
        cfg,
        &outcome.policy,
        outcome.iterations,
        eval_episodes,
        out_dir,
        out,
        rec,
    )
}

/// `diffrl grpo` / `diffrl ppo`.
pub fn finetune_cmd(
    args: &FinetuneArgs,
    algorithm: Algorithm,
    rerun: Option<&diffrl_viz::RerunSink>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let (mut cfg, _) = config::load(args.config.as_deref())?;
    if let Some(n) = args.iterations {
        anyhow::ensure!(n >= 1, "--iterations must be at least 1");
        cfg.grpo.iterations = n;
    }
    if let Some(e) = args.estimator {
        cfg.grpo.advantage.estimator = e;
    }
    if let Some(s) = args.seed {
        cfg.run.seed = s;
    }
    let stage = algorithm.name();
    let run_dir = cfg.run.runs_dir.join(&cfg.run.name);
    let policy_dir = args
        .policy
        .clone()
        .unwrap_or_else(|| run_dir.join("pretrain").join("policy"));
    let out_dir = args.out.clone().unwrap_or_else(|| run_dir.join(stage));
    // grpo-lambda without [reward.shaping]: the run folder's progress model, where `diffrl run`
    // and `diffrl reward train` put it (as --policy defaults to the run folder's BC policy).
    let own_model = crate::pipeline::progress_model_dir(&run_dir);
    if let Some(c) = crate::pipeline::own_progress_model(&cfg, algorithm, &run_dir)
        && own_model.exists()
    {
        writeln!(
            out,
            "grpo-lambda: progress model {} ([reward.shaping] names none)",
            own_model.display()
        )?;
        cfg = c;
    }
    if !args.resume && out_dir.join("train_state").exists() {
        bail!(
            "{} already holds a fine-tuning run: pass --resume to continue it, or choose another --out",
            out_dir.display()
        );
    }
    if args.resume && !out_dir.join("train_state").exists() {
        writeln!(
            out,
            "{stage}: --resume: {} holds no saved state; starting from iteration 0",
            out_dir.display()
        )?;
    }
    let episodes = args.eval_episodes.unwrap_or(cfg.eval.episodes);
    let recording = Recording::open(
        rerun,
        diffrl_viz::RerunSink::Off,
        stage,
        Timeline::TrainStep,
        out,
    )?;
    if let Some(w) = args.device.sharding_warning(&cfg) {
        writeln!(out, "{w}")?;
    }
    with_device!(args.device, |device, B| {
        finetune::<B>(
            &cfg,
            algorithm,
            &policy_dir,
            &out_dir,
            args.resume,
            episodes,
            &device,
            out,
            recording.recorder(),
        )
    })?;
    Ok(())
}
