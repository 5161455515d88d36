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
//! Camera frames are an `observation.image` feature of dtype `image`: PNG files embedded in the
//! data parquet the way Hugging Face `datasets.Image()` stores them (a struct of `bytes` and a
//! null `path`), which is what LeRobot reads for image features. Each episode's task is its
//! [`Episode::task`], or [`DatasetMeta::task`] when it has none.
//!
//! A dataset is written into a temporary sibling folder and renamed into place, so a crash
//! never leaves a half-written dataset.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{
    Array, ArrayRef, BinaryArray, BooleanArray, FixedSizeListArray, Float32Array, Float64Array,
    Int32Array, Int64Array, LargeBinaryArray, LargeListArray, LargeStringArray, ListArray,
    RecordBatch, StringArray, StructArray,
};
use arrow_schema::{DataType, Field, Fields, Schema};
use image::ImageEncoder;
use image::codecs::png::{CompressionType, FilterType, PngEncoder};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;
use rayon::prelude::*;
use serde_json::{Value, json};

use crate::DatasetError;
use crate::episode::Episode;
use crate::space::{ImageObs, Observation};

/// Episodes per chunk folder (LeRobot's default).
pub const CHUNKS_SIZE: usize = 1000;
const DATA_FILE: &str = "data/chunk-000/file-000.parquet";
const EPISODES_FILE: &str = "meta/episodes/chunk-000/file-000.parquet";
/// The feature holding [`Observation::image`].
pub const IMAGE_KEY: &str = "observation.image";
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
    /// The task description of every episode whose [`Episode::task`] is `None`.
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
    /// The `observation.image` feature decoded to RGB8, one per frame, when the dataset has it.
    pub images: Option<Vec<ImageObs>>,
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

/// Episodes-table statistics columns: `stats/{feature}/{stat}` -> (shape of one row, values).
type StatColumns = BTreeMap<String, (Vec<usize>, Vec<f64>)>;

/// One feature's statistics in LeRobot's format: every statistic but `count` has `shape`
/// (`[dim]` for vectors, `[3, 1, 1]` for images), its values stored row-major in `values`.
struct FeatureStats {
    shape: Vec<usize>,
    values: BTreeMap<&'static str, Vec<f64>>,
    count: usize,
}

impl FeatureStats {
    /// The stats.json object: statistics as lists nested to `shape`, then `"count": [n]`.
    fn to_json(&self) -> Value {
        fn nest(values: &[f64], shape: &[usize]) -> Value {
            match shape {
                [] | [_] => json!(values),
                [outer, inner @ ..] => {
                    let step = (values.len() / (*outer).max(1)).max(1);
                    Value::Array(values.chunks(step).map(|c| nest(c, inner)).collect())
                }
            }
        }
        let mut out = serde_json::Map::new();
        for (k, v) in &self.values {
            out.insert((*k).into(), nest(v, &self.shape));
        }
        out.insert("count".into(), json!([self.count]));
        Value::Object(out)
    }

    /// The episodes-table columns of feature `key`.
    fn columns(&self, key: &str) -> StatColumns {
        let mut out: BTreeMap<_, _> = self
            .values
            .iter()
            .map(|(stat, v)| {
                (
                    format!("stats/{key}/{stat}"),
                    (self.shape.clone(), v.clone()),
                )
            })
            .collect();
        out.insert(
            format!("stats/{key}/count"),
            (vec![1], vec![self.count as f64]),
        );
        out
    }
}

/// Appends one component's LeRobot statistics to `stats`: `[min, max, mean, std]`, then the
/// quantiles q01, q10, q50, q90 and q99 from `q`, each divided by `divisor`.
fn push_stats(
    stats: &mut BTreeMap<&'static str, Vec<f64>>,
    [min, max, mean, std]: [f64; 4],
    q: impl Fn(f64) -> f64,
    divisor: f64,
) {
    for (k, x) in [
        ("min", min),
        ("max", max),
        ("mean", mean),
        ("std", std),
        ("q01", q(0.01)),
        ("q10", q(0.10)),
        ("q50", q(0.50)),
        ("q90", q(0.90)),
        ("q99", q(0.99)),
    ] {
        stats.entry(k).or_default().push(x / divisor);
    }
}

