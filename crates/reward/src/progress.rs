//! The progress reward model Phi(s) in [0, 1]: an MLP with a sigmoid head on the normalised
//! states of a short context of steps (or on CNN features of their images), trained by regression on progress labels ([`crate::labels`]); its checkpoints; and the
//! metrics of docs/algorithms.md §4 on held-out episodes.

use std::path::Path;
use std::sync::Mutex;

use burn::module::{AutodiffModule, Module};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use diffrl_core::config::{Invalid, Validate};
use diffrl_core::episode::Episode;
use diffrl_core::normalize::{Normalizer, RunningStats};
use diffrl_core::seeding::rng;
use diffrl_core::space::{ImageObs, Observation};
use diffrl_core::stages::StagePredicates;
use diffrl_policy::Vocabulary;
use diffrl_policy::config::ImageEncoderConfig;
use diffrl_policy::nn::Mlp;
use diffrl_policy::seeded_init;
use diffrl_policy::tokenizer::words;
use diffrl_policy::vision::ImageEncoder;
use rand::Rng as _;
use serde::{Deserialize, Serialize};

use crate::error::RewardError;
use crate::labels::{LabelKind, stage_labels, time_labels};
use crate::metrics::{RewardMetrics, auroc, monotonicity, pairwise_accuracy, voc};
use crate::shaping::ProgressFn;

pub use crate::folder::{META_FILE, WEIGHTS_FILE};

/// Progress-model settings (`[reward.progress]` in a run config).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProgressConfig {
    /// Label kind: "stages" (stage budgets, failed episodes capped) or "time" (t / T on
    /// successful episodes).
    pub labels: LabelKind,
    /// Budget per stage (sums to 1); empty = equal budgets.
    pub stage_budgets: Vec<f64>,
    /// Hidden widths of the MLP.
    pub hidden: Vec<usize>,
    /// Optimiser steps.
    pub steps: usize,
    /// States per step.
    pub batch_size: usize,
    /// AdamW learning rate.
    pub lr: f64,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Every `holdout_every`-th episode (index % n == n - 1) is held out for the metrics
    /// (0 = none).
    pub holdout_every: usize,
    /// Seed of initialisation and batches.
    pub seed: u64,
    /// Weight of the within-episode ranking term (0 = off): for pairs of states of one
    /// labelled episode whose labels increase, `softplus(-(Phi(s_later) - Phi(s_earlier)) /
    /// rank_temperature)`, averaged over `batch_size` pairs per step and added to the MSE.
    /// It asks for the order of progress inside an episode (what VOC measures), which the
    /// regression on labels only asks for indirectly.
    pub rank_weight: f64,
    /// Temperature of the ranking term (progress units).
    pub rank_temperature: f64,
    /// States the model reads per prediction: the current one and `context - 1` earlier ones,
    /// `context_stride` environment steps apart (indices before the episode's start repeat its
    /// first state). 1 = Phi(s_t) alone. The potential is then a function of the recent
    /// history, which shaping allows (the telescoping sum does not care what Phi reads).
    /// Default 4 states 8 steps apart (tuned on Push-T at 10 Hz, docs/reward.md); folders
    /// written before the setting existed read as 1.
    pub context: usize,
    /// Environment steps between the states of the context.
    pub context_stride: usize,
    /// What the network reads: "state" (the normalised state vector) or "image" (the camera
    /// image of each context step through a CNN, nothing else; the state vector then only
    /// serves the stage labels during training).
    pub input: ProgressInput,
    /// The CNN of `input = "image"` (ResNet stages with GroupNorm and a spatial-softmax head,
    /// the policy's image encoder).
    pub image_encoder: ImageEncoderConfig,
    /// Also read the observation's instruction (language-conditioned tasks, where the state or
    /// image alone does not say which object the progress is about): its words, one-hot per
    /// position, appended to the MLP's input. The vocabulary is that of the training
    /// episodes' tasks and of every instruction the task can say; a word outside it is an
    /// error when scoring.
    #[serde(skip_serializing_if = "is_false")]
    pub text: bool,
}

fn is_false(v: &bool) -> bool {
    !v
}

/// What a progress model reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProgressInput {
    /// The state vector.
    #[default]
    State,
    /// The camera image.
    Image,
}

impl Default for ProgressConfig {
    fn default() -> Self {
        Self {
            labels: LabelKind::Stages,
            stage_budgets: Vec::new(),
            hidden: vec![256, 256],
            steps: 3000,
            batch_size: 256,
            lr: 1e-3,
            weight_decay: 1e-4,
            holdout_every: 10,
            seed: 0,
            rank_weight: 3.0,
            rank_temperature: 0.01,
            context: 4,
            context_stride: 8,
            input: ProgressInput::State,
            image_encoder: ImageEncoderConfig {
                channels: vec![16, 32],
                groups: 8,
                keypoints: 16,
                out_dim: 32,
                ..ImageEncoderConfig::default()
            },
            text: false,
        }
    }
}

