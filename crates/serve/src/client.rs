//! A Rust client for the policy server (and for any openpi-protocol server).

use rmpv::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use futures_util::{SinkExt, StreamExt};

use crate::error::ServeError;
use crate::msgpack::{self, NdArray, get};

/// One observation to send: the newest state (or a window of them) and optional pixels.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observation {
    /// `observation.state` values.
    pub state: Vec<f32>,
    /// Its shape ([D] or [To, D]).
    pub state_shape: Vec<usize>,
    /// `observation.image` pixels (uint8) and shape ([H, W, C] or [To, H, W, C]).
    pub image: Option<(Vec<u8>, Vec<usize>)>,
    /// Task instruction (`prompt`), for language-conditioned policies.
    pub prompt: Option<String>,
    /// Noise seed for this request.
    pub seed: Option<u64>,
    /// Start of an episode: the server forgets this connection's observation window.
    pub reset: bool,
}

impl Observation {
    /// The request map in openpi's msgpack-numpy encoding.
    pub fn to_value(&self) -> Value {
        let mut m = vec![(
            Value::from("observation.state"),
            NdArray::from_f32(&self.state_shape, &self.state).to_value(),
        )];
        if let Some((px, shape)) = &self.image {
            let a = NdArray {
                shape: shape.clone(),
                dtype: msgpack::DType::Uint(1),
                data: px.clone(),
            };
            m.push((Value::from("observation.image"), a.to_value()));
        }
        if let Some(p) = &self.prompt {
            m.push((Value::from("prompt"), Value::from(p.as_str())));
        }
        if let Some(s) = self.seed {
            m.push((Value::from("seed"), Value::from(s)));
        }
        if self.reset {
            m.push((Value::from("reset"), Value::Boolean(true)));
        }
        Value::Map(m)
    }
}

/// A reply: actions [Ta, Da] and the server's timing.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// Row-major actions.
    pub actions: Vec<f32>,
    /// [Ta, Da].
    pub shape: [usize; 2],
    /// Time of the policy call that answered (ms), if the server says.
    pub infer_ms: Option<f64>,
    /// Requests in that policy call, if the server says.
    pub batch_size: Option<usize>,
}

/// A connected client.
pub struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    metadata: Value,
}

impl Client {
    /// Connects to `url` (`ws://host:port`), sending `Authorization: Api-Key <key>` when given,
    /// and reads the server's metadata.
    pub async fn connect(url: &str, api_key: Option<&str>) -> Result<Self, ServeError> {
        let mut req = url
            .into_client_request()
            .map_err(|e| ServeError::ws(format!("{url} is not a websocket URL"), e))?;
        if let Some(k) = api_key {
            let v =
                HeaderValue::from_str(&format!("Api-Key {k}")).map_err(|_| ServeError::Config {
                    field: "api_key".into(),
                    message: "holds characters a header cannot carry".into(),
                })?;
            req.headers_mut().insert("Authorization", v);
        }
        let config = WebSocketConfig::default().max_message_size(Some(256 << 20));
        let (mut ws, _) = tokio_tungstenite::connect_async_with_config(req, Some(config), true)
            .await
            .map_err(|e| match e {
                tungstenite::Error::Http(resp) => {
                    let body = resp
                        .body()
                        .as_ref()
                        .map(|b| String::from_utf8_lossy(b).trim().to_owned())
                        .unwrap_or_default();
                    ServeError::Refused(format!("{url} answered HTTP {}: {body}", resp.status()))
                }
                e => ServeError::ws(format!("connecting to {url}"), e),
            })?;
        let metadata = match ws.next().await {
            Some(Ok(Message::Binary(b))) => {
                msgpack::decode(&b).map_err(|e| ServeError::Protocol(format!("metadata: {e}")))?
            }
            other => {
                return Err(ServeError::Protocol(format!(
                    "expected the metadata map first, got {other:?}"
                )));
            }
        };
        Ok(Self { ws, metadata })
    }

    /// The metadata map the server sent on connect.
    pub fn metadata(&self) -> &Value {
        &self.metadata
    }

    /// An integer entry of the metadata (e.g. `action_horizon`).
    pub fn metadata_usize(&self, key: &str) -> Option<usize> {
        match &self.metadata {
            Value::Map(m) => get(m, key).and_then(Value::as_u64).map(|v| v as usize),
            _ => None,
        }
    }

    /// Sends raw bytes and returns the raw answer: `Ok(binary)` or `Err(Refused(text))`.
    pub async fn send_raw(&mut self, bytes: Vec<u8>) -> Result<Vec<u8>, ServeError> {
        self.ws
            .send(Message::binary(bytes))
            .await
            .map_err(|e| ServeError::ws("sending a request", e))?;
        loop {
            match self.ws.next().await {
                Some(Ok(Message::Binary(b))) => return Ok(b.to_vec()),
                Some(Ok(Message::Text(t))) => return Err(ServeError::Refused(t.to_string())),
                Some(Ok(Message::Close(f))) => {
                    return Err(ServeError::Protocol(format!(
                        "the server closed the connection{}",
                        f.map(|f| format!(": {}", f.reason)).unwrap_or_default()
                    )));
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(ServeError::ws("reading the reply", e)),
                None => {
                    return Err(ServeError::Protocol(
                        "the server closed the connection".into(),
                    ));
                }
            }
        }
    }

    /// Asks for actions.
    pub async fn infer(&mut self, obs: &Observation) -> Result<Reply, ServeError> {
        let bytes = self.send_raw(msgpack::encode(&obs.to_value())).await?;
        parse_reply(&bytes)
    }

    /// Closes the connection politely.
    pub async fn close(mut self) -> Result<(), ServeError> {
        self.ws
            .close(None)
            .await
            .map_err(|e| ServeError::ws("closing", e))
    }
}

/// Decodes a reply map.
pub fn parse_reply(bytes: &[u8]) -> Result<Reply, ServeError> {
    let v = msgpack::decode(bytes).map_err(|e| ServeError::Protocol(format!("reply: {e}")))?;
    let Value::Map(m) = &v else {
        return Err(ServeError::Protocol("the reply is not a map".into()));
    };
    let actions = get(m, "actions")
        .ok_or_else(|| ServeError::Protocol("the reply has no \"actions\"".into()))?;
    let (shape, values) =
        msgpack::numeric(actions, "actions").map_err(|e| ServeError::Protocol(e.to_string()))?;
    let shape: [usize; 2] = shape
        .try_into()
        .map_err(|s| ServeError::Protocol(format!("actions of shape {s:?}, expected [Ta, Da]")))?;
    let timing = match get(m, "server_timing") {
        Some(Value::Map(t)) => Some(t),
        _ => None,
    };
    Ok(Reply {
        actions: values.iter().map(|&x| x as f32).collect(),
        shape,
        infer_ms: timing
            .and_then(|t| get(t, "infer_ms"))
            .and_then(Value::as_f64),
        batch_size: timing
            .and_then(|t| get(t, "batch_size"))
            .and_then(Value::as_u64)
            .map(|b| b as usize),
    })
}