/// Per-component statistics in LeRobot's format.
fn feature_stats(col: &Column) -> FeatureStats {
    let n = col.len();
    let mut stats: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    for d in 0..col.dim {
        let mut v: Vec<f64> = (0..n).map(|i| col.data[i * col.dim + d] as f64).collect();
        v.sort_by(f64::total_cmp);
        let mean = v.iter().sum::<f64>() / n.max(1) as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n.max(1) as f64;
        let q = |p: f64| {
            // Linear interpolation between order statistics (numpy's default quantile).
            crate::stats::linear_quantile(&v, p).unwrap_or(0.0)
        };
        let (min, max) = (
            v.first().copied().unwrap_or(0.0),
            v.last().copied().unwrap_or(0.0),
        );
        push_stats(&mut stats, [min, max, mean, var.sqrt()], q, 1.0);
    }
    FeatureStats {
        shape: vec![col.dim],
        values: stats,
        count: n,
    }
}

/// LeRobot's image statistics: per channel over every pixel of every frame, on values scaled
/// to [0, 1], shaped `[3, 1, 1]`; `count` is the number of frames. Quantiles interpolate
/// linearly between order statistics like [`feature_stats`]'s; pixels are 8-bit, so a
/// 256-bin histogram per channel gives them exactly without sorting.
fn image_stats(images: &[&ImageObs]) -> FeatureStats {
    let mut histogram = [[0u64; 256]; 3];
    for img in images {
        for px in img.data.chunks_exact(3) {
            for (c, &v) in px.iter().enumerate() {
                histogram[c][v as usize] += 1;
            }
        }
    }
    let mut stats: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    for h in &histogram {
        let n: u64 = h.iter().sum();
        // The k-th smallest pixel value (0-based).
        let order_statistic = |k: u64| {
            let mut seen = 0;
            for (v, &c) in h.iter().enumerate() {
                seen += c;
                if seen > k {
                    return v as f64;
                }
            }
            255.0
        };
        let q = |p: f64| {
            let pos = p * n.saturating_sub(1) as f64;
            let (lo, hi) = (
                order_statistic(pos.floor() as u64),
                order_statistic(pos.ceil() as u64),
            );
            lo + (hi - lo) * (pos - pos.floor())
        };
        let total = n.max(1) as f64;
        let mean = h
            .iter()
            .enumerate()
            .map(|(v, &c)| v as f64 * c as f64)
            .sum::<f64>()
            / total;
        let var = h
            .iter()
            .enumerate()
            .map(|(v, &c)| (v as f64 - mean).powi(2) * c as f64)
            .sum::<f64>()
            / total;
        let (min, max) = match (
            h.iter().position(|&c| c > 0),
            h.iter().rposition(|&c| c > 0),
        ) {
            (Some(lo), Some(hi)) => (lo as f64, hi as f64),
            _ => (0.0, 0.0),
        };
        push_stats(&mut stats, [min, max, mean, var.sqrt()], q, 255.0);
    }
    FeatureStats {
        shape: vec![3, 1, 1],
        values: stats,
        count: images.len(),
    }
}

/// A PNG file of `img`. The encoder settings are fixed so that the bytes depend only on the
/// pixels (and the `image` crate's version): equal episodes give byte-identical datasets.
fn encode_png(img: &ImageObs) -> Result<Vec<u8>, image::ImageError> {
    let mut out = Vec::new();
    PngEncoder::new_with_quality(&mut out, CompressionType::Fast, FilterType::Adaptive)
        .write_image(
            &img.data,
            img.width,
            img.height,
            image::ExtendedColorType::Rgb8,
        )?;
    Ok(out)
}

/// The arrow type of `datasets.Image()`: `struct<bytes: binary, path: string>`.
fn image_fields() -> Fields {
    Fields::from(vec![
        Field::new("bytes", DataType::Binary, true),
        Field::new("path", DataType::Utf8, true),
    ])
}

/// Embedded PNG files as `datasets.Image()` stores them: the bytes, and a null path.
fn image_array(pngs: &[Vec<u8>]) -> ArrayRef {
    let bytes: ArrayRef = Arc::new(BinaryArray::from_iter_values(pngs));
    let path: ArrayRef = Arc::new(StringArray::new_null(pngs.len()));
    Arc::new(StructArray::new(image_fields(), vec![bytes, path], None))
}

