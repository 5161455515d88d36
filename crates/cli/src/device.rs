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
