//! tandem-server: the HTTP server (hyper 1, HTTP/1.1 on tokio). OpenAI-compatible
//! `/v1/completions` and `/v1/chat/completions` (whole or streamed as server-sent events),
//! `/generate`, `/v1/models`, `/health` and Prometheus `/metrics`.
//!
//! Code map:
//! - [`server`]: the listener, connections, graceful shutdown; [`serve`] and [`Server`].
//! - [`router`]: routes, API key, body limits.
//! - [`openai`]: request parsing and the response and chunk formats.
//! - [`params`]: sampling fields, type- and range-checked.
//! - [`run`]: one request's engine submissions, merged; aborts them when dropped.
//! - [`body`]: the response body, whole or streamed.
//! - [`metrics`]: vLLM-named metrics in the Prometheus text format.
//! - [`test_support`]: a tiny tokenizer for tests, examples and benchmarks.
//! - [`engine_client`]: the narrow interface to the engine; [`engine_adapter`] implements it for
//!   `tandem_engine`.
//!
//! Architecture invariant: this is the only crate that knows HTTP and JSON; nothing of either
//! crosses [`engine_client::EngineClient`].

pub mod body;
pub mod config;
pub mod engine_adapter;
pub mod engine_client;
pub mod error;
pub mod metrics;
pub mod openai;
pub mod params;
pub mod router;
pub mod run;
pub mod server;
pub mod test_support;

pub use config::ServerConfig;
pub use engine_client::EngineClient;
pub use error::ApiError;
pub use server::{serve, shutdown_signal, AppState, Server};
