//! The policy as the rest of diffrl sees it: a model (diffusion or Gaussian) with its config,
//! the dimensions it was built for, and the normalisers of its inputs and outputs.

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use diffrl_core::config::Validate;
use diffrl_core::normalize::Normalizer;
use diffrl_core::seeding::Rng;
use diffrl_core::space::EntityGroup;
use serde::{Deserialize, Serialize};

use crate::config::{DenoiserKind, PolicyConfig, PolicyKind};
use crate::diffusion::{ChainSample, DiffusionModel, DiffusionProcess, Noise, SampleMode};
use crate::encoder::ObsTensors;
use crate::error::PolicyError;
use crate::gaussian::GaussianModel;
use crate::nn::Freeze;
use crate::planner::AgentLayout;
use crate::text_encoder::TextTokens;
use crate::tokenizer::{Strictness, Tokenizer, Tokens, Vocabulary};

/// Serialises weight initialisation (see [`seeded_init`]).
static INIT_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Forces lazily initialised parameters to draw their values now.
struct Materialise;

impl<B: Backend> ModuleVisitor<B> for Materialise {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let _ = param.val();
    }
}

/// Frames of `hwc` = [H, W, C] u8 pixels, row-major HWC and back to back, as the [C, H, W]
/// floats in [0, 1] that [`ObsTensors::image`] holds, frame after frame.
pub fn pixels_to_chw(px: &[u8], hwc: [usize; 3]) -> Vec<f32> {
    let [h, w, c] = hwc;
    let per = h * w * c;
    let mut chw = vec![0f32; px.len()];
    for (f, frame) in px.chunks(per).enumerate() {
        let out = &mut chw[f * per..(f + 1) * per];
        for (p, rgb) in frame.chunks(c).enumerate() {
            for (ch, &v) in rgb.iter().enumerate() {
                out[ch * h * w + p] = f32::from(v) / 255.0;
            }
        }
    }
    chw
}

/// Builds a module whose initial weights depend only on `seed`.
///
/// Burn draws initial weights from one process-wide generator (seeded by `Backend::seed`,
/// consumed lazily when a parameter is first used); builds are serialised here and every
/// parameter is materialised under the lock, so concurrent builds (tests, a policy and a critic
/// in one process) cannot interleave their draws.
pub fn seeded_init<B: Backend, M: Module<B>>(
    device: &B::Device,
    seed: u64,
    build: impl FnOnce() -> M,
) -> M {
    let _guard = INIT_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    B::seed(device, seed);
    let model = build();
    model.visit(&mut Materialise);
    model
}

/// The dimensions a policy was built for (from the dataset or environment spaces).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// Width of one state observation.
    pub state_dim: usize,
    /// Width of one action.
    pub action_dim: usize,
    /// Image geometry [channels, height, width] when the policy sees pixels.
    #[serde(default)]
    pub image: Option<[usize; 3]>,
    /// Whether the policy reads a text instruction (the environment's `ObservationSpace::text`);
    /// its vocabulary comes from the training tasks (see [`Policy::with_text`]). Written out
    /// only when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub text: bool,
    /// Agents whose blocks are stacked in the state vector and whose actions are stacked in the
    /// action (the environment's `ObservationSpace::agents`); written out only when > 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub agents: usize,
    /// Entity records inside each agent's block (`ObservationSpace::entities`), read as tokens
    /// by the joint planner; written out only when there are some.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entities: Vec<EntityGroup>,
    /// Privileged values per frame that behaviour cloning's auxiliary head regresses from the
    /// condition vector (`Task::privileged_recorded`; the head exists only with
    /// `[policy.encoder] aux_weight > 0`); written out only when > 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub aux: usize,
}

