//! The joint multi-agent planner (docs/policy.md, "The joint planner"): a denoiser over the
//! action chunks of all agents at once, one token per agent.
//!
//! ```text
//! obs     = cond reshaped to [B, N agents, To, block]         (the normalised state history)
//! agent_i = Linear([x_t of agent i (Tp x Da), own values of agent i (To x E)]) + Agent[i]
//! ent_ij  = Mlp_g(record j of agent i's group g (To x width)) + Slot_g[j]
//! c       = act(StepEmbedding(t))
//! per block, with (shift, scale, gate) = Linear_zero(c) for each sub-layer (AdaLN-Zero):
//!   agent_i += gate_1 * CrossAttention(norm(agent_i) * (1 + scale_1) + shift_1, ent_i*)
//!   agent   += gate_2 * SelfAttention over the N agents (norm(agent) * (1 + scale_2) + shift_2)
//!   agent   += gate_3 * Mlp(norm(agent) * (1 + scale_3) + shift_3)
//! eps_i   = Linear(norm(agent_i) * (1 + scale_f) + shift_f)     -> Tp x Da, stacked per step
//! ```
//!
//! `norm` is a layer norm without affine parameters. The modulation layers start at zero, so
//! every block starts as the identity (Peebles and Xie's AdaLN-Zero). Each agent reads its own
//! entity tokens (the lanes and vehicles of its agent-centric block, a map cross-attention in
//! the sense of scene-conditioned planners) and the other agents through self-attention, which
//! is what lets the planner coordinate them. Nothing here knows the task: the layout comes
//! from the environment's observation space.

use burn::module::{Initializer, Module, Param};
use burn::nn::attention::{MultiHeadAttention, MultiHeadAttentionConfig};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use diffrl_core::space::EntityGroup;

use crate::config::{Activation, DenoiserConfig};
use crate::nn::{Mlp, StepEmbedding, activate};

/// What the planner reads: how many agents share the state and action vectors, the history
/// length, and the layout of each agent's block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLayout {
    /// Agents N.
    pub agents: usize,
    /// Observation horizon To.
    pub obs_horizon: usize,
    /// Width of one agent's block of a state observation.
    pub block: usize,
    /// Width of one agent's action.
    pub action: usize,
    /// Entity records inside each block.
    pub entities: Vec<EntityGroup>,
}

impl AgentLayout {
    /// Indices of a block's values outside every entity group: the agent's own state.
    pub fn own_values(&self) -> Vec<usize> {
        (0..self.block)
            .filter(|&i| {
                !self
                    .entities
                    .iter()
                    .any(|g| (g.offset..g.end()).contains(&i))
            })
            .collect()
    }
}

/// Encoder of one entity group: a shared MLP over each record's history, plus a learned
/// embedding of the record's slot (left lane, own lane, nearest vehicle, ...).
#[derive(Module, Debug)]
struct EntityEncoder<B: Backend> {
    mlp: Mlp<B>,
    slots: Param<Tensor<B, 2>>,
    #[module(skip)]
    group: (usize, usize, usize),
}

/// One block: cross-attention to the entities, self-attention across agents, an MLP, each
/// under its AdaLN-Zero modulation.
#[derive(Module, Debug)]
struct PlannerBlock<B: Backend> {
    modulation: Linear<B>,
    cross: Option<MultiHeadAttention<B>>,
    mix: MultiHeadAttention<B>,
    ff_in: Linear<B>,
    ff_out: Linear<B>,
}

/// The joint planner's network (see the module documentation).
#[derive(Module, Debug)]
pub struct JointPlanner<B: Backend> {
    step: StepEmbedding<B>,
    input: Linear<B>,
    agent_embedding: Param<Tensor<B, 2>>,
    entities: Vec<EntityEncoder<B>>,
    blocks: Vec<PlannerBlock<B>>,
    final_modulation: Linear<B>,
    output: Linear<B>,
    #[module(skip)]
    act: Activation,
    /// [N, To, block, Da, d_model].
    #[module(skip)]
    dims: [usize; 5],
    #[module(skip)]
    own: Vec<usize>,
}

fn zero_linear<B: Backend>(i: usize, o: usize, device: &B::Device) -> Linear<B> {
    LinearConfig::new(i, o)
        .with_initializer(Initializer::Zeros)
        .init(device)
}

fn embedding<B: Backend>(rows: usize, d: usize, device: &B::Device) -> Param<Tensor<B, 2>> {
    Initializer::Normal {
        mean: 0.0,
        std: 0.02,
    }
    .init([rows, d], device)
}

fn attention<B: Backend>(d: usize, heads: usize, device: &B::Device) -> MultiHeadAttention<B> {
    MultiHeadAttentionConfig::new(d, heads)
        .with_dropout(0.0)
        .init(device)
}

