//! diffrl-viz: recordings for the Rerun Viewer (`pip install rerun-sdk==0.36.3`).
//!
//! - [`RerunRecorder`]: diffrl-core's [`Recorder`](diffrl_core::record::Recorder) on a Rerun
//!   stream (scenes, action chunks, denoising chains, rewards, group statistics, training
//!   scalars in columns, episode logs, documents, bar charts). Training code sees only the
//!   trait; this crate is the only one that imports rerun.
//! - [`RerunSink`]: the `--rerun off|spawn|save=PATH|connect=URL|serve=PORT` flag.
//! - [`blueprint::default_blueprint`]: the layout every recording carries (2-D, or 3-D once a
//!   3-D scene arrives).
//! - [`paths`]: the entity paths (docs/viz.md).
//! - [`read`]: decode an .rrd back (entities, rows, components, footer).
//! - [`view`]: open a run's recording in a spawned viewer.
//!
//! Sink failures never stop training: a viewer that is missing or goes away, a disk that fills
//! up, each print one warning and the run goes on. What can be checked before training (an
//! unwritable save path, a port in use, no viewer binary for `spawn`) is an error instead.
#![warn(missing_docs)]

pub mod blueprint;
mod guarded;
pub mod paths;
pub mod read;
mod recorder;
mod sink;
pub mod view;

use std::path::PathBuf;

pub use recorder::{APP_ID, RerunRecorder};
pub use sink::{DEFAULT_PORT, RerunSink, SinkParseError};

/// A run folder's recording (`diffrl run` saves there by default; `diffrl view RUN` opens it).
pub const RECORDING_FILE: &str = "recording.rrd";

/// How users get the matching viewer.
pub const VIEWER_PIP: &str = "pip install rerun-sdk==0.36.3";

/// What can go wrong before anything is recorded (after that, only warnings).
#[derive(Debug, thiserror::Error)]
pub enum VizError {
    /// The recording file cannot be created.
    #[error("--rerun save={}: cannot write the recording: {message}", path.display())]
    Save {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The serve address cannot be bound.
    #[error("--rerun serve: cannot listen on {addr}: {message}")]
    Serve {
        /// `bind:port`.
        addr: String,
        /// Why.
        message: String,
    },
    /// A connect URL is not usable.
    #[error("--rerun connect: {0}")]
    Connect(String),
    /// No `rerun` executable on PATH.
    #[error(
        "the Rerun Viewer (`rerun`) is not on PATH; install the version matching this diffrl \
         with `{VIEWER_PIP}`, or record to a file with --rerun save=PATH and open it later"
    )]
    NoViewer,
    /// The viewer could not be started.
    #[error("starting the Rerun Viewer: {0}")]
    Spawn(String),
    /// `diffrl view` found no recording.
    #[error(
        "no recording at {} (record one with --rerun save=PATH, or pass a run folder that \
         has a {RECORDING_FILE})",
        .0.display()
    )]
    NoRecording(PathBuf),
    /// Reading an .rrd failed.
    #[error("reading a recording: {0}")]
    Read(String),
    /// The Rerun SDK refused to build the stream.
    #[error("rerun: {0}")]
    Rerun(String),
}
