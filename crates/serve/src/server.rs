//! The websocket server.
//!
//! Each connection: an HTTP request (`GET /healthz` answers 200; anything else must be a
//! websocket upgrade, with `Authorization: Api-Key KEY` when a key is set), then the metadata
//! map as one binary frame, then request/reply pairs: a binary msgpack map of observations in,
//! `{"actions": float32 [Ta, Da], "server_timing": {"infer_ms", "queue_ms", "batch_size"}}` out,
//! or a text frame that says what was wrong with the request; the connection stays usable.
//!
//! Requests from all connections go through one bounded queue (when it is full, connections
//! stop reading their sockets: backpressure) to one inference thread, which takes everything
//! queued (up to `max_batch`, waiting up to `batch_window` for more) into one policy call.
//! Every request draws its noise from its own stream, so batching never changes an answer.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use diffrl_core::seeding::{derive, rng};
use diffrl_policy::ObsBatch;
use futures_util::{SinkExt, StreamExt};
use rmpv::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message};

use crate::error::{RequestError, ServeError};
use crate::model::{ActionModel, ModelSpec, Window, metadata, parse_request};
use crate::msgpack::{self, NdArray};

/// Server settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Address to bind (loopback unless told otherwise).
    pub host: String,
    /// Port (openpi's default is 8000; 0 picks a free one).
    pub port: u16,
    /// When set, clients must send `Authorization: Api-Key <key>`.
    pub api_key: Option<String>,
    /// Most requests in one policy call (1 = no batching).
    pub max_batch: usize,
    /// How long the inference thread waits for more requests after the first (0 = take only
    /// what is already queued, adding no latency).
    pub batch_window: Duration,
    /// Requests waiting for the policy before connections stop reading (backpressure).
    pub queue: usize,
    /// Largest accepted message (bytes); bigger frames get a text error and close code 1009.
    pub max_message_bytes: usize,
    /// Connections served at once; more are answered HTTP 503.
    pub max_connections: usize,
    /// Root of the per-request noise seeds.
    pub seed: u64,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8000,
            api_key: None,
            max_batch: 64,
            batch_window: Duration::ZERO,
            queue: 256,
            max_message_bytes: 16 << 20,
            max_connections: 256,
            seed: 0,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

impl ServerConfig {
    fn validate(&self) -> Result<(), ServeError> {
        let bad = |field: &str, message: &str| {
            Err(ServeError::Config {
                field: field.into(),
                message: message.into(),
            })
        };
        if self.max_batch == 0 {
            return bad("max_batch", "must be at least 1 (1 = no batching)");
        }
        if self.queue == 0 {
            return bad("queue", "must be at least 1");
        }
        if self.max_message_bytes < 1024 {
            return bad("max_message_bytes", "must be at least 1 KiB");
        }
        if self.max_connections == 0 {
            return bad("max_connections", "must be at least 1");
        }
        if self.api_key.as_deref().is_some_and(str::is_empty) {
            return bad(
                "api_key",
                "is empty (leave it unset to accept every client)",
            );
        }
        Ok(())
    }
}

/// What a server did, returned when it stops.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServeStats {
    /// Websocket connections accepted.
    pub connections: u64,
    /// Requests answered with actions.
    pub answered: u64,
    /// Requests answered with an error text frame.
    pub refused: u64,
    /// Policy calls.
    pub batches: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    answered: AtomicU64,
    refused: AtomicU64,
}

struct Job {
    state: Vec<f32>,
    image: Option<Vec<u8>>,
    /// The request's instruction (checked already when the policy reads text).
    prompt: Option<String>,
    seed: u64,
    queued: Instant,
    reply: oneshot::Sender<Result<Answer, String>>,
}

struct Answer {
    actions: Vec<f32>,
    infer_ms: f64,
    queue_ms: f64,
    batch: usize,
}

struct Shared {
    cfg: ServerConfig,
    spec: ModelSpec,
    metadata: Vec<u8>,
    jobs: mpsc::Sender<Job>,
    counters: Counters,
    log: bool,
}

/// A bound server; [`Server::run`] serves until its shutdown future completes.
pub struct Server {
    listener: TcpListener,
    model: Box<dyn ActionModel>,
    cfg: ServerConfig,
    log: bool,
}

impl Server {
    /// Validates the settings and binds the address.
    pub async fn bind(cfg: ServerConfig, model: Box<dyn ActionModel>) -> Result<Self, ServeError> {
        cfg.validate()?;
        let addr = format!("{}:{}", cfg.host, cfg.port);
        let listener = TcpListener::bind(&addr)
            .await
            .map_err(|e| ServeError::io(format!("binding {addr}"), e))?;
        Ok(Self {
            listener,
            model,
            cfg,
            log: false,
        })
    }

