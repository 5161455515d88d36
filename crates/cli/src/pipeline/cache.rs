//! Stage folders: the fingerprint that decides reuse, resume or restart.

use std::io::Write;
use std::path::{Path, PathBuf};

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
    /// Opens the stage folder `root/name` for settings `fp`; prints `header: fresh` when the
    /// stage starts from nothing. Paths inside the run folder `root` enter the fingerprint
    /// relative to it ([`run_relative`]), so a copied or moved run folder keeps its stages; a
    /// folder written before that (the run folder's own path in its fingerprints) is still
    /// recognised, and its markers are rewritten in the new form.
    pub fn open(
        root: &Path,
        name: &str,
        fp: Value,
        header: &str,
        fresh: &str,
        out: &mut dyn Write,
    ) -> anyhow::Result<(Self, StageState)> {
        let dir = root.join(name);
        let legacy = fp;
        let fp = run_relative(&legacy, root);
        let same = |v: &Value| *v == fp || *v == legacy;
        let read = |name: &str| -> Option<Value> {
            std::fs::read_to_string(dir.join(name))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
        };
        if let Some(mut m) = read("stage.json").filter(|m| same(&m["fingerprint"])) {
            writeln!(out, "{header}: reusing {} (same settings)", dir.display())?;
            if m["fingerprint"] != fp {
                m["fingerprint"] = fp.clone();
                write_json(&dir.join("stage.json"), &m)?;
                write_json(&dir.join("fingerprint.json"), &fp)?;
            }
            return Ok((Self { dir, fp }, StageState::Done(m)));
        }
        let state = if read("fingerprint.json").is_some_and(|f| same(&f)) {
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
        write_json(&dir.join("fingerprint.json"), &fp)?;
        Ok((Self { dir, fp }, state))
    }

    /// Marks the stage complete with its wall time and results.
    pub fn finish(&self, seconds: f64, results: Value) -> anyhow::Result<Value> {
        let marker = json!({"fingerprint": self.fp, "seconds": seconds, "results": results});
        write_json(&self.dir.join("stage.json"), &marker)?;
        Ok(marker)
    }
}

/// Lets a stage whose only change is a larger count at `fp[section][key]` (GRPO's `[grpo]
/// iterations`, raised) go on from where it stopped instead of starting over: when `root/name`
/// was written with the same settings but a smaller count and still holds `state` (the
/// learner's saved state, which the learner extends: crates/learn/src/session.rs), its
/// fingerprint is rewritten to `fp` and its completion marker removed, so that
/// [`Stage::open`] resumes it. Prints `header: extending ...` and returns whether it did.
pub(super) fn extend_count(
    root: &Path,
    name: &str,
    fp: &Value,
    (section, key): (&str, &str),
    state: &str,
    header: &str,
    out: &mut dyn Write,
) -> anyhow::Result<bool> {
    let dir = root.join(name);
    let Some(mut old) = std::fs::read_to_string(dir.join("fingerprint.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
    else {
        return Ok(false);
    };
    let (Some(done), Some(asked)) = (old[section][key].as_u64(), fp[section][key].as_u64()) else {
        return Ok(false);
    };
    old[section][key] = fp[section][key].clone();
    let fp_rel = run_relative(fp, root);
    if done >= asked || (old != fp_rel && old != *fp) || !dir.join(state).exists() {
        return Ok(false);
    }
    writeln!(
        out,
        "{header}: extending {} from {done} to {asked} {key} ({section}.{key} raised, nothing else changed)",
        dir.display()
    )?;
    let marker = dir.join("stage.json");
    if marker.exists() {
        std::fs::remove_file(&marker).with_context(|| format!("removing {}", marker.display()))?;
    }
    write_json(&dir.join("fingerprint.json"), &fp_rel)?;
    Ok(true)
}

fn write_json(path: &Path, v: &Value) -> anyhow::Result<()> {
    write_atomic(path, serde_json::to_string_pretty(v)?.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// How fingerprints name the run folder: `<run>/demos` is the run's own demos/ wherever the
/// folder lies.
const RUN_FOLDER: &str = "<run>";

/// `fp` with every string that is a path inside the run folder `root` (the recorded demos'
/// folder, a model the config names there) rewritten relative to it, from [`RUN_FOLDER`].
pub(super) fn run_relative(fp: &Value, root: &Path) -> Value {
    let sep = std::path::MAIN_SEPARATOR;
    let prefix = format!("{}{sep}", root.display());
    match fp {
        Value::String(s) => match s.strip_prefix(&prefix) {
            Some(rest) if !rest.is_empty() => json!(format!("{RUN_FOLDER}{sep}{rest}")),
            _ => fp.clone(),
        },
        Value::Array(a) => Value::Array(a.iter().map(|v| run_relative(v, root)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), run_relative(v, root)))
                .collect(),
        ),
        _ => fp.clone(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_inside_the_run_folder_are_named_from_it_and_nothing_else_changes() {
        let fp_at = |root: &Path| {
            json!({
                "dataset": root.join("demos"),
                "pretrain": {"dataset": root.join("demos"), "steps": 3},
                "models": [root.join("reward").join("progress"), "runs/vla-other/demos"],
                "name": "runs/vla",
                "elsewhere": "assets/pusht_pusher_200",
                "seed": 0,
            })
        };
        let root = Path::new("runs").join("vla");
        let sep = std::path::MAIN_SEPARATOR;
        let demos = format!("<run>{sep}demos");
        assert_eq!(
            run_relative(&fp_at(&root), &root),
            json!({
                "dataset": demos,
                "pretrain": {"dataset": demos, "steps": 3},
                "models": [format!("<run>{sep}reward{sep}progress"), "runs/vla-other/demos"],
                "name": "runs/vla",
                "elsewhere": "assets/pusht_pusher_200",
                "seed": 0,
            })
        );
        // The same run moved: the same fingerprint.
        let moved = Path::new("backup").join("vla-1");
        assert_eq!(
            run_relative(&fp_at(&moved), &moved),
            run_relative(&fp_at(&root), &root)
        );
    }
}
