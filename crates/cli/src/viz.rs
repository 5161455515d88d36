//! The `--rerun` flag of every subcommand and `diffrl view`: opens the chosen sink before any
//! work starts (so a bad one fails early), hands the training code a `&dyn Recorder`, and
//! finishes the recording when the command ends or on Ctrl-C (the .rrd footer must be written
//! for `rerun rrd verify` to accept the file).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use clap::Args;
use diffrl_core::record::{Level, NoRecorder, Recorder, Timeline};
use diffrl_viz::{RerunRecorder, RerunSink, paths};

/// A command's recording: nothing (`--rerun off`, the default outside `diffrl run`) or a Rerun
/// stream.
pub struct Recording {
    rec: Option<Arc<RerunRecorder>>,
}

impl Recording {
    /// Records nothing.
    pub fn off() -> Self {
        Self { rec: None }
    }

    /// Opens `sink` (or `default` when the flag was not given) for the command `command`
    /// (e.g. `"pretrain"`), the viewer opening on `timeline`, and says where the recording goes
    /// on `out`.
    pub fn open(
        sink: Option<&RerunSink>,
        default: RerunSink,
        command: &str,
        timeline: Timeline,
        out: &mut dyn Write,
    ) -> anyhow::Result<Self> {
        let sink = sink.cloned().unwrap_or(default);
        let Some(rec) = RerunRecorder::open(&sink, &format!("diffrl {command}"), timeline)? else {
            stop_on_ctrl_c(None);
            return Ok(Self::off());
        };
        let rec = Arc::new(rec);
        stop_on_ctrl_c(Some(Arc::downgrade(&rec)));
        rec.text(
            paths::RUN_LOG,
            Level::Info,
            &format!(
                "diffrl {} {command}: {}",
                env!("CARGO_PKG_VERSION"),
                std::env::args().collect::<Vec<_>>().join(" ")
            ),
        );
        writeln!(out, "rerun: recording to {sink}")?;
        Ok(Self { rec: Some(rec) })
    }

    /// The recorder to hand to training code.
    pub fn recorder(&self) -> &dyn Recorder {
        match &self.rec {
            Some(r) => r.as_ref(),
            None => &NoRecorder,
        }
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        if let Some(r) = &self.rec {
            r.flush();
        }
    }
}

/// On Ctrl-C: let the file write in progress finish (checkpoints, reports: see
/// `diffrl_core::fs::stop_writes`), finish the recording if there is one, then exit with 130 as
/// the default handler would. Holds the recorder weakly so a finished command still drops (and
/// finalises) it normally.
fn stop_on_ctrl_c(rec: Option<Weak<RerunRecorder>>) {
    let spawned = std::thread::Builder::new()
        .name("diffrl-ctrl-c".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            if rt.block_on(tokio::signal::ctrl_c()).is_err() {
                return;
            }
            let _no_more_writes = diffrl_core::fs::stop_writes();
            eprintln!(
                "\ninterrupted: stopped between file writes (checkpoints are whole); `diffrl run` \
                 resumes from the last checkpoint, `diffrl pretrain/grpo/ppo` with --resume (the \
                 work since it, up to [pretrain].checkpoint_every steps or \
                 [grpo].checkpoint_every iterations, runs again)"
            );
            if let Some(r) = rec.and_then(|r| r.upgrade()) {
                eprintln!(
                    "\ninterrupted: finishing the recording ({})",
                    r.description()
                );
                r.finish();
            }
            std::process::exit(130);
        });
    if let Err(e) = spawned {
        eprintln!(
            "warning: no Ctrl-C handler ({e}); an interrupted run may leave an unfinished recording"
        );
    }
}

/// Notes that `command` records nothing when `--rerun` asked for a recording.
pub fn ignored(sink: Option<&RerunSink>, command: &str) {
    if let Some(s) = sink.filter(|s| s.is_on()) {
        eprintln!("note: --rerun {s}: `diffrl {command}` records nothing");
    }
}

/// `diffrl view`.
#[derive(Debug, Args)]
pub struct ViewArgs {
    /// A run folder (opens RUN/recording.rrd) or an .rrd file.
    pub path: PathBuf,
}

/// Opens the recording in a new viewer process.
pub fn view_cmd(args: &ViewArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let paths = diffrl_viz::view::view(Path::new(&args.path))?;
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    writeln!(out, "opened {} in the Rerun Viewer", names.join(", "))?;
    Ok(())
}
