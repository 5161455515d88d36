//! PPO over diffusion chains, the DPPO-style baseline (docs/algorithms.md §3): B x G
//! independent stochastic rollouts, a state-value critic, GAE over action-chunk steps, and the
//! clipped surrogate over (decision, fine-tuned denoising step) pairs shared with GRPO
//! (`surrogate`). It reads the `[grpo]` table ([`GrpoConfig`]) with its own `[grpo.ppo]`
//! settings.

use std::path::Path;
use std::time::Instant;

use burn::module::{AutodiffModule, Module};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use diffrl_core::config::{Invalid, Validate, ensure};
use diffrl_core::env::Env;
use diffrl_core::episode::Episode;
use diffrl_core::record::Timeline;
use diffrl_core::reward::{EpisodeRewards, RewardModule};
use diffrl_core::seeding::{derive, rng};
use diffrl_core::space::Observation;
use diffrl_core::vec_env::VecEnv;
use diffrl_policy::config::Activation;
use diffrl_policy::nn::Mlp;
use diffrl_policy::{ObsBatch, Policy, seeded_init};
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::LearnError;
use crate::advantages::gae;
use crate::batch::{Batch, Round, collect_round};
use crate::finetune::{Algorithm, GrpoConfig, GrpoHooks, GrpoOutcome};
use crate::rollout::GroupRollout;
use crate::session::Session;
use crate::state;
use crate::surrogate::{UpdateAcc, exceeds_target_kl, policy_epoch, to_vec, update_batch};

/// PPO's critic and return settings (`[grpo.ppo]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PpoConfig {
    /// Discount per action-chunk step.
    pub gamma: f64,
    /// GAE lambda.
    pub lambda: f64,
    /// Critic learning rate.
    pub critic_lr: f64,
    /// Critic hidden width (two hidden layers).
    pub critic_hidden: usize,
    /// What the critic reads ([`CriticInput`]).
    pub critic_input: CriticInput,
    /// Normalise advantages over the batch.
    pub normalize_advantages: bool,
    /// What the critic's returns sum ([`PpoRewards`]).
    pub rewards: PpoRewards,
}

/// What PPO's critic reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CriticInput {
    /// The normalised state window alone: neither the images nor the instruction.
    #[default]
    State,
    /// The policy's condition vector: its encoder's features of the state window, the images
    /// and the instruction, computed by the current policy; the critic's loss does not train
    /// the encoder. For tasks whose state does not tell the goal (an instruction, a camera).
    Condition,
}

/// The rewards PPO's returns are made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PpoRewards {
    /// The episode's outcome (the reward module's, GRPO's R) on its last decision, zero before,
    /// and no bootstrap after it: the objective GRPO optimises, so PPO is its baseline.
    #[default]
    Outcome,
    /// The reward module's per-step rewards summed over each executed chunk (the outcome on
    /// the last decision when it gives none), and the critic's value of the final observation
    /// after an episode cut by the step limit. Where success ends the episode and every step
    /// pays (Push-T's coverage reward), ending early forfeits the reward of the steps left, so
    /// these returns favour lingering just short of success (docs/grpo.md, "PPO's returns").
    Steps,
}

impl Default for PpoConfig {
    fn default() -> Self {
        Self {
            gamma: 0.99,
            lambda: 0.95,
            critic_lr: 1e-3,
            critic_hidden: 256,
            critic_input: CriticInput::State,
            normalize_advantages: true,
            rewards: PpoRewards::Outcome,
        }
    }
}

impl Validate for PpoConfig {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            (0.0..=1.0).contains(&self.gamma),
            "gamma",
            "must be in [0, 1]",
        )?;
        ensure(
            (0.0..=1.0).contains(&self.lambda),
            "lambda",
            "must be in [0, 1]",
        )?;
        ensure(self.critic_lr > 0.0, "critic_lr", "must be > 0")?;
        ensure(self.critic_hidden >= 1, "critic_hidden", "must be >= 1")
    }
}

/// State-value network of PPO: MLP over [`critic_features`].
#[derive(Module, Debug)]
pub struct Critic<B: Backend> {
    net: Mlp<B>,
}

