//! LeRobot dataset v3.0 folders: writing episodes so LeRobot tools read them, and reading the
//! same layout back, including datasets LeRobot itself produced (state-only columns).
//!
//! ```text
//! meta/info.json                          fps, features, totals, path templates
//! meta/stats.json                         per feature: min max mean std count q01 q10 q50 q90 q99
//! meta/tasks.parquet                      task_index, task (+ __index_level_0__ for rerun)
//! meta/episodes/chunk-000/file-000.parquet  one row per episode (length, index ranges, stats)
//! data/chunk-000/file-000.parquet         one row per frame, many episodes per file
//! ```
//! A dataset is written into a temporary sibling folder and renamed into place, so a crash
//! never leaves a half-written dataset.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{
    Array, ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, Float64Array, Int32Array,
    Int64Array, LargeListArray, LargeStringArray, ListArray, RecordBatch, StringArray,
};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use serde_json::{Value, json};

use crate::DatasetError;
use crate::episode::Episode;
use crate::space::Observation;

/// Episodes per chunk folder (LeRobot's default).
pub const CHUNKS_SIZE: usize = 1000;
const DATA_FILE: &str = "data/chunk-000/file-000.parquet";
const EPISODES_FILE: &str = "meta/episodes/chunk-000/file-000.parquet";
const INDEX_COLUMNS: [&str; 5] = [
    "timestamp",
    "frame_index",
    "episode_index",
    "index",
    "task_index",
];

/// What the writer needs besides the episodes.
#[derive(Debug, Clone)]
pub struct DatasetMeta {
    /// Control frequency.
    pub fps: u32,
    /// LeRobot's `robot_type`.
    pub robot_type: String,
    /// Names of the `observation.state` components.
    pub state_names: Vec<String>,
    /// Names of the `action` components.
    pub action_names: Vec<String>,
    /// The task description of every episode.
    pub task: String,
    /// Free-form provenance stored in info.json under `diffrl` (command, seed, versions).
    pub provenance: Value,
}

/// A float feature column: `len * dim` values, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// Components per frame.
    pub dim: usize,
    /// Values.
    pub data: Vec<f32>,
}