fn one() -> usize {
    1
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl PolicySpec {
    /// A single-agent spec without entity groups.
    pub fn flat(state_dim: usize, action_dim: usize) -> Self {
        Self {
            state_dim,
            action_dim,
            image: None,
            text: false,
            agents: 1,
            entities: Vec::new(),
            aux: 0,
        }
    }
}

/// Input and output normalisers, stored with the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Normalizers {
    /// Applied to each state observation.
    pub state: Normalizer,
    /// Maps actions to [-1, 1] (and back).
    pub action: Normalizer,
}

/// The network of a policy.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum PolicyModel<B: Backend> {
    /// Diffusion policy.
    Diffusion(DiffusionModel<B>),
    /// Gaussian MLP policy.
    Gaussian(GaussianModel<B>),
}

/// A batch of raw (unnormalised) observation histories, as the environment loop holds them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ObsBatch {
    /// Batch size B.
    pub batch: usize,
    /// [B, To, Ds] states, row-major.
    pub state: Vec<f32>,
    /// [B, To, H, W, C] images (HWC, u8) when the policy uses pixels.
    pub image: Option<Vec<u8>>,
    /// One instruction per batch row (the newest observation's `text`), when the observations
    /// carry text; policies without text ignore it.
    pub text: Option<Vec<String>>,
}

impl ObsBatch {
    /// The batch's rows `rows` (their states, images and instructions).
    pub fn rows(&self, rows: std::ops::Range<usize>) -> ObsBatch {
        let b = self.batch.max(1);
        let cut = |len: usize| {
            let per = len / b;
            rows.start * per..rows.end * per
        };
        ObsBatch {
            batch: rows.len(),
            state: self.state[cut(self.state.len())].to_vec(),
            image: self.image.as_ref().map(|px| px[cut(px.len())].to_vec()),
            text: self.text.as_ref().map(|t| t[rows.clone()].to_vec()),
        }
    }

    /// That each field holds a whole number of rows (what [`ObsBatch::rows`] cuts by).
    fn check_rows(&self) -> Result<(), PolicyError> {
        let whole = |what: &str, len: usize| {
            if len.is_multiple_of(self.batch) {
                Ok(())
            } else {
                Err(PolicyError::Shape {
                    what: format!("observation {what} (values per batch row x {})", self.batch),
                    expected: len.next_multiple_of(self.batch),
                    got: len,
                })
            }
        };
        whole("state", self.state.len())?;
        if let Some(px) = &self.image {
            whole("image", px.len())?;
        }
        match &self.text {
            Some(t) if t.len() != self.batch => Err(PolicyError::Shape {
                what: "observation.text (one instruction per batch row)".into(),
                expected: self.batch,
                got: t.len(),
            }),
            _ => Ok(()),
        }
    }
}

/// The outcome of one policy call for a batch.
#[derive(Debug, Clone)]
pub struct Act<B: Backend> {
    /// [B, Tp, Da] action chunks in environment units.
    pub actions: Vec<f32>,
    /// The sampled chain in normalised units (x_0 and, when recorded, x_K..x_0 and log-probs).
    pub sample: ChainSample<B>,
}

/// The agents' layout of `spec`, checked against what the configured denoiser needs: the
/// joint planner splits the state and action vectors into equal agent blocks and reads no
/// images or text.
fn agent_layout(config: &PolicyConfig, spec: &PolicySpec) -> Result<AgentLayout, PolicyError> {
    let shape = |what: &str, expected: usize, got: usize| PolicyError::Shape {
        what: what.into(),
        expected,
        got,
    };
    if spec.agents == 0 {
        return Err(shape("agents in the policy spec (at least 1)", 1, 0));
    }
    if !spec.state_dim.is_multiple_of(spec.agents) {
        return Err(shape(
            &format!("state values, a multiple of the {} agents", spec.agents),
            spec.state_dim.next_multiple_of(spec.agents),
            spec.state_dim,
        ));
    }
    if !spec.action_dim.is_multiple_of(spec.agents) {
        return Err(shape(
            &format!("action values, a multiple of the {} agents", spec.agents),
            spec.action_dim.next_multiple_of(spec.agents),
            spec.action_dim,
        ));
    }
    let block = spec.state_dim / spec.agents;
    diffrl_core::space::check_entity_groups(&spec.entities, block).map_err(|m| {
        PolicyError::Config {
            field: "spec.entities".into(),
            message: m,
        }
    })?;
    if config.denoiser.kind == DenoiserKind::Joint && (spec.image.is_some() || spec.text) {
        return Err(PolicyError::Config {
            field: "denoiser.kind".into(),
            message: "the joint planner reads state vectors only; this environment also \
                      observes images or text: use the mlp or unet denoiser"
                .into(),
        });
    }
    Ok(AgentLayout {
        agents: spec.agents,
        obs_horizon: config.obs_horizon,
        block,
        action: spec.action_dim / spec.agents,
        entities: spec.entities.clone(),
    })
}

