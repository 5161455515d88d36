//! Group-relative advantage estimators (docs/algorithms.md §3): GRPO, Dr.GRPO, the variance-gated
//! VG-GRPO, per-step process advantages and GiGPO, for ONE group of G rollouts that share an
//! initial state and an instruction.
//!
//! Every function here is pure: rewards in, advantages out. [`group_advantages`] checks the
//! inputs (lengths, NaN / infinite rewards) and dispatches on [`Estimator`]; the individual
//! estimators are exported so tests and diagnostics can call them directly.

use std::fmt;

use diffrl_core::config::{Invalid, Validate};
use serde::{Deserialize, Serialize};

/// Added to every standard deviation we divide by (GRPO's epsilon).
const STD_EPS: f64 = 1e-6;

/// Below this population standard deviation a set of rewards counts as constant: a group with
/// constant outcomes has zero variance and its outcome advantages are exactly 0.
const ZERO_VARIANCE_STD: f64 = 1e-12;

/// Which advantage estimator turns a group's rewards into per-step advantages.
///
/// Serialised in kebab-case, e.g. `estimator = "vg-grpo"` in TOML.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Estimator {
    /// GRPO: A_i = (R_i - mean R) / (std R + 1e-6) for every step of rollout i.
    #[default]
    Grpo,
    /// Dr.GRPO: A_i = R_i - mean R (no division by the std).
    DrGrpo,
    /// VG-GRPO: the GRPO advantage times the variance gate g(std R) (see [`variance_gate`]).
    VgGrpo,
    /// Process advantages from per-step rewards: reward-to-go of the group-normalised step
    /// rewards (see [`process_advantages`]).
    Process,
    /// GiGPO: A_{i,t} = A^E_i + omega * A^S_{i,t}, episode GRPO advantage plus an anchor-state
    /// step advantage (see [`gigpo_step_advantages`]).
    Gigpo,
    /// Outcome plus process: A_{i,t} = A^GRPO_i + A^P_{i,t}, the GRPO advantage of the episode
    /// plus the process advantage of its step rewards (OPRL's combination of episode- and
    /// step-level advantages; the step rewards may come from the implicit PRM).
    GrpoProcess,
    /// GRPO-lambda: the group's mean outcome as the value of the shared start, a progress
    /// model's change since the start for the value of later states, and lambda-returns over
    /// decisions (see [`grpo_lambda`]); computed over the whole batch.
    GrpoLambda,
}

impl Estimator {
    /// The name used in configs (`"grpo"`, `"dr-grpo"`, `"vg-grpo"`, `"process"`, `"gigpo"`,
    /// `"grpo-process"`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Grpo => "grpo",
            Self::DrGrpo => "dr-grpo",
            Self::VgGrpo => "vg-grpo",
            Self::Process => "process",
            Self::Gigpo => "gigpo",
            Self::GrpoProcess => "grpo-process",
            Self::GrpoLambda => "grpo-lambda",
        }
    }
}

impl fmt::Display for Estimator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How advantages are estimated from a group's rewards.
///
/// - `estimator`: which estimator (default `grpo`).
/// - `vg_tau`: variance-gate scale tau (> 0, default 0.1); used by `vg-grpo`.
/// - `vg_hard`: use the hard gate 1[std > tau] instead of the soft std^2 / (std^2 + tau^2)
///   (default false).
/// - `gigpo_omega`: weight omega (>= 0) of the step advantage A^S in GiGPO (default 1.0).
/// - `gigpo_gamma`: discount gamma in (0, 1] of the step returns in GiGPO (default 0.95).
/// - `gigpo_grid`: cell size (> 0, in state units) of the grid that quantises states into
///   GiGPO anchors, the same in every dimension. Absent (the default): each dimension's cell is
///   the environment's (`Env::anchor_cells`; Push-T: 5 in every dimension). Set, it overrides
///   the environment's cells; an environment without cells needs it (see [`anchor_cells`]).
/// - `gigpo_normalise`: divide A^S by the anchor cluster's std (+ 1e-6) (default false).
/// - `gamma`, `lambda`: discount in (0, 1] and lambda in [0, 1] per decision of `grpo-lambda`
///   (defaults 0.99 and 0.95, PPO's).
/// - `value`: how `grpo-lambda`'s value moves from its group's start value along a rollout
///   ([`LambdaValue`], default `linear`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdvantageConfig {
    /// Which estimator.
    pub estimator: Estimator,
    /// Variance-gate scale tau (> 0).
    pub vg_tau: f64,
    /// Hard variance gate 1[std > tau] instead of the soft std^2 / (std^2 + tau^2).
    pub vg_hard: bool,
    /// Weight omega (>= 0) of GiGPO's step advantage.
    pub gigpo_omega: f64,
    /// Discount gamma in (0, 1] of GiGPO's step returns.
    pub gigpo_gamma: f64,
    /// Anchor quantisation cell size (> 0, in state units) for every dimension; None = the
    /// environment's cells.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gigpo_grid: Option<f64>,
    /// Divide GiGPO's step advantage by the anchor cluster's std (+ 1e-6).
    pub gigpo_normalise: bool,
    /// Discount per decision of `grpo-lambda`, in (0, 1]. Serialised only when not the
    /// default, so fingerprints of runs from before it existed stay the same.
    #[serde(skip_serializing_if = "is_default_gamma")]
    pub gamma: f64,
    /// Lambda of `grpo-lambda`'s returns, in [0, 1] (serialised only when not the default).
    #[serde(skip_serializing_if = "is_default_lambda")]
    pub lambda: f64,
    /// The value model of `grpo-lambda` (serialised only when not the default).
    #[serde(skip_serializing_if = "is_default_value")]
    pub value: LambdaValue,
    /// Keep only the positive part of every advantage, max(A, 0): the update raises the
    /// likelihood of the rollouts that did better than their group (or than grpo-lambda's
    /// value) and no longer pushes away from those that did worse. Off by default (both signs,
    /// GRPO's); serialised only when on.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub positive_only: bool,
}

/// How `grpo-lambda`'s value of a decision's state differs from its group's start value: a
/// function of the progress model's Phi fitted by least squares over the batch (see
/// [`grpo_lambda`]).
///
/// Serialised in kebab-case: `value = "piecewise"` in TOML.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LambdaValue {
    /// V = V_g + b (Phi - Phi_start): one slope.
    #[default]
    Linear,
    /// V = V_g + f(Phi) - f(Phi_start) + c j / J: f piecewise linear over
    /// [`VALUE_PIECES`] equal pieces of the batch's range of Phi, and a term in the decision's
    /// index j (J: the batch's longest rollout), because a discounted outcome grows along a
    /// rollout that runs to the time limit.
    Piecewise,
}

/// Pieces of the piecewise-linear value of [`LambdaValue::Piecewise`].
pub const VALUE_PIECES: usize = 8;

fn is_default_value(v: &LambdaValue) -> bool {
    *v == LambdaValue::default()
}

fn is_default_gamma(g: &f64) -> bool {
    *g == AdvantageConfig::default().gamma
}

fn is_default_lambda(l: &f64) -> bool {
    *l == AdvantageConfig::default().lambda
}

impl Default for AdvantageConfig {
    fn default() -> Self {
        Self {
            estimator: Estimator::Grpo,
            vg_tau: 0.1,
            vg_hard: false,
            gigpo_omega: 1.0,
            gigpo_gamma: 0.95,
            gigpo_grid: None,
            gigpo_normalise: false,
            gamma: 0.99,
            lambda: 0.95,
            value: LambdaValue::Linear,
            positive_only: false,
        }
    }
}

/// The ranges: `vg_tau` > 0, `gigpo_omega` >= 0, `gigpo_gamma` and `gamma` in (0, 1], `lambda`
/// in [0, 1], `gigpo_grid` > 0 when set, all finite.
impl Validate for AdvantageConfig {
    fn validate(&self) -> Result<(), Invalid> {
        let bad = Invalid::new;
        if !(self.vg_tau.is_finite() && self.vg_tau > 0.0) {
            return Err(bad(
                "vg_tau",
                format!("must be finite and > 0, got {}", self.vg_tau),
            ));
        }
        if !(self.gigpo_omega.is_finite() && self.gigpo_omega >= 0.0) {
            return Err(bad(
                "gigpo_omega",
                format!("must be finite and >= 0, got {}", self.gigpo_omega),
            ));
        }
        if !(self.gigpo_gamma > 0.0 && self.gigpo_gamma <= 1.0) {
            return Err(bad(
                "gigpo_gamma",
                format!("must be in (0, 1], got {}", self.gigpo_gamma),
            ));
        }
        if !(self.gamma > 0.0 && self.gamma <= 1.0) {
            return Err(bad(
                "gamma",
                format!("must be in (0, 1], got {}", self.gamma),
            ));
        }
        if !(0.0..=1.0).contains(&self.lambda) {
            return Err(bad(
                "lambda",
                format!("must be in [0, 1], got {}", self.lambda),
            ));
        }
        if let Some(grid) = self.gigpo_grid
            && !(grid.is_finite() && grid > 0.0)
        {
            return Err(bad(
                "gigpo_grid",
                format!("must be finite and > 0, got {grid}"),
            ));
        }
        Ok(())
    }
}

