//! DAgger (Ross, Gordon & Bagnell 2011): roll out the learner's policy, let the expert label
//! every state the policy visits, and train on the demonstrations plus those labelled states.
//! Behaviour cloning alone only ever sees the expert's own states; the policy's small errors
//! take it to states the data never showed, where its errors grow. The labels fix exactly those.
//!
//! A label is one call of the task's expert at the visited state (no snapshot, restore or warm
//! start): exact for an expert whose action is a function of the state (Push-T's pusher). An
//! expert that keeps a plan (Push-T's MPPI) also works, but its label then depends on the plan
//! it carried from the previous state of the policy's rollout.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use burn::tensor::backend::{AutodiffBackend, Backend};
use diffrl_core::dyn_env::{DynEnv, DynExpert, DynSnapshot};
use diffrl_core::dyn_task::{EnvSection, ExpertSection};
use diffrl_core::env::{Env, StepResult};
use diffrl_core::fs::write_atomic;
use diffrl_core::lerobot::read_dataset;
use diffrl_core::record::{NoRecorder, Recorder};
use diffrl_core::seeding::{Rng, derive, rng};
use diffrl_core::space::{BoxSpace, ImageObs, Observation, ObservationSpace};
use diffrl_core::task::{Expert, TaskEnv};
use diffrl_core::vec_env::{AutoReset, VecEnv};
use diffrl_core::{EnvError, Episode};
use diffrl_learn::eval::{EvalReport, PolicyActor, evaluate_actor};
use diffrl_policy::{Policy, SampleMode, checkpoint};
use rand::Rng as _;
use serde::{Deserialize, Serialize};

use crate::config::RunConfig;
use crate::envs::{check_spec, env_spec};
use crate::progress::bar;

/// Seed stream of the expert inside a relabelled episode.
const EXPERT_STREAM: u64 = 0xE7;
/// Seed stream of the per-step choice between the expert's and the policy's action.
const MIX_STREAM: u64 = 0xB7;

/// A task's environment driven by someone else's actions that records, at every state it
/// visits, the expert's action there: DAgger's data collection. The recorded episodes hold the
/// true states and the expert's labels; with probability `beta` per step the expert's label is
/// executed instead of the given action (DAgger's mixture policy; 0 = the learner alone).
pub struct Relabel {
    env: DynEnv,
    expert: DynExpert,
    instruction: String,
    beta: f64,
    mix: Rng,
    current: Episode,
    /// Completed episodes, in the order they ended.
    pub done: Vec<Episode>,
    /// Sum over recorded steps of the distance (px) between the executed and the expert's action.
    disagreement: f64,
    /// The camera frame of the current observation, recorded with the next step.
    frame: Option<ImageObs>,
}

impl Relabel {
    /// Wraps a fresh environment of `env_cfg` with an expert of `expert_cfg` (an error when the
    /// task has no expert).
    pub fn new(
        env_cfg: &EnvSection,
        expert_cfg: &ExpertSection,
        beta: f64,
    ) -> anyhow::Result<Self> {
        let expert = expert_cfg.build(0).with_context(|| {
            format!(
                "DAgger needs an expert to label states; task {} has none",
                env_cfg.task().name()
            )
        })?;
        Ok(Self {
            env: env_cfg.build(),
            expert,
            instruction: env_cfg.task().dataset().instruction,
            beta,
            mix: rng(0),
            current: Episode::default(),
            done: Vec::new(),
            disagreement: 0.0,
            frame: None,
        })
    }
}

impl Env for Relabel {
    type Snapshot = DynSnapshot;

