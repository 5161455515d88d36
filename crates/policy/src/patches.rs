//! Patch image encoder: the image cut into non-overlapping P x P patches (ViT's patch
//! embedding), each patch through the same two-layer MLP, a learned embedding per patch
//! position, and a linear read-out over all patch features. Every layer is a matrix product,
//! which Burn's CPU backend runs several times faster per image than the CNN's convolutions
//! (docs/policy.md, "Patch image encoder"), and the read-out keeps where in the image each
//! feature was found.
//!
//! ```text
//! x      = 2 * image - 1, zero-padded to multiples of P        [N, C, H', W']
//! tokens = flatten each P x P patch                             [N, T, C*P*P], T = H'W'/P^2
//! h      = GELU(Linear(tokens) + pos)                            [N, T, hidden]
//! f      = GELU(Linear(h))                                       [N, T, token_dim]
//! out    = Linear(flatten(f))                                    [N, out_dim]
//! ```
//!
//! With the keypoint read-out (`kind = "patch-keypoints"`), K = `keypoints` image positions
//! replace the flattened features: each patch t scores each keypoint k and proposes a point
//! inside itself, and the keypoint is the softmax-weighted mean of the proposals (a
//! spatial softmax over patches with sub-patch offsets):
//!
//! ```text
//! [l, ox, oy] = Linear(f)                                        [N, T, 3K]
//! w_tk   = softmax_t(l_tk)
//! x_k    = sum_t w_tk (cx_t + tanh(ox_tk) / W'')                 cx_t: patch centre in [-1, 1]
//! y_k    = sum_t w_tk (cy_t + tanh(oy_tk) / H'')                 W'', H'': patches per row, column
//! out    = Linear([x, y])                                        [N, out_dim]
//! ```
//!
//! The features then move smoothly with what the keypoints locate: the linear read-out has one
//! weight per patch position, so its features jump as an object crosses a patch border. The
//! keypoints learn to locate objects with behaviour cloning's auxiliary target, hardly
//! without it (docs/policy.md, "Image encoders").

use burn::module::{Module, Param};
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData, activation};

use crate::config::{ImageEncoderConfig, ImageEncoderKind};
use crate::nn::{gelu, tanh};

/// The patch encoder: [N, C, H, W] in [0, 1] -> [N, out_dim]. See the module documentation.
#[derive(Module, Debug)]
pub struct PatchEncoder<B: Backend> {
    embed: Linear<B>,
    pos: Param<Tensor<B, 2>>,
    mix: Linear<B>,
    /// The keypoint read-out's scores and offsets (`patch-keypoints`); None = linear read-out.
    keypoints: Option<Linear<B>>,
    head: Linear<B>,
    #[module(skip)]
    input_shape: [usize; 3],
    #[module(skip)]
    patch: usize,
}

impl<B: Backend> PatchEncoder<B> {
    /// An encoder for images of `in_channels` x `height` x `width`.
    ///
    /// # Panics
    /// If `cfg.patch_size` is 0 (rejected by `PolicyConfig::validate`).
    pub fn new(
        in_channels: usize,
        height: usize,
        width: usize,
        cfg: &ImageEncoderConfig,
        device: &B::Device,
    ) -> Self {
        let p = cfg.patch_size;
        assert!(p >= 1, "encoder.image.patch_size must be >= 1");
        let tokens = height.div_ceil(p) * width.div_ceil(p);
        let pos = Initializer::Normal {
            mean: 0.0,
            std: 0.02,
        }
        .init([tokens, cfg.patch_hidden], device);
        let keypoints = (cfg.kind == ImageEncoderKind::PatchKeypoints)
            .then(|| LinearConfig::new(cfg.token_dim, 3 * cfg.keypoints).init(device));
        let head_in = match &keypoints {
            Some(_) => 2 * cfg.keypoints,
            None => tokens * cfg.token_dim,
        };
        Self {
            embed: LinearConfig::new(in_channels * p * p, cfg.patch_hidden).init(device),
            pos,
            mix: LinearConfig::new(cfg.patch_hidden, cfg.token_dim).init(device),
            keypoints,
            head: LinearConfig::new(head_in, cfg.out_dim).init(device),
            input_shape: [in_channels, height, width],
            patch: p,
        }
    }

