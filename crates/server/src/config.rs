//! Server settings: where to listen, limits, and what the model allows.

use std::net::SocketAddr;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Port 0 picks a free port; [`crate::Server::local_addr`] tells which.
    pub addr: SocketAddr,
    /// When set, every endpoint but `/health` needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Larger request bodies are answered 413.
    pub max_body_bytes: usize,
    /// Requests submitted but without output yet (waiting or in prefill); beyond this, 429.
    pub max_queued_requests: usize,
    /// Context length: prompt plus output tokens (the model's `max_position_embeddings`).
    pub max_model_len: usize,
    /// Token ids in prompts and `stop_token_ids` must be below this.
    pub vocab_size: usize,
    /// On shutdown, running requests get this long to finish before they are aborted.
    pub shutdown_grace: Duration,
    /// `max_tokens` when a completions or /generate request gives none (OpenAI's legacy 16);
    /// chat requests default to what the context leaves.
    pub default_max_tokens: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 8000)),
            api_key: None,
            max_body_bytes: 8 << 20,
            max_queued_requests: 1024,
            max_model_len: 2048,
            vocab_size: 32000,
            shutdown_grace: Duration::from_secs(30),
            default_max_tokens: 16,
        }
    }
}