    fn observation_space(&self) -> ObservationSpace {
        self.env.observation_space()
    }
    fn action_space(&self) -> BoxSpace {
        self.env.action_space()
    }
    fn max_episode_steps(&self) -> usize {
        self.env.max_episode_steps()
    }
    fn reset(&mut self, seed: u64) -> Observation {
        self.expert.reset(derive(seed, EXPERT_STREAM));
        self.mix = rng(derive(seed, MIX_STREAM));
        let obs = self.env.reset(seed);
        self.current = Episode {
            seed: Some(seed),
            // A language-conditioned task draws its instruction per episode: that one is the
            // episode's task, which behaviour cloning conditions on.
            task: Some(obs.text.clone().unwrap_or_else(|| self.instruction.clone())),
            ..Episode::default()
        };
        self.frame = obs.image.clone();
        obs
    }
    fn step(&mut self, action: &[f32]) -> Result<StepResult, EnvError> {
        let state = self.env.true_state().iter().map(|&v| v as f32).collect();
        let label = self.expert.act(&self.env);
        let use_expert = self.beta > 0.0 && self.mix.random::<f64>() < self.beta;
        let r = if use_expert {
            self.env.step(&label)?
        } else {
            self.env.step(action)?
        };
        if !use_expert && action.len() == label.len() {
            self.disagreement += f64::from(
                action
                    .iter()
                    .zip(&label)
                    .map(|(a, l)| (a - l).powi(2))
                    .sum::<f32>()
                    .sqrt(),
            );
        }
        let frame = std::mem::replace(&mut self.frame, r.obs.image.clone());
        self.current.push(
            Observation {
                state,
                image: frame,
                text: None,
            },
            label,
            r.reward,
            r.info.score,
            r.info.success,
        );
        if r.terminated || r.truncated {
            self.current.terminated = r.terminated;
            self.current.truncated = r.truncated;
            self.done.push(std::mem::take(&mut self.current));
        }
        Ok(r)
    }
    fn snapshot(&self) -> Self::Snapshot {
        self.env.snapshot()
    }
    fn restore(&mut self, snapshot: &Self::Snapshot) -> Observation {
        let obs = self.env.restore(snapshot);
        self.frame = obs.image.clone();
        obs
    }
    fn observe(&mut self) -> Observation {
        self.env.observe()
    }
    fn elapsed_steps(&self) -> usize {
        self.env.elapsed_steps()
    }
    fn scene(&self) -> Option<diffrl_core::scene::Scene2d> {
        self.env.scene()
    }
    fn anchor_cells(&self) -> Option<Vec<f32>> {
        self.env.anchor_cells()
    }
}

/// What one DAgger round of rollouts gave.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DaggerSummary {
    /// Policy episodes rolled out.
    pub episodes: usize,
    /// Their success rate (the learner's, or the mixture's when beta > 0).
    pub success_rate: f64,
    /// Wilson 95% interval of that rate.
    pub ci95: [f64; 2],
    /// Mean over episodes of the highest score.
    pub mean_max_score: f64,
    /// States labelled by the expert.
    pub labelled_states: usize,
    /// Mean distance (px) between the policy's executed action and the expert's label.
    pub mean_disagreement_px: f64,
    /// Probability per step of executing the expert's label instead.
    pub beta: f64,
    /// Wall-clock seconds.
    pub seconds: f64,
}

impl std::fmt::Display for DaggerSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} policy episodes (beta {}): success {:.1}% (95% CI {:.1}-{:.1}%), mean max score \
             {:.3}; {} states labelled by the expert, policy-expert disagreement {:.1} px; {:.1} s",
            self.episodes,
            self.beta,
            100.0 * self.success_rate,
            100.0 * self.ci95[0],
            100.0 * self.ci95[1],
            self.mean_max_score,
            self.labelled_states,
            self.mean_disagreement_px,
            self.seconds
        )
    }
}