impl<B: Backend> Critic<B> {
    /// A critic for `input` features.
    pub fn new(input: usize, hidden: usize, device: &B::Device) -> Self {
        Self {
            net: Mlp::new(&[input, hidden, hidden, 1], Activation::Mish, device),
        }
    }

    /// V(s) of [B, input] features: [B].
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 1> {
        let b = x.dims()[0];
        self.net.forward(x).reshape([b])
    }
}

/// The critic's input rows for `obs` ([`CriticInput`]): [B, to * ds] normalised states, or
/// [B, cond_dim] condition features of `policy`.
fn critic_features<B: Backend>(
    policy: &Policy<B>,
    input: CriticInput,
    obs: &ObsBatch,
    device: &B::Device,
) -> Result<Tensor<B, 2>, LearnError> {
    let t = policy.obs_tensors(obs, device)?;
    Ok(match input {
        CriticInput::State => {
            let [b, to, ds] = t.state.dims();
            t.state.reshape([b, to * ds])
        }
        CriticInput::Condition => policy.condition(&t),
    })
}

/// The critic's input width for `policy`.
fn critic_width<B: Backend>(policy: &Policy<B>, input: CriticInput) -> usize {
    match input {
        CriticInput::State => policy.config.obs_horizon * policy.spec.state_dim,
        CriticInput::Condition => policy.condition_dim(),
    }
}

/// The observations `decisions` read, as one batch: states, images (for pixel policies) and
/// instructions (tasks with text).
fn decisions_batch<'a>(decisions: impl Iterator<Item = &'a crate::rollout::Decision>) -> ObsBatch {
    let mut obs = ObsBatch::default();
    let mut texts: Option<Vec<String>> = Some(Vec::new());
    for d in decisions {
        obs.batch += 1;
        obs.state.extend_from_slice(&d.state);
        if let Some(img) = &d.image {
            obs.image
                .get_or_insert_with(Vec::new)
                .extend_from_slice(img);
        }
        match (&mut texts, &d.text) {
            (Some(t), Some(x)) => t.push(x.clone()),
            _ => texts = None,
        }
    }
    obs.text = texts.filter(|t| !t.is_empty());
    obs
}

/// Fine-tunes `policy` with PPO (see [`crate::grpo::train`], which hands [`Algorithm::Ppo`]
/// over to this): `venv` holds the `groups * group_size` environments of B x G independent
/// rollouts.
#[allow(clippy::too_many_arguments)]
pub fn train<E: Env, B: AutodiffBackend>(
    policy: Policy<B>,
    reference: &Policy<B::InnerBackend>,
    venv: &mut VecEnv<E>,
    reward: &dyn RewardModule,
    cfg: &GrpoConfig,
    seed: u64,
    out: &Path,
    resume: bool,
    hooks: &mut dyn GrpoHooks<B::InnerBackend>,
) -> Result<GrpoOutcome<B::InnerBackend>, LearnError> {
    if cfg.advantage.positive_only {
        return Err(LearnError::Data(
            "grpo.advantage.positive_only cuts GRPO's group-relative advantages; PPO's come \
             from its critic (use `diffrl grpo`, or drop the setting)"
                .into(),
        ));
    }
    let mut run = Session::new(policy, reference, cfg, Algorithm::Ppo, seed, out)?;
    if cfg.implicit_prm.is_some() {
        return Err(LearnError::Data(
            "grpo.implicit_prm ranks the rollouts of a group by outcome; PPO plays no groups \
             (use `diffrl grpo`)"
                .into(),
        ));
    }
    let mut value = ValueFunction::new(&run);
    if let Some(dir) = run.resume(resume)? {
        value.load(&dir)?;
    }
    while run.iteration < cfg.iterations {
        let it_seed = derive(seed, run.iteration as u64);
        // 1. Collect B x G independent rollouts, scored by the reward module.
        let rec = hooks.recorder();
        rec.set_time(Timeline::TrainStep, run.iteration as i64 + 1);
        let batch = collect_independent(&mut run, venv, reward, rec, it_seed)?;
        // 2. GAE advantages and returns per (rollout, decision) from the critic's values.
        let (advantages, returns) = ppo_advantages(
            &batch.kept,
            &batch.rewards,
            &run.policy.valid(),
            &value.critic.valid(),
            &cfg.ppo,
            &run.device,
        )?;
        batch.record_series(hooks.recorder(), &advantages);
        // 3. Update the actor and the critic.
        let update =
            update_actor_critic(&mut run, &mut value, &batch, &advantages, &returns, it_seed)?;
        // 4. Log, evaluate, checkpoint.
        run.iteration += 1;
        let line = run.log_line(&batch, &update, 0.0, None, 0.0);
        if run.end_iteration(line, hooks, || value.files())? {
            break;
        }
    }
    Ok(run.outcome())
}

