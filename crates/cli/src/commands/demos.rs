//! Expert demonstrations: run a task's expert for N seeded episodes (in parallel over
//! episodes) and write them as a LeRobot v3.0 dataset.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use diffrl_core::dyn_env::{DynEnv, DynExpert};
use diffrl_core::dyn_task::{EnvSection, ExpertSection};
use diffrl_core::lerobot::{DatasetMeta, write_dataset};
use diffrl_core::seeding::derive;
use diffrl_core::stats::{nearest_rank_quantile, wilson_interval};
use diffrl_core::task::{Expert, TaskEnv};
use diffrl_core::{BoxSpace, Env, Episode, Observation};
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Seed stream of the expert's noise, separate from the environment's.
const EXPERT_STREAM: u64 = 0xE7;
/// Seed stream of the DART noise added to executed actions.
const DART_STREAM: u64 = 0xDA;

/// What a batch of expert episodes achieved.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DemoSummary {
    /// Episodes run.
    pub episodes: usize,
    /// Successful episodes.
    pub successes: usize,
    /// Success rate.
    pub success_rate: f64,
    /// Wilson 95% interval of the success rate.
    pub success_ci95: [f64; 2],
    /// Mean over episodes of the best reward (gym-pusht's "max reward").
    pub mean_max_reward: f64,
    /// Mean episode length (steps).
    pub mean_length: f64,
    /// Environment steps executed in episodes (not counting planning look-ahead).
    pub env_steps: usize,
    /// Median distance (px) between consecutive actions within an episode: how jumpy the
    /// demonstrations are (datasets recorded before it read as 0).
    #[serde(default)]
    pub action_jump_median: f64,
    /// 90th percentile of that distance (px).
    #[serde(default)]
    pub action_jump_p90: f64,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// One expert episode on `env` from `seed`, executing the expert's actions plus DART noise of
/// `noise_px` standard deviation. `on_step` sees (observation, label) pairs.
pub fn expert_episode(
    env: &mut DynEnv,
    expert: &mut DynExpert,
    instruction: &str,
    seed: u64,
    noise_px: f64,
    mut on_step: impl FnMut(&DynEnv, &[f32], &diffrl_core::StepResult),
) -> anyhow::Result<Episode> {
    let obs = env.reset(seed);
    expert.reset(derive(seed, EXPERT_STREAM));
    let mut noise = Dart::new(noise_px, derive(seed, DART_STREAM));
    run_expert_from_current(
        env,
        obs,
        expert,
        instruction,
        Some(seed),
        &mut noise,
        &mut on_step,
    )
}

/// DART noise injection (Laskey et al. 2017): Gaussian noise on the executed action only.
pub struct Dart {
    std: f64,
    rng: diffrl_core::seeding::Rng,
}

impl Dart {
    /// Noise of `std` px (0 = none) from the stream `seed`.
    pub fn new(std: f64, seed: u64) -> Self {
        Self {
            std,
            rng: diffrl_core::seeding::rng(seed),
        }
    }

    /// The action to execute for the expert's `label`, kept inside the action `space`.
    fn perturb(&mut self, label: &[f32], space: &BoxSpace) -> Vec<f32> {
        if self.std <= 0.0 {
            return label.to_vec();
        }
        label
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let n: f64 =
                    rand_distr::Distribution::sample(&rand_distr::StandardNormal, &mut self.rng);
                (f64::from(v) + self.std * n)
                    .clamp(f64::from(space.low[i]), f64::from(space.high[i])) as f32
            })
            .collect()
    }
}

/// Runs the expert from `env`'s current state, whose observation is `obs`, until the episode
/// ends. Episodes record the full state ([`DynEnv::true_state`]), the camera frame when the
/// environment observes one, and the expert's labels; the environment gets them through
/// `noise`. The episode's task is `obs`'s text when the environment has one (a language task
/// draws an instruction per episode), else `instruction` (the task's single one).
pub fn run_expert_from_current(
    env: &mut DynEnv,
    obs: Observation,
    expert: &mut DynExpert,
    instruction: &str,
    seed: Option<u64>,
    noise: &mut Dart,
    on_step: &mut dyn FnMut(&DynEnv, &[f32], &diffrl_core::StepResult),
) -> anyhow::Result<Episode> {
    let mut ep = Episode {
        seed,
        task: Some(obs.text.unwrap_or_else(|| instruction.to_string())),
        ..Episode::default()
    };
    let space = env.action_space();
    // The camera frame of the current observation, recorded with the next step.
    let mut frame = obs.image;
    loop {
        let state = env.true_state().iter().map(|&v| v as f32).collect();
        let action = expert.act(env);
        let r = env.step(&noise.perturb(&action, &space))?;
        on_step(env, &action, &r);
        let seen = Observation {
            state,
            image: std::mem::replace(&mut frame, r.obs.image.clone()),
            text: None,
        };
        ep.push(seen, action, r.reward, r.info.score, r.info.success);
        if r.terminated || r.truncated {
            ep.terminated = r.terminated;
            ep.truncated = r.truncated;
            return Ok(ep);
        }
    }
}

