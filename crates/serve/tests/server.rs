//! The server end to end on loopback: answers equal in-process inference whatever the
//! batching, bad requests get text frames and the connection lives on, clients that vanish do
//! not disturb others, API keys, /healthz, graceful shutdown.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use diffrl_core::normalize::Normalizer;
use diffrl_core::seeding::{Rng, derive, rng};
use diffrl_policy::config::{DenoiserConfig, DiffusionConfig, PolicyConfig, TextEncoderConfig};
use diffrl_policy::{
    CpuBackend, Normalizers, ObsBatch, Policy, PolicySpec, SampleMode, Vocabulary,
};
use diffrl_serve::msgpack::{self, NdArray};
use diffrl_serve::{
    ActionModel, Client, ModelSpec, Observation, PolicyRunner, ServeError, ServeStats, Server,
    ServerConfig,
};
use rmpv::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// A small diffusion policy: To 2, Ds 3, Tp 4, Ta 2, Da 2, K = 3.
fn tiny_policy() -> Policy<CpuBackend> {
    let config = PolicyConfig {
        obs_horizon: 2,
        pred_horizon: 4,
        action_horizon: 2,
        denoiser: DenoiserConfig {
            hidden: 16,
            blocks: 1,
            step_embed_dim: 8,
            ..DenoiserConfig::default()
        },
        diffusion: DiffusionConfig {
            train_steps: 6,
            denoising_steps: 3,
            ..DiffusionConfig::default()
        },
        ..PolicyConfig::default()
    };
    let spec = PolicySpec::flat(3, 2);
    let norm = Normalizers {
        state: Normalizer::MinMax {
            min: vec![0.0; 3],
            max: vec![10.0; 3],
        },
        action: Normalizer::MinMax {
            min: vec![0.0; 2],
            max: vec![100.0; 2],
        },
    };
    Policy::new(config, spec, norm, 3, &Default::default()).unwrap()
}

/// [`tiny_policy`] reading an instruction over the words of "stack the red cube" and "stack the
/// blue cube".
fn tiny_text_policy() -> Policy<CpuBackend> {
    let p = tiny_policy();
    let mut config = p.config.clone();
    config.encoder.text = TextEncoderConfig {
        max_tokens: 5,
        d_model: 8,
        heads: 2,
        ff_dim: 16,
        out_dim: 4,
        ..TextEncoderConfig::default()
    };
    let vocab = Vocabulary::from_texts(["stack the red cube", "stack the blue cube"]);
    let spec = PolicySpec {
        text: true,
        ..p.spec
    };
    // Seed 11: the untrained network's first actions stay inside the action bounds for both
    // prompts (with some seeds they saturate at a bound, and the prompts cannot differ there).
    Policy::with_text(config, spec, p.norm, vocab, 11, &Default::default()).unwrap()
}

/// Wraps a model so the test decides when each call runs: a call announces itself on
/// `entered`, then waits for a token on `release` (no sleeps, no timing windows).
struct Gated<M> {
    inner: M,
    calls: Arc<AtomicUsize>,
    entered: mpsc::UnboundedSender<()>,
    release: mpsc::UnboundedReceiver<()>,
}

impl<M: ActionModel> ActionModel for Gated<M> {
    fn spec(&self) -> &ModelSpec {
        self.inner.spec()
    }
    fn infer(&mut self, obs: &ObsBatch, rngs: &mut [Rng]) -> Result<Vec<f32>, String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let _ = self.entered.send(());
        // The inference thread is a plain thread: block until the test lets the call finish.
        self.release
            .blocking_recv()
            .ok_or("the test dropped the gate")?;
        self.inner.infer(obs, rngs)
    }
}

/// The gate's test side: when a call has entered the model, and letting one finish.
struct Gate {
    calls: Arc<AtomicUsize>,
    entered: mpsc::UnboundedReceiver<()>,
    release: mpsc::UnboundedSender<()>,
}

impl Gate {
    /// Waits until a call is inside the model.
    async fn entered(&mut self) {
        self.entered.recv().await.expect("the model is alive");
    }
    /// Lets the call inside the model finish.
    fn release(&self) {
        self.release.send(()).expect("the model is alive");
    }
    /// Waits for the next call and lets it finish.
    async fn pass_one(&mut self) {
        self.entered().await;
        self.release();
    }
}

fn gated<M: ActionModel>(inner: M) -> (Gated<M>, Gate) {
    let calls = Arc::new(AtomicUsize::new(0));
    let (entered_tx, entered_rx) = mpsc::unbounded_channel();
    let (release_tx, release_rx) = mpsc::unbounded_channel();
    let model = Gated {
        inner,
        calls: calls.clone(),
        entered: entered_tx,
        release: release_rx,
    };
    let gate = Gate {
        calls,
        entered: entered_rx,
        release: release_tx,
    };
    (model, gate)
}

