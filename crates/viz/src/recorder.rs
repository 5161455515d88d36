//! [`RerunRecorder`]: core's [`Recorder`] on a Rerun recording stream.
//!
//! Scenes, policy calls, group statistics and text go out as they come (Rerun batches them on
//! its own thread). Scalar series (training scalars on `train_step`, per-step rollout series on
//! `env_step`, chain log-probs on `denoise_step`) are buffered per entity and sent as columns
//! with `send_columns`, every 512 rows or 2 seconds and on [`Recorder::flush`]. Scene shapes that did not change since they were
//! last logged (walls, goal) are not logged again.
//!
//! 3-D scenes: each body is an entity under `scene3d/` with its transform and primitive (boxes,
//! spheres, capsules, cylinders, line strips), the scene's tool point (end effector) leaves a
//! path through the episode (`scene3d/tool_path`, cleared when environment 0's episode ends), action chunks
//! and denoising chains are drawn as 3-D paths where the scene says how actions map to points
//! ([`ActionPoints3d`]), and named camera images go to `cameras/<name>`. The first 3-D scene
//! switches the viewer to the blueprint's 3-D layout.
//!
//! A sink error never reaches the caller: the first one is printed as a warning, later ones
//! are dropped. Dropping the recorder flushes it; the stream finalises the file (its footer)
//! when the last handle goes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use diffrl_core::record::{
    EpisodeEnd, FrameSaliency, Level, PolicyCall, Recorder, StepSeries, Timeline, Topic,
};
use diffrl_core::scene::{ActionPaths2d, ActionPoints3d, Body, Rgba, Scene, Shape2d, Shape3d};
use rerun::{
    BarChart, Boxes2D, Boxes3D, Capsules3D, Color, Cylinders3D, Ellipsoids3D, Image, LineStrips2D,
    LineStrips3D, MediaType, Points2D, Quaternion, RecordingStream, RecordingStreamBuilder,
    Scalars, TextDocument, TextLog, TextLogLevel, TimeColumn, Transform3D,
};

use rerun::components::Radius;

use crate::blueprint::{Layout, default_blueprint};
use crate::guarded::GuardedGrpcSink;
use crate::sink::RerunSink;
use crate::{VizError, paths};

/// The application id recordings are grouped under in the viewer.
pub const APP_ID: &str = "diffrl";

/// Buffered scalar rows (all entities) before they are sent.
const FLUSH_ROWS: usize = 512;
/// Longest time scalars wait in the buffer (a live viewer should not lag more).
const FLUSH_EVERY: Duration = Duration::from_secs(2);

/// One buffered scalar series: its values and, per timeline, their times.
struct Column {
    timelines: Vec<&'static str>,
    times: Vec<Vec<i64>>,
    values: Vec<f64>,
}

/// How the scene's frame maps to the viewer's (y down).
#[derive(Clone, Copy)]
struct Frame {
    y_down: bool,
    y_sum: f32,
}

impl Frame {
    fn map(self, [x, y]: [f32; 2]) -> [f32; 2] {
        if self.y_down {
            [x, y]
        } else {
            [x, self.y_sum - y]
        }
    }
}

struct State {
    env_step: Option<i64>,
    train_step: Option<i64>,
    columns: HashMap<String, Column>,
    buffered: usize,
    last_flush: Instant,
    frame: Frame,
    /// Last logged shape per scene item (unchanged shapes are not logged again).
    shapes: HashMap<&'static str, Shape2d>,
    bounds: Option<[[f32; 2]; 2]>,
    /// Last logged 3-D body per name.
    bodies: HashMap<&'static str, Body>,
    /// Whether the 3-D layout was sent.
    solid: bool,
    /// Whether the road layout was sent.
    road: bool,
    /// How the last scene's actions map to 3-D points.
    actions_3d: Option<ActionPoints3d>,
    /// How the last scene's actions map to paths of its agents in 2-D.
    action_paths: Option<ActionPaths2d>,
    /// The tool's path through the current episode.
    tool_path: Vec<[f32; 3]>,
}

/// Longest tool path kept (older points drop off).
const TOOL_PATH_MAX: usize = 2_000;

/// What kind of sink the stream writes to (for warnings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SinkKind {
    File,
    Network,
    Memory,
}

/// Records into a Rerun stream. Cheap to share by reference; every method takes `&self`.
pub struct RerunRecorder {
    rec: RecordingStream,
    state: Mutex<State>,
    kind: SinkKind,
    description: String,
    warned: AtomicBool,
    finished: AtomicBool,
    timeline: Timeline,
}

fn color(c: Rgba) -> Color {
    Color::from_unmultiplied_rgba(c[0], c[1], c[2], c[3])
}

/// x_K (noise) in blue through x_0 (the action chunk) in red.
/// A line width in screen points (Rerun reads negative radii so), whatever the scene's units.
fn ui(points: f32) -> Radius {
    Radius::new_ui_points(points)
}

/// Black (0) through red and yellow to white (1).
fn heat_color(v: f32) -> [u8; 3] {
    let v = v.clamp(0.0, 1.0) * 3.0;
    [v, v - 1.0, v - 2.0].map(|c| (c.clamp(0.0, 1.0) * 255.0).round() as u8)
}

