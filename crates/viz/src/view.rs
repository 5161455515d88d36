//! `diffrl view`: open a recording in the Rerun Viewer.

use std::path::{Path, PathBuf};

use crate::{RECORDING_FILE, VIEWER_PIP, VizError};

/// Turns Rerun's spawn error into ours; a missing viewer names the pip command.
pub(crate) fn spawn_error(e: rerun::SpawnError) -> VizError {
    match e {
        rerun::SpawnError::ExecutableNotFoundInPath { .. } => VizError::NoViewer,
        rerun::SpawnError::ExecutableNotFound { executable_path } => VizError::Spawn(format!(
            "no Rerun Viewer at {executable_path}; install it with `{VIEWER_PIP}`"
        )),
        other => VizError::Spawn(other.to_string()),
    }
}

/// The recordings of `run_or_rrd`: the file itself, or for a run folder its `recording.rrd`
/// followed by the `recording-N.rrd` of later invocations (in N order).
pub fn recording_paths(run_or_rrd: &Path) -> Result<Vec<PathBuf>, VizError> {
    if !run_or_rrd.is_dir() {
        if !run_or_rrd.is_file() {
            return Err(VizError::NoRecording(run_or_rrd.to_path_buf()));
        }
        return Ok(vec![run_or_rrd.to_path_buf()]);
    }
    let first = run_or_rrd.join(RECORDING_FILE);
    if !first.is_file() {
        return Err(VizError::NoRecording(first));
    }
    let mut later: Vec<(u64, PathBuf)> = std::fs::read_dir(run_or_rrd)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    let n = name.strip_prefix("recording-")?.strip_suffix(".rrd")?;
                    Some((n.parse().ok()?, e.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    later.sort();
    Ok(std::iter::once(first)
        .chain(later.into_iter().map(|(_, p)| p))
        .collect())
}

/// Starts a viewer (`rerun` on PATH, its own process) on the recordings of `run_or_rrd`.
/// Returns the files it opened.
pub fn view(run_or_rrd: &Path) -> Result<Vec<PathBuf>, VizError> {
    let paths = recording_paths(run_or_rrd)?;
    let opts = rerun::SpawnOptions {
        // A new viewer even when one is running: that one would not open the files.
        new: true,
        extra_args: paths.iter().map(|p| p.display().to_string()).collect(),
        ..Default::default()
    };
    rerun::spawn(&opts).map_err(spawn_error)?;
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_folder_lists_its_recordings_in_order() {
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(
            recording_paths(d.path()),
            Err(VizError::NoRecording(_))
        ));
        for f in [
            "recording.rrd",
            "recording-10.rrd",
            "recording-2.rrd",
            "recording-x.rrd",
        ] {
            std::fs::write(d.path().join(f), b"").unwrap();
        }
        let names: Vec<String> = recording_paths(d.path())
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            ["recording.rrd", "recording-2.rrd", "recording-10.rrd"]
        );
        let one = d.path().join("recording-2.rrd");
        assert_eq!(recording_paths(&one).unwrap(), vec![one]);
        assert!(recording_paths(&d.path().join("none.rrd")).is_err());
    }
}
