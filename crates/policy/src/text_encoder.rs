//! The instruction encoder of language-conditioned policies (docs/policy.md, "Language
//! conditioning"):
//!
//! ```text
//! h_0 = TokenEmbedding(ids) + PositionEmbedding[0..L]            [B, L, d_model], both N(0, 0.02) at init
//! h   = LayerNorm(TransformerEncoder^layers(h_0, padding mask))   (pre-norm, no dropout)
//! z   = Linear(sum_l keep_l h_l / max(1, sum_l keep_l))           [B, out_dim]
//! ```
//!
//! with keep_l = 0 at padding positions. `z` joins the observation encoder's condition vector,
//! which the denoiser reads (the U-Net through FiLM).

use burn::module::{Initializer, Module, Param};
use burn::nn::attention::MultiHeadAttention;
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderLayer,
};
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData, activation};

use crate::config::TextEncoderConfig;
use crate::nn::gelu;
use crate::tokenizer::Tokens;

/// Encoded instructions of a batch: each distinct instruction once, and which one each batch
/// element reads. A batch holds few distinct instructions (a language suite has tens of
/// paraphrases, a BC batch hundreds of rows), so the encoder runs on the distinct ones only.
#[derive(Debug, Clone)]
pub struct TextTokens<B: Backend> {
    /// [U, L] token ids of the U distinct instructions, in order of first appearance.
    pub ids: Tensor<B, 2, Int>,
    /// [U, L], true at padding positions.
    pub pad: Tensor<B, 2, Bool>,
    /// [B]: the distinct instruction of each batch element.
    pub rows: Tensor<B, 1, Int>,
    /// `pad`'s values, from which the attention mask is built.
    pad_values: Vec<bool>,
}

impl<B: Backend> TextTokens<B> {
    /// Uploads rows of [`Tokens`] (all of one length), one per batch element.
    pub fn from_rows<'a>(rows: impl IntoIterator<Item = &'a Tokens>, device: &B::Device) -> Self {
        let mut distinct: Vec<&Tokens> = Vec::new();
        let mut index = Vec::new();
        for t in rows {
            let i = match distinct.iter().position(|d| *d == t) {
                Some(i) => i,
                None => {
                    distinct.push(t);
                    distinct.len() - 1
                }
            };
            index.push(i as i64);
        }
        let len = distinct.first().map_or(0, |t| t.ids.len());
        let ids: Vec<i64> = distinct
            .iter()
            .flat_map(|t| t.ids.iter().map(|&i| i as i64))
            .collect();
        let pad: Vec<bool> = distinct
            .iter()
            .flat_map(|t| t.pad.iter().copied())
            .collect();
        let (u, b) = (distinct.len(), index.len());
        Self {
            ids: Tensor::from_data(TensorData::new(ids, [u, len]), device),
            pad: Tensor::from_data(TensorData::new(pad.clone(), [u, len]), device),
            rows: Tensor::from_data(TensorData::new(index, [b]), device),
            pad_values: pad,
        }
    }
}

/// Token + position embeddings, a Transformer encoder, masked mean-pooling and a projection.
#[derive(Module, Debug)]
pub struct TextEncoder<B: Backend> {
    token_embedding: Embedding<B>,
    position_embedding: Param<Tensor<B, 2>>,
    transformer: TransformerEncoder<B>,
    final_norm: LayerNorm<B>,
    output: Linear<B>,
}

impl<B: Backend> TextEncoder<B> {
    /// An encoder for ids below `vocab_size` (the embedding's rows).
    pub fn new(vocab_size: usize, cfg: &TextEncoderConfig, device: &B::Device) -> Self {
        let d = cfg.d_model;
        Self {
            // Token and position embeddings start at the same scale (BERT's N(0, 0.02)), so word
            // order is visible from the start: Burn's default N(0, 1) token embeddings drowned
            // the positions, and "stack red on green" read as "stack green on red".
            token_embedding: EmbeddingConfig::new(vocab_size, d)
                .with_initializer(Initializer::Normal {
                    mean: 0.0,
                    std: 0.02,
                })
                .init(device),
            position_embedding: Initializer::Normal {
                mean: 0.0,
                std: 0.02,
            }
            .init([cfg.max_tokens, d], device),
            // Dropout would draw from Burn's global generator during training, which the
            // seeded runs of this crate never do.
            transformer: TransformerEncoderConfig::new(d, cfg.ff_dim, cfg.heads, cfg.layers)
                .with_dropout(0.0)
                .with_norm_first(true)
                .init(device),
            // Pre-norm layers leave the residual stream unnormalised; the final LayerNorm gives
            // the pooled features unit scale, like the normalised state beside them.
            final_norm: LayerNormConfig::new(d).init(device),
            output: LinearConfig::new(d, cfg.out_dim).init(device),
        }
    }

    /// Rows of the token embedding (the vocabulary size it was built for).
    pub fn vocab_size(&self) -> usize {
        self.token_embedding.weight.dims()[0]
    }

    /// Width of the output.
    pub fn out_dim(&self) -> usize {
        self.output.weight.dims()[1]
    }