fn chain_color(k: usize, big_k: usize) -> Color {
    let t = if big_k == 0 {
        0.0
    } else {
        k as f32 / big_k as f32
    };
    let lerp = |a: f32, b: f32| (a + (b - a) * t).round() as u8;
    Color::from_unmultiplied_rgba(lerp(220.0, 70.0), lerp(50.0, 130.0), lerp(40.0, 230.0), 255)
}

fn level(l: Level) -> TextLogLevel {
    match l {
        Level::Info => TextLogLevel::from(TextLogLevel::INFO),
        Level::Warn => TextLogLevel::from(TextLogLevel::WARN),
        Level::Error => TextLogLevel::from(TextLogLevel::ERROR),
    }
}

impl RerunRecorder {
    /// Opens `sink` (None for [`RerunSink::Off`]). Fails before anything is recorded when the
    /// sink cannot work: an unwritable save path, a port already in use, no viewer binary.
    /// `name` labels the recording in the viewer (e.g. `diffrl pretrain`); the viewer opens on
    /// `timeline`.
    pub fn open(
        sink: &RerunSink,
        name: &str,
        timeline: Timeline,
    ) -> Result<Option<Self>, VizError> {
        let builder = || {
            RecordingStreamBuilder::new(APP_ID)
                .recording_name(name)
                .enabled(true)
                .with_blueprint(default_blueprint(timeline, Layout::Flat))
        };
        let (rec, kind) = match sink {
            RerunSink::Off => return Ok(None),
            RerunSink::Save(path) => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|source| VizError::Save {
                        path: path.clone(),
                        message: source.to_string(),
                    })?;
                }
                let rec = builder().save(path).map_err(|e| VizError::Save {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
                (rec, SinkKind::File)
            }
            RerunSink::Connect(url) => (Self::guarded(builder(), url)?, SinkKind::Network),
            RerunSink::Spawn => {
                let info = rerun::spawn(&rerun::SpawnOptions::default())
                    .map_err(crate::view::spawn_error)?;
                // Give the viewer time to bind (Rerun's own wait panics in debug builds when
                // it does not); if it never does, the sink warns and training goes on.
                wait_listening(std::net::SocketAddr::from(([127, 0, 0, 1], info.port)));
                let url = format!("rerun+http://127.0.0.1:{}/proxy", info.port);
                (Self::guarded(builder(), &url)?, SinkKind::Network)
            }
            RerunSink::Serve { bind, port } => {
                // Rerun binds on its own thread and only logs a failure: check first.
                std::net::TcpListener::bind((*bind, *port)).map_err(|e| VizError::Serve {
                    addr: format!("{bind}:{port}"),
                    message: e.to_string(),
                })?;
                let opts = rerun::ServerOptions {
                    memory_limit: rerun::MemoryLimit::from_fraction_of_total(0.25),
                    ..Default::default()
                };
                let rec = builder()
                    .serve_grpc_opts(bind.to_string(), *port, opts)
                    .map_err(|e| VizError::Serve {
                        addr: format!("{bind}:{port}"),
                        message: e.to_string(),
                    })?;
                // Rerun's server binds in the background: return once it listens, so that a
                // viewer started right after `open` is not refused.
                let local = if bind.is_unspecified() {
                    std::net::IpAddr::from([127, 0, 0, 1])
                } else {
                    *bind
                };
                wait_listening(std::net::SocketAddr::new(local, *port));
                (rec, SinkKind::Network)
            }
        };
        Ok(Some(Self::wrap(rec, kind, sink.to_string(), timeline)))
    }

    /// A recorder into memory, for tests: the stream's messages are read back from the storage.
    pub fn memory() -> Result<(Self, rerun::sink::MemorySinkStorage), VizError> {
        let (rec, storage) = RecordingStreamBuilder::new(APP_ID)
            .enabled(true)
            .with_blueprint(default_blueprint(Timeline::EnvStep, Layout::Flat))
            .memory()
            .map_err(|e| VizError::Rerun(e.to_string()))?;
        let me = Self::wrap(rec, SinkKind::Memory, "memory".into(), Timeline::EnvStep);
        Ok((me, storage))
    }

    fn guarded(builder: RecordingStreamBuilder, url: &str) -> Result<RecordingStream, VizError> {
        let sink = GuardedGrpcSink::new(url).map_err(VizError::Connect)?;
        let (_, store_info, properties, batcher, hooks, blueprint) = builder.into_args();
        let rec = RecordingStream::new(store_info, properties, batcher, hooks, Box::new(sink))
            .map_err(|e| VizError::Rerun(e.to_string()))?;
        if let Some(bp) = blueprint {
            bp.send(&rec).map_err(|e| VizError::Rerun(e.to_string()))?;
        }
        Ok(rec)
    }

    fn wrap(rec: RecordingStream, kind: SinkKind, description: String, timeline: Timeline) -> Self {
        // log_time stays (wall clock of live runs); log_tick would only add a column per row.
        rec.set_log_tick_enabled(false);
        Self {
            rec,
            state: Mutex::new(State {
                env_step: None,
                train_step: None,
                columns: HashMap::new(),
                buffered: 0,
                last_flush: Instant::now(),
                frame: Frame {
                    y_down: true,
                    y_sum: 0.0,
                },
                shapes: HashMap::new(),
                bounds: None,
                bodies: HashMap::new(),
                solid: false,
                road: false,
                actions_3d: None,
                action_paths: None,
                tool_path: Vec::new(),
            }),
            kind,
            description,
            warned: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            timeline,
        }
    }

    /// The sink, as the `--rerun` value that opened it.
    pub fn description(&self) -> &str {
        &self.description
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn warn(&self, what: &str, e: &dyn std::fmt::Display) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            eprintln!(
                "warning: rerun ({}): {what}: {e}; training continues (further recording \
                 errors are not shown)",
                self.description
            );
        }
    }

    fn check<T, E: std::fmt::Display>(&self, what: &str, r: Result<T, E>) {
        if let Err(e) = r {
            self.warn(what, &e);
        }
    }

    /// Sets this thread's Rerun time to the recorder's clocks on `timelines` (and clears the
    /// others), since Rerun's time is per thread while the recorder may be called from several.
    fn stamp(&self, st: &State, timelines: &[Timeline]) {
        for (tl, v) in [
            (Timeline::EnvStep, st.env_step),
            (Timeline::TrainStep, st.train_step),
        ] {
            match v.filter(|_| timelines.contains(&tl)) {
                Some(v) => self.rec.set_time_sequence(tl.name(), v),
                None => self.rec.disable_timeline(tl.name()),
            }
        }
    }

    /// Buffers scalar rows of `path`: `values[i]` at `times[j].1[i]` on each timeline `j`.
    fn push_rows(
        &self,
        st: &mut State,
        path: &str,
        times: Vec<(&'static str, Vec<i64>)>,
        values: &[f64],
    ) {
        let names: Vec<&'static str> = times.iter().map(|t| t.0).collect();
        if let Some(col) = st.columns.get_mut(path)
            && col.timelines != names
        {
            // Another set of timelines (e.g. train_step appeared): send what was there first.
            let old = std::mem::replace(
                col,
                Column {
                    timelines: names.clone(),
                    times: vec![Vec::new(); names.len()],
                    values: Vec::new(),
                },
            );
            self.send_column(path, old);
        }
        let col = st
            .columns
            .entry(path.to_string())
            .or_insert_with(|| Column {
                timelines: names.clone(),
                times: vec![Vec::new(); names.len()],
                values: Vec::new(),
            });
        for (dst, (_, src)) in col.times.iter_mut().zip(times) {
            dst.extend(src);
        }
        col.values.extend_from_slice(values);
        st.buffered += values.len();
        if st.buffered >= FLUSH_ROWS || st.last_flush.elapsed() >= FLUSH_EVERY {
            self.send_columns(st);
        }
    }

    fn send_column(&self, path: &str, col: Column) {
        if col.values.is_empty() {
            return;
        }
        let times: Vec<TimeColumn> = col
            .timelines
            .iter()
            .zip(col.times)
            .map(|(tl, t)| TimeColumn::new_sequence(*tl, t))
            .collect();
        match Scalars::new(col.values).columns_of_unit_batches() {
            Ok(cols) => self.check("sending scalars", self.rec.send_columns(path, times, cols)),
            Err(e) => self.warn("serialising scalars", &e),
        }
    }

    fn send_columns(&self, st: &mut State) {
        for (path, col) in &mut st.columns {
            let taken = Column {
                timelines: col.timelines.clone(),
                times: col.times.iter_mut().map(std::mem::take).collect(),
                values: std::mem::take(&mut col.values),
            };
            self.send_column(path, taken);
        }
        st.buffered = 0;
        st.last_flush = Instant::now();
    }

    fn strip(&self, frame: Frame, points: &[[f32; 2]], close: bool) -> Vec<[f32; 2]> {
        let mut v: Vec<[f32; 2]> = points.iter().map(|&p| frame.map(p)).collect();
        if close && let Some(&first) = v.first() {
            v.push(first);
        }
        v
    }

    fn log_shape(&self, path: &str, frame: Frame, shape: &Shape2d) {
        let r = match shape {
            Shape2d::Polygon {
                points,
                color: c,
                filled,
            } => self.rec.log(
                path,
                &LineStrips2D::new([self.strip(frame, points, true)])
                    .with_colors([color(*c)])
                    // Rerun has no filled 2-D polygon: solid bodies get a heavier outline.
                    // Outline widths are screen points, so a scene of any size (512 px
                    // Push-T, 200 m of road) draws them alike.
                    .with_radii([ui(if *filled { 2.5 } else { 1.0 })]),
            ),
            Shape2d::Circle {
                center,
                radius,
                color: c,
            } => self.rec.log(
                path,
                &Points2D::new([frame.map(*center)])
                    .with_radii([*radius])
                    .with_colors([color(*c)]),
            ),
            Shape2d::LineStrip { points, color: c } => self.rec.log(
                path,
                &LineStrips2D::new([self.strip(frame, points, false)])
                    .with_colors([color(*c)])
                    .with_radii([ui(1.0)]),
            ),
        };
        self.check("logging the scene", r);
    }

    /// A 3-D body: its pose as the entity's transform, its primitive in the entity's frame.
    fn log_body(&self, path: &str, body: &Body) {
        let pose = Transform3D::from_translation_rotation(
            body.pose.translation,
            Quaternion::from_xyzw(body.pose.rotation),
        );
        let r = self.rec.log(path, &pose);
        self.check("logging the 3-D scene", r);
        let c = [color(body.color)];
        let r = match &body.shape {
            Shape3d::Box { half_extents } => self.rec.log(
                path,
                &Boxes3D::from_half_sizes([*half_extents]).with_colors(c),
            ),
            Shape3d::Sphere { radius } => self
                .rec
                .log(path, &Ellipsoids3D::from_radii([*radius]).with_colors(c)),
            // Rerun's capsules start at the origin and run along +z: centre them.
            Shape3d::Capsule {
                half_length,
                radius,
            } => self.rec.log(
                path,
                &Capsules3D::from_lengths_and_radii([2.0 * half_length], [*radius])
                    .with_translations([[0.0, 0.0, -half_length]])
                    .with_colors(c),
            ),
            Shape3d::Cylinder {
                half_length,
                radius,
            } => self.rec.log(
                path,
                &Cylinders3D::from_lengths_and_radii([2.0 * half_length], [*radius]).with_colors(c),
            ),
            Shape3d::LineStrip { points } => self.rec.log(
                path,
                &LineStrips3D::new([points.clone()])
                    .with_colors(c)
                    .with_radii([0.002f32]),
            ),
        };
        self.check("logging the 3-D scene", r);
    }

    /// A result (document, chart): at the current `train_step` during training, else static so
    /// it shows on every timeline.
    /// Chain log-probs of `call` on the `denoise_step` timeline (both layouts).
    fn chain_logp(&self, st: &mut State, call: &PolicyCall<'_>) {
        if call.logp.is_empty() {
            return;
        }
        let n = call.logp.len();
        // logp[i] is log pi(x_{K-i-1} | x_{K-i}): it sits at denoise_step k = K - i.
        let mut times = vec![(
            Timeline::DenoiseStep.name(),
            (0..n).map(|i| (n - i) as i64).collect(),
        )];
        for (tl, v) in [
            (Timeline::EnvStep, st.env_step),
            (Timeline::TrainStep, st.train_step),
        ] {
            if let Some(v) = v {
                times.push((tl.name(), vec![v; n]));
            }
        }
        let values: Vec<f64> = call.logp.iter().map(|&v| f64::from(v)).collect();
        self.push_rows(st, paths::CHAIN_LOGP, times, &values);
    }

    /// The action chunk and denoising chain of `call` as 3-D paths over a 3-D scene.
    /// The frame blended with a heat map of its squares' saliency, scaled to the largest
    /// (`saliency/frame`), and that largest value (`saliency/max`, normalised action units).
    fn saliency(&self, s: &FrameSaliency<'_>) {
        let (h, w) = (s.height as usize, s.width as usize);
        if s.frame.len() != h * w * 3 || s.values.len() != s.rows * s.cols || s.square == 0 {
            self.check::<(), _>(
                "logging the saliency map",
                Err(format!(
                    "a {h} x {w} RGB frame has {} bytes, not {}, or {} values for {} x {} squares",
                    s.frame.len(),
                    h * w * 3,
                    s.values.len(),
                    s.rows,
                    s.cols
                )),
            );
            return;
        }
        let max = s.values.iter().copied().fold(0.0f32, f32::max);
        let mut px = Vec::with_capacity(h * w * 3);
        for y in 0..h {
            for x in 0..w {
                let (r, q) = (
                    (y / s.square).min(s.rows - 1),
                    (x / s.square).min(s.cols - 1),
                );
                let v = if max > 0.0 {
                    s.values[r * s.cols + q] / max
                } else {
                    0.0
                };
                let heat = heat_color(v);
                let at = (y * w + x) * 3;
                let grey = s.frame[at..at + 3]
                    .iter()
                    .map(|&c| f32::from(c))
                    .sum::<f32>()
                    / 3.0;
                for c in heat {
                    px.push((0.4 * grey + 0.6 * f32::from(c)).round() as u8);
                }
            }
        }
        let r = self.rec.log(
            paths::SALIENCY_FRAME,
            &Image::from_rgb24(px, [s.width, s.height]),
        );
        self.check("logging the saliency map", r);
        let r = self
            .rec
            .log(paths::SALIENCY_MAX, &Scalars::new([f64::from(max)]));
        self.check("logging the saliency maximum", r);
    }

    fn policy_call_3d(&self, a3: &ActionPoints3d, call: &PolicyCall<'_>) {
        let da = call.action_dim;
        let predicted = a3.points(call.predicted, da);
        if predicted.is_empty() {
            return;
        }
        // A displacement path has its start point first.
        let start = usize::from(a3.cumulative);
        let executed: Vec<[f32; 3]> = predicted
            .iter()
            .take(call.executed + start)
            .copied()
            .collect();
        for (path, strip, rgb, radius) in [
            (
                paths::ACTIONS3D_PREDICTED,
                predicted,
                (255, 165, 0),
                0.002f32,
            ),
            (paths::ACTIONS3D_EXECUTED, executed, (220, 20, 60), 0.004),
        ] {
            let r = self.rec.log(
                path,
                &LineStrips3D::new([strip])
                    .with_colors([Color::from_unmultiplied_rgba(rgb.0, rgb.1, rgb.2, 255)])
                    .with_radii([radius]),
            );
            self.check("logging actions", r);
        }
        let per = call.predicted.len();
        if per == 0 || call.chain.is_empty() {
            return;
        }
        let k = call.chain.len() / per - 1;
        // Row i of the chain is x_{K - i}.
        let strips: Vec<Vec<[f32; 3]>> = call.chain.chunks(per).map(|x| a3.points(x, da)).collect();
        let colors: Vec<Color> = (0..=k).map(|i| chain_color(k - i, k)).collect();
        let radii: Vec<f32> = (0..=k)
            .map(|i| if i == k { 0.003 } else { 0.001 })
            .collect();
        self.check(
            "logging the denoising chain",
            self.rec.log(
                paths::CHAIN3D,
                &LineStrips3D::new(strips)
                    .with_colors(colors)
                    .with_radii(radii),
            ),
        );
    }

    fn log_result(&self, path: &str, what: &dyn rerun::AsComponents, context: &str) {
        let st = self.lock();
        let r = if st.train_step.is_some() {
            self.stamp(&st, &[Timeline::TrainStep]);
            self.rec.log(path, what)
        } else {
            self.rec.log_static(path, what)
        };
        self.check(context, r);
    }

    /// Flushes buffered scalars and finalises file sinks (writes the .rrd footer), e.g. on
    /// Ctrl-C before the process exits. Later calls do nothing; logging after it is lost.
    pub fn finish(&self) {
        if self.finished.swap(true, Ordering::SeqCst) {
            return;
        }
        {
            let mut st = self.lock();
            self.send_columns(&mut st);
        }
        if self.kind == SinkKind::Network {
            // Gives a connected viewer the tail; a missing one has been warned about.
            let _ = self.rec.flush_with_timeout(Duration::from_secs(2));
        }
        self.rec.finalize_deferred_sinks();
    }
}

