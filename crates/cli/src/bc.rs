//! Behaviour cloning of the configured policy on a LeRobot dataset ([`pretrain`]): what
//! `diffrl pretrain`, DAgger rounds and the pipeline's BC stage run.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use burn::tensor::backend::{AutodiffBackend, Backend};
use diffrl_core::lerobot::read_dataset;
use diffrl_core::record::{Recorder, Topic};
use diffrl_learn::LearnError;
use diffrl_learn::bc::{self, BcHooks, BcLog};
use diffrl_learn::data::{ChunkDataset, episode_tasks, fit_normalizers};
use diffrl_learn::eval::EvalReport;
use diffrl_policy::{Policy, PolicySpec, Vocabulary, checkpoint};
use indicatif::ProgressBar;

use crate::config::RunConfig;
use crate::envs::{check_spec, env_spec, observe_recorded, privileged_recorded};
use crate::evaluation::{final_eval, periodic_eval};
use crate::progress::{append_metrics, bar, trim_metrics};

/// Training hooks: the progress bar, metrics.jsonl, the recording and periodic evaluations.
struct Hooks<'a> {
    cfg: &'a RunConfig,
    pb: ProgressBar,
    metrics: PathBuf,
    /// Whether the log has been trimmed to the work this run continues (at its first line).
    trimmed: bool,
    rec: &'a dyn Recorder,
}

impl Hooks<'_> {
    /// Before the run's first line, at `step`: steps up to `step - 1` are what it continues
    /// (the first line after a checkpoint is its first log or evaluation step).
    fn trim_once(&mut self, step: usize) {
        if !self.trimmed {
            trim_metrics(&self.metrics, "step", step as u64 - 1);
            self.trimmed = true;
        }
    }
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
        self.trim_once(l.step);
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
            self.trim_once(step);
            append_metrics(
                &self.metrics,
                &serde_json::json!({"stage": "pretrain", "eval": s}),
            );
        }
        Ok(summary)
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
    // The auxiliary target of the encoders: read off the recorded states before they become
    // observations.
    let env = env_spec(cfg)?;
    let privileged = if cfg.policy.encoder.aux_weight > 0.0 {
        let p = privileged_recorded(&cfg.env, &episodes)
            .with_context(|| format!("reading privileged values from {}", dataset.display()))?;
        if p.iter().flatten().all(Vec::is_empty) {
            bail!(
                "[policy.encoder] aux_weight = {} asks for an auxiliary target, but the task {} \
                 names no privileged values; set it to 0",
                cfg.policy.encoder.aux_weight,
                cfg.task
            );
        }
        Some(p)
    } else {
        None
    };
    observe_recorded(&cfg.env, &mut episodes).with_context(|| {
        format!(
            "[env] observes {} with {}",
            cfg.env.observation(),
            dataset.display()
        )
    })?;
    let norm = fit_normalizers(&episodes)
        .with_context(|| format!("checking the dataset {}", dataset.display()))?;
    let frames = episodes
        .iter()
        .find_map(|e| e.observations.first())
        .and_then(|o| o.image.as_ref())
        .map(|im| [3, im.height as usize, im.width as usize]);
    if env.image.is_some() && frames.is_none() {
        bail!(
            "[env] observes \"{}\", which includes a camera image, but the dataset {} holds no \
             camera frames (observation.image); record one with the same [env] (`diffrl demos \
             {} --config CONFIG --out DIR`)",
            cfg.env.observation(),
            dataset.display(),
            cfg.task
        );
    }
    let spec = PolicySpec {
        state_dim: norm.state.dim(),
        action_dim: norm.action.dim(),
        // A state policy ignores the frames of a dataset recorded with a camera.
        image: env.image.and(frames),
        // A language-conditioned task: the policy reads each episode's instruction.
        text: env.text,
        agents: env.agents,
        entities: env.entities.clone(),
        aux: privileged
            .as_ref()
            .and_then(|p| p.iter().flatten().next())
            .map_or(0, Vec::len),
    };
    if spec.image.is_none() {
        for o in episodes.iter_mut().flat_map(|e| e.observations.iter_mut()) {
            o.image = None;
        }
    }
    check_spec(&spec, &env, &format!("the dataset {}", dataset.display()))?;
    let policy = match init {
        // The vocabulary: the words of the training episodes' instructions and of every
        // instruction the task can say (a short run's demos miss some paraphrases).
        None if spec.text => {
            let mut texts = episode_tasks(&episodes)
                .with_context(|| format!("reading the tasks of {}", dataset.display()))?
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>();
            texts.extend(cfg.env.texts());
            let vocab = Vocabulary::from_texts(texts.iter().map(String::as_str));
            Policy::<B>::with_text(cfg.policy.clone(), spec, norm, vocab, cfg.run.seed, device)?
        }
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
    // A policy that reads text: each sample carries its episode's instruction (words that an
    // initial policy's vocabulary lacks read as <unk>).
    let data = ChunkDataset::build_with_text(
        &episodes,
        cfg.policy.obs_horizon,
        cfg.policy.pred_horizon,
        &policy.norm,
        policy.tokenizer(),
    )
    .with_context(|| format!("building training samples from {}", dataset.display()))?;
    // An initial policy without the head (DAgger's later rounds of an older policy) ignores it.
    let data = match privileged {
        Some(p) if policy.has_aux_head() => data
            .with_aux(&p)
            .with_context(|| format!("privileged values of {}", dataset.display()))?,
        _ => data,
    };
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    writeln!(
        out,
        "pretrain: {} samples from {} episodes of {}; {:?} policy of {} parameters, {} steps of batch {}",
        data.len,
        episodes.len(),
        dataset.display(),
        cfg.policy.kind,
        burn::module::Module::num_params(&policy.model),
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
        trimmed: false,
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
    final_eval(
        cfg,
        &outcome.policy,
        outcome.steps,
        eval_episodes,
        out_dir,
        out,
        rec,
    )
}
