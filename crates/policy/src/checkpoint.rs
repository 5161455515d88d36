//! Policy checkpoints: a folder with `model.safetensors` (weights), `policy.json` (config,
//! dimensions, normalisers and free-form training metadata) and, for a policy fine-tuned on the
//! last K' < K chain steps, `base.safetensors` (the frozen network that runs the steps before
//! them; see `Policy::with_base`), and for a language-conditioned policy (`spec.text` in
//! `policy.json`) `vocab.json`, its instruction vocabulary (`{"tokens": [...]}`, a token's id
//! being its position), which loading then requires. Written to a temporary sibling folder and
//! renamed into place, so a crash never leaves a half-written checkpoint.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::store::{ModuleSnapshot, SafetensorsStore};
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::config::PolicyConfig;
use crate::error::CheckpointError;
use crate::policy::{Normalizers, Policy, PolicySpec};
use crate::tokenizer::Vocabulary;

/// Weights file inside a checkpoint folder.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// Weights of the base network (the chain's steps before the last K'), when the policy has one.
pub const BASE_FILE: &str = "base.safetensors";
/// Metadata file inside a checkpoint folder.
pub const META_FILE: &str = "policy.json";
/// Instruction vocabulary of a language-conditioned policy.
pub const VOCAB_FILE: &str = "vocab.json";
/// Name ending of the token-embedding tensor of the instruction encoder in the weights file.
const TOKEN_EMBEDDING: &str = "token_embedding.weight";
const FORMAT: u32 = 1;

/// Everything but the weights.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyMeta {
    /// Checkpoint format version.
    pub format: u32,
    /// Policy configuration (architecture and diffusion settings).
    pub config: PolicyConfig,
    /// Dimensions.
    pub spec: PolicySpec,
    /// Normalisers.
    pub norm: Normalizers,
    /// Training metadata (step, dataset, losses, ...), free-form.
    #[serde(default)]
    pub info: serde_json::Value,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Serialises the weights of a model (a policy, a reward model, ...) to safetensors bytes.
pub fn weights_to_bytes<B: Backend, M: Module<B>>(model: &M) -> Result<Vec<u8>, String> {
    let mut store = SafetensorsStore::from_bytes(None);
    model.save_into(&mut store).map_err(|e| e.to_string())?;
    canonical_header(store.get_bytes().map_err(|e| e.to_string())?)
}

/// Rewrites a safetensors header with its JSON keys sorted. Burn writes the header from hash
/// maps, so identical weights gave different bytes in different processes; sorted, the same
/// weights always give the same file (reproducibility checks can compare hashes).
fn canonical_header(bytes: Vec<u8>) -> Result<Vec<u8>, String> {
    let bad = || "safetensors bytes from Burn have no valid header".to_string();
    let len = u64::from_le_bytes(
        bytes
            .get(..8)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?,
    );
    let end = usize::try_from(len)
        .map_err(|_| bad())?
        .checked_add(8)
        .ok_or_else(bad)?;
    let header: serde_json::Value =
        serde_json::from_slice(bytes.get(8..end).ok_or_else(bad)?).map_err(|e| e.to_string())?;
    // serde_json's map is ordered by key (the `preserve_order` feature is not enabled).
    let mut text = serde_json::to_vec(&header).map_err(|e| e.to_string())?;
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + text.len() + bytes.len() - end);
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[end..]);
    Ok(out)
}

/// Loads safetensors bytes into a model of the same architecture, refusing missing, unused or
/// mis-shaped tensors.
pub fn weights_from_bytes<B: Backend, M: Module<B>>(
    model: &mut M,
    bytes: Vec<u8>,
    path: &Path,
) -> Result<(), CheckpointError> {
    let mut store = SafetensorsStore::from_bytes(Some(bytes))
        .validate(true)
        .allow_partial(true);
    let result = model.load_from(&mut store).map_err(|e| {
        let mut message = e.to_string();
        // burn-store reports shape mismatches as a failed validation, decoding problems
        // otherwise: the first means "another architecture", the second "corrupt file".
        let mismatch = message.contains("Mismatch");
        if message.len() > 600 {
            message.truncate(600);
            message.push_str(" ...");
        }
        if mismatch {
            CheckpointError::Mismatch {
                path: path.to_path_buf(),
                message,
            }
        } else {
            CheckpointError::Corrupt {
                path: path.to_path_buf(),
                message,
            }
        }
    })?;
    let mut problems = Vec::new();
    problems.extend(result.errors.iter().map(|e| format!("{e:?}")));
    problems.extend(result.missing.iter().map(|(p, _)| format!("missing {p}")));
    problems.extend(result.unused.iter().map(|p| format!("unexpected {p}")));
    if problems.is_empty() {
        Ok(())
    } else {
        problems.truncate(8);
        Err(CheckpointError::Mismatch {
            path: path.to_path_buf(),
            message: problems.join("; "),
        })
    }
}

