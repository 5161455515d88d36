//! A gRPC sink that never holds training up when the viewer is not there.
//!
//! Rerun's `GrpcSink` queues at most 100 messages while it is (re)trying to connect, and then
//! blocks the sender; Rerun's batcher in turn blocks `log` calls once its byte quota fills. A
//! viewer that never comes up would therefore stall training after a few seconds. This sink
//! hands messages to the inner sink only while it is connected, keeps a bounded backlog while it
//! connects (the first messages, which describe the recording and its blueprint, are always
//! kept), and drops everything once the connection is lost (the inner sink never reconnects).
//! Each of the two situations prints one warning.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rerun::log::LogMsg;
use rerun::sink::{GrpcSink, GrpcSinkConnectionState, LogSink, SinkFlushError};

/// Messages kept from the start of the stream whatever happens (store info, blueprint).
const HEAD: usize = 64;
/// Messages kept while connecting, after the head; older ones are dropped first.
const BACKLOG: usize = 4096;
/// How long a connection may take before the first warning.
const PATIENCE: Duration = Duration::from_secs(3);

#[derive(Default)]
struct Pending {
    head: Vec<LogMsg>,
    tail: VecDeque<LogMsg>,
    dropped: usize,
}

/// See the module docs.
pub(crate) struct GuardedGrpcSink {
    inner: GrpcSink,
    url: String,
    pending: Mutex<Pending>,
    sent_any: AtomicBool,
    warned_connect: AtomicBool,
    warned_lost: AtomicBool,
}

impl GuardedGrpcSink {
    /// A sink streaming to the viewer at `url` (a `rerun+http://HOST:PORT/proxy` URL).
    pub(crate) fn new(url: &str) -> Result<Self, String> {
        let uri = match url.parse::<rerun::external::re_uri::RedapUri>() {
            Ok(rerun::external::re_uri::RedapUri::Proxy(u)) => u,
            Ok(_) => return Err(format!("{url} is not a viewer's proxy endpoint")),
            Err(e) => return Err(format!("{url}: {e}")),
        };
        // Say at once when nobody listens, rather than after PATIENCE (a short run would end
        // before that without a word).
        let addr = format!("{}:{}", uri.origin.host, uri.origin.port);
        let listening = std::net::ToSocketAddrs::to_socket_addrs(&addr)
            .ok()
            .into_iter()
            .flatten()
            .any(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_ok());
        let sink = Self {
            inner: GrpcSink::new(uri),
            url: url.to_string(),
            pending: Mutex::new(Pending::default()),
            sent_any: AtomicBool::new(false),
            warned_connect: AtomicBool::new(false),
            warned_lost: AtomicBool::new(false),
        };
        if !listening {
            sink.warn_connect();
        }
        Ok(sink)
    }

    fn warn_connect(&self) {
        if !self.warned_connect.swap(true, Ordering::Relaxed) {
            eprintln!(
                "warning: rerun: no viewer at {} (start one with `rerun`); training continues, \
                 the recording is held back (latest {BACKLOG} messages) until one connects",
                self.url
            );
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sends the backlog (connected only).
    fn drain(&self, p: &mut Pending) {
        for m in p.head.drain(..).chain(p.tail.drain(..)) {
            self.inner.send(m);
        }
    }

    fn warn_lost(&self) {
        if !self.warned_lost.swap(true, Ordering::Relaxed) {
            eprintln!(
                "warning: rerun: the viewer at {} is gone; training continues, the rest of \
                 this recording is not sent",
                self.url
            );
        }
    }
}

impl LogSink for GuardedGrpcSink {
    fn send(&self, msg: LogMsg) {
        match self.inner.status() {
            GrpcSinkConnectionState::Connected => {
                let mut p = self.lock();
                if !p.head.is_empty() || !p.tail.is_empty() {
                    self.drain(&mut p);
                }
                drop(p);
                self.sent_any.store(true, Ordering::Relaxed);
                self.inner.send(msg);
            }
            GrpcSinkConnectionState::Connecting { started } => {
                if self.sent_any.load(Ordering::Relaxed) {
                    // Rerun's client does not reconnect once connected; treat as lost.
                    self.warn_lost();
                    return;
                }
                if started.elapsed() > PATIENCE {
                    self.warn_connect();
                }
                let mut p = self.lock();
                if p.head.len() < HEAD {
                    p.head.push(msg);
                } else {
                    if p.tail.len() == BACKLOG {
                        p.tail.pop_front();
                        p.dropped += 1;
                    }
                    p.tail.push_back(msg);
                }
            }
            GrpcSinkConnectionState::Disconnected(_) => {
                self.warn_lost();
                let mut p = self.lock();
                p.head.clear();
                p.tail.clear();
            }
        }
    }

    fn flush_blocking(&self, timeout: Duration) -> Result<(), SinkFlushError> {
        match self.inner.status() {
            GrpcSinkConnectionState::Connected => {
                {
                    let mut p = self.lock();
                    self.drain(&mut p);
                }
                self.inner.flush_blocking(timeout)
            }
            GrpcSinkConnectionState::Connecting { .. } => Err(SinkFlushError::failed(format!(
                "not connected to the viewer at {}",
                self.url
            ))),
            GrpcSinkConnectionState::Disconnected(_) => Err(SinkFlushError::failed(format!(
                "the viewer at {} is gone",
                self.url
            ))),
        }
    }

    fn default_batcher_config(&self) -> rerun::log::ChunkBatcherConfig {
        self.inner.default_batcher_config()
    }
}