impl Validate for ProgressConfig {
    /// Checks the settings.
    fn validate(&self) -> Result<(), Invalid> {
        let bad = |f: &str, m: &str| Err(Invalid::new(f, m));
        if self.hidden.contains(&0) {
            return bad("hidden", "widths must be at least 1");
        }
        if self.steps == 0 || self.batch_size == 0 {
            return bad("steps", "steps and batch_size must be at least 1");
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad("lr", "must be > 0");
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad("weight_decay", "must be >= 0");
        }
        if !(self.rank_weight.is_finite() && self.rank_weight >= 0.0) {
            return bad("rank_weight", "must be >= 0");
        }
        if !(self.rank_temperature.is_finite() && self.rank_temperature > 0.0) {
            return bad("rank_temperature", "must be > 0");
        }
        if self.context == 0 || self.context_stride == 0 {
            return bad("context", "context and context_stride must be at least 1");
        }
        if self.holdout_every == 1 {
            return bad("holdout_every", "1 would hold out every episode (0 = none)");
        }
        let e = &self.image_encoder;
        if e.channels.is_empty()
            || e.channels.contains(&0)
            || e.groups == 0
            || e.channels.iter().any(|c| c % e.groups != 0)
            || e.keypoints == 0
            || e.out_dim == 0
        {
            return bad(
                "image_encoder",
                "channels must be non-empty multiples of groups; groups, keypoints and out_dim \
                 at least 1",
            );
        }
        if e.kind != diffrl_policy::config::ImageEncoderKind::Cnn {
            return bad(
                "image_encoder.kind",
                "the progress model reads images through the CNN only (kind = \"cnn\")",
            );
        }
        Ok(())
    }
}

/// MLP with a sigmoid head, on the context's states or on the CNN features of its images.
#[derive(Module, Debug)]
pub struct ProgressNet<B: Backend> {
    image: Option<ImageEncoder<B>>,
    mlp: Mlp<B>,
    #[module(skip)]
    context: usize,
}

impl<B: Backend> ProgressNet<B> {
    fn new(
        state_dim: usize,
        image: Option<[usize; 3]>,
        text_dim: usize,
        cfg: &ProgressConfig,
        device: &B::Device,
    ) -> Self {
        let image = image.map(|[c, h, w]| ImageEncoder::new(c, h, w, &cfg.image_encoder, device));
        let per_step = image.as_ref().map_or(state_dim, ImageEncoder::out_dim);
        Self {
            image,
            mlp: crate::scalar_mlp(per_step * cfg.context + text_dim, &cfg.hidden, device),
            context: cfg.context,
        }
    }

    /// [B, context x D (+ text features)] normalised states -> [B] progress in (0, 1).
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 1> {
        let b = x.dims()[0];
        burn::tensor::activation::sigmoid(self.mlp.forward(x)).reshape([b])
    }

    /// Image models: CNN features of `frames` [M, C, H, W] in [0, 1] -> [M, F].
    pub fn encode(&self, frames: Tensor<B, 4>) -> Tensor<B, 2> {
        self.image
            .as_ref()
            .expect("encode is only called on image models")
            .forward(frames)
    }

    /// Image models: per prediction, the rows of `feats` ([`Self::encode`]) of its context's
    /// frames (`gather`, B x context indices, oldest first), then its text features [B, T]
    /// when the model reads the instruction -> [B] progress.
    pub fn forward_features(
        &self,
        feats: Tensor<B, 2>,
        gather: &[usize],
        text: Option<Tensor<B, 2>>,
    ) -> Tensor<B, 1> {
        let d = feats.dims()[1];
        let idx = Tensor::<B, 1, Int>::from_data(
            TensorData::new(
                gather.iter().map(|&i| i as i64).collect::<Vec<_>>(),
                [gather.len()],
            ),
            &feats.device(),
        );
        let b = gather.len() / self.context;
        let x = feats.select(0, idx).reshape([b, self.context * d]);
        self.forward(match text {
            Some(t) => Tensor::cat(vec![x, t], 1),
            None => x,
        })
    }
}

/// [M, H, W, 3] RGB8 frames -> [M, 3, H, W] floats in [0, 1].
fn frames_tensor<B: Backend>(
    frames: &[&ImageObs],
    shape: [usize; 3],
    device: &B::Device,
) -> Tensor<B, 4> {
    let [_, h, w] = shape;
    let data: Vec<f32> = frames
        .iter()
        .flat_map(|f| f.data.iter().map(|&v| f32::from(v) / 255.0))
        .collect();
    Tensor::<B, 4>::from_data(TensorData::new(data, [frames.len(), h, w, 3]), device)
        .permute([0, 3, 1, 2])
}

/// The image of `o`, checked against `shape` ([3, H, W]); `what` names it in errors.
fn checked_frame<'a>(
    o: &'a Observation,
    shape: [usize; 3],
    what: &str,
) -> Result<&'a ImageObs, RewardError> {
    let [_, h, w] = shape;
    let expected = format!("a {h} x {w} RGB image (what the progress model was trained on)");
    match &o.image {
        Some(im)
            if im.height as usize == h && im.width as usize == w && im.data.len() == h * w * 3 =>
        {
            Ok(im)
        }
        Some(im) => Err(RewardError::Shape {
            what: what.into(),
            expected,
            got: format!(
                "a {} x {} image of {} bytes",
                im.height,
                im.width,
                im.data.len()
            ),
        }),
        None => Err(RewardError::Shape {
            what: what.into(),
            expected,
            got: "no image (observe pixels, or render the states)".into(),
        }),
    }
}