/// Why a group's advantages could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum AdvantageError {
    /// A reward or anchor state is NaN or infinite.
    #[error(
        "{what} of rollout {rollout}{} is {value}",
        .step.map(|s| format!(" at step {s}")).unwrap_or_default()
    )]
    NonFinite {
        /// Which quantity (`"outcome reward"`, `"step reward"`, `"anchor state"`).
        what: &'static str,
        /// Index of the rollout in the group.
        rollout: usize,
        /// Index of the env step, for per-step quantities.
        step: Option<usize>,
        /// The offending value.
        value: f64,
    },
    /// The estimator needs an input the group does not have.
    #[error("the {estimator} estimator needs {needs}")]
    Missing {
        /// The estimator asking.
        estimator: Estimator,
        /// What it needs (`"per-step rewards"`, `"anchor states"`).
        needs: &'static str,
    },
    /// A per-rollout input has a different number of rollouts than the outcomes.
    #[error("{what} has {got} rollouts, the group has {expected}")]
    Count {
        /// Which input (`"lengths"`, `"step rewards"`, `"anchor states"`).
        what: &'static str,
        /// Number of rollouts in the group (outcomes).
        expected: usize,
        /// Number given.
        got: usize,
    },
    /// A rollout's per-step input has the wrong number of env steps.
    #[error("rollout {rollout}: {what} has {got} steps, expected {expected}")]
    Length {
        /// Which input (`"step rewards"`, `"anchor states"`).
        what: &'static str,
        /// Index of the rollout in the group.
        rollout: usize,
        /// Number of env steps of the rollout (`lengths[rollout]`).
        expected: usize,
        /// Number given.
        got: usize,
    },
    /// A configuration field is out of range (named relative to [`AdvantageConfig`]).
    #[error("advantage config: {0}")]
    Config(#[from] Invalid),
    /// The group has no rollouts.
    #[error("a group needs at least one rollout")]
    EmptyGroup,
    /// GiGPO's anchor cells do not fit the states, or are not sizes.
    #[error("anchor cells: {0}")]
    AnchorCells(String),
}

/// The rewards of one group of G rollouts.
#[derive(Debug, Clone, Copy)]
pub struct GroupRewards<'a> {
    /// Outcome reward R_i of each rollout (length G).
    pub outcomes: &'a [f64],
    /// Step rewards r_{i,t}: per rollout, per env step (rollouts may differ in length).
    pub steps: Option<&'a [Vec<f64>]>,
    /// GiGPO anchors: per rollout, per env step, the state observed at that step; same lengths
    /// as `steps`.
    pub anchors: Option<&'a [Vec<Vec<f32>>]>,
    /// GiGPO's grid: the cell size of each state dimension ([`anchor_cells`]).
    pub anchor_cells: Option<&'a [f64]>,
}

/// Advantages of one group.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupAdvantages {
    /// A_{i,t}: per rollout, per env step (rollout i has `lengths[i]` entries).
    pub per_step: Vec<Vec<f64>>,
    /// The outcomes of the group are all equal (population std < 1e-12).
    pub zero_variance: bool,
    /// Mean of the outcomes.
    pub mean: f64,
    /// Population standard deviation (ddof = 0) of the outcomes.
    pub std: f64,
}

/// Mean and population standard deviation (ddof = 0) of `values`; (0, 0) when empty.
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// GRPO advantages (Shao et al. 2024, DeepSeekMath):
/// A_i = (R_i - mean R) / (std R + 1e-6), population std.
///
/// Constant outcomes (std < 1e-12, which includes G = 1) give exactly 0 for every rollout, so
/// rounding in the mean cannot leak through the division.
pub fn grpo(outcomes: &[f64]) -> Vec<f64> {
    let (mean, std) = mean_std(outcomes);
    if std < ZERO_VARIANCE_STD {
        return vec![0.0; outcomes.len()];
    }
    outcomes
        .iter()
        .map(|r| (r - mean) / (std + STD_EPS))
        .collect()
}

/// Dr.GRPO advantages (Liu et al. 2025, "Understanding R1-Zero-like training"):
/// A_i = R_i - mean R. Constant outcomes give exactly 0.
pub fn dr_grpo(outcomes: &[f64]) -> Vec<f64> {
    let (mean, std) = mean_std(outcomes);
    if std < ZERO_VARIANCE_STD {
        return vec![0.0; outcomes.len()];
    }
    outcomes.iter().map(|r| r - mean).collect()
}

/// Variance gate of VG-GRPO (our choice of formula, docs/algorithms.md §3):
/// soft g = std^2 / (std^2 + tau^2), hard g = 1[std > tau]. VG-GRPO's advantage is
/// g * [`grpo`], so low-variance groups, whose normalised advantages are mostly noise, are
/// damped.
pub fn variance_gate(std: f64, tau: f64, hard: bool) -> f64 {
    if hard {
        if std > tau { 1.0 } else { 0.0 }
    } else {
        let var = std * std;
        var / (var + tau * tau)
    }
}

/// Process advantages from step rewards: normalise ALL step rewards of the group together,
/// r~ = (r - mean) / (std + 1e-6) (population std), then take the reward-to-go
/// A_{i,t} = sum_{t' >= t} r~_{i,t'}.
///
/// Empty rollouts give empty vectors; constant step rewards (std < 1e-12) give 0 everywhere.
pub fn process_advantages(step_rewards: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let all: Vec<f64> = step_rewards.iter().flatten().copied().collect();
    let (mean, std) = mean_std(&all);
    if std < ZERO_VARIANCE_STD {
        return step_rewards.iter().map(|r| vec![0.0; r.len()]).collect();
    }
    step_rewards
        .iter()
        .map(|rewards| {
            let mut to_go = vec![0.0; rewards.len()];
            let mut acc = 0.0;
            for (t, r) in rewards.iter().enumerate().rev() {
                acc += (r - mean) / (std + STD_EPS);
                to_go[t] = acc;
            }
            to_go
        })
        .collect()
}

/// Discounted returns R_t = sum_k gamma^k r_{t+k}, computed backwards as
/// R_t = r_t + gamma * R_{t+1}.
pub fn discounted_returns(r: &[f64], gamma: f64) -> Vec<f64> {
    let mut returns = vec![0.0; r.len()];
    let mut acc = 0.0;
    for (t, reward) in r.iter().enumerate().rev() {
        acc = reward + gamma * acc;
        returns[t] = acc;
    }
    returns
}

/// Generalised advantage estimation over one episode of n steps (Schulman et al. 2016,
/// *High-Dimensional Continuous Control Using Generalized Advantage Estimation*;
/// docs/algorithms.md §3):
///
/// ```text
/// delta_t = r_t + gamma V(s_{t+1}) - V(s_t),   V(s_n) = bootstrap
/// A_t     = sum_l (gamma lambda)^l delta_{t+l} = delta_t + gamma lambda A_{t+1}
/// R_t     = A_t + V(s_t)                        (the critic's regression target)
/// ```
///
/// `bootstrap` is 0 for an episode that terminated and the critic's value of the final
/// observation for one cut by the step limit. `values` holds V(s_0..s_{n-1}) (entries past n
/// are ignored). Returns (A, R).
pub fn gae(
    rewards: &[f64],
    values: &[f64],
    bootstrap: f64,
    gamma: f64,
    lambda: f64,
) -> (Vec<f64>, Vec<f64>) {
    let n = rewards.len();
    let mut adv = vec![0.0; n];
    let mut next_adv = 0.0;
    for t in (0..n).rev() {
        let next_v = if t + 1 < n { values[t + 1] } else { bootstrap };
        let delta = rewards[t] + gamma * next_v - values[t];
        next_adv = delta + gamma * lambda * next_adv;
        adv[t] = next_adv;
    }
    let returns = adv.iter().zip(values).map(|(a, v)| a + v).collect();
    (adv, returns)
}

/// The cell size of every state dimension on GiGPO's anchor grid (our choice,
/// docs/algorithms.md §3): `gigpo_grid` in all `state_dim` dimensions when it is set (an
/// override), else the environment's `env_cells` (`Env::anchor_cells`). An error when neither
/// is there, or when the environment's cells do not fit the state or are not all finite and
/// > 0.
pub fn anchor_cells(
    cfg: &AdvantageConfig,
    env_cells: Option<&[f32]>,
    state_dim: usize,
) -> Result<Vec<f64>, AdvantageError> {
    let cells: Vec<f64> = match (cfg.gigpo_grid, env_cells) {
        (Some(grid), _) => vec![grid; state_dim],
        (None, Some(cells)) => cells.iter().map(|&c| f64::from(c)).collect(),
        (None, None) => {
            return Err(AdvantageError::AnchorCells(
                "the environment gives none; set [grpo.advantage] gigpo_grid".into(),
            ));
        }
    };
    if cells.len() != state_dim {
        return Err(AdvantageError::AnchorCells(format!(
            "the environment gives {} for a {state_dim}-d state",
            cells.len()
        )));
    }
    if let Some(c) = cells.iter().find(|c| !(c.is_finite() && **c > 0.0)) {
        return Err(AdvantageError::AnchorCells(format!(
            "must be finite and > 0, the environment gives {c}"
        )));
    }
    Ok(cells)
}

