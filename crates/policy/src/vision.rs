//! Image encoder for pixel observations: a small ResNet-style CNN with GroupNorm (batch
//! statistics would couple the samples of a rollout batch) and a spatial-softmax keypoint head,
//! the visual backbone of Diffusion Policy / robomimic at a CPU-friendly size.
//!
//! ```text
//! x = 2 * image - 1                                     [N, C, H, W], image in [0, 1]
//! stem:     ReLU(GN(Conv3x3(x)))                        channels[0]
//! stage i:  ReLU(GN(Conv3x3(ReLU(GN(Conv3x3/2(x))))) + GN(Conv1x1/2(x)))   channels[i]
//! head:     keypoints = SpatialSoftmax(Conv1x1(x))      [N, K, 2]
//!           features  = Linear(flatten(keypoints))      [N, out_dim]
//! ```
//!
//! Each stage halves the resolution, rounding up: H -> ceil(H / 2).

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{GroupNorm, GroupNormConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, activation};

use crate::config::ImageEncoderConfig;

fn conv3x3<B: Backend>(c_in: usize, c_out: usize, stride: usize, device: &B::Device) -> Conv2d<B> {
    Conv2dConfig::new([c_in, c_out], [3, 3])
        .with_stride([stride, stride])
        .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
        .init(device)
}

/// Residual stage halving the resolution: ReLU(main(x) + shortcut(x)) with
/// main = GN(Conv3x3(ReLU(GN(Conv3x3/2(x))))) and shortcut = GN(Conv1x1/2(x)).
#[derive(Module, Debug)]
pub struct ResidualStage<B: Backend> {
    conv1: Conv2d<B>,
    norm1: GroupNorm<B>,
    conv2: Conv2d<B>,
    norm2: GroupNorm<B>,
    shortcut: Conv2d<B>,
    shortcut_norm: GroupNorm<B>,
}

impl<B: Backend> ResidualStage<B> {
    /// `channels_in` -> `channels_out`; `groups` must divide `channels_out`.
    pub fn new(channels_in: usize, channels_out: usize, groups: usize, device: &B::Device) -> Self {
        let norm = || GroupNormConfig::new(groups, channels_out).init(device);
        Self {
            conv1: conv3x3(channels_in, channels_out, 2, device),
            norm1: norm(),
            conv2: conv3x3(channels_out, channels_out, 1, device),
            norm2: norm(),
            shortcut: Conv2dConfig::new([channels_in, channels_out], [1, 1])
                .with_stride([2, 2])
                .init(device),
            shortcut_norm: norm(),
        }
    }

    /// [N, C_in, H, W] -> [N, C_out, ceil(H/2), ceil(W/2)].
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let h = activation::relu(self.norm1.forward(self.conv1.forward(x.clone())));
        let h = self.norm2.forward(self.conv2.forward(h));
        let skip = self.shortcut_norm.forward(self.shortcut.forward(x));
        activation::relu(h + skip)
    }
}

/// `n` evenly spaced coordinates from -1 to 1 (pixel centres of the first and last pixel);
/// a single pixel sits at 0.
fn linspace(n: usize) -> Vec<f32> {
    if n == 1 {
        return vec![0.0];
    }
    (0..n)
        .map(|i| (-1.0 + 2.0 * i as f64 / (n - 1) as f64) as f32)
        .collect()
}

/// Spatial softmax (Levine et al. 2016): per channel k, a softmax over the H*W positions,
///
/// p_k(i, j) = exp(f_k(i, j)) / sum_{i', j'} exp(f_k(i', j')),
///
/// and the expected position (x_k, y_k) = sum_{i, j} p_k(i, j) (u_j, v_i), where u and v are
/// the column and row coordinates spaced evenly over [-1, 1]. [N, K, H, W] -> [N, K, 2] with
/// (x, y) last; both lie in [-1, 1] as convex combinations of grid coordinates.
pub fn spatial_softmax<B: Backend>(features: Tensor<B, 4>) -> Tensor<B, 3> {
    let [n, k, h, w] = features.dims();
    let device = features.device();
    let attention = activation::softmax(features.reshape([n, k, h * w]), 2);
    // Row-major flattening: position p = i * w + j has column j and row i.
    let xs = linspace(w);
    let ys = linspace(h);
    let pos_x: Vec<f32> = (0..h * w).map(|p| xs[p % w]).collect();
    let pos_y: Vec<f32> = (0..h * w).map(|p| ys[p / w]).collect();
    let grid = |v: Vec<f32>| Tensor::<B, 3>::from_data(TensorData::new(v, [1, 1, h * w]), &device);
    let x = (attention.clone() * grid(pos_x)).sum_dim(2);
    let y = (attention * grid(pos_y)).sum_dim(2);
    Tensor::cat(vec![x, y], 2)
}