impl Drop for RerunRecorder {
    fn drop(&mut self) {
        let mut st = self.lock();
        self.send_columns(&mut st);
    }
}

impl Recorder for RerunRecorder {
    fn enabled(&self) -> bool {
        !self.finished.load(Ordering::Relaxed)
    }

    fn set_time(&self, timeline: Timeline, value: i64) {
        let mut st = self.lock();
        match timeline {
            Timeline::EnvStep => st.env_step = Some(value),
            Timeline::TrainStep => st.train_step = Some(value),
            Timeline::DenoiseStep => {}
        }
    }

    fn tick(&self, timeline: Timeline) -> i64 {
        let mut st = self.lock();
        let slot = match timeline {
            Timeline::EnvStep => &mut st.env_step,
            Timeline::TrainStep => &mut st.train_step,
            Timeline::DenoiseStep => return 0,
        };
        let v = slot.map_or(0, |v| v + 1);
        *slot = Some(v);
        v
    }

    fn scene(&self, scene: &Scene) {
        let mut st = self.lock();
        let [[_, y0], [_, y1]] = scene.bounds;
        st.frame = Frame {
            y_down: scene.y_down,
            y_sum: y0 + y1,
        };
        let frame = st.frame;
        self.stamp(&st, &[Timeline::EnvStep, Timeline::TrainStep]);
        let flat = !scene.items.is_empty() || !scene.is_3d();
        if flat && st.bounds != Some(scene.bounds) {
            st.bounds = Some(scene.bounds);
            let [[x0, y0], [x1, y1]] = scene.bounds;
            let r = self.rec.log(
                paths::SCENE_BOUNDS,
                &Boxes2D::from_mins_and_sizes([[x0, y0.min(y1)]], [[x1 - x0, (y1 - y0).abs()]])
                    .with_colors([Color::from_unmultiplied_rgba(200, 200, 200, 60)]),
            );
            self.check("logging the scene", r);
        }
        for item in &scene.items {
            if st.shapes.get(item.name) == Some(&item.shape) {
                continue;
            }
            self.log_shape(
                &format!("{}/{}", paths::SCENE, item.name),
                frame,
                &item.shape,
            );
            st.shapes.insert(item.name, item.shape.clone());
        }
        let activation = rerun::blueprint::BlueprintActivation {
            make_active: true,
            make_default: true,
        };
        if scene.is_3d() && !st.solid {
            st.solid = true;
            let r = default_blueprint(self.timeline, Layout::Solid).send(&self.rec, activation);
            self.check("sending the 3-D layout", r);
        } else if !scene.is_3d() && scene.action_paths.is_some() && !st.road {
            st.road = true;
            let r = default_blueprint(self.timeline, Layout::Road).send(&self.rec, activation);
            self.check("sending the road layout", r);
        }
        st.actions_3d = scene.actions_3d;
        st.action_paths.clone_from(&scene.action_paths);
        if let Some(p) = scene.tool
            && st.tool_path.last() != Some(&p)
        {
            if st.tool_path.len() == TOOL_PATH_MAX {
                st.tool_path.remove(0);
            }
            st.tool_path.push(p);
            let r = self.rec.log(
                paths::TOOL_PATH,
                &LineStrips3D::new([st.tool_path.clone()])
                    .with_colors([Color::from_unmultiplied_rgba(30, 144, 255, 255)]),
            );
            self.check("logging the tool path", r);
        }
        for body in &scene.bodies {
            if st.bodies.get(body.name) == Some(body) {
                continue;
            }
            self.log_body(&format!("{}/{}", paths::SCENE3D, body.name), body);
            st.bodies.insert(body.name, body.clone());
        }
        if let Some(img) = &scene.image {
            let r = self.rec.log(
                paths::PIXELS,
                &Image::from_rgb24(img.data.clone(), [img.width, img.height]),
            );
            self.check("logging the camera image", r);
        }
        for cam in &scene.cameras {
            let img = &cam.image;
            let r = self.rec.log(
                format!("{}/{}", paths::CAMERAS, cam.name),
                &Image::from_rgb24(img.data.clone(), [img.width, img.height]),
            );
            self.check("logging a camera image", r);
        }
    }

