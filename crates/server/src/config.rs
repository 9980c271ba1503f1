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
    /// A request body must arrive whole within this long of the handler asking for it; a
    /// client that stalls mid-body is answered 408 and its connection closed. (hyper bounds
    /// the headers alone, at 30 s.)
    pub body_read_timeout: Duration,
    /// A generation request past this long since it arrived is aborted (its KV freed): its
    /// choices end with finish_reason "abort", or it is answered 408 when no output token
    /// exists yet and nothing has been sent (see `run.rs`). `None`: no bound.
    pub request_timeout: Option<Duration>,
    /// Browser origins answered with CORS headers: empty for none, `"*"` for any, else exact
    /// origins (`https://app.example`). Preflight `OPTIONS` requests are answered for these.
    pub allowed_origins: Vec<String>,
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
            body_read_timeout: Duration::from_secs(30),
            request_timeout: None,
            allowed_origins: Vec::new(),
        }
    }
}