/// Writes `policy` to the folder `dir` atomically (replacing an existing checkpoint there).
pub fn save<B: Backend>(
    policy: &Policy<B>,
    dir: &Path,
    info: serde_json::Value,
) -> Result<(), CheckpointError> {
    let meta = PolicyMeta {
        format: FORMAT,
        config: policy.config.clone(),
        spec: policy.spec.clone(),
        norm: policy.norm.clone(),
        info,
    };
    let weights = weights_to_bytes(&policy.model).map_err(|message| CheckpointError::Corrupt {
        path: dir.join(WEIGHTS_FILE),
        message,
    })?;
    let json = serde_json::to_vec_pretty(&meta).expect("policy metadata serialises");
    let base = match policy.base() {
        Some(b) => Some(
            weights_to_bytes(b).map_err(|message| CheckpointError::Corrupt {
                path: dir.join(BASE_FILE),
                message,
            })?,
        ),
        None => None,
    };
    let vocab = policy
        .tokenizer()
        .map(|t| serde_json::to_vec_pretty(t.vocabulary()).expect("vocabularies serialise"));
    let mut files: Vec<(&str, &[u8])> = vec![(WEIGHTS_FILE, &weights), (META_FILE, &json)];
    if let Some(b) = &base {
        files.push((BASE_FILE, b));
    }
    if let Some(v) = &vocab {
        files.push((VOCAB_FILE, v));
    }
    write_dir_atomic(dir, &files)
}

/// Reads the vocabulary of a language-conditioned checkpoint; errors name the file.
pub fn load_vocabulary(dir: &Path) -> Result<Vocabulary, CheckpointError> {
    let path = dir.join(VOCAB_FILE);
    let bad = |message: String| CheckpointError::Vocabulary {
        path: path.clone(),
        message,
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(bad(format!(
                "missing: {META_FILE} says the policy reads text (spec.text), and its \
                 instruction vocabulary belongs in this file"
            )));
        }
        Err(e) => return Err(bad(format!("unreadable: {e}"))),
    };
    serde_json::from_str(&text).map_err(|e| bad(format!("not a diffrl vocabulary: {e}")))
}

/// Rows of the first tensor whose name ends with `suffix` in safetensors `bytes` (None when
/// the header does not parse or holds no such tensor: weight loading reports those).
fn tensor_rows(bytes: &[u8], suffix: &str) -> Option<usize> {
    let len = usize::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?;
    let header: serde_json::Value = serde_json::from_slice(bytes.get(8..8 + len)?).ok()?;
    let (_, t) = header
        .as_object()?
        .iter()
        .find(|(name, _)| name.ends_with(suffix))?;
    usize::try_from(t.get("shape")?.get(0)?.as_u64()?).ok()
}

/// Writes a folder of files atomically: a temporary sibling, then renames.
pub fn write_dir_atomic(dir: &Path, files: &[(&str, &[u8])]) -> Result<(), CheckpointError> {
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "checkpoint".into());
    let _writing = diffrl_core::fs::write_guard();
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}.tmp"))
        .tempdir_in(&parent)
        .map_err(io(&parent))?;
    for (file, bytes) in files {
        let p = tmp.path().join(file);
        std::fs::write(&p, bytes).map_err(io(&p))?;
    }
    let tmp = tmp.keep();
    if dir.exists() {
        let old = parent.join(format!(".{name}.old-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&old);
        std::fs::rename(dir, &old).map_err(io(dir))?;
        std::fs::rename(&tmp, dir).map_err(io(dir))?;
        let _ = std::fs::remove_dir_all(&old);
    } else {
        std::fs::rename(&tmp, dir).map_err(io(dir))?;
    }
    Ok(())
}

/// Reads only the metadata of a checkpoint folder.
pub fn load_meta(dir: &Path) -> Result<PolicyMeta, CheckpointError> {
    let path = dir.join(META_FILE);
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    let meta: PolicyMeta = serde_json::from_str(&text).map_err(|e| CheckpointError::Meta {
        path: path.clone(),
        message: e.to_string(),
    })?;
    if meta.format != FORMAT {
        return Err(CheckpointError::Meta {
            path,
            message: format!("format {} (this build reads format {FORMAT})", meta.format),
        });
    }
    Ok(meta)
}

/// Loads a checkpoint folder onto `device`; returns the policy and its training metadata.
pub fn load<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(Policy<B>, serde_json::Value), CheckpointError> {
    let meta = load_meta(dir)?;
    let meta_path = dir.join(META_FILE);
    let wpath = dir.join(WEIGHTS_FILE);
    let bytes = std::fs::read(&wpath).map_err(io(&wpath))?;
    let vocab = if meta.spec.text {
        let vocab = load_vocabulary(dir)?;
        if let Some(rows) = tensor_rows(&bytes, TOKEN_EMBEDDING)
            && rows != vocab.len()
        {
            return Err(CheckpointError::Vocabulary {
                path: dir.join(VOCAB_FILE),
                message: format!(
                    "holds {} tokens, but the instruction encoder's token embedding in \
                     {WEIGHTS_FILE} has {rows} rows: the vocabulary is not the one this policy \
                     was trained with",
                    vocab.len()
                ),
            });
        }
        Some(vocab)
    } else {
        None
    };
    let built = match vocab {
        Some(v) => Policy::with_text(meta.config, meta.spec, meta.norm, v, 0, device),
        None => Policy::new(meta.config, meta.spec, meta.norm, 0, device),
    };
    let mut policy = built.map_err(|source| CheckpointError::Policy {
        path: meta_path,
        source,
    })?;
    weights_from_bytes(&mut policy.model, bytes, &wpath)?;
    let bpath = dir.join(BASE_FILE);
    if bpath.exists() {
        let mut base = policy.model.clone();
        let bytes = std::fs::read(&bpath).map_err(io(&bpath))?;
        weights_from_bytes(&mut base, bytes, &bpath)?;
        policy = policy.with_base(base);
    }
    Ok((policy, meta.info))
}