    fn policy_call(&self, call: &PolicyCall<'_>) {
        let da = call.action_dim.max(1);
        let mut st = self.lock();
        let frame = st.frame;
        self.stamp(&st, &[Timeline::EnvStep, Timeline::TrainStep]);
        if let Some(s) = &call.saliency {
            self.saliency(s);
        }
        if let Some(a3) = st.actions_3d {
            self.policy_call_3d(&a3, call);
            self.chain_logp(&mut st, call);
            return;
        }
        // Actions draw as the paths the scene predicts for its agents, else as points from
        // their first two components (1-D actions: index, value): one strip per agent.
        let paths = st.action_paths.clone();
        let strips_of = |rows: &[f32]| -> Vec<Vec<[f32; 2]>> {
            if let Some(paths) = &paths {
                return paths
                    .paths(rows)
                    .into_iter()
                    .map(|p| p.into_iter().map(|q| frame.map(q)).collect())
                    .collect();
            }
            vec![
                rows.chunks(da)
                    .enumerate()
                    .map(|(i, a)| {
                        frame.map(if da >= 2 {
                            [a[0], a[1]]
                        } else {
                            [i as f32, a[0]]
                        })
                    })
                    .collect(),
            ]
        };
        let executed_len = (call.executed * da).min(call.predicted.len());
        for (path, rows, color, radius) in [
            (
                paths::ACTIONS_PREDICTED,
                call.predicted,
                Color::from_unmultiplied_rgba(255, 165, 0, 255),
                ui(1.5),
            ),
            (
                paths::ACTIONS_EXECUTED,
                &call.predicted[..executed_len],
                Color::from_unmultiplied_rgba(220, 20, 60, 255),
                ui(3.0),
            ),
        ] {
            let strips = strips_of(rows);
            let n = strips.len();
            self.check(
                "logging actions",
                self.rec.log(
                    path,
                    &LineStrips2D::new(strips)
                        .with_colors(vec![color; n])
                        .with_radii(vec![radius; n]),
                ),
            );
        }
        let per = call.predicted.len();
        if per == 0 || call.chain.is_empty() {
            return;
        }
        let k = call.chain.len() / per - 1;
        // Row i of the chain is x_{K - i}; each row draws as one strip per agent.
        let (mut strips, mut colors, mut radii) = (Vec::new(), Vec::new(), Vec::new());
        for (i, row) in call.chain.chunks(per).enumerate() {
            for strip in strips_of(row) {
                strips.push(strip);
                colors.push(chain_color(k - i, k));
                radii.push(ui(if i == k { 2.0 } else { 0.75 }));
            }
        }
        self.check(
            "logging the denoising chain",
            self.rec.log(
                paths::CHAIN_X,
                &LineStrips2D::new(strips)
                    .with_colors(colors)
                    .with_radii(radii),
            ),
        );
        self.chain_logp(&mut st, call);
    }
    fn step_series(&self, series: StepSeries, first_env_step: i64, values: &[f64]) {
        if values.is_empty() {
            return;
        }
        let mut st = self.lock();
        let path = format!("{}/{}", paths::REWARDS, series.name());
        let times = (first_env_step..first_env_step + values.len() as i64).collect();
        self.push_rows(
            &mut st,
            &path,
            vec![(Timeline::EnvStep.name(), times)],
            values,
        );
    }