impl Column {
    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.data.len().checked_div(self.dim).unwrap_or(0)
    }
    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// A dataset read from disk.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// The folder.
    pub root: PathBuf,
    /// `meta/info.json` as read.
    pub info: Value,
    /// Frames per second.
    pub fps: f64,
    /// Tasks by index.
    pub tasks: Vec<String>,
    /// Frame index inside its episode.
    pub frame_index: Vec<i64>,
    /// Episode of each frame.
    pub episode_index: Vec<i64>,
    /// Global frame index.
    pub index: Vec<i64>,
    /// Task of each frame.
    pub task_index: Vec<i64>,
    /// Every numeric or boolean feature (vectors and scalars), booleans as 0/1.
    pub columns: BTreeMap<String, Column>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DatasetError + '_ {
    move |source| DatasetError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn corrupt(path: &Path, message: impl Into<String>) -> DatasetError {
    DatasetError::Corrupt {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn vector_field(name: &str, dim: usize) -> Field {
    let item = Arc::new(Field::new("item", DataType::Float32, true));
    Field::new(name, DataType::FixedSizeList(item, dim as i32), false)
}

fn vector_array(values: Vec<f32>, dim: usize) -> ArrayRef {
    let item = Arc::new(Field::new("item", DataType::Float32, true));
    Arc::new(FixedSizeListArray::new(
        item,
        dim as i32,
        Arc::new(Float32Array::from(values)),
        None,
    ))
}

/// Per-component statistics in LeRobot's format.
fn feature_stats(col: &Column) -> Value {
    let n = col.len();
    let mut stats: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for d in 0..col.dim {
        let mut v: Vec<f64> = (0..n).map(|i| col.data[i * col.dim + d] as f64).collect();
        v.sort_by(f64::total_cmp);
        let mean = v.iter().sum::<f64>() / n.max(1) as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n.max(1) as f64;
        let q = |p: f64| {
            // Linear interpolation between order statistics (numpy's default quantile).
            crate::stats::linear_quantile(&v, p).unwrap_or(0.0)
        };
        for (k, x) in [
            ("min", v.first().copied().unwrap_or(0.0)),
            ("max", v.last().copied().unwrap_or(0.0)),
            ("mean", mean),
            ("std", var.sqrt()),
            ("q01", q(0.01)),
            ("q10", q(0.10)),
            ("q50", q(0.50)),
            ("q90", q(0.90)),
            ("q99", q(0.99)),
        ] {
            stats.entry(k).or_default().push(x);
        }
    }
    let mut out = serde_json::Map::new();
    for (k, v) in stats {
        out.insert(k.into(), json!(v));
    }
    out.insert("count".into(), json!([n]));
    Value::Object(out)
}

/// Writes `episodes` as a LeRobot v3.0 dataset at `out`. Fails if `out` exists and is not
/// empty unless `overwrite`; the folder appears only when complete.
pub fn write_dataset(
    out: &Path,
    meta: &DatasetMeta,
    episodes: &[Episode],
    overwrite: bool,
) -> Result<(), DatasetError> {
    if episodes.is_empty() {
        return Err(DatasetError::Invalid("no episodes to write".into()));
    }
    let (sd, ad) = (meta.state_names.len(), meta.action_names.len());
    for (e, ep) in episodes.iter().enumerate() {
        if ep.is_empty() {
            return Err(DatasetError::Invalid(format!("episode {e} has no steps")));
        }
        for (t, (o, a)) in ep.observations.iter().zip(&ep.actions).enumerate() {
            if o.state.len() != sd || a.len() != ad {
                return Err(DatasetError::Invalid(format!(
                    "episode {e} step {t}: state has {} values and action {}, expected {sd} and {ad}",
                    o.state.len(),
                    a.len()
                )));
            }
        }
    }
    if out.exists()
        && std::fs::read_dir(out)
            .map_err(io_err(out))?
            .next()
            .is_some()
        && !overwrite
    {
        return Err(DatasetError::Invalid(format!(
            "{} exists and is not empty (pass overwrite to replace it)",
            out.display()
        )));
    }
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io_err(parent))?;
    let tmp = tempfile::Builder::new()
        .prefix(".diffrl-dataset-")
        .tempdir_in(parent)
        .map_err(io_err(parent))?;
    write_into(tmp.path(), meta, episodes)?;
    let _writing = crate::fs::write_guard();
    let tmp_path = tmp.keep();
    // Move the old folder aside before renaming the new one in, so that at every moment either
    // the old or the new dataset is complete on disk.
    let old = out
        .exists()
        .then(|| parent.join(format!(".diffrl-dataset-old-{}", std::process::id())));
    if let Some(old) = &old {
        std::fs::rename(out, old).map_err(io_err(out))?;
    }
    std::fs::rename(&tmp_path, out).map_err(io_err(out))?;
    if let Some(old) = &old {
        std::fs::remove_dir_all(old).map_err(io_err(old))?;
    }
    Ok(())
}

fn write_into(root: &Path, meta: &DatasetMeta, episodes: &[Episode]) -> Result<(), DatasetError> {
    let (sd, ad) = (meta.state_names.len(), meta.action_names.len());
    let frames: usize = episodes.iter().map(Episode::len).sum();
    let fps = meta.fps as f32;

    // Frame table.
    let mut state = Vec::with_capacity(frames * sd);
    let mut action = Vec::with_capacity(frames * ad);
    let (mut reward, mut done, mut success) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ts, mut fi, mut ei, mut idx) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (e, ep) in episodes.iter().enumerate() {
        let last = ep.len() - 1;
        for t in 0..ep.len() {
            state.extend_from_slice(&ep.observations[t].state);
            action.extend_from_slice(&ep.actions[t]);
            reward.push(ep.rewards[t]);
            done.push(t == last);
            success.push(ep.successes[t]);
            ts.push(t as f32 / fps);
            fi.push(t as i64);
            ei.push(e as i64);
            idx.push(idx.len() as i64);
        }
    }
    let columns = BTreeMap::from([
        (
            "observation.state".to_string(),
            Column {
                dim: sd,
                data: state.clone(),
            },
        ),
        (
            "action".to_string(),
            Column {
                dim: ad,
                data: action.clone(),
            },
        ),
        (
            "next.reward".to_string(),
            Column {
                dim: 1,
                data: reward.clone(),
            },
        ),
        (
            "next.done".to_string(),
            Column {
                dim: 1,
                data: done.iter().map(|&b| b as u8 as f32).collect(),
            },
        ),
        (
            "next.success".to_string(),
            Column {
                dim: 1,
                data: success.iter().map(|&b| b as u8 as f32).collect(),
            },
        ),
        (
            "timestamp".to_string(),
            Column {
                dim: 1,
                data: ts.clone(),
            },
        ),
        (
            "frame_index".to_string(),
            Column {
                dim: 1,
                data: fi.iter().map(|&v| v as f32).collect(),
            },
        ),
        (
            "episode_index".to_string(),
            Column {
                dim: 1,
                data: ei.iter().map(|&v| v as f32).collect(),
            },
        ),
        (
            "index".to_string(),
            Column {
                dim: 1,
                data: idx.iter().map(|&v| v as f32).collect(),
            },
        ),
        (
            "task_index".to_string(),
            Column {
                dim: 1,
                data: vec![0.0; frames],
            },
        ),
    ]);
    let schema = Arc::new(Schema::new(vec![
        vector_field("observation.state", sd),
        vector_field("action", ad),
        Field::new("next.reward", DataType::Float32, false),
        Field::new("next.done", DataType::Boolean, false),
        Field::new("next.success", DataType::Boolean, false),
        Field::new("timestamp", DataType::Float32, false),
        Field::new("frame_index", DataType::Int64, false),
        Field::new("episode_index", DataType::Int64, false),
        Field::new("index", DataType::Int64, false),
        Field::new("task_index", DataType::Int64, false),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            vector_array(state, sd),
            vector_array(action, ad),
            Arc::new(Float32Array::from(reward)),
            Arc::new(BooleanArray::from(done)),
            Arc::new(BooleanArray::from(success)),
            Arc::new(Float32Array::from(ts)),
            Arc::new(Int64Array::from(fi)),
            Arc::new(Int64Array::from(ei)),
            Arc::new(Int64Array::from(idx)),
            Arc::new(Int64Array::from(vec![0i64; frames])),
        ],
    )
    .map_err(|e| DatasetError::Invalid(e.to_string()))?;
    write_parquet(&root.join(DATA_FILE), &batch)?;

    // Tasks.
    let tasks_schema = Schema::new(vec![
        Field::new("task_index", DataType::Int64, false),
        Field::new("task", DataType::Utf8, false),
        Field::new("__index_level_0__", DataType::Utf8, false),
    ])
    .with_metadata(std::collections::HashMap::from([(
        "pandas".to_string(),
        pandas_task_metadata(),
    )]));
    let tasks = RecordBatch::try_new(
        Arc::new(tasks_schema),
        vec![
            Arc::new(Int64Array::from(vec![0i64])),
            Arc::new(StringArray::from(vec![meta.task.as_str()])),
            Arc::new(StringArray::from(vec![meta.task.as_str()])),
        ],
    )
    .map_err(|e| DatasetError::Invalid(e.to_string()))?;
    write_parquet(&root.join("meta/tasks.parquet"), &tasks)?;

    // Episodes table, with per-episode stats of the float features.
    let stat_keys = ["observation.state", "action", "next.reward"];
    let mut ep_fields = vec![
        Field::new("episode_index", DataType::Int64, false),
        Field::new(
            "tasks",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            false,
        ),
        Field::new("length", DataType::Int64, false),
        Field::new("data/chunk_index", DataType::Int64, false),
        Field::new("data/file_index", DataType::Int64, false),
        Field::new("dataset_from_index", DataType::Int64, false),
        Field::new("dataset_to_index", DataType::Int64, false),
        Field::new("meta/episodes/chunk_index", DataType::Int64, false),
        Field::new("meta/episodes/file_index", DataType::Int64, false),
    ];
    let mut tasks_col = ListBuilder::new(StringBuilder::new());
    let (mut lens, mut from, mut to) = (Vec::new(), Vec::new(), Vec::new());
    let mut per_ep_stats: Vec<BTreeMap<String, Vec<f64>>> = Vec::new();
    let mut start = 0usize;
    for ep in episodes {
        tasks_col.values().append_value(&meta.task);
        tasks_col.append(true);
        lens.push(ep.len() as i64);
        from.push(start as i64);
        to.push((start + ep.len()) as i64);
        let mut m = BTreeMap::new();
        for key in stat_keys {
            let col = &columns[key];
            let sub = Column {
                dim: col.dim,
                data: col.data[start * col.dim..(start + ep.len()) * col.dim].to_vec(),
            };
            if let Value::Object(s) = feature_stats(&sub) {
                for (stat, v) in s {
                    let v: Vec<f64> = serde_json::from_value(v).unwrap_or_default();
                    m.insert(format!("stats/{key}/{stat}"), v);
                }
            }
        }
        per_ep_stats.push(m);
        start += ep.len();
    }
    let n = episodes.len();
    let mut ep_cols: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from((0..n as i64).collect::<Vec<_>>())),
        Arc::new(tasks_col.finish()),
        Arc::new(Int64Array::from(lens)),
        Arc::new(Int64Array::from(vec![0i64; n])),
        Arc::new(Int64Array::from(vec![0i64; n])),
        Arc::new(Int64Array::from(from)),
        Arc::new(Int64Array::from(to)),
        Arc::new(Int64Array::from(vec![0i64; n])),
        Arc::new(Int64Array::from(vec![0i64; n])),
    ];
    for name in per_ep_stats[0].keys() {
        let width = per_ep_stats[0][name].len();
        let values: Vec<f64> = per_ep_stats
            .iter()
            .flat_map(|m| m[name].iter().copied())
            .collect();
        let item = Arc::new(Field::new("item", DataType::Float64, true));
        ep_fields.push(Field::new(
            name,
            DataType::FixedSizeList(item.clone(), width as i32),
            false,
        ));
        ep_cols.push(Arc::new(FixedSizeListArray::new(
            item,
            width as i32,
            Arc::new(Float64Array::from(values)),
            None,
        )));
    }
    let ep_batch = RecordBatch::try_new(Arc::new(Schema::new(ep_fields)), ep_cols)
        .map_err(|e| DatasetError::Invalid(e.to_string()))?;
    write_parquet(&root.join(EPISODES_FILE), &ep_batch)?;

    // stats.json and info.json.
    let mut stats = serde_json::Map::new();
    for (k, col) in &columns {
        stats.insert(k.clone(), feature_stats(col));
    }
    write_json(&root.join("meta/stats.json"), &Value::Object(stats))?;
    let scalar = |dtype: &str| json!({"dtype": dtype, "shape": [1], "names": null});
    let info = json!({
        "codebase_version": "v3.0",
        "robot_type": meta.robot_type,
        "total_episodes": n,
        "total_frames": frames,
        "total_tasks": 1,
        "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 500,
        "fps": meta.fps,
        "splits": {"train": format!("0:{n}")},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": null,
        "features": {
            "observation.state": {"dtype": "float32", "shape": [sd], "names": meta.state_names},
            "action": {"dtype": "float32", "shape": [ad], "names": meta.action_names},
            "next.reward": scalar("float32"),
            "next.done": scalar("bool"),
            "next.success": scalar("bool"),
            "timestamp": scalar("float32"),
            "frame_index": scalar("int64"),
            "episode_index": scalar("int64"),
            "index": scalar("int64"),
            "task_index": scalar("int64"),
        },
        "diffrl": meta.provenance,
    });
    write_json(&root.join("meta/info.json"), &info)
}