    /// The batch's instructions -> [B, out_dim] (each distinct instruction encoded once).
    pub fn forward(&self, text: &TextTokens<B>) -> Tensor<B, 2> {
        let [u, l] = text.ids.dims();
        let d = self.position_embedding.dims()[1];
        let pos = self
            .position_embedding
            .val()
            .narrow(0, 0, l)
            .reshape([1, l * d]);
        // [U, L*d] + [1, L*d]: the shape Burn's CPU backend adds fastest (same values).
        let h = (self
            .token_embedding
            .forward(text.ids.clone())
            .reshape([u, l * d])
            + pos)
            .reshape([u, l, d]);
        let heads = self.transformer.n_heads;
        let mask = attention_mask(&text.pad_values, [u, heads, l], &h.device());
        let h = self
            .transformer
            .layers
            .iter()
            .fold(h, |h, layer| encoder_layer(layer, h, mask.clone()));
        let h = self.final_norm.forward(h);
        let keep = text.pad.clone().bool_not().float().reshape([u, l, 1]);
        let count = keep.clone().sum_dim(1).reshape([u, 1]).clamp_min(1.0);
        let pooled = (h * keep).sum_dim(1).reshape([u, d]) / count;
        self.output.forward(pooled).select(0, text.rows.clone())
    }
}

/// Burn's `TransformerEncoderLayer::forward` as [`TextEncoder::new`] builds the layers
/// (pre-norm, dropout 0, so Burn's dropout returns its input), with two changes that keep the
/// bits: the feed-forward's GELU goes through [`gelu`] (on the CPU backend that node computes
/// erf in vector registers and keeps it for the backward pass, where Burn's GELU calls the
/// scalar erf in both passes), and the attention reads a padding mask already spread over
/// heads and queries ([`self_attention`]). `mask`: [U, heads, L, L] from [`attention_mask`].
fn encoder_layer<B: Backend>(
    layer: &TransformerEncoderLayer<B>,
    x: Tensor<B, 3>,
    mask: Tensor<B, 4, Bool>,
) -> Tensor<B, 3> {
    debug_assert!(layer.norm_first, "the text encoder's layers are pre-norm");
    debug_assert!(
        layer.dropout.prob == 0.0 && layer.mha.dropout.prob == 0.0,
        "the text encoder's layers have no dropout"
    );
    let attended = self_attention(&layer.mha, layer.norm_2.forward(x.clone()), mask);
    let x = x + attended;
    let ff = layer.norm_1.forward(x.clone());
    let ff = layer.pwff.linear_inner.forward(ff);
    x + layer.pwff.linear_outer.forward(gelu(ff))
}

/// Burn's `MultiHeadAttention::forward` on self-attention (dropout 0, plain softmax): the same
/// operations in the same order, with the padding mask given as [U, heads, L, L] rather than
/// Burn's [U, L] seen as [U, 1, 1, L]. Burn's CPU backend copies a broadcast mask element by
/// element in every masked fill, forward and backward; the values filled are the same.
fn self_attention<B: Backend>(
    mha: &MultiHeadAttention<B>,
    x: Tensor<B, 3>,
    mask: Tensor<B, 4, Bool>,
) -> Tensor<B, 3> {
    debug_assert!(
        !mha.quiet_softmax,
        "the text encoder's attention uses softmax"
    );
    let [u, l, d] = x.dims();
    let heads = |linear: &Linear<B>| {
        linear
            .forward(x.clone())
            .reshape([u, l, mha.n_heads, mha.d_k])
            .swap_dims(1, 2)
    };
    let (query, key, value) = (heads(&mha.query), heads(&mha.key), heads(&mha.value));
    let scores = query
        .matmul(key.transpose())
        .div_scalar((mha.d_k as f32).sqrt());
    let weights = activation::softmax(scores.mask_fill(mask, mha.min_float), 3);
    let context = weights.matmul(value).swap_dims(1, 2).reshape([u, l, d]);
    mha.output.forward(context)
}

