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

/// The recording of `run_or_rrd`: the file itself, or `RUN/recording.rrd` for a run folder.
pub fn recording_path(run_or_rrd: &Path) -> Result<PathBuf, VizError> {
    let path = if run_or_rrd.is_dir() {
        run_or_rrd.join(RECORDING_FILE)
    } else {
        run_or_rrd.to_path_buf()
    };
    if !path.is_file() {
        return Err(VizError::NoRecording(path));
    }
    Ok(path)
}

/// Starts a viewer (`rerun` on PATH, its own process) on the recording of `run_or_rrd`.
/// Returns the file it opened.
pub fn view(run_or_rrd: &Path) -> Result<PathBuf, VizError> {
    let path = recording_path(run_or_rrd)?;
    let opts = rerun::SpawnOptions {
        // A new viewer even when one is running: that one would not open the file.
        new: true,
        extra_args: vec![path.display().to_string()],
        ..Default::default()
    };
    rerun::spawn(&opts).map_err(spawn_error)?;
    Ok(path)
}
