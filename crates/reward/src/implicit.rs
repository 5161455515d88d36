//! OPRL-style implicit process reward model (docs/algorithms.md §4): a copy of the policy, pi_phi,
//! trained online with trajectory DPO against the behaviour policy pi_old that collected the
//! batch, on pairs of rollouts from one initial state ranked by their outcome:
//!
//! `L = -log sigma(beta [log pi_phi(tau+)/pi_old(tau+) - log pi_phi(tau-)/pi_old(tau-)])`.
//!
//! A trajectory's log-likelihood is the sum over its policy calls of the fine-tuned steps of
//! the denoising chain (the reverse-kernel log-probs the learner already stores); the reward of
//! policy call t is then `r_t = beta * sum_k log pi_phi(x_{k-1} | x_k, s_t) / pi_old(...)`:
//! calls that the outcome-preferred trajectories made more likely get positive reward. The
//! rewards come from the learner's own chains, so they need no labels, demonstrations or state
//! features; the learner turns them into step advantages like any other step rewards.

use burn::module::Module;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsParams, Optimizer};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::activation::log_sigmoid;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion as _, Tensor, TensorData};
use diffrl_core::config::{Invalid, Validate};
use diffrl_policy::{ObsBatch, Policy, PolicyModel};
use serde::{Deserialize, Serialize};

use crate::error::RewardError;

/// Implicit PRM settings (`[grpo.implicit_prm]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImplicitPrmConfig {
    /// beta of the DPO loss and of the step rewards.
    pub beta: f64,
    /// AdamW learning rate of pi_phi.
    pub lr: f64,
    /// Passes over each batch's pairs (one optimiser step per group and pass).
    pub epochs: usize,
    /// Rollouts whose outcomes differ by less than this are not paired.
    pub min_gap: f64,
    /// Policy calls per forward pass when scoring (bounds memory).
    pub chunk: usize,
}

impl Default for ImplicitPrmConfig {
    fn default() -> Self {
        Self {
            beta: 1.0,
            lr: 3e-5,
            epochs: 1,
            min_gap: 1e-6,
            chunk: 2048,
        }
    }
}

impl Validate for ImplicitPrmConfig {
    /// Checks every setting.
    fn validate(&self) -> Result<(), Invalid> {
        let positive = |v: f64| v > 0.0 && v.is_finite();
        if !positive(self.beta) {
            return Err(Invalid::new("beta", "must be > 0"));
        }
        if !positive(self.lr) {
            return Err(Invalid::new("lr", "must be > 0"));
        }
        if self.epochs == 0 {
            return Err(Invalid::new("epochs", "must be >= 1"));
        }
        if !(self.min_gap >= 0.0 && self.min_gap.is_finite()) {
            return Err(Invalid::new("min_gap", "must be >= 0"));
        }
        if self.chunk == 0 {
            return Err(Invalid::new("chunk", "must be >= 1"));
        }
        Ok(())
    }
}

/// One policy call of a rollout as the learner stored it.
#[derive(Debug, Clone, Copy)]
pub struct ChainCall<'a> {
    /// Raw state history the call saw ([To, Ds]).
    pub state: &'a [f32],
    /// Images, for pixel policies ([To, H, W, C]).
    pub image: Option<&'a [u8]>,
    /// The instruction, for language-conditioned policies.
    pub text: Option<&'a str>,
    /// x_K..x_0 of the sampled chain ([K + 1, Tp, Da], as the policy's log-probs read it).
    pub chain: &'a [f32],
    /// log pi_old of every chain step ([K]).
    pub old_logp: &'a [f32],
}

/// One rollout: its policy calls in order.
pub type Trajectory<'a> = [ChainCall<'a>];

/// What one update did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DpoStats {
    /// Ranked pairs in the batch.
    pub pairs: usize,
    /// Mean DPO loss over the pairs (first epoch, before its step: log 2 when pi_phi = pi_old).
    pub loss: f64,
    /// Fraction of pairs whose preferred rollout already had the larger log-ratio.
    pub accuracy: f64,
    /// Groups without two rollouts of different outcome (no pair).
    pub unranked_groups: usize,
}