/// GiGPO anchor key of a continuous state (our choice, docs/algorithms.md §3): component d is
/// quantised to its grid cell `(x_d / cells[d]).floor() as i64`, and the cell (its dimension,
/// then its integer coordinates as little-endian bytes) is hashed with 64-bit FNV-1a.
///
/// FNV-1a is written out rather than taken from `std`'s `DefaultHasher` so that keys are the
/// same on every platform, run and Rust version. States in the same cell get the same key;
/// different cells collide only by a 64-bit hash collision.
///
/// # Panics
/// When `cells` and `state` have different lengths.
pub fn anchor_key(state: &[f32], cells: &[f64]) -> u64 {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = FNV_OFFSET;
    let mut eat = |bytes: [u8; 8]| {
        for b in bytes {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(FNV_PRIME);
        }
    };
    assert_eq!(
        state.len(),
        cells.len(),
        "one cell size per state dimension"
    );
    eat((state.len() as u64).to_le_bytes());
    for (&x, &size) in state.iter().zip(cells) {
        let cell = (f64::from(x) / size).floor() as i64;
        eat(cell.to_le_bytes());
    }
    hash
}

/// GiGPO step advantages (Feng et al. 2025, "Group-in-Group Policy Optimization"):
/// R_{i,t} = sum_k gamma^k r_{i,t+k}; all steps (i, t) of the group are clustered by the
/// [`anchor_key`] of their anchor state on the grid of `cells`; A^S_{i,t} = R_{i,t} - mean
/// over the cluster, divided by (cluster std + 1e-6) when `normalise`. Singleton clusters get 0.
///
/// # Panics
/// When `anchors` does not have the shape of `step_rewards`, or a state not the length of
/// `cells` ([`group_advantages`] checks both and returns an error instead).
pub fn gigpo_step_advantages(
    step_rewards: &[Vec<f64>],
    anchors: &[Vec<Vec<f32>>],
    gamma: f64,
    cells: &[f64],
    normalise: bool,
) -> Vec<Vec<f64>> {
    assert_eq!(
        step_rewards.len(),
        anchors.len(),
        "one anchor sequence per rollout"
    );
    let returns: Vec<Vec<f64>> = step_rewards
        .iter()
        .map(|r| discounted_returns(r, gamma))
        .collect();
    // Clusters are keyed by anchor and listed in first-visit order so the result does not
    // depend on HashMap iteration order.
    let mut cluster_of: std::collections::HashMap<u64, usize> = Default::default();
    let mut members: Vec<Vec<(usize, usize)>> = Vec::new();
    for (i, (rollout_returns, states)) in returns.iter().zip(anchors).enumerate() {
        assert_eq!(
            rollout_returns.len(),
            states.len(),
            "rollout {i}: one anchor state per step reward"
        );
        for (t, state) in states.iter().enumerate() {
            let next = members.len();
            let c = *cluster_of.entry(anchor_key(state, cells)).or_insert(next);
            if c == next {
                members.push(Vec::new());
            }
            members[c].push((i, t));
        }
    }
    let mut advantages: Vec<Vec<f64>> = returns.iter().map(|r| vec![0.0; r.len()]).collect();
    for cluster in members.iter().filter(|m| m.len() > 1) {
        let values: Vec<f64> = cluster.iter().map(|&(i, t)| returns[i][t]).collect();
        let (mean, std) = mean_std(&values);
        for (&(i, t), value) in cluster.iter().zip(&values) {
            let centred = value - mean;
            advantages[i][t] = if normalise {
                centred / (std + STD_EPS)
            } else {
                centred
            };
        }
    }
    advantages
}

/// DAPO dynamic sampling (Yu et al. 2025): keep the group only when its outcomes are not all
/// equal (a constant group has zero advantage and teaches nothing).
pub fn dapo_keep(outcomes: &[f64]) -> bool {
    outcomes.iter().any(|&r| r != outcomes[0])
}

/// Dynamic sampling by success (`[grpo] dynamic_sampling_by = "success"`): keep a group iff
/// some of its rollouts succeeded and some failed.
pub fn mixed_success(successes: &[bool]) -> bool {
    successes.iter().any(|&s| s) && successes.iter().any(|&s| !s)
}

/// Dynamic sampling by failure (`[grpo] dynamic_sampling_by = "failure"`, with [`dapo_keep`]
/// on the outcomes): a group that all succeeded is dropped, one that all failed is not.
pub fn some_failure(successes: &[bool]) -> bool {
    successes.iter().any(|&s| !s)
}

fn check_finite(
    what: &'static str,
    rollout: usize,
    step: Option<usize>,
    value: f64,
) -> Result<(), AdvantageError> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(AdvantageError::NonFinite {
            what,
            rollout,
            step,
            value,
        })
    }
}

fn check_shape<T>(
    what: &'static str,
    per_rollout: &[Vec<T>],
    lengths: &[usize],
) -> Result<(), AdvantageError> {
    if per_rollout.len() != lengths.len() {
        return Err(AdvantageError::Count {
            what,
            expected: lengths.len(),
            got: per_rollout.len(),
        });
    }
    for (rollout, (seq, &expected)) in per_rollout.iter().zip(lengths).enumerate() {
        if seq.len() != expected {
            return Err(AdvantageError::Length {
                what,
                rollout,
                expected,
                got: seq.len(),
            });
        }
    }
    Ok(())
}

/// One rollout for [`grpo_lambda`].
#[derive(Debug, Clone, Copy)]
pub struct LambdaRollout<'a> {
    /// Index of its group (rollouts of a group share the initial state).
    pub group: usize,
    /// Its outcome R.
    pub outcome: f64,
    /// Phi of the state each decision was taken in, in order (one entry per decision).
    pub potential: &'a [f64],
}

/// What [`grpo_lambda`] computed.
#[derive(Debug, Clone, PartialEq)]
pub struct LambdaAdvantages {
    /// A_{i,j} per rollout, per decision, normalised over the batch.
    pub per_decision: Vec<Vec<f64>>,
    /// The value's slope in Phi: b of [`LambdaValue::Linear`]; for
    /// [`LambdaValue::Piecewise`], (f(max Phi) - f(min Phi)) / (max Phi - min Phi) over the
    /// batch. 0 when Phi does not vary.
    pub slope: f64,
    /// Fraction of the variance of the returns (about their group's start value) that the
    /// fitted value explains; 0 when the returns do not vary.
    pub explained: f64,
    /// Groups whose outcomes are all equal (population std < 1e-12).
    pub zero_variance_groups: usize,
}

