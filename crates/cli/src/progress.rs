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
