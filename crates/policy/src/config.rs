//! Policy configuration: every field has a default and is validated before a model is built.

use diffrl_core::config::{Invalid, Validate, ensure};
use serde::{Deserialize, Serialize};

use crate::schedule::{Prediction, SamplerKind, ScheduleKind};

/// Which policy family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Diffusion policy (epsilon prediction) with step-wise reverse-kernel likelihoods.
    #[default]
    Diffusion,
    /// Gaussian MLP policy over the action chunk (baseline).
    Gaussian,
}

/// Which denoiser network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DenoiserKind {
    /// Residual MLP over the flattened chunk (fast; the CPU default).
    #[default]
    Mlp,
    /// 1-D temporal U-Net with FiLM conditioning (the Diffusion Policy architecture).
    Unet,
    /// Joint multi-agent planner: one token per agent, cross-attention to the agent's entity
    /// tokens (lanes, neighbours), self-attention across agents, AdaLN-Zero conditioning on the
    /// denoising step (docs/policy.md, "The joint planner").
    Joint,
}

/// Element-wise nonlinearity of the MLPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// x * tanh(softplus(x)) (Diffusion Policy's choice).
    #[default]
    Mish,
    /// x * sigmoid(x).
    Silu,
    /// max(x, 0).
    Relu,
}

/// The whole policy: horizons, encoder, denoiser and diffusion settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Policy family.
    pub kind: PolicyKind,
    /// Observation horizon To: how many past observations are stacked.
    pub obs_horizon: usize,
    /// Prediction horizon Tp: actions per predicted chunk.
    pub pred_horizon: usize,
    /// Executed horizon Ta: actions executed before the policy is called again (Ta <= Tp).
    pub action_horizon: usize,
    /// Observation encoder.
    pub encoder: EncoderConfig,
    /// Denoiser network (diffusion) or mean network (Gaussian).
    pub denoiser: DenoiserConfig,
    /// Diffusion process, sampling and likelihood settings.
    pub diffusion: DiffusionConfig,
    /// Gaussian policy settings.
    pub gaussian: GaussianConfig,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            kind: PolicyKind::Diffusion,
            obs_horizon: 1,
            pred_horizon: 4,
            action_horizon: 4,
            encoder: EncoderConfig::default(),
            denoiser: DenoiserConfig::default(),
            diffusion: DiffusionConfig::default(),
            gaussian: GaussianConfig::default(),
        }
    }
}

/// Observation encoders.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EncoderConfig {
    /// Hidden widths of the state MLP; empty = the normalised state history is the condition.
    pub state_hidden: Vec<usize>,
    /// Output width of the state MLP (ignored when `state_hidden` is empty).
    pub state_out: usize,
    /// Image encoder (used only for pixel observations).
    pub image: ImageEncoderConfig,
    /// Instruction encoder (`[policy.encoder.text]`; used only when the environment's
    /// observations carry text). Left out of a serialised config while it has its defaults, so
    /// the configs and checkpoints of policies without text read as before it existed.
    #[serde(skip_serializing_if = "TextEncoderConfig::is_default")]
    pub text: TextEncoderConfig,
    /// Weight of behaviour cloning's auxiliary loss: a linear head on the condition vector
    /// (state, image and instruction features) regresses the task's privileged values of the
    /// newest frame (`Task::privileged_recorded`, standardised: lang-cubes' cube centres and
    /// the instruction's goal, the arm tasks' cube centres), so the encoders learn where things
    /// are and what the words ask from a dense signal, not only through the denoising loss
    /// (docs/policy.md, "An auxiliary target for the encoders"). The policy never reads the
    /// privileged values. 0 (the default, left out of a serialised config): no head, no
    /// auxiliary loss.
    #[serde(skip_serializing_if = "is_zero")]
    pub aux_weight: f64,
}

impl Default for EncoderConfig {
    fn default() -> Self {
        Self {
            state_hidden: Vec::new(),
            state_out: 64,
            image: ImageEncoderConfig::default(),
            text: TextEncoderConfig::default(),
            aux_weight: 0.0,
        }
    }
}