/// The image encoder: [N, C, H, W] in [0, 1] -> [N, out_dim]. See the module documentation.
#[derive(Module, Debug)]
pub struct ImageEncoder<B: Backend> {
    stem: Conv2d<B>,
    stem_norm: GroupNorm<B>,
    stages: Vec<ResidualStage<B>>,
    keypoint_conv: Conv2d<B>,
    head: Linear<B>,
    #[module(skip)]
    input_shape: [usize; 3],
}

impl<B: Backend> ImageEncoder<B> {
    /// An encoder for images of `in_channels` x `height` x `width`.
    ///
    /// # Panics
    /// If `cfg.channels` is empty or `cfg.groups` does not divide every channel count (both
    /// rejected by `PolicyConfig::validate`).
    pub fn new(
        in_channels: usize,
        height: usize,
        width: usize,
        cfg: &ImageEncoderConfig,
        device: &B::Device,
    ) -> Self {
        assert!(
            !cfg.channels.is_empty(),
            "encoder.image.channels must not be empty"
        );
        let first = cfg.channels[0];
        let stages = std::iter::once(first)
            .chain(cfg.channels.iter().copied())
            .collect::<Vec<_>>()
            .windows(2)
            .map(|w| ResidualStage::new(w[0], w[1], cfg.groups, device))
            .collect();
        let last = cfg.channels[cfg.channels.len() - 1];
        Self {
            stem: conv3x3(in_channels, first, 1, device),
            stem_norm: GroupNormConfig::new(cfg.groups, first).init(device),
            stages,
            keypoint_conv: Conv2dConfig::new([last, cfg.keypoints], [1, 1]).init(device),
            head: LinearConfig::new(2 * cfg.keypoints, cfg.out_dim).init(device),
            input_shape: [in_channels, height, width],
        }
    }

    /// Keypoints (x, y) in [-1, 1] of the spatial-softmax head: [N, C, H, W] -> [N, K, 2].
    ///
    /// # Panics
    /// If the images are not C x H x W as given to [`ImageEncoder::new`].
    pub fn keypoints(&self, images: Tensor<B, 4>) -> Tensor<B, 3> {
        let [_, c, h, w] = images.dims();
        assert_eq!(
            [c, h, w],
            self.input_shape,
            "ImageEncoder built for [C, H, W] = {:?} got images of {:?}",
            self.input_shape,
            [c, h, w]
        );
        let x = images.mul_scalar(2.0).sub_scalar(1.0);
        let mut x = activation::relu(self.stem_norm.forward(self.stem.forward(x)));
        for stage in &self.stages {
            x = stage.forward(x);
        }
        spatial_softmax(self.keypoint_conv.forward(x))
    }

