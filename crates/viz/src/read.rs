//! Reading recordings back: which entities an .rrd holds, with how many rows and components.
//! Used by tests and checks; the viewer's own tools (`rerun rrd verify`) remain the reference.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use rerun::log::{Chunk, LogMsg};

use crate::VizError;

/// What one entity of a recording holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntitySummary {
    /// Rows over all chunks.
    pub rows: usize,
    /// Component names (e.g. `LineStrips2D:strips`).
    pub components: BTreeSet<String>,
    /// Timelines the rows are indexed by.
    pub timelines: BTreeSet<String>,
}

/// The data part of a recording (blueprint stores are counted, not listed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordingSummary {
    /// Entities of the recording store, by path (`/scene/block`, ...).
    pub entities: BTreeMap<String, EntitySummary>,
    /// Messages of blueprint stores.
    pub blueprint_messages: usize,
    /// Whether the file ends with an RRD stream footer (the writer finished cleanly).
    pub footer: bool,
}

impl RecordingSummary {
    /// Adds one message.
    pub fn add(&mut self, msg: &LogMsg) -> Result<(), VizError> {
        let LogMsg::ArrowMsg(store, arrow) = msg else {
            return Ok(());
        };
        if !store.is_recording() {
            self.blueprint_messages += 1;
            return Ok(());
        }
        let chunk = Chunk::from_arrow_msg(arrow).map_err(|e| VizError::Read(e.to_string()))?;
        let e = self
            .entities
            .entry(chunk.entity_path().to_string())
            .or_default();
        e.rows += chunk.num_rows();
        e.components
            .extend(chunk.component_descriptors().map(|d| d.to_string()));
        e.timelines
            .extend(chunk.timelines().keys().map(|t| t.to_string()));
        Ok(())
    }

    /// Summarises messages (e.g. a memory sink's).
    pub fn from_messages(msgs: &[LogMsg]) -> Result<Self, VizError> {
        let mut s = Self::default();
        for m in msgs {
            s.add(m)?;
        }
        Ok(s)
    }

    /// Rows of `path` (0 when absent).
    pub fn rows(&self, path: &str) -> usize {
        self.entities.get(path).map_or(0, |e| e.rows)
    }
}

/// Decodes the .rrd at `path`.
pub fn read_rrd(path: &Path) -> Result<RecordingSummary, VizError> {
    let open = || {
        std::fs::File::open(path).map_err(|e| VizError::Read(format!("{}: {e}", path.display())))
    };
    let mut s = RecordingSummary::default();
    let decoder = re_log_encoding::DecoderApp::decode_eager(BufReader::new(open()?))
        .map_err(|e| VizError::Read(format!("{}: {e}", path.display())))?;
    for msg in decoder {
        let msg = msg.map_err(|e| VizError::Read(format!("{}: {e}", path.display())))?;
        s.add(&msg)?;
    }
    // The stream footer's fixed part ends the file: FourCC, "FOOT", entry count.
    let mut f = open()?;
    let mut tail = [0u8; 12];
    s.footer = f.seek(SeekFrom::End(-12)).is_ok()
        && f.read_exact(&mut tail).is_ok()
        && tail[..4] == re_log_encoding::RRD_FOURCC
        && &tail[4..8] == b"FOOT";
    Ok(s)
}
