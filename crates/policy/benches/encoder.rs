//! Criterion benches of the patch image encoder at the VLA config's sizes (one 3 x 64 x 64
//! camera, batch 64, 8 x 8 patches): a forward and backward pass with the linear read-out
//! (`kind = "patches"`) and with the keypoint read-out (`kind = "patch-keypoints"`), the
//! comparison that decides which read-out a CPU config can afford (docs/policy.md).

use burn::tensor::{Tensor, TensorData};
use criterion::{Criterion, criterion_group, criterion_main};
use diffrl_core::seeding::rng;
use diffrl_policy::config::{ImageEncoderConfig, ImageEncoderKind};
use diffrl_policy::patches::PatchEncoder;
use diffrl_policy::{CpuAutodiff, CpuBackend};
use rand::Rng as _;

fn encoder(c: &mut Criterion) {
    let device = Default::default();
    let (b, ch, side) = (64usize, 3usize, 64usize);
    let mut r = rng(0);
    let px: Vec<f32> = (0..b * ch * side * side)
        .map(|_| r.random_range(0.0..1.0))
        .collect();
    for (name, kind) in [
        ("patches", ImageEncoderKind::Patches),
        ("patch_keypoints", ImageEncoderKind::PatchKeypoints),
    ] {
        let cfg = ImageEncoderConfig {
            kind,
            ..ImageEncoderConfig::default()
        };
        let enc = PatchEncoder::<CpuAutodiff>::new(ch, side, side, &cfg, &device);
        c.bench_function(&format!("{name}_forward_backward_b{b}"), |bench| {
            bench.iter(|| {
                let images = Tensor::<CpuAutodiff, 4>::from_data(
                    TensorData::new(px.clone(), [b, ch, side, side]),
                    &device,
                );
                enc.forward(images).powf_scalar(2.0).mean().backward()
            })
        });
        let enc = PatchEncoder::<CpuBackend>::new(ch, side, side, &cfg, &device);
        c.bench_function(&format!("{name}_forward_b{b}"), |bench| {
            bench.iter(|| {
                let images = Tensor::<CpuBackend, 4>::from_data(
                    TensorData::new(px.clone(), [b, ch, side, side]),
                    &device,
                );
                enc.forward(images).into_data()
            })
        });
    }
}

criterion_group!(benches, encoder);
criterion_main!(benches);
