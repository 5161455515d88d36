//! The scored rollouts of one fine-tuning iteration: rounds of group rollouts
//! ([`crate::rollout::collect_groups`]), each rollout scored by the reward module, and the groups
//! the learner keeps.

use burn::tensor::backend::AutodiffBackend;
use diffrl_core::env::Env;
use diffrl_core::episode::Episode;
use diffrl_core::record::Recorder;
use diffrl_core::reward::{EpisodeRewards, RewardModule};
use diffrl_core::seeding::{derive, rng};
use diffrl_core::vec_env::VecEnv;

use crate::LearnError;
use crate::rollout::{
    CollectStats, GroupRollout, collect_groups, fresh_starts, record_rollout_series,
};
use crate::session::Session;

/// What one iteration collected.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// The kept rollouts, `group_size` consecutive ones per group.
    pub kept: Vec<GroupRollout>,
    /// The reward module's rewards of each kept rollout.
    pub rewards: Vec<EpisodeRewards>,
    /// Groups kept.
    pub groups: usize,
    /// Groups dropped (DAPO dynamic sampling).
    pub dropped: usize,
    /// Outcome of every rollout collected, kept or not.
    pub outcomes: Vec<f64>,
    /// Successful rollouts among them.
    pub successes: usize,
    /// Sum over them of the highest score.
    pub max_score_sum: f64,
    /// Where the time of every round went.
    pub stats: CollectStats,
    /// (`env_step` of rollout 0's start, its index in `kept`) when it was recorded and kept.
    pub recorded: Option<(i64, usize)>,
    /// The recorded rollout with its start and rewards when dynamic sampling dropped its group.
    pub recorded_dropped: Option<(i64, GroupRollout, EpisodeRewards)>,
    /// Seconds collecting and scoring.
    pub collect_s: f64,
    /// Sum over the groups collected of [`first_call_spread`], and how many groups had one.
    pub spread: (f64, usize),
}

impl Batch {
    /// Adds a collection round's time and steps.
    pub fn add_round(&mut self, round: &CollectStats) {
        self.stats.env_s += round.env_s;
        self.stats.policy_s += round.policy_s;
        self.stats.env_steps += round.env_steps;
        self.stats.decisions += round.decisions;
    }

    /// Counts one scored group of a round in the statistics; with `keep`, adds it to the batch.
    pub fn add_group(
        &mut self,
        members: &[GroupRollout],
        rewards: Vec<EpisodeRewards>,
        keep: bool,
        recorded_env_step: Option<i64>,
    ) {
        if let Some(spread) = first_call_spread(members) {
            self.spread.0 += spread;
            self.spread.1 += 1;
        }
        self.outcomes.extend(rewards.iter().map(|r| r.outcome));
        self.successes += members.iter().filter(|r| r.episode.success()).count();
        self.max_score_sum += members
            .iter()
            .map(|r| f64::from(r.episode.max_score()))
            .sum::<f64>();
        if !keep {
            self.dropped += 1;
            if let (Some(t), Some(first), Some(rw)) =
                (recorded_env_step, members.first(), rewards.first())
            {
                self.recorded_dropped = Some((t, first.clone(), rw.clone()));
            }
            return;
        }
        if let Some(t) = recorded_env_step {
            self.recorded = Some((t, self.kept.len()));
        }
        self.groups += 1;
        for (mut r, rw) in members.iter().cloned().zip(rewards) {
            r.group = self.groups - 1;
            self.kept.push(r);
            self.rewards.push(rw);
        }
    }

    /// Logs the recorded rollout's per-step series with its `advantages` (per kept rollout,
    /// per decision) ([`record_rollout_series`]). When dynamic sampling dropped its group, the
    /// update gives its decisions no weight, and the series shows advantage 0.
    pub fn record_series(&self, rec: &dyn Recorder, advantages: &[Vec<f64>]) {
        if let Some((t, ri)) = self.recorded {
            record_rollout_series(rec, t, &self.kept[ri], &self.rewards[ri], &advantages[ri]);
        } else if let Some((t, rollout, rewards)) = &self.recorded_dropped {
            let zeros = vec![0.0; rollout.decisions.len()];
            record_rollout_series(rec, *t, rollout, rewards, &zeros);
        }
    }
}

/// How far the policy's sampling noise spreads a group's first actions: the standard deviation
/// across the group's rollouts of their first policy call's clean chunk (the chain's last state
/// x_0, normalised actions), averaged over the chunk's elements. A group's rollouts share their
/// start, so their first calls see the same observation and differ only by the chain's noise.
/// None for fewer than two rollouts with a first call (PPO's groups of one).
pub(crate) fn first_call_spread(members: &[GroupRollout]) -> Option<f64> {
    let x0: Vec<&[f32]> = members
        .iter()
        .filter_map(|m| {
            let d = m.decisions.first()?;
            // x_K..x_0, K + 1 states of equal size, and K log-probs.
            let per = d.chain.len() / (d.logp.len() + 1);
            d.chain.get(d.chain.len() - per..)
        })
        .collect();
    let (n, len) = (x0.len(), x0.first().map_or(0, |x| x.len()));
    if n < 2 || len == 0 || x0.iter().any(|x| x.len() != len) {
        return None;
    }
    let sum: f64 = (0..len)
        .map(|e| {
            let mean = x0.iter().map(|x| f64::from(x[e])).sum::<f64>() / n as f64;
            let ss: f64 = x0.iter().map(|x| (f64::from(x[e]) - mean).powi(2)).sum();
            (ss / (n - 1) as f64).sqrt()
        })
        .sum();
    Some(sum / len as f64)
}

