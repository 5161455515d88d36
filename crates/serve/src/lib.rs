//! A policy server for real robots: a tokio websocket server speaking the protocol of
//! `openpi-client` (`WebsocketClientPolicy`, PyPI openpi-client 0.1.2), and a Rust client.
//!
//! - [`msgpack`]: openpi's msgpack-numpy encoding.
//! - [`model`]: what is served ([`ActionModel`], [`PolicyRunner`] for diffrl checkpoints),
//!   request parsing and the metadata map.
//! - [`server`]: the server (batching, backpressure, API key, `/healthz`, graceful shutdown).
//! - [`client`]: the client used by `diffrl eval --remote` and the load benchmark.
#![warn(missing_docs)]

pub mod client;
pub mod error;
pub mod model;
pub mod msgpack;
pub mod server;

pub use client::{Client, Observation, Reply};
pub use error::{RequestError, ServeError};
pub use model::{ActionModel, ModelSpec, PolicyRunner};
pub use server::{ServeStats, Server, ServerConfig, shutdown_signal};
