//! How long work shows itself: progress bars on the terminal and metrics.jsonl lines on disk.

use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar drawn with `template` (indicatif's syntax).
pub(crate) fn bar(len: u64, template: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb
}

/// Appends one JSON line to a metrics.jsonl (best effort: a full disk must not stop training).
pub(crate) fn append_metrics(path: &Path, v: &serde_json::Value) {
    use std::io::Write as _;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{v}");
    }
}

/// Drops from a metrics.jsonl the `train` and `eval` lines whose `key` (`step` or `iteration`)
/// is above `done`. A trainer calls it at its first line, with `done` the work its run starts
/// from: a run resumed from its last checkpoint then does not repeat the lines logged after
/// that checkpoint (a run killed between a line and its checkpoint), and a fresh run in a
/// folder with an old log starts a fresh log. Best effort, as the lines themselves; the file is
/// rewritten through a temporary file and a rename.
pub(crate) fn trim_metrics(path: &Path, key: &str, done: u64) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let keep = |line: &&str| match serde_json::from_str::<serde_json::Value>(line) {
        Ok(v) => ["train", "eval"]
            .iter()
            .all(|k| v[k][key].as_u64().is_none_or(|n| n <= done)),
        Err(_) => true,
    };
    // A line without its newline was torn by a kill mid-write: drop it, or the next line
    // appended would run into it and be lost too.
    let whole = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    let kept: Vec<&str> = whole.lines().filter(keep).collect();
    if kept.len() < text.lines().count() {
        let body: String = kept.iter().map(|l| format!("{l}\n")).collect();
        let _ = diffrl_core::fs::write_atomic(path, body.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trimming_keeps_the_lines_up_to_the_resumed_work() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("metrics.jsonl");
        let lines = [
            r#"{"stage":"grpo","train":{"iteration":1}}"#,
            r#"{"stage":"grpo","eval":{"iteration":1,"success_rate":0.5}}"#,
            r#"{"stage":"grpo","train":{"iteration":2}}"#,
            r#"{"stage":"grpo","train":{"iteration":3}}"#,
            r#"{"stage":"done"}"#,
        ];
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        trim_metrics(&p, "iteration", 1);
        let kept = std::fs::read_to_string(&p).unwrap();
        assert_eq!(kept, [lines[0], lines[1], lines[4]].join("\n") + "\n");
        // Nothing above: the file is left as it is; a fresh start (0) keeps no train lines.
        trim_metrics(&p, "iteration", 5);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), kept);
        trim_metrics(&p, "iteration", 0);
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            lines[4].to_string() + "\n"
        );
        trim_metrics(&d.path().join("absent.jsonl"), "step", 0);
        // A last line torn by a kill mid-write is dropped, so the next append starts clean.
        std::fs::write(&p, format!("{}\n{{\"stage\":\"grpo\",\"tra", lines[0])).unwrap();
        trim_metrics(&p, "iteration", 1);
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            lines[0].to_string() + "\n"
        );
    }
}
