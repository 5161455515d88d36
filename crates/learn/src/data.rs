//! Behaviour-cloning samples from recorded episodes: for every frame t, the observation window
//! [t - To + 1, t] (padded with the first frame) and the action chunk [t, t + Tp) (padded with
//! the last action), both normalised. The first Ta actions of a chunk are the ones executed.
//! Episodes whose observations carry camera images keep each frame once; samples index them.
//! For a language-conditioned policy every sample carries its episode's task instruction
//! ([`Episode::task`]) as token ids.

use diffrl_core::episode::Episode;
use diffrl_core::normalize::{Normalizer, RunningStats};
use diffrl_policy::Normalizers;
use diffrl_policy::text_encoder::TextTokens;
use diffrl_policy::tokenizer::{Strictness, Tokenizer, Tokens, Vocabulary};

use crate::LearnError;

/// Normalised (observation window, action chunk) pairs, flattened row-major.
#[derive(Debug, Clone)]
pub struct ChunkDataset {
    /// [N, To, Ds].
    pub obs: Vec<f32>,
    /// [N, Tp, Da].
    pub actions: Vec<f32>,
    /// Number of samples N.
    pub len: usize,
    /// To, Ds.
    pub obs_shape: [usize; 2],
    /// Tp, Da.
    pub action_shape: [usize; 2],
    /// The camera frames, when the episodes' observations hold images.
    pub images: Option<Frames>,
    /// The instruction of every sample, when the policy reads text.
    pub text: Option<TaskTokens>,
    /// Every sample's privileged values, when behaviour cloning has an auxiliary target
    /// ([`ChunkDataset::with_aux`]).
    pub aux: Option<AuxTargets>,
}

/// The standardised privileged values of each sample's newest frame: the auxiliary target of
/// the encoders (`diffrl_policy::Policy::bc_loss_aux`).
#[derive(Debug, Clone)]
pub struct AuxTargets {
    /// [N, dim], each column standardised over the dataset's frames (zero mean, unit spread;
    /// a constant column stays 0).
    pub values: Vec<f32>,
    /// Values per sample.
    pub dim: usize,
}

/// Each episode's instruction once, and which one each sample carries.
#[derive(Debug, Clone)]
pub struct TaskTokens {
    /// The encoded instruction of every non-empty episode, in order.
    pub tasks: Vec<Tokens>,
    /// [N]: the index in `tasks` of each sample's instruction.
    pub sample_task: Vec<u32>,
}

/// The task instructions of `episodes` (one per episode, [`Episode::task`]); an episode without
/// one is an error naming it.
pub fn episode_tasks(episodes: &[Episode]) -> Result<Vec<&str>, LearnError> {
    episodes
        .iter()
        .enumerate()
        .map(|(e, ep)| {
            ep.task.as_deref().ok_or_else(|| {
                LearnError::Data(format!(
                    "episode {e} has no task instruction (Episode.task), but the policy is \
                     language-conditioned: every episode of its dataset needs one"
                ))
            })
        })
        .collect()
}

/// The vocabulary of the training episodes' task instructions (each episode needs one).
pub fn task_vocabulary(episodes: &[Episode]) -> Result<Vocabulary, LearnError> {
    Ok(Vocabulary::from_texts(episode_tasks(episodes)?))
}

/// Every camera frame of a dataset once, and which frames each sample's window shows.
#[derive(Debug, Clone)]
pub struct Frames {
    /// The frames back to back, each [H, W, C] u8 (row-major HWC, as recorded).
    pub pixels: Vec<u8>,
    /// [N, To]: the frame shown at each position of each sample's observation window.
    pub window: Vec<u32>,
    /// [H, W, C].
    pub hwc: [usize; 3],
}