    /// Logs connections and refused requests to stderr.
    pub fn with_log(mut self, on: bool) -> Self {
        self.log = on;
        self
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, ServeError> {
        self.listener
            .local_addr()
            .map_err(|e| ServeError::io("reading the bound address", e))
    }

    /// Serves until `shutdown` completes, then stops accepting, lets every connection finish
    /// its in-flight request, closes them (code 1001) and returns what was served.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<ServeStats, ServeError> {
        let Server {
            listener,
            model,
            cfg,
            log,
        } = self;
        let spec = model.spec().clone();
        let batching = Value::Map(vec![
            (Value::from("max_batch"), Value::from(cfg.max_batch)),
            (
                Value::from("window_ms"),
                Value::F64(cfg.batch_window.as_secs_f64() * 1e3),
            ),
        ]);
        let meta = msgpack::encode(&metadata(&spec, batching));
        let (jobs_tx, jobs_rx) = mpsc::channel(cfg.queue);
        let batches = Arc::new(AtomicU64::new(0));
        let inference = {
            let (max_batch, window) = (cfg.max_batch, cfg.batch_window);
            let batches = batches.clone();
            std::thread::Builder::new()
                .name("diffrl-inference".into())
                .spawn(move || inference_loop(model, jobs_rx, max_batch, window, &batches))
                .map_err(|e| ServeError::io("starting the inference thread", e))?
        };
        let shared = Arc::new(Shared {
            cfg,
            spec,
            metadata: meta,
            jobs: jobs_tx,
            counters: Counters::default(),
            log,
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut conns = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(x) => x,
                        Err(e) => {
                            // Out of file descriptors and the like: wait, keep serving the rest.
                            if log {
                                eprintln!("serve: accept failed: {e}");
                            }
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let _ = stream.set_nodelay(true);
                    let full = conns.len() >= shared.cfg.max_connections;
                    conns.spawn(connection(stream, peer, shared.clone(), stop_rx.clone(), full));
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
        drop(listener);
        let _ = stop_tx.send(true);
        let grace = shared.cfg.shutdown_grace;
        let drained =
            tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            conns.abort_all();
        }
        let c = &shared.counters;
        let mut stats = ServeStats {
            connections: c.connections.load(Ordering::Relaxed),
            answered: c.answered.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            batches: 0,
        };
        // The last job sender goes with `shared`; the inference thread then ends.
        drop(shared);
        tokio::task::spawn_blocking(move || inference.join())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or_else(|| ServeError::Policy("the inference thread panicked".into()))?;
        stats.batches = batches.load(Ordering::Relaxed);
        Ok(stats)
    }
}

fn inference_loop(
    mut model: Box<dyn ActionModel>,
    mut jobs: mpsc::Receiver<Job>,
    max_batch: usize,
    window: Duration,
    batches: &AtomicU64,
) {
    let spec = model.spec().clone();
    let (to, ta, da) = (spec.obs_horizon, spec.action_horizon, spec.action_dim);
    while let Some(first) = jobs.blocking_recv() {
        let mut batch = vec![first];
        let deadline = Instant::now() + window;
        while batch.len() < max_batch {
            match jobs.try_recv() {
                Ok(j) => batch.push(j),
                Err(mpsc::error::TryRecvError::Empty) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(50));
                }
                Err(_) => break,
            }
        }
        // Requests whose client has gone are dropped before they cost a policy row.
        batch.retain(|j| !j.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        let obs = ObsBatch {
            batch: batch.len(),
            state: batch.iter().flat_map(|j| j.state.iter().copied()).collect(),
            image: spec.image.map(|_| {
                batch
                    .iter()
                    .flat_map(|j| j.image.iter().flatten().copied())
                    .collect()
            }),
            text: spec.text.as_ref().map(|_| {
                batch
                    .iter()
                    .map(|j| j.prompt.clone().unwrap_or_default())
                    .collect()
            }),
        };
        debug_assert_eq!(obs.state.len(), batch.len() * to * spec.state_dim);
        let mut rngs: Vec<_> = batch.iter().map(|j| rng(j.seed)).collect();
        let start = Instant::now();
        let result = model.infer(&obs, &mut rngs);
        batches.fetch_add(1, Ordering::Relaxed);
        let infer_ms = start.elapsed().as_secs_f64() * 1e3;
        let n = batch.len();
        match result {
            Ok(actions) if actions.len() == n * ta * da => {
                for (j, chunk) in batch.into_iter().zip(actions.chunks(ta * da)) {
                    let queue_ms = (start - j.queued).as_secs_f64() * 1e3;
                    let _ = j.reply.send(Ok(Answer {
                        actions: chunk.to_vec(),
                        infer_ms,
                        queue_ms,
                        batch: n,
                    }));
                }
            }
            Ok(actions) => {
                let msg = format!(
                    "the policy returned {} values for {n} requests of {ta} x {da}",
                    actions.len()
                );
                for j in batch {
                    let _ = j.reply.send(Err(msg.clone()));
                }
            }
            Err(e) => {
                for j in batch {
                    let _ = j.reply.send(Err(e.clone()));
                }
            }
        }
    }
}

const MAX_HEAD: usize = 16 << 10;

/// Reads an HTTP request head; returns it and any bytes read past it.
async fn read_head(stream: &mut TcpStream) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(format!("request head longer than {MAX_HEAD} bytes"));
        }
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading the request: {e}"))?;
        if n == 0 {
            return Err("connection closed before the request was complete".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn http_reply(stream: &mut TcpStream, status: &str, body: &str) {
    let msg = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(msg.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Compares in time independent of where the strings differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

enum Handshake {
    Upgrade { key: String, rest: Vec<u8> },
    Answered,
}

async fn handshake(stream: &mut TcpStream, shared: &Shared, full: bool) -> Handshake {
    let (head, rest) = match tokio::time::timeout(Duration::from_secs(10), read_head(stream)).await
    {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => {
            http_reply(stream, "400 Bad Request", &format!("{e}\n")).await;
            return Handshake::Answered;
        }
        Err(_) => {
            http_reply(stream, "408 Request Timeout", "no request within 10 s\n").await;
            return Handshake::Answered;
        }
    };
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    if !matches!(req.parse(&head), Ok(httparse::Status::Complete(_))) {
        http_reply(stream, "400 Bad Request", "malformed HTTP request\n").await;
        return Handshake::Answered;
    }
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_owned())
    };
    let path = req.path.unwrap_or("/");
    let upgrade = header("upgrade").is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
    if !upgrade {
        let (status, body) = match (req.method, path) {
            (Some("GET"), "/healthz") => ("200 OK", "ok\n".to_string()),
            _ => (
                "400 Bad Request",
                format!(
                    "this is a diffrl policy server for {}: connect with a websocket client \
                     (openpi-client's WebsocketClientPolicy), or GET /healthz\n",
                    shared.spec.name
                ),
            ),
        };
        http_reply(stream, status, &body).await;
        return Handshake::Answered;
    }
    if let Some(want) = &shared.cfg.api_key {
        let got = header("authorization").unwrap_or_default();
        let ok = got
            .strip_prefix("Api-Key ")
            .is_some_and(|k| same_secret(k.trim().as_bytes(), want.as_bytes()));
        if !ok {
            let body = if got.is_empty() {
                "this server needs an API key: send the header `Authorization: Api-Key <key>` \
                 (openpi-client: WebsocketClientPolicy(..., api_key=...))\n"
            } else {
                "wrong API key\n"
            };
            http_reply(stream, "401 Unauthorized", body).await;
            return Handshake::Answered;
        }
    }
    if full {
        http_reply(
            stream,
            "503 Service Unavailable",
            &format!(
                "the server already has {} connections (--max-connections); retry later\n",
                shared.cfg.max_connections
            ),
        )
        .await;
        return Handshake::Answered;
    }
    match (header("sec-websocket-key"), header("sec-websocket-version")) {
        (Some(key), Some(v)) if v == "13" => Handshake::Upgrade { key, rest },
        _ => {
            http_reply(
                stream,
                "400 Bad Request",
                "websocket upgrade without Sec-WebSocket-Key or with a version other than 13\n",
            )
            .await;
            Handshake::Answered
        }
    }
}

async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    full: bool,
) {
    let (key, rest) = match handshake(&mut stream, &shared, full).await {
        Handshake::Upgrade { key, rest } => (key, rest),
        Handshake::Answered => return,
    };
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    let response = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
    );
    if stream.write_all(response.as_bytes()).await.is_err() {
        return;
    }
    let limit = shared.cfg.max_message_bytes;
    let config = WebSocketConfig::default()
        .max_message_size(Some(limit))
        .max_frame_size(Some(limit));
    let mut ws =
        WebSocketStream::from_partially_read(stream, rest, Role::Server, Some(config)).await;
    shared.counters.connections.fetch_add(1, Ordering::Relaxed);
    if shared.log {
        eprintln!("serve: {peer} connected");
    }
    if ws
        .send(Message::binary(shared.metadata.clone()))
        .await
        .is_err()
    {
        return;
    }
    let mut window = Window::default();
    let mut requests = 0u64;
    loop {
        let msg = tokio::select! {
            m = ws.next() => m,
            _ = stop.changed() => {
                let _ = ws.close(Some(CloseFrame {
                    code: CloseCode::Away,
                    reason: "the policy server is shutting down".into(),
                })).await;
                break;
            }
        };
        let reply = match msg {
            None | Some(Ok(Message::Close(_))) => break,
            Some(Ok(Message::Binary(bytes))) => {
                match answer(&bytes, &shared, &mut window, &mut requests).await {
                    Ok(reply) => {
                        shared.counters.answered.fetch_add(1, Ordering::Relaxed);
                        Message::binary(reply)
                    }
                    Err(e) => {
                        shared.counters.refused.fetch_add(1, Ordering::Relaxed);
                        if shared.log {
                            eprintln!("serve: {peer}: refused: {e}");
                        }
                        Message::text(e)
                    }
                }
            }
            Some(Ok(Message::Text(_))) => {
                shared.counters.refused.fetch_add(1, Ordering::Relaxed);
                Message::text(
                    "request: expected a binary frame holding a msgpack map (openpi's \
                     msgpack-numpy), got a text frame",
                )
            }
            Some(Ok(_)) => continue,
            Some(Err(tungstenite::Error::Capacity(e))) => {
                shared.counters.refused.fetch_add(1, Ordering::Relaxed);
                let text = format!(
                    "request: {e}; this server accepts messages up to {limit} bytes \
                     (diffrl serve --max-message-mb); closing the connection"
                );
                if shared.log {
                    eprintln!("serve: {peer}: {text}");
                }
                let _ = ws.send(Message::text(text)).await;
                let _ = ws
                    .close(Some(CloseFrame {
                        code: CloseCode::Size,
                        reason: "message too big".into(),
                    }))
                    .await;
                // The rest of the frame is still arriving: closing the socket on unread data
                // makes the kernel send a reset, which can destroy our error before the client
                // reads it. Finish our side, then swallow what comes until the client closes.
                let mut tcp = ws.into_inner();
                let _ = tcp.shutdown().await;
                let _ = tokio::time::timeout(Duration::from_secs(5), async {
                    let mut sink = [0u8; 16 << 10];
                    while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {}
                })
                .await;
                return;
            }
            Some(Err(e)) => {
                if shared.log {
                    eprintln!("serve: {peer}: {e}");
                }
                break;
            }
        };
        if ws.send(reply).await.is_err() {
            break;
        }
    }
    if shared.log {
        eprintln!("serve: {peer} disconnected");
    }
}