/// Runs `episodes` expert episodes with DART noise of `noise_px`; episode `i` starts from seed
/// `derive(seed, i)`.
pub fn generate(
    env_cfg: &EnvSection,
    expert_cfg: &ExpertSection,
    noise_px: f64,
    episodes: usize,
    seed: u64,
    threads: usize,
) -> anyhow::Result<(Vec<Episode>, DemoSummary)> {
    let instruction = env_cfg.task().dataset().instruction;
    let no_expert = || {
        anyhow::anyhow!(
            "task {} has no expert to record demonstrations with",
            env_cfg.task().name()
        )
    };
    expert_cfg.build(0).ok_or_else(no_expert)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("starting worker threads")?;
    let bar = ProgressBar::new(episodes as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} expert demos [{bar:30}] {pos}/{len} episodes, {msg} ETA {eta}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    let successes = std::sync::atomic::AtomicUsize::new(0);
    let start = Instant::now();
    let eps: Vec<Episode> = pool.install(|| {
        (0..episodes)
            .into_par_iter()
            .map(|i| {
                let s = derive(seed, i as u64);
                let mut env = env_cfg.build();
                let mut expert = expert_cfg.build(s).ok_or_else(no_expert)?;
                let ep = expert_episode(
                    &mut env,
                    &mut expert,
                    &instruction,
                    s,
                    noise_px,
                    |_, _, _| {},
                )?;
                let done = successes
                    .fetch_add(ep.success() as usize, std::sync::atomic::Ordering::Relaxed)
                    + ep.success() as usize;
                bar.inc(1);
                bar.set_message(format!("{done} successful"));
                Ok(ep)
            })
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    bar.finish_and_clear();
    let summary = summarize(&eps, start.elapsed().as_secs_f64());
    Ok((eps, summary))
}

/// Success rate with its Wilson interval, mean max reward and length.
pub fn summarize(eps: &[Episode], seconds: f64) -> DemoSummary {
    let n = eps.len();
    let successes = eps.iter().filter(|e| e.success()).count();
    let (lo, hi) = wilson_interval(successes, n, 1.959964);
    let mut jumps: Vec<f64> = eps
        .iter()
        .flat_map(|e| {
            e.actions.windows(2).map(|w| {
                w[0].iter()
                    .zip(&w[1])
                    .map(|(a, b)| f64::from(a - b).powi(2))
                    .sum::<f64>()
                    .sqrt()
            })
        })
        .collect();
    jumps.sort_by(f64::total_cmp);
    let quantile = |q: f64| nearest_rank_quantile(&jumps, q).unwrap_or(0.0);
    DemoSummary {
        action_jump_median: quantile(0.5),
        action_jump_p90: quantile(0.9),
        episodes: n,
        successes,
        success_rate: successes as f64 / n.max(1) as f64,
        success_ci95: [lo, hi],
        mean_max_reward: eps.iter().map(|e| e.max_reward() as f64).sum::<f64>() / n.max(1) as f64,
        mean_length: eps.iter().map(|e| e.len() as f64).sum::<f64>() / n.max(1) as f64,
        env_steps: eps.iter().map(Episode::len).sum(),
        seconds,
    }
}

impl std::fmt::Display for DemoSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} episodes: success {:.1}% (95% CI {:.1}-{:.1}%), mean max reward {:.3}, mean length {:.1} steps, action jumps median {:.1} (p90 {:.1}; action units, px on Push-T), {:.1} s",
            self.episodes,
            100.0 * self.success_rate,
            100.0 * self.success_ci95[0],
            100.0 * self.success_ci95[1],
            self.mean_max_reward,
            self.mean_length,
            self.action_jump_median,
            self.action_jump_p90,
            self.seconds
        )
    }
}

/// Writes episodes (only the successful ones when `only_successful`) as a LeRobot dataset
/// with provenance; returns how many episodes were written.
pub fn write(
    env: &EnvSection,
    out: &Path,
    eps: &[Episode],
    summary: &DemoSummary,
    provenance: serde_json::Value,
    only_successful: bool,
    overwrite: bool,
) -> anyhow::Result<usize> {
    let kept: Vec<Episode> = eps
        .iter()
        .filter(|e| !only_successful || e.success())
        .cloned()
        .collect();
    anyhow::ensure!(
        !kept.is_empty(),
        "the expert solved none of the {} episodes, and only successful ones were asked for",
        eps.len()
    );
    let info = env.dataset();
    let meta = DatasetMeta {
        fps: info.fps,
        robot_type: info.robot_type,
        state_names: info.state_names,
        action_names: info.action_names,
        task: info.instruction,
        provenance: serde_json::json!({"provenance": provenance, "summary": summary}),
    };
    write_dataset(out, &meta, &kept, overwrite)
        .with_context(|| format!("writing dataset {}", out.display()))?;
    Ok(kept.len())
}