/// The padding mask as the attention scores' shape: [U, heads, L, L], true where the key
/// (last axis) is padding. `pad`: [U, L] row-major, true at padding positions.
fn attention_mask<B: Backend>(
    pad: &[bool],
    [u, heads, l]: [usize; 3],
    device: &B::Device,
) -> Tensor<B, 4, Bool> {
    let values: Vec<bool> = (0..u)
        .flat_map(|i| {
            let keys = &pad[i * l..(i + 1) * l];
            std::iter::repeat_n(keys, heads * l).flatten().copied()
        })
        .collect();
    Tensor::from_data(TensorData::new(values, [u, heads, l, l]), device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{Strictness, Tokenizer, Vocabulary};

    type Cpu = crate::CpuBackend;

    fn tokenizer() -> Tokenizer {
        Tokenizer::new(Vocabulary::from_texts(["go left", "go right now"]), 5)
    }

    fn rows(texts: &[&str]) -> Vec<Tokens> {
        let t = tokenizer();
        texts
            .iter()
            .map(|s| t.encode(s, Strictness::Strict).unwrap())
            .collect()
    }

    /// The layers as [`TextEncoder::forward`] runs them give Burn's `TransformerEncoder`'s
    /// outputs and gradients bit for bit, padding included.
    #[test]
    fn the_layers_are_burns_encoder_bit_for_bit() {
        use burn::nn::transformer::TransformerEncoderInput;
        type Ad = burn::backend::Autodiff<Cpu>;
        let device = Default::default();
        let cfg = TextEncoderConfig {
            max_tokens: 6,
            d_model: 16,
            heads: 2,
            layers: 2,
            ff_dim: 32,
            out_dim: 3,
        };
        let enc = crate::policy::seeded_init::<Ad, _>(&device, 5, || {
            TextEncoder::<Ad>::new(7, &cfg, &device)
        });
        let values = |n: usize, k: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * k) % 101) as f32 / 25.0 - 2.0)
                .collect()
        };
        let h = Tensor::<Ad, 3>::from_data(
            TensorData::new(values(3 * 6 * 16, 37), [3, 6, 16]),
            &device,
        )
        .require_grad();
        let pad: Vec<bool> = (0..18).map(|i| i % 6 >= [6, 4, 2][i / 6]).collect();
        let mask = attention_mask::<Ad>(&pad, [3, 2, 6], &device);
        let pad = Tensor::<Ad, 2, Bool>::from_data(TensorData::new(pad, [3, 6]), &device);
        let ours = enc
            .transformer
            .layers
            .iter()
            .fold(h.clone(), |h, layer| encoder_layer(layer, h, mask.clone()));
        let burns = enc
            .transformer
            .forward(TransformerEncoderInput::new(h.clone()).mask_pad(pad));
        assert_eq!(bits(ours.clone().inner()), bits(burns.clone().inner()));
        let w = Tensor::<Ad, 3>::from_data(
            TensorData::new(values(3 * 6 * 16, 53), [3, 6, 16]),
            &device,
        );
        let g_ours = (ours * w.clone()).sum().backward();
        let g_burns = (burns * w).sum().backward();
        assert_eq!(
            bits(h.grad(&g_ours).unwrap()),
            bits(h.grad(&g_burns).unwrap())
        );
        for layer in &enc.transformer.layers {
            for weight in [
                &layer.pwff.linear_inner.weight,
                &layer.mha.query.weight,
                &layer.mha.value.weight,
            ] {
                assert_eq!(
                    bits(weight.grad(&g_ours).unwrap()),
                    bits(weight.grad(&g_burns).unwrap())
                );
            }
        }
    }

    /// A CPU tensor's values as bit patterns.
    fn bits<const D: usize>(t: Tensor<Cpu, D>) -> Vec<u32> {
        t.into_data()
            .into_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    #[test]
    fn padding_does_not_change_the_output_and_words_do() {
        let device = Default::default();
        let cfg = TextEncoderConfig {
            max_tokens: 5,
            d_model: 8,
            heads: 2,
            ff_dim: 16,
            out_dim: 3,
            ..TextEncoderConfig::default()
        };
        let vocab = tokenizer().vocabulary().len();
        let enc = crate::policy::seeded_init::<Cpu, _>(&device, 3, || {
            TextEncoder::<Cpu>::new(vocab, &cfg, &device)
        });
        assert_eq!((enc.vocab_size(), enc.out_dim()), (6, 3));
        let rows = rows(&["go left", "go right", "go right now"]);
        let out = enc.forward(&TextTokens::from_rows(&rows, &device));
        assert_eq!(out.dims(), [3, 3]);
        let v: Vec<f32> = out.into_data().convert::<f32>().into_vec().unwrap();
        assert!(v.iter().all(|x| x.is_finite()));
        assert_ne!(v[..3], v[3..6], "different instructions, same features");
        // What sits at padding positions is ignored.
        let mut garbled = rows[0].clone();
        garbled.ids[3] = 5;
        let again = enc.forward(&TextTokens::from_rows([&garbled], &device));
        let w: Vec<f32> = again.into_data().convert::<f32>().into_vec().unwrap();
        for (a, b) in w.iter().zip(&v[..3]) {
            assert!((a - b).abs() < 1e-5, "{w:?} vs {v:?}");
        }
        // A batch repeating instructions encodes each distinct one once and gives every row
        // its own instruction's features.
        let batch = [&rows[2], &rows[0], &rows[2], &rows[1], &rows[0]];
        let text = TextTokens::<Cpu>::from_rows(batch, &device);
        assert_eq!(text.ids.dims()[0], 3, "three distinct instructions");
        let out: Vec<f32> = enc
            .forward(&text)
            .into_data()
            .convert::<f32>()
            .into_vec()
            .unwrap();
        assert_eq!(out.len(), 5 * 3);
        for (row, want) in [(0, 2), (1, 0), (2, 2), (3, 1), (4, 0)] {
            for k in 0..3 {
                let (a, b) = (out[row * 3 + k], v[want * 3 + k]);
                assert!((a - b).abs() < 1e-5, "row {row}: {a} vs {b}");
            }
        }
    }
}