/// Parses, queues and waits for one request; the error string is the text frame to send.
async fn answer(
    bytes: &[u8],
    shared: &Shared,
    window: &mut Window,
    requests: &mut u64,
) -> Result<Vec<u8>, String> {
    let value = msgpack::decode(bytes).map_err(|e| e.to_string())?;
    let req = parse_request(&value, &shared.spec).map_err(|e| e.to_string())?;
    let seed = req
        .seed
        .unwrap_or_else(|| derive(shared.cfg.seed, *requests));
    *requests += 1;
    let prompt = req.prompt.clone();
    let (state, image) = window.push(req, shared.spec.obs_horizon);
    let (tx, rx) = oneshot::channel();
    let job = Job {
        state,
        image,
        prompt,
        seed,
        queued: Instant::now(),
        reply: tx,
    };
    shared
        .jobs
        .send(job)
        .await
        .map_err(|_| RequestError::new("server", "the policy is shutting down").to_string())?;
    let a = rx
        .await
        .map_err(|_| "server: the inference thread stopped".to_string())?
        .map_err(|e| format!("policy: {e}"))?;
    let timing = Value::Map(vec![
        (Value::from("infer_ms"), Value::F64(a.infer_ms)),
        (Value::from("queue_ms"), Value::F64(a.queue_ms)),
        (Value::from("batch_size"), Value::from(a.batch)),
    ]);
    let spec = &shared.spec;
    let reply = Value::Map(vec![
        (
            Value::from("actions"),
            NdArray::from_f32(&[spec.action_horizon, spec.action_dim], &a.actions).to_value(),
        ),
        (Value::from("server_timing"), timing),
    ]);
    Ok(msgpack::encode(&reply))
}

/// Completes on Ctrl-C (SIGINT) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