/// Float64 values nested in fixed-size lists to `shape` per row (`[3]` -> `[f64; 3]`,
/// `[3, 1, 1]` -> `[[[f64; 1]; 1]; 3]`).
fn nested_f64_array(values: Vec<f64>, shape: &[usize]) -> ArrayRef {
    let mut array: ArrayRef = Arc::new(Float64Array::from(values));
    let mut item = Arc::new(Field::new("item", DataType::Float64, true));
    for &d in shape.iter().rev() {
        array = Arc::new(FixedSizeListArray::new(item, d as i32, array, None));
        item = Arc::new(Field::new("item", array.data_type().clone(), true));
    }
    array
}

/// Writes `episodes` as a LeRobot v3.0 dataset at `out`. Fails if `out` exists and is not
/// empty unless `overwrite`; the folder appears only when complete.
///
/// When the first observation carries an image, every observation must carry one of the same
/// size: they are written as the `observation.image` feature. Each episode's task is its
/// [`Episode::task`], or `meta.task` when it has none.
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
    if let Some(e) = episodes.iter().position(Episode::is_empty) {
        return Err(DatasetError::Invalid(format!("episode {e} has no steps")));
    }
    let image_size = episodes[0].observations[0]
        .image
        .as_ref()
        .map(|i| (i.height, i.width));
    for (e, ep) in episodes.iter().enumerate() {
        for (t, (o, a)) in ep.observations.iter().zip(&ep.actions).enumerate() {
            if o.state.len() != sd || a.len() != ad {
                return Err(DatasetError::Invalid(format!(
                    "episode {e} step {t}: state has {} values and action {}, expected {sd} and {ad}",
                    o.state.len(),
                    a.len()
                )));
            }
            check_image(e, t, o.image.as_ref(), image_size)?;
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

/// Checks that step `t` of episode `e` has an image exactly when episode 0 step 0 has one
/// (`expected` is that one's height and width), of that size and holding `height * width * 3`
/// bytes.
fn check_image(
    e: usize,
    t: usize,
    image: Option<&ImageObs>,
    expected: Option<(u32, u32)>,
) -> Result<(), DatasetError> {
    let invalid = |what: String| {
        Err(DatasetError::Invalid(format!(
            "episode {e} step {t}: {what}"
        )))
    };
    match (image, expected) {
        (None, None) => Ok(()),
        (Some(_), None) => invalid(
            "has a camera image but episode 0 step 0 has none; a dataset has an image in every \
             frame or in none"
                .into(),
        ),
        (None, Some((h, w))) => invalid(format!(
            "has no camera image but episode 0 step 0 has a {h}x{w} one; a dataset has an image \
             in every frame or in none"
        )),
        (Some(img), Some((h, w))) => {
            if (img.height, img.width) != (h, w) {
                invalid(format!(
                    "camera image is {}x{} (height x width) but episode 0 step 0's is {h}x{w}; \
                     all frames of a dataset have one size",
                    img.height, img.width
                ))
            } else if h == 0 || w == 0 {
                invalid(format!("camera image is {h}x{w}, an empty image"))
            } else if img.data.len() != h as usize * w as usize * 3 {
                invalid(format!(
                    "camera image holds {} bytes, a {h}x{w} RGB8 image {}",
                    img.data.len(),
                    h as usize * w as usize * 3
                ))
            } else {
                Ok(())
            }
        }
    }
}

fn write_into(root: &Path, meta: &DatasetMeta, episodes: &[Episode]) -> Result<(), DatasetError> {
    let (sd, ad) = (meta.state_names.len(), meta.action_names.len());
    let frames: usize = episodes.iter().map(Episode::len).sum();
    let fps = meta.fps as f32;

    // Tasks: distinct, in order of first appearance; `episode_task[e]` indexes `tasks`.
    let mut tasks: Vec<&str> = Vec::new();
    let episode_task: Vec<usize> = episodes
        .iter()
        .map(|ep| {
            let task = ep.task.as_deref().unwrap_or(&meta.task);
            tasks.iter().position(|&t| t == task).unwrap_or_else(|| {
                tasks.push(task);
                tasks.len() - 1
            })
        })
        .collect();

    // Frame table.
    let mut state = Vec::with_capacity(frames * sd);
    let mut action = Vec::with_capacity(frames * ad);
    let (mut reward, mut done, mut success) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ts, mut fi, mut ei, mut idx) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut ti = Vec::with_capacity(frames);
    // write_dataset checked that either every observation has an image or none has.
    let mut images: Vec<&ImageObs> = Vec::new();
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
            ti.push(episode_task[e] as i64);
            images.extend(&ep.observations[t].image);
        }
    }
    let image_size = images.first().map(|i| (i.height, i.width));
    let pngs = images
        .par_iter()
        .enumerate()
        .map(|(i, img)| {
            encode_png(img).map_err(|err| {
                DatasetError::Invalid(format!(
                    "episode {} step {}: encoding the camera image as PNG: {err}",
                    ei[i], fi[i]
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
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
                data: ti.iter().map(|&v| v as f32).collect(),
            },
        ),
    ]);
    let image_field = Field::new(IMAGE_KEY, DataType::Struct(image_fields()), true);
    let schema = Schema::new(
        [vector_field("observation.state", sd)]
            .into_iter()
            .chain(image_size.map(|_| image_field))
            .chain([
                vector_field("action", ad),
                Field::new("next.reward", DataType::Float32, false),
                Field::new("next.done", DataType::Boolean, false),
                Field::new("next.success", DataType::Boolean, false),
                Field::new("timestamp", DataType::Float32, false),
                Field::new("frame_index", DataType::Int64, false),
                Field::new("episode_index", DataType::Int64, false),
                Field::new("index", DataType::Int64, false),
                Field::new("task_index", DataType::Int64, false),
            ])
            .collect::<Vec<_>>(),
    );
    // LeRobot hands `datasets` the features when it loads the data files, but its streaming
    // dataset (and a plain `load_dataset("parquet")`) takes them from this schema metadata:
    // without it the image column reads as a bytes/path struct instead of an image.
    let schema = Arc::new(match image_size {
        Some(_) => schema.with_metadata(std::collections::HashMap::from([(
            "huggingface".to_string(),
            json!({"info": {"features": {IMAGE_KEY: {"_type": "Image"}}}}).to_string(),
        )])),
        None => schema,
    });
    let batch = RecordBatch::try_new(
        schema.clone(),
        [vector_array(state, sd)]
            .into_iter()
            .chain(image_size.map(|_| image_array(&pngs)))
            .chain([
                vector_array(action, ad),
                Arc::new(Float32Array::from(reward)),
                Arc::new(BooleanArray::from(done)),
                Arc::new(BooleanArray::from(success)),
                Arc::new(Float32Array::from(ts)),
                Arc::new(Int64Array::from(fi)),
                Arc::new(Int64Array::from(ei)),
                Arc::new(Int64Array::from(idx)),
                Arc::new(Int64Array::from(ti)),
            ])
            .collect(),
    )
    .map_err(|e| DatasetError::Invalid(e.to_string()))?;
    drop(pngs); // the batch holds a copy
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
    let tasks_batch = RecordBatch::try_new(
        Arc::new(tasks_schema),
        vec![
            Arc::new(Int64Array::from_iter_values(0..tasks.len() as i64)),
            Arc::new(StringArray::from(tasks.clone())),
            Arc::new(StringArray::from(tasks.clone())),
        ],
    )
    .map_err(|e| DatasetError::Invalid(e.to_string()))?;
    write_parquet(&root.join("meta/tasks.parquet"), &tasks_batch)?;

    // Episodes table, with per-episode stats of the float features and the image.
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
    let mut per_ep_stats: Vec<StatColumns> = Vec::new();
    let mut start = 0usize;
    for (ep, &task) in episodes.iter().zip(&episode_task) {
        tasks_col.values().append_value(tasks[task]);
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
            m.extend(feature_stats(&sub).columns(key));
        }
        if image_size.is_some() {
            m.extend(image_stats(&images[start..start + ep.len()]).columns(IMAGE_KEY));
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
    for (name, (shape, _)) in &per_ep_stats[0] {
        let values: Vec<f64> = per_ep_stats
            .iter()
            .flat_map(|m| m[name].1.iter().copied())
            .collect();
        let array = nested_f64_array(values, shape);
        ep_fields.push(Field::new(name, array.data_type().clone(), false));
        ep_cols.push(array);
    }
    let ep_batch = RecordBatch::try_new(Arc::new(Schema::new(ep_fields)), ep_cols)
        .map_err(|e| DatasetError::Invalid(e.to_string()))?;
    write_parquet(&root.join(EPISODES_FILE), &ep_batch)?;

    // stats.json and info.json.
    let mut stats = serde_json::Map::new();
    for (k, col) in &columns {
        stats.insert(k.clone(), feature_stats(col).to_json());
    }
    if image_size.is_some() {
        stats.insert(IMAGE_KEY.into(), image_stats(&images).to_json());
    }
    write_json(&root.join("meta/stats.json"), &Value::Object(stats))?;
    let scalar = |dtype: &str| json!({"dtype": dtype, "shape": [1], "names": null});
    let mut info = json!({
        "codebase_version": "v3.0",
        "robot_type": meta.robot_type,
        "total_episodes": n,
        "total_frames": frames,
        "total_tasks": tasks.len(),
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
    if let Some((h, w)) = image_size {
        info["features"][IMAGE_KEY] = json!({
            "dtype": "image",
            "shape": [h, w, 3],
            "names": ["height", "width", "channels"],
        });
    }
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
    // PNG files never repeat, so a dictionary for them would only be built to be thrown away.
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_column_dictionary_enabled(
            ColumnPath::new(vec![IMAGE_KEY.into(), "bytes".into()]),
            false,
        )
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

/// Height and width of the image feature as `meta/info.json` gives its shape: `[H, W, C]`, or
/// `[C, H, W]` when its names say so (older LeRobot datasets).
fn info_image_size(info: &Value) -> Option<(u32, u32)> {
    let feature = info.get("features")?.get(IMAGE_KEY)?;
    let shape: Vec<u32> = serde_json::from_value(feature.get("shape")?.clone()).ok()?;
    let channels_first = feature
        .get("names")
        .and_then(|n| n.get(0))
        .and_then(Value::as_str)
        == Some("channels");
    match shape[..] {
        [_, h, w] if channels_first => Some((h, w)),
        [h, w, _] => Some((h, w)),
        _ => None,
    }
}

/// Decodes the `observation.image` column of one record batch of `path`: a
/// `datasets.Image()` struct (its `bytes` field) or a plain binary column of PNG files,
/// converted to RGB8. `first_frame` is the dataset-wide index of the batch's first row (for
/// messages); every frame must be `size` (height, width) when given, and `size` is set from
/// the first frame otherwise.
fn decode_images(
    path: &Path,
    column: &dyn Array,
    first_frame: usize,
    size: &mut Option<(u32, u32)>,
) -> Result<Vec<ImageObs>, DatasetError> {
    let (bytes, rows_valid): (&dyn Array, Option<&StructArray>) =
        match column.as_any().downcast_ref::<StructArray>() {
            Some(s) => {
                let bytes = s.column_by_name("bytes").ok_or_else(|| {
                    corrupt(
                        path,
                        format!("column {IMAGE_KEY:?} is a struct without a \"bytes\" field"),
                    )
                })?;
                (bytes.as_ref(), Some(s))
            }
            None => (column, None),
        };
    let any = bytes.as_any();
    let files: Vec<Option<&[u8]>> = if let Some(b) = any.downcast_ref::<BinaryArray>() {
        b.iter().collect()
    } else if let Some(b) = any.downcast_ref::<LargeBinaryArray>() {
        b.iter().collect()
    } else {
        return Err(corrupt(
            path,
            format!(
                "column {IMAGE_KEY:?} has type {}, expected struct<bytes: binary, path: string> \
                 (datasets.Image) or binary",
                column.data_type()
            ),
        ));
    };
    let decoded: Vec<Result<ImageObs, String>> = files
        .par_iter()
        .enumerate()
        .map(|(row, file)| {
            let file = file
                .filter(|_| rows_valid.is_none_or(|s| s.is_valid(row)))
                .ok_or("has no image bytes (null)")?;
            let img = image::load_from_memory_with_format(file, image::ImageFormat::Png)
                .map_err(|e| format!("is not a readable PNG file: {e}"))?
                .into_rgb8();
            Ok(ImageObs {
                height: img.height(),
                width: img.width(),
                data: img.into_raw(),
            })
        })
        .collect();
    let mut out = Vec::with_capacity(decoded.len());
    for (row, img) in decoded.into_iter().enumerate() {
        let frame = first_frame + row;
        let img =
            img.map_err(|what| corrupt(path, format!("{IMAGE_KEY} of frame {frame} {what}")))?;
        let (h, w) = *size.get_or_insert((img.height, img.width));
        if (img.height, img.width) != (h, w) {
            return Err(corrupt(
                path,
                format!(
                    "{IMAGE_KEY} of frame {frame} is {}x{} (height x width), expected {h}x{w} \
                     (meta/info.json's shape, or the first frame's)",
                    img.height, img.width
                ),
            ));
        }
        out.push(img);
    }
    Ok(out)
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
        images: None,
    };
    let mut image_size = info_image_size(&ds.info);
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
            if let Some(col) = b.column_by_name(IMAGE_KEY) {
                let first_frame = ds.index.len() - b.num_rows();
                let images = decode_images(path, col.as_ref(), first_frame, &mut image_size)?;
                ds.images.get_or_insert_with(Vec::new).extend(images);
            }
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
    if let Some(images) = &ds.images
        && images.len() != n
    {
        return Err(corrupt(
            &data_dir,
            format!(
                "column {IMAGE_KEY:?} has {} rows, expected {n} (missing from some data files?)",
                images.len()
            ),
        ));
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
    /// observation state, `action` the actions, [`Dataset::images`] the observation images;
    /// rewards and success flags are taken from `next.reward` / `next.success` when present.
    /// Frames are grouped by `episode_index` in order of appearance; an episode's task is its
    /// first frame's.
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
            let mut obs = Observation::state(state.row(i).to_vec());
            obs.image = self.images.as_ref().and_then(|v| v.get(i)).cloned();
            ep.push(obs, action.row(i).to_vec(), r, r, s);
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

    /// A 4x6 frame: red everywhere, no green, a blue gradient that differs per step.
    fn frame(e: usize, t: usize) -> ImageObs {
        ImageObs {
            height: 4,
            width: 6,
            data: (0..4 * 6)
                .flat_map(|p| [255, 0, (p * 7 + e * 50 + t * 3) as u8])
                .collect(),
        }
    }

    /// Two short episodes with camera frames and different tasks.
    fn image_episodes() -> Vec<Episode> {
        [
            "Pick up the red cube.",
            "Stack the red cube on the blue one.",
        ]
        .iter()
        .enumerate()
        .map(|(e, task)| {
            let mut ep = Episode {
                task: Some(task.to_string()),
                ..Episode::default()
            };
            for t in 0..(3 + e) {
                let v = (e * 10 + t) as f32;
                let mut obs = Observation::state(vec![v, 0.0, -v]);
                obs.image = Some(frame(e, t));
                ep.push(obs, vec![v, 1.0], 0.0, 0.0, false);
            }
            ep
        })
        .collect()
    }

    fn read_json(path: &Path) -> Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn round_trip_with_images_and_tasks() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("ds");
        let eps = image_episodes();
        write_dataset(&out, &meta(), &eps, false).unwrap();

        // The column is datasets.Image()'s struct: PNG bytes and a null path.
        let batch = &read_parquet(&out.join(DATA_FILE)).unwrap()[0];
        let col = batch.column_by_name(IMAGE_KEY).unwrap();
        assert_eq!(col.data_type(), &DataType::Struct(image_fields()));
        let col = col.as_any().downcast_ref::<StructArray>().unwrap();
        assert_eq!(col.column_by_name("path").unwrap().null_count(), 7);
        let file = std::fs::File::open(out.join(DATA_FILE)).unwrap();
        let schema = ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .schema()
            .clone();
        let hf: Value = serde_json::from_str(&schema.metadata()["huggingface"]).unwrap();
        assert_eq!(hf["info"]["features"][IMAGE_KEY]["_type"], "Image");
        let bytes = col.column_by_name("bytes").unwrap();
        let bytes = bytes.as_any().downcast_ref::<BinaryArray>().unwrap();
        assert!(bytes.value(0).starts_with(b"\x89PNG\r\n\x1a\n"));

        let ds = read_dataset(&out).unwrap();
        let images = ds.images.as_ref().unwrap();
        assert_eq!(images.len(), 7);
        assert_eq!(images[4], frame(1, 1));
        let back = ds.episodes("observation.state").unwrap();
        assert_eq!(back.len(), 2);
        for (a, b) in eps.iter().zip(&back) {
            assert_eq!(a.observations, b.observations);
            assert_eq!(a.task, b.task);
        }

        // Tasks: one row each in tasks.parquet, frames and episodes point at their own.
        assert_eq!(
            ds.tasks,
            vec![
                "Pick up the red cube.",
                "Stack the red cube on the blue one."
            ]
        );
        assert_eq!(ds.task_index, vec![0, 0, 0, 1, 1, 1, 1]);
        let ep_batch = &read_parquet(&out.join(EPISODES_FILE)).unwrap()[0];
        let ep_tasks = ep_batch.column_by_name("tasks").unwrap();
        let ep_tasks = ep_tasks.as_any().downcast_ref::<ListArray>().unwrap();
        assert_eq!(
            string_column(ep_tasks.value(1).as_ref()).unwrap(),
            vec!["Stack the red cube on the blue one."]
        );

        let info = read_json(&out.join("meta/info.json"));
        assert_eq!(info["total_tasks"], 2);
        assert_eq!(
            info["features"][IMAGE_KEY],
            json!({"dtype": "image", "shape": [4, 6, 3], "names": ["height", "width", "channels"]})
        );

        // Image stats: per channel on [0, 1], shaped [3][1][1], count = frames.
        let stats = &read_json(&out.join("meta/stats.json"))[IMAGE_KEY];
        let blue: Vec<f64> = images
            .iter()
            .flat_map(|i| i.data.chunks(3).map(|px| px[2] as f64 / 255.0))
            .collect();
        let blue_mean = blue.iter().sum::<f64>() / blue.len() as f64;
        for key in [
            "min", "max", "mean", "std", "q01", "q10", "q50", "q90", "q99",
        ] {
            let s = stats[key].as_array().unwrap();
            assert_eq!(s.len(), 3, "{key}");
            assert!(
                s.iter().all(
                    |c| c.as_array().unwrap().len() == 1 && c[0].as_array().unwrap().len() == 1
                ),
                "{key}: {s:?}"
            );
        }
        assert_eq!(stats["mean"][0][0][0], 1.0);
        assert_eq!(stats["mean"][1][0][0], 0.0);
        assert!((stats["mean"][2][0][0].as_f64().unwrap() - blue_mean).abs() < 1e-12);
        let mut sorted = blue.clone();
        sorted.sort_by(f64::total_cmp);
        for (key, p) in [("q10", 0.10), ("q50", 0.5), ("q99", 0.99)] {
            let want = crate::stats::linear_quantile(&sorted, p).unwrap();
            let got = stats[key][2][0][0].as_f64().unwrap();
            assert!((got - want).abs() < 1e-12, "{key}: {got} vs {want}");
        }
        assert_eq!(stats["std"][0][0][0], 0.0);
        assert_eq!(stats["count"], json!([7]));
        // ...and per episode in the episodes table, nested the same way.
        let ep_mean = ep_batch
            .column_by_name("stats/observation.image/mean")
            .unwrap();
        let item = |dt: &DataType| match dt {
            DataType::FixedSizeList(f, n) => (f.data_type().clone(), *n),
            other => panic!("{other}"),
        };
        let (inner, n) = item(ep_mean.data_type());
        assert_eq!(n, 3);
        let (inner, n) = item(&inner);
        assert_eq!((item(&inner), n), ((DataType::Float64, 1), 1));
    }

    #[test]
    fn writing_twice_gives_identical_files() {
        let d = tempfile::tempdir().unwrap();
        let eps = image_episodes();
        write_dataset(&d.path().join("a"), &meta(), &eps, false).unwrap();
        write_dataset(&d.path().join("b"), &meta(), &eps, false).unwrap();
        for file in [
            DATA_FILE,
            EPISODES_FILE,
            "meta/tasks.parquet",
            "meta/info.json",
            "meta/stats.json",
        ] {
            let read = |ds: &str| std::fs::read(d.path().join(ds).join(file)).unwrap();
            assert!(read("a") == read("b"), "{file} differs");
        }
    }

    #[test]
    fn images_in_some_frames_or_of_several_sizes_are_invalid() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("ds");
        let invalid = |eps: &[Episode]| match write_dataset(&out, &meta(), eps, false) {
            Err(DatasetError::Invalid(m)) => m,
            other => panic!("expected Invalid, got {other:?}"),
        };
        let mut eps = image_episodes();
        eps[1].observations[0].image = None;
        let e = invalid(&eps);
        assert!(
            e.contains("episode 1 step 0") && e.contains("no camera image"),
            "{e}"
        );

        let mut eps = image_episodes();
        for o in &mut eps[0].observations {
            o.image = None;
        }
        let e = invalid(&eps);
        assert!(
            e.contains("episode 1 step 0") && e.contains("has a camera image"),
            "{e}"
        );

        let mut eps = image_episodes();
        eps[1].observations[2].image = Some(ImageObs {
            height: 5,
            width: 6,
            data: vec![0; 5 * 6 * 3],
        });
        let e = invalid(&eps);
        assert!(e.contains("episode 1 step 2") && e.contains("5x6"), "{e}");

        let mut eps = image_episodes();
        eps[0].observations[1].image.as_mut().unwrap().data.pop();
        let e = invalid(&eps);
        assert!(
            e.contains("episode 0 step 1") && e.contains("71 bytes"),
            "{e}"
        );
        assert!(!out.exists());
    }

    /// Rewrites the dataset's data file with its image column replaced by `image`.
    fn replace_image_column(out: &Path, image: impl FnOnce(&StructArray) -> ArrayRef) {
        let path = out.join(DATA_FILE);
        let b = read_parquet(&path).unwrap().remove(0);
        let (i, _) = b.schema().column_with_name(IMAGE_KEY).unwrap();
        let old = b.column(i).as_any().downcast_ref::<StructArray>().unwrap();
        let new = image(old);
        let mut fields: Vec<Field> = b
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields[i] = Field::new(IMAGE_KEY, new.data_type().clone(), true);
        let mut columns = b.columns().to_vec();
        columns[i] = new;
        let b = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
        write_parquet(&path, &b).unwrap();
    }

    #[test]
    fn corrupt_images_name_the_file_and_frame() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("ds");
        write_dataset(&out, &meta(), &image_episodes(), false).unwrap();
        let pngs = |s: &StructArray| -> Vec<Vec<u8>> {
            let b = s.column_by_name("bytes").unwrap();
            let b = b.as_any().downcast_ref::<BinaryArray>().unwrap();
            b.iter().map(|v| v.unwrap().to_vec()).collect()
        };

        // A plain binary column of PNG files is read as well.
        replace_image_column(&out, |s| Arc::new(BinaryArray::from_iter_values(pngs(s))));
        let ds = read_dataset(&out).unwrap();
        assert_eq!(ds.images.unwrap()[3], frame(1, 0));

        // Garbage bytes in frame 3.
        write_dataset(&out, &meta(), &image_episodes(), true).unwrap();
        replace_image_column(&out, |s| {
            let mut files = pngs(s);
            files[3] = b"not a png".to_vec();
            image_array(&files)
        });
        let e = read_dataset(&out).unwrap_err();
        assert!(matches!(e, DatasetError::Corrupt { .. }), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains("file-000.parquet") && e.contains("frame 3"),
            "{e}"
        );

        // A frame of another size than info.json says.
        write_dataset(&out, &meta(), &image_episodes(), true).unwrap();
        let p = out.join("meta/info.json");
        let mut info = read_json(&p);
        info["features"][IMAGE_KEY]["shape"] = json!([5, 6, 3]);
        std::fs::write(&p, info.to_string()).unwrap();
        let e = read_dataset(&out).unwrap_err().to_string();
        assert!(
            e.contains("frame 0") && e.contains("4x6") && e.contains("5x6"),
            "{e}"
        );
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
