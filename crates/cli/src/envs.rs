//! The configured environment as the commands need it: the policy spec it produces, a vector
//! of its worlds, its view of recorded states, and a run's dataset folder.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use burn::tensor::backend::Backend;
use diffrl_core::Episode;
use diffrl_core::dyn_env::DynEnv;
use diffrl_core::dyn_task::EnvSection;
use diffrl_core::env::Env;
use diffrl_core::vec_env::{AutoReset, VecEnv};
use diffrl_policy::{Policy, PolicySpec, checkpoint};

use crate::config::RunConfig;

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

/// The privileged values ([`diffrl_core::task::Task::privileged_recorded`]) of every recorded
/// frame of `episodes`: one list per episode, one vector per frame.
pub(crate) fn privileged_recorded(
    env: &EnvSection,
    episodes: &[Episode],
) -> anyhow::Result<Vec<Vec<Vec<f32>>>> {
    episodes
        .iter()
        .enumerate()
        .map(|(i, ep)| {
            ep.observations
                .iter()
                .map(|o| {
                    env.privileged_recorded(&o.state)
                        .map_err(|m| anyhow::anyhow!("episode {i} {m}"))
                })
                .collect()
        })
        .collect()
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
        text: space.text,
        agents: space.agents,
        entities: space.entities,
        aux: 0,
    })
}

/// Refuses a policy whose shapes differ from the environment's. The agents' layout is compared
/// only where the policy records one (more than one agent, or entity groups): a flat policy
/// reads the state as one vector and does not depend on it.
pub(crate) fn check_spec(policy: &PolicySpec, env: &PolicySpec, what: &str) -> anyhow::Result<()> {
    let flat = policy.agents == 1 && policy.entities.is_empty();
    if !flat && (policy.agents != env.agents || policy.entities != env.entities) {
        let groups = |s: &PolicySpec| {
            s.entities
                .iter()
                .map(|g| format!("{} {} x {} at {}", g.name, g.count, g.width, g.offset))
                .collect::<Vec<_>>()
                .join(", ")
        };
        bail!(
            "{what} was built for {} agents with entity groups [{}], but the configured \
             environment gives {} agents with [{}] (check the [env] settings)",
            policy.agents,
            groups(policy),
            env.agents,
            groups(env)
        );
    }
    let shape = |s: &PolicySpec| (s.state_dim, s.action_dim, s.image, s.text);
    if shape(policy) != shape(env) {
        bail!(
            "{what} expects state dim {}, action dim {}, image {:?}, text {}, but the \
             configured environment gives {}, {}, {:?}, {} (check [env].obs)",
            policy.state_dim,
            policy.action_dim,
            policy.image,
            policy.text,
            env.state_dim,
            env.action_dim,
            env.image,
            env.text
        );
    }
    Ok(())
}

pub(crate) fn vec_env(cfg: &RunConfig, envs: usize) -> VecEnv<DynEnv> {
    let worlds = (0..envs).map(|_| cfg.env.build()).collect();
    VecEnv::new(worlds, AutoReset::SameStep, cfg.run.threads)
}

/// Resolves the dataset folder of a run.
pub fn dataset_dir(cfg: &RunConfig, arg: Option<&Path>) -> PathBuf {
    match arg {
        Some(p) => p.to_path_buf(),
        None if !cfg.demos.dataset.as_os_str().is_empty() => cfg.demos.dataset.clone(),
        None => cfg.run.runs_dir.join(&cfg.run.name).join("demos"),
    }
}

/// Loads the policy checkpoint `dir` onto `device` and checks that it fits the configured
/// environment; errors name the folder.
pub(crate) fn load_policy<B: Backend>(
    cfg: &RunConfig,
    dir: &Path,
    device: &B::Device,
) -> anyhow::Result<Policy<B>> {
    let (policy, _) = checkpoint::load::<B>(dir, device)
        .with_context(|| format!("loading the policy {}", dir.display()))?;
    check_spec(
        &policy.spec,
        &env_spec(cfg)?,
        &format!("the policy {}", dir.display()),
    )?;
    Ok(policy)
}
