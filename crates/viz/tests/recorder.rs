//! The Rerun recorder against Rerun itself: what lands in a memory sink and in an .rrd file,
//! and that a missing or vanishing viewer neither blocks nor fails the caller.

use std::time::Duration;

use diffrl_core::ImageObs;
use diffrl_core::record::{
    EpisodeEnd, Level, NoRecorder, PolicyCall, Recorder, StepSeries, Timeline, Topic,
};
use diffrl_core::scene::{Scene2d, Shape2d};
use diffrl_viz::read::{RecordingSummary, read_rrd};
use diffrl_viz::{RerunRecorder, RerunSink, VizError, paths};

fn scene(agent_x: f32, image: bool) -> Scene2d {
    let mut s = Scene2d::new([[0.0, 0.0], [512.0, 512.0]], true);
    s.actions_are_points = true;
    s.push(
        "goal",
        Shape2d::Polygon {
            points: vec![[200.0, 200.0], [300.0, 200.0], [250.0, 300.0]],
            color: [144, 238, 144, 255],
            filled: false,
        },
    )
    .push(
        "agent",
        Shape2d::Circle {
            center: [agent_x, 100.0],
            radius: 15.0,
            color: [65, 105, 225, 255],
        },
    )
    .push(
        "walls",
        Shape2d::LineStrip {
            points: vec![[5.0, 5.0], [506.0, 5.0]],
            color: [211, 211, 211, 255],
        },
    );
    if image {
        s.image = Some(ImageObs {
            height: 4,
            width: 4,
            data: vec![128; 48],
        });
    }
    s
}

/// Everything a training run logs, once or a few times.
fn log_everything(rec: &dyn Recorder) {
    rec.set_time(Timeline::TrainStep, 1);
    for step in 0..3 {
        rec.tick(Timeline::EnvStep);
        rec.scene(&scene(100.0 + step as f32, step == 0));
    }
    // K = 2 denoising steps of a chunk of Tp = 3 two-dimensional actions.
    let predicted = [10.0f32, 11.0, 20.0, 21.0, 30.0, 31.0];
    let chain: Vec<f32> = (0..3 * 6).map(|i| i as f32).collect();
    rec.policy_call(&PolicyCall {
        action_dim: 2,
        predicted: &predicted,
        executed: 2,
        chain: &chain,
        logp: &[-1.5, 0.25],
        saliency: None,
    });
    rec.step_series(StepSeries::Reward, 1, &[0.0, 0.1, 0.2]);
    rec.step_series(StepSeries::Advantage, 1, &[0.5, 0.5, -0.5]);
    rec.group_stats(&[1.0, 0.0, 0.5, 0.5], 2);
    for s in 1..=10 {
        rec.train_scalars(
            s,
            &[(Topic::Loss, "bc", 1.0 / s as f64), (Topic::Lr, "lr", 1e-3)],
        );
    }
    rec.episode_end(&EpisodeEnd {
        env: 0,
        episode: 0,
        success: true,
        max_score: 0.97,
        total_reward: 12.5,
        length: 40,
    });
    rec.text(paths::RUN_LOG, Level::Info, "hello");
    rec.document(paths::ROBUSTNESS_TABLE, "| a | b |\n|---|---|\n| 1 | 2 |\n");
    rec.bar_chart(paths::ROBUSTNESS_SUCCESS, &[0.5, 0.25, 0.75]);
    rec.flush();
}