/// Word-level instruction encoder of language-conditioned policies (docs/policy.md, "Language
/// conditioning"): token + learned position embeddings, `layers` pre-norm Transformer encoder
/// layers over the words (padding masked), masked mean-pooling, a linear map to `out_dim`. Its
/// output joins the condition vector the denoiser reads (the U-Net through FiLM).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TextEncoderConfig {
    /// Most words an instruction may have (longer ones are refused, never cut); every
    /// instruction is padded to this many tokens.
    pub max_tokens: usize,
    /// Width of the token embeddings and of the Transformer.
    pub d_model: usize,
    /// Attention heads per layer (must divide `d_model`).
    pub heads: usize,
    /// Transformer encoder layers.
    pub layers: usize,
    /// Hidden width of each layer's feed-forward block (4 x d_model in Vaswani et al. 2017).
    pub ff_dim: usize,
    /// Width of the instruction features appended to the condition vector.
    pub out_dim: usize,
}

impl Default for TextEncoderConfig {
    fn default() -> Self {
        Self {
            max_tokens: 16,
            d_model: 64,
            heads: 4,
            layers: 1,
            ff_dim: 256,
            out_dim: 64,
        }
    }
}

impl TextEncoderConfig {
    /// Whether every field has its default (the section is then not written out).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Which image encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ImageEncoderKind {
    /// Small ResNet-style CNN with GroupNorm and a spatial-softmax head (`vision.rs`).
    #[default]
    Cnn,
    /// Non-overlapping patches through a shared MLP and a linear read-out (`patches.rs`).
    Patches,
    /// The patch MLP with a keypoint read-out (`patches.rs`): `keypoints` soft-argmax image
    /// positions, each a softmax over the patches of the patch centres plus a learned
    /// sub-patch offset, then a linear map to `out_dim`. The features move smoothly with what
    /// they locate, where the linear read-out keeps one weight per patch position.
    PatchKeypoints,
}

impl ImageEncoderKind {
    fn is_cnn(&self) -> bool {
        *self == Self::Cnn
    }

    /// Whether the encoder cuts the image into patches (`patches` or `patch-keypoints`).
    pub fn is_patches(self) -> bool {
        matches!(self, Self::Patches | Self::PatchKeypoints)
    }
}

/// The image encoder: a small ResNet-style CNN with GroupNorm and a spatial-softmax head
/// (`kind = "cnn"`, default), or patch embeddings with a linear read-out (`kind = "patches"`) or
/// a keypoint read-out (`kind = "patch-keypoints"`).
/// The patch keys are left out of a CNN config's serialised form, so CNN checkpoints and run
/// fingerprints are unchanged by their existence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImageEncoderConfig {
    /// `cnn` or `patches`.
    #[serde(skip_serializing_if = "ImageEncoderKind::is_cnn")]
    pub kind: ImageEncoderKind,
    /// CNN: channels of each residual stage (each stage halves the resolution).
    pub channels: Vec<usize>,
    /// CNN: GroupNorm groups (must divide every channel count).
    pub groups: usize,
    /// CNN and patch-keypoints: keypoints of the spatial-softmax head (2 features each).
    pub keypoints: usize,
    /// Output feature width per frame.
    pub out_dim: usize,
    /// Patches: side of a square patch in pixels (images are zero-padded to a multiple).
    #[serde(skip_serializing_if = "is_default_patch_size")]
    pub patch_size: usize,
    /// Patches: width of the patch MLP's hidden layer (and of the position embedding).
    #[serde(skip_serializing_if = "is_default_patch_hidden")]
    pub patch_hidden: usize,
    /// Patches: features per patch fed to the read-out.
    #[serde(skip_serializing_if = "is_default_token_dim")]
    pub token_dim: usize,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

const DEFAULT_PATCH_SIZE: usize = 8;
const DEFAULT_PATCH_HIDDEN: usize = 64;
const DEFAULT_TOKEN_DIM: usize = 32;