/// Context indices (oldest first) of every step of a sequence of `n`.
fn context_index(n: usize, context: usize, stride: usize) -> Vec<usize> {
    (0..n)
        .flat_map(|t| {
            (0..context)
                .rev()
                .map(move |j| t.saturating_sub(j * stride))
        })
        .collect()
}

/// How a progress model that reads the instruction encodes it: each of the first `words`
/// positions a one-hot vector over the vocabulary (all zeros past the instruction's end).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextCode {
    /// The words it knows (`<pad>`, `<unk>`, then the words of its texts).
    pub vocab: Vocabulary,
    /// Positions encoded: the most words of an instruction it was built from.
    pub words: usize,
}

impl TextCode {
    /// The code of `texts`: their words, and room for the longest.
    pub fn from_texts<'a>(texts: impl IntoIterator<Item = &'a str> + Clone) -> Self {
        Self {
            vocab: Vocabulary::from_texts(texts.clone()),
            words: texts.into_iter().map(|t| words(t).len()).max().unwrap_or(0),
        }
    }

    /// Width of the features of one instruction.
    pub fn dim(&self) -> usize {
        self.words * self.vocab.len()
    }

    /// The features of `text`; `what` names it in errors (no instruction, an unknown word, too
    /// many words).
    pub fn encode(&self, text: Option<&str>, what: &str) -> Result<Vec<f32>, RewardError> {
        let text = text.ok_or_else(|| {
            RewardError::Data(format!(
                "{what} carries no instruction, but this progress model reads one \
                 (progress.text = true)"
            ))
        })?;
        let ws = words(text);
        if ws.len() > self.words {
            return Err(RewardError::Data(format!(
                "{what}: the instruction {text:?} has {} words; this progress model reads at \
                 most {}",
                ws.len(),
                self.words
            )));
        }
        let v = self.vocab.len();
        let mut out = vec![0.0; self.dim()];
        for (i, w) in ws.iter().enumerate() {
            let id = self.vocab.id(w).ok_or_else(|| {
                RewardError::Data(format!(
                    "{what}: unknown word {w:?} in the instruction {text:?}; this progress \
                     model knows the {} words of its training tasks",
                    v - 2
                ))
            })?;
            out[i * v + id as usize] = 1.0;
        }
        Ok(out)
    }
}

/// Everything a reward-model folder holds besides the weights.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgressMeta {
    /// Always "progress".
    pub kind: String,
    /// Width of the state observations it was trained on.
    pub state_dim: usize,
    /// State normaliser (from the training states).
    pub norm: Normalizer,
    /// Settings used.
    pub config: ProgressConfig,
    /// Stage names when stage labels were used.
    #[serde(default)]
    pub stages: Vec<String>,
    /// [channels, height, width] of the images an image model reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_shape: Option<[usize; 3]>,
    /// The instruction encoding of a model that reads it (`text = true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<TextCode>,
    /// Training facts and held-out metrics.
    #[serde(default)]
    pub info: serde_json::Value,
}

/// A trained progress model on the CPU, usable from several threads.
pub struct ProgressModel<B: Backend> {
    net: Mutex<ProgressNet<B>>,
    device: B::Device,
    /// Metadata (normaliser, dimensions, settings).
    pub meta: ProgressMeta,
    clamped: std::sync::atomic::AtomicUsize,
}

impl<B: Backend> ProgressModel<B> {
    /// Phi along one episode's states, in order (with `context` > 1 each prediction also reads
    /// earlier states of the sequence); non-finite outputs are errors naming the index, values
    /// outside [0, 1] are clamped and counted.
    pub fn predict(&self, states: &[&[f32]]) -> Result<Vec<f64>, RewardError> {
        if self.meta.text.is_some() {
            return Err(RewardError::Data(
                "this progress model also reads the instruction: score observations \
                 (episode_progress or predict_obs)"
                    .into(),
            ));
        }
        self.predict_states(states, &[])
    }