/// Layer norm over the last dimension without affine parameters.
fn norm<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
    let (var, mean) = x.clone().var_mean_bias(1);
    (x - mean) / (var + 1e-6).sqrt()
}

/// Columns `[from, from + width)` of `linear`'s output, computed alone (one product with a
/// slice of the weight): [B, in] -> [B, width], contiguous.
fn linear_columns<B: Backend>(
    linear: &Linear<B>,
    x: Tensor<B, 2>,
    from: usize,
    width: usize,
) -> Tensor<B, 2> {
    let y = x.matmul(linear.weight.val().narrow(1, from, width));
    match &linear.bias {
        Some(bias) => y + bias.val().narrow(0, from, width).unsqueeze_dim(0),
        None => y,
    }
}

/// [blocks rows, blocks]: row `i rows + r` is one-hot at column i.
fn block_rows<B: Backend>(blocks: usize, rows: usize, device: &B::Device) -> Tensor<B, 2> {
    let mut pick = vec![0.0f32; blocks * rows * blocks];
    for (row, value) in pick.chunks_exact_mut(blocks).enumerate() {
        value[row / rows] = 1.0;
    }
    Tensor::from_data(TensorData::new(pick, [blocks * rows, blocks]), device)
}

/// `x * factor` for agent-major rows ([N B, d], agent i's rows `i B..(i + 1) B`) and a
/// per-sample [B, d] `factor`, shared by the agents.
fn per_sample<B: Backend>(x: Tensor<B, 2>, factor: Tensor<B, 2>, add: bool) -> Tensor<B, 2> {
    let [rows, d] = x.dims();
    let b = factor.dims()[0];
    let (x, f) = (x.reshape([rows / b, b * d]), factor.reshape([1, b * d]));
    if add { x + f } else { x * f }.reshape([rows, d])
}

/// x * (1 + scale) + shift on agent-major rows, with [B, d] modulations.
fn modulate<B: Backend>(x: Tensor<B, 2>, shift: Tensor<B, 2>, scale: Tensor<B, 2>) -> Tensor<B, 2> {
    per_sample(per_sample(x, scale + 1.0, false), shift, true)
}

/// `rows`-row block `i` of `t` as [rows heads, d_k]: one head's values per row.
fn heads<B: Backend>(t: &Tensor<B, 2>, i: usize, rows: usize, dk: usize) -> Tensor<B, 2> {
    let d = t.dims()[1];
    t.clone()
        .narrow(0, i * rows, rows)
        .reshape([rows * d / dk, dk])
}

/// One query's attention over its context blocks, on [rows heads, d_k] heads: the scaled
/// scores, their softmax over the blocks, and the weighted sum of the values.
fn mix<B: Backend>(
    q: Tensor<B, 2>,
    keys: &[Tensor<B, 2>],
    values: &[Tensor<B, 2>],
    scale: f32,
) -> Tensor<B, 2> {
    let scores: Vec<Tensor<B, 2>> = keys
        .iter()
        .map(|kj| (q.clone() * kj.clone()).sum_dim(1).mul_scalar(scale))
        .collect();
    let max = scores[1..]
        .iter()
        .fold(scores[0].clone(), |m, s| m.max_pair(s.clone()))
        .detach();
    let exps: Vec<Tensor<B, 2>> = scores
        .into_iter()
        .map(|s| (s - max.clone()).exp())
        .collect();
    let total = exps[1..].iter().fold(exps[0].clone(), |a, e| a + e.clone());
    exps.into_iter()
        .zip(values)
        .map(|(e, vj)| vj.clone() * (e / total.clone()))
        .reduce(|a, b| a + b)
        .expect("at least one context block")
}

/// [`attend`] on stacked blocks, for the forward pass alone (sampling, evaluation, serving):
/// `queries` holds Q blocks of `rows` rows, `context` L blocks, and row r of each query block
/// attends to row r of every context block ([Q rows, d], [L rows, d] -> [Q rows, d]). The agents' self-attention
/// is N blocks attending to the same N; the entity cross-attention one block (all agents'
/// rows) attending to one block per entity slot.
///
/// The blocks are cut out of the projections (`narrow`), which is free here; in training each
/// cut's gradient is a zeroed tensor the size of the whole, so [`JointPlanner::forward`] takes
/// [`attend`] and [`attend_stacked`] there. All three compute the same bits.
fn attend_views<B: Backend>(
    mha: &MultiHeadAttention<B>,
    queries: Tensor<B, 2>,
    context: Tensor<B, 2>,
    rows: usize,
) -> Tensor<B, 2> {
    let dk = mha.d_k;
    let scale = 1.0 / (dk as f32).sqrt();
    let (nq, nk) = (queries.dims()[0] / rows, context.dims()[0] / rows);
    let q = mha.query.forward(queries);
    let k = mha.key.forward(context.clone());
    let v = mha.value.forward(context);
    let d = q.dims()[1];
    let keys: Vec<_> = (0..nk).map(|j| heads(&k, j, rows, dk)).collect();
    let values: Vec<_> = (0..nk).map(|j| heads(&v, j, rows, dk)).collect();
    let mixed = (0..nq)
        .map(|i| mix(heads(&q, i, rows, dk), &keys, &values, scale).reshape([rows, d]))
        .collect();
    mha.output.forward(Tensor::cat(mixed, 0))
}