fn is_false(v: &bool) -> bool {
    !v
}

fn is_default_patch_size(v: &usize) -> bool {
    *v == DEFAULT_PATCH_SIZE
}

fn is_default_patch_hidden(v: &usize) -> bool {
    *v == DEFAULT_PATCH_HIDDEN
}

fn is_default_token_dim(v: &usize) -> bool {
    *v == DEFAULT_TOKEN_DIM
}

impl Default for ImageEncoderConfig {
    fn default() -> Self {
        Self {
            kind: ImageEncoderKind::Cnn,
            channels: vec![16, 32, 64],
            groups: 8,
            keypoints: 32,
            out_dim: 64,
            patch_size: DEFAULT_PATCH_SIZE,
            patch_hidden: DEFAULT_PATCH_HIDDEN,
            token_dim: DEFAULT_TOKEN_DIM,
        }
    }
}

/// Denoiser network settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DenoiserConfig {
    /// Architecture.
    pub kind: DenoiserKind,
    /// Residual MLP width.
    pub hidden: usize,
    /// Residual MLP blocks (two linear layers each).
    pub blocks: usize,
    /// Residual MLP: FiLM-modulate every block by the condition (docs/policy.md, "FiLM in the
    /// residual MLP, and what the denoiser predicts"). Left out of a serialised config while false, so earlier checkpoints
    /// read as before.
    #[serde(skip_serializing_if = "is_false")]
    pub film: bool,
    /// Sinusoidal step-embedding width.
    pub step_embed_dim: usize,
    /// Nonlinearity.
    pub activation: Activation,
    /// U-Net channel widths per level.
    pub unet_down_dims: Vec<usize>,
    /// U-Net temporal kernel size (odd).
    pub unet_kernel: usize,
    /// U-Net GroupNorm groups.
    pub unet_groups: usize,
    /// The joint planner (`kind = "joint"`). Left out of a serialised config while it has its
    /// defaults, so the configs and checkpoints of other denoisers read as before it existed.
    #[serde(skip_serializing_if = "PlannerConfig::is_default")]
    pub planner: PlannerConfig,
}

/// Sizes of the joint planner (`[policy.denoiser.planner]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlannerConfig {
    /// Token width.
    pub d_model: usize,
    /// Attention heads (must divide `d_model`).
    pub heads: usize,
    /// Blocks of [cross-attention to entities, self-attention across agents, MLP].
    pub layers: usize,
    /// Hidden width of each block's MLP.
    pub ff_dim: usize,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        Self {
            d_model: 64,
            heads: 4,
            layers: 2,
            ff_dim: 128,
        }
    }
}

impl PlannerConfig {
    /// Whether every field has its default (the section is then not written out).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl Default for DenoiserConfig {
    fn default() -> Self {
        Self {
            kind: DenoiserKind::Mlp,
            hidden: 256,
            blocks: 3,
            film: false,
            step_embed_dim: 32,
            activation: Activation::Mish,
            unet_down_dims: vec![64, 128, 256],
            unet_kernel: 5,
            unet_groups: 8,
            planner: PlannerConfig::default(),
        }
    }
}