/// Checks the episodes and returns (state_dim, action_dim).
pub fn check_episodes(episodes: &[Episode]) -> Result<(usize, usize), LearnError> {
    let first = episodes
        .iter()
        .find(|e| !e.is_empty())
        .ok_or_else(|| LearnError::Data("no frames: the dataset is empty".into()))?;
    let (ds, da) = (first.observations[0].state.len(), first.actions[0].len());
    let size = |o: &diffrl_core::space::Observation| o.image.as_ref().map(|i| (i.height, i.width));
    let image = size(&first.observations[0]);
    for (e, ep) in episodes.iter().enumerate() {
        for (t, (o, a)) in ep.observations.iter().zip(&ep.actions).enumerate() {
            if size(o) != image {
                return Err(LearnError::Data(format!(
                    "episode {e} frame {t}: image (height, width) {:?}, expected {image:?} as in \
                     the first frame (None = no image)",
                    size(o)
                )));
            }
            if let Some(im) = &o.image
                && im.data.len() != im.height as usize * im.width as usize * 3
            {
                return Err(LearnError::Data(format!(
                    "episode {e} frame {t}: a {}x{} RGB image needs {} bytes, it has {}",
                    im.height,
                    im.width,
                    im.height as usize * im.width as usize * 3,
                    im.data.len()
                )));
            }
            if o.state.len() != ds || a.len() != da {
                return Err(LearnError::Data(format!(
                    "episode {e} frame {t}: state has {} values and action {} (expected {ds} and {da})",
                    o.state.len(),
                    a.len()
                )));
            }
            if let Some(v) = o.state.iter().chain(a).find(|v| !v.is_finite()) {
                return Err(LearnError::Data(format!(
                    "episode {e} frame {t}: non-finite value {v} in observation.state or action"
                )));
            }
        }
    }
    Ok((ds, da))
}

/// Min-max normalisers (to [-1, 1]) fitted on every frame.
pub fn fit_normalizers(episodes: &[Episode]) -> Result<Normalizers, LearnError> {
    let (ds, da) = check_episodes(episodes)?;
    let (mut s, mut a) = (RunningStats::new(ds), RunningStats::new(da));
    for ep in episodes {
        for (o, act) in ep.observations.iter().zip(&ep.actions) {
            s.push(&o.state);
            a.push(act);
        }
    }
    Ok(Normalizers {
        state: Normalizer::min_max(&s),
        action: Normalizer::min_max(&a),
    })
}

impl ChunkDataset {
    /// Builds every (window, chunk) pair of the episodes.
    pub fn build(
        episodes: &[Episode],
        obs_horizon: usize,
        pred_horizon: usize,
        norm: &Normalizers,
    ) -> Result<Self, LearnError> {
        Self::build_with_text(episodes, obs_horizon, pred_horizon, norm, None)
    }

    /// [`ChunkDataset::build`] for a policy that reads text (`tokenizer`: its tokenizer): every
    /// sample also carries its episode's task instruction. Words outside the vocabulary read as
    /// `<unk>`; an episode without an instruction, or with one too long or empty, is an error.
    pub fn build_with_text(
        episodes: &[Episode],
        obs_horizon: usize,
        pred_horizon: usize,
        norm: &Normalizers,
        tokenizer: Option<&Tokenizer>,
    ) -> Result<Self, LearnError> {
        let (ds, da) = check_episodes(episodes)?;
        let mut text = match tokenizer {
            None => None,
            Some(tok) => Some(TaskTokens {
                tasks: episode_tasks(episodes)?
                    .into_iter()
                    .enumerate()
                    .filter(|(e, _)| !episodes[*e].is_empty())
                    .map(|(e, t)| {
                        tok.encode(t, Strictness::Lenient)
                            .map_err(|m| LearnError::Data(format!("episode {e} task: {m}")))
                    })
                    .collect::<Result<_, _>>()?,
                sample_task: Vec::new(),
            }),
        };
        if norm.state.dim() != ds || norm.action.dim() != da {
            return Err(LearnError::Data(format!(
                "the dataset has state dim {ds} and action dim {da}, the policy expects {} and {}",
                norm.state.dim(),
                norm.action.dim()
            )));
        }
        let (mut obs, mut actions) = (Vec::new(), Vec::new());
        let mut images = episodes
            .iter()
            .find_map(|e| e.observations.first())
            .and_then(|o| o.image.as_ref())
            .map(|im| Frames {
                pixels: Vec::new(),
                window: Vec::new(),
                hwc: [im.height as usize, im.width as usize, 3],
            });
        let mut len = 0;
        for (k, ep) in episodes.iter().filter(|e| !e.is_empty()).enumerate() {
            let n = ep.len() as isize;
            // Index of this episode's first frame in `images.pixels`.
            let first = images.as_mut().map_or(0, |f| {
                let per = f.hwc.iter().product::<usize>();
                let first = f.pixels.len() / per;
                for o in &ep.observations {
                    if let Some(im) = &o.image {
                        f.pixels.extend_from_slice(&im.data);
                    }
                }
                first
            });
            for t in 0..n {
                for j in (t - obs_horizon as isize + 1)..=t {
                    let mut s = ep.observations[j.max(0) as usize].state.clone();
                    norm.state.normalize(&mut s);
                    obs.extend(s);
                    if let Some(f) = images.as_mut() {
                        f.window.push((first + j.max(0) as usize) as u32);
                    }
                }
                for j in t..t + pred_horizon as isize {
                    let mut a = ep.actions[j.min(n - 1) as usize].clone();
                    norm.action.normalize(&mut a);
                    actions.extend(a);
                }
                if let Some(t) = text.as_mut() {
                    t.sample_task.push(k as u32);
                }
                len += 1;
            }
        }
        Ok(Self {
            obs,
            actions,
            len,
            obs_shape: [obs_horizon, ds],
            action_shape: [pred_horizon, da],
            images,
            text,
            aux: None,
        })
    }

