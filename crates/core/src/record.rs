//! What simulators and learners record for a viewer, behind one small trait so training code
//! never depends on a viewer. `diffrl-viz` implements [`Recorder`] with Rerun; [`NoRecorder`]
//! records nothing and costs nothing.
//!
//! Callers check [`Recorder::enabled`] before building anything they would only build for the
//! recorder (a [`Scene`], a de-normalised chain), so an off recorder allocates nothing per
//! step. No method has a default (wrappers must forward every one); a recorder never fails the
//! caller (sink errors are the recorder's to report).
//!
//! Time: a recorder keeps one clock per [`Timeline`]. Scenes, policy calls and episode ends are
//! stamped with the current `env_step` (and `train_step` when set); series carry their own steps.

use crate::scene::Scene;

/// The timelines a recording is indexed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timeline {
    /// Recorded environment steps, monotonic over the whole recording (episodes follow each
    /// other on it).
    EnvStep,
    /// Optimiser steps (behaviour cloning) or iterations (GRPO / PPO).
    TrainStep,
    /// Denoising step k of a chain (K = pure noise, 0 = the action chunk).
    DenoiseStep,
}

impl Timeline {
    /// The timeline's name in the recording.
    pub const fn name(self) -> &'static str {
        match self {
            Self::EnvStep => "env_step",
            Self::TrainStep => "train_step",
            Self::DenoiseStep => "denoise_step",
        }
    }
}

/// Topics training scalars are grouped by (one plot each in the default layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Topic {
    /// Losses (behaviour cloning, surrogate, critic).
    Loss,
    /// KL divergences (to the behaviour policy, to the reference policy).
    Kl,
    /// Ratio clipping.
    Clip,
    /// Success rates (rollouts, evaluations).
    Success,
    /// Rewards and scores of rollouts.
    Reward,
    /// Learning rates.
    Lr,
    /// Gradient norms.
    Grad,
    /// Throughput (steps per second).
    Speed,
}

impl Topic {
    /// Every topic, in the order of the default layout.
    pub const ALL: [Topic; 8] = [
        Self::Loss,
        Self::Kl,
        Self::Clip,
        Self::Success,
        Self::Reward,
        Self::Lr,
        Self::Grad,
        Self::Speed,
    ];

    /// The topic's path segment (`train/<topic>/<name>`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Loss => "loss",
            Self::Kl => "kl",
            Self::Clip => "clip",
            Self::Success => "success",
            Self::Reward => "reward",
            Self::Lr => "lr",
            Self::Grad => "grad",
            Self::Speed => "speed",
        }
    }
}

/// Per-environment-step quantities of a recorded rollout (`rewards/<name>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepSeries {
    /// The environment's reward.
    Reward,
    /// A progress estimate Phi(s) of the state after the step.
    Progress,
    /// The shaped per-step reward a learner optimises.
    Shaped,
    /// The advantage credited to the step.
    Advantage,
}

impl StepSeries {
    /// The series' path segment.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Reward => "reward",
            Self::Progress => "progress",
            Self::Shaped => "shaped",
            Self::Advantage => "advantage",
        }
    }
}

/// Severity of a text log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Normal progress.
    Info,
    /// Something worth a look (a failed episode).
    Warn,
    /// Something went wrong.
    Error,
}

/// One policy call for the recorded environment, in environment units.
#[derive(Debug, Clone, Copy)]
pub struct PolicyCall<'a> {
    /// Width of one action (Da).
    pub action_dim: usize,
    /// The predicted chunk, `[Tp, Da]` row-major.
    pub predicted: &'a [f32],
    /// How many of its actions are executed (Ta).
    pub executed: usize,
    /// The denoising chain x_K..x_0, `[K + 1, Tp, Da]`, or empty when not sampled.
    pub chain: &'a [f32],
    /// log pi(x_{k-1} | x_k, s) for k = K..1, `[K]`, or empty.
    pub logp: &'a [f32],
    /// Where a pixel policy looked in its newest camera frame, when computed.
    pub saliency: Option<FrameSaliency<'a>>,
}

/// Occlusion saliency of a policy's camera frame: per square of the frame, how far the policy's
/// action chunk moves when the square is hidden.
#[derive(Debug, Clone, Copy)]
pub struct FrameSaliency<'a> {
    /// The frame, `[height, width, 3]` RGB.
    pub frame: &'a [u8],
    /// Frame rows.
    pub height: u32,
    /// Frame columns.
    pub width: u32,
    /// Side of a square in pixels.
    pub square: usize,
    /// Squares per column of the frame.
    pub rows: usize,
    /// Squares per row of the frame.
    pub cols: usize,
    /// Saliency per square, row-major (`rows * cols` values >= 0).
    pub values: &'a [f32],
}

/// The end of an evaluation (or rollout) episode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpisodeEnd {
    /// Environment that played it.
    pub env: usize,
    /// Its index in that environment's episode stream.
    pub episode: u64,
    /// Whether the task succeeded.
    pub success: bool,
    /// Highest score reached.
    pub max_score: f32,
    /// Sum of rewards.
    pub total_reward: f32,
    /// Steps taken.
    pub length: usize,
}

