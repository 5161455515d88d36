//! Observation encoders: the stacked state history (optionally through an MLP), for pixel
//! observations the CNN or the patch encoder per frame, and for language-conditioned policies
//! the instruction encoder ([`TextEncoder`]). Output: one condition vector per batch element,
//! the concatenation of their features.

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::config::{Activation, EncoderConfig};
use crate::nn::{Mlp, activate};
use crate::patches::PatchEncoder;
use crate::text_encoder::{TextEncoder, TextTokens};
use crate::vision::ImageEncoder;

/// What the policy observes, in the shapes the networks need (already normalised).
#[derive(Debug, Clone)]
pub struct ObsTensors<B: Backend> {
    /// [B, To, Ds] normalised state history.
    pub state: Tensor<B, 3>,
    /// [B, To, C, H, W] images scaled to [0, 1], when the policy uses pixels.
    pub image: Option<Tensor<B, 5>>,
    /// The instruction of every batch element, when the policy reads text.
    pub text: Option<TextTokens<B>>,
}

/// State MLP + optional image CNN + optional instruction encoder.
#[derive(Module, Debug)]
pub struct ObsEncoder<B: Backend> {
    state_mlp: Option<Mlp<B>>,
    image: Option<ImageEncoder<B>>,
    patches: Option<PatchEncoder<B>>,
    /// None without text: such policies build and draw exactly what they did before text
    /// existed (same weights, same checkpoints).
    text: Option<TextEncoder<B>>,
    /// Behaviour cloning's auxiliary head: the condition vector -> the task's privileged
    /// values. None unless `aux_weight > 0` and the task names privileged values, so other
    /// policies' weights and checkpoints are unchanged.
    aux: Option<Linear<B>>,
    #[module(skip)]
    act: Activation,
    #[module(skip)]
    out_dim: usize,
}

/// Image geometry seen by the encoder: channels, height, width.
pub type ImageShape = (usize, usize, usize);

impl<B: Backend> ObsEncoder<B> {
    /// An encoder for `obs_horizon` stacked states of `state_dim` (and images of `image`, and
    /// instructions over a vocabulary of `vocab_size` tokens, and an auxiliary head onto `aux`
    /// privileged values when `cfg.aux_weight > 0`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        obs_horizon: usize,
        state_dim: usize,
        image: Option<ImageShape>,
        vocab_size: Option<usize>,
        aux: usize,
        cfg: &EncoderConfig,
        act: Activation,
        device: &B::Device,
    ) -> Self {
        let flat = obs_horizon * state_dim;
        let (state_mlp, state_out) = if cfg.state_hidden.is_empty() {
            (None, flat)
        } else {
            let mut widths = vec![flat];
            widths.extend(&cfg.state_hidden);
            widths.push(cfg.state_out);
            (Some(Mlp::new(&widths, act, device)), cfg.state_out)
        };
        let patches_kind = cfg.image.kind.is_patches();
        let patches = image
            .filter(|_| patches_kind)
            .map(|(c, h, w)| PatchEncoder::new(c, h, w, &cfg.image, device));
        let image = image
            .filter(|_| !patches_kind)
            .map(|(c, h, w)| ImageEncoder::new(c, h, w, &cfg.image, device));
        let image_out = if image.is_some() || patches.is_some() {
            obs_horizon * cfg.image.out_dim
        } else {
            0
        };
        let text = vocab_size.map(|v| TextEncoder::new(v, &cfg.text, device));
        let text_out = text.as_ref().map_or(0, TextEncoder::out_dim);
        let out_dim = state_out + image_out + text_out;
        let aux =
            (aux > 0 && cfg.aux_weight > 0.0).then(|| LinearConfig::new(out_dim, aux).init(device));
        Self {
            state_mlp,
            image,
            patches,
            text,
            aux,
            act,
            out_dim,
        }
    }

    /// Width of the condition vector.
    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// Whether the encoder expects images.
    pub fn uses_images(&self) -> bool {
        self.image.is_some() || self.patches.is_some()
    }

    /// The instruction encoder, when the policy reads text.
    pub fn text(&self) -> Option<&TextEncoder<B>> {
        self.text.as_ref()
    }

    /// [B, cond_dim] condition: [state features, image features, instruction features].
    ///
    /// # Panics
    /// When the encoder reads text and `obs` carries none (`Policy::obs_tensors` refuses such
    /// observations with an error before they get here).
    pub fn forward(&self, obs: &ObsTensors<B>) -> Tensor<B, 2> {
        self.forward_aux(obs).0
    }

    /// Whether the encoder has behaviour cloning's auxiliary head.
    pub fn has_aux(&self) -> bool {
        self.aux.is_some()
    }

    /// [`ObsEncoder::forward`], and the auxiliary head's prediction [B, A] from the condition
    /// when the encoder has the head.
    pub fn forward_aux(&self, obs: &ObsTensors<B>) -> (Tensor<B, 2>, Option<Tensor<B, 2>>) {
        let [b, to, ds] = obs.state.dims();
        let mut cond = obs.state.clone().reshape([b, to * ds]);
        if let Some(mlp) = &self.state_mlp {
            cond = activate(self.act, mlp.forward(cond));
        }
        if let Some(img) = &obs.image {
            let [b, to, c, h, w] = img.dims();
            let frames = img.clone().reshape([b * to, c, h, w]);
            let feats = match (&self.image, &self.patches) {
                (Some(enc), _) => Some(enc.forward(frames)),
                (None, Some(enc)) => Some(enc.forward(frames)),
                (None, None) => None,
            };
            if let Some(feats) = feats {
                let d = feats.dims()[1];
                cond = Tensor::cat(vec![cond, feats.reshape([b, to * d])], 1);
            }
        }
        if let Some(enc) = &self.text {
            let text = obs
                .text
                .as_ref()
                .expect("a language-conditioned policy needs the instruction tokens");
            cond = Tensor::cat(vec![cond, enc.forward(text)], 1);
        }
        let aux = self.aux.as_ref().map(|head| head.forward(cond.clone()));
        (cond, aux)
    }
}