    /// Attaches the auxiliary target: `privileged[e][t]` holds the privileged values of frame
    /// t of episode e (every episode of [`ChunkDataset::build`]'s input, in order, empty ones
    /// included). Columns are standardised over all frames. Ragged or non-finite values are
    /// an error naming the episode and frame.
    pub fn with_aux(mut self, privileged: &[Vec<Vec<f32>>]) -> Result<Self, LearnError> {
        let dim = privileged
            .iter()
            .flatten()
            .map(Vec::len)
            .next()
            .unwrap_or(0);
        if dim == 0 {
            return Err(LearnError::Data(
                "the auxiliary target has no values: the task names no privileged values".into(),
            ));
        }
        let mut stats = RunningStats::new(dim);
        let mut rows = 0;
        for (e, ep) in privileged.iter().enumerate() {
            for (t, v) in ep.iter().enumerate() {
                if v.len() != dim {
                    return Err(LearnError::Data(format!(
                        "episode {e} frame {t}: {} privileged values, expected {dim}",
                        v.len()
                    )));
                }
                if let Some(x) = v.iter().find(|x| !x.is_finite()) {
                    return Err(LearnError::Data(format!(
                        "episode {e} frame {t}: non-finite privileged value {x}"
                    )));
                }
                stats.push(v);
                rows += 1;
            }
        }
        if rows != self.len {
            return Err(LearnError::Data(format!(
                "{rows} frames of privileged values for {} samples (one per frame)",
                self.len
            )));
        }
        let (mean, std) = (stats.mean.clone(), stats.std());
        let mut values = Vec::with_capacity(rows * dim);
        for v in privileged.iter().flatten() {
            values.extend(v.iter().enumerate().map(|(j, &x)| {
                let s = if std[j] > 1e-8 { std[j] } else { 1.0 };
                ((f64::from(x) - mean[j]) / s) as f32
            }));
        }
        self.aux = Some(AuxTargets { values, dim });
        Ok(self)
    }

    /// The auxiliary targets of samples `idx`, [B, dim] flat (None without them).
    pub fn gather_aux(&self, idx: &[usize]) -> Option<Vec<f32>> {
        let a = self.aux.as_ref()?;
        let mut out = Vec::with_capacity(idx.len() * a.dim);
        for &i in idx {
            out.extend_from_slice(&a.values[i * a.dim..(i + 1) * a.dim]);
        }
        Some(out)
    }

    /// The instructions of samples `idx` as the tokens [`diffrl_policy::encoder::ObsTensors`]
    /// holds (None without text).
    pub fn gather_text<B: burn::tensor::backend::Backend>(
        &self,
        idx: &[usize],
        device: &B::Device,
    ) -> Option<TextTokens<B>> {
        let t = self.text.as_ref()?;
        Some(TextTokens::from_rows(
            idx.iter().map(|&i| &t.tasks[t.sample_task[i] as usize]),
            device,
        ))
    }

    /// The camera frames of samples `idx` as the [B, To, C, H, W] floats in [0, 1] that
    /// [`diffrl_policy::encoder::ObsTensors::image`] holds (None without images).
    pub fn gather_images(&self, idx: &[usize]) -> Option<Vec<f32>> {
        let f = self.images.as_ref()?;
        let per = f.hwc.iter().product::<usize>();
        let to = self.obs_shape[0];
        let mut px = Vec::with_capacity(idx.len() * to * per);
        for &i in idx {
            for &frame in &f.window[i * to..(i + 1) * to] {
                let start = frame as usize * per;
                px.extend_from_slice(&f.pixels[start..start + per]);
            }
        }
        Some(diffrl_policy::policy::pixels_to_chw(&px, f.hwc))
    }