/// Each of `epochs` epochs: one pass of clipped-surrogate minibatches over the chain pairs
/// ([`policy_epoch`]), then one pass of critic regression on the returns; stops early once an
/// epoch's approximate KL exceeds `target_kl`.
fn update_actor_critic<B: AutodiffBackend>(
    run: &mut Session<'_, B>,
    value: &mut ValueFunction<B>,
    batch: &Batch,
    advantages: &[Vec<f64>],
    returns: &[Vec<f64>],
    it_seed: u64,
) -> Result<UpdateAcc, LearnError> {
    let t = Instant::now();
    // The actor's pairs may see shifted frames ([grpo] random_shift); the critic the collected.
    let (kept, pairs) = update_batch(run, &batch.kept, advantages, derive(it_seed, 30_000))?;
    let mut acc = UpdateAcc::default();
    let mut order: Vec<usize> = (0..pairs.len()).collect();
    for epoch in 0..run.cfg.epochs {
        let shuffle = derive(it_seed, 10_000 + epoch as u64);
        let kl = policy_epoch(run, &kept, &pairs, &mut order, shuffle, &mut acc)?;
        let shuffle = derive(it_seed, 20_000 + epoch as u64);
        acc.value_loss += value.fit_epoch(&batch.kept, returns, &run.policy, run.cfg, shuffle)?;
        acc.epochs += 1;
        if exceeds_target_kl(run.cfg, kl) {
            break;
        }
    }
    acc.seconds = t.elapsed().as_secs_f64();
    Ok(acc)
}

/// Files of the critic in `train_state/`: its weights and its optimiser.
const CRITIC_FILES: [&str; 2] = ["critic.mpk", "critic_optim.mpk"];

/// PPO's critic and its AdamW state.
struct ValueFunction<B: AutodiffBackend> {
    critic: Critic<B>,
    optim: OptimizerAdaptor<AdamW, Critic<B>, B>,
    device: B::Device,
}

impl<B: AutodiffBackend> ValueFunction<B> {
    /// A critic of the run's policy's observations ([`CriticInput`]), initialised from the
    /// run's seed.
    fn new(run: &Session<'_, B>) -> Self {
        let input = critic_width(&run.policy, run.cfg.ppo.critic_input);
        let device = run.device.clone();
        let critic = seeded_init::<B, _>(&device, derive(run.seed, 0xC817), || {
            Critic::new(input, run.cfg.ppo.critic_hidden, &device)
        });
        Self {
            critic,
            optim: AdamWConfig::new().init::<B, Critic<B>>(),
            device,
        }
    }

    /// Restores the critic and its optimiser from the `train_state/` folder `dir`.
    fn load(&mut self, dir: &Path) -> Result<(), LearnError> {
        let record = state::load(dir, CRITIC_FILES[0], &self.device)?;
        self.critic = self.critic.clone().load_record(record);
        let record = state::load(dir, CRITIC_FILES[1], &self.device)?;
        let optim = std::mem::replace(&mut self.optim, AdamWConfig::new().init());
        self.optim = optim.load_record(record);
        Ok(())
    }

