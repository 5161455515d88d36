//! The hop model (Robo-Dopamine-style; docs/algorithms.md §4): H(s_p, s_q) in [-1, 1] predicts the
//! progress gained from s_p to s_q, trained on pairs of states of the same demonstration with
//! target p_q - p_p (the progress labels). Fused progress along a trajectory averages three
//! estimates:
//!
//! - incremental: Phi(s_0) + sum_{k<t} H(s_k, s_{k+1});
//! - forward-anchored: Phi(s_0) + H(s_0, s_t);
//! - backward-anchored: 1 - mean_g H(s_t, g) over goal anchors g (final states of successful
//!   training demonstrations);
//!
//! each clamped to [0, 1]; Phi(s_0) is the progress model's estimate of the first state.

use burn::module::{AutodiffModule, Module};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use diffrl_core::episode::Episode;
use diffrl_core::normalize::Normalizer;
use diffrl_core::seeding::rng;
use diffrl_policy::nn::Mlp;
use diffrl_policy::seeded_init;
use rand::Rng as _;

use crate::error::RewardError;

/// Pairwise MLP with a tanh head.
#[derive(Module, Debug)]
pub struct HopNet<B: Backend> {
    mlp: Mlp<B>,
}

impl<B: Backend> HopNet<B> {
    fn new(state_dim: usize, hidden: &[usize], device: &B::Device) -> Self {
        Self {
            mlp: crate::scalar_mlp(2 * state_dim, hidden, device),
        }
    }

    /// [B, 2D] (normalised s_p then s_q) -> [B] in (-1, 1).
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 1> {
        let b = x.dims()[0];
        self.mlp.forward(x).tanh().reshape([b])
    }
}

/// A trained hop model with its goal anchors.
pub struct HopModel<B: Backend> {
    net: HopNet<B>,
    device: B::Device,
    norm: Normalizer,
    state_dim: usize,
    anchors: Vec<Vec<f32>>,
}

/// One trajectory's fused progress and its three parts.
#[derive(Debug, Clone, PartialEq)]
pub struct Fused {
    /// mean of the three, per state.
    pub fused: Vec<f64>,
    /// Incremental estimate.
    pub incremental: Vec<f64>,
    /// Forward-anchored estimate.
    pub forward: Vec<f64>,
    /// Backward-anchored estimate.
    pub backward: Vec<f64>,
}

impl<B: Backend> HopModel<B> {
    /// H for pairs of raw states; non-finite outputs are errors naming the pair.
    pub fn hop(&self, pairs: &[(&[f32], &[f32])]) -> Result<Vec<f64>, RewardError> {
        if pairs.is_empty() {
            return Ok(Vec::new());
        }
        let d = self.state_dim;
        let mut flat = Vec::with_capacity(pairs.len() * 2 * d);
        for (i, (p, q)) in pairs.iter().enumerate() {
            for s in [p, q] {
                if s.len() != d {
                    return Err(RewardError::Shape {
                        what: format!("pair {i} of the batch"),
                        expected: format!("{d} state values"),
                        got: format!("{}", s.len()),
                    });
                }
                let mut row = s.to_vec();
                self.norm.normalize(&mut row);
                flat.extend(row);
            }
        }
        let x =
            Tensor::<B, 2>::from_data(TensorData::new(flat, [pairs.len(), 2 * d]), &self.device);
        let v: Vec<f32> = self
            .net
            .forward(x)
            .into_data()
            .convert::<f32>()
            .into_vec()
            .map_err(|e| RewardError::Data(format!("reading hops back: {e:?}")))?;
        v.iter()
            .enumerate()
            .map(|(i, &h)| {
                if h.is_finite() {
                    Ok(f64::from(h))
                } else {
                    Err(RewardError::NonFinite {
                        what: "hop".into(),
                        index: i,
                        value: h,
                    })
                }
            })
            .collect()
    }