/// Burn's `MultiHeadAttention::forward` without masks or dropout (the planner uses neither), on
/// the module's own weights, for attention between blocks of rows: each of the `queries`
/// blocks and of the `context` blocks is [rows, d], and row r of a query block attends to row
/// r of every context block. The agents' self-attention is N blocks (one per agent)
/// attending to the same N; an agent's entity cross-attention its one block attending to one
/// block per entity slot.
///
/// Burn's version runs every projection, and each head's score and context products, as one
/// small matrix product per sample on the CPU backend, after copying the heads into place
/// element by element; with a handful of tokens, that fixed cost was most of the planner's
/// time. Here the projections are 2-D products, one per block, and the scores and weighted
/// sums are element-wise products over [rows heads, d_k], one per pair of blocks. The blocks
/// come in as separate tensors: cutting them out of one (`narrow`) costs a zeroed tensor the
/// size of the whole in the backward pass, per cut. Same arithmetic up to the order of the
/// sums; the checkpoints are unchanged.
fn attend<B: Backend>(
    mha: &MultiHeadAttention<B>,
    queries: &[Tensor<B, 2>],
    context: &[Tensor<B, 2>],
) -> Vec<Tensor<B, 2>> {
    let dk = mha.d_k;
    let scale = 1.0 / (dk as f32).sqrt();
    // [rows, d] -> [rows heads, d_k]: one head's values per row.
    let heads = |t: Tensor<B, 2>| {
        let [rows, d] = t.dims();
        t.reshape([rows * d / dk, dk])
    };
    let k: Vec<_> = context
        .iter()
        .map(|c| heads(mha.key.forward(c.clone())))
        .collect();
    let v: Vec<_> = context
        .iter()
        .map(|c| heads(mha.value.forward(c.clone())))
        .collect();
    queries
        .iter()
        .map(|query| {
            let dims = query.dims();
            let q = heads(mha.query.forward(query.clone()));
            let mixed = mix(q, &k, &v, scale);
            mha.output.forward(mixed.reshape(dims))
        })
        .collect()
}

/// [`attend`] for one query block [R, d] and L context blocks stacked as [L R, d] (the entity
/// tokens, slot-major): the scores and weighted sums as products of [L, R d] by [1, R d]
/// rows, which the CPU backend broadcasts fastest, and sums over the slot axis, so that no
/// block is cut out. Same arithmetic as [`attend`] up to the order of the sums.
fn attend_stacked<B: Backend>(
    mha: &MultiHeadAttention<B>,
    query: Tensor<B, 2>,
    context: Tensor<B, 2>,
) -> Tensor<B, 2> {
    let [rows, d] = query.dims();
    let l = context.dims()[0] / rows;
    let dk = mha.d_k;
    let r = rows * d / dk;
    let scale = 1.0 / (dk as f32).sqrt();
    let q = mha.query.forward(query).reshape([1, r * dk]);
    let k = mha.key.forward(context.clone()).reshape([l, r * dk]);
    let v = mha.value.forward(context).reshape([l * r, dk]);
    // [L, rows heads]: softmax over the context blocks.
    let scores = (k * q)
        .reshape([l * r, dk])
        .sum_dim(1)
        .reshape([l, r])
        .mul_scalar(scale);
    let max = scores.clone().max_dim(0).detach();
    let exps = (scores - max).exp();
    let total = exps.clone().sum_dim(0);
    let weights = (exps / total).reshape([l * r, 1]);
    let mixed = (v * weights).reshape([l, r * dk]).sum_dim(0);
    mha.output.forward(mixed.reshape([rows, d]))
}