    /// The critic's files for a checkpoint.
    fn files(&self) -> Result<Vec<(&'static str, Vec<u8>)>, LearnError> {
        let critic = self.critic.clone().into_record();
        Ok(vec![
            (
                CRITIC_FILES[0],
                state::bytes::<B, _>(critic, CRITIC_FILES[0])?,
            ),
            (
                CRITIC_FILES[1],
                state::bytes::<B, _>(self.optim.to_record(), CRITIC_FILES[1])?,
            ),
        ])
    }

    /// One epoch of critic regression on the iteration's GAE returns: mean squared error of
    /// V(s) in minibatches of `minibatch / K'` decisions, shuffled with `seed`. Returns the
    /// mean loss.
    fn fit_epoch(
        &mut self,
        kept: &[GroupRollout],
        returns: &[Vec<f64>],
        policy: &Policy<B>,
        cfg: &GrpoConfig,
        seed: u64,
    ) -> Result<f64, LearnError> {
        let (device, mut critic) = (&self.device, self.critic.clone());
        // The features come from the policy without its autodiff graph: the critic's loss
        // trains the critic alone.
        let inner = policy.valid();
        let rows: Vec<(usize, usize, f32)> = returns
            .iter()
            .enumerate()
            .flat_map(|(ri, r)| r.iter().enumerate().map(move |(di, &v)| (ri, di, v as f32)))
            .collect();
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.shuffle(&mut rng(seed));
        let mb = (cfg.minibatch / policy.process().map_or(1, |p| p.ft_steps())).max(1);
        let mut total = 0.0;
        let mut count = 0usize;
        for idx in order.chunks(mb) {
            let obs = decisions_batch(idx.iter().map(|&i| &kept[rows[i].0].decisions[rows[i].1]));
            let x =
                Tensor::from_inner(critic_features(&inner, cfg.ppo.critic_input, &obs, device)?);
            let target = Tensor::<B, 1>::from_data(
                TensorData::new(
                    idx.iter().map(|&i| rows[i].2).collect::<Vec<_>>(),
                    [idx.len()],
                ),
                device,
            );
            let loss = (critic.forward(x) - target).square().mean();
            let v = loss.clone().into_scalar().elem::<f64>();
            if !v.is_finite() {
                continue;
            }
            let grads = GradientsParams::from_grads(loss.backward(), &critic);
            critic = self.optim.step(cfg.ppo.critic_lr, critic, grads);
            total += v * idx.len() as f64;
            count += idx.len();
        }
        self.critic = critic;
        Ok(total / count.max(1) as f64)
    }
}

/// Collects `groups * group_size` independent rollouts (groups of one), each scored by the
/// reward module.
fn collect_independent<E: Env, B: AutodiffBackend>(
    run: &mut Session<'_, B>,
    venv: &mut VecEnv<E>,
    reward: &dyn RewardModule,
    rec: &dyn diffrl_core::record::Recorder,
    it_seed: u64,
) -> Result<Batch, LearnError> {
    let t = Instant::now();
    let n = run.cfg.groups * run.cfg.group_size;
    let Round {
        rollouts,
        rewards,
        stats,
    } = collect_round(run, venv, reward, it_seed, 0, n, 1, rec)?;
    let mut batch = Batch::default();
    batch.add_round(&stats);
    for (i, (member, rewards)) in rollouts.chunks(1).zip(rewards).enumerate() {
        let recorded = stats.recorded_env_step.filter(|_| i == 0);
        batch.add_group(member, rewards, true, recorded);
    }
    batch.collect_s = t.elapsed().as_secs_f64();
    run.env_steps += batch.stats.env_steps;
    run.episodes += batch.outcomes.len();
    Ok(batch)
}

/// A value per (rollout, decision).
type PerDecision = Vec<Vec<f64>>;