    /// Gathers rows `idx` into (obs [B, To, Ds], actions [B, Tp, Da]) flat buffers.
    pub fn gather(&self, idx: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let (no, na) = (
            self.obs_shape[0] * self.obs_shape[1],
            self.action_shape[0] * self.action_shape[1],
        );
        let mut o = Vec::with_capacity(idx.len() * no);
        let mut a = Vec::with_capacity(idx.len() * na);
        for &i in idx {
            o.extend_from_slice(&self.obs[i * no..(i + 1) * no]);
            a.extend_from_slice(&self.actions[i * na..(i + 1) * na]);
        }
        (o, a)
    }
}

/// Random-shift augmentation of [B, To, C, H, W] images in place: each sample's frames are
/// padded by `pad` pixels on every side with their edge pixels and cropped back to H x W at an
/// offset drawn uniformly in [-pad, pad] per axis (one offset per sample, shared by its To
/// frames, so motion between frames is kept).
pub fn random_shift(px: &mut [f32], shape: [usize; 5], pad: usize, rng: &mut impl rand::Rng) {
    let [b, to, c, h, w] = shape;
    let per = to * c * h * w;
    debug_assert_eq!(px.len(), b * per);
    if pad == 0 || per == 0 {
        return;
    }
    let p = pad as i64;
    let mut plane = vec![0.0f32; h * w];
    for sample in px.chunks_exact_mut(per) {
        let (dy, dx) = (rng.random_range(-p..=p), rng.random_range(-p..=p));
        for img in sample.chunks_exact_mut(h * w) {
            shift_image(img, &mut plane, [h, w, 1], dy, dx);
        }
    }
}

/// [`random_shift`] for frames as rollouts keep them: `frames` holds one policy call's
/// [To, H, W, C] u8 images, and all of them move by the same (dy, dx), each drawn from
/// -pad..=pad in that order; pixel (y, x) reads (y + dy, x + dx) clamped to the image.
pub fn random_shift_frames(
    frames: &mut [u8],
    [h, w, c]: [usize; 3],
    pad: usize,
    rng: &mut impl rand::Rng,
) {
    let per = h * w * c;
    if pad == 0 || per == 0 {
        return;
    }
    let p = pad as i64;
    let (dy, dx) = (rng.random_range(-p..=p), rng.random_range(-p..=p));
    let mut copy = vec![0u8; per];
    for frame in frames.chunks_exact_mut(per) {
        shift_image(frame, &mut copy, [h, w, c], dy, dx);
    }
}