fn assert_everything(s: &RecordingSummary) {
    let has = |path: &str, component: &str| {
        let e = s
            .entities
            .get(path)
            .unwrap_or_else(|| panic!("{path} missing; have {:?}", s.entities.keys()));
        assert!(
            e.components.iter().any(|c| c.contains(component)),
            "{path}: no {component} in {:?}",
            e.components
        );
        e
    };
    has("/scene/goal", "LineStrips2D:strips");
    has("/scene/agent", "Points2D:positions");
    has("/scene/agent", "Points2D:radii");
    has("/scene/walls", "LineStrips2D:strips");
    has("/scene/bounds", "Boxes2D");
    has("/pixels", "Image");
    has("/scene/actions/predicted", "LineStrips2D:strips");
    has("/scene/actions/executed", "LineStrips2D:strips");
    has("/chain/x", "LineStrips2D:colors");
    let logp = has("/chain/logp", "Scalars:scalars");
    assert!(
        logp.timelines.contains("denoise_step") && logp.timelines.contains("env_step"),
        "{:?}",
        logp.timelines
    );
    has("/rewards/reward", "Scalars:scalars");
    has("/rewards/advantage", "Scalars:scalars");
    has("/groups/mean", "Scalars:scalars");
    has("/groups/std", "Scalars:scalars");
    has("/groups/zero_variance_frac", "Scalars:scalars");
    let loss = has("/train/loss/bc", "Scalars:scalars");
    assert_eq!(loss.timelines.iter().collect::<Vec<_>>(), ["train_step"]);
    has("/train/lr/lr", "Scalars:scalars");
    has("/eval/episodes", "TextLog:text");
    has("/log", "TextLog:level");
    has("/robustness/table", "TextDocument:media_type");
    has("/robustness/success_rate", "BarChart:values");
    // Unchanged shapes are logged once; moving ones every step.
    assert_eq!(s.rows("/scene/goal"), 1);
    assert_eq!(s.rows("/scene/walls"), 1);
    assert_eq!(s.rows("/scene/agent"), 3);
    assert_eq!(s.rows("/pixels"), 1);
    assert_eq!(s.rows("/chain/logp"), 2, "one row per denoising step");
    assert_eq!(s.rows("/rewards/reward"), 3);
    assert_eq!(s.rows("/train/loss/bc"), 10);
    assert!(s.blueprint_messages > 0, "the default blueprint is sent");
}

#[test]
fn memory_sink_receives_every_entity() {
    let (rec, storage) = RerunRecorder::memory().unwrap();
    log_everything(&rec);
    drop(rec);
    let s = RecordingSummary::from_messages(&storage.take()).unwrap();
    assert_everything(&s);
    let scene_paths: Vec<_> = s
        .entities
        .keys()
        .filter(|p| p.starts_with("/scene"))
        .collect();
    assert_eq!(
        scene_paths,
        [
            "/scene/actions/executed",
            "/scene/actions/predicted",
            "/scene/agent",
            "/scene/bounds",
            "/scene/goal",
            "/scene/walls"
        ]
    );
}

#[test]
fn off_records_nothing() {
    assert!(
        RerunRecorder::open(&RerunSink::Off, "t", Timeline::EnvStep)
            .unwrap()
            .is_none()
    );
    let r = NoRecorder;
    assert!(!r.enabled());
    log_everything(&r);
}

#[test]
fn clocks_tick_from_zero_and_follow_set_time() {
    let (rec, _storage) = RerunRecorder::memory().unwrap();
    assert!(rec.enabled());
    assert_eq!(rec.tick(Timeline::EnvStep), 0);
    assert_eq!(rec.tick(Timeline::EnvStep), 1);
    rec.set_time(Timeline::EnvStep, 10);
    assert_eq!(rec.tick(Timeline::EnvStep), 11);
    rec.finish();
    assert!(!rec.enabled(), "a finished recorder is off");
}

#[test]
fn saved_file_has_everything_and_a_footer() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("sub/dir/rec.rrd");
    let sink: RerunSink = format!("save={}", path.display()).parse().unwrap();
    let rec = RerunRecorder::open(&sink, "test", Timeline::EnvStep)
        .unwrap()
        .unwrap();
    log_everything(&rec);
    drop(rec);
    let s = read_rrd(&path).unwrap();
    assert!(s.footer, "dropping the recorder writes the footer");
    assert_everything(&s);
}

#[test]
fn finish_writes_the_footer_while_the_recorder_lives() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("rec.rrd");
    let rec = RerunRecorder::open(&RerunSink::Save(path.clone()), "test", Timeline::EnvStep)
        .unwrap()
        .unwrap();
    log_everything(&rec);
    rec.finish();
    let s = read_rrd(&path).unwrap();
    assert!(s.footer);
    assert_eq!(s.rows("/train/loss/bc"), 10);
    // Logging after finish neither fails nor reaches the file.
    rec.train_scalars(11, &[(Topic::Loss, "bc", 0.0)]);
    drop(rec);
    assert_eq!(read_rrd(&path).unwrap().rows("/train/loss/bc"), 10);
}