    /// [N, C, H, W] -> [N, T, C*P*P], patches in row-major order, each patch's values in
    /// (channel, row, column) order.
    ///
    /// Each image is seen as its runs of P consecutive pixels of one row ([N, C*H'*W'/P, P])
    /// and the runs are gathered in patch order with one `select`. Burn's CPU backend copies
    /// each run whole there, while the equivalent six-dimensional permute walks the pixels
    /// one by one (several times slower).
    fn patchify(&self, images: Tensor<B, 4>) -> Tensor<B, 3> {
        let [n, c, h, w] = images.dims();
        let p = self.patch;
        let (hp, wp) = (h.div_ceil(p), w.div_ceil(p));
        let x = if hp * p != h || wp * p != w {
            images.pad((0, wp * p - w, 0, hp * p - h), 0.0)
        } else {
            images
        };
        let runs = c * hp * p * wp;
        // Run (channel ch, pixel row yy, patch column px) sits at (ch * H' + yy) * W'/P + px.
        let mut order = Vec::with_capacity(runs);
        for py in 0..hp {
            for px in 0..wp {
                for ch in 0..c {
                    for y in 0..p {
                        order.push(((ch * hp * p + py * p + y) * wp + px) as i64);
                    }
                }
            }
        }
        let device = x.device();
        let order = Tensor::<B, 1, Int>::from_data(TensorData::new(order, [runs]), &device);
        x.reshape([n, runs, p])
            .select(1, order)
            .reshape([n, hp * wp, c * p * p])
    }

