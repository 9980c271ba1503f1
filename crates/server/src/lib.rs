//! tandem-server: the HTTP server (hyper 1, HTTP/1.1 on tokio). OpenAI-compatible
//! `/v1/completions` and `/v1/chat/completions` (whole or streamed as server-sent events),
//! OpenAI's Responses API (`/v1/responses`), Anthropic's `/v1/messages` and
//! `/v1/messages/count_tokens`,
//! `/generate`, `/v1/models`, vLLM's `/tokenize`, `/detokenize` and `/version`, `/health` and
//! Prometheus `/metrics`.
//!
//! Code map:
//! - [`server`]: the listener, connections, graceful shutdown; [`serve`] and [`Server`].
//! - [`router`]: routes, API key, body limits and read timeout, `X-Request-Id`.
//! - [`cors`]: CORS headers and preflights, behind `ServerConfig::allowed_origins`.
//! - [`tokenization`]: `/tokenize` and `/detokenize`.
//! - [`state`]: what every handler shares ([`AppState`]).
//! - [`pipeline`]: the one skeleton every generation endpoint runs (ready, tokenize, compile,
//!   start, stream or collect), generic over the wire format's request.
//! - [`job`]: a request read and tokenized, ready to submit; [`chat`]: the chat template.
//! - [`answer`]: how an answer's text is read into content, tool calls and the finish.
//! - [`wire`]: the wire formats (OpenAI's completions and chat, Anthropic's Messages, OpenAI's
//!   Responses), each only reading requests and writing answers.
//! - [`response_store`]: the Responses API's bounded store.
//! - [`reply`]: JSON, error and event-stream responses.
//! - [`tool_stream`]: tool calls' arguments read as they are sampled, for the streams.
//! - [`fields`]: a JSON body read field by field, and the errors that name a field.
//! - [`params`]: sampling fields, type- and range-checked.
//! - [`structured`]: structured-output forms and tools to a `GuideSpec`; tool calls read back.
//! - [`run`]: one request's engine submissions, merged; aborts them when dropped or past the
//!   request's time bound.
//! - [`body`]: the response body, whole or streamed.
//! - [`metrics`]: vLLM-named metrics in the Prometheus text format.
//! - [`worker_api`]: what vLLM's and SGLang's routers ask a worker (`/get_load`,
//!   `/get_server_info`, `/get_model_info`, `/health_generate`, `/flush_cache`).
//! - [`lora`]: the LoRA adapters served, by name (a request's `model`).
//! - [`test_support`]: a tiny tokenizer for tests, examples and benchmarks.
//! - [`engine_client`]: the narrow interface to the engine; [`engine_adapter`] implements it for
//!   `tandem_engine`.
//!
//! Wiring it in a binary (what `examples/fake_server.rs` does with a fake model):
//!
//! ```text
//! let tok = Arc::new(Tokenizer::from_dir(dir)?);
//! let engine = TandemEngine::loading();            // /health answers 503 ...
//! let config = ServerConfig { addr, max_model_len, vocab_size, ..Default::default() };
//! let server = Server::bind(config, engine.clone(), tok.clone(), name).await?;
//! // Structured output: optional; without it such requests are 400s saying why.
//! server.set_structured(Structured::from_model_dir(dir, &tok.eos_ids).map(Arc::new).map_err(|e| e.to_string()));
//! let server = tokio::spawn(server.run(shutdown_signal()));
//! let handle = Engine::spawn(runner, decode_fn(tok), EngineConfig::default())?;
//! engine.set(handle.clone());                      // ... and 200 from here on
//! server.await??;                                  // Ctrl-C / SIGTERM: drain, then abort
//! handle.shutdown();
//! ```
//!
//! `max_model_len` should be the engine's (`EngineHandle::max_model_len`, which the KV pool may
//! make smaller than the model's `max_position_embeddings`); `vocab_size` the model's.
//!
//! Architecture invariant: this is the only crate that knows HTTP and JSON; nothing of either
//! crosses [`engine_client::EngineClient`].

pub mod answer;
pub mod body;
pub mod chat;
pub mod config;
pub mod cors;
pub mod engine_adapter;
pub mod engine_client;
pub mod error;
pub mod fields;
pub mod job;
pub mod kv_events;
pub mod lora;
pub mod metrics;
pub mod params;
pub mod pipeline;
pub mod reasoning;
pub mod reply;
pub mod response_store;
pub mod router;
pub mod run;
pub mod server;
pub mod state;
pub mod step_estimate;
pub mod structured;
pub mod test_support;
pub mod tokenization;
pub mod tool_parser;
pub mod tool_stream;
pub mod wire;
pub mod worker_api;

pub use config::ServerConfig;
pub use engine_client::EngineClient;
pub use error::ApiError;
pub use server::{serve, shutdown_signal, Server};
pub use state::AppState;
