//! Reward-model folders: `model.safetensors` + `reward.json`, written atomically. The JSON's
//! `kind` names the model a folder holds, so loading the wrong kind says so.

use std::path::Path;

use burn::module::Module;
use burn::tensor::backend::Backend;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::RewardError;

/// Weights file of a reward-model folder.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// Metadata file of a reward-model folder.
pub const META_FILE: &str = "reward.json";

fn ck(path: &Path, message: impl Into<String>) -> RewardError {
    RewardError::Checkpoint {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Writes `net` and `meta` into `dir` atomically (a temporary folder, then renames).
pub(crate) fn save<B: Backend, M: Module<B>>(
    dir: &Path,
    net: &M,
    meta: &impl Serialize,
) -> Result<(), RewardError> {
    let weights = diffrl_policy::checkpoint::weights_to_bytes(net).map_err(|m| ck(dir, m))?;
    let meta = serde_json::to_vec_pretty(meta).map_err(|e| ck(dir, e.to_string()))?;
    diffrl_policy::checkpoint::write_dir_atomic(
        dir,
        &[(WEIGHTS_FILE, &weights), (META_FILE, &meta)],
    )
    .map_err(|e| ck(dir, e.to_string()))
}

/// Reads the metadata of a folder that must hold a `kind` model (`what` names it in errors,
/// e.g. "a progress model"; `train` is the command that makes one). `legacy` lists settings
/// of `config` added after folders were first written, with the value such older folders were
/// trained with (the current default may differ).
pub(crate) fn load_meta<T: DeserializeOwned>(
    dir: &Path,
    kind: &str,
    what: &str,
    train: &str,
    legacy: &[(&str, serde_json::Value)],
) -> Result<T, RewardError> {
    let path = dir.join(META_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        ck(
            &path,
            format!("{e} (a reward-model folder holds {META_FILE} and {WEIGHTS_FILE}; train one with `{train}`)"),
        )
    })?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ck(&path, format!("invalid JSON: {e}")))?;
    if value["kind"] != kind {
        return Err(ck(&path, format!("a {} model, not {what}", value["kind"])));
    }
    let mut value = value;
    if let Some(config) = value.get_mut("config").and_then(|c| c.as_object_mut()) {
        for (key, old) in legacy {
            config.entry(key.to_string()).or_insert_with(|| old.clone());
        }
    }
    serde_json::from_value(value).map_err(|e| ck(&path, format!("invalid JSON: {e}")))
}

/// Loads the weights of `dir` into `net` (built with the folder's metadata).
pub(crate) fn load_weights<B: Backend, M: Module<B>>(
    dir: &Path,
    net: &mut M,
) -> Result<(), RewardError> {
    let path = dir.join(WEIGHTS_FILE);
    let bytes = std::fs::read(&path).map_err(|e| ck(&path, e.to_string()))?;
    diffrl_policy::checkpoint::weights_from_bytes(net, bytes, &path)
        .map_err(|e| ck(&path, e.to_string()))
}