/// A policy: model + config + spec + normalisers.
#[derive(Debug, Clone)]
pub struct Policy<B: Backend> {
    /// The network.
    pub model: PolicyModel<B>,
    /// Its configuration.
    pub config: PolicyConfig,
    /// Dimensions.
    pub spec: PolicySpec,
    /// Normalisers.
    pub norm: Normalizers,
    /// `config.diffusion` precomputed for the chain. Every policy has one, so a diffusion model
    /// can never lack its process; only diffusion models read it (dispatch is on `model`).
    process: DiffusionProcess,
    /// The network that runs the chain steps before the last K' of a policy fine-tuned with
    /// K' < K: the frozen pretrained copy it was trained with, so evaluation and serving sample
    /// the chain its rollouts sampled. None: `model` runs every step.
    base: Option<PolicyModel<B>>,
    /// The instruction tokenizer of a policy whose spec reads text.
    tokenizer: Option<Tokenizer>,
}

impl<B: Backend> Policy<B> {
    /// Builds a freshly initialised policy whose weights depend only on `seed` (see
    /// [`seeded_init`]); a spec that reads text needs [`Policy::with_text`].
    pub fn new(
        config: PolicyConfig,
        spec: PolicySpec,
        norm: Normalizers,
        seed: u64,
        device: &B::Device,
    ) -> Result<Self, PolicyError> {
        Self::build(config, spec, norm, None, seed, device)
    }

    /// [`Policy::new`] for a language-conditioned spec (`spec.text`): its instruction encoder
    /// embeds the tokens of `vocab` (built from the training tasks, see
    /// [`Vocabulary::from_texts`]).
    pub fn with_text(
        config: PolicyConfig,
        spec: PolicySpec,
        norm: Normalizers,
        vocab: Vocabulary,
        seed: u64,
        device: &B::Device,
    ) -> Result<Self, PolicyError> {
        Self::build(config, spec, norm, Some(vocab), seed, device)
    }

    fn build(
        config: PolicyConfig,
        spec: PolicySpec,
        norm: Normalizers,
        vocab: Option<Vocabulary>,
        seed: u64,
        device: &B::Device,
    ) -> Result<Self, PolicyError> {
        config.validate().map_err(|e| PolicyError::Config {
            field: e.field,
            message: e.message,
        })?;
        match (spec.text, &vocab) {
            (true, None) => {
                return Err(PolicyError::Missing(
                    "the policy reads text (spec.text) but was given no vocabulary: build it \
                     with Policy::with_text"
                        .into(),
                ));
            }
            (false, Some(_)) => {
                return Err(PolicyError::Missing(
                    "a vocabulary was given for a policy that reads no text (spec.text = false)"
                        .into(),
                ));
            }
            _ => {}
        }
        let tokenizer = vocab.map(|v| Tokenizer::new(v, config.encoder.text.max_tokens));
        let vocab_size = tokenizer.as_ref().map(|t| t.vocabulary().len());
        if norm.state.dim() != spec.state_dim || norm.action.dim() != spec.action_dim {
            return Err(PolicyError::Shape {
                what: "normaliser dimensions (state + action)".into(),
                expected: spec.state_dim + spec.action_dim,
                got: norm.state.dim() + norm.action.dim(),
            });
        }
        let layout = agent_layout(&config, &spec)?;
        let image = spec.image.map(|[c, h, w]| (c, h, w));
        let c = &config;
        let model = seeded_init::<B, _>(device, seed, || match c.kind {
            PolicyKind::Diffusion => PolicyModel::Diffusion(DiffusionModel::new(
                c.obs_horizon,
                spec.state_dim,
                image,
                vocab_size,
                spec.aux,
                c.pred_horizon,
                spec.action_dim,
                &c.encoder,
                &c.denoiser,
                &layout,
                device,
            )),
            PolicyKind::Gaussian => PolicyModel::Gaussian(GaussianModel::new(
                c.obs_horizon,
                spec.state_dim,
                image,
                vocab_size,
                c.pred_horizon,
                spec.action_dim,
                &c.encoder,
                &c.gaussian,
                c.diffusion.noise_clip,
                device,
            )),
        });
        let process = DiffusionProcess::new(&c.diffusion, c.action_horizon);
        Ok(Self {
            model,
            config,
            spec,
            norm,
            process,
            base: None,
            tokenizer,
        })
    }