    /// [`Self::predict`] with each state's text features appended (`text`: one row per state,
    /// or empty for a model that reads no instruction).
    fn predict_states(
        &self,
        states: &[&[f32]],
        text: &[Vec<f32>],
    ) -> Result<Vec<f64>, RewardError> {
        if self.meta.image_shape.is_some() {
            return Err(RewardError::Data(
                "this progress model reads images, not state vectors: score observations \
                 (episode_progress or predict_obs)"
                    .into(),
            ));
        }
        let d = self.meta.state_dim;
        let mut normed = Vec::with_capacity(states.len());
        for (i, s) in states.iter().enumerate() {
            if s.len() != d {
                return Err(RewardError::Shape {
                    what: format!("state {i} of the batch"),
                    expected: format!("{d} values (the observation space it was trained on)"),
                    got: format!("{} values", s.len()),
                });
            }
            let mut row = s.to_vec();
            self.meta.norm.normalize(&mut row);
            normed.push(row);
        }
        let c = &self.meta.config;
        let mut flat = context_rows(&normed, c.context, c.context_stride);
        let mut width = d * c.context;
        if states.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(first) = text.first() {
            flat = flat
                .chunks(width)
                .zip(text)
                .flat_map(|(x, t)| x.iter().chain(t).copied())
                .collect();
            width += first.len();
        }
        let x =
            Tensor::<B, 2>::from_data(TensorData::new(flat, [states.len(), width]), &self.device);
        let out = {
            let net = self.net.lock().unwrap_or_else(|p| p.into_inner());
            net.forward(x)
        };
        self.finish(out)
    }

    /// Phi along one episode's observations, in order: their state vectors or, for an image
    /// model, their images (checked against the size it was trained on), and their
    /// instructions for a model that reads them.
    pub fn predict_obs(&self, obs: &[&Observation]) -> Result<Vec<f64>, RewardError> {
        self.predict_obs_with_task(obs, None)
    }