/// Diffusion process (docs/algorithms.md §1–2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiffusionConfig {
    /// Beta schedule.
    pub schedule: ScheduleKind,
    /// Training steps T of the forward process.
    pub train_steps: usize,
    /// Chain length K: reverse steps per policy call (DDPM requires K = T).
    pub denoising_steps: usize,
    /// Reverse sampler.
    pub sampler: SamplerKind,
    /// DDIM eta while collecting stochastic rollouts (1 = DDPM-like variance).
    pub eta: f64,
    /// DDIM eta for deterministic evaluation (0 = deterministic DDIM).
    pub eval_eta: f64,
    /// x0 estimates are clamped to [-clip_x0, clip_x0] (actions are normalised to [-1, 1]).
    pub clip_x0: f64,
    /// Floor on the sampling standard deviation in stochastic rollouts.
    pub min_sampling_std: f64,
    /// Floor on the standard deviation used for log-likelihoods.
    pub min_logprob_std: f64,
    /// Per-element log-prob clamp [lo, hi], applied before reduction. The upper bound in force
    /// is never below the density's peak at `min_logprob_std` ([`DiffusionConfig::logprob_bounds`]).
    pub logprob_clamp: [f64; 2],
    /// Sampling noise is clipped to +-noise_clip standard deviations.
    pub noise_clip: f64,
    /// K': the last K' denoising steps use the trainable network (0 = all K).
    pub ft_denoising_steps: usize,
    /// What the denoiser predicts: `"epsilon"` (the noise, Diffusion Policy's default),
    /// `"sample"` (the clean chunk) or `"v_prediction"` (the velocity; docs/policy.md, "FiLM in
    /// the residual MLP, and what the denoiser predicts"). Left out of a
    /// serialised config while `"epsilon"`, so earlier checkpoints read as before.
    #[serde(skip_serializing_if = "Prediction::is_epsilon")]
    pub prediction: Prediction,
}

impl Default for DiffusionConfig {
    fn default() -> Self {
        Self {
            schedule: ScheduleKind::Cosine,
            train_steps: 100,
            denoising_steps: 10,
            sampler: SamplerKind::Ddim,
            eta: 1.0,
            eval_eta: 0.0,
            clip_x0: 1.0,
            min_sampling_std: 0.1,
            min_logprob_std: 0.1,
            logprob_clamp: [-5.0, 2.0],
            noise_clip: 3.0,
            ft_denoising_steps: 0,
            prediction: Prediction::Epsilon,
        }
    }
}

impl DiffusionConfig {
    /// K' resolved (0 means every step).
    pub fn ft_steps(&self) -> usize {
        if self.ft_denoising_steps == 0 {
            self.denoising_steps
        } else {
            self.ft_denoising_steps
        }
    }

    /// The per-element log-prob clamp in force: `logprob_clamp` with its upper bound raised to
    /// the Gaussian's peak density at `min_logprob_std`, -ln(std) - ln(2 pi) / 2, where that is
    /// higher. With the 0.1 floor the peak is 1.38 and [-5, 2] applies as given (DPPO's clamp);
    /// with fine-tuning's 0.03 floor the peak is 2.59, and an upper bound of 2 would cut the
    /// log-prob of every element within 1.09 std of the mean, 72% of the samples of the last
    /// chain steps, and with it their gradient (docs/algorithms.md §2).
    pub fn logprob_bounds(&self) -> [f64; 2] {
        let peak = -self.min_logprob_std.ln() - crate::diffusion::HALF_LN_2PI;
        [self.logprob_clamp[0], self.logprob_clamp[1].max(peak)]
    }
}

/// Gaussian MLP policy settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GaussianConfig {
    /// Hidden widths of the mean network.
    pub hidden: Vec<usize>,
    /// Initial standard deviation (state-independent, learned, in normalised action units).
    pub init_std: f64,
    /// Floor on the standard deviation.
    pub min_std: f64,
}

impl Default for GaussianConfig {
    fn default() -> Self {
        Self {
            hidden: vec![256, 256, 256],
            init_std: 0.1,
            min_std: 0.01,
        }
    }
}