impl<B: Backend> JointPlanner<B> {
    /// A planner for chunks of `pred_horizon` actions of the agents in `layout`.
    pub fn new(
        pred_horizon: usize,
        layout: &AgentLayout,
        cfg: &DenoiserConfig,
        device: &B::Device,
    ) -> Self {
        let p = &cfg.planner;
        let (d, to, e) = (p.d_model, layout.obs_horizon, cfg.step_embed_dim);
        let own = layout.own_values();
        let entities = layout
            .entities
            .iter()
            .map(|g| EntityEncoder {
                mlp: Mlp::new(&[to * g.width, d, d], cfg.activation, device),
                slots: embedding(g.count, d, device),
                group: (g.offset, g.width, g.count),
            })
            .collect::<Vec<_>>();
        let has_entities = !entities.is_empty();
        Self {
            step: StepEmbedding::new(e, cfg.activation, device),
            input: LinearConfig::new(pred_horizon * layout.action + to * own.len(), d).init(device),
            agent_embedding: embedding(layout.agents, d, device),
            entities,
            blocks: (0..p.layers)
                .map(|_| PlannerBlock {
                    modulation: zero_linear(e, 9 * d, device),
                    cross: has_entities.then(|| attention(d, p.heads, device)),
                    mix: attention(d, p.heads, device),
                    ff_in: LinearConfig::new(d, p.ff_dim).init(device),
                    ff_out: LinearConfig::new(p.ff_dim, d).init(device),
                })
                .collect(),
            final_modulation: zero_linear(e, 2 * d, device),
            output: LinearConfig::new(d, pred_horizon * layout.action).init(device),
            act: cfg.activation,
            dims: [layout.agents, to, layout.block, layout.action, d],
            own,
        }
    }

    /// Indices of an agent block's own values (outside every entity group), for `select`.
    fn own_index(&self, device: &B::Device) -> Tensor<B, 1, Int> {
        let own: Vec<i64> = self.own.iter().map(|&i| i as i64).collect();
        Tensor::from_data(TensorData::new(own, [self.own.len()]), device)
    }

    /// x: [B, Tp, N Da], t: [B], cond: [B, To N block] (the normalised state history, agents'
    /// blocks stacked per observation) -> predicted noise [B, Tp, N Da].
    ///
    /// Inside, every tensor is 2-D with one row per agent and sample, agent-major (agent i's
    /// rows are `i B..(i + 1) B`), and entity tokens are slot-major: the layouts Burn's CPU
    /// backend runs fastest.
    pub fn forward(&self, x: Tensor<B, 3>, t: Tensor<B, 1>, cond: Tensor<B, 2>) -> Tensor<B, 3> {
        let [n, to, block, da, d] = self.dims;
        let [b, tp, _] = x.dims();
        let device = x.device();
        // [N, B, To, block]
        let obs = cond.reshape([b, to, n, block]).permute([2, 0, 1, 3]);
        let own = obs
            .clone()
            .select(3, self.own_index(&device))
            .reshape([n * b, to * self.own.len()]);
        let chunk = x
            .reshape([b, tp, n, da])
            .permute([2, 0, 1, 3])
            .reshape([n * b, tp * da]);
        let input = self.input.forward(Tensor::cat(vec![chunk, own], 1));
        let agents = self.agent_embedding.val();
        // Whether a backward pass can follow (the weights track gradients): the forward pass
        // then cuts no blocks out of tensors that train, since the gradient of each cut is a
        // zeroed tensor the size of the whole (see [`attend_views`]). Both ways give the same
        // bits; without a backward pass, cuts are free views and the broadcasts that replace
        // them cost more.
        let training = self.input.weight.val().is_require_grad();
        // Row `i rows + r` of `x` plus row i of `emb` (an agent's or an entity slot's).
        let embed = |x: Tensor<B, 2>, emb: Tensor<B, 2>, blocks: usize, rows: usize| {
            if training {
                // As the product of one-hot rows and `emb`, whose gradient is a product too:
                // the CPU backend walks a [blocks, 1, d] broadcast over [blocks, rows, d], and
                // its gradient's sum, element by element (6% of the roundabout planner's GRPO time).
                x + block_rows(blocks, rows, &device).matmul(emb)
            } else {
                let each = (0..blocks)
                    .map(|i| x.clone().narrow(0, i * rows, rows) + emb.clone().narrow(0, i, 1));
                Tensor::cat(each.collect(), 0)
            }
        };
        let mut h = embed(input, agents, n, b);
        // [slots x N B, d]
        let tokens = (!self.entities.is_empty()).then(|| {
            let mut slots = Vec::new();
            for enc in &self.entities {
                let (offset, width, count) = enc.group;
                let records = obs
                    .clone()
                    .narrow(3, offset, width * count)
                    .reshape([n, b, to, count, width])
                    .permute([3, 0, 1, 2, 4])
                    .reshape([count * n * b, to * width]);
                slots.push(embed(
                    enc.mlp.forward(records),
                    enc.slots.val(),
                    count,
                    n * b,
                ));
            }
            Tensor::cat(slots, 0)
        });
        let c = activate(self.act, self.step.forward(t));
        for blk in &self.blocks {
            let part = |i: usize| linear_columns(&blk.modulation, c.clone(), i * d, d);
            if let (Some(cross), Some(tokens)) = (&blk.cross, &tokens) {
                let q = modulate(norm(h.clone()), part(0), part(1));
                let ctx = if training {
                    attend_stacked(cross, q, tokens.clone())
                } else {
                    attend_views(cross, q, tokens.clone(), n * b)
                };
                h = h + per_sample(ctx, part(2), false);
            }
            let a = modulate(norm(h.clone()), part(3), part(4));
            let mixed = if training {
                let blocks: Vec<_> = (0..n).map(|i| a.clone().narrow(0, i * b, b)).collect();
                Tensor::cat(attend(&blk.mix, &blocks, &blocks), 0)
            } else {
                attend_views(&blk.mix, a.clone(), a, b)
            };
            h = h + per_sample(mixed, part(5), false);
            let f = modulate(norm(h.clone()), part(6), part(7));
            let ff = blk.ff_out.forward(activate(self.act, blk.ff_in.forward(f)));
            h = h + per_sample(ff, part(8), false);
        }
        let shift = linear_columns(&self.final_modulation, c.clone(), 0, d);
        let scale = linear_columns(&self.final_modulation, c, d, d);
        self.output
            .forward(modulate(norm(h), shift, scale))
            .reshape([n, b, tp, da])
            .permute([1, 2, 0, 3])
            .reshape([b, tp, n * da])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DenoiserKind, PlannerConfig};