    /// Fused progress along `states`, starting from `phi0` = Phi(s_0).
    pub fn fuse(&self, states: &[&[f32]], phi0: f64) -> Result<Fused, RewardError> {
        let n = states.len();
        if n == 0 {
            return Ok(Fused {
                fused: vec![],
                incremental: vec![],
                forward: vec![],
                backward: vec![],
            });
        }
        let steps: Vec<(&[f32], &[f32])> = states.windows(2).map(|w| (w[0], w[1])).collect();
        let inc_h = self.hop(&steps)?;
        let mut incremental = Vec::with_capacity(n);
        let mut acc = phi0;
        incremental.push(acc.clamp(0.0, 1.0));
        for h in inc_h {
            acc += h;
            incremental.push(acc.clamp(0.0, 1.0));
        }
        let fwd_pairs: Vec<(&[f32], &[f32])> = states.iter().map(|s| (states[0], *s)).collect();
        let forward: Vec<f64> = self
            .hop(&fwd_pairs)?
            .into_iter()
            .enumerate()
            .map(|(t, h)| if t == 0 { phi0 } else { phi0 + h }.clamp(0.0, 1.0))
            .collect();
        let mut backward = vec![0.0; n];
        for g in &self.anchors {
            let pairs: Vec<(&[f32], &[f32])> = states.iter().map(|s| (*s, g.as_slice())).collect();
            for (b, h) in backward.iter_mut().zip(self.hop(&pairs)?) {
                *b += (1.0 - h) / self.anchors.len() as f64;
            }
        }
        let backward: Vec<f64> = backward.into_iter().map(|b| b.clamp(0.0, 1.0)).collect();
        let fused = (0..n)
            .map(|t| (incremental[t] + forward[t] + backward[t]) / 3.0)
            .collect();
        Ok(Fused {
            fused,
            incremental,
            forward,
            backward,
        })
    }
}

/// Trains a hop model on labelled trajectories (`labels[i]` for `episodes[i]`, None = unused):
/// half the pairs are consecutive states (what the incremental estimate sums), half random
/// pairs of the same trajectory in either order. Goal anchors: the last states of up to 16
/// successful trajectories.
#[allow(clippy::too_many_arguments)]
pub fn train<B: AutodiffBackend>(
    episodes: &[&Episode],
    labels: &[Option<Vec<f32>>],
    norm: &Normalizer,
    hidden: &[usize],
    steps: usize,
    batch_size: usize,
    lr: f64,
    seed: u64,
    device: &B::Device,
) -> Result<HopModel<B::InnerBackend>, RewardError> {
    let trajs: Vec<(&Episode, &Vec<f32>)> = episodes
        .iter()
        .zip(labels)
        .filter_map(|(e, l)| l.as_ref().filter(|l| l.len() >= 2).map(|l| (*e, l)))
        .collect();
    if trajs.is_empty() {
        return Err(RewardError::Data(
            "no labelled trajectories of 2+ states for the hop model".into(),
        ));
    }
    let state_dim = norm.dim();
    let normed: Vec<Vec<Vec<f32>>> = trajs
        .iter()
        .map(|(e, _)| {
            e.observations
                .iter()
                .map(|o| {
                    let mut r = o.state.clone();
                    norm.normalize(&mut r);
                    r
                })
                .collect()
        })
        .collect();
    let anchors: Vec<Vec<f32>> = trajs
        .iter()
        .filter(|(e, _)| e.success())
        .take(16)
        .filter_map(|(e, _)| e.observations.last().map(|o| o.state.clone()))
        .collect();
    let mut net: HopNet<B> =
        seeded_init::<B, _>(device, seed, || HopNet::new(state_dim, hidden, device));
    let mut optim = AdamWConfig::new().init::<B, HopNet<B>>();
    let mut r = rng(seed ^ 0x4077);
    for step in 0..steps {
        let mut x: Vec<f32> = Vec::with_capacity(batch_size * 2 * state_dim);
        let mut y = Vec::with_capacity(batch_size);
        for k in 0..batch_size {
            let i = r.random_range(0..trajs.len());
            let l = trajs[i].1;
            let n = l.len();
            let (p, q) = if k % 2 == 0 {
                let p = r.random_range(0..n - 1);
                (p, p + 1)
            } else {
                (r.random_range(0..n), r.random_range(0..n))
            };
            x.extend(&normed[i][p]);
            x.extend(&normed[i][q]);
            y.push(l[q] - l[p]);
        }
        let xt = Tensor::<B, 2>::from_data(TensorData::new(x, [batch_size, 2 * state_dim]), device);
        let yt = Tensor::<B, 1>::from_data(TensorData::new(y, [batch_size]), device);
        let loss = (net.forward(xt) - yt).square().mean();
        let lv: f64 = loss.clone().into_scalar().elem();
        if !lv.is_finite() {
            return Err(RewardError::Data(format!(
                "the hop loss became {lv} at step {step}"
            )));
        }
        let grads = GradientsParams::from_grads(loss.backward(), &net);
        net = optim.step(lr, net, grads);
    }
    Ok(HopModel {
        net: net.valid(),
        device: device.clone(),
        norm: norm.clone(),
        state_dim,
        anchors,
    })
}