    fn group_stats(&self, outcomes: &[f64], group_size: usize) {
        if outcomes.is_empty() || group_size == 0 {
            return;
        }
        let (mut means, mut stds) = (Vec::new(), Vec::new());
        let mut zero = 0usize;
        for g in outcomes.chunks(group_size) {
            let m = g.iter().sum::<f64>() / g.len() as f64;
            let v = g.iter().map(|r| (r - m).powi(2)).sum::<f64>() / g.len() as f64;
            means.push(m);
            stds.push(v.sqrt());
            zero += usize::from(g.iter().all(|&r| r == g[0]));
        }
        let groups = means.len();
        let st = self.lock();
        self.stamp(&st, &[Timeline::TrainStep]);
        for (path, v) in [(paths::GROUPS_MEAN, means), (paths::GROUPS_STD, stds)] {
            self.check(
                "logging group statistics",
                self.rec.log(path, &Scalars::new(v)),
            );
        }
        self.check(
            "logging group statistics",
            self.rec.log(
                paths::GROUPS_ZERO_VAR,
                &Scalars::new([zero as f64 / groups as f64]),
            ),
        );
    }

    fn train_scalars(&self, step: i64, values: &[(Topic, &str, f64)]) {
        let mut st = self.lock();
        for &(topic, name, v) in values {
            let path = format!("{}/{}/{name}", paths::TRAIN, topic.name());
            self.push_rows(
                &mut st,
                &path,
                vec![(Timeline::TrainStep.name(), vec![step])],
                &[v],
            );
        }
    }