/// Rolls `policy` out for `episodes` seeded episodes (environments and seeds as in
/// evaluation: `envs` environments, root `seed`; deterministic chains unless `stochastic`) and
/// returns the expert-labelled episodes.
#[allow(clippy::too_many_arguments)]
pub fn collect<B: Backend>(
    env_cfg: &EnvSection,
    expert_cfg: &ExpertSection,
    policy: &Policy<B>,
    device: &B::Device,
    episodes: usize,
    envs: usize,
    seed: u64,
    beta: f64,
    stochastic: bool,
    threads: usize,
) -> anyhow::Result<(Vec<Episode>, DaggerSummary)> {
    let mode = if stochastic {
        SampleMode::Stochastic
    } else {
        SampleMode::Deterministic
    };
    anyhow::ensure!(
        (0.0..=1.0).contains(&beta),
        "DAgger's beta (the probability of executing the expert's action) must be in [0, 1], got {beta}"
    );
    let start = Instant::now();
    let n_env = envs.clamp(1, episodes.max(1));
    let worlds = (0..n_env)
        .map(|_| Relabel::new(env_cfg, expert_cfg, beta))
        .collect::<anyhow::Result<_>>()?;
    let mut venv = VecEnv::new(worlds, AutoReset::SameStep, threads);
    let mut actor = PolicyActor::new(policy, device, mode, seed).with_threads(venv.threads());
    let pb = bar(
        episodes as u64,
        "  dagger rollouts [{bar:30}] {pos}/{len} episodes {elapsed_precise} (eta {eta})",
    );
    let report: EvalReport = evaluate_actor(
        &mut venv,
        &mut actor,
        episodes,
        seed,
        &mut |d, _| pb.set_position(d as u64),
        &NoRecorder,
    )?;
    pb.finish_and_clear();
    // Each environment played its quota of episodes first; anything after that was idling.
    let mut eps = Vec::with_capacity(episodes);
    let mut disagreement = 0.0;
    for (i, env) in venv.envs().enumerate() {
        let n = report.per_episode.iter().filter(|e| e.env == i).count();
        anyhow::ensure!(
            env.done.len() >= n,
            "environment {i} recorded {} episodes, evaluation counted {n}",
            env.done.len()
        );
        eps.extend(env.done[..n].iter().cloned());
        disagreement += env.disagreement;
    }
    let labelled: usize = eps.iter().map(Episode::len).sum();
    let summary = DaggerSummary {
        episodes: report.episodes,
        success_rate: report.success_rate,
        ci95: report.ci95,
        mean_max_score: report.mean_max_score,
        labelled_states: labelled,
        // Idle steps after an environment's quota count too; close enough for a diagnostic.
        mean_disagreement_px: disagreement / labelled.max(1) as f64,
        beta,
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok((eps, summary))
}

/// One round's data: `base`'s episodes (none without it) followed by the expert-labelled
/// rollouts of `policy` ([`collect`] with `cfg`'s environment, expert and [eval].envs), written
/// as a dataset at `dir` with `provenance` (plus the rollouts' summary). The base is read
/// before any rollout, so a bad dataset is refused at once. Returns the rollouts' summary, the
/// base's episode count and the episodes written.
#[allow(clippy::too_many_arguments)]
fn relabel_and_aggregate<B: Backend>(
    cfg: &RunConfig,
    policy: &Policy<B>,
    device: &B::Device,
    base: Option<&Path>,
    (episodes, seed, beta, stochastic): (usize, u64, f64, bool),
    dir: &Path,
    overwrite: bool,
    mut provenance: serde_json::Value,
) -> anyhow::Result<(DaggerSummary, usize, usize)> {
    let mut all = match base {
        Some(base) => read_dataset(base)
            .and_then(|ds| ds.episodes("observation.state"))
            .with_context(|| format!("reading the base dataset {}", base.display()))?,
        None => Vec::new(),
    };
    let base_episodes = all.len();
    let (eps, summary) = collect(
        &cfg.env,
        &cfg.expert,
        policy,
        device,
        episodes,
        cfg.eval.envs,
        seed,
        beta,
        stochastic,
        cfg.run.threads,
    )?;
    all.extend(eps);
    provenance["dagger"] = serde_json::to_value(&summary)?;
    provenance["base_episodes"] = base_episodes.into();
    provenance["expert"] = serde_json::to_value(&cfg.expert)?;
    let data_summary = crate::commands::demos::summarize(&all, summary.seconds);
    let written = crate::commands::demos::write(
        &cfg.env,
        dir,
        &all,
        &data_summary,
        provenance,
        false,
        overwrite,
    )?;
    Ok((summary, base_episodes, written))
}

/// `diffrl demos TASK --dagger POLICY`'s arguments.
#[derive(Debug, Clone)]
pub struct DaggerArgs {
    /// The policy checkpoint to roll out.
    pub policy: PathBuf,
    /// A dataset whose episodes come first in the output.
    pub base: Option<PathBuf>,
    /// Probability per step of executing the expert's label.
    pub beta: f64,
    /// Stochastic chains instead of deterministic DDIM.
    pub stochastic: bool,
    /// Policy episodes.
    pub episodes: usize,
    /// Root seed of the rollouts.
    pub seed: u64,
}

/// `diffrl demos TASK --dagger POLICY [--base DATASET] --out DIR`: one DAgger round's data
/// (environments stepped on `cfg`'s [run].threads).
pub fn dagger_cmd(
    cfg: &RunConfig,
    args: &DaggerArgs,
    dir: &Path,
    overwrite: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    type B = diffrl_policy::CpuBackend;
    let device = Default::default();
    let (policy, _) = checkpoint::load::<B>(&args.policy, &device)
        .with_context(|| format!("loading the policy {}", args.policy.display()))?;
    check_spec(
        &policy.spec,
        &env_spec(cfg)?,
        &format!("the policy {}", args.policy.display()),
    )?;
    let command = format!(
        "diffrl demos {} --dagger {} {}--episodes {} --seed {} --beta {}{}",
        cfg.task,
        args.policy.display(),
        args.base
            .as_ref()
            .map_or(String::new(), |b| format!("--base {} ", b.display())),
        args.episodes,
        args.seed,
        args.beta,
        if args.stochastic { " --stochastic" } else { "" }
    );
    let provenance = serde_json::json!({
        "command": command,
        "seed": args.seed,
        "env": cfg.env,
        "diffrl_version": env!("CARGO_PKG_VERSION"),
    });
    let (summary, base_episodes, written) = relabel_and_aggregate(
        cfg,
        &policy,
        &device,
        args.base.as_deref(),
        (args.episodes, args.seed, args.beta, args.stochastic),
        dir,
        overwrite,
        provenance,
    )?;
    writeln!(out, "dagger: {summary}")?;
    writeln!(
        out,
        "wrote {written} episodes ({base_episodes} from the base dataset, {} relabelled policy \
         episodes) to {}",
        written - base_episodes,
        dir.display()
    )?;
    Ok(())
}

/// Seed stream of `diffrl run`'s DAgger rollouts (round r uses `derive(seed, STREAM + r)`).
const ROUND_STREAM: u64 = 0xDA66E400;

/// One finished DAgger round of `diffrl run` (its `round.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoundRecord {
    /// Round number, from 1.
    pub round: usize,
    /// The rollouts of the previous policy that were labelled.
    pub rollouts: DaggerSummary,
    /// Episodes in the aggregated dataset the round trained on.
    pub episodes_in_data: usize,
    /// Behaviour-cloning steps of the round.
    pub steps: usize,
    /// Wall-clock seconds of the round (rollouts, writing, training).
    pub seconds: f64,
}

