//! The resumable part of a training run (`train_state/`): Burn records of weights and optimiser
//! state (MessagePack) plus a `state.json`, read and written the same way by every learner.

use std::path::Path;

use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Record, Recorder};
use burn::tensor::backend::Backend;
use serde::de::DeserializeOwned;

use crate::LearnError;

/// Folder of the resumable state inside a run's output folder.
pub(crate) const STATE_DIR: &str = "train_state";

type Rec = NamedMpkBytesRecorder<FullPrecisionSettings>;

fn state_err(what: &str, e: impl std::fmt::Display) -> LearnError {
    LearnError::Resume(format!("{STATE_DIR}/{what}: {e}"))
}

/// `dir/state.json` when it exists.
pub(crate) fn read_json<T: DeserializeOwned>(dir: &Path) -> Result<Option<T>, LearnError> {
    let path = dir.join("state.json");
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|source| LearnError::Io {
        path: path.clone(),
        source,
    })?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| state_err("state.json", e))
}

/// Reads the record `name` of `dir` (a module's or an optimiser's).
pub(crate) fn load<B: Backend, R: Record<B>>(
    dir: &Path,
    name: &str,
    device: &B::Device,
) -> Result<R, LearnError> {
    let path = dir.join(name);
    let bytes = std::fs::read(&path).map_err(|source| LearnError::Io { path, source })?;
    Recorder::<B>::load(&Rec::default(), bytes, device).map_err(|e| state_err(name, e))
}

/// Serialises a record to be written as `name`.
pub(crate) fn bytes<B: Backend, R: Record<B>>(
    record: R,
    name: &str,
) -> Result<Vec<u8>, LearnError> {
    Recorder::<B>::record(&Rec::default(), record, ()).map_err(|e| state_err(name, e))
}