    /// [N, C, H, W] floats in [0, 1] -> [N, out_dim].
    pub fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let keypoints = self.keypoints(images);
        let [n, k, _] = keypoints.dims();
        self.head.forward(keypoints.reshape([n, 2 * k]))
    }

    /// Output feature width.
    pub fn out_dim(&self) -> usize {
        self.head.weight.dims()[1]
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::module::{ModuleVisitor, Param};
    use burn::tensor::Distribution;
    use burn::tensor::backend::AutodiffBackend;

    use super::*;

    type Cpu = Flex;
    type Ad = Autodiff<Flex>;

    fn tiny_cfg() -> ImageEncoderConfig {
        ImageEncoderConfig {
            channels: vec![8, 16],
            groups: 4,
            keypoints: 6,
            out_dim: 10,
            ..ImageEncoderConfig::default()
        }
    }

    fn images<B: Backend>(n: usize, device: &B::Device) -> Tensor<B, 4> {
        Tensor::random([n, 3, 16, 16], Distribution::Uniform(0.0, 1.0), device)
    }

    fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
        t.into_data().to_vec::<f32>().unwrap()
    }

    #[test]
    fn output_shape_is_batch_by_out_dim() {
        let device = Default::default();
        let enc = ImageEncoder::<Cpu>::new(3, 16, 16, &tiny_cfg(), &device);
        assert_eq!(enc.out_dim(), 10);
        let out = enc.forward(images::<Cpu>(4, &device));
        assert_eq!(out.dims(), [4, 10]);
        assert!(values(out).iter().all(|v| v.is_finite()));

        // Odd sizes round up at every stage: 15x9 -> 8x5 -> 4x3.
        let enc = ImageEncoder::<Cpu>::new(1, 15, 9, &tiny_cfg(), &device);
        let out = enc.forward(Tensor::random(
            [2, 1, 15, 9],
            Distribution::Default,
            &device,
        ));
        assert_eq!(out.dims(), [2, 10]);
    }

    #[test]
    fn keypoints_lie_in_the_unit_square() {
        let device = Default::default();
        let enc = ImageEncoder::<Cpu>::new(3, 16, 16, &tiny_cfg(), &device);
        let kp = enc.keypoints(images::<Cpu>(4, &device));
        assert_eq!(kp.dims(), [4, 6, 2]);
        assert!(values(kp).iter().all(|v| (-1.0..=1.0).contains(v)));
    }

    #[test]
    fn spatial_softmax_matches_closed_forms() {
        let device = Default::default();
        // Uniform features: the expectation is the grid's centre.
        let flat = spatial_softmax(Tensor::<Cpu, 4>::zeros([1, 1, 4, 5], &device));
        for v in values(flat) {
            assert!(v.abs() < 1e-6, "{v}");
        }
        // A sharp peak at row 1 of 3 and column 3 of 5 puts the keypoint on that pixel:
        // x = -1 + 2 * 3/4 = 0.5, y = -1 + 2 * 1/2 = 0.
        let mut f = vec![0.0f32; 15];
        f[5 + 3] = 50.0;
        let peak = spatial_softmax(Tensor::<Cpu, 4>::from_data(
            TensorData::new(f, [1, 1, 3, 5]),
            &device,
        ));
        let v = values(peak);
        assert!((v[0] - 0.5).abs() < 1e-5 && v[1].abs() < 1e-5, "{v:?}");
        // A single pixel sits at the centre.
        let one = spatial_softmax(Tensor::<Cpu, 4>::ones([2, 3, 1, 1], &device));
        assert!(values(one).iter().all(|v| *v == 0.0));
    }

    #[test]
    fn samples_in_a_batch_are_independent() {
        let device = Default::default();
        let enc = ImageEncoder::<Cpu>::new(3, 16, 16, &tiny_cfg(), &device);
        let a = images::<Cpu>(2, &device);
        let b = Tensor::cat(
            vec![a.clone().narrow(0, 0, 1), images::<Cpu>(1, &device)],
            0,
        );
        let (oa, ob) = (enc.forward(a), enc.forward(b));
        let first = |o: Tensor<Cpu, 2>| values(o.narrow(0, 0, 1));
        for (x, y) in first(oa.clone()).iter().zip(first(ob.clone())) {
            assert!((x - y).abs() < 1e-5, "sample 0 changed: {x} vs {y}");
        }
        let second = |o: Tensor<Cpu, 2>| values(o.narrow(0, 1, 1));
        assert!(
            second(oa)
                .iter()
                .zip(second(ob))
                .any(|(x, y)| (x - y).abs() > 1e-5),
            "sample 1 should depend on its own image"
        );
    }

    /// Collects the names of float parameters whose gradient is missing, non-finite or zero.
    struct GradCheck<'a, B: AutodiffBackend> {
        grads: &'a B::Gradients,
        path: Vec<String>,
        checked: usize,
        failures: Vec<String>,
    }

    impl<B: AutodiffBackend> ModuleVisitor<B> for GradCheck<'_, B> {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_string());
        }

        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }

        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.checked += 1;
            let name = self.path.join(".");
            match param.val().grad(self.grads).map(values) {
                None => self.failures.push(format!("{name}: no gradient")),
                Some(g) if !g.iter().all(|v| v.is_finite()) => {
                    self.failures.push(format!("{name}: non-finite gradient"))
                }
                Some(g) if g.iter().all(|v| *v == 0.0) => {
                    self.failures.push(format!("{name}: zero gradient"))
                }
                Some(_) => {}
            }
        }
    }

    #[test]
    fn every_parameter_gets_a_finite_nonzero_gradient() {
        let device = Default::default();
        let enc = ImageEncoder::<Ad>::new(3, 16, 16, &tiny_cfg(), &device);
        let target = Tensor::<Ad, 2>::random([3, 10], Distribution::Normal(0.0, 1.0), &device);
        let loss = (enc.forward(images::<Ad>(3, &device)) - target)
            .square()
            .mean();
        let grads = loss.backward();

        let mut check = GradCheck::<Ad> {
            grads: &grads,
            path: Vec::new(),
            checked: 0,
            failures: Vec::new(),
        };
        enc.visit(&mut check);
        assert!(check.checked > 0, "no parameter visited");
        assert!(check.failures.is_empty(), "{:#?}", check.failures);
    }
}