    type Cpu = crate::CpuBackend;

    fn layout() -> AgentLayout {
        AgentLayout {
            agents: 3,
            obs_horizon: 2,
            block: 9,
            action: 2,
            entities: vec![EntityGroup::new("near", 3, 2, 2)],
        }
    }

    fn cfg() -> DenoiserConfig {
        DenoiserConfig {
            kind: DenoiserKind::Joint,
            step_embed_dim: 8,
            planner: PlannerConfig {
                d_model: 16,
                heads: 2,
                layers: 2,
                ff_dim: 24,
            },
            ..DenoiserConfig::default()
        }
    }

    fn data(n: usize, k: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7 + k * 13) % 17) as f32 - 8.0) / 8.0)
            .collect()
    }

    fn values(t: Tensor<Cpu, 3>) -> Vec<f32> {
        t.into_data().convert::<f32>().into_vec().unwrap()
    }

    /// Every weight of a module replaced by a fixed pseudo-random draw, uniform in
    /// +-1 / sqrt(fan-in) (vectors +-0.1), independent of the backend's generator, which the
    /// tests running beside these share.
    struct FixedDraw(u64);

    impl<B: Backend> burn::module::ModuleMapper<B> for FixedDraw {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, _) = param.consume();
            let shape = tensor.shape();
            let dims = shape.dims::<D>();
            let bound = if D == 2 {
                1.0 / (dims[0] as f64).sqrt()
            } else {
                0.1
            };
            let mut state = self.0;
            self.0 += 1;
            let values: Vec<f32> = (0..shape.num_elements())
                .map(|_| {
                    // splitmix64
                    state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                    let mut z = state;
                    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                    let u = ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64;
                    ((2.0 * u - 1.0) * bound) as f32
                })
                .collect();
            let t = Tensor::from_data(TensorData::new(values, dims), &tensor.device());
            Param::initialized(id, t.require_grad())
        }
    }

    /// Takes a planner whose modulations are no longer zero (as after training), so that every
    /// path through the blocks carries signal, with every weight drawn by [`FixedDraw`].
    fn trained<B: Backend>(p: JointPlanner<B>) -> JointPlanner<B> {
        let mut p = p.map(&mut FixedDraw(1));
        let device = Default::default();
        let noise = |o: usize, i: usize| {
            Tensor::<B, 2>::from_data(TensorData::new(data(i * o, o), [i, o]), &device) * 0.3
        };
        for blk in &mut p.blocks {
            let [i, o] = blk.modulation.weight.dims();
            blk.modulation.weight = Param::from_tensor(noise(o, i));
        }
        let [i, o] = p.final_modulation.weight.dims();
        p.final_modulation.weight = Param::from_tensor(noise(o, i));
        p
    }

    /// [`attend`] computes what Burn's multi-head attention computes on the same weights, for
    /// one query per row (the entity cross-attention, also in [`attend_stacked`]'s form) and
    /// for self-attention.
    #[test]
    fn attention_equals_burns() {
        use burn::nn::attention::MhaInput;
        let device = Default::default();
        let mha = attention::<Cpu>(16, 4, &device);
        let input = |rows: usize, len: usize, k: usize| {
            Tensor::<Cpu, 3>::from_data(
                TensorData::new(data(rows * len * 16, k), [rows, len, 16]),
                &device,
            )
        };
        // Burn's layout [R, L, d] <-> L blocks of rows [R, d], stacked as [L R, d].
        let blocks = |t: Tensor<Cpu, 3>| {
            let l = t.dims()[1];
            (0..l)
                .map(|i| t.clone().narrow(1, i, 1).reshape([6, 16]))
                .collect::<Vec<_>>()
        };
        for (lq, lk) in [(1, 5), (3, 3)] {
            let (q, kv) = (input(6, lq, 1), input(6, lk, 2));
            let burns = mha.forward(MhaInput::new(q.clone(), kv.clone(), kv.clone()));
            let ours = attend(&mha, &blocks(q.clone()), &blocks(kv.clone()));
            assert_eq!(ours.len(), lq);
            assert!(ours.iter().all(|o| o.dims() == [6, 16]));
            let (a, b) = (
                values(Tensor::cat(ours, 0).reshape([lq, 6, 16])),
                values(Tensor::cat(blocks(burns.context), 0).reshape([lq, 6, 16])),
            );
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(worst < 1e-5, "Lq {lq}, Lk {lk}: differs by {worst}");
            assert!(b.iter().any(|v| v.abs() > 1e-2));
            if lq == 1 {
                // The entity cross-attention's form: the context blocks stacked.
                let stacked = attend_stacked(&mha, blocks(q).remove(0), Tensor::cat(blocks(kv), 0));
                let c = values(stacked.reshape([1, 6, 16]));
                let worst = c
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0, f32::max);
                assert!(worst < 1e-5, "stacked, Lk {lk}: differs by {worst}");
            }
        }
    }

    /// The forward pass as first written (batch-major [B, N, d] tensors and Burn's attention),
    /// kept to check the 2-D rewrite against.
    fn reference_forward<B: Backend>(
        p: &JointPlanner<B>,
        x: Tensor<B, 3>,
        t: Tensor<B, 1>,
        cond: Tensor<B, 2>,
    ) -> Tensor<B, 3> {
        use burn::nn::attention::MhaInput;
        let norm3 = |x: Tensor<B, 3>| {
            let (var, mean) = x.clone().var_mean_bias(2);
            (x - mean) / (var + 1e-6).sqrt()
        };
        let modulate3 =
            |x: Tensor<B, 3>, shift: Tensor<B, 3>, scale: Tensor<B, 3>| x * (scale + 1.0) + shift;
        let [n, to, block, da, d] = p.dims;
        let [b, tp, _] = x.dims();
        let device = x.device();
        let obs = cond.reshape([b, to, n, block]).swap_dims(1, 2);
        let own = obs
            .clone()
            .select(3, p.own_index(&device))
            .reshape([b, n, to * p.own.len()]);
        let chunk = x
            .reshape([b, tp, n, da])
            .swap_dims(1, 2)
            .reshape([b, n, tp * da]);
        let mut h = p.input.forward(Tensor::cat(vec![chunk, own], 2))
            + p.agent_embedding.val().unsqueeze_dim::<3>(0);
        let tokens = (!p.entities.is_empty()).then(|| {
            let groups = p
                .entities
                .iter()
                .map(|enc| {
                    let (offset, width, count) = enc.group;
                    let records = obs
                        .clone()
                        .narrow(3, offset, width * count)
                        .reshape([b, n, to, count, width])
                        .permute([0, 1, 3, 2, 4])
                        .reshape([b * n * count, to * width]);
                    enc.mlp.forward(records).reshape([b * n, count, d])
                        + enc.slots.val().unsqueeze_dim::<3>(0)
                })
                .collect();
            Tensor::cat(groups, 1)
        });
        let c = activate(p.act, p.step.forward(t));
        for blk in &p.blocks {
            let m = blk.modulation.forward(c.clone());
            let part = |i: usize| m.clone().narrow(1, i * d, d).unsqueeze_dim::<3>(1);
            if let (Some(cross), Some(tokens)) = (&blk.cross, &tokens) {
                let q = modulate3(norm3(h.clone()), part(0), part(1)).reshape([b * n, 1, d]);
                let ctx = cross
                    .forward(MhaInput::new(q, tokens.clone(), tokens.clone()))
                    .context
                    .reshape([b, n, d]);
                h = h + part(2) * ctx;
            }
            let a = modulate3(norm3(h.clone()), part(3), part(4));
            h = h + part(5) * blk.mix.forward(MhaInput::self_attn(a)).context;
            let f = modulate3(norm3(h.clone()), part(6), part(7));
            h = h + part(8) * blk.ff_out.forward(activate(p.act, blk.ff_in.forward(f)));
        }
        let fm = p.final_modulation.forward(c);
        let shift = fm.clone().narrow(1, 0, d).unsqueeze_dim::<3>(1);
        let scale = fm.narrow(1, d, d).unsqueeze_dim::<3>(1);
        p.output
            .forward(modulate3(norm3(h), shift, scale))
            .reshape([b, n, tp, da])
            .swap_dims(1, 2)
            .reshape([b, tp, n * da])
    }

    /// The 2-D, agent-major forward pass computes what the batch-major one with Burn's
    /// attention computes, on a planner whose every path carries signal.
    #[test]
    fn forward_equals_the_batch_major_reference() {
        let device = Default::default();
        let p = trained(JointPlanner::<Cpu>::new(4, &layout(), &cfg(), &device));
        let (b, tp, n, da) = (5, 4, 3, 2);
        let x = Tensor::<Cpu, 3>::from_data(
            TensorData::new(data(b * tp * n * da, 3), [b, tp, n * da]),
            &device,
        );
        let t = Tensor::<Cpu, 1>::from_data(
            TensorData::new(vec![1.0f32, 7.0, 3.0, 0.0, 9.0], [b]),
            &device,
        );
        let cond = Tensor::<Cpu, 2>::from_data(
            TensorData::new(data(b * 2 * n * 9, 4), [b, 2 * n * 9]),
            &device,
        );
        let ours = values(p.forward(x.clone(), t.clone(), cond.clone()));
        let reference = values(reference_forward(&p, x, t, cond));
        let worst = ours
            .iter()
            .zip(&reference)
            .map(|(a, r)| (a - r).abs())
            .fold(0.0, f32::max);
        assert!(worst < 1e-4, "differs by {worst}");
        let spread = reference.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(spread > 0.1, "the reference output is flat: {spread}");
    }

    /// Training takes other attention code than sampling (blocks computed apart instead of cut
    /// out of one tensor): both give the same bits, so a fine-tuning update's recomputed
    /// log-likelihoods are those its rollouts recorded.
    #[test]
    fn training_and_sampling_compute_the_same_bits() {
        use burn::module::AutodiffModule;
        type Ad = crate::CpuAutodiff;
        let device = Default::default();
        let p = trained(JointPlanner::<Ad>::new(4, &layout(), &cfg(), &device));
        let (b, tp, n, da) = (64, 4, 3, 2);
        let x = TensorData::new(data(b * tp * n * da, 5), [b, tp, n * da]);
        let t = TensorData::new((0..b).map(|i| (i % 10) as f32).collect(), [b]);
        let cond = TensorData::new(data(b * 2 * n * 9, 6), [b, 2 * n * 9]);
        let trained_out = p.forward(
            Tensor::from_data(x.clone(), &device),
            Tensor::from_data(t.clone(), &device),
            Tensor::from_data(cond.clone(), &device),
        );
        assert!(
            p.input.weight.val().is_require_grad(),
            "the training path is not taken"
        );
        let sampled = p.valid().forward(
            Tensor::from_data(x, &device),
            Tensor::from_data(t, &device),
            Tensor::from_data(cond, &device),
        );
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let (a, s) = (
            trained_out
                .into_data()
                .convert::<f32>()
                .into_vec::<f32>()
                .unwrap(),
            values(sampled),
        );
        assert!(s.iter().any(|v| v.abs() > 1e-2));
        assert_eq!(bits(a), bits(s));
    }

    /// The gradients agree too: those of the input layer, of the first block's attention
    /// weights and of its modulation, under the sum of squared outputs.
    #[test]
    fn gradients_equal_the_batch_major_reference() {
        type Ad = crate::CpuAutodiff;
        let device = Default::default();
        let p = trained(JointPlanner::<Ad>::new(4, &layout(), &cfg(), &device));
        let (b, tp, n, da) = (4, 4, 3, 2);
        let inputs = || {
            (
                Tensor::<Ad, 3>::from_data(
                    TensorData::new(data(b * tp * n * da, 5), [b, tp, n * da]),
                    &device,
                ),
                Tensor::<Ad, 1>::from_data(
                    TensorData::new(vec![2.0f32, 5.0, 8.0, 1.0], [b]),
                    &device,
                ),
                Tensor::<Ad, 2>::from_data(
                    TensorData::new(data(b * 2 * n * 9, 6), [b, 2 * n * 9]),
                    &device,
                ),
            )
        };
        let grads = |out: Tensor<Ad, 3>| {
            let g = out.powf_scalar(2.0).sum().backward();
            let blk = &p.blocks[0];
            [
                p.input.weight.grad(&g).unwrap(),
                blk.mix.key.weight.grad(&g).unwrap(),
                blk.cross.as_ref().unwrap().query.weight.grad(&g).unwrap(),
                blk.modulation.weight.grad(&g).unwrap(),
            ]
            .map(|t| t.into_data().convert::<f32>().into_vec::<f32>().unwrap())
        };
        let (x, t, cond) = inputs();
        let ours = grads(p.forward(x, t, cond));
        let (x, t, cond) = inputs();
        let reference = grads(reference_forward(&p, x, t, cond));
        for (k, (a, r)) in ours.iter().zip(&reference).enumerate() {
            let scale = r.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert!(scale > 1e-3, "gradient {k} is zero");
            let worst = a
                .iter()
                .zip(r)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(
                worst < 1e-4 * scale.max(1.0),
                "gradient {k} differs by {worst} (scale {scale})"
            );
        }
    }

    /// The own values are those outside every group, and the shapes run through.
    #[test]
    fn reads_every_agent_and_returns_the_joint_chunk() {
        let l = layout();
        assert_eq!(l.own_values(), vec![0, 1, 2, 7, 8]);
        let device = Default::default();
        let p = JointPlanner::<Cpu>::new(4, &l, &cfg(), &device);
        let (b, tp, n, da) = (2, 4, 3, 2);
        let x = Tensor::<Cpu, 3>::from_data(
            TensorData::new(data(b * tp * n * da, 0), [b, tp, n * da]),
            &device,
        );
        let t = Tensor::<Cpu, 1>::from_data(TensorData::new(vec![1.0f32, 7.0], [b]), &device);
        let cond = Tensor::<Cpu, 2>::from_data(
            TensorData::new(data(b * 2 * n * 9, 1), [b, 2 * n * 9]),
            &device,
        );
        let out = p.forward(x, t, cond);
        assert_eq!(out.dims(), [b, tp, n * da]);
        assert!(values(out).iter().all(|v| v.is_finite()));
    }

    /// The agents' predicted noise for one fixed noisy chunk at step 3, given an observation
    /// vector of 2 steps x 3 agents x 9 values.
    fn predict(p: &JointPlanner<Cpu>, obs: &[f32]) -> Vec<f32> {
        let device = Default::default();
        let (tp, n, da) = (4, 3, 2);
        let x = Tensor::<Cpu, 3>::from_data(
            TensorData::new(data(tp * n * da, 0), [1, tp, n * da]),
            &device,
        );
        let t = Tensor::<Cpu, 1>::from_data(TensorData::new(vec![3.0f32], [1]), &device);
        let cond =
            Tensor::<Cpu, 2>::from_data(TensorData::new(obs.to_vec(), [1, obs.len()]), &device);
        values(p.forward(x, t, cond))
    }

    /// Self-attention couples the agents: changing agent 2's observation changes agent 0's
    /// predicted noise; the entity cross-attention reads the records: changing one record of
    /// agent 0 changes agent 0's output.
    #[test]
    fn agents_see_each_other_and_their_entities() {
        let device = Default::default();
        let l = layout();
        let p = trained(JointPlanner::<Cpu>::new(4, &l, &cfg(), &device));
        let n = 3;
        let base = data(2 * n * 9, 2);
        let run = |obs: &[f32]| predict(&p, obs);
        // Agent 0's noise in step 0 is values [0, 1]; agent 2's block of the last observation
        // starts at 9 n + 18.
        let agent0 = |v: &[f32]| [v[0], v[1], v[6], v[7]];
        let reference = run(&base);
        let mut other = base.clone();
        other[9 * n + 18] += 1.0;
        assert_ne!(agent0(&run(&other)), agent0(&reference));
        let mut record = base.clone();
        record[9 * n + 4] += 1.0; // agent 0, group "near", record 0, value 1
        assert_ne!(agent0(&run(&record)), agent0(&reference));
    }

    /// AdaLN-Zero: at initialisation every block is the identity, so the output does not depend
    /// on the other agents yet (only the first layers and the final projection act).
    #[test]
    fn blocks_start_as_the_identity() {
        let device = Default::default();
        let l = layout();
        let p = JointPlanner::<Cpu>::new(4, &l, &cfg(), &device);
        let n = 3;
        let base = data(2 * n * 9, 2);
        let run = |obs: &[f32]| predict(&p, obs);
        let mut other = base.clone();
        other[9 * n + 18] += 1.0;
        let (a, b) = (run(&base), run(&other));
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[4..], b[4..]);
    }
}