impl Validate for PolicyConfig {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(self.obs_horizon >= 1, "obs_horizon", "must be >= 1")?;
        ensure(self.pred_horizon >= 1, "pred_horizon", "must be >= 1")?;
        ensure(
            (1..=self.pred_horizon).contains(&self.action_horizon),
            "action_horizon",
            format!("must be in 1..=pred_horizon ({})", self.pred_horizon),
        )?;
        let e = &self.encoder;
        ensure(
            e.state_hidden.is_empty() || e.state_out >= 1,
            "encoder.state_out",
            "must be >= 1",
        )?;
        let im = &e.image;
        ensure(
            !im.channels.is_empty(),
            "encoder.image.channels",
            "must not be empty",
        )?;
        ensure(
            im.groups >= 1 && im.channels.iter().all(|c| c.is_multiple_of(im.groups)),
            "encoder.image.groups",
            format!("must divide every channel count {:?}", im.channels),
        )?;
        ensure(im.keypoints >= 1, "encoder.image.keypoints", "must be >= 1")?;
        ensure(im.out_dim >= 1, "encoder.image.out_dim", "must be >= 1")?;
        ensure(
            (1..=64).contains(&im.patch_size),
            "encoder.image.patch_size",
            format!("must be in 1..=64 pixels, got {}", im.patch_size),
        )?;
        ensure(
            im.patch_hidden >= 1,
            "encoder.image.patch_hidden",
            "must be >= 1",
        )?;
        ensure(im.token_dim >= 1, "encoder.image.token_dim", "must be >= 1")?;
        ensure(
            self.encoder.aux_weight >= 0.0 && self.encoder.aux_weight.is_finite(),
            "encoder.aux_weight",
            "must be a finite number >= 0 (0 = no auxiliary loss)",
        )?;
        ensure(
            self.encoder.aux_weight == 0.0 || self.kind == PolicyKind::Diffusion,
            "encoder.aux_weight",
            "applies to diffusion policies only (kind = \"diffusion\"); set it to 0",
        )?;
        let t = &e.text;
        ensure(t.max_tokens >= 1, "encoder.text.max_tokens", "must be >= 1")?;
        ensure(t.d_model >= 1, "encoder.text.d_model", "must be >= 1")?;
        ensure(
            t.heads >= 1 && t.d_model.is_multiple_of(t.heads),
            "encoder.text.heads",
            format!("must be >= 1 and divide d_model = {}", t.d_model),
        )?;
        ensure(t.layers >= 1, "encoder.text.layers", "must be >= 1")?;
        ensure(t.ff_dim >= 1, "encoder.text.ff_dim", "must be >= 1")?;
        ensure(t.out_dim >= 1, "encoder.text.out_dim", "must be >= 1")?;
        let d = &self.denoiser;
        ensure(d.hidden >= 1, "denoiser.hidden", "must be >= 1")?;
        ensure(
            d.step_embed_dim >= 4 && d.step_embed_dim.is_multiple_of(2),
            "denoiser.step_embed_dim",
            "must be even and >= 4",
        )?;
        ensure(
            !d.unet_down_dims.is_empty(),
            "denoiser.unet_down_dims",
            "must not be empty",
        )?;
        ensure(
            d.unet_kernel % 2 == 1,
            "denoiser.unet_kernel",
            "must be odd",
        )?;
        ensure(
            d.unet_groups >= 1
                && d.unet_down_dims
                    .iter()
                    .all(|c| c.is_multiple_of(d.unet_groups)),
            "denoiser.unet_groups",
            format!("must divide every U-Net width {:?}", d.unet_down_dims),
        )?;
        let p = &d.planner;
        ensure(p.d_model >= 1, "denoiser.planner.d_model", "must be >= 1")?;
        ensure(
            p.heads >= 1 && p.d_model.is_multiple_of(p.heads),
            "denoiser.planner.heads",
            format!("must be >= 1 and divide d_model = {}", p.d_model),
        )?;
        ensure(p.layers >= 1, "denoiser.planner.layers", "must be >= 1")?;
        ensure(p.ff_dim >= 1, "denoiser.planner.ff_dim", "must be >= 1")?;
        ensure(
            d.kind != DenoiserKind::Joint || self.encoder.state_hidden.is_empty(),
            "encoder.state_hidden",
            "the joint planner reads the agents' blocks of the state itself: leave \
             state_hidden empty",
        )?;
        ensure(
            d.kind != DenoiserKind::Joint || self.kind == PolicyKind::Diffusion,
            "denoiser.kind",
            "the joint planner is a diffusion denoiser (kind = \"diffusion\")",
        )?;
        let f = &self.diffusion;
        ensure(f.train_steps >= 1, "diffusion.train_steps", "must be >= 1")?;
        ensure(
            (1..=f.train_steps).contains(&f.denoising_steps),
            "diffusion.denoising_steps",
            format!("K must be in 1..=train_steps ({})", f.train_steps),
        )?;
        ensure(
            f.train_steps.is_multiple_of(f.denoising_steps),
            "diffusion.denoising_steps",
            format!(
                "K = {} must divide train_steps = {} (leading-spaced DDIM)",
                f.denoising_steps, f.train_steps
            ),
        )?;
        ensure(
            f.sampler != SamplerKind::Ddpm || f.denoising_steps == f.train_steps,
            "diffusion.sampler",
            "ddpm steps through every training step: set denoising_steps = train_steps or use ddim",
        )?;
        ensure(
            f.ft_denoising_steps <= f.denoising_steps,
            "diffusion.ft_denoising_steps",
            format!(
                "K' = {} exceeds the chain length K = {}",
                f.ft_denoising_steps, f.denoising_steps
            ),
        )?;
        for (name, v) in [("eta", f.eta), ("eval_eta", f.eval_eta)] {
            ensure(
                (0.0..=1.0).contains(&v),
                &format!("diffusion.{name}"),
                "must be in [0, 1]",
            )?;
        }
        ensure(f.clip_x0 > 0.0, "diffusion.clip_x0", "must be > 0")?;
        ensure(
            f.min_sampling_std >= 0.0 && f.min_logprob_std > 0.0,
            "diffusion.min_logprob_std",
            "min_logprob_std must be > 0 and min_sampling_std >= 0",
        )?;
        ensure(
            f.logprob_clamp[0] < f.logprob_clamp[1],
            "diffusion.logprob_clamp",
            "needs lo < hi",
        )?;
        ensure(f.noise_clip > 0.0, "diffusion.noise_clip", "must be > 0")?;
        let g = &self.gaussian;
        ensure(
            g.init_std > 0.0 && g.min_std > 0.0 && g.min_std <= g.init_std,
            "gaussian.init_std",
            "needs 0 < min_std <= init_std",
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CNN config serialises as it did before the patch encoder existed, so CNN checkpoints'
    /// configs and the run fingerprints that hash them stay the same; a patches config keeps
    /// its kind and its non-default patch keys.
    #[test]
    fn patch_keys_are_serialised_only_for_patch_encoders() {
        let cnn = serde_json::to_value(ImageEncoderConfig::default()).unwrap();
        let keys: Vec<&str> = cnn
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["channels", "groups", "keypoints", "out_dim"]);
        let patches = ImageEncoderConfig {
            kind: ImageEncoderKind::Patches,
            patch_size: 4,
            ..ImageEncoderConfig::default()
        };
        let v = serde_json::to_value(&patches).unwrap();
        assert_eq!(v["kind"], "patches");
        assert_eq!(v["patch_size"], 4);
        let back: ImageEncoderConfig = serde_json::from_value(v).unwrap();
        assert_eq!(back, patches);
    }

    #[test]
    fn the_text_section_is_written_only_when_set_and_is_validated() {
        let plain = serde_json::to_string(&PolicyConfig::default()).unwrap();
        assert!(!plain.contains("\"text\""), "{plain}");
        let mut c = PolicyConfig::default();
        c.encoder.text.heads = 3;
        assert_eq!(c.validate().unwrap_err().field, "encoder.text.heads");
        c.encoder.text.heads = 2;
        c.encoder.text.max_tokens = 0;
        assert_eq!(c.validate().unwrap_err().field, "encoder.text.max_tokens");
        c.encoder.text.max_tokens = 8;
        c.validate().unwrap();
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains("\"max_tokens\":8"), "{json}");
        assert_eq!(serde_json::from_str::<PolicyConfig>(&json).unwrap(), c);
        assert!(serde_json::from_str::<TextEncoderConfig>(r#"{"dmodel": 8}"#).is_err());
    }
}