fn runner(mode: SampleMode) -> PolicyRunner<CpuBackend> {
    PolicyRunner::new(tiny_policy(), Default::default(), mode, "tiny".into(), 10.0)
}

struct Running {
    url: String,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<ServeStats, ServeError>>,
}

impl Running {
    async fn stop(self) -> ServeStats {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap()
    }
}

async fn start(cfg: ServerConfig, model: Box<dyn ActionModel>) -> Running {
    let server = Server::bind(ServerConfig { port: 0, ..cfg }, model)
        .await
        .unwrap();
    let url = format!("ws://{}", server.local_addr().unwrap());
    let (stop, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    Running { url, stop, task }
}

fn state(client: usize, k: usize) -> Vec<f32> {
    (0..3)
        .map(|d| ((client * 7 + k * 3 + d) % 10) as f32)
        .collect()
}

/// What the policy answers in-process for a window of states and a noise seed: first Ta of Tp.
fn in_process(
    policy: &Policy<CpuBackend>,
    window: &[f32],
    seed: u64,
    mode: SampleMode,
) -> Vec<f32> {
    let obs = ObsBatch {
        batch: 1,
        state: window.to_vec(),
        image: None,
        text: None,
    };
    let act = policy
        .act_rows(&obs, mode, &mut [rng(seed)], &Default::default())
        .unwrap();
    act.actions[..2 * 2].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_get_the_in_process_answers() {
    for mode in [SampleMode::Deterministic, SampleMode::Stochastic] {
        let cfg = ServerConfig {
            seed: 11,
            max_batch: 64,
            batch_window: Duration::from_millis(20),
            ..ServerConfig::default()
        };
        let server = start(cfg, Box::new(runner(mode))).await;
        let clients = 6;
        let requests = 5;
        let barrier = Arc::new(tokio::sync::Barrier::new(clients));
        let mut tasks = Vec::new();
        for c in 0..clients {
            let (url, barrier) = (server.url.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let mut client = Client::connect(&url, None).await.unwrap();
                assert_eq!(client.metadata_usize("action_horizon"), Some(2));
                assert_eq!(client.metadata_usize("obs_horizon"), Some(2));
                let mut replies = Vec::new();
                for k in 0..requests {
                    barrier.wait().await;
                    let obs = Observation {
                        state: state(c, k),
                        state_shape: vec![3],
                        ..Observation::default()
                    };
                    replies.push(client.infer(&obs).await.unwrap());
                }
                replies
            }));
        }
        let policy = tiny_policy();
        let mut biggest = 0;
        for (c, t) in tasks.into_iter().enumerate() {
            let replies = t.await.unwrap();
            for (k, r) in replies.iter().enumerate() {
                assert_eq!(r.shape, [2, 2]);
                // The server stacks single observations into the window (first one repeated).
                let window = [state(c, k.saturating_sub(1)), state(c, k)].concat();
                let want = in_process(&policy, &window, derive(11, k as u64), mode);
                for (a, b) in r.actions.iter().zip(&want) {
                    assert!(
                        (a - b).abs() < 1e-4,
                        "{mode:?} client {c} request {k}: {a} vs {b}"
                    );
                }
                biggest = biggest.max(r.batch_size.unwrap());
            }
        }
        assert!(
            biggest > 1,
            "requests that arrive together share a policy call"
        );
        let stats = server.stop().await;
        assert_eq!(stats.answered, (clients * requests) as u64);
        assert_eq!(stats.refused, 0);
        assert!(stats.batches < stats.answered);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_seeds_and_windows_are_honoured() {
    let server = start(
        ServerConfig::default(),
        Box::new(runner(SampleMode::Deterministic)),
    )
    .await;
    let mut client = Client::connect(&server.url, None).await.unwrap();
    let window = [state(0, 0), state(0, 1)].concat();
    let obs = Observation {
        state: window.clone(),
        state_shape: vec![2, 3],
        seed: Some(99),
        ..Observation::default()
    };
    let r = client.infer(&obs).await.unwrap();
    assert_eq!(
        r.actions,
        in_process(&tiny_policy(), &window, 99, SampleMode::Deterministic)
    );
    server.stop().await;
}

/// A language-conditioned policy acts on the request's `prompt` (as in process) and refuses
/// requests whose prompt it cannot read, naming the problem; the connection lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_policy_reads_the_prompt_and_refuses_bad_ones() {
    let policy = tiny_text_policy();
    let model = PolicyRunner::new(
        tiny_text_policy(),
        Default::default(),
        SampleMode::Deterministic,
        "text".into(),
        10.0,
    );
    let server = start(ServerConfig::default(), Box::new(model)).await;
    let mut client = Client::connect(&server.url, None).await.unwrap();
    let vocabulary = msgpack::get(
        match client.metadata() {
            Value::Map(m) => m,
            other => panic!("metadata {other:?}"),
        },
        "observation",
    )
    .map(|o| format!("{o}"))
    .unwrap_or_default();
    assert!(
        vocabulary.contains("prompt") && vocabulary.contains("blue"),
        "{vocabulary}"
    );
    let window = [state(0, 0), state(0, 1)].concat();
    let ask = |prompt: Option<&str>| Observation {
        state: window.clone(),
        state_shape: vec![2, 3],
        seed: Some(5),
        prompt: prompt.map(str::to_owned),
        ..Observation::default()
    };
    let in_process = |prompt: &str| {
        let obs = ObsBatch {
            batch: 1,
            state: window.clone(),
            image: None,
            text: Some(vec![prompt.into()]),
        };
        policy
            .act_rows(
                &obs,
                SampleMode::Deterministic,
                &mut [rng(5)],
                &Default::default(),
            )
            .unwrap()
            .actions
    };
    let red = client
        .infer(&ask(Some("Stack the red cube.")))
        .await
        .unwrap();
    let blue = client
        .infer(&ask(Some("stack the blue cube")))
        .await
        .unwrap();
    for (r, want) in [
        (&red, in_process("stack the red cube")),
        (&blue, in_process("stack the blue cube")),
    ] {
        for (a, b) in r.actions.iter().zip(&want) {
            assert!((a - b).abs() < 1e-4, "{:?} vs {want:?}", r.actions);
        }
    }
    assert_ne!(red.actions, blue.actions, "the prompt reaches the policy");
    for (prompt, needle) in [
        (None, "prompt: required"),
        (Some(""), "empty"),
        (Some("stack the green cube"), "unknown word(s) 'green'"),
        (
            Some("stack the red cube on the blue cube"),
            "max_tokens = 5",
        ),
    ] {
        match client.infer(&ask(prompt)).await {
            Err(ServeError::Refused(text)) => {
                assert!(text.contains(needle), "{needle:?} in {text:?}");
            }
            other => panic!("{prompt:?}: expected a refusal, got {other:?}"),
        }
    }
    assert!(client.infer(&ask(Some("stack the red cube"))).await.is_ok());
    let stats = server.stop().await;
    assert_eq!((stats.answered, stats.refused), (3, 4));
}

/// Sends raw bytes and expects a text frame containing `needle`.
async fn refused(client: &mut Client, bytes: Vec<u8>, needle: &str) {
    match client.send_raw(bytes).await {
        Err(ServeError::Refused(text)) => assert!(text.contains(needle), "{needle:?} in {text:?}"),
        other => panic!("expected a refusal mentioning {needle:?}, got {other:?}"),
    }
}

fn request(entries: Vec<(&str, Value)>) -> Vec<u8> {
    msgpack::encode(&Value::Map(
        entries
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_text_frames_and_the_connection_lives_on() {
    let cfg = ServerConfig {
        max_message_bytes: 4096,
        ..ServerConfig::default()
    };
    let server = start(cfg, Box::new(runner(SampleMode::Deterministic))).await;
    let mut client = Client::connect(&server.url, None).await.unwrap();
    let good = Observation {
        state: state(1, 1),
        state_shape: vec![3],
        ..Observation::default()
    };
    refused(&mut client, vec![0x92, 0x01], "not valid msgpack").await;
    refused(
        &mut client,
        request(vec![(
            "observation.state",
            NdArray::from_f32(&[4], &[0.0; 4]).to_value(),
        )]),
        "[4]",
    )
    .await;
    refused(
        &mut client,
        request(vec![(
            "observation.state",
            NdArray::from_f32(&[3], &[0.0, f32::NAN, 0.0]).to_value(),
        )]),
        "NaN",
    )
    .await;
    refused(
        &mut client,
        request(vec![("obs", Value::from(1)), ("camera", Value::from(2))]),
        "unknown keys received: obs, camera",
    )
    .await;
    assert!(client.infer(&good).await.is_ok(), "still serving");
    // An oversized frame: a clear text error, then close code 1009; other clients carry on.
    let mut other = Client::connect(&server.url, None).await.unwrap();
    let big = request(vec![("pad", Value::Binary(vec![0; 10_000]))]);
    refused(&mut client, big, "4096 bytes").await;
    assert!(
        client.infer(&good).await.is_err(),
        "closed after the oversized frame"
    );
    assert!(other.infer(&good).await.is_ok());
    let stats = server.stop().await;
    assert_eq!(stats.refused, 5);
    assert_eq!(stats.answered, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_vanishes_mid_request_does_not_disturb_the_others() {
    let (model, mut gate) = gated(runner(SampleMode::Deterministic));
    let server = start(ServerConfig::default(), Box::new(model)).await;
    let obs = Observation {
        state: state(2, 0),
        state_shape: vec![3],
        ..Observation::default()
    };
    let mut stayer = Client::connect(&server.url, None).await.unwrap();
    let (first, ()) = tokio::join!(stayer.infer(&obs), gate.pass_one());
    let first = first.unwrap();
    for _ in 0..3 {
        let mut leaver = Client::connect(&server.url, None).await.unwrap();
        let mine = obs.clone();
        let pending = tokio::spawn(async move { leaver.infer(&mine).await });
        // The policy is busy with the leaver's request: drop its connection now.
        gate.entered().await;
        pending.abort();
        assert!(pending.await.unwrap_err().is_cancelled());
        gate.release();
        let (again, ()) = tokio::join!(stayer.infer(&obs), gate.pass_one());
        assert_eq!(again.unwrap().shape, first.shape);
    }
    let stats = server.stop().await;
    assert_eq!(stats.refused, 0);
    assert_eq!(
        gate.calls.load(Ordering::SeqCst),
        7,
        "every request ran once"
    );
    assert!(stats.answered >= 4, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_healthz_and_plain_http() {
    let cfg = ServerConfig {
        api_key: Some("s3cret".into()),
        ..ServerConfig::default()
    };
    let server = start(cfg, Box::new(runner(SampleMode::Deterministic))).await;
    match Client::connect(&server.url, None).await {
        Err(ServeError::Refused(m)) => assert!(m.contains("401") && m.contains("Api-Key"), "{m}"),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    match Client::connect(&server.url, Some("wrong")).await {
        Err(ServeError::Refused(m)) => assert!(m.contains("wrong API key"), "{m}"),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    let mut ok = Client::connect(&server.url, Some("s3cret")).await.unwrap();
    let obs = Observation {
        state: state(0, 0),
        state_shape: vec![3],
        ..Observation::default()
    };
    assert!(ok.infer(&obs).await.is_ok());
    let addr = server.url.trim_start_matches("ws://").to_string();
    let http = |req: &'static str| {
        let addr = addr.clone();
        async move {
            let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        }
    };
    let health = http("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"),
        "{health}"
    );
    let other = http("GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(
        other.starts_with("HTTP/1.1 400") && other.contains("websocket"),
        "{other}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_in_flight_requests_and_a_full_queue_only_slows_clients() {
    let (model, mut gate) = gated(runner(SampleMode::Deterministic));
    let cfg = ServerConfig {
        port: 0,
        queue: 1,
        max_batch: 1,
        ..ServerConfig::default()
    };
    let server = Server::bind(cfg, Box::new(model)).await.unwrap();
    let url = format!("ws://{}", server.local_addr().unwrap());
    // The shutdown future tells the test when the server has stopped accepting.
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let (stopping_tx, stopping_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = stop_rx.await;
        let _ = stopping_tx.send(());
    }));
    let mut tasks = Vec::new();
    for c in 0..8 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = Client::connect(&url, None).await.unwrap();
            let obs = Observation {
                state: state(c, 0),
                state_shape: vec![3],
                ..Observation::default()
            };
            client.infer(&obs).await
        }));
    }
    // Behind a queue of one, requests wait their turn; none is refused.
    for _ in 0..7 {
        gate.pass_one().await;
    }
    // The last request is inside the policy when the server is told to stop.
    gate.entered().await;
    stop_tx.send(()).unwrap();
    stopping_rx.await.unwrap();
    gate.release();
    let stats = task.await.unwrap().unwrap();
    for t in tasks {
        assert!(
            t.await.unwrap().is_ok(),
            "every request in flight was answered"
        );
    }
    assert_eq!(stats.answered, 8);
    assert_eq!(stats.refused, 0);
    assert_eq!(
        gate.calls.load(Ordering::SeqCst),
        8,
        "no batching with max_batch = 1"
    );
}

#[tokio::test]
async fn bad_settings_are_refused_before_binding() {
    let e = Server::bind(
        ServerConfig {
            max_batch: 0,
            port: 0,
            ..ServerConfig::default()
        },
        Box::new(runner(SampleMode::Deterministic)),
    )
    .await
    .err()
    .unwrap();
    assert!(e.to_string().contains("max_batch"), "{e}");
}