#[test]
fn unwritable_save_path_is_an_error_up_front() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let e = RerunRecorder::open(
        &RerunSink::Save(file.join("rec.rrd")),
        "t",
        Timeline::EnvStep,
    )
    .err()
    .expect("a path under a file cannot be written");
    assert!(matches!(e, VizError::Save { .. }), "{e}");
    assert!(e.to_string().contains("a-file"), "{e}");
}

#[test]
fn serve_on_a_taken_port_is_an_error_up_front() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let e = RerunRecorder::open(
        &format!("serve={port}").parse().unwrap(),
        "t",
        Timeline::EnvStep,
    )
    .err()
    .expect("the port is taken");
    assert!(e.to_string().contains(&port.to_string()), "{e}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Far longer than any unblocked logging or shutdown here takes, even on a loaded CI machine:
/// a deadlock guard that turns a blocked recorder into a failure instead of a hung test, not a
/// speed requirement.
const HANG: Duration = Duration::from_secs(120);

/// Logs `n` iterations as a training loop would, on another thread; hands the recorder back.
/// Panics if the logging never finishes.
fn log_n(rec: RerunRecorder, n: usize) -> RerunRecorder {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for _ in 0..n {
            log_everything(&rec);
        }
        let _ = tx.send(rec);
    });
    rx.recv_timeout(HANG)
        .unwrap_or_else(|_| panic!("logging {n} iterations blocked"))
}

/// Drops the recorder (flushes, closes the stream) on another thread; panics if that hangs.
fn shut_down(rec: RerunRecorder) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(rec);
        let _ = tx.send(());
    });
    rx.recv_timeout(HANG)
        .expect("shutting the recorder down hung");
}

#[test]
fn no_viewer_listening_never_blocks() {
    let port = free_port();
    let rec = RerunRecorder::open(
        &format!("connect=127.0.0.1:{port}").parse().unwrap(),
        "t",
        Timeline::EnvStep,
    )
    .unwrap()
    .unwrap();
    // Far more messages than Rerun's client queues (100) while it keeps trying to connect.
    let rec = log_n(rec, 500);
    shut_down(rec);
}

/// A TCP relay standing in for a viewer's network path: `kill` closes every connection and
/// stops listening, as a viewer process that exits does.
struct Relay {
    port: u16,
    conns: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// One message per connection relayed.
    connected: std::sync::mpsc::Receiver<()>,
}

impl Relay {
    fn start(upstream: u16) -> Self {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (c, st) = (conns.clone(), stop.clone());
        let (connected_tx, connected) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for down in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(down) = down else { continue };
                let up = std::net::TcpStream::connect(("127.0.0.1", upstream)).unwrap();
                let mut list = c.lock().unwrap();
                list.push(down.try_clone().unwrap());
                list.push(up.try_clone().unwrap());
                let _ = connected_tx.send(());
                for (mut from, mut to) in [
                    (down.try_clone().unwrap(), up.try_clone().unwrap()),
                    (up, down),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Self {
            port,
            conns,
            stop,
            connected,
        }
    }

    fn kill(&self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        // Wakes the accept loop so it sees `stop`.
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
    }
}

#[test]
fn a_viewer_that_goes_away_does_not_stop_the_caller() {
    let port = free_port();
    // Our own gRPC server stands in for the viewer (a viewer is such a server), behind a relay
    // whose connections we can cut.
    let _viewer = RerunRecorder::open(
        &format!("serve={port}").parse().unwrap(),
        "viewer",
        Timeline::EnvStep,
    )
    .unwrap()
    .unwrap();
    let relay = Relay::start(port);
    let rec = RerunRecorder::open(
        &format!("connect=127.0.0.1:{}", relay.port).parse().unwrap(),
        "t",
        Timeline::EnvStep,
    )
    .unwrap()
    .unwrap();
    let rec = log_n(rec, 10);
    relay
        .connected
        .recv_timeout(HANG)
        .expect("the recorder connected to the viewer");
    relay.kill();
    let rec = log_n(rec, 500);
    shut_down(rec);
}