fn pandas_task_metadata() -> String {
    json!({
        "index_columns": ["task"],
        "column_indexes": [{"name": null, "field_name": null, "pandas_type": "unicode", "numpy_type": "object", "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64", "metadata": null},
            {"name": "__index_level_0__", "field_name": "__index_level_0__", "pandas_type": "unicode", "numpy_type": "object", "metadata": null},
            {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": null}
        ],
        "creator": {"library": "diffrl", "version": env!("CARGO_PKG_VERSION")},
        "pandas_version": "2.2.3"
    })
    .to_string()
}

fn write_json(path: &Path, v: &Value) -> Result<(), DatasetError> {
    let text = serde_json::to_string_pretty(v).map_err(|e| DatasetError::Invalid(e.to_string()))?;
    crate::fs::write_atomic(path, text.as_bytes()).map_err(io_err(path))
}

fn write_parquet(path: &Path, batch: &RecordBatch) -> Result<(), DatasetError> {
    let dir = path.parent().expect("dataset files live in folders");
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let file = std::fs::File::create(path).map_err(io_err(path))?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let parquet_err =
        |e: parquet::errors::ParquetError| corrupt(path, format!("writing parquet: {e}"));
    let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props)).map_err(parquet_err)?;
    w.write(batch).map_err(parquet_err)?;
    w.close().map_err(parquet_err)?;
    Ok(())
}