    /// The same policy around another model of the same architecture (e.g. after an update),
    /// without a base network (see [`Policy::with_base`]).
    pub fn with_model<B2: Backend>(&self, model: PolicyModel<B2>) -> Policy<B2> {
        Policy {
            model,
            config: self.config.clone(),
            spec: self.spec.clone(),
            norm: self.norm.clone(),
            process: self.process.clone(),
            base: None,
            tokenizer: self.tokenizer.clone(),
        }
    }

    /// The same policy whose chain steps before the last K' run `base` (the frozen pretrained
    /// network it was fine-tuned with) unless [`Policy::act`] is handed another; checkpoints
    /// keep it. Only diffusion policies with K' < K read it.
    pub fn with_base(mut self, base: PolicyModel<B>) -> Self {
        self.base = Some(base);
        self
    }

    /// The base network, when the chain's early steps run one (see [`Policy::with_base`]).
    pub fn base(&self) -> Option<&PolicyModel<B>> {
        self.base.as_ref()
    }

    /// The network a fine-tuning of this policy freezes for the chain's steps before the last
    /// K': its base when it has one (a policy fine-tuned before), else its own.
    pub fn base_or_model(&self) -> &PolicyModel<B> {
        self.base.as_ref().unwrap_or(&self.model)
    }

    /// Whether the chain's steps before the last K' run another network than `model` when one
    /// is given (a diffusion policy fine-tuning K' < K steps).
    pub fn splits_chain(&self) -> bool {
        self.process().is_some_and(|p| p.ft_steps() < p.steps())
    }

    /// The same network fine-tuning only the last `ft` denoising steps (K'; 0 = all): earlier
    /// steps then run the frozen copy passed to [`Policy::act`]. Fails when K' > K.
    pub fn with_fine_tuned_steps(&self, ft: usize) -> Result<Self, PolicyError> {
        self.with_diffusion(|d| d.ft_denoising_steps = ft)
    }

    /// The same network with its diffusion settings changed by `change` (e.g. the exploration
    /// noise floors of fine-tuning); fails when the result is not a valid config.
    pub fn with_diffusion(
        &self,
        change: impl FnOnce(&mut crate::config::DiffusionConfig),
    ) -> Result<Self, PolicyError> {
        let mut config = self.config.clone();
        change(&mut config.diffusion);
        config.validate().map_err(|e| PolicyError::Config {
            field: e.field,
            message: e.message,
        })?;
        let process = DiffusionProcess::new(&config.diffusion, config.action_horizon);
        Ok(Policy {
            model: self.model.clone(),
            config,
            spec: self.spec.clone(),
            norm: self.norm.clone(),
            process,
            base: self.base.clone(),
            tokenizer: self.tokenizer.clone(),
        })
    }