/// One collection round.
pub(crate) struct Round {
    /// `group_size` consecutive rollouts per group.
    pub rollouts: Vec<GroupRollout>,
    /// The rewards of each group's rollouts.
    pub rewards: Vec<Vec<EpisodeRewards>>,
    /// Where its time went.
    pub stats: CollectStats,
}

/// Collection round `round` of the iteration seeded `it_seed`: `groups` groups of `group_size`
/// rollouts of the current policy (the frozen reference running the chain steps before the
/// fine-tuned ones), then each group scored by `reward` (its rewards per rollout, then
/// [`RewardModule::refine_group`]). Rollout 0 is recorded into `rec`. Every outcome must be
/// finite.
#[allow(clippy::too_many_arguments)]
pub(crate) fn collect_round<E: Env, B: AutodiffBackend>(
    run: &Session<'_, B>,
    venv: &mut VecEnv<E>,
    reward: &dyn RewardModule,
    it_seed: u64,
    round: usize,
    groups: usize,
    group_size: usize,
    rec: &dyn Recorder,
) -> Result<Round, LearnError> {
    let starts = match run.cfg.start_pool {
        0 => fresh_starts(derive(it_seed, 100 + round as u64), groups, group_size),
        pool => pool_starts(run, round, groups, pool),
    };
    let (rollouts, stats) = collect_groups(
        venv,
        &run.policy.valid(),
        Some(run.reference.base_or_model()),
        groups,
        group_size,
        &starts,
        &mut rng(derive(it_seed, 1 + round as u64)),
        &run.device,
        rec,
    )?;
    let scored = rollouts
        .chunks(group_size)
        .enumerate()
        .map(|(g, members)| score_group(reward, members, g, run.iteration))
        .collect::<Result<_, _>>()?;
    Ok(Round {
        rollouts,
        rewards: scored,
        stats,
    })
}

/// `[grpo] start_pool`: the run's fixed pool of `pool` initial states (seed streams derived
/// from the run's seed alone), walked in order and wrapping: collection round `round` of
/// iteration i takes the next `groups` members after those of the rounds before it (every
/// iteration counted with its maximum number of rounds), so a pool of `groups` gives every
/// iteration the same starts.
fn pool_starts<B: AutodiffBackend>(
    run: &Session<'_, B>,
    round: usize,
    groups: usize,
    pool: usize,
) -> Vec<u64> {
    let root = derive(run.seed, START_POOL_STREAM);
    let first = (run.iteration * run.cfg.collection_rounds() + round) * groups;
    (first..first + groups)
        .map(|k| derive(root, (k % pool) as u64))
        .collect()
}

/// The seed stream of `[grpo] start_pool` under the run's seed (distinct from the iterations'
/// `derive(seed, iteration)`).
const START_POOL_STREAM: u64 = 0x5354_4152_5450_4f4f;

/// The reward module's rewards of one group's rollouts.
fn score_group(
    reward: &dyn RewardModule,
    members: &[GroupRollout],
    g: usize,
    iteration: usize,
) -> Result<Vec<EpisodeRewards>, LearnError> {
    let mut rewards = members
        .iter()
        .enumerate()
        .map(|(j, r)| {
            reward.rewards(&r.episode).map_err(|e| {
                LearnError::Data(format!(
                    "reward module '{}' failed on rollout {j} of group {g} at iteration \
                     {iteration}: {e}",
                    reward.name()
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let episodes: Vec<&Episode> = members.iter().map(|r| &r.episode).collect();
    reward.refine_group(&episodes, &mut rewards).map_err(|e| {
        LearnError::Data(format!(
            "reward module '{}' failed on group {g} at iteration {iteration}: {e}",
            reward.name()
        ))
    })?;
    for (j, r) in rewards.iter().enumerate() {
        if !r.outcome.is_finite() {
            return Err(LearnError::Data(format!(
                "reward module '{}' gave a non-finite outcome ({}) for rollout {j} of group {g} \
                 at iteration {iteration}",
                reward.name(),
                r.outcome
            )));
        }
    }
    Ok(rewards)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(chain: Vec<f32>, k: usize) -> GroupRollout {
        GroupRollout {
            group: 0,
            episode: Episode::default(),
            decisions: vec![crate::rollout::Decision {
                state: vec![],
                image: None,
                text: None,
                chain,
                logp: vec![0.0; k],
                env_step: 0,
                executed: 1,
            }],
        }
    }

    #[test]
    fn the_spread_reads_the_clean_chunk_of_each_first_call() {
        // K = 2, chunks of two elements: x_2, x_1, x_0. Only x_0 counts: the earlier states
        // differ wildly and must not enter.
        let a = member(vec![9.0, -9.0, 5.0, 5.0, 1.0, 0.0], 2);
        let b = member(vec![-9.0, 9.0, -5.0, 2.0, 3.0, 0.0], 2);
        // Element 0: 1 and 3, sample std sqrt(2); element 1: 0 and 0.
        let s = first_call_spread(&[a.clone(), b]).unwrap();
        assert!((s - 2f64.sqrt() / 2.0).abs() < 1e-12, "{s}");
        // Identical first calls: no spread; one rollout or none: undefined.
        assert_eq!(first_call_spread(&[a.clone(), a.clone()]), Some(0.0));
        assert_eq!(first_call_spread(std::slice::from_ref(&a)), None);
        let mut empty = a.clone();
        empty.decisions.clear();
        assert_eq!(first_call_spread(&[a, empty]), None);
    }
}