fn read_parquet(path: &Path) -> Result<Vec<RecordBatch>, DatasetError> {
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.build())
        .map_err(|e| corrupt(path, format!("not a readable parquet file: {e}")))?;
    reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| corrupt(path, format!("corrupt parquet data: {e}")))
}

/// Float values of a column: scalars (dim 1) or lists of floats; booleans as 0/1.
fn float_column(a: &dyn Array) -> Option<Column> {
    fn flat(values: &dyn Array) -> Option<Vec<f32>> {
        let any = values.as_any();
        if let Some(v) = any.downcast_ref::<Float32Array>() {
            return Some(v.values().to_vec());
        }
        if let Some(v) = any.downcast_ref::<Float64Array>() {
            return Some(v.values().iter().map(|&x| x as f32).collect());
        }
        if let Some(v) = any.downcast_ref::<BooleanArray>() {
            return Some(v.iter().map(|b| b.unwrap_or(false) as u8 as f32).collect());
        }
        if let Some(v) = any.downcast_ref::<Int64Array>() {
            return Some(v.values().iter().map(|&x| x as f32).collect());
        }
        if let Some(v) = any.downcast_ref::<Int32Array>() {
            return Some(v.values().iter().map(|&x| x as f32).collect());
        }
        None
    }
    let any = a.as_any();
    if let Some(l) = any.downcast_ref::<FixedSizeListArray>() {
        let dim = l.value_length() as usize;
        let values = l.values().slice(l.offset() * dim, l.len() * dim);
        return Some(Column {
            dim,
            data: flat(&values)?,
        });
    }
    if let Some(l) = any.downcast_ref::<ListArray>() {
        return uniform_list(l.len(), |i| l.value(i), flat);
    }
    if let Some(l) = any.downcast_ref::<LargeListArray>() {
        return uniform_list(l.len(), |i| l.value(i), flat);
    }
    Some(Column {
        dim: 1,
        data: flat(a)?,
    })
}

