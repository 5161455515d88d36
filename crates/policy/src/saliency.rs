//! Where a pixel policy looks: occlusion saliency of its newest camera frame (Zeiler and Fergus,
//! "Visualizing and understanding convolutional networks", 2014). Each square of the frame is
//! replaced by the frame's mean colour in turn, and the saliency of the square is how far the
//! policy's deterministic action chunk moves. It needs no gradients, so it works on any backend
//! and for every image encoder; one batched chain per call (squares + 1 rows).

use burn::tensor::backend::Backend;
use diffrl_core::seeding::rng;

use crate::diffusion::SampleMode;
use crate::error::PolicyError;
use crate::policy::{ObsBatch, Policy};

/// Saliency of the squares of one camera frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Saliency {
    /// Squares per column of the frame.
    pub rows: usize,
    /// Squares per row of the frame.
    pub cols: usize,
    /// Side of a square in pixels (the last row and column may be cut by the frame's edge).
    pub square: usize,
    /// Per square, row-major: root-mean-square change of the action chunk (normalised action
    /// units, the whole chunk of Tp actions) when the square is occluded. >= 0.
    pub values: Vec<f32>,
}

impl<B: Backend> Policy<B> {
    /// Occlusion saliency of the newest camera frame of row `row` of `obs`, in squares of
    /// `square` pixels. Every chain of the call starts from the same noise (seeded with `seed`)
    /// and runs deterministically, so the rows differ only in the occluded square. Errors when
    /// the policy reads no images, `row` is not in the batch or `square` is 0.
    pub fn occlusion_saliency(
        &self,
        obs: &ObsBatch,
        row: usize,
        square: usize,
        seed: u64,
        device: &B::Device,
    ) -> Result<Saliency, PolicyError> {
        let Some([c, h, w]) = self.spec.image else {
            return Err(PolicyError::Missing(
                "occlusion saliency needs a policy that reads images".into(),
            ));
        };
        let shape = |what: &str, expected: usize, got: usize| PolicyError::Shape {
            what: what.into(),
            expected,
            got,
        };
        if square == 0 {
            return Err(shape("saliency square side (pixels, at least 1)", 1, 0));
        }
        if row >= obs.batch {
            return Err(shape("saliency row (inside the batch)", obs.batch, row));
        }
        let to = self.config.obs_horizon;
        let (per_state, per_frame) = (to * self.spec.state_dim, h * w * c);
        let image = obs
            .image
            .as_ref()
            .ok_or_else(|| PolicyError::Missing("the observation has no image".into()))?;
        if obs.state.len() != obs.batch * per_state {
            return Err(shape(
                &format!(
                    "observation.state ({} x {to} x {})",
                    obs.batch, self.spec.state_dim
                ),
                obs.batch * per_state,
                obs.state.len(),
            ));
        }
        if image.len() != obs.batch * to * per_frame {
            return Err(shape(
                &format!("observation.image ({} x {to} x {h} x {w} x {c})", obs.batch),
                obs.batch * to * per_frame,
                image.len(),
            ));
        }
        let state = &obs.state[row * per_state..(row + 1) * per_state];
        let frames = &image[row * to * per_frame..(row + 1) * to * per_frame];
        let newest = (to - 1) * per_frame;
        let mean: Vec<u8> = (0..c)
            .map(|ch| {
                let sum: u64 = frames[newest..]
                    .iter()
                    .skip(ch)
                    .step_by(c)
                    .map(|&v| u64::from(v))
                    .sum();
                (sum / (h * w) as u64) as u8
            })
            .collect();
        let (rows, cols) = (h.div_ceil(square), w.div_ceil(square));
        let n = rows * cols + 1;
        let mut batch = ObsBatch {
            batch: n,
            state: state.repeat(n),
            image: Some(frames.repeat(n)),
            text: match &obs.text {
                Some(t) if t.len() == obs.batch => Some(vec![t[row].clone(); n]),
                Some(t) => {
                    return Err(shape(
                        "observation.text (one instruction per batch row)",
                        obs.batch,
                        t.len(),
                    ));
                }
                None => None,
            },
        };
        // Row 0 sees the frame as it is; row 1 + r * cols + q has square (r, q) occluded.
        let px = batch.image.as_mut().expect("set above");
        for (i, copy) in px.chunks_mut(to * per_frame).enumerate().skip(1) {
            let (r, q) = ((i - 1) / cols, (i - 1) % cols);
            for y in r * square..((r + 1) * square).min(h) {
                for x in q * square..((q + 1) * square).min(w) {
                    let at = newest + (y * w + x) * c;
                    copy[at..at + c].copy_from_slice(&mean);
                }
            }
        }
        let base = rng(seed);
        let mut rngs = vec![base; n];
        let act = self.act_rows(&batch, SampleMode::Deterministic, &mut rngs, device)?;
        let x0: Vec<f32> = act
            .sample
            .actions
            .into_data()
            .convert::<f32>()
            .into_vec()
            .map_err(|e| PolicyError::Missing(format!("reading actions back: {e:?}")))?;
        let per = x0.len() / n;
        let (reference, occluded) = x0.split_at(per);
        let values = occluded
            .chunks(per)
            .map(|a| {
                let sq: f32 = a.iter().zip(reference).map(|(x, y)| (x - y).powi(2)).sum();
                (sq / per as f32).sqrt()
            })
            .collect();
        Ok(Saliency {
            rows,
            cols,
            square,
            values,
        })
    }
}