    /// The instruction tokenizer, when the policy reads text.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// Encodes one instruction per batch row (`Strict` where the policy acts: a word it never
    /// saw in training is an error, not a silent `<unk>`). Errors name the row.
    pub fn tokenize<S: AsRef<str>>(
        &self,
        texts: &[S],
        mode: Strictness,
    ) -> Result<Vec<Tokens>, PolicyError> {
        let tok = self.tokenizer.as_ref().ok_or_else(|| {
            PolicyError::Missing("this policy reads no text: it has no tokenizer".into())
        })?;
        texts
            .iter()
            .enumerate()
            .map(|(row, t)| {
                tok.encode(t.as_ref(), mode)
                    .map_err(|source| PolicyError::Text { row, source })
            })
            .collect()
    }

    /// The diffusion process (None for Gaussian policies).
    pub fn process(&self) -> Option<&DiffusionProcess> {
        match self.model {
            PolicyModel::Diffusion(_) => Some(&self.process),
            PolicyModel::Gaussian(_) => None,
        }
    }

    /// The condition vector [B, cond_dim] the network reads for `obs`: its encoder's state,
    /// image and instruction features.
    pub fn condition(&self, obs: &ObsTensors<B>) -> Tensor<B, 2> {
        match &self.model {
            PolicyModel::Diffusion(m) => m.encoder.forward(obs),
            PolicyModel::Gaussian(m) => m.encoder.forward(obs),
        }
    }

    /// Width of [`Policy::condition`].
    pub fn condition_dim(&self) -> usize {
        match &self.model {
            PolicyModel::Diffusion(m) => m.encoder.out_dim(),
            PolicyModel::Gaussian(m) => m.encoder.out_dim(),
        }
    }

    /// Chain length: K for diffusion, 1 for Gaussian.
    pub fn chain_len(&self) -> usize {
        self.process().map_or(1, DiffusionProcess::steps)
    }

    /// Chunk shape [Tp, Da].
    pub fn chunk(&self) -> [usize; 2] {
        [self.config.pred_horizon, self.spec.action_dim]
    }