/// Moves one H x W image of `c` interleaved values per pixel so that pixel (y, x) reads
/// (y + dy, x + dx) clamped to the image; `copy` (as long as `img`) is scratch space. Each row
/// is a contiguous run of the source row plus its edge pixel repeated on one side.
fn shift_image<T: Copy>(img: &mut [T], copy: &mut [T], [h, w, c]: [usize; 3], dy: i64, dx: i64) {
    if dy == 0 && dx == 0 {
        return;
    }
    copy.copy_from_slice(img);
    let (row, d) = (w * c, (dx.unsigned_abs() as usize).min(w));
    for (y, dst) in img.chunks_exact_mut(row).enumerate() {
        let sy = (y as i64 + dy).clamp(0, h as i64 - 1) as usize;
        let src = &copy[sy * row..(sy + 1) * row];
        let (run, edge) = if dx >= 0 {
            dst[..(w - d) * c].copy_from_slice(&src[d * c..]);
            (&mut dst[(w - d) * c..], &src[(w - 1) * c..])
        } else {
            dst[d * c..].copy_from_slice(&src[..(w - d) * c]);
            (&mut dst[..d * c], &src[..c])
        };
        for px in run.chunks_exact_mut(c) {
            px.copy_from_slice(edge);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use diffrl_core::space::Observation;

    fn episode(n: usize) -> Episode {
        let mut e = Episode::default();
        for t in 0..n {
            e.push(
                Observation::state(vec![t as f32, 0.0]),
                vec![t as f32 * 2.0],
                0.0,
                0.0,
                false,
            );
        }
        e
    }

    #[test]
    fn windows_pad_with_first_frame_and_last_action() {
        let eps = vec![episode(4)];
        let norm = Normalizers {
            state: Normalizer::MeanStd {
                mean: vec![0.0, 0.0],
                std: vec![1.0, 1.0],
            },
            action: Normalizer::MeanStd {
                mean: vec![0.0],
                std: vec![1.0],
            },
        };
        let d = ChunkDataset::build(&eps, 2, 3, &norm).unwrap();
        assert_eq!(d.len, 4);
        let (o, a) = d.gather(&[0, 3]);
        assert_eq!(o, vec![0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 3.0, 0.0]);
        assert_eq!(a, vec![0.0, 2.0, 4.0, 6.0, 6.0, 6.0]);
    }

    #[test]
    fn windows_index_each_frame_once_and_pad_with_the_first() {
        let framed = |n: usize, base: u8| {
            let mut e = episode(n);
            for (t, o) in e.observations.iter_mut().enumerate() {
                // A 1x2 image whose red channel tells the frame.
                o.image = Some(diffrl_core::space::ImageObs {
                    height: 1,
                    width: 2,
                    data: vec![base + t as u8, 0, 0, 0, 255, 0],
                });
            }
            e
        };
        let norm = fit_normalizers(&[episode(3)]).unwrap();
        let d = ChunkDataset::build(&[framed(3, 0), framed(2, 100)], 2, 1, &norm).unwrap();
        let f = d.images.as_ref().unwrap();
        assert_eq!((f.hwc, f.pixels.len()), ([1, 2, 3], 5 * 6));
        // Sample 3 is the second episode's first frame: its window repeats that frame.
        assert_eq!(f.window, vec![0, 0, 0, 1, 1, 2, 3, 3, 3, 4]);
        let px = d.gather_images(&[3, 1]).unwrap();
        // [B, To, C, H, W]: red of both pixels, green, blue, per frame.
        let red = |v: u8| f32::from(v) / 255.0;
        assert_eq!(px.len(), 2 * 2 * 6);
        assert_eq!(&px[..6], &[red(100), 0.0, 0.0, 1.0, 0.0, 0.0]);
        assert_eq!((px[12], px[18]), (red(0), red(1)));
        // A frame without an image, or of another size, is named.
        let mut bad = framed(2, 0);
        bad.observations[1].image = None;
        let err = check_episodes(&[framed(1, 0), bad])
            .unwrap_err()
            .to_string();
        assert!(err.contains("episode 1 frame 1"), "{err}");
        // Episodes without images build a dataset without frames.
        let plain = ChunkDataset::build(&[episode(2)], 1, 1, &norm).unwrap();
        assert!(plain.images.is_none() && plain.gather_images(&[0]).is_none());
    }

    #[test]
    fn auxiliary_targets_are_standardised_per_sample_and_checked() {
        let norm = fit_normalizers(&[episode(3)]).unwrap();
        let eps = [episode(3), Episode::default(), episode(1)];
        let d = ChunkDataset::build(&eps, 2, 1, &norm).unwrap();
        // Column 0 is 0, 2, 4, 6 over the four frames; column 1 is constant.
        let p = vec![
            vec![vec![0.0, 7.0], vec![2.0, 7.0], vec![4.0, 7.0]],
            vec![],
            vec![vec![6.0, 7.0]],
        ];
        let d = d.with_aux(&p).unwrap();
        let z = 1.0 / 5.0f32.sqrt();
        let got = d.gather_aux(&[3, 0]).unwrap();
        let want = [3.0 * z, 0.0, -3.0 * z, 0.0];
        assert!(
            got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-6),
            "{got:?}"
        );
        let err = |p: &[Vec<Vec<f32>>]| {
            let d = ChunkDataset::build(&eps, 2, 1, &norm).unwrap();
            d.with_aux(p).unwrap_err().to_string()
        };
        let mut ragged = p.clone();
        ragged[2][0] = vec![1.0];
        assert!(
            err(&ragged).contains("episode 2 frame 0"),
            "{}",
            err(&ragged)
        );
        let mut nan = p.clone();
        nan[0][1][1] = f32::NAN;
        assert!(err(&nan).contains("episode 0 frame 1"), "{}", err(&nan));
        assert!(err(&p[..1]).contains("3 frames"), "{}", err(&p[..1]));
        assert!(err(&[vec![vec![]]]).contains("no privileged values"));
        assert!(
            ChunkDataset::build(&eps, 2, 1, &norm)
                .unwrap()
                .gather_aux(&[0])
                .is_none()
        );
    }

    #[test]
    fn bad_data_is_named() {
        assert!(matches!(check_episodes(&[]), Err(LearnError::Data(m)) if m.contains("empty")));
        let mut e = episode(3);
        e.observations[1].state[0] = f32::NAN;
        let err = check_episodes(&[episode(2), e]).unwrap_err().to_string();
        assert!(
            err.contains("episode 1 frame 1") && err.contains("NaN"),
            "{err}"
        );
        let mut e = episode(3);
        e.actions[2] = vec![1.0, 2.0];
        let err = check_episodes(&[e]).unwrap_err().to_string();
        assert!(err.contains("episode 0 frame 2"), "{err}");
    }

    #[test]
    fn random_shift_moves_each_sample_by_one_offset_and_repeats_edges() {
        use diffrl_core::seeding::rng;
        // Two samples of To = 2 single-channel 3x4 frames; frame f of sample s holds
        // 100 s + 10 f + (y * 4 + x).
        let [b, to, c, h, w] = [2usize, 2, 1, 3, 4];
        let orig: Vec<f32> = (0..b * to * c * h * w)
            .map(|i| {
                let (s, f, yx) = (i / (to * h * w), (i / (h * w)) % to, i % (h * w));
                (100 * s + 10 * f + yx) as f32
            })
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..40 {
            let mut px = orig.clone();
            random_shift(&mut px, [b, to, c, h, w], 1, &mut rng(seed));
            for s in 0..b {
                // Find the offset: every pixel of both frames must equal the clamped
                // source pixel of one (dy, dx) in [-1, 1]^2 (the values are distinct, so
                // at most one offset fits).
                let found: Vec<(i64, i64)> = (-1i64..=1)
                    .flat_map(|dy| (-1i64..=1).map(move |dx| (dy, dx)))
                    .filter(|&(dy, dx)| {
                        (0..to).all(|f| {
                            (0..h).all(|y| {
                                (0..w).all(|x| {
                                    let sy = (y as i64 + dy).clamp(0, h as i64 - 1) as usize;
                                    let sx = (x as i64 + dx).clamp(0, w as i64 - 1) as usize;
                                    let base = (s * to + f) * h * w;
                                    px[base + y * w + x] == orig[base + sy * w + sx]
                                })
                            })
                        })
                    })
                    .collect();
                assert!(!found.is_empty(), "seed {seed} sample {s}: not one shift");
                seen.insert(found[0]);
            }
            // Same seed, same shifts.
            let mut again = orig.clone();
            random_shift(&mut again, [b, to, c, h, w], 1, &mut rng(seed));
            assert_eq!(px, again);
        }
        // Every offset in [-1, 1]^2 turns up over 80 draws.
        assert_eq!(seen.len(), 9, "{seen:?}");
        let mut px = orig.clone();
        random_shift(&mut px, [b, to, c, h, w], 0, &mut rng(0));
        assert_eq!(px, orig);
    }

    #[test]
    fn random_shift_frames_moves_pixels_as_random_shift_does_on_hwc_bytes() {
        use diffrl_core::seeding::rng;
        // One call of To = 2 frames of 5x6 pixels, 3 channels, all values distinct mod 256
        // where it matters: compare against random_shift on the same data laid out as CHW.
        let [to, h, w, c] = [2usize, 5, 6, 3];
        let hwc: Vec<u8> = (0..to * h * w * c).map(|i| (i * 7 % 251) as u8).collect();
        let chw = |v: &[u8]| -> Vec<f32> {
            let mut out = vec![0.0; v.len()];
            for f in 0..to {
                for y in 0..h {
                    for x in 0..w {
                        for ch in 0..c {
                            out[((f * c + ch) * h + y) * w + x] =
                                f32::from(v[((f * h + y) * w + x) * c + ch]);
                        }
                    }
                }
            }
            out
        };
        let mut moved = 0;
        for seed in 0..20 {
            let mut frames = hwc.clone();
            random_shift_frames(&mut frames, [h, w, c], 2, &mut rng(seed));
            let mut px = chw(&hwc);
            random_shift(&mut px, [1, to, c, h, w], 2, &mut rng(seed));
            assert_eq!(chw(&frames), px, "seed {seed}");
            moved += usize::from(frames != hwc);
        }
        assert!(moved >= 15, "only {moved} of 20 draws moved the frames");
        let mut frames = hwc.clone();
        random_shift_frames(&mut frames, [h, w, c], 0, &mut rng(0));
        assert_eq!(frames, hwc);
    }
}
