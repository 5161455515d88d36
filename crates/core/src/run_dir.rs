//! Run folders: `runs/<name>/` holding a copy of the config and an append-only `metrics.jsonl`.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::fs::write_atomic;

/// An open run folder.
#[derive(Debug)]
pub struct RunDir {
    root: PathBuf,
    metrics: std::fs::File,
}

impl RunDir {
    /// Creates (or reopens, to resume) `<runs>/<name>/`, writes `config.toml` atomically and
    /// opens `metrics.jsonl` for appending. Reopening keeps existing metrics.
    pub fn open(runs: &Path, name: &str, config_toml: &str) -> std::io::Result<Self> {
        if name.is_empty() || name.contains(['/', '\\']) || name == "." || name == ".." {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("run name {name:?} must be a plain folder name"),
            ));
        }
        let root = runs.join(name);
        std::fs::create_dir_all(&root)?;
        write_atomic(&root.join("config.toml"), config_toml.as_bytes())?;
        let metrics = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(root.join("metrics.jsonl"))?;
        Ok(Self { root, metrics })
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Appends one JSON object as a line (one `write` call, so lines never interleave).
    pub fn log(&mut self, record: &serde_json::Value) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        self.metrics.write_all(&line)?;
        self.metrics.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_append_across_reopen() {
        let d = tempfile::tempdir().unwrap();
        let mut r = RunDir::open(d.path(), "a", "x = 1\n").unwrap();
        r.log(&serde_json::json!({"step": 1})).unwrap();
        drop(r);
        let mut r = RunDir::open(d.path(), "a", "x = 1\n").unwrap();
        r.log(&serde_json::json!({"step": 2})).unwrap();
        let text = std::fs::read_to_string(d.path().join("a/metrics.jsonl")).unwrap();
        assert_eq!(text, "{\"step\":1}\n{\"step\":2}\n");
        assert_eq!(
            std::fs::read_to_string(d.path().join("a/config.toml")).unwrap(),
            "x = 1\n"
        );
        assert!(RunDir::open(d.path(), "../x", "").is_err());
    }
}