    /// [`Self::predict_obs`]; an observation without text reads `task` (a recorded episode's
    /// instruction) instead.
    pub fn predict_obs_with_task(
        &self,
        obs: &[&Observation],
        task: Option<&str>,
    ) -> Result<Vec<f64>, RewardError> {
        let text = match &self.meta.text {
            Some(code) => obs
                .iter()
                .enumerate()
                .map(|(i, o)| {
                    code.encode(
                        o.text.as_deref().or(task),
                        &format!("observation {i} of the sequence"),
                    )
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
        };
        let Some(shape) = self.meta.image_shape else {
            let states: Vec<&[f32]> = obs.iter().map(|o| o.state.as_slice()).collect();
            return self.predict_states(&states, &text);
        };
        let frames = obs
            .iter()
            .enumerate()
            .map(|(i, o)| checked_frame(o, shape, &format!("observation {i} of the sequence")))
            .collect::<Result<Vec<_>, _>>()?;
        if frames.is_empty() {
            return Ok(Vec::new());
        }
        let c = &self.meta.config;
        let gather = context_index(frames.len(), c.context, c.context_stride);
        let out = {
            let net = self.net.lock().unwrap_or_else(|p| p.into_inner());
            // Encoded a chunk at a time: the CNN's activations of a whole episode are large.
            let feats: Vec<Tensor<B, 2>> = frames
                .chunks(64)
                .map(|ch| net.encode(frames_tensor::<B>(ch, shape, &self.device)))
                .collect();
            let text = text.first().map(|t| {
                let w = t.len();
                Tensor::<B, 2>::from_data(
                    TensorData::new(text.concat(), [text.len(), w]),
                    &self.device,
                )
            });
            net.forward_features(Tensor::cat(feats, 0), &gather, text)
        };
        self.finish(out)
    }

    fn finish(&self, out: Tensor<B, 1>) -> Result<Vec<f64>, RewardError> {
        let v: Vec<f32> = out
            .into_data()
            .convert::<f32>()
            .into_vec()
            .map_err(|e| RewardError::Data(format!("reading progress back: {e:?}")))?;
        let mut clamped = 0;
        let out = v
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                if !p.is_finite() {
                    return Err(RewardError::NonFinite {
                        what: "progress".into(),
                        index: i,
                        value: p,
                    });
                }
                if !(0.0..=1.0).contains(&p) {
                    clamped += 1;
                }
                Ok(f64::from(p.clamp(0.0, 1.0)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.clamped
            .fetch_add(clamped, std::sync::atomic::Ordering::Relaxed);
        Ok(out)
    }

    /// Predictions outside [0, 1] clamped so far.
    pub fn clamped(&self) -> usize {
        self.clamped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Phi along an episode: its observations, then the final observation when recorded.
    pub fn episode_progress(&self, ep: &Episode) -> Result<Vec<f64>, RewardError> {
        let mut obs: Vec<&Observation> = ep.observations.iter().collect();
        if let Some(f) = &ep.final_observation {
            obs.push(f);
        }
        self.predict_obs_with_task(&obs, ep.task.as_deref())
    }
}

impl<B: Backend> ProgressFn for ProgressModel<B>
where
    B::Device: Send + Sync,
    ProgressNet<B>: Send,
{
    fn name(&self) -> String {
        "progress".into()
    }

    fn progress(&self, obs: &[&Observation]) -> Result<Vec<f64>, RewardError> {
        self.predict_obs(obs)
    }
}

/// Progress labels of every training episode (None = episode not used).
pub fn episode_labels(
    episodes: &[Episode],
    kind: LabelKind,
    stages: Option<&dyn StagePredicates>,
    budgets: &[f64],
    scale: &[f32],
) -> Result<Vec<Option<Vec<f32>>>, RewardError> {
    episodes
        .iter()
        .map(|ep| {
            let states: Vec<Vec<f32>> = ep.observations.iter().map(|o| o.state.clone()).collect();
            match kind {
                LabelKind::Time => Ok(ep.success().then(|| time_labels(states.len()))),
                LabelKind::Stages => {
                    let st = stages.ok_or_else(|| {
                        RewardError::config(
                            "progress.labels",
                            "\"stages\" needs an environment with stage predicates",
                        )
                    })?;
                    stage_labels(st, budgets, &states, scale, ep.success()).map(Some)
                }
            }
        })
        .collect()
}

/// Model inputs along one episode: per step, the normalised states of its context (oldest
/// first, indices before 0 repeating state 0), concatenated.
fn context_rows(normed: &[Vec<f32>], context: usize, stride: usize) -> Vec<f32> {
    context_index(normed.len(), context, stride)
        .into_iter()
        .flat_map(|i| normed[i].iter().copied())
        .collect()
}

/// Whether episode `i` is held out.
pub fn held_out(i: usize, every: usize) -> bool {
    every > 1 && i % every == every - 1
}

/// Normaliser, distance scale, budgets and labels of the training episodes.
pub struct Prepared {
    /// Width of the state.
    pub state_dim: usize,
    /// Min-max normaliser of the training states.
    pub norm: Normalizer,
    /// Per-component range (divides state changes for stage labels).
    pub scale: Vec<f32>,
    /// Stage budgets used.
    pub budgets: Vec<f64>,
    /// Stage names.
    pub names: Vec<String>,
    /// The training episodes (held-out ones removed).
    pub episodes: Vec<Episode>,
    /// Labels per training episode (None = not used).
    pub labels: Vec<Option<Vec<f32>>>,
    /// [3, H, W] of the images an image model reads (None for state models).
    pub image_shape: Option<[usize; 3]>,
    /// The instruction encoding (`text = true`): the training episodes' tasks, widened by
    /// [`Self::add_texts`].
    pub text: Option<TextCode>,
}

impl Prepared {
    /// Widens the instruction encoding to `texts` too (every instruction the task can say),
    /// so that scoring a paraphrase the training episodes never showed is not an error.
    pub fn add_texts(&mut self, texts: &[String]) {
        if self.text.is_none() || texts.is_empty() {
            return;
        }
        let mut all: Vec<&str> = self
            .episodes
            .iter()
            .filter_map(|e| e.task.as_deref())
            .collect();
        all.extend(texts.iter().map(String::as_str));
        self.text = Some(TextCode::from_texts(all));
    }
}

/// Splits off the held-out episodes, checks the states and labels the rest.
pub fn prepare(
    episodes: &[Episode],
    stages: Option<&dyn StagePredicates>,
    cfg: &ProgressConfig,
) -> Result<Prepared, RewardError> {
    cfg.validate().map_err(|e| e.within("progress"))?;
    let state_dim = episodes
        .iter()
        .flat_map(|e| e.observations.first())
        .map(|o| o.state.len())
        .next()
        .ok_or_else(|| RewardError::Data("no episodes with observations".into()))?;
    let image = cfg.input == ProgressInput::Image;
    if state_dim == 0 && (!image || cfg.labels == LabelKind::Stages) {
        return Err(RewardError::Data(
            "the episodes have no state observations (state progress models and stage labels \
             read states)"
                .into(),
        ));
    }
    let train_eps: Vec<Episode> = episodes
        .iter()
        .enumerate()
        .filter(|(i, _)| !held_out(*i, cfg.holdout_every))
        .map(|(_, e)| e.clone())
        .collect();
    let mut stats = RunningStats::new(state_dim);
    for ep in &train_eps {
        for (t, o) in ep.observations.iter().enumerate() {
            if o.state.len() != state_dim {
                return Err(RewardError::Shape {
                    what: format!("observation {t} of an episode"),
                    expected: format!("{state_dim} state values"),
                    got: format!("{}", o.state.len()),
                });
            }
            if let Some(i) = o.state.iter().position(|v| !v.is_finite()) {
                return Err(RewardError::Data(format!(
                    "observation {t} of an episode has a non-finite value at component {i}"
                )));
            }
            stats.push(&o.state);
        }
    }
    let image_shape = if image {
        let first = train_eps
            .iter()
            .flat_map(|e| e.observations.first())
            .next()
            .and_then(|o| o.image.as_ref())
            .ok_or_else(|| {
                RewardError::Data(
                    "progress.input = \"image\" but the episodes carry no images (observe pixels, \
                     or render the states)"
                        .into(),
                )
            })?;
        let shape = [3, first.height as usize, first.width as usize];
        for (k, ep) in train_eps.iter().enumerate() {
            for (t, o) in ep.observations.iter().enumerate() {
                checked_frame(
                    o,
                    shape,
                    &format!("observation {t} of training episode {k}"),
                )?;
            }
        }
        Some(shape)
    } else {
        None
    };
    let norm = Normalizer::min_max(&stats);
    let scale: Vec<f32> = stats
        .min
        .iter()
        .zip(&stats.max)
        .map(|(lo, hi)| ((hi - lo) as f32).max(1e-6))
        .collect();
    let names = stages.map(|s| s.names()).unwrap_or_default();
    let budgets = if cfg.stage_budgets.is_empty() && !names.is_empty() {
        vec![1.0 / names.len() as f64; names.len()]
    } else {
        cfg.stage_budgets.clone()
    };
    let labels = episode_labels(&train_eps, cfg.labels, stages, &budgets, &scale)?;
    let text = if cfg.text {
        let tasks = train_eps
            .iter()
            .enumerate()
            .map(|(k, e)| {
                e.task.as_deref().ok_or_else(|| {
                    RewardError::Data(format!(
                        "progress.text = true, but training episode {k} has no task instruction"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Some(TextCode::from_texts(tasks))
    } else {
        None
    };
    Ok(Prepared {
        state_dim,
        norm,
        scale,
        budgets,
        names,
        episodes: train_eps,
        labels,
        image_shape,
        text,
    })
}

/// Trains a progress model on `episodes`; `progress(step, loss)` is called every 100 steps.
pub fn train<B: AutodiffBackend>(
    episodes: &[Episode],
    stages: Option<&dyn StagePredicates>,
    cfg: &ProgressConfig,
    device: &B::Device,
    progress: &mut dyn FnMut(usize, f64),
) -> Result<ProgressModel<B::InnerBackend>, RewardError> {
    let prep = prepare(episodes, stages, cfg)?;
    train_prepared::<B>(&prep, cfg, device, progress)
}

/// [`train`] on prepared data.
pub fn train_prepared<B: AutodiffBackend>(
    prep: &Prepared,
    cfg: &ProgressConfig,
    device: &B::Device,
    progress: &mut dyn FnMut(usize, f64),
) -> Result<ProgressModel<B::InnerBackend>, RewardError> {
    let (state_dim, norm, owned, labels) =
        (prep.state_dim, &prep.norm, &prep.episodes, &prep.labels);
    // State models: the context's normalised states of every labelled step. Image models: the
    // frames of the labelled steps and, per step, its context's indices into them.
    let mut xs: Vec<Vec<f32>> = Vec::new();
    let mut frames: Vec<&ImageObs> = Vec::new();
    let mut ctx: Vec<Vec<usize>> = Vec::new();
    let mut ys: Vec<f32> = Vec::new();
    // Text models: each row's instruction features.
    let mut texts: Vec<Vec<f32>> = Vec::new();
    let mut used = 0;
    // Index ranges of the labelled episodes' steps (ranking pairs stay inside one).
    let mut spans: Vec<std::ops::Range<usize>> = Vec::new();
    for (ep, l) in owned.iter().zip(labels) {
        let Some(l) = l else { continue };
        used += 1;
        let n = ep.observations.len().min(l.len());
        spans.push(ys.len()..ys.len() + n);
        if let Some(code) = &prep.text {
            for (t, o) in ep.observations[..n].iter().enumerate() {
                texts.push(code.encode(
                    o.text.as_deref().or(ep.task.as_deref()),
                    &format!("training observation {t}"),
                )?);
            }
        }
        if let Some(shape) = prep.image_shape {
            let base = frames.len();
            for (t, o) in ep.observations[..n].iter().enumerate() {
                frames.push(checked_frame(
                    o,
                    shape,
                    &format!("training observation {t}"),
                )?);
            }
            let index = context_index(n, cfg.context, cfg.context_stride);
            ctx.extend(
                index
                    .chunks(cfg.context)
                    .map(|c| c.iter().map(|i| base + i).collect()),
            );
        } else {
            let normed: Vec<Vec<f32>> = ep.observations[..n]
                .iter()
                .map(|o| {
                    let mut row = o.state.clone();
                    norm.normalize(&mut row);
                    row
                })
                .collect();
            let rows = context_rows(&normed, cfg.context, cfg.context_stride);
            xs.extend(rows.chunks(state_dim * cfg.context).map(<[f32]>::to_vec));
        }
        ys.extend_from_slice(&l[..n]);
    }
    if ys.is_empty() {
        return Err(RewardError::Data(format!(
            "no labelled states: {} training episodes, none usable with {:?} labels (time labels \
             need successful episodes)",
            owned.len(),
            cfg.labels
        )));
    }
    let text_dim = prep.text.as_ref().map_or(0, TextCode::dim);
    let width = state_dim * cfg.context;
    let mut net: ProgressNet<B> = seeded_init::<B, _>(device, cfg.seed, || {
        ProgressNet::new(state_dim, prep.image_shape, text_dim, cfg, device)
    });
    let text_rows = |rows: &[usize]| -> Vec<f32> {
        rows.iter()
            .flat_map(|&i| texts.get(i).into_iter().flatten().copied())
            .collect()
    };
    // Phi of the given training rows.
    let forward = |net: &ProgressNet<B>, rows: &[usize]| -> Tensor<B, 1> {
        match prep.image_shape {
            None => {
                let x: Vec<f32> = rows
                    .iter()
                    .flat_map(|&i| {
                        xs[i]
                            .iter()
                            .chain(texts.get(i).into_iter().flatten())
                            .copied()
                    })
                    .collect();
                net.forward(Tensor::from_data(
                    TensorData::new(x, [rows.len(), width + text_dim]),
                    device,
                ))
            }
            Some(shape) => {
                // Each distinct frame of the batch through the CNN once.
                let mut local = std::collections::HashMap::new();
                let mut batch: Vec<&ImageObs> = Vec::new();
                let mut gather = Vec::with_capacity(rows.len() * cfg.context);
                for &i in rows {
                    for &g in &ctx[i] {
                        let k = *local.entry(g).or_insert_with(|| {
                            batch.push(frames[g]);
                            batch.len() - 1
                        });
                        gather.push(k);
                    }
                }
                let feats = net.encode(frames_tensor::<B>(&batch, shape, device));
                let text = (text_dim > 0).then(|| {
                    Tensor::from_data(
                        TensorData::new(text_rows(rows), [rows.len(), text_dim]),
                        device,
                    )
                });
                net.forward_features(feats, &gather, text)
            }
        }
    };
    let mut optim = AdamWConfig::new()
        .with_weight_decay(cfg.weight_decay as f32)
        .init::<B, ProgressNet<B>>();
    let mut r = rng(cfg.seed ^ 0x9E37);
    let mut loss_sum = 0.0;
    let mut last_loss = f64::NAN;
    for step in 0..cfg.steps {
        let bsz = cfg.batch_size.min(ys.len());
        let idx: Vec<usize> = (0..bsz).map(|_| r.random_range(0..ys.len())).collect();
        let y: Vec<f32> = idx.iter().map(|&i| ys[i]).collect();
        let y = Tensor::<B, 1>::from_data(TensorData::new(y, [bsz]), device);
        let mut loss = (forward(&net, &idx) - y).square().mean();
        if cfg.rank_weight > 0.0 {
            let (early, late) = rank_pairs(&spans, &ys, bsz, &mut r);
            if !early.is_empty() {
                let margin = (forward(&net, &late) - forward(&net, &early)) / cfg.rank_temperature;
                let rank = -burn::tensor::activation::log_sigmoid(margin).mean();
                loss = loss + rank * cfg.rank_weight;
            }
        }
        let lv: f64 = loss.clone().into_scalar().elem();
        if !lv.is_finite() {
            return Err(RewardError::Data(format!(
                "the progress loss became {lv} at step {step}; lower progress.lr"
            )));
        }
        loss_sum += lv;
        let grads = GradientsParams::from_grads(loss.backward(), &net);
        net = optim.step(cfg.lr, net, grads);
        if (step + 1) % 100 == 0 || step + 1 == cfg.steps {
            last_loss = loss_sum / f64::from(((step % 100) + 1) as u32);
            progress(step + 1, last_loss);
            loss_sum = 0.0;
        }
    }
    let info = serde_json::json!({
        "train_episodes": owned.len(),
        "labelled_episodes": used,
        "train_states": ys.len(),
        "final_loss": last_loss,
        "stage_budgets": prep.budgets,
    });
    let meta = ProgressMeta {
        kind: "progress".into(),
        state_dim,
        norm: norm.clone(),
        config: cfg.clone(),
        stages: prep.names.clone(),
        image_shape: prep.image_shape,
        text: prep.text.clone(),
        info,
    };
    Ok(ProgressModel {
        net: Mutex::new(net.valid()),
        device: device.clone(),
        meta,
        clamped: Default::default(),
    })
}

use burn::tensor::ElementConversion as _;

/// Up to `n` pairs (earlier, later) of rows of one span whose labels increase.
fn rank_pairs(
    spans: &[std::ops::Range<usize>],
    ys: &[f32],
    n: usize,
    r: &mut diffrl_core::seeding::Rng,
) -> (Vec<usize>, Vec<usize>) {
    let (mut early, mut late) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let usable: Vec<&std::ops::Range<usize>> = spans.iter().filter(|s| s.len() >= 2).collect();
    if usable.is_empty() {
        return (early, late);
    }
    for _ in 0..n {
        let s = usable[r.random_range(0..usable.len())];
        let (a, b) = (r.random_range(s.clone()), r.random_range(s.clone()));
        let (a, b) = (a.min(b), a.max(b));
        if ys[b] > ys[a] {
            early.push(a);
            late.push(b);
        }
    }
    (early, late)
}

/// Writes the model folder (`model.safetensors` + `reward.json`) atomically.
pub fn save<B: Backend>(model: &ProgressModel<B>, dir: &Path) -> Result<(), RewardError> {
    let net = model.net.lock().unwrap_or_else(|p| p.into_inner());
    crate::folder::save(dir, &*net, &model.meta)
}

/// Loads a model folder written by [`save`].
pub fn load<B: Backend>(dir: &Path, device: &B::Device) -> Result<ProgressModel<B>, RewardError> {
    let meta: ProgressMeta = crate::folder::load_meta(
        dir,
        "progress",
        "a progress model",
        "diffrl reward train",
        &[
            ("context", serde_json::json!(1)),
            ("context_stride", serde_json::json!(1)),
        ],
    )?;
    if meta.norm.dim() != meta.state_dim {
        return Err(RewardError::Checkpoint {
            path: dir.join(META_FILE),
            message: "normaliser and state_dim disagree".into(),
        });
    }
    // Settings that would not build a network (edited or corrupt files) are errors, not panics.
    meta.config
        .validate()
        .map_err(|e| RewardError::Checkpoint {
            path: dir.join(META_FILE),
            message: e.to_string(),
        })?;
    if meta.config.text != meta.text.is_some() {
        return Err(RewardError::Checkpoint {
            path: dir.join(META_FILE),
            message: "config.text and the instruction encoding (text) disagree".into(),
        });
    }
    let text_dim = meta.text.as_ref().map_or(0, TextCode::dim);
    let mut net = ProgressNet::<B>::new(
        meta.state_dim,
        meta.image_shape,
        text_dim,
        &meta.config,
        device,
    );
    crate::folder::load_weights(dir, &mut net)?;
    Ok(ProgressModel {
        net: Mutex::new(net),
        device: device.clone(),
        meta,
        clamped: Default::default(),
    })
}

/// Held-out metrics: VOC and monotonicity over successful episodes; pairwise accuracy over
/// (success, failure) pairs of equal length (the failure cut to the success's length, final
/// progress compared); AUROC of final progress as a success detector.
pub fn evaluate<B: Backend>(
    model: &ProgressModel<B>,
    episodes: &[&Episode],
) -> Result<RewardMetrics, RewardError> {
    let before = model.clamped();
    let mut m = metrics_of(episodes, &mut |ep| model.episode_progress(ep))?;
    m.clamped = model.clamped() - before;
    Ok(m)
}

/// The same metrics for fused progress (progress model for Phi(s_0), hop model for the rest).
pub fn evaluate_fused<B: Backend>(
    model: &ProgressModel<B>,
    hop: &crate::hop::HopModel<B>,
    episodes: &[&Episode],
) -> Result<RewardMetrics, RewardError> {
    metrics_of(episodes, &mut |ep| {
        let mut states: Vec<&[f32]> = ep.observations.iter().map(|o| o.state.as_slice()).collect();
        if let Some(f) = &ep.final_observation {
            states.push(&f.state);
        }
        let first: Vec<&Observation> = ep.observations.iter().take(1).collect();
        let phi0 = model.predict_obs_with_task(&first, ep.task.as_deref())?;
        Ok(hop
            .fuse(&states, phi0.first().copied().unwrap_or(0.0))?
            .fused)
    })
}

fn metrics_of(
    episodes: &[&Episode],
    progress_of: &mut dyn FnMut(&Episode) -> Result<Vec<f64>, RewardError>,
) -> Result<RewardMetrics, RewardError> {
    let mut succ = Vec::new();
    let mut fail = Vec::new();
    for ep in episodes {
        if ep.observations.is_empty() {
            continue;
        }
        let p = progress_of(ep)?;
        if ep.success() {
            succ.push(p);
        } else {
            fail.push(p);
        }
    }
    let mut pairs = Vec::new();
    for s in &succ {
        let l = s.len();
        for f in &fail {
            if f.len() >= l {
                pairs.push((s[l - 1], f[l - 1]));
            }
        }
    }
    let finals: Vec<f64> = succ.iter().chain(&fail).map(|p| p[p.len() - 1]).collect();
    let labels: Vec<bool> = succ
        .iter()
        .map(|_| true)
        .chain(fail.iter().map(|_| false))
        .collect();
    Ok(RewardMetrics {
        voc: voc(&succ),
        voc_trajectories: succ.len(),
        pairwise_accuracy: pairwise_accuracy(&pairs),
        pairs: pairs.len(),
        success_auroc: auroc(&finals, &labels),
        monotonicity: monotonicity(&succ, 0.01),
        clamped: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranking_pairs_stay_inside_an_episode_and_follow_its_labels() {
        // Two episodes: rows 0..4 (labels rise, then a plateau) and 4..7; one single-row span.
        let spans = vec![0..4, 4..7, 7..8];
        let ys = [0.0, 0.5, 0.5, 1.0, 0.2, 0.4, 0.9, 0.3];
        let (early, late) = rank_pairs(&spans, &ys, 500, &mut rng(3));
        assert!(early.len() > 200, "{}", early.len());
        for (&a, &b) in early.iter().zip(&late) {
            let span = spans.iter().position(|s| s.contains(&a)).unwrap();
            assert!(spans[span].contains(&b) && span < 2, "{a} {b}");
            assert!(a < b && ys[b] > ys[a], "{a} {b}");
        }
        // The plateau (rows 1 and 2) is never a pair.
        assert!(!early.iter().zip(&late).any(|(&a, &b)| (a, b) == (1, 2)));
        // Nothing to rank: no pairs.
        assert!(
            rank_pairs(std::slice::from_ref(&(0..1)), &[0.5], 10, &mut rng(0))
                .0
                .is_empty()
        );
    }
}