/// Runs DAgger round `round` of [dagger] into `dir`: rolls out the policy in `policy`, labels
/// its states, writes `dir/data` (the episodes of `data` followed by the new ones) and
/// continues training the policy on it into `dir` (policy in `dir/policy`). A finished round
/// (`dir/round.json`) is read back; an interrupted one keeps its data and resumes training.
#[allow(clippy::too_many_arguments)]
pub fn round<B: AutodiffBackend>(
    cfg: &RunConfig,
    round: usize,
    data: &Path,
    policy: &Path,
    dir: &Path,
    device: &B::Device,
    out: &mut dyn Write,
    rec: &dyn Recorder,
) -> anyhow::Result<RoundRecord> {
    let marker = dir.join("round.json");
    if let Some(r) = std::fs::read_to_string(&marker)
        .ok()
        .and_then(|t| serde_json::from_str::<RoundRecord>(&t).ok())
    {
        return Ok(r);
    }
    let t0 = Instant::now();
    let data_dir = dir.join("data");
    let rollouts_path = dir.join("rollouts.json");
    let (rollouts, episodes_in_data): (DaggerSummary, usize) =
        match std::fs::read_to_string(&rollouts_path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .filter(|_| data_dir.join("meta/info.json").exists())
        {
            Some(done) => done,
            None => {
                let (p, _) = checkpoint::load::<B::InnerBackend>(policy, device)
                    .with_context(|| format!("loading the policy {}", policy.display()))?;
                let (summary, _, written) = relabel_and_aggregate(
                    cfg,
                    &p,
                    device,
                    Some(data),
                    (
                        cfg.dagger.episodes,
                        derive(cfg.run.seed, ROUND_STREAM + round as u64),
                        cfg.dagger.beta,
                        cfg.dagger.stochastic,
                    ),
                    &data_dir,
                    true,
                    serde_json::json!({"dagger_round": round, "policy": policy, "base": data}),
                )?;
                writeln!(out, "      round {round}: {summary}")?;
                write_atomic(
                    &rollouts_path,
                    &serde_json::to_vec_pretty(&(&summary, written))?,
                )
                .with_context(|| format!("writing {}", rollouts_path.display()))?;
                (summary, written)
            }
        };
    let mut rcfg = cfg.clone();
    rcfg.pretrain.steps = cfg.dagger.steps;
    rcfg.pretrain.warmup_steps = cfg.pretrain.warmup_steps.min(cfg.dagger.steps / 10);
    rcfg.pretrain.eval_every = 0;
    crate::bc::pretrain::<B>(
        &rcfg,
        &data_dir,
        Some(policy),
        dir,
        true,
        0,
        device,
        out,
        rec,
    )?;
    let record = RoundRecord {
        round,
        episodes_in_data,
        rollouts,
        steps: cfg.dagger.steps,
        seconds: t0.elapsed().as_secs_f64(),
    };
    write_atomic(&marker, &serde_json::to_vec_pretty(&record)?)
        .with_context(|| format!("writing {}", marker.display()))?;
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded default config's task (Push-T), through the registry.
    fn sections() -> (EnvSection, ExpertSection) {
        let (cfg, _) = crate::config::load(None).unwrap();
        (cfg.env, cfg.expert)
    }

    /// The recorded label at every step is what a fresh expert says at that state, whatever
    /// action drove the environment.
    #[test]
    fn labels_are_the_experts_action_at_the_visited_state() {
        let (env_cfg, expert_cfg) = sections();
        let mut env = Relabel::new(&env_cfg, &expert_cfg, 0.0).unwrap();
        env.reset(7);
        let mut check = env_cfg.build();
        for t in 0..30 {
            // A policy that wanders: not the expert's action.
            let a = [100.0 + 10.0 * t as f32, 300.0 - 5.0 * t as f32];
            check.restore(&env.env.snapshot());
            env.step(&a).unwrap();
            let mut fresh = expert_cfg.build(0).unwrap();
            let want = fresh.act(&check);
            let got = &env.current.actions[t];
            assert!(
                (got[0] - want[0]).abs() < 1e-3 && (got[1] - want[1]).abs() < 1e-3,
                "step {t}: recorded {got:?}, expert at that state {want:?}"
            );
            assert_eq!(env.current.observations[t].state.len(), 5);
        }
        assert!(env.disagreement > 0.0);
    }

    /// beta = 1 executes the expert: the episode is the expert's own.
    #[test]
    fn beta_one_is_the_expert() {
        let (env_cfg, expert_cfg) = sections();
        let mut a = Relabel::new(&env_cfg, &expert_cfg, 1.0).unwrap();
        let mut b = env_cfg.build();
        let mut expert = expert_cfg.build(0).unwrap();
        a.reset(3);
        b.reset(3);
        for _ in 0..40 {
            let label = expert.act(&b);
            let ra = a.step(&[0.0, 0.0]).unwrap();
            let rb = b.step(&label).unwrap();
            assert_eq!(ra.obs, rb.obs);
            if rb.terminated || rb.truncated {
                break;
            }
        }
    }
}
