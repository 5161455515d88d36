//! Errors of the server and the client.

use std::fmt;

/// A request the server cannot answer: which field and why. Sent back as a text frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestError {
    /// The offending key (or `request` for the frame as a whole).
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl RequestError {
    /// An error about `field`.
    pub fn new(field: &str, message: impl Into<String>) -> Self {
        Self {
            field: field.to_owned(),
            message: message.into(),
        }
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for RequestError {}

/// Server and client failures.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Binding, accepting or talking over a socket.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The websocket layer.
    #[error("{what}: {source}")]
    WebSocket {
        /// What was being done.
        what: String,
        /// The cause.
        source: Box<tokio_tungstenite::tungstenite::Error>,
    },
    /// The server answered a request with an error text frame.
    #[error("the policy server refused the request: {0}")]
    Refused(String),
    /// The peer broke the protocol (unexpected frame, undecodable reply, closed connection).
    #[error("protocol: {0}")]
    Protocol(String),
    /// The policy failed on a batch.
    #[error("policy: {0}")]
    Policy(String),
    /// Invalid server or client settings.
    #[error("invalid setting {field}: {message}")]
    Config {
        /// The setting.
        field: String,
        /// Why.
        message: String,
    },
}

impl ServeError {
    pub(crate) fn ws(what: impl Into<String>, e: tokio_tungstenite::tungstenite::Error) -> Self {
        ServeError::WebSocket {
            what: what.into(),
            source: Box::new(e),
        }
    }

    pub(crate) fn io(what: impl Into<String>, e: std::io::Error) -> Self {
        ServeError::Io {
            what: what.into(),
            source: e,
        }
    }
}
