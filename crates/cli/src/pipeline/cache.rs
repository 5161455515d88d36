//! Stage folders: the fingerprint that decides reuse, resume or restart.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use diffrl_core::fs::{content_hash, write_atomic};
use serde_json::{Value, json};

use crate::config::RunConfig;

/// A stage folder: its settings fingerprint, and whether it is done, half done or fresh.
pub(super) struct Stage {
    pub dir: PathBuf,
    fp: Value,
}

pub(super) enum StageState {
    Done(Value),
    Partial,
    Fresh,
}

impl Stage {
    /// Opens `dir` for settings `fp`; prints `header: fresh` when the stage starts from nothing.
    pub fn open(
        dir: PathBuf,
        fp: Value,
        header: &str,
        fresh: &str,
        out: &mut dyn Write,
    ) -> anyhow::Result<(Self, StageState)> {
        let read = |name: &str| -> Option<Value> {
            std::fs::read_to_string(dir.join(name))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
        };
        if let Some(m) = read("stage.json").filter(|m| m["fingerprint"] == fp) {
            writeln!(out, "{header}: reusing {} (same settings)", dir.display())?;
            return Ok((Self { dir, fp }, StageState::Done(m)));
        }
        let state = if read("fingerprint.json").is_some_and(|f| f == fp) {
            writeln!(out, "{header}: resuming {}", dir.display())?;
            StageState::Partial
        } else {
            if dir.exists() {
                writeln!(
                    out,
                    "{header}: settings changed since {} was written; starting it over",
                    dir.display()
                )?;
                std::fs::remove_dir_all(&dir)
                    .with_context(|| format!("removing {}", dir.display()))?;
            } else {
                writeln!(out, "{header}: {fresh}")?;
            }
            StageState::Fresh
        };
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        write_atomic(
            &dir.join("fingerprint.json"),
            serde_json::to_string_pretty(&fp)?.as_bytes(),
        )
        .with_context(|| format!("writing {}", dir.join("fingerprint.json").display()))?;
        Ok((Self { dir, fp }, state))
    }

    /// Marks the stage complete with its wall time and results.
    pub fn finish(&self, seconds: f64, results: Value) -> anyhow::Result<Value> {
        let marker = json!({"fingerprint": self.fp, "seconds": seconds, "results": results});
        let path = self.dir.join("stage.json");
        write_atomic(&path, serde_json::to_string_pretty(&marker)?.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(marker)
    }
}

/// Content hashes of the reward-model folders GRPO reads (`[reward.shaping]`, `[reward.spa]`).
pub(super) fn reward_model_hashes(
    cfg: &RunConfig,
) -> anyhow::Result<serde_json::Map<String, Value>> {
    let mut hashes = serde_json::Map::new();
    let folders = [
        ("shaping", cfg.reward.shaping.as_ref().map(|s| &s.model)),
        ("spa", cfg.reward.spa.as_ref().map(|s| &s.model)),
    ];
    for (key, dir) in folders {
        if let Some(dir) = dir {
            let hash = content_hash(dir).with_context(|| {
                format!(
                    "reading the model folder {} ([reward.{key}].model)",
                    dir.display()
                )
            })?;
            hashes.insert(key.into(), json!(hash));
        }
    }
    Ok(hashes)
}