    /// Checks, normalises and uploads a batch of observation histories.
    pub fn obs_tensors(
        &self,
        obs: &ObsBatch,
        device: &B::Device,
    ) -> Result<ObsTensors<B>, PolicyError> {
        let (b, to, ds) = (obs.batch, self.config.obs_horizon, self.spec.state_dim);
        if obs.state.len() != b * to * ds {
            return Err(PolicyError::Shape {
                what: format!("observation.state (batch {b} x horizon {to} x dim {ds})"),
                expected: b * to * ds,
                got: obs.state.len(),
            });
        }
        let mut state = obs.state.clone();
        if let Some((i, &v)) = state.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(PolicyError::NonFinite {
                what: "observation.state".into(),
                index: i / (to * ds),
                value: v,
            });
        }
        for row in state.chunks_mut(ds) {
            self.norm.state.normalize(row);
        }
        let state = Tensor::from_data(TensorData::new(state, [b, to, ds]), device);
        let image = match (self.spec.image, &obs.image) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(PolicyError::Missing(
                    "this policy sees pixels but the observation has no image".into(),
                ));
            }
            (Some([c, h, w]), Some(px)) => {
                let per = h * w * c;
                if px.len() != b * to * per {
                    return Err(PolicyError::Shape {
                        what: format!("observation.image ({b} x {to} x {h} x {w} x {c})"),
                        expected: b * to * per,
                        got: px.len(),
                    });
                }
                Some(Tensor::from_data(
                    TensorData::new(pixels_to_chw(px, [h, w, c]), [b, to, c, h, w]),
                    device,
                ))
            }
        };
        let text = match (&self.tokenizer, &obs.text) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(PolicyError::Missing(
                    "this policy is language-conditioned but the observation has no text \
                     instruction"
                        .into(),
                ));
            }
            (Some(_), Some(texts)) => {
                if texts.len() != b {
                    return Err(PolicyError::Shape {
                        what: "observation.text (one instruction per batch row)".into(),
                        expected: b,
                        got: texts.len(),
                    });
                }
                let rows = self.tokenize(texts, Strictness::Strict)?;
                Some(TextTokens::from_rows(&rows, device))
            }
        };
        Ok(ObsTensors { state, image, text })
    }

    /// Samples action chunks for a batch. `frozen` (the pretrained copy) runs the steps before
    /// the last K' during fine-tuning; without it, the policy's own base does, if it has one
    /// (see [`Policy::with_base`]). `record` keeps the chain and its log-probs.
    pub fn act(
        &self,
        frozen: Option<&PolicyModel<B>>,
        obs: &ObsBatch,
        mode: SampleMode,
        record: bool,
        rng: &mut Rng,
        device: &B::Device,
    ) -> Result<Act<B>, PolicyError> {
        self.act_with(frozen, obs, mode, record, &mut Noise::Shared(rng), device)
    }

    /// [`Policy::act`] with the batch cut into `threads` runs of rows, each run's chain on its
    /// own thread. The noise is drawn first, on the calling thread, in the order `act` draws
    /// it, and each run takes its rows of every draw; every operation of the chain treats rows
    /// apart, and Burn's CPU kernels give a row the same bits whatever the rows beside it, so
    /// the actions, chains and log-probs are `act`'s, bit for bit (a test checks it, since
    /// Burn does not promise it; docs/grpo.md). This is for Burn's CPU backend, whose kernels run one thread each; on
    /// any other backend, for Gaussian policies and for batches of one row it is `act`.
    #[allow(clippy::too_many_arguments)]
    pub fn act_threads(
        &self,
        frozen: Option<&PolicyModel<B>>,
        obs: &ObsBatch,
        mode: SampleMode,
        record: bool,
        rng: &mut Rng,
        device: &B::Device,
        threads: usize,
    ) -> Result<Act<B>, PolicyError> {
        let runs = threads.clamp(1, obs.batch.max(1));
        let cpu = B::name(device) == "flex";
        if runs == 1 || !cpu || !matches!(self.model, PolicyModel::Diffusion(_)) {
            return self.act(frozen, obs, mode, record, rng, device);
        }
        obs.check_rows()?;
        let per_row: usize = self.chunk().iter().product();
        let draws: Vec<Vec<f32>> = self
            .process
            .noise_draws(mode)
            .into_iter()
            .map(|clip| crate::diffusion::normal_values(rng, obs.batch * per_row, clip))
            .collect();
        let ranges = diffrl_core::shards::shard_ranges(obs.batch, runs);
        let run = |rows: &std::ops::Range<usize>| {
            let given = draws
                .iter()
                .map(|d| d[rows.start * per_row..rows.end * per_row].to_vec())
                .collect();
            let part = obs.rows(rows.clone());
            self.act_with(
                frozen,
                &part,
                mode,
                record,
                &mut Noise::Given(given),
                device,
            )
        };
        let parts: Vec<Result<Act<B>, PolicyError>> = std::thread::scope(|s| {
            let handles: Vec<_> = ranges[1..]
                .iter()
                .map(|rows| s.spawn(|| run(rows)))
                .collect();
            let mut parts = vec![run(&ranges[0])];
            parts.extend(handles.into_iter().map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(PolicyError::Missing(
                        "a policy call's thread panicked".into(),
                    ))
                })
            }));
            parts
        });
        let parts = match parts.into_iter().collect::<Result<Vec<_>, _>>() {
            Ok(parts) => parts,
            // A run's error names the run's rows; the whole batch's names the batch, as `act`.
            Err(e) => return Err(self.obs_tensors(obs, device).err().unwrap_or(e)),
        };
        let chain = record.then(|| {
            let runs = parts.iter().filter_map(|p| p.sample.chain.clone());
            Tensor::cat(runs.collect(), 0)
        });
        let logp = record.then(|| {
            let runs = parts.iter().filter_map(|p| p.sample.logp.clone());
            Tensor::cat(runs.collect(), 0)
        });
        let mut actions = Vec::with_capacity(obs.batch * per_row);
        let mut xs = Vec::with_capacity(parts.len());
        for p in parts {
            actions.extend(p.actions);
            xs.push(p.sample.actions);
        }
        Ok(Act {
            actions,
            sample: ChainSample {
                actions: Tensor::cat(xs, 0),
                chain,
                logp,
            },
        })
    }

    /// [`Policy::act`] with one noise stream per batch row: row b's chunk depends only on its
    /// observation and `rngs[b]`, whatever else shares the batch.
    pub fn act_rows(
        &self,
        obs: &ObsBatch,
        mode: SampleMode,
        rngs: &mut [Rng],
        device: &B::Device,
    ) -> Result<Act<B>, PolicyError> {
        if rngs.len() != obs.batch {
            return Err(PolicyError::Shape {
                what: "noise streams (one per batch row)".into(),
                expected: obs.batch,
                got: rngs.len(),
            });
        }
        self.act_with(None, obs, mode, false, &mut Noise::PerRow(rngs), device)
    }

    fn act_with(
        &self,
        frozen: Option<&PolicyModel<B>>,
        obs: &ObsBatch,
        mode: SampleMode,
        record: bool,
        noise: &mut Noise<'_>,
        device: &B::Device,
    ) -> Result<Act<B>, PolicyError> {
        let obs_t = self.obs_tensors(obs, device)?;
        let [tp, da] = self.chunk();
        let ta = self.config.action_horizon;
        let p = &self.process;
        let sample = match &self.model {
            PolicyModel::Diffusion(m) => {
                let frozen = match frozen.or(self.base.as_ref()) {
                    Some(PolicyModel::Diffusion(f)) => Some(f),
                    _ => None,
                };
                p.sample(m, frozen, &obs_t, [obs.batch, tp, da], mode, record, noise)
            }
            PolicyModel::Gaussian(g) => g.sample(&obs_t, mode, record, ta, noise),
        };
        let mut actions: Vec<f32> = sample
            .actions
            .clone()
            .into_data()
            .convert::<f32>()
            .into_vec()
            .map_err(|e| PolicyError::Missing(format!("reading actions back: {e:?}")))?;
        for a in actions.chunks_mut(da) {
            self.norm.action.denormalize(a);
        }
        Ok(Act { actions, sample })
    }

    /// Whether the policy has behaviour cloning's auxiliary head (`spec.aux > 0`,
    /// `aux_weight > 0`, a diffusion policy).
    pub fn has_aux_head(&self) -> bool {
        matches!(&self.model, PolicyModel::Diffusion(m) if m.encoder.has_aux())
    }

    /// Behaviour-cloning loss for normalised observations and action chunks [B, Tp, Da].
    pub fn bc_loss(
        &self,
        obs: &ObsTensors<B>,
        actions: Tensor<B, 3>,
        rng: &mut Rng,
    ) -> Tensor<B, 1> {
        self.bc_loss_aux(obs, actions, None, rng)
    }

    /// [`Policy::bc_loss`] plus, when the policy has an auxiliary head and `aux` holds the
    /// batch's standardised privileged values [B, spec.aux] (of each sample's newest frame),
    /// `aux_weight` times the head's mean squared error on them. Without a head `aux` is
    /// ignored.
    pub fn bc_loss_aux(
        &self,
        obs: &ObsTensors<B>,
        actions: Tensor<B, 3>,
        aux: Option<Tensor<B, 2>>,
        rng: &mut Rng,
    ) -> Tensor<B, 1> {
        match &self.model {
            PolicyModel::Diffusion(m) => {
                let aux = aux.map(|t| (t, self.config.encoder.aux_weight));
                self.process.bc_loss(m, obs, actions, aux, rng)
            }
            PolicyModel::Gaussian(g) => {
                let tp = self.config.pred_horizon;
                -g.logp(obs, actions, tp).mean()
            }
        }
    }

    /// Log-probs of the fine-tuned steps of stored chains [B, K + 1, Tp, Da] under the current
    /// parameters: [B, K'] (Gaussian: [B, 1]).
    pub fn chain_logprobs(&self, obs: &ObsTensors<B>, chain: Tensor<B, 4>) -> Tensor<B, 2> {
        match &self.model {
            PolicyModel::Diffusion(m) => self.process.chain_logprobs(m, obs, chain),
            PolicyModel::Gaussian(g) => {
                let [b, _, tp, da] = chain.dims();
                let x0 = chain.narrow(1, 1, 1).reshape([b, tp, da]);
                g.logp(obs, x0, self.config.action_horizon).reshape([b, 1])
            }
        }
    }

    /// Log-probs of single chain steps, one (observation, step) pair per row (see
    /// [`DiffusionProcess::pair_logprobs`]): `x`, `next` [N, Tp, Da] normalised, `step[n]` the
    /// chain index of the pair. Gaussian policies have one step: `next` is the action chunk.
    pub fn pair_logprobs(
        &self,
        obs: &ObsTensors<B>,
        x: Tensor<B, 3>,
        next: Tensor<B, 3>,
        step: &[usize],
    ) -> Tensor<B, 1> {
        match &self.model {
            PolicyModel::Diffusion(m) => self.process.pair_logprobs(m, obs, x, next, step),
            PolicyModel::Gaussian(g) => g.logp(obs, next, self.config.action_horizon),
        }
    }
}