    fn episode_end(&self, e: &EpisodeEnd) {
        // Scenes are environment 0's.
        if e.env == 0 {
            self.lock().tool_path.clear();
        }
        let text = format!(
            "env {} episode {}: {} (max score {:.3}, return {:.2}, {} steps)",
            e.env,
            e.episode,
            if e.success { "success" } else { "failure" },
            e.max_score,
            e.total_reward,
            e.length
        );
        let lvl = if e.success { Level::Info } else { Level::Warn };
        self.text(paths::EVAL_EPISODES, lvl, &text);
    }

    fn text(&self, path: &str, lvl: Level, text: &str) {
        let st = self.lock();
        self.stamp(&st, &[Timeline::EnvStep, Timeline::TrainStep]);
        self.check(
            "logging text",
            self.rec
                .log(path, &TextLog::new(text).with_level(level(lvl))),
        );
    }

    fn document(&self, path: &str, markdown: &str) {
        let doc = TextDocument::new(markdown).with_media_type(MediaType::markdown());
        self.log_result(path, &doc, "logging a document");
    }

    fn bar_chart(&self, path: &str, values: &[f64]) {
        self.log_result(path, &BarChart::new(values.to_vec()), "logging a bar chart");
    }

    fn flush(&self) {
        let mut st = self.lock();
        self.send_columns(&mut st);
        drop(st);
        if self.kind == SinkKind::File {
            // Surfaces write errors (full disk) once; the data itself is already queued.
            self.check(
                "writing the recording",
                self.rec.flush_with_timeout(Duration::from_secs(10)),
            );
        }
    }
}