/// GRPO-lambda (our construction, docs/algorithms.md §3), over a batch of groups.
///
/// GRPO's baseline is a value of the shared initial state only, so every decision of an
/// episode gets the same credit. Here the group still gives the value of its start, and a
/// progress model Phi says how the value changes along each rollout; lambda-returns then
/// credit each decision mostly with what happened in the next 1 / (1 - gamma lambda)
/// decisions, as GAE does with a learned critic:
///
/// ```text
/// G_{i,j}  = gamma^(n_i - 1 - j) R_i                 (the outcome, discounted to decision j)
/// V_g      = mean over i in g of G_{i,0}               (the group's start value)
/// x_{i,j}  = phi(Phi_{i,j}, j) - phi(Phi_{i,0}, 0)     (features, 0 at the start)
/// w        = argmin sum (G - V_g - w.x)^2              (least squares over the whole batch)
/// V_{i,j}  = V_g + w.x_{i,j},  V_{i,n_i} = 0
/// delta_j  = [j = n_i - 1] R_i + gamma V_{i,j+1} - V_{i,j}
/// A_{i,j}  = sum_k (gamma lambda)^k delta_{j+k}        (then (A - mean) / (std + 1e-8) over the batch)
/// ```
///
/// `value` picks phi: [`LambdaValue::Linear`] phi = Phi (w is one slope b);
/// [`LambdaValue::Piecewise`] the hat functions of a piecewise-linear f on [`VALUE_PIECES`]
/// equal pieces of the batch's range of Phi, and j / J. With lambda = 1 and gamma = 1 the first
/// decision's advantage is Dr.GRPO's R_i - mean R (before the normalisation), whatever Phi.
/// Features that do not vary get weight 0. Errors on a NaN or infinite outcome or potential.
pub fn grpo_lambda(
    rollouts: &[LambdaRollout<'_>],
    gamma: f64,
    lambda: f64,
    value: LambdaValue,
) -> Result<LambdaAdvantages, AdvantageError> {
    for (i, r) in rollouts.iter().enumerate() {
        check_finite("outcome reward", i, None, r.outcome)?;
        for (t, &p) in r.potential.iter().enumerate() {
            check_finite("potential", i, Some(t), p)?;
        }
    }
    let returns: Vec<Vec<f64>> = rollouts
        .iter()
        .map(|r| {
            let n = r.potential.len();
            (0..n)
                .map(|j| gamma.powi((n - 1 - j) as i32) * r.outcome)
                .collect()
        })
        .collect();
    // The start value of each group: the mean discounted return of its first decisions.
    let groups = rollouts.iter().map(|r| r.group + 1).max().unwrap_or(0);
    let mut sum = vec![0.0; groups];
    let mut count = vec![0usize; groups];
    for (r, g) in rollouts.iter().zip(&returns) {
        if let Some(&first) = g.first() {
            sum[r.group] += first;
            count[r.group] += 1;
        }
    }
    let start: Vec<f64> = sum
        .iter()
        .zip(&count)
        .map(|(s, &c)| if c > 0 { s / c as f64 } else { 0.0 })
        .collect();
    let mut outcomes: Vec<Vec<f64>> = vec![Vec::new(); groups];
    for r in rollouts {
        outcomes[r.group].push(r.outcome);
    }
    let zero_variance_groups = outcomes
        .iter()
        .filter(|o| !o.is_empty() && mean_std(o).1 < ZERO_VARIANCE_STD)
        .count();

    let features = ValueFeatures::new(rollouts, value);
    let m = features.len();
    let mut xtx = nalgebra::DMatrix::<f64>::zeros(m, m);
    let mut xty = nalgebra::DVector::<f64>::zeros(m);
    let mut syy = 0.0;
    let mut x = vec![0.0; m];
    for (r, g) in rollouts.iter().zip(&returns) {
        let Some(&phi0) = r.potential.first() else {
            continue;
        };
        for (j, (&phi, &ret)) in r.potential.iter().zip(g).enumerate() {
            features.fill(phi0, phi, j, &mut x);
            let y = ret - start[r.group];
            for a in 0..m {
                xty[a] += x[a] * y;
                for b in 0..m {
                    xtx[(a, b)] += x[a] * x[b];
                }
            }
            syy += y * y;
        }
    }
    let weights = least_squares(xtx, &xty);
    let explained = if syy > ZERO_VARIANCE_STD {
        weights.dot(&xty) / syy
    } else {
        0.0
    };
    let mut per_decision: Vec<Vec<f64>> = rollouts
        .iter()
        .map(|r| {
            let n = r.potential.len();
            let Some(&phi0) = r.potential.first() else {
                return Vec::new();
            };
            let mut x = vec![0.0; m];
            let values: Vec<f64> = r
                .potential
                .iter()
                .enumerate()
                .map(|(j, &phi)| {
                    features.fill(phi0, phi, j, &mut x);
                    start[r.group]
                        + x.iter()
                            .zip(weights.iter())
                            .map(|(a, w)| a * w)
                            .sum::<f64>()
                })
                .collect();
            let mut rewards = vec![0.0; n];
            rewards[n - 1] = r.outcome;
            gae(&rewards, &values, 0.0, gamma, lambda).0
        })
        .collect();
    let (mean, std) = mean_std(&per_decision.concat());
    for a in per_decision.iter_mut().flatten() {
        *a = (*a - mean) / (std + 1e-8);
    }
    Ok(LambdaAdvantages {
        per_decision,
        slope: features.slope(weights.as_slice()),
        explained,
        zero_variance_groups,
    })
}

/// The features x_{i,j} of [`grpo_lambda`]'s value.
enum ValueFeatures {
    /// x = Phi - Phi_start.
    Linear,
    /// Hat functions on the knots lo + k (hi - lo) / P, k = 1..=P (the one at lo is left out:
    /// f is defined up to a constant), then j / J.
    Piecewise { lo: f64, width: f64, longest: f64 },
}

impl ValueFeatures {
    fn new(rollouts: &[LambdaRollout<'_>], value: LambdaValue) -> Self {
        match value {
            LambdaValue::Linear => Self::Linear,
            LambdaValue::Piecewise => {
                let all = rollouts.iter().flat_map(|r| r.potential.iter().copied());
                let lo = all.clone().fold(f64::INFINITY, f64::min);
                let hi = all.fold(f64::NEG_INFINITY, f64::max);
                let longest = rollouts
                    .iter()
                    .map(|r| r.potential.len())
                    .max()
                    .unwrap_or(1);
                Self::Piecewise {
                    lo: if lo.is_finite() { lo } else { 0.0 },
                    // A batch without spread in Phi gets Phi features that are all 0.
                    width: if hi > lo {
                        (hi - lo) / VALUE_PIECES as f64
                    } else {
                        0.0
                    },
                    longest: longest.max(1) as f64,
                }
            }
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::Linear => 1,
            Self::Piecewise { .. } => VALUE_PIECES + 1,
        }
    }

    /// phi(Phi, j) - phi(Phi_start, 0) into `x`.
    fn fill(&self, phi0: f64, phi: f64, j: usize, x: &mut [f64]) {
        match *self {
            Self::Linear => x[0] = phi - phi0,
            Self::Piecewise { lo, width, longest } => {
                for (k, xk) in x[..VALUE_PIECES].iter_mut().enumerate() {
                    *xk = if width > 0.0 {
                        let knot = lo + (k + 1) as f64 * width;
                        let hat = |p: f64| (1.0 - (p - knot).abs() / width).max(0.0);
                        hat(phi) - hat(phi0)
                    } else {
                        0.0
                    };
                }
                x[VALUE_PIECES] = j as f64 / longest;
            }
        }
    }

    /// The value's mean slope in Phi over the batch's range.
    fn slope(&self, w: &[f64]) -> f64 {
        match *self {
            Self::Linear => w[0],
            // f(lo) = 0 (every kept hat is 0 there) and f(hi) = w_P.
            Self::Piecewise { width, .. } if width > 0.0 => {
                w[VALUE_PIECES - 1] / (width * VALUE_PIECES as f64)
            }
            Self::Piecewise { .. } => 0.0,
        }
    }
}

/// Solves the normal equations `xtx w = xty` (symmetric, positive semi-definite) for the
/// least-squares weights. A feature that never varies (its diagonal entry ~0) gets weight 0; with
/// several, a tiny ridge (1e-9 of the mean diagonal) keeps nearly collinear features solvable.
fn least_squares(
    mut xtx: nalgebra::DMatrix<f64>,
    xty: &nalgebra::DVector<f64>,
) -> nalgebra::DVector<f64> {
    let m = xty.len();
    let used: Vec<usize> = (0..m)
        .filter(|&a| xtx[(a, a)] > ZERO_VARIANCE_STD)
        .collect();
    let mut w = nalgebra::DVector::zeros(m);
    match used[..] {
        [] => return w,
        // One feature: the slope sum xy / sum x^2 itself (no ridge, no factorisation).
        [a] => {
            w[a] = xty[a] / xtx[(a, a)];
            return w;
        }
        _ => {}
    }
    let ridge = 1e-9 * used.iter().map(|&a| xtx[(a, a)]).sum::<f64>() / used.len() as f64;
    for &a in &used {
        xtx[(a, a)] += ridge;
    }
    let a = xtx.select_rows(&used).select_columns(&used);
    let b = xty.select_rows(&used);
    if let Some(chol) = a.cholesky() {
        for (sol, &i) in chol.solve(&b).iter().zip(&used) {
            w[i] = *sol;
        }
    }
    w
}

/// Advantages of one group with the estimator of `cfg`: A_{i,t} for every rollout i and env
/// step t < `lengths[i]`.
///
/// GRPO, Dr.GRPO and VG-GRPO give every step of rollout i the same A_i; `process` needs
/// `group.steps`; `gigpo` needs `group.steps`, `group.anchors` and `group.anchor_cells`. Whenever `steps` or
/// `anchors` are given, their shapes must match `lengths` and every value must be finite,
/// whichever estimator is used: NaN or infinite rewards are an error, never dropped.
pub fn group_advantages(
    cfg: &AdvantageConfig,
    group: &GroupRewards,
    lengths: &[usize],
) -> Result<GroupAdvantages, AdvantageError> {
    cfg.validate()?;
    let outcomes = group.outcomes;
    if outcomes.is_empty() {
        return Err(AdvantageError::EmptyGroup);
    }
    if lengths.len() != outcomes.len() {
        return Err(AdvantageError::Count {
            what: "lengths",
            expected: outcomes.len(),
            got: lengths.len(),
        });
    }
    for (i, &r) in outcomes.iter().enumerate() {
        check_finite("outcome reward", i, None, r)?;
    }
    if let Some(steps) = group.steps {
        check_shape("step rewards", steps, lengths)?;
        for (i, rewards) in steps.iter().enumerate() {
            for (t, &r) in rewards.iter().enumerate() {
                check_finite("step reward", i, Some(t), r)?;
            }
        }
    }
    if let Some(anchors) = group.anchors {
        check_shape("anchor states", anchors, lengths)?;
        for (i, states) in anchors.iter().enumerate() {
            for (t, state) in states.iter().enumerate() {
                for &x in state {
                    check_finite("anchor state", i, Some(t), f64::from(x))?;
                }
            }
        }
    }

    let (mean, std) = mean_std(outcomes);
    let per_rollout = |a: Vec<f64>| -> Vec<Vec<f64>> {
        a.iter().zip(lengths).map(|(&a, &n)| vec![a; n]).collect()
    };
    let needs = |needs: &'static str| AdvantageError::Missing {
        estimator: cfg.estimator,
        needs,
    };
    let per_step = match cfg.estimator {
        Estimator::Grpo => per_rollout(grpo(outcomes)),
        Estimator::DrGrpo => per_rollout(dr_grpo(outcomes)),
        Estimator::VgGrpo => {
            let gate = variance_gate(std, cfg.vg_tau, cfg.vg_hard);
            per_rollout(grpo(outcomes).into_iter().map(|a| gate * a).collect())
        }
        Estimator::Process => {
            process_advantages(group.steps.ok_or_else(|| needs("per-step rewards"))?)
        }
        Estimator::GrpoProcess => {
            let steps = process_advantages(group.steps.ok_or_else(|| needs("per-step rewards"))?);
            grpo(outcomes)
                .into_iter()
                .zip(steps)
                .map(|(episode, steps)| steps.into_iter().map(|s| episode + s).collect())
                .collect()
        }
        Estimator::GrpoLambda => {
            return Err(needs(
                "the whole batch: its value slope is fitted over all groups (grpo_lambda)",
            ));
        }
        Estimator::Gigpo => {
            let steps = group.steps.ok_or_else(|| needs("per-step rewards"))?;
            let anchors = group.anchors.ok_or_else(|| needs("anchor states"))?;
            let cells = group.anchor_cells.ok_or_else(|| needs("anchor cells"))?;
            if let Some(state) = anchors.iter().flatten().find(|s| s.len() != cells.len()) {
                return Err(AdvantageError::AnchorCells(format!(
                    "{} for {}-d anchor states",
                    cells.len(),
                    state.len()
                )));
            }
            let step_adv =
                gigpo_step_advantages(steps, anchors, cfg.gigpo_gamma, cells, cfg.gigpo_normalise);
            grpo(outcomes)
                .into_iter()
                .zip(step_adv)
                .map(|(episode, steps)| {
                    steps
                        .into_iter()
                        .map(|s| episode + cfg.gigpo_omega * s)
                        .collect()
                })
                .collect()
        }
    };
    Ok(GroupAdvantages {
        per_step,
        zero_variance: std < ZERO_VARIANCE_STD,
        mean,
        std,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: f64 = 1e-9;

    fn close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < TOL, "{got:?} vs {want:?}");
        }
    }

    fn close2(got: &[Vec<f64>], want: &[Vec<f64>]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            close(g, w);
        }
    }

    fn cfg(estimator: Estimator) -> AdvantageConfig {
        AdvantageConfig {
            estimator,
            ..AdvantageConfig::default()
        }
    }

    fn outcomes_only(outcomes: &[f64]) -> GroupRewards<'_> {
        GroupRewards {
            outcomes,
            steps: None,
            anchors: None,
            anchor_cells: None,
        }
    }

    #[test]
    fn grpo_normalises_by_population_std_plus_eps() {
        // mean 0.5, population std 0.5: A = +-0.5 / 0.500001 = +-0.999998000004.
        let a = 0.999_998_000_004;
        close(&grpo(&[1.0, 0.0, 0.0, 1.0]), &[a, -a, -a, a]);
        // mean 2, std sqrt(2/3) = 0.816496580927726: A = +-1 / 0.816497580927726.
        let a = 1.224_743_371_393_426;
        close(&grpo(&[3.0, 1.0, 2.0]), &[a, -a, 0.0]);
    }

    #[test]
    fn dr_grpo_only_centres() {
        close(&dr_grpo(&[3.0, 1.0, 2.0]), &[1.0, -1.0, 0.0]);
        close(&dr_grpo(&[1.0, 0.0, 0.0, 1.0]), &[0.5, -0.5, -0.5, 0.5]);
    }

    #[test]
    fn variance_gate_soft_and_hard() {
        assert!((variance_gate(0.1, 0.1, false) - 0.5).abs() < TOL);
        assert!((variance_gate(0.2, 0.1, false) - 0.8).abs() < TOL);
        assert!((variance_gate(0.0, 0.1, false)).abs() < TOL);
        assert_eq!(variance_gate(0.2, 0.1, true), 1.0);
        assert_eq!(variance_gate(0.1, 0.1, true), 0.0);
        assert_eq!(variance_gate(0.05, 0.1, true), 0.0);
    }

    #[test]
    fn vg_grpo_scales_grpo_by_the_gate() {
        // std 0.5, tau 0.1: g = 0.25 / 0.26.
        let out = [1.0, 0.0, 0.0, 1.0];
        let adv =
            group_advantages(&cfg(Estimator::VgGrpo), &outcomes_only(&out), &[1, 2, 0, 1]).unwrap();
        let a = 0.25 / 0.26 * 0.5 / 0.500_001;
        close2(&adv.per_step, &[vec![a], vec![-a, -a], vec![], vec![a]]);
        assert!((adv.mean - 0.5).abs() < TOL && (adv.std - 0.5).abs() < TOL);
        assert!(!adv.zero_variance);

        let hard = AdvantageConfig {
            vg_hard: true,
            vg_tau: 0.6,
            ..cfg(Estimator::VgGrpo)
        };
        let adv = group_advantages(&hard, &outcomes_only(&out), &[1, 1, 1, 1]).unwrap();
        close2(&adv.per_step, &[vec![0.0], vec![0.0], vec![0.0], vec![0.0]]);
    }

    #[test]
    fn outcome_estimators_repeat_a_i_over_the_steps() {
        let out = [3.0, 1.0, 2.0];
        let adv =
            group_advantages(&cfg(Estimator::DrGrpo), &outcomes_only(&out), &[2, 3, 1]).unwrap();
        close2(
            &adv.per_step,
            &[vec![1.0, 1.0], vec![-1.0, -1.0, -1.0], vec![0.0]],
        );
        assert!((adv.mean - 2.0).abs() < TOL);
        assert!((adv.std - (2.0f64 / 3.0).sqrt()).abs() < TOL);
    }

    #[test]
    fn group_of_one_has_zero_advantage() {
        assert_eq!(grpo(&[0.7]), vec![0.0]);
        assert_eq!(dr_grpo(&[0.7]), vec![0.0]);
        let adv = group_advantages(&cfg(Estimator::Grpo), &outcomes_only(&[0.7]), &[3]).unwrap();
        assert_eq!(adv.per_step, vec![vec![0.0; 3]]);
        assert!(adv.zero_variance);
        assert!((adv.mean - 0.7).abs() < TOL);
        assert_eq!(adv.std, 0.0);
    }

    #[test]
    fn all_equal_outcomes_have_zero_variance_and_zero_advantage() {
        // 0.1 * 3 / 3 is not exactly 0.1: the result must still be exactly 0.
        let out = [0.1, 0.1, 0.1];
        for estimator in [Estimator::Grpo, Estimator::DrGrpo, Estimator::VgGrpo] {
            let adv = group_advantages(&cfg(estimator), &outcomes_only(&out), &[2, 1, 2]).unwrap();
            assert!(adv.zero_variance, "{estimator}");
            assert_eq!(
                adv.per_step,
                vec![vec![0.0; 2], vec![0.0], vec![0.0; 2]],
                "{estimator}"
            );
        }
    }

    #[test]
    fn nan_outcome_is_an_error_naming_the_rollout() {
        let out = [0.0, 1.0, 0.5, f64::NAN];
        let err =
            group_advantages(&cfg(Estimator::Grpo), &outcomes_only(&out), &[1; 4]).unwrap_err();
        assert!(
            matches!(
                err,
                AdvantageError::NonFinite { rollout: 3, step: None, value, .. } if value.is_nan()
            ),
            "{err:?}"
        );
        assert_eq!(err.to_string(), "outcome reward of rollout 3 is NaN");
    }

    #[test]
    fn nan_or_infinite_step_reward_is_an_error_naming_rollout_and_step() {
        let steps = vec![vec![0.0, 1.0], vec![0.0, f64::NAN, 1.0]];
        let group = GroupRewards {
            outcomes: &[1.0, 0.0],
            steps: Some(&steps),
            anchors: None,
            anchor_cells: None,
        };
        // Checked whichever estimator is used.
        for estimator in [Estimator::Grpo, Estimator::Process] {
            let err = group_advantages(&cfg(estimator), &group, &[2, 3]).unwrap_err();
            assert!(
                matches!(
                    err,
                    AdvantageError::NonFinite {
                        rollout: 1,
                        step: Some(1),
                        ..
                    }
                ),
                "{err:?}"
            );
            assert_eq!(err.to_string(), "step reward of rollout 1 at step 1 is NaN");
        }
        let steps = vec![vec![f64::INFINITY]];
        let group = GroupRewards {
            outcomes: &[1.0],
            steps: Some(&steps),
            anchors: None,
            anchor_cells: None,
        };
        let err = group_advantages(&cfg(Estimator::Process), &group, &[1]).unwrap_err();
        assert_eq!(err.to_string(), "step reward of rollout 0 at step 0 is inf");
    }

    #[test]
    fn process_advantages_hand_example() {
        // Rewards [[1, 0, 1], [0, 0, 0]]: mean 1/3, population std sqrt(2)/3, so
        // r~ = 2/3 / d for a 1 and -1/3 / d for a 0, d = sqrt(2)/3 + 1e-6 = 0.471405520...;
        // summed to go: [1, 1/3, 2/3] / d and [-1, -2/3, -1/3] / d.
        let steps = vec![vec![1.0, 0.0, 1.0], vec![0.0, 0.0, 0.0]];
        let (a, b, c) = (
            2.121_315_843_569_188,
            0.707_105_281_189_729,
            1.414_210_562_379_459,
        );
        let want = vec![vec![a, b, c], vec![-a, -c, -b]];
        close2(&process_advantages(&steps), &want);

        let group = GroupRewards {
            outcomes: &[2.0, 0.0],
            steps: Some(&steps),
            anchors: None,
            anchor_cells: None,
        };
        let adv = group_advantages(&cfg(Estimator::Process), &group, &[3, 3]).unwrap();
        close2(&adv.per_step, &want);
    }

    #[test]
    fn grpo_process_adds_the_process_advantage_to_the_episode_one() {
        // Outcomes [2, 0]: GRPO gives +-1 / (1 + 1e-6) = +-0.999999000001 (population std 1).
        // The steps are those of process_advantages_hand_example: process advantages
        // [2.1213158, 0.7071053, 1.4142106] and their negatives [-2.12.., -1.41.., -0.71..].
        let steps = vec![vec![1.0, 0.0, 1.0], vec![0.0, 0.0, 0.0]];
        let group = GroupRewards {
            outcomes: &[2.0, 0.0],
            steps: Some(&steps),
            anchors: None,
            anchor_cells: None,
        };
        let c = cfg(Estimator::GrpoProcess);
        let adv = group_advantages(&c, &group, &[3, 3]).unwrap();
        let (a, b, c2) = (
            3.121_314_843_570_188,
            1.707_104_281_190_73,
            2.414_209_562_380_459,
        );
        close2(&adv.per_step, &[vec![a, b, c2], vec![-a, -c2, -b]]);
        // Without step rewards it says what it needs.
        let err = group_advantages(&c, &outcomes_only(&[1.0, 0.0]), &[3, 3]).unwrap_err();
        assert!(err.to_string().contains("per-step rewards"), "{err}");
    }

    #[test]
    fn process_advantages_ragged_empty_and_constant() {
        // [[2], [], [0, 0]]: mean 2/3, std sqrt(8/9); d = std + 1e-6.
        let d = (8.0f64 / 9.0).sqrt() + 1e-6;
        let got = process_advantages(&[vec![2.0], vec![], vec![0.0, 0.0]]);
        close2(
            &got,
            &[
                vec![(4.0 / 3.0) / d],
                vec![],
                vec![-(4.0 / 3.0) / d, -(2.0 / 3.0) / d],
            ],
        );
        let got = process_advantages(&[vec![0.3, 0.3], vec![], vec![0.3]]);
        assert_eq!(got, vec![vec![0.0, 0.0], vec![], vec![0.0]]);
    }

    fn lambda_rollout(group: usize, outcome: f64, potential: &[f64]) -> LambdaRollout<'_> {
        LambdaRollout {
            group,
            outcome,
            potential,
        }
    }

    #[test]
    fn grpo_lambda_credits_the_decision_after_which_progress_jumps() {
        // One group: a success whose progress jumps after decision 1, a failure that never
        // progresses. gamma 1: V_g = 0.5; x = Phi; y = +-0.5, so b = (0.5 + 0.5) / 2 = 0.5 and
        // V = [0.5, 0.5, 1, 1] and [0.5; 4]. lambda 0 (A = delta): the success's decision 1
        // moved to the higher value (+0.5), the failure's last decision ended at 0 from 0.5
        // (-0.5), nothing else; the batch std is 0.25.
        let (s, f) = ([0.0, 0.0, 1.0, 1.0], [0.0; 4]);
        let got = grpo_lambda(
            &[lambda_rollout(0, 1.0, &s), lambda_rollout(0, 0.0, &f)],
            1.0,
            0.0,
            LambdaValue::Linear,
        )
        .unwrap();
        assert!((got.slope - 0.5).abs() < TOL);
        assert_eq!(got.zero_variance_groups, 0);
        // sum y^2 = 8 x 0.25 = 2, of which b sum xy = 0.5 is explained.
        assert!((got.explained - 0.25).abs() < TOL, "{}", got.explained);
        let a = 0.5 / (0.25 + 1e-8);
        close2(
            &got.per_decision,
            &[vec![0.0, a, 0.0, 0.0], vec![0.0, 0.0, 0.0, -a]],
        );
    }

    #[test]
    fn grpo_lambda_with_lambda_and_gamma_one_and_flat_progress_is_dr_grpo_normalised() {
        // Phi constant: b = 0, V = the group's mean outcome, and lambda = gamma = 1 gives
        // A_{i,j} = R_i - mean R at every decision (then normalised over the batch).
        let flat = [0.3; 3];
        let short = [0.7; 2];
        let rollouts = [
            lambda_rollout(0, 2.0, &flat),
            lambda_rollout(0, 0.0, &flat),
            lambda_rollout(1, 1.0, &short),
            lambda_rollout(1, 1.0, &short),
        ];
        let raw = [vec![1.0; 3], vec![-1.0; 3], vec![0.0; 2], vec![0.0; 2]];
        let (m, sd) = mean_std(&raw.concat());
        let want: Vec<Vec<f64>> = raw
            .iter()
            .map(|r| r.iter().map(|a| (a - m) / (sd + 1e-8)).collect())
            .collect();
        // The piecewise value's term in j gets weight 0 too: group 0's returns about its start
        // value are +1 and -1 at every j, group 1's 0.
        for value in [LambdaValue::Linear, LambdaValue::Piecewise] {
            let got = grpo_lambda(&rollouts, 1.0, 1.0, value).unwrap();
            assert_eq!(got.slope, 0.0);
            // Group 1's outcomes are equal.
            assert_eq!(got.zero_variance_groups, 1);
            assert!(got.explained.abs() < TOL, "{value:?}: {}", got.explained);
            close2(&got.per_decision, &want);
        }
    }

    #[test]
    fn grpo_lambda_discounts_the_outcome_and_names_bad_input() {
        // One decision per rollout, gamma 0.5: G = R, V_g = 1, b = 0; A = R - 1 = +-1, which
        // the normalisation (std 1) keeps.
        let one = [0.0];
        let a = 1.0 / (1.0 + 1e-8);
        let got = grpo_lambda(
            &[lambda_rollout(0, 2.0, &one), lambda_rollout(0, 0.0, &one)],
            0.5,
            0.95,
            LambdaValue::Linear,
        )
        .unwrap();
        close2(&got.per_decision, &[vec![a], vec![-a]]);
        // An empty rollout gets no advantages and does not disturb the others.
        let got = grpo_lambda(
            &[
                lambda_rollout(0, 2.0, &one),
                lambda_rollout(0, 0.0, &one),
                lambda_rollout(0, 5.0, &[]),
            ],
            0.5,
            0.95,
            LambdaValue::Linear,
        )
        .unwrap();
        close2(&got.per_decision, &[vec![a], vec![-a], vec![]]);
        let e = grpo_lambda(
            &[lambda_rollout(0, 1.0, &[0.0, f64::NAN])],
            1.0,
            1.0,
            LambdaValue::Piecewise,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(e, "potential of rollout 0 at step 1 is NaN");
        let e = grpo_lambda(
            &[lambda_rollout(0, f64::INFINITY, &one)],
            1.0,
            1.0,
            LambdaValue::Piecewise,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(e, "outcome reward of rollout 0 is inf");
    }

    #[test]
    fn grpo_lambda_piecewise_value_fits_a_step_in_progress_that_one_slope_cannot() {
        // Successes (R = 2) are the rollouts whose progress passes 0.5, whatever else it does;
        // below 0.5 progress says nothing. One slope explains 5% of the returns' variance about
        // the start value, the piecewise-linear value (which contains every linear one) 42%.
        let paths: [(&[f64], f64); 6] = [
            (&[0.0, 0.1, 0.3, 0.45, 0.4], 0.0),
            (&[0.0, 0.3, 0.2, 0.1, 0.05], 0.0),
            (&[0.0, 0.2, 0.4, 0.45, 0.45], 0.0),
            (&[0.0, 0.1, 0.6, 0.7, 0.8], 2.0),
            (&[0.0, 0.3, 0.55, 1.0, 0.9], 2.0),
            (&[0.0, 0.05, 0.1, 0.2, 0.6], 2.0),
        ];
        let rollouts: Vec<_> = paths
            .iter()
            .map(|&(p, r)| lambda_rollout(0, r, p))
            .collect();
        let linear = grpo_lambda(&rollouts, 0.99, 0.95, LambdaValue::Linear).unwrap();
        let piecewise = grpo_lambda(&rollouts, 0.99, 0.95, LambdaValue::Piecewise).unwrap();
        assert!(
            piecewise.explained > linear.explained + 0.1 && piecewise.explained <= 1.0,
            "piecewise {} linear {}",
            piecewise.explained,
            linear.explained
        );
        // Most of the step is in the value: the rise in Phi over the range is about the
        // returns' jump of 2.
        assert!(piecewise.slope > 1.0, "{}", piecewise.slope);
        let all = piecewise.per_decision.concat();
        let (m, sd) = mean_std(&all);
        assert!(m.abs() < TOL && (sd - 1.0).abs() < 1e-6, "{m} {sd}");
        // With lambda 0 (A = delta) the step itself is credited: the decision after which
        // rollout 3 passes 0.5 has the largest advantage of its rollout.
        let td = grpo_lambda(&rollouts, 0.99, 0.0, LambdaValue::Piecewise).unwrap();
        let a3 = &td.per_decision[3];
        let best = (0..a3.len())
            .max_by(|&a, &b| a3[a].total_cmp(&a3[b]))
            .unwrap();
        assert_eq!(best, 1, "{a3:?}");
    }

    #[test]
    fn gae_hand_example() {
        // gamma 0.9, lambda 0.8 (gamma lambda = 0.72), bootstrap V(s_3) = 2:
        // delta_2 = 2 + 0.9 * 2.0 - 1.5 = 2.3;   A_2 = 2.3
        // delta_1 = 0 + 0.9 * 1.5 - 1.0 = 0.35;  A_1 = 0.35 + 0.72 * 2.3 = 2.006
        // delta_0 = 1 + 0.9 * 1.0 - 0.5 = 1.4;   A_0 = 1.4 + 0.72 * 2.006 = 2.84432
        // Returns R_t = A_t + V(s_t): 2.84432 + 0.5, 2.006 + 1.0, 2.3 + 1.5.
        let (a, r) = gae(&[1.0, 0.0, 2.0], &[0.5, 1.0, 1.5], 2.0, 0.9, 0.8);
        close(&a, &[2.84432, 2.006, 2.3]);
        close(&r, &[3.34432, 3.006, 3.8]);
        // Terminated: no bootstrap, so the last delta is r - V = 1 - 0.25.
        let (a, r) = gae(&[1.0], &[0.25], 0.0, 0.9, 0.8);
        close(&a, &[0.75]);
        close(&r, &[1.0]);
        // lambda = 1 and V = 0: the discounted return, A_1 = 2, A_0 = 1 + 0.5 * 2 = 2.
        let (a, r) = gae(&[1.0, 2.0], &[0.0, 0.0], 0.0, 0.5, 1.0);
        close(&a, &[2.0, 2.0]);
        close(&r, &[2.0, 2.0]);
        // lambda = 0: one-step TD errors; the critic's value of a final observation (3)
        // bootstraps the cut episode: delta_1 = 0 + 0.5 * 3 - 1 = 0.5,
        // delta_0 = 1 + 0.5 * 1 - 2 = -0.5.
        let (a, _) = gae(&[1.0, 0.0], &[2.0, 1.0], 3.0, 0.5, 0.0);
        close(&a, &[-0.5, 0.5]);
    }

    #[test]
    fn discounted_returns_backwards() {
        close(&discounted_returns(&[1.0, 0.0, 2.0], 0.5), &[1.5, 1.0, 2.0]);
        close(&discounted_returns(&[1.0, 1.0, 1.0], 1.0), &[3.0, 2.0, 1.0]);
        assert!(discounted_returns(&[], 0.9).is_empty());
    }

    #[test]
    fn anchor_key_equal_within_a_cell_and_different_across() {
        let five = [5.0, 5.0];
        assert_eq!(
            anchor_key(&[0.1, 4.9], &five),
            anchor_key(&[4.99, 0.0], &five)
        );
        assert_ne!(
            anchor_key(&[0.1, 4.9], &five),
            anchor_key(&[5.0, 0.0], &five)
        );
        // Floor, not truncation: -0.1 lies in cell -1, 0.1 in cell 0.
        assert_ne!(anchor_key(&[-0.1], &[5.0]), anchor_key(&[0.1], &[5.0]));
        assert_eq!(anchor_key(&[-0.1], &[5.0]), anchor_key(&[-4.9], &[5.0]));
        // The dimension is part of the cell.
        assert_ne!(
            anchor_key(&[0.0], &[1.0]),
            anchor_key(&[0.0, 0.0], &[1.0, 1.0])
        );
        // Each dimension has its own cell size: 0.3 and 0.4 share cell 0 of size 0.5, 0.6 is in
        // cell 1.
        let cells = [5.0, 0.5];
        assert_eq!(
            anchor_key(&[1.0, 0.3], &cells),
            anchor_key(&[4.0, 0.4], &cells)
        );
        assert_ne!(
            anchor_key(&[1.0, 0.3], &cells),
            anchor_key(&[1.0, 0.6], &cells)
        );
        // Fixed values (FNV-1a of the length and cells, checked in Python): keys must not drift
        // between builds. [7.5, -0.5] on cells [5, 1] is cell (1, -1), as [1.5, -0.5] on [1, 1].
        assert_eq!(anchor_key(&[], &[]), 0xa8c7_f832_281a_39c5);
        assert_eq!(anchor_key(&[1.5, -0.5], &[1.0, 1.0]), 0xe131_8b94_1230_b9fe);
        assert_eq!(anchor_key(&[7.5, -0.5], &[5.0, 1.0]), 0xe131_8b94_1230_b9fe);
    }

    /// Rollout 0: rewards [0, 0, 1], cells [A, B, C]; rollout 1: rewards [0, 1], cells [A, B].
    /// gamma 0.5: returns [0.25, 0.5, 1] and [0.5, 1]. Cluster A {0.25, 0.5} mean 0.375,
    /// cluster B {0.5, 1} mean 0.75, C singleton.
    fn gigpo_example() -> (Vec<Vec<f64>>, Vec<Vec<Vec<f32>>>) {
        let steps = vec![vec![0.0, 0.0, 1.0], vec![0.0, 1.0]];
        let anchors = vec![
            vec![vec![0.2, 0.7], vec![1.5, -0.5], vec![5.5, 5.5]],
            vec![vec![0.9, 0.1], vec![1.01, -0.99]],
        ];
        (steps, anchors)
    }

    #[test]
    fn gigpo_step_advantages_hand_example() {
        let (steps, anchors) = gigpo_example();
        let got = gigpo_step_advantages(&steps, &anchors, 0.5, &[1.0, 1.0], false);
        close2(&got, &[vec![-0.125, -0.25, 0.0], vec![0.125, 0.25]]);
        // Cluster stds 0.125 and 0.25.
        let got = gigpo_step_advantages(&steps, &anchors, 0.5, &[1.0, 1.0], true);
        let (a, b) = (0.125 / 0.125_001, 0.25 / 0.250_001);
        close2(&got, &[vec![-a, -b, 0.0], vec![a, b]]);
        // Grid 10: the cells become (0, 0), (0, -1), (0, 0) and (0, 0), (0, -1).
        let got = gigpo_step_advantages(&steps, &anchors, 0.5, &[10.0, 10.0], false);
        // Cell (0, 0): {0.25, 1, 0.5} mean 7/12; cell (0, -1): {0.5, 1} mean 0.75.
        let m = 7.0 / 12.0;
        close2(&got, &[vec![0.25 - m, -0.25, 1.0 - m], vec![0.5 - m, 0.25]]);
        // Cells 10 x 1, one per dimension: (0, 0), (0, -1), (0, 5) and (0, 0), (0, -1); cluster
        // (0, 0) is {0.25, 0.5} as on the unit grid, (0, -1) {0.5, 1}, (0, 5) a singleton.
        let got = gigpo_step_advantages(&steps, &anchors, 0.5, &[10.0, 1.0], false);
        close2(&got, &[vec![-0.125, -0.25, 0.0], vec![0.125, 0.25]]);
    }

    #[test]
    fn gigpo_adds_omega_times_step_advantage_to_episode_grpo() {
        let (steps, anchors) = gigpo_example();
        let group = GroupRewards {
            outcomes: &[1.0, 0.0],
            steps: Some(&steps),
            anchors: Some(&anchors),
            anchor_cells: Some(&[1.0, 1.0]),
        };
        let cfg = AdvantageConfig {
            estimator: Estimator::Gigpo,
            gigpo_omega: 2.0,
            gigpo_gamma: 0.5,
            ..AdvantageConfig::default()
        };
        let adv = group_advantages(&cfg, &group, &[3, 2]).unwrap();
        let e = 0.5 / 0.500_001;
        close2(
            &adv.per_step,
            &[vec![e - 0.25, e - 0.5, e], vec![-e + 0.25, -e + 0.5]],
        );
    }

    #[test]
    fn anchor_cells_come_from_the_environment_unless_gigpo_grid_overrides_them() {
        let env = [5.0f32, 5.0, 0.1];
        let d = AdvantageConfig::default();
        assert_eq!(
            anchor_cells(&d, Some(&env), 3).unwrap(),
            [5.0, 5.0, 0.1f32 as f64]
        );
        let grid = AdvantageConfig {
            gigpo_grid: Some(2.0),
            ..d.clone()
        };
        assert_eq!(anchor_cells(&grid, Some(&env), 3).unwrap(), [2.0; 3]);
        assert_eq!(anchor_cells(&grid, None, 2).unwrap(), [2.0; 2]);
        let err = anchor_cells(&d, None, 3).unwrap_err().to_string();
        assert!(err.contains("gigpo_grid"), "{err}");
        let err = anchor_cells(&d, Some(&env), 2).unwrap_err().to_string();
        assert_eq!(err, "anchor cells: the environment gives 3 for a 2-d state");
        let err = anchor_cells(&d, Some(&[5.0, 0.0]), 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("> 0"), "{err}");
    }

    #[test]
    fn success_sampling_keeps_only_groups_with_both_successes_and_failures() {
        assert!(mixed_success(&[true, false, true]));
        assert!(!mixed_success(&[true, true]));
        assert!(!mixed_success(&[false, false, false]));
        assert!(!mixed_success(&[]));
        assert!(some_failure(&[true, false, true]));
        assert!(some_failure(&[false, false]));
        assert!(!some_failure(&[true, true]));
        assert!(!some_failure(&[]));
    }

    #[test]
    fn dapo_keeps_only_groups_with_different_outcomes() {
        assert!(dapo_keep(&[0.0, 1.0, 0.0]));
        assert!(!dapo_keep(&[0.5, 0.5, 0.5]));
        assert!(!dapo_keep(&[0.5]));
        assert!(!dapo_keep(&[]));
    }

    #[test]
    fn lengths_mismatch_is_an_error() {
        let steps = vec![vec![0.0, 0.0], vec![0.0]];
        let group = GroupRewards {
            outcomes: &[1.0, 0.0],
            steps: Some(&steps),
            anchors: None,
            anchor_cells: None,
        };
        let err = group_advantages(&cfg(Estimator::Process), &group, &[2, 2]).unwrap_err();
        assert!(
            matches!(
                err,
                AdvantageError::Length {
                    rollout: 1,
                    expected: 2,
                    got: 1,
                    ..
                }
            ),
            "{err:?}"
        );
        let err =
            group_advantages(&cfg(Estimator::Grpo), &outcomes_only(&[1.0, 0.0]), &[2]).unwrap_err();
        assert!(
            matches!(
                err,
                AdvantageError::Count {
                    expected: 2,
                    got: 1,
                    ..
                }
            ),
            "{err:?}"
        );
        let anchors = vec![vec![vec![0.0f32]], vec![vec![0.0f32]; 2]];
        let steps = vec![vec![0.0; 2], vec![0.0; 2]];
        let group = GroupRewards {
            outcomes: &[1.0, 0.0],
            steps: Some(&steps),
            anchors: Some(&anchors),
            anchor_cells: None,
        };
        let err = group_advantages(&cfg(Estimator::Gigpo), &group, &[2, 2]).unwrap_err();
        assert!(
            matches!(
                err,
                AdvantageError::Length {
                    what: "anchor states",
                    rollout: 0,
                    expected: 2,
                    got: 1
                }
            ),
            "{err:?}"
        );
        let err = group_advantages(&cfg(Estimator::Grpo), &outcomes_only(&[]), &[]).unwrap_err();
        assert!(matches!(err, AdvantageError::EmptyGroup), "{err:?}");
    }

    #[test]
    fn estimators_needing_steps_or_anchors_say_so() {
        let out = [1.0, 0.0];
        let err =
            group_advantages(&cfg(Estimator::Process), &outcomes_only(&out), &[1, 1]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the process estimator needs per-step rewards"
        );
        let err =
            group_advantages(&cfg(Estimator::Gigpo), &outcomes_only(&out), &[1, 1]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the gigpo estimator needs per-step rewards"
        );
        let steps = vec![vec![0.0], vec![1.0]];
        let group = GroupRewards {
            outcomes: &out,
            steps: Some(&steps),
            anchors: None,
            anchor_cells: None,
        };
        let err = group_advantages(&cfg(Estimator::Gigpo), &group, &[1, 1]).unwrap_err();
        assert_eq!(err.to_string(), "the gigpo estimator needs anchor states");
        let anchors = vec![vec![vec![0.0f32, 1.0]], vec![vec![2.0f32, 3.0]]];
        let group = GroupRewards {
            anchors: Some(&anchors),
            ..group
        };
        let err = group_advantages(&cfg(Estimator::Gigpo), &group, &[1, 1]).unwrap_err();
        assert_eq!(err.to_string(), "the gigpo estimator needs anchor cells");
        let group = GroupRewards {
            anchor_cells: Some(&[1.0]),
            ..group
        };
        let err = group_advantages(&cfg(Estimator::Gigpo), &group, &[1, 1]).unwrap_err();
        assert_eq!(err.to_string(), "anchor cells: 1 for 2-d anchor states");
    }

    #[test]
    fn nan_anchor_is_an_error() {
        let steps = vec![vec![0.0, 1.0]];
        let anchors = vec![vec![vec![0.0f32], vec![f32::NAN]]];
        let group = GroupRewards {
            outcomes: &[1.0],
            steps: Some(&steps),
            anchors: Some(&anchors),
            anchor_cells: None,
        };
        let err = group_advantages(&cfg(Estimator::Gigpo), &group, &[2]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "anchor state of rollout 0 at step 1 is NaN"
        );
    }

    #[test]
    fn config_defaults_serde_and_validation() {
        let c: AdvantageConfig = serde_json::from_str(r#"{"estimator": "vg-grpo"}"#).unwrap();
        assert_eq!(
            c,
            AdvantageConfig {
                estimator: Estimator::VgGrpo,
                ..AdvantageConfig::default()
            }
        );
        let c: AdvantageConfig = serde_json::from_str(r#"{"estimator": "dr-grpo"}"#).unwrap();
        assert_eq!(c.estimator, Estimator::DrGrpo);
        assert!(serde_json::from_str::<AdvantageConfig>(r#"{"vg_tua": 0.1}"#).is_err());
        let d = AdvantageConfig::default();
        assert_eq!(d.estimator, Estimator::Grpo);
        assert_eq!((d.vg_tau, d.vg_hard), (0.1, false));
        assert_eq!(
            (d.gigpo_omega, d.gigpo_gamma, d.gigpo_grid),
            (1.0, 0.95, None)
        );
        assert!(!d.gigpo_normalise);
        d.validate().unwrap();
        AdvantageConfig {
            gigpo_gamma: 1.0,
            gigpo_omega: 0.0,
            ..d.clone()
        }
        .validate()
        .unwrap();

        let field_of = |c: AdvantageConfig| c.validate().unwrap_err().field;
        let with = |f: fn(&mut AdvantageConfig)| {
            let mut c = AdvantageConfig::default();
            f(&mut c);
            c
        };
        assert_eq!(field_of(with(|c| c.vg_tau = 0.0)), "vg_tau");
        assert_eq!(field_of(with(|c| c.vg_tau = f64::INFINITY)), "vg_tau");
        assert_eq!(field_of(with(|c| c.gigpo_omega = -1.0)), "gigpo_omega");
        assert_eq!(field_of(with(|c| c.gigpo_gamma = 0.0)), "gigpo_gamma");
        assert_eq!(field_of(with(|c| c.gigpo_gamma = 1.5)), "gigpo_gamma");
        assert_eq!(field_of(with(|c| c.gigpo_gamma = f64::NAN)), "gigpo_gamma");
        assert_eq!(field_of(with(|c| c.gigpo_grid = Some(-5.0))), "gigpo_grid");
        assert_eq!(
            field_of(with(|c| c.gigpo_grid = Some(f64::NAN))),
            "gigpo_grid"
        );
        // group_advantages refuses a bad config.
        let bad = with(|c| c.vg_tau = -1.0);
        assert!(matches!(
            group_advantages(&bad, &outcomes_only(&[1.0]), &[1]),
            Err(AdvantageError::Config(Invalid { field, .. })) if field == "vg_tau"
        ));
    }
}