/// GAE over action-chunk steps with the critic's values. Rewards per decision ([`PpoRewards`]):
/// the outcome on the last decision and no bootstrap, or the reward module's per-step rewards
/// summed over the executed chunk (the outcome on the last decision when it gives none), where
/// an episode cut by the step limit bootstraps from the critic's value of its final
/// observation (the window of the last `To` observations ending there).
/// Returns (advantages, critic targets = GAE advantages + values before normalisation).
fn ppo_advantages<B: Backend>(
    kept: &[GroupRollout],
    rewards: &[EpisodeRewards],
    policy: &Policy<B>,
    critic: &Critic<B>,
    cfg: &PpoConfig,
    device: &B::Device,
) -> Result<(PerDecision, PerDecision), LearnError> {
    let mut out = Vec::with_capacity(kept.len());
    let mut returns = Vec::with_capacity(kept.len());
    for (r, rw) in kept.iter().zip(rewards) {
        let n = r.decisions.len();
        if n == 0 {
            out.push(Vec::new());
            returns.push(Vec::new());
            continue;
        }
        let per = match (&rw.per_step, cfg.rewards) {
            (Some(s), PpoRewards::Steps) => r.per_decision(s),
            _ => {
                let mut v = vec![0.0; n];
                v[n - 1] = rw.outcome;
                v
            }
        };
        if let Some((t, v)) = per.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(LearnError::Data(format!(
                "non-finite reward {v} at decision {t} of a rollout"
            )));
        }
        let mut obs = decisions_batch(r.decisions.iter());
        // The outcome is the whole episode's: nothing follows its last decision.
        let episodic = r.episode.terminated || cfg.rewards == PpoRewards::Outcome;
        let images = policy.spec.image.is_some();
        let final_window = (!episodic)
            .then(|| final_window(&r.episode, policy.config.obs_horizon, images))
            .flatten();
        if let Some((state, image)) = &final_window {
            obs.batch += 1;
            obs.state.extend_from_slice(state);
            if let (Some(all), Some(img)) = (obs.image.as_mut(), image) {
                all.extend_from_slice(img);
            }
            // The final window reads the instruction of the episode's last decision.
            if let (Some(texts), Some(last)) = (obs.text.as_mut(), r.decisions.last()) {
                texts.extend(last.text.clone());
            }
        }
        let x = critic_features(policy, cfg.critic_input, &obs, device)?;
        let values: Vec<f64> = to_vec(critic.forward(x))?
            .into_iter()
            .map(f64::from)
            .collect();
        let bootstrap = match (episodic, final_window.is_some()) {
            (true, _) => 0.0,
            (false, true) => values[n],
            // No final observation recorded: the last decision's value stands in.
            (false, false) => values[n - 1],
        };
        let (adv, ret) = gae(&per, &values[..n], bootstrap, cfg.gamma, cfg.lambda);
        returns.push(ret);
        out.push(adv);
    }
    if cfg.normalize_advantages {
        let all: Vec<f64> = out.iter().flatten().copied().collect();
        let m = all.iter().sum::<f64>() / all.len().max(1) as f64;
        let s = (all.iter().map(|a| (a - m).powi(2)).sum::<f64>() / all.len().max(1) as f64).sqrt();
        for a in out.iter_mut().flatten() {
            *a = (*a - m) / (s + 1e-8);
        }
    }
    Ok((out, returns))
}

/// The observation window (`horizon` frames, oldest first, the first frame repeated before
/// the start as during rollouts) that ends at `ep`'s final observation: its states and, with
/// `images`, its images; `None` without one (or, with `images`, when a frame has none).
fn final_window(ep: &Episode, horizon: usize, images: bool) -> Option<(Vec<f32>, Option<Vec<u8>>)> {
    let last = ep.final_observation.as_ref()?;
    let mut frames: Vec<&Observation> = ep.observations.iter().chain([last]).collect();
    let first = frames[0];
    while frames.len() < horizon {
        frames.insert(0, first);
    }
    let frames = &frames[frames.len() - horizon..];
    let state = frames
        .iter()
        .flat_map(|o| o.state.iter().copied())
        .collect();
    let image = if images {
        let px: Option<Vec<&[u8]>> = frames
            .iter()
            .map(|o| o.image.as_ref().map(|i| i.data.as_slice()))
            .collect();
        Some(px?.concat())
    } else {
        None
    };
    Some((state, image))
}