/// Marks every float parameter as trainable.
struct RequireGrad;

impl<B: Backend> ModuleMapper<B> for RequireGrad {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, t, mapper) = param.consume();
        Param::from_mapped_value(id, t.set_require_grad(true), mapper)
    }
}

impl<B: AutodiffBackend> Policy<B> {
    /// A trainable copy of an inference policy (e.g. a loaded checkpoint to fine-tune): same
    /// weights, every parameter tracked by autodiff.
    pub fn trainable(inner: &Policy<B::InnerBackend>) -> Self {
        let model = PolicyModel::<B>::from_inner(inner.model.clone()).map(&mut RequireGrad);
        inner.with_model(model)
    }

    /// The same trainable policy with its observation encoder (the state, image and
    /// instruction features that make the denoiser's condition) frozen: its parameters no
    /// longer take gradients, so fine-tuning moves only the action head, and they stay frozen
    /// through checkpoints (a loaded record keeps each parameter's setting).
    pub fn with_frozen_encoder(mut self) -> Self {
        self.model = match self.model {
            PolicyModel::Diffusion(mut m) => {
                m.encoder = m.encoder.map(&mut Freeze);
                PolicyModel::Diffusion(m)
            }
            PolicyModel::Gaussian(mut g) => {
                g.encoder = g.encoder.map(&mut Freeze);
                PolicyModel::Gaussian(g)
            }
        };
        self
    }

    /// The same trainable policy with the denoiser's FiLM layers (the products by which the
    /// condition modulates each block: `[policy.denoiser] film = true`, and every U-Net
    /// block) frozen, and the number of layers frozen: 0 where the policy has none (the CLI
    /// then refuses the setting). Fine-tuning then moves the denoiser's own path while the
    /// way the condition switches its features stays as behaviour cloning left it.
    pub fn with_frozen_film(mut self) -> (Self, usize) {
        let (model, frozen) = match self.model {
            PolicyModel::Diffusion(mut m) => {
                let (denoiser, n) = m.denoiser.with_frozen_film();
                m.denoiser = denoiser;
                (PolicyModel::Diffusion(m), n)
            }
            gaussian @ PolicyModel::Gaussian(_) => (gaussian, 0),
        };
        self.model = model;
        (self, frozen)
    }

    /// The inference copy (no autodiff graph) of a trainable policy.
    pub fn valid(&self) -> Policy<B::InnerBackend> {
        self.with_model(self.model.valid())
    }
}