fn uniform_list(
    len: usize,
    row: impl Fn(usize) -> ArrayRef,
    flat: fn(&dyn Array) -> Option<Vec<f32>>,
) -> Option<Column> {
    let mut data = Vec::new();
    let mut dim = None;
    for i in 0..len {
        let r = flat(&row(i))?;
        if *dim.get_or_insert(r.len()) != r.len() {
            return None;
        }
        data.extend(r);
    }
    Some(Column {
        dim: dim.unwrap_or(0),
        data,
    })
}

fn int_column(a: &dyn Array) -> Option<Vec<i64>> {
    let any = a.as_any();
    if let Some(v) = any.downcast_ref::<Int64Array>() {
        return Some(v.values().to_vec());
    }
    any.downcast_ref::<Int32Array>()
        .map(|v| v.values().iter().map(|&x| x as i64).collect())
}

fn string_column(a: &dyn Array) -> Option<Vec<String>> {
    let any = a.as_any();
    if let Some(v) = any.downcast_ref::<StringArray>() {
        return Some(
            v.iter()
                .map(|s| s.unwrap_or_default().to_string())
                .collect(),
        );
    }
    any.downcast_ref::<LargeStringArray>().map(|v| {
        v.iter()
            .map(|s| s.unwrap_or_default().to_string())
            .collect()
    })
}

