//! What recording costs per GRPO iteration: one rollout as the learner records it (300 steps:
//! a scene per step, a policy call with its chain every 2 steps, per-step rewards and
//! advantages, group statistics, 13 training scalars), into an .rrd file and into nothing.
//! Prints the calling thread's wall time and the process's CPU time (Rerun's encoder and
//! writer threads included) per rollout. `cargo bench -p diffrl-viz --bench record`.

use std::time::Instant;

use diffrl_core::record::{NoRecorder, PolicyCall, Recorder, StepSeries, Timeline, Topic};
use diffrl_core::scene::{Scene2d, Shape2d};
use diffrl_viz::{RerunRecorder, RerunSink};

/// Process CPU time (user + system) in seconds, from /proc (Linux); 0 elsewhere.
fn cpu_s() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces): utime is the 14th, stime the 15th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn t_shape(x: f32, y: f32, a: f32) -> Vec<[f32; 2]> {
    let (s, c) = a.sin_cos();
    [
        [-60.0, 0.0],
        [60.0, 0.0],
        [60.0, 30.0],
        [15.0, 30.0],
        [15.0, 120.0],
        [-15.0, 120.0],
        [-15.0, 30.0],
        [-60.0, 30.0],
    ]
    .iter()
    .map(|[px, py]| [x + c * px - s * py, y + s * px + c * py])
    .collect()
}

fn rollout(rec: &dyn Recorder, iteration: i64) {
    const STEPS: usize = 300;
    let (tp, da, k) = (4usize, 2usize, 10usize);
    rec.set_time(Timeline::TrainStep, iteration);
    let mut first = None;
    for t in 0..STEPS {
        if !rec.enabled() {
            continue;
        }
        let step = rec.tick(Timeline::EnvStep);
        first.get_or_insert(step);
        let f = t as f32;
        let mut s = Scene2d::new([[0.0, 0.0], [512.0, 512.0]], true);
        s.actions_are_points = true;
        s.push(
            "goal",
            Shape2d::Polygon {
                points: t_shape(256.0, 256.0, 0.78),
                color: [144, 238, 144, 255],
                filled: false,
            },
        )
        .push(
            "block",
            Shape2d::Polygon {
                points: t_shape(200.0 + f * 0.1, 300.0, 0.001 * f),
                color: [119, 136, 153, 255],
                filled: true,
            },
        )
        .push(
            "agent",
            Shape2d::Circle {
                center: [100.0 + f, 100.0],
                radius: 15.0,
                color: [65, 105, 225, 255],
            },
        );
        rec.scene(&s);
        if t % 2 == 0 {
            let predicted: Vec<f32> = (0..tp * da).map(|i| f + i as f32).collect();
            let chain: Vec<f32> = (0..(k + 1) * tp * da).map(|i| i as f32).collect();
            let logp: Vec<f32> = (0..k).map(|i| -(i as f32)).collect();
            rec.policy_call(&PolicyCall {
                action_dim: da,
                predicted: &predicted,
                executed: 2,
                chain: &chain,
                logp: &logp,
                saliency: None,
            });
        }
    }
    let values: Vec<f64> = (0..STEPS).map(|i| i as f64 * 1e-3).collect();
    if let Some(t0) = first {
        rec.step_series(StepSeries::Reward, t0 + 1, &values);
        rec.step_series(StepSeries::Advantage, t0 + 1, &values);
    }
    rec.group_stats(&[0.5; 64], 8);
    let names = [
        "surrogate",
        "value",
        "approx",
        "ref",
        "frac",
        "rollouts",
        "mean",
        "std",
        "max",
        "lr",
        "norm",
        "collect",
        "update",
    ];
    let scalars: Vec<(Topic, &str, f64)> = names.iter().map(|n| (Topic::Loss, *n, 0.1)).collect();
    rec.train_scalars(iteration, &scalars);
}

fn measure(name: &str, rec: &dyn Recorder, n: usize) {
    rollout(rec, 0); // warm-up
    let (t0, c0) = (Instant::now(), cpu_s());
    for i in 1..=n {
        rollout(rec, i as i64);
    }
    rec.flush();
    let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_s() - c0);
    println!(
        "{{\"bench\": \"record_rollout\", \"sink\": \"{name}\", \"rollouts\": {n}, \
         \"wall_ms_per_rollout\": {:.3}, \"cpu_ms_per_rollout\": {:.3}}}",
        1e3 * wall / n as f64,
        1e3 * cpu / n as f64
    );
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing: run briefly then.
    let n = if std::env::args().any(|a| a == "--bench") {
        50
    } else {
        2
    };
    measure("off", &NoRecorder, n);
    let dir = tempfile::tempdir().expect("a temporary folder");
    let rec = RerunRecorder::open(
        &RerunSink::Save(dir.path().join("bench.rrd")),
        "bench",
        Timeline::TrainStep,
    )
    .expect("a file sink")
    .expect("on");
    measure("save", &rec, n);
    let (mem, _storage) = RerunRecorder::memory().expect("a memory sink");
    measure("memory", &mem, n);
}