    /// [N, C, H, W] floats in [0, 1] -> [N, out_dim].
    ///
    /// # Panics
    /// If the images are not C x H x W as given to [`PatchEncoder::new`].
    pub fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let [n, c, h, w] = images.dims();
        assert_eq!(
            [c, h, w],
            self.input_shape,
            "PatchEncoder built for [C, H, W] = {:?} got images of {:?}",
            self.input_shape,
            [c, h, w]
        );
        let tokens = self.patchify(images.mul_scalar(2.0).sub_scalar(1.0));
        let e = self.embed.forward(tokens);
        let [_, t, hid] = e.dims();
        // Added as [N, T*hidden] + [1, T*hidden]: Burn's CPU backend has a fast path for a row
        // shared by every row, not for a [1, T, hidden] broadcast (same values either way).
        let e = e.reshape([n, t * hid]) + self.pos.val().reshape([1, t * hid]);
        let h = gelu(e.reshape([n, t, hid]));
        let f = gelu(self.mix.forward(h));
        let [_, t, d] = f.dims();
        match &self.keypoints {
            Some(kp) => self.head.forward(self.keypoint_positions(kp.forward(f))),
            None => self.head.forward(f.reshape([n, t * d])),
        }
    }

    /// The keypoint read-out's positions from the per-patch scores and offsets [N, T, 3K]:
    /// [N, 2K] = (x_1..x_K, y_1..y_K) in [-1, 1] image coordinates (x right, y down).
    fn keypoint_positions(&self, s: Tensor<B, 3>) -> Tensor<B, 2> {
        let [n, t, k3] = s.dims();
        let k = k3 / 3;
        let [_, h, w] = self.input_shape;
        let (hp, wp) = (h.div_ceil(self.patch), w.div_ceil(self.patch));
        let device = s.device();
        // Patches on the last axis: the softmax, the sums and the centres' broadcast (a row
        // shared by every row) then run on contiguous rows, where Burn's CPU backend has its
        // fast paths. Over the middle axis the read-out added 25 ms to the encoder's forward
        // and backward pass at batch 64, this way 16 ms (the patch encoder itself: 17 ms;
        // `cargo bench -p diffrl-policy --bench encoder`). The rows are in (k, n) order, the
        // transpose of [N*T, 3K]: Burn's CPU backend copies a two-dimensional transpose in
        // tiles, but walks a batched one ([N, T, 3K] -> [N, 3K, T]) element by element, in
        // the forward pass and again for the gradient; a row's values do not depend on where
        // the row sits, so the outputs and gradients are the same bits either way.
        let s = s.reshape([n * t, k3]).transpose();
        let rows = |from: usize| s.clone().narrow(0, from, k).reshape([k * n, t]);
        let centre = |i: usize, count: usize| (2.0 * i as f32 + 1.0) / count as f32 - 1.0;
        let row = |v: Vec<f32>| Tensor::<B, 2>::from_data(TensorData::new(v, [1, t]), &device);
        let cx = row((0..t).map(|i| centre(i % wp, wp)).collect());
        let cy = row((0..t).map(|i| centre(i / wp, hp)).collect());
        let weights = activation::softmax(rows(0), 1);
        let x = tanh(rows(k)).div_scalar(wp as f32) + cx;
        let y = tanh(rows(2 * k)).div_scalar(hp as f32) + cy;
        let x = (weights.clone() * x).sum_dim(1).reshape([k, n]);
        let y = (weights * y).sum_dim(1).reshape([k, n]);
        // [2K, N] -> [N, 2K] = (x_1..x_K, y_1..y_K) per image.
        Tensor::cat(vec![x, y], 0).transpose()
    }

    /// Output feature width.
    pub fn out_dim(&self) -> usize {
        self.head.weight.dims()[1]
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Distribution, TensorData};

    use super::*;

    type Cpu = Flex;

    fn cfg() -> ImageEncoderConfig {
        ImageEncoderConfig {
            patch_size: 4,
            patch_hidden: 12,
            token_dim: 5,
            out_dim: 7,
            ..ImageEncoderConfig::default()
        }
    }

    #[test]
    fn patchify_orders_patches_row_major_and_values_channel_row_column() {
        let device = Default::default();
        let enc = PatchEncoder::<Cpu>::new(2, 8, 4, &cfg(), &device);
        // Value = c * 100 + y * 10 + x.
        let v: Vec<f32> = (0..2)
            .flat_map(|c| {
                (0..8).flat_map(move |y| (0..4).map(move |x| (c * 100 + y * 10 + x) as f32))
            })
            .collect();
        let img = Tensor::<Cpu, 4>::from_data(TensorData::new(v, [1, 2, 8, 4]), &device);
        let t = enc.patchify(img);
        assert_eq!(t.dims(), [1, 2, 32]);
        let t = t.into_data().to_vec::<f32>().unwrap();
        // Patch 1 (rows 4..8), channel 1, row 2 of the patch, column 3: 100 + 60 + 3.
        assert_eq!(t[32 + 16 + 2 * 4 + 3], 163.0);
        // Patch 0, channel 0, row 0, column 0.
        assert_eq!(t[0], 0.0);
    }

    #[test]
    fn patchify_matches_a_pixel_by_pixel_cut_with_padding_and_several_columns() {
        let device = Default::default();
        let (n, c, h, w, p) = (2, 3, 10, 7, 4);
        let enc = PatchEncoder::<Cpu>::new(c, h, w, &cfg(), &device);
        let v: Vec<f32> = (0..n * c * h * w).map(|i| i as f32 + 1.0).collect();
        let img = Tensor::<Cpu, 4>::from_data(TensorData::new(v.clone(), [n, c, h, w]), &device);
        let t = enc.patchify(img);
        let (hp, wp) = (h.div_ceil(p), w.div_ceil(p));
        assert_eq!(t.dims(), [n, hp * wp, c * p * p]);
        let got = t.into_data().to_vec::<f32>().unwrap();
        let mut want = Vec::new();
        for b in 0..n {
            for py in 0..hp {
                for px in 0..wp {
                    for ch in 0..c {
                        for y in 0..p {
                            for x in 0..p {
                                let (yy, xx) = (py * p + y, px * p + x);
                                want.push(if yy < h && xx < w {
                                    v[((b * c + ch) * h + yy) * w + xx]
                                } else {
                                    0.0
                                });
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(got, want);
    }

    #[test]
    fn odd_sizes_are_padded_and_samples_stay_independent() {
        let device = Default::default();
        let enc = PatchEncoder::<Cpu>::new(3, 10, 7, &cfg(), &device);
        let a = Tensor::<Cpu, 4>::random([2, 3, 10, 7], Distribution::Uniform(0.0, 1.0), &device);
        let b = Tensor::cat(
            vec![
                a.clone().narrow(0, 0, 1),
                Tensor::random([1, 3, 10, 7], Distribution::Uniform(0.0, 1.0), &device),
            ],
            0,
        );
        let (oa, ob) = (enc.forward(a), enc.forward(b));
        assert_eq!(oa.dims(), [2, 7]);
        let row = |o: &Tensor<Cpu, 2>, i| {
            o.clone()
                .narrow(0, i, 1)
                .into_data()
                .to_vec::<f32>()
                .unwrap()
        };
        assert_eq!(row(&oa, 0), row(&ob, 0));
        assert_ne!(row(&oa, 1), row(&ob, 1));
    }

    #[test]
    fn every_parameter_gets_a_gradient() {
        type Ad = Autodiff<Flex>;
        let device = Default::default();
        let enc = PatchEncoder::<Ad>::new(3, 8, 8, &cfg(), &device);
        let x = Tensor::<Ad, 4>::random([3, 3, 8, 8], Distribution::Uniform(0.0, 1.0), &device);
        let grads = enc.forward(x).square().mean().backward();
        let nonzero = |g: Option<Tensor<Flex, 2>>| {
            g.is_some_and(|g| {
                g.into_data()
                    .to_vec::<f32>()
                    .unwrap()
                    .iter()
                    .any(|v| *v != 0.0)
            })
        };
        assert!(nonzero(enc.embed.weight.val().grad(&grads)));
        assert!(nonzero(enc.pos.val().grad(&grads)));
        assert!(nonzero(enc.mix.weight.val().grad(&grads)));
        assert!(nonzero(enc.head.weight.val().grad(&grads)));
    }

    fn keypoint_cfg() -> ImageEncoderConfig {
        ImageEncoderConfig {
            kind: ImageEncoderKind::PatchKeypoints,
            keypoints: 2,
            ..cfg()
        }
    }

    #[test]
    fn keypoints_are_the_softmax_mean_of_patch_centres_plus_offsets() {
        let device = Default::default();
        // 8 x 12 pixels in 4-pixel patches: 2 rows of 3 patches; centres x in {-2/3, 0, 2/3},
        // y in {-1/2, 1/2}.
        let enc = PatchEncoder::<Cpu>::new(1, 8, 12, &keypoint_cfg(), &device);
        let (t, k) = (6, 2);
        let mut s = vec![0.0f32; t * 3 * k];
        // Keypoint 0: all weight on patch 5 (row 1, column 2), offset tanh(ox) = 0.5 in x.
        s[5 * 3 * k] = 60.0;
        s[5 * 3 * k + k] = 0.5f32.atanh();
        // Keypoint 1: equal scores, no offsets: the mean of the centres.
        let pos = enc
            .keypoint_positions(Tensor::from_data(
                TensorData::new(s, [1, t, 3 * k]),
                &device,
            ))
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        let want = [2.0 / 3.0 + 0.5 / 3.0, 0.0, 0.5, 0.0];
        for (g, w) in pos.iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{pos:?} vs {want:?}");
        }
    }

    #[test]
    fn keypoint_readout_reads_2k_positions_and_trains() {
        type Ad = Autodiff<Flex>;
        let device = Default::default();
        let enc = PatchEncoder::<Ad>::new(3, 16, 16, &keypoint_cfg(), &device);
        assert_eq!(enc.out_dim(), 7);
        let x = Tensor::<Ad, 4>::random([3, 3, 16, 16], Distribution::Uniform(0.0, 1.0), &device);
        let grads = enc.forward(x).square().mean().backward();
        let kp = enc.keypoints.as_ref().expect("keypoint read-out");
        let g = kp.weight.val().grad(&grads).expect("a gradient");
        assert!(
            g.into_data()
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .any(|v| *v != 0.0)
        );
        // The read-out takes 2K positions, not T x token_dim features.
        assert_eq!(enc.head.weight.dims(), [4, 7]);
    }
}