type Optim<B> = OptimizerAdaptor<AdamW, PolicyModel<B>, B>;
type Rec = NamedMpkBytesRecorder<FullPrecisionSettings>;

/// The implicit PRM: pi_phi and its optimiser.
pub struct ImplicitPrm<B: AutodiffBackend> {
    phi: Policy<B>,
    optim: Optim<B>,
    cfg: ImplicitPrmConfig,
}

impl<B: AutodiffBackend> ImplicitPrm<B> {
    /// pi_phi starts as a copy of `init` (the policy being fine-tuned, with its K').
    pub fn new(
        init: &Policy<B::InnerBackend>,
        cfg: ImplicitPrmConfig,
    ) -> Result<Self, RewardError> {
        cfg.validate().map_err(|e| e.within("implicit_prm"))?;
        Ok(Self {
            phi: Policy::trainable(init),
            optim: AdamWConfig::new().with_weight_decay(0.0).init(),
            cfg,
        })
    }

    /// The settings.
    pub fn config(&self) -> &ImplicitPrmConfig {
        &self.cfg
    }

    /// One DPO update on a batch of groups: `rollouts[g * group_size + i]` is rollout i of
    /// group g, `outcomes` their outcomes. Within a group every pair whose outcomes differ by at
    /// least `min_gap` is ranked; each group is one optimiser step per epoch.
    pub fn update(
        &mut self,
        rollouts: &[&Trajectory<'_>],
        outcomes: &[f64],
        group_size: usize,
    ) -> Result<DpoStats, RewardError> {
        if rollouts.len() != outcomes.len()
            || group_size == 0
            || !rollouts.len().is_multiple_of(group_size)
        {
            return Err(RewardError::Data(format!(
                "implicit PRM: {} rollouts, {} outcomes, groups of {group_size}",
                rollouts.len(),
                outcomes.len()
            )));
        }
        if let Some(i) = outcomes.iter().position(|o| !o.is_finite()) {
            return Err(RewardError::NonFinite {
                what: "implicit PRM: outcome".into(),
                index: i,
                value: outcomes[i] as f32,
            });
        }
        let mut stats = DpoStats::default();
        let (mut loss_sum, mut correct) = (0.0, 0usize);
        for epoch in 0..self.cfg.epochs {
            for (g, members) in rollouts.chunks(group_size).enumerate() {
                let o = &outcomes[g * group_size..(g + 1) * group_size];
                let pairs: Vec<(usize, usize)> = (0..group_size)
                    .flat_map(|i| (0..group_size).map(move |j| (i, j)))
                    .filter(|&(i, j)| o[i] - o[j] >= self.cfg.min_gap.max(f64::MIN_POSITIVE))
                    .collect();
                if pairs.is_empty() {
                    stats.unranked_groups += usize::from(epoch == 0);
                    continue;
                }
                let device = self.device()?;
                let ratios = self.log_ratios(members, &device)?;
                let n = members.len();
                let mut sel = vec![0f32; pairs.len() * n];
                for (p, &(i, j)) in pairs.iter().enumerate() {
                    sel[p * n + i] = 1.0;
                    sel[p * n + j] = -1.0;
                }
                let sel =
                    Tensor::<B, 2>::from_data(TensorData::new(sel, [pairs.len(), n]), &device);
                let margin = sel.matmul(ratios.reshape([n, 1])).reshape([pairs.len()]);
                let loss = -log_sigmoid(margin.clone() * self.cfg.beta).mean();
                let value: f64 = loss.clone().into_scalar().elem();
                if !value.is_finite() {
                    return Err(RewardError::NonFinite {
                        what: format!("implicit PRM: DPO loss of group {g}"),
                        index: g,
                        value: value as f32,
                    });
                }
                if epoch == 0 {
                    stats.pairs += pairs.len();
                    loss_sum += value * pairs.len() as f64;
                    let m = margin
                        .into_data()
                        .convert::<f32>()
                        .to_vec::<f32>()
                        .unwrap_or_default();
                    correct += m.iter().filter(|&&v| v > 0.0).count();
                }
                let grads = GradientsParams::from_grads(loss.backward(), &self.phi.model);
                self.phi.model = self.optim.step(self.cfg.lr, self.phi.model.clone(), grads);
            }
        }
        if stats.pairs > 0 {
            stats.loss = loss_sum / stats.pairs as f64;
            stats.accuracy = correct as f64 / stats.pairs as f64;
        }
        Ok(stats)
    }

    /// Step rewards of one rollout, one per policy call:
    /// `beta * sum over fine-tuned chain steps of (log pi_phi - log pi_old)`.
    pub fn call_rewards(&self, rollout: &Trajectory<'_>) -> Result<Vec<f64>, RewardError> {
        let phi = self.phi.valid();
        let device = self.device()?;
        let mut out = Vec::with_capacity(rollout.len());
        for calls in rollout.chunks(self.cfg.chunk) {
            let (lp, old) = call_logps(&phi, calls, &device)?;
            let lp = lp
                .into_data()
                .convert::<f32>()
                .to_vec::<f32>()
                .map_err(|e| {
                    RewardError::Data(format!("implicit PRM: reading log-probs back: {e:?}"))
                })?;
            let ft = lp.len() / calls.len().max(1);
            for (c, (row, old)) in lp.chunks(ft).zip(old.chunks(ft)).enumerate() {
                let r: f64 = row.iter().zip(old).map(|(&a, &b)| f64::from(a - b)).sum();
                if !r.is_finite() {
                    return Err(RewardError::NonFinite {
                        what: "implicit PRM: step reward".into(),
                        index: out.len() + c,
                        value: r as f32,
                    });
                }
                out.push(self.cfg.beta * r);
            }
        }
        Ok(out)
    }

    /// pi_phi's weights and optimiser state as bytes (for a learner's resumable state).
    pub fn state_bytes(&self) -> Result<[Vec<u8>; 2], RewardError> {
        let err =
            |e: burn::record::RecorderError| RewardError::Data(format!("implicit PRM state: {e}"));
        Ok([
            Recorder::<B>::record(&Rec::default(), self.phi.model.clone().into_record(), ())
                .map_err(err)?,
            Recorder::<B>::record(&Rec::default(), self.optim.to_record(), ()).map_err(err)?,
        ])
    }

    /// Restores what [`ImplicitPrm::state_bytes`] wrote.
    pub fn load_state(&mut self, model: Vec<u8>, optim: Vec<u8>) -> Result<(), RewardError> {
        let err =
            |e: burn::record::RecorderError| RewardError::Data(format!("implicit PRM state: {e}"));
        let device = self.device()?;
        let model = Recorder::<B>::load(&Rec::default(), model, &device).map_err(err)?;
        let optim = Recorder::<B>::load(&Rec::default(), optim, &device).map_err(err)?;
        self.phi.model = self.phi.model.clone().load_record(model);
        self.optim =
            std::mem::replace(&mut self.optim, AdamWConfig::new().init()).load_record(optim);
        Ok(())
    }

    fn device(&self) -> Result<B::Device, RewardError> {
        self.phi
            .model
            .devices()
            .pop()
            .ok_or_else(|| RewardError::Data("implicit PRM: the policy has no parameters".into()))
    }

    /// log pi_phi(tau) - log pi_old(tau) per rollout, differentiable: [n].
    fn log_ratios(
        &self,
        rollouts: &[&Trajectory<'_>],
        device: &B::Device,
    ) -> Result<Tensor<B, 1>, RewardError> {
        let calls: Vec<ChainCall<'_>> = rollouts.iter().flat_map(|r| r.iter().copied()).collect();
        if rollouts.iter().any(|r| r.is_empty()) {
            return Err(RewardError::Data(
                "implicit PRM: a rollout without policy calls".into(),
            ));
        }
        let (lp, old) = call_logps(&self.phi, &calls, device)?;
        let ft = old.len() / calls.len();
        // Sum each rollout's rows through a 0/1 segment matrix [n, rows].
        let rows = calls.len() * ft;
        let mut seg = vec![0f32; rollouts.len() * rows];
        let mut start = 0;
        for (i, r) in rollouts.iter().enumerate() {
            for c in start..start + r.len() * ft {
                seg[i * rows + c] = 1.0;
            }
            start += r.len() * ft;
        }
        let n = rollouts.len();
        let seg = Tensor::<B, 2>::from_data(TensorData::new(seg, [n, rows]), device);
        let old_sum: Vec<f32> = rollouts
            .iter()
            .scan(0, |at, r| {
                let s: f32 = old[*at..*at + r.len() * ft].iter().sum();
                *at += r.len() * ft;
                Some(s)
            })
            .collect();
        let old_sum = Tensor::<B, 1>::from_data(TensorData::new(old_sum, [n]), device);
        Ok(seg.matmul(lp.reshape([rows, 1])).reshape([n]) - old_sum)
    }
}

/// Log-probs of the fine-tuned chain steps of `calls` under `policy`, rows ordered call-major
/// ([calls x K']), and the matching old log-probs.
fn call_logps<B: Backend>(
    policy: &Policy<B>,
    calls: &[ChainCall<'_>],
    device: &B::Device,
) -> Result<(Tensor<B, 1>, Vec<f32>), RewardError> {
    let k = policy.chain_len();
    let ft = policy.process().map_or(1, |p| p.ft_steps());
    let [tp, da] = policy.chunk();
    let per = tp * da;
    let n = calls.len() * ft;
    let mut text: Option<Vec<String>> = None;
    let (mut state, mut image, mut x, mut next, mut steps, mut old) = (
        Vec::new(),
        None::<Vec<u8>>,
        Vec::with_capacity(n * per),
        Vec::with_capacity(n * per),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for (i, c) in calls.iter().enumerate() {
        if c.chain.len() != (k + 1) * per || c.old_logp.len() != k {
            return Err(RewardError::Shape {
                what: format!("implicit PRM: policy call {i}"),
                expected: format!("a chain of {} values and {k} log-probs", (k + 1) * per),
                got: format!(
                    "{} values and {} log-probs",
                    c.chain.len(),
                    c.old_logp.len()
                ),
            });
        }
        for step in k - ft..k {
            state.extend_from_slice(c.state);
            if let Some(img) = c.image {
                image.get_or_insert_with(Vec::new).extend_from_slice(img);
            }
            if let Some(t) = c.text {
                text.get_or_insert_with(Vec::new).push(t.to_owned());
            }
            x.extend_from_slice(&c.chain[step * per..(step + 1) * per]);
            next.extend_from_slice(&c.chain[(step + 1) * per..(step + 2) * per]);
            steps.push(step);
            old.push(c.old_logp[step]);
        }
    }
    let obs = policy
        .obs_tensors(
            &ObsBatch {
                batch: n,
                state,
                image,
                text,
            },
            device,
        )
        .map_err(|e| RewardError::Data(format!("implicit PRM: {e}")))?;
    let x = Tensor::from_data(TensorData::new(x, [n, tp, da]), device);
    let next = Tensor::from_data(TensorData::new(next, [n, tp, da]), device);
    Ok((policy.pair_logprobs(&obs, x, next, &steps), old))
}

#[cfg(test)]
mod tests {
    use diffrl_core::normalize::Normalizer;
    use diffrl_core::seeding::rng;
    use diffrl_policy::config::{DenoiserConfig, DiffusionConfig, PolicyConfig};
    use diffrl_policy::{Normalizers, PolicySpec, SampleMode};

    use super::*;

    type B = diffrl_policy::CpuBackend;
    type Ad = diffrl_policy::CpuAutodiff;

    /// A small diffusion policy (To 2, Ds 3, Tp 4, Ta 2, Da 2, K = 4) fine-tuning K' = 2.
    fn policy() -> Policy<B> {
        let config = PolicyConfig {
            obs_horizon: 2,
            pred_horizon: 4,
            action_horizon: 2,
            denoiser: DenoiserConfig {
                hidden: 16,
                blocks: 1,
                step_embed_dim: 8,
                ..DenoiserConfig::default()
            },
            diffusion: DiffusionConfig {
                train_steps: 8,
                denoising_steps: 4,
                ft_denoising_steps: 2,
                ..DiffusionConfig::default()
            },
            ..PolicyConfig::default()
        };
        let spec = PolicySpec::flat(3, 2);
        let norm = Normalizers {
            state: Normalizer::MinMax {
                min: vec![0.0; 3],
                max: vec![10.0; 3],
            },
            action: Normalizer::MinMax {
                min: vec![0.0; 2],
                max: vec![100.0; 2],
            },
        };
        Policy::new(config, spec, norm, 7, &Default::default()).unwrap()
    }

    /// Owned policy calls: `n` rollouts of `calls` calls each, sampled from `policy`.
    struct Calls {
        state: Vec<Vec<f32>>,
        chain: Vec<Vec<f32>>,
        logp: Vec<Vec<f32>>,
    }

    fn sample(policy: &Policy<B>, n: usize, seed: u64) -> Calls {
        let obs = ObsBatch {
            batch: n,
            state: (0..n * 6)
                .map(|i| ((i * 7 + seed as usize) % 11) as f32 * 0.9)
                .collect(),
            image: None,
            text: None,
        };
        let act = policy
            .act(
                None,
                &obs,
                SampleMode::Stochastic,
                true,
                &mut rng(seed),
                &Default::default(),
            )
            .unwrap();
        let chain: Vec<f32> = act.sample.chain.unwrap().into_data().to_vec().unwrap();
        let logp: Vec<f32> = act.sample.logp.unwrap().into_data().to_vec().unwrap();
        let (pc, pl) = (chain.len() / n, logp.len() / n);
        Calls {
            state: obs.state.chunks(6).map(<[f32]>::to_vec).collect(),
            chain: chain.chunks(pc).map(<[f32]>::to_vec).collect(),
            logp: logp.chunks(pl).map(<[f32]>::to_vec).collect(),
        }
    }

    impl Calls {
        fn view(&self) -> Vec<ChainCall<'_>> {
            (0..self.state.len())
                .map(|i| ChainCall {
                    state: &self.state[i],
                    image: None,
                    text: None,
                    chain: &self.chain[i],
                    old_logp: &self.logp[i],
                })
                .collect()
        }
    }

    #[test]
    fn rewards_are_zero_before_training_and_favour_the_preferred_rollouts_after() {
        let p = policy();
        // 2 groups of 4 rollouts, 3 calls each.
        let data = sample(&p, 24, 1);
        let calls = data.view();
        let rollouts: Vec<&Trajectory<'_>> = calls.chunks(3).collect();
        let outcomes = [1.0, 0.2, 0.0, 0.5, 0.0, 0.0, 1.0, 0.3];
        let mut prm = ImplicitPrm::<Ad>::new(
            &p,
            ImplicitPrmConfig {
                lr: 1e-3,
                ..ImplicitPrmConfig::default()
            },
        )
        .unwrap();
        // pi_phi = pi_old: every log-ratio is 0.
        for r in &rollouts {
            for v in prm.call_rewards(r).unwrap() {
                assert!(v.abs() < 1e-4, "{v}");
            }
        }
        let first = prm.update(&rollouts, &outcomes, 4).unwrap();
        // Group 0: 6 ranked pairs; group 1: (1.0 > 0.3 > 0.0 = 0.0) gives 5.
        assert_eq!(first.pairs, 11);
        assert_eq!(first.unranked_groups, 0);
        // log 2 for group 0; group 1 is scored after group 0's step.
        assert!(
            (first.loss - std::f64::consts::LN_2).abs() < 0.01,
            "{first:?}"
        );
        let mut last = first;
        for _ in 0..30 {
            last = prm.update(&rollouts, &outcomes, 4).unwrap();
        }
        assert!(last.loss < first.loss - 0.1, "{first:?} -> {last:?}");
        assert!(last.accuracy > 0.99, "{last:?}");
        let sums: Vec<f64> = rollouts
            .iter()
            .map(|r| prm.call_rewards(r).unwrap().iter().sum())
            .collect();
        // The best rollout of each group now earns more than the worst.
        assert!(sums[0] > sums[2], "{sums:?}");
        assert!(sums[6] > sums[4] && sums[6] > sums[5], "{sums:?}");
    }

    #[test]
    fn state_round_trips_and_groups_without_a_ranking_leave_it_unchanged() {
        let p = policy();
        let data = sample(&p, 8, 2);
        let calls = data.view();
        let rollouts: Vec<&Trajectory<'_>> = calls.chunks(2).collect();
        let cfg = ImplicitPrmConfig {
            lr: 1e-3,
            ..ImplicitPrmConfig::default()
        };
        let mut prm = ImplicitPrm::<Ad>::new(&p, cfg.clone()).unwrap();
        let tie = prm.update(&rollouts, &[0.5; 4], 2).unwrap();
        assert_eq!((tie.pairs, tie.unranked_groups), (0, 2));
        assert!(
            prm.call_rewards(rollouts[0])
                .unwrap()
                .iter()
                .all(|v| v.abs() < 1e-4)
        );
        prm.update(&rollouts, &[1.0, 0.0, 0.0, 1.0], 2).unwrap();
        let [model, optim] = prm.state_bytes().unwrap();
        let mut copy = ImplicitPrm::<Ad>::new(&p, cfg).unwrap();
        copy.load_state(model, optim).unwrap();
        for r in &rollouts {
            assert_eq!(prm.call_rewards(r).unwrap(), copy.call_rewards(r).unwrap());
        }
        // The optimiser state came along: the next update matches too.
        prm.update(&rollouts, &[1.0, 0.0, 0.0, 1.0], 2).unwrap();
        copy.update(&rollouts, &[1.0, 0.0, 0.0, 1.0], 2).unwrap();
        assert_eq!(
            prm.call_rewards(rollouts[1]).unwrap(),
            copy.call_rewards(rollouts[1]).unwrap()
        );
    }

    #[test]
    fn bad_input_is_named() {
        let p = policy();
        let data = sample(&p, 4, 3);
        let calls = data.view();
        let rollouts: Vec<&Trajectory<'_>> = calls.chunks(2).collect();
        let mut prm = ImplicitPrm::<Ad>::new(&p, ImplicitPrmConfig::default()).unwrap();
        let e = prm.update(&rollouts, &[1.0, f64::NAN], 2).unwrap_err();
        assert!(e.to_string().contains("outcome"), "{e}");
        let e = prm.update(&rollouts, &[1.0], 2).unwrap_err();
        assert!(e.to_string().contains("2 rollouts, 1 outcomes"), "{e}");
        let mut short = calls[0];
        short.chain = &short.chain[..3];
        let e = prm.call_rewards(&[short]).unwrap_err();
        assert!(e.to_string().contains("policy call 0"), "{e}");
        for (bad, field) in [
            (
                ImplicitPrmConfig {
                    beta: 0.0,
                    ..Default::default()
                },
                "beta",
            ),
            (
                ImplicitPrmConfig {
                    lr: f64::NAN,
                    ..Default::default()
                },
                "lr",
            ),
            (
                ImplicitPrmConfig {
                    epochs: 0,
                    ..Default::default()
                },
                "epochs",
            ),
        ] {
            let e = ImplicitPrm::<Ad>::new(&p, bad).err().unwrap();
            assert!(e.to_string().contains(field), "{e}");
        }
    }
}