/// Waits (at most 10 s) until `addr` accepts a TCP connection: a viewer or server that Rerun
/// starts binds on its own thread. Returns either way; a sink that never connects warns.
fn wait_listening(addr: std::net::SocketAddr) {
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err()
        && t0.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use diffrl_core::ImageObs;
    use diffrl_core::scene::{CameraImage, Transform3d};

    use super::*;
    use crate::read::RecordingSummary;

    /// A 3-D scene: bodies under `scene3d/`, named cameras under `cameras/`, no 2-D bounds box;
    /// a body that did not move is not logged again.
    #[test]
    fn a_3d_scene_logs_its_bodies_and_cameras() {
        let (rec, storage) = RerunRecorder::memory().unwrap();
        let mut scene = Scene::new_3d([[-1.0; 3], [1.0; 3]]);
        let grey = [128, 128, 128, 255];
        scene
            .push_body(
                "table",
                Shape3d::Box {
                    half_extents: [0.5, 0.5, 0.02],
                },
                Transform3d::IDENTITY,
                grey,
            )
            .push_body(
                "ball",
                Shape3d::Sphere { radius: 0.03 },
                Transform3d::from_translation([0.1, 0.0, 0.05]),
                grey,
            )
            .push_body(
                "finger",
                Shape3d::Capsule {
                    half_length: 0.02,
                    radius: 0.01,
                },
                Transform3d::from_axis_angle([0.0, 0.1, 0.2], [1.0, 0.0, 0.0], 0.3),
                grey,
            )
            .push_body(
                "pole",
                Shape3d::Cylinder {
                    half_length: 0.1,
                    radius: 0.01,
                },
                Transform3d::IDENTITY,
                grey,
            )
            .push_body(
                "path",
                Shape3d::LineStrip {
                    points: vec![[0.0; 3], [0.1, 0.1, 0.1]],
                },
                Transform3d::IDENTITY,
                grey,
            );
        scene.cameras.push(CameraImage {
            name: "wrist",
            image: ImageObs {
                height: 2,
                width: 2,
                data: vec![0; 12],
            },
            pose: None,
        });
        rec.set_time(Timeline::EnvStep, 0);
        rec.scene(&scene);
        scene.bodies[1].pose.translation[0] = 0.2;
        rec.set_time(Timeline::EnvStep, 1);
        rec.scene(&scene);
        drop(rec);
        let s = RecordingSummary::from_messages(&storage.take()).unwrap();
        for body in ["table", "ball", "finger", "pole", "path"] {
            assert!(
                s.rows(&format!("/scene3d/{body}")) > 0,
                "{body}: {:?}",
                s.entities.keys()
            );
        }
        assert!(s.rows("/scene3d/ball") > s.rows("/scene3d/table"));
        assert!(s.rows("/cameras/wrist") > 0);
        assert_eq!(s.rows("/scene/bounds"), 0);
    }

    /// A 3-D scene switches the viewer to the 3-D layout (one more blueprint), traces its tool
    /// and draws action chunks and chains as 3-D paths; a 2-D scene does neither.
    #[test]
    fn a_3d_scene_gets_its_layout_tool_path_and_3d_chunks() {
        let chunk = [1.0, 0.0, 0.0, 0.5, 0.0, 1.0, 0.0, 0.5];
        let chain = [chunk, [0.0; 8], chunk].concat();
        let call = PolicyCall {
            action_dim: 4,
            predicted: &chunk,
            executed: 1,
            chain: &chain,
            logp: &[-1.0, -2.0],
            saliency: None,
        };
        let record = |scene: &Scene| {
            let (rec, storage) = RerunRecorder::memory().unwrap();
            for t in 0..3 {
                rec.set_time(Timeline::EnvStep, t);
                let mut s = scene.clone();
                if let Some(p) = &mut s.tool {
                    p[0] += 0.01 * t as f32;
                }
                rec.scene(&s);
                rec.policy_call(&call);
            }
            drop(rec);
            RecordingSummary::from_messages(&storage.take()).unwrap()
        };
        let mut solid = Scene::new_3d([[-1.0; 3], [1.0; 3]]);
        solid.tool = Some([0.5, 0.0, 0.2]);
        solid.actions_3d = Some(ActionPoints3d {
            origin: [0.5, 0.0, 0.2],
            scale: [0.025; 3],
            cumulative: true,
        });
        let s3 = record(&solid);
        let s2 = record(&Scene::new([[0.0, 0.0], [1.0, 1.0]], true));
        assert!(s3.blueprint_messages > s2.blueprint_messages);
        assert_eq!(s3.rows("/scene3d/tool_path"), 3);
        for path in ["actions/predicted", "actions/executed", "chain"] {
            assert_eq!(s3.rows(&format!("/scene3d/{path}")), 3, "{path}");
            assert_eq!(s2.rows(&format!("/scene3d/{path}")), 0, "{path}");
        }
        assert_eq!(s3.rows("/chain/x"), 0);
        assert_eq!(s2.rows("/chain/x"), 3);
        assert_eq!(s2.rows("/scene3d/tool_path"), 0);
    }

    /// A policy call with a saliency map logs the blended frame and its largest value on both
    /// layouts; a map whose frame or values have the wrong size is skipped with a warning.
    #[test]
    fn saliency_maps_log_their_frame_and_largest_value() {
        let frame = vec![100u8; 4 * 4 * 3];
        let map = FrameSaliency {
            frame: &frame,
            height: 4,
            width: 4,
            square: 2,
            rows: 2,
            cols: 2,
            values: &[0.5, 0.0, 0.25, 0.1],
        };
        let good = PolicyCall {
            action_dim: 2,
            predicted: &[0.1, 0.2, 0.3, 0.4],
            executed: 1,
            chain: &[],
            logp: &[],
            saliency: Some(map),
        };
        let bad = PolicyCall {
            saliency: Some(FrameSaliency {
                frame: &frame[1..],
                ..map
            }),
            ..good
        };
        for scene in [
            Scene::new([[0.0, 0.0], [1.0, 1.0]], true),
            Scene::new_3d([[-1.0; 3], [1.0; 3]]),
        ] {
            let (rec, storage) = RerunRecorder::memory().unwrap();
            for t in 0..2 {
                rec.set_time(Timeline::EnvStep, t);
                rec.scene(&scene);
                rec.policy_call(&good);
                rec.policy_call(&bad);
            }
            drop(rec);
            let s = RecordingSummary::from_messages(&storage.take()).unwrap();
            assert_eq!(s.rows("/saliency/frame"), 2, "{:?}", s.entities.keys());
            assert_eq!(s.rows("/saliency/max"), 2);
        }
        assert_eq!(heat_color(0.0), [0, 0, 0]);
        assert_eq!(heat_color(0.5), [255, 128, 0]);
        assert_eq!(heat_color(1.0), [255, 255, 255]);
    }

    /// A scene whose actions are commands draws each chunk, its executed part and every row
    /// of the chain through the scene's path map, one strip per agent.
    #[test]
    fn action_paths_draw_chunks_and_chains_through_the_scene() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicUsize;
        let calls = Arc::new(AtomicUsize::new(0));
        let lengths = Arc::new(Mutex::new(Vec::new()));
        let mut scene = Scene::new([[0.0, 0.0], [10.0, 10.0]], true);
        let (c, l) = (Arc::clone(&calls), Arc::clone(&lengths));
        scene.action_paths = Some(ActionPaths2d::new(move |rows: &[f32]| {
            c.fetch_add(1, Ordering::SeqCst);
            l.lock().unwrap().push(rows.len());
            let path = |dy: f32| rows.chunks(2).map(|a| [a[0], a[1] + dy]).collect();
            vec![path(0.0), path(1.0)]
        }));
        let chunk = [1.0, 0.0, 2.0, 0.5, 3.0, 1.0];
        let chain = [chunk, [0.0; 6], chunk].concat();
        let (rec, storage) = RerunRecorder::memory().unwrap();
        rec.set_time(Timeline::EnvStep, 0);
        rec.scene(&scene);
        rec.policy_call(&PolicyCall {
            action_dim: 2,
            predicted: &chunk,
            executed: 2,
            chain: &chain,
            logp: &[-1.0, -2.0],
            saliency: None,
        });
        drop(rec);
        // The chunk, its executed two actions, then the chain's three rows.
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        assert_eq!(*lengths.lock().unwrap(), [6, 4, 6, 6, 6]);
        let s = RecordingSummary::from_messages(&storage.take()).unwrap();
        for path in [
            "/scene/actions/predicted",
            "/scene/actions/executed",
            "/chain/x",
        ] {
            assert_eq!(s.rows(path), 1, "{path}");
        }
        // Such a scene gets the road layout (sent once), a plain 2-D scene does not.
        let (rec, storage) = RerunRecorder::memory().unwrap();
        rec.scene(&Scene::new([[0.0, 0.0], [10.0, 10.0]], true));
        drop(rec);
        let plain = RecordingSummary::from_messages(&storage.take()).unwrap();
        let road = |scenes: usize| {
            let (rec, storage) = RerunRecorder::memory().unwrap();
            for _ in 0..scenes {
                rec.scene(&scene);
            }
            drop(rec);
            RecordingSummary::from_messages(&storage.take())
                .unwrap()
                .blueprint_messages
        };
        assert!(road(1) > plain.blueprint_messages);
        assert_eq!(road(2), road(1));
    }
}
