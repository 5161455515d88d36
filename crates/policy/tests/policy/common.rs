//! Shared fixtures: tiny policies that build in milliseconds.

#![allow(dead_code)]

use diffrl_core::normalize::Normalizer;
use diffrl_policy::config::{DenoiserConfig, DiffusionConfig, PolicyConfig};
use diffrl_policy::{Normalizers, ObsBatch, PolicySpec};

pub type B = diffrl_policy::CpuBackend;
pub type AD = diffrl_policy::CpuAutodiff;

/// A small diffusion policy config: Tp 4, Ta 2, Da 2, K = `k` DDIM steps over T = 2k.
pub fn tiny_config(k: usize) -> PolicyConfig {
    PolicyConfig {
        obs_horizon: 2,
        pred_horizon: 4,
        action_horizon: 2,
        denoiser: DenoiserConfig {
            hidden: 16,
            blocks: 1,
            step_embed_dim: 8,
            ..DenoiserConfig::default()
        },
        diffusion: DiffusionConfig {
            train_steps: 2 * k,
            denoising_steps: k,
            ..DiffusionConfig::default()
        },
        ..PolicyConfig::default()
    }
}

pub fn spec() -> PolicySpec {
    PolicySpec::flat(3, 2)
}

pub fn norm() -> Normalizers {
    Normalizers {
        state: Normalizer::MinMax {
            min: vec![0.0; 3],
            max: vec![10.0; 3],
        },
        action: Normalizer::MinMax {
            min: vec![0.0; 2],
            max: vec![100.0; 2],
        },
    }
}

/// A batch of `b` observation histories (To = 2, Ds = 3) with distinct values.
pub fn obs(b: usize) -> ObsBatch {
    ObsBatch {
        batch: b,
        state: (0..b * 2 * 3).map(|i| (i % 11) as f32 * 0.7).collect(),
        image: None,
        text: None,
    }
}

pub fn to_vec<Bk: burn::tensor::backend::Backend, const D: usize>(
    t: burn::tensor::Tensor<Bk, D>,
) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec().unwrap()
}

/// A file of the repository. The package directory is read at run time (cargo sets it for test
/// processes): the compile-time value goes stale when clones at other paths share one target
/// directory and cargo reuses their test binaries.
pub fn repo_file(rel: &str) -> std::path::PathBuf {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    dir.join("../..").join(rel)
}
