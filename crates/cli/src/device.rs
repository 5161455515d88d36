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

impl DeviceArg {
    /// A warning for settings that are slower on this device: on a GPU, cutting each step's
    /// batch into `[pretrain] threads` / `[grpo] threads` shards runs them one after another
    /// (2 shards: a BC step 3.4x slower on an H200, docs/scale.md). `None` when nothing applies.
    pub fn sharding_warning(self, cfg: &crate::config::RunConfig) -> Option<String> {
        let sharded: Vec<String> = [
            ("pretrain", cfg.pretrain.threads),
            ("grpo", cfg.grpo.threads),
        ]
        .into_iter()
        .filter(|&(_, t)| t > 1)
        .map(|(table, t)| format!("[{table}] threads = {t}"))
        .collect();
        (self == DeviceArg::Cuda && !sharded.is_empty()).then(|| {
            format!(
                "warning: {} shards each step's batch, which is slower on a GPU than one \
                 shard (docs/scale.md); set threads = 1 for --device cuda",
                sharded.join(" and ")
            )
        })
    }
}

/// Checks, before Burn opens the GPU, that the NVIDIA driver library loads and shows a device:
/// burn-cuda panics on a machine without them, and `--device cuda` should refuse with the
/// reason instead.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // the one unsafe call below: cudarc's probe for the driver library
pub fn cuda_ready() -> anyhow::Result<()> {
    use cudarc::driver::result;
    // SAFETY: is_culib_present only tries to open the driver library by its usual names
    // (libloading) and drops what it opened; burn-cuda loads the same library right after.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        anyhow::bail!(
            "--device cuda: the NVIDIA driver library (libcuda.so) was not found: this machine \
             has no NVIDIA driver, or LD_LIBRARY_PATH does not reach it; use --device cpu"
        );
    }
    result::init().map_err(|e| {
        anyhow::anyhow!(
            "--device cuda: the CUDA driver did not initialise ({e:?}); use --device cpu"
        )
    })?;
    match result::device::get_count() {
        Ok(n) if n > 0 => Ok(()),
        Ok(_) => anyhow::bail!(
            "--device cuda: the CUDA driver sees no GPU (is CUDA_VISIBLE_DEVICES empty?); use \
             --device cpu"
        ),
        Err(e) => anyhow::bail!("--device cuda: cannot count the GPUs ({e:?}); use --device cpu"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharding_on_a_gpu_is_warned_about() {
        let (mut cfg, _) = crate::config::load(None).unwrap();
        cfg.pretrain.threads = 2;
        cfg.grpo.threads = 1;
        assert_eq!(DeviceArg::Cpu.sharding_warning(&cfg), None);
        let w = DeviceArg::Cuda.sharding_warning(&cfg).unwrap();
        assert!(
            w.contains("[pretrain] threads = 2") && !w.contains("[grpo]"),
            "{w}"
        );
        cfg.pretrain.threads = 1;
        assert_eq!(DeviceArg::Cuda.sharding_warning(&cfg), None);
    }
}