/// Reads a LeRobot v3.0 dataset folder. Every problem names the offending file.
pub fn read_dataset(root: &Path) -> Result<Dataset, DatasetError> {
    let info_path = root.join("meta/info.json");
    let text = std::fs::read_to_string(&info_path).map_err(io_err(&info_path))?;
    let info: Value = serde_json::from_str(&text)
        .map_err(|e| corrupt(&info_path, format!("invalid JSON: {e}")))?;
    let version = info
        .get("codebase_version")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !version.starts_with("v3") {
        return Err(corrupt(
            &info_path,
            format!(
                "codebase_version {version:?} is not v3.x (convert it with LeRobot's v2.1 -> v3.0 script)"
            ),
        ));
    }
    let fps = info
        .get("fps")
        .and_then(Value::as_f64)
        .ok_or_else(|| corrupt(&info_path, "missing numeric \"fps\""))?;
    let total_frames = info.get("total_frames").and_then(Value::as_u64);

    let tasks_path = root.join("meta/tasks.parquet");
    let mut tasks = Vec::new();
    if tasks_path.exists() {
        for b in read_parquet(&tasks_path)? {
            let col = b
                .column_by_name("task")
                .or_else(|| b.column_by_name("__index_level_0__"))
                .and_then(|c| string_column(c))
                .ok_or_else(|| corrupt(&tasks_path, "no string column \"task\""))?;
            tasks.extend(col);
        }
    }

    let mut files = Vec::new();
    let data_dir = root.join("data");
    let chunks = std::fs::read_dir(&data_dir).map_err(io_err(&data_dir))?;
    for chunk in chunks {
        let chunk = chunk.map_err(io_err(&data_dir))?.path();
        if chunk.is_dir() {
            for f in std::fs::read_dir(&chunk).map_err(io_err(&chunk))? {
                let f = f.map_err(io_err(&chunk))?.path();
                if f.extension().is_some_and(|e| e == "parquet") {
                    files.push(f);
                }
            }
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(corrupt(&data_dir, "no data/chunk-*/file-*.parquet files"));
    }

    let mut ds = Dataset {
        root: root.to_path_buf(),
        info,
        fps,
        tasks,
        frame_index: Vec::new(),
        episode_index: Vec::new(),
        index: Vec::new(),
        task_index: Vec::new(),
        columns: BTreeMap::new(),
    };
    for path in &files {
        for b in read_parquet(path)? {
            let need_int = |name: &str| {
                b.column_by_name(name)
                    .and_then(|c| int_column(c))
                    .ok_or_else(|| corrupt(path, format!("missing integer column {name:?}")))
            };
            ds.frame_index.extend(need_int("frame_index")?);
            ds.episode_index.extend(need_int("episode_index")?);
            ds.index.extend(need_int("index")?);
            ds.task_index
                .extend(need_int("task_index").unwrap_or_else(|_| vec![0; b.num_rows()]));
            for (field, col) in b.schema().fields().iter().zip(b.columns()) {
                let name = field.name();
                if INDEX_COLUMNS.contains(&name.as_str()) && name != "timestamp" {
                    continue;
                }
                let Some(c) = float_column(col.as_ref()) else {
                    continue;
                };
                let entry = ds.columns.entry(name.clone()).or_insert(Column {
                    dim: c.dim,
                    data: Vec::new(),
                });
                if entry.dim != c.dim {
                    return Err(corrupt(
                        path,
                        format!(
                            "column {name:?} has {} components here, {} in earlier files",
                            c.dim, entry.dim
                        ),
                    ));
                }
                entry.data.extend(c.data);
            }
        }
    }
    let n = ds.index.len();
    if let Some(total) = total_frames
        && total as usize != n
    {
        return Err(corrupt(
            &info_path,
            format!(
                "total_frames is {total} but the data files hold {n} frames (truncated dataset?)"
            ),
        ));
    }
    for (name, c) in &ds.columns {
        if c.len() != n {
            return Err(corrupt(
                &data_dir,
                format!("column {name:?} has {} rows, expected {n}", c.len()),
            ));
        }
    }
    Ok(ds)
}

impl Dataset {
    /// Number of frames.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether the dataset has no frames.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// A float column by feature key, or an error naming the dataset and the columns it has.
    pub fn column(&self, key: &str) -> Result<&Column, DatasetError> {
        self.columns.get(key).ok_or_else(|| {
            let have: Vec<_> = self.columns.keys().cloned().collect();
            corrupt(
                &self.root,
                format!("no feature {key:?}; the dataset has {have:?}"),
            )
        })
    }

    /// Episodes rebuilt from frames: `state_key` (e.g. `observation.state`) becomes the
    /// observation state, `action` the actions; rewards and success flags are taken from
    /// `next.reward` / `next.success` when present. Frames are grouped by `episode_index` in
    /// order of appearance.
    pub fn episodes(&self, state_key: &str) -> Result<Vec<Episode>, DatasetError> {
        let state = self.column(state_key)?;
        let action = self.column("action")?;
        let reward = self.columns.get("next.reward");
        let success = self.columns.get("next.success");
        let done = self.columns.get("next.done");
        let mut out: Vec<Episode> = Vec::new();
        let mut current: Option<i64> = None;
        for i in 0..self.len() {
            if current != Some(self.episode_index[i]) {
                current = Some(self.episode_index[i]);
                let task = self.tasks.get(self.task_index[i] as usize).cloned();
                out.push(Episode {
                    task,
                    ..Episode::default()
                });
            }
            let ep = out.last_mut().expect("pushed above");
            let r = reward.map_or(0.0, |c| c.data[i]);
            let s = success.is_some_and(|c| c.data[i] > 0.5);
            ep.push(
                Observation::state(state.row(i).to_vec()),
                action.row(i).to_vec(),
                r,
                r,
                s,
            );
            if done.is_some_and(|c| c.data[i] > 0.5) {
                ep.terminated = s;
                ep.truncated = !s;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> DatasetMeta {
        DatasetMeta {
            fps: 10,
            robot_type: "2d pointer".into(),
            state_names: vec!["a".into(), "b".into(), "c".into()],
            action_names: vec!["x".into(), "y".into()],
            task: "Push the T-shaped block onto the T-shaped target.".into(),
            provenance: json!({"test": true}),
        }
    }

    fn episodes() -> Vec<Episode> {
        (0..3)
            .map(|e| {
                let mut ep = Episode::default();
                for t in 0..(4 + e) {
                    let v = (e * 10 + t) as f32;
                    ep.push(
                        Observation::state(vec![v, v + 0.5, -v]),
                        vec![v * 2.0, 1.0],
                        v / 100.0,
                        0.0,
                        t == 3 + e && e != 1,
                    );
                }
                ep
            })
            .collect()
    }

    #[test]
    fn round_trip() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("ds");
        let eps = episodes();
        write_dataset(&out, &meta(), &eps, false).unwrap();
        let ds = read_dataset(&out).unwrap();
        assert_eq!(ds.len(), 4 + 5 + 6);
        assert_eq!(ds.fps, 10.0);
        assert_eq!(ds.tasks, vec![meta().task]);
        let back = ds.episodes("observation.state").unwrap();
        assert_eq!(back.len(), 3);
        for (a, b) in eps.iter().zip(&back) {
            assert_eq!(a.observations, b.observations);
            assert_eq!(a.actions, b.actions);
            assert_eq!(a.rewards, b.rewards);
            assert_eq!(a.successes, b.successes);
        }
        assert!(back[0].terminated && back[1].truncated);
        let stats: Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("meta/stats.json")).unwrap())
                .unwrap();
        assert_eq!(stats["observation.state"]["min"][0], 0.0);
        assert_eq!(stats["observation.state"]["max"][0], 25.0);
        assert_eq!(stats["action"]["count"][0], 15);
        // Existing folders are not clobbered by accident.
        assert!(write_dataset(&out, &meta(), &eps, false).is_err());
        write_dataset(&out, &meta(), &eps, true).unwrap();
    }

    #[test]
    fn corrupt_and_truncated_files_name_the_file() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("ds");
        write_dataset(&out, &meta(), &episodes(), false).unwrap();
        let data = out.join(DATA_FILE);
        let bytes = std::fs::read(&data).unwrap();
        std::fs::write(&data, &bytes[..bytes.len() / 2]).unwrap();
        let e = read_dataset(&out).unwrap_err().to_string();
        assert!(e.contains("file-000.parquet"), "{e}");
        std::fs::write(&data, b"not parquet at all").unwrap();
        assert!(
            read_dataset(&out)
                .unwrap_err()
                .to_string()
                .contains("file-000.parquet")
        );
        std::fs::remove_file(&data).unwrap();
        assert!(read_dataset(&out).is_err());
        std::fs::write(out.join("meta/info.json"), "{ nope").unwrap();
        assert!(
            read_dataset(&out)
                .unwrap_err()
                .to_string()
                .contains("info.json")
        );
        assert!(
            read_dataset(&d.path().join("missing"))
                .unwrap_err()
                .to_string()
                .contains("missing")
        );
    }

    #[test]
    fn frame_count_mismatch_is_reported() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("ds");
        write_dataset(&out, &meta(), &episodes(), false).unwrap();
        let p = out.join("meta/info.json");
        let mut info: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        info["total_frames"] = json!(999);
        std::fs::write(&p, info.to_string()).unwrap();
        assert!(
            read_dataset(&out)
                .unwrap_err()
                .to_string()
                .contains("total_frames")
        );
    }

    #[test]
    fn reads_lerobot_style_list_columns() {
        // LeRobot's own pusht files store vectors as list<float> (not fixed size) and may
        // lack next.success: the reader accepts both.
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("meta")).unwrap();
        std::fs::write(
            root.join("meta/info.json"),
            json!({"codebase_version": "v3.0", "fps": 10, "total_frames": 3}).to_string(),
        )
        .unwrap();
        let mut lb = ListBuilder::new(arrow_array::builder::Float32Builder::new());
        for i in 0..3 {
            lb.values().append_slice(&[i as f32, 1.0]);
            lb.append(true);
        }
        let list: ArrayRef = Arc::new(lb.finish());
        let schema = Arc::new(Schema::new(vec![
            Field::new("observation.state", list.data_type().clone(), true),
            Field::new("action", list.data_type().clone(), true),
            Field::new("episode_index", DataType::Int64, false),
            Field::new("frame_index", DataType::Int64, false),
            Field::new("index", DataType::Int64, false),
            Field::new("timestamp", DataType::Float32, false),
        ]));
        let b = RecordBatch::try_new(
            schema,
            vec![
                list.clone(),
                list,
                Arc::new(Int64Array::from(vec![0, 0, 1])),
                Arc::new(Int64Array::from(vec![0, 1, 0])),
                Arc::new(Int64Array::from(vec![0, 1, 2])),
                Arc::new(Float32Array::from(vec![0.0, 0.1, 0.0])),
            ],
        )
        .unwrap();
        write_parquet(&root.join(DATA_FILE), &b).unwrap();
        let ds = read_dataset(root).unwrap();
        let eps = ds.episodes("observation.state").unwrap();
        assert_eq!(eps.len(), 2);
        assert_eq!(eps[0].observations[1].state, vec![1.0, 1.0]);
        let e = ds
            .episodes("observation.environment_state")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("observation.environment_state") && e.contains("observation.state"),
            "{e}"
        );
    }
}
