//! Server settings: where to listen, limits, and what the model allows.

use std::net::SocketAddr;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Port 0 picks a free port; [`crate::Server::local_addr`] tells which.
    pub addr: SocketAddr,
    /// When set, every endpoint but `/health` needs `Authorization: Bearer <key>` (or Anthropic's
    /// `x-api-key: <key>`).
    pub api_key: Option<String>,
    /// Larger request bodies are answered 413.
    pub max_body_bytes: usize,
    /// Sequences that may wait for admission beyond the `max_num_seqs` the engine runs; a
    /// request beyond that is answered 429, one larger than both together 400.
    pub max_queued_requests: usize,
    /// Sequences the engine runs at once (its `max_num_seqs`).
    pub max_num_seqs: usize,
    /// Context length (prompt plus output tokens) until the engine is loaded; then the
    /// engine's own limit applies (see `AppState::max_model_len`).
    pub max_model_len: usize,
    /// Token ids in prompts and `stop_token_ids` must be below this.
    pub vocab_size: usize,
    /// On shutdown, running requests get this long to finish before they are aborted.
    pub shutdown_grace: Duration,
    /// `max_tokens` when a completions or /generate request gives none (OpenAI's legacy 16);
    /// chat requests default to what the context leaves.
    pub default_max_tokens: usize,
    /// Sampling defaults under each request's own values (the model's generation config).
    pub sampling_defaults: SamplingDefaults,
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
    /// `--tool-call-parser`: how a `tool_choice: "auto"` answer is read for calls. `None`:
    /// Hermes `<tool_call>` blocks when the chat template writes them, else plain text.
    pub tool_call_parser: Option<crate::tool_parser::ToolParser>,
    /// `--reasoning-parser`: a chat answer's `<think>` block goes to `reasoning_content`.
    pub reasoning_parser: Option<crate::reasoning::ReasoningParser>,
    /// `/v1/responses` with `store`: at most this many responses are kept (the oldest go
    /// first; 0 keeps none), in at most `responses_max_bytes` (their JSON's length), each for
    /// at most `responses_ttl`.
    pub responses_capacity: usize,
    pub responses_max_bytes: usize,
    pub responses_ttl: Duration,
    /// More names the model is served under (vLLM's `--served-model-name a b`: `Server::bind`
    /// takes the first, these are the rest): listed by `/v1/models` and accepted as `model`.
    pub served_model_names: Vec<String>,
    /// Names accepted as `model` but not listed (the model directory's base name, which
    /// earlier versions served).
    pub model_aliases: Vec<String>,
    /// `root` of `/v1/models` entries (vLLM: the model path); the served name when `None`.
    pub model_root: Option<String>,
    /// The LoRA adapters served at start (`--lora-modules`), each in its engine slot.
    pub lora_adapters: Vec<crate::lora::ServedAdapter>,
    /// `--max-loras` where LoRA is enabled (`vllm:lora_requests_info` is exported then); 0: off.
    pub max_loras: usize,
    /// `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` are routed (vLLM's
    /// `VLLM_ALLOW_RUNTIME_LORA_UPDATING`: [`crate::lora::runtime_updating_allowed`]).
    pub runtime_lora_updating: bool,
}

/// What a request that leaves a field out gets instead of the API's default: vLLM's
/// `--generation-config auto` takes these from the model's `generation_config.json`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// 0 is no limit.
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// Output tokens when a request gives no `max_tokens` (still capped by the context).
    pub max_tokens: Option<usize>,
}

impl SamplingDefaults {
    /// The fields of a generation config that are in the ranges requests accept; others are
    /// dropped with a warning rather than served.
    pub fn from_generation_config(g: &tandem_core::GenerationConfig) -> Self {
        let keep = |name: &str, v: Option<f32>, ok: fn(f32) -> bool| match v {
            Some(x) if !ok(x) => {
                tracing::warn!("generation_config.json: {name} = {x} is outside what requests accept; ignored");
                None
            }
            v => v,
        };
        SamplingDefaults {
            temperature: keep("temperature", g.temperature, |x| (0.0..=2.0).contains(&x)),
            top_p: keep("top_p", g.top_p, |x| x > 0.0 && x <= 1.0),
            top_k: g.top_k.map(|k| k.max(0) as usize),
            min_p: keep("min_p", g.min_p, |x| (0.0..=1.0).contains(&x)),
            repetition_penalty: keep("repetition_penalty", g.repetition_penalty, |x| x > 0.0 && x <= 10.0),
            max_tokens: g.max_new_tokens.filter(|&m| m > 0),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == SamplingDefaults::default()
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 8000)),
            api_key: None,
            max_body_bytes: 8 << 20,
            max_queued_requests: 1024,
            max_num_seqs: 256,
            max_model_len: 2048,
            vocab_size: 32000,
            shutdown_grace: Duration::from_secs(30),
            default_max_tokens: 16,
            sampling_defaults: SamplingDefaults::default(),
            body_read_timeout: Duration::from_secs(30),
            request_timeout: None,
            allowed_origins: Vec::new(),
            tool_call_parser: None,
            reasoning_parser: None,
            responses_capacity: 1000,
            responses_max_bytes: 256 << 20,
            responses_ttl: Duration::from_secs(3600),
            served_model_names: Vec::new(),
            model_aliases: Vec::new(),
            model_root: None,
            lora_adapters: Vec::new(),
            max_loras: 0,
            runtime_lora_updating: false,
        }
    }
}
