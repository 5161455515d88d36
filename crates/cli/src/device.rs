//! `--device`: where models run.

use clap::ValueEnum;

/// Where models run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum DeviceArg {
    /// Pure-Rust CPU backend (Burn Flex).
    #[default]
    Cpu,
    /// NVIDIA GPU through burn-cuda (needs a build with `--features cuda`).
    Cuda,
}