/// Where recordable data goes. The methods take `&self` so one recorder can be shared by the
/// learner, its hooks and the evaluation loop; implementations synchronise internally.
///
/// No method has a default: a recorder that wraps another ([`TrainStepOffset`]) then cannot
/// forget to forward one, since the compiler asks for every method, including ones added later.
pub trait Recorder: Send + Sync {
    /// Whether anything is recorded. Callers skip building recording-only data when false.
    fn enabled(&self) -> bool;
    /// Sets `timeline`'s clock.
    fn set_time(&self, timeline: Timeline, value: i64);
    /// Advances `timeline`'s clock by one and returns the new value.
    fn tick(&self, timeline: Timeline) -> i64;
    /// The recorded environment's scene at the current `env_step`.
    fn scene(&self, scene: &Scene);
    /// A policy call of the recorded environment: executed and predicted chunks, the chain.
    fn policy_call(&self, call: &PolicyCall<'_>);
    /// Values of consecutive environment steps `first_env_step, first_env_step + 1, ...`.
    fn step_series(&self, series: StepSeries, first_env_step: i64, values: &[f64]);
    /// Outcomes of one update's rollouts, `group_size` consecutive ones per group, at the
    /// current `train_step`.
    fn group_stats(&self, outcomes: &[f64], group_size: usize);
    /// Training scalars at `step` of the `train_step` timeline: `(topic, name, value)`.
    fn train_scalars(&self, step: i64, values: &[(Topic, &str, f64)]);
    /// An episode ended (logged as text at the current `env_step`).
    fn episode_end(&self, end: &EpisodeEnd);
    /// A line of text under `path`.
    fn text(&self, path: &str, level: Level, text: &str);
    /// A Markdown document under `path` (replaces the previous one).
    fn document(&self, path: &str, markdown: &str);
    /// A bar chart under `path`, one bar per value.
    fn bar_chart(&self, path: &str, values: &[f64]);
    /// Sends everything buffered so far.
    fn flush(&self);
}

/// Records nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoRecorder;

impl Recorder for NoRecorder {
    fn enabled(&self) -> bool {
        false
    }
    fn set_time(&self, _timeline: Timeline, _value: i64) {}
    fn tick(&self, _timeline: Timeline) -> i64 {
        0
    }
    fn scene(&self, _scene: &Scene) {}
    fn policy_call(&self, _call: &PolicyCall<'_>) {}
    fn step_series(&self, _series: StepSeries, _first_env_step: i64, _values: &[f64]) {}
    fn group_stats(&self, _outcomes: &[f64], _group_size: usize) {}
    fn train_scalars(&self, _step: i64, _values: &[(Topic, &str, f64)]) {}
    fn episode_end(&self, _end: &EpisodeEnd) {}
    fn text(&self, _path: &str, _level: Level, _text: &str) {}
    fn document(&self, _path: &str, _markdown: &str) {}
    fn bar_chart(&self, _path: &str, _values: &[f64]) {}
    fn flush(&self) {}
}

/// Another recorder with its `train_step` timeline moved forward by `by`, so a training phase
/// that counts its steps from 0 (a DAgger round, GRPO after behaviour cloning) lands after the
/// previous phase: `train_step` values written (set_time, train_scalars) gain `by`, values read
/// back (tick) lose it; everything else passes through unchanged.
#[derive(Clone, Copy)]
pub struct TrainStepOffset<'a> {
    inner: &'a dyn Recorder,
    by: i64,
}

impl<'a> TrainStepOffset<'a> {
    /// `inner` seen with `train_step` moved forward by `by`.
    pub fn new(inner: &'a dyn Recorder, by: i64) -> Self {
        Self { inner, by }
    }
}

impl Recorder for TrainStepOffset<'_> {
    fn enabled(&self) -> bool {
        self.inner.enabled()
    }
    fn set_time(&self, timeline: Timeline, value: i64) {
        let v = if timeline == Timeline::TrainStep {
            value + self.by
        } else {
            value
        };
        self.inner.set_time(timeline, v);
    }
    fn tick(&self, timeline: Timeline) -> i64 {
        let v = self.inner.tick(timeline);
        if timeline == Timeline::TrainStep {
            v - self.by
        } else {
            v
        }
    }
    fn scene(&self, scene: &Scene) {
        self.inner.scene(scene);
    }
    fn policy_call(&self, call: &PolicyCall<'_>) {
        self.inner.policy_call(call);
    }
    fn step_series(&self, series: StepSeries, first_env_step: i64, values: &[f64]) {
        self.inner.step_series(series, first_env_step, values);
    }
    fn group_stats(&self, outcomes: &[f64], group_size: usize) {
        self.inner.group_stats(outcomes, group_size);
    }
    fn train_scalars(&self, step: i64, values: &[(Topic, &str, f64)]) {
        self.inner.train_scalars(step + self.by, values);
    }
    fn episode_end(&self, end: &EpisodeEnd) {
        self.inner.episode_end(end);
    }
    fn text(&self, path: &str, level: Level, text: &str) {
        self.inner.text(path, level, text);
    }
    fn document(&self, path: &str, markdown: &str) {
        self.inner.document(path, markdown);
    }
    fn bar_chart(&self, path: &str, values: &[f64]) {
        self.inner.bar_chart(path, values);
    }
    fn flush(&self) {
        self.inner.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_recorder_is_off_and_accepts_everything() {
        let r = NoRecorder;
        assert!(!r.enabled());
        r.set_time(Timeline::EnvStep, 3);
        assert_eq!(r.tick(Timeline::EnvStep), 0);
        r.scene(&Scene::default());
        r.train_scalars(1, &[(Topic::Loss, "bc", 0.5)]);
        r.flush();
        let names: Vec<_> = Topic::ALL.iter().map(|t| t.name()).collect();
        assert_eq!(names.len(), 8);
        assert_eq!(Timeline::DenoiseStep.name(), "denoise_step");
    }

    /// Writes every call it gets as a line, and ticks a shared clock.
    #[derive(Default)]
    struct Log(std::sync::Mutex<Vec<String>>);

    impl Log {
        fn push(&self, line: String) {
            self.0.lock().unwrap().push(line);
        }
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut self.0.lock().unwrap())
        }
    }

    impl Recorder for Log {
        fn enabled(&self) -> bool {
            self.push("enabled".into());
            true
        }
        fn set_time(&self, timeline: Timeline, value: i64) {
            self.push(format!("set_time {} {value}", timeline.name()));
        }
        fn tick(&self, timeline: Timeline) -> i64 {
            self.push(format!("tick {}", timeline.name()));
            100
        }
        fn scene(&self, scene: &Scene) {
            self.push(format!("scene {scene:?}"));
        }
        fn policy_call(&self, call: &PolicyCall<'_>) {
            self.push(format!("policy_call {call:?}"));
        }
        fn step_series(&self, series: StepSeries, first_env_step: i64, values: &[f64]) {
            self.push(format!(
                "step_series {} {first_env_step} {values:?}",
                series.name()
            ));
        }
        fn group_stats(&self, outcomes: &[f64], group_size: usize) {
            self.push(format!("group_stats {outcomes:?} {group_size}"));
        }
        fn train_scalars(&self, step: i64, values: &[(Topic, &str, f64)]) {
            self.push(format!("train_scalars {step} {values:?}"));
        }
        fn episode_end(&self, end: &EpisodeEnd) {
            self.push(format!("episode_end {end:?}"));
        }
        fn text(&self, path: &str, level: Level, text: &str) {
            self.push(format!("text {path} {level:?} {text}"));
        }
        fn document(&self, path: &str, markdown: &str) {
            self.push(format!("document {path} {markdown}"));
        }
        fn bar_chart(&self, path: &str, values: &[f64]) {
            self.push(format!("bar_chart {path} {values:?}"));
        }
        fn flush(&self) {
            self.push("flush".into());
        }
    }

    /// Calls every method once, returning what tick and enabled answered.
    fn every_call(r: &dyn Recorder, train_step: i64) -> (bool, i64, i64) {
        let on = r.enabled();
        r.set_time(Timeline::EnvStep, 7);
        r.set_time(Timeline::TrainStep, train_step);
        let env = r.tick(Timeline::EnvStep);
        let train = r.tick(Timeline::TrainStep);
        r.scene(&Scene::default());
        r.policy_call(&PolicyCall {
            action_dim: 1,
            predicted: &[0.5],
            executed: 1,
            chain: &[],
            logp: &[],
            saliency: None,
        });
        r.step_series(StepSeries::Reward, 3, &[1.0, 2.0]);
        r.group_stats(&[0.0, 1.0], 2);
        r.train_scalars(train_step, &[(Topic::Loss, "bc", 0.5)]);
        r.episode_end(&EpisodeEnd {
            env: 1,
            episode: 2,
            success: true,
            max_score: 0.9,
            total_reward: 3.0,
            length: 4,
        });
        r.text("log", Level::Info, "hello");
        r.document("doc", "# hi");
        r.bar_chart("bars", &[1.0]);
        r.flush();
        (on, env, train)
    }

    #[test]
    fn train_step_offset_moves_only_the_train_step_timeline() {
        let inner = Log::default();
        let direct = every_call(&inner, 3 + 40);
        let expected = inner.take();
        let shifted = every_call(&TrainStepOffset::new(&inner, 40), 3);
        assert_eq!(
            inner.take(),
            expected,
            "every call reaches the inner recorder"
        );
        assert_eq!((shifted.0, shifted.1), (direct.0, direct.1));
        assert_eq!(
            shifted.2,
            direct.2 - 40,
            "ticks read back in the phase's own steps"
        );
    }
}
