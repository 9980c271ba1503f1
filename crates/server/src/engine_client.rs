//! What the server needs from an engine, and nothing more: submit a tokenized request and get
//! a tokio stream of per-completion deltas, abort it, read counters, ask whether it is ready.
//!
//! The server is written against [`EngineClient`] so that HTTP concerns never reach the engine
//! crate; `engine_adapter.rs` implements it for `tandem_engine`, and tests may plug in their
//! own. Architecture invariant: no HTTP or JSON type crosses this boundary.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tandem_engine::SamplingParams;
use tokio::sync::mpsc;

pub type RequestId = u64;

/// What the engine is asked for one prompt: sampling and stopping as the engine takes them,
/// already validated by the server (ranges are checked in `params.rs`, `max_tokens` resolved
/// in `job.rs`), and the adapter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestParams {
    pub sampling: SamplingParams,
    /// The LoRA slot of the adapter the request's `model` names (None: the base model).
    pub adapter: Option<u32>,
}

/// One prompt, tokenized, with its parameters.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub params: RequestParams,
    /// Lower is served first (vLLM's convention); 0 by default.
    pub priority: i32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// Most likely tokens, best first.
    pub top: Vec<(u32, f32)>,
    /// The token's rank in the vocabulary (1 the most likely), when the engine computed it
    /// (prompt logprobs).
    pub rank: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum FinishReason {
    Stop,
    Length,
    /// Aborted (client gone, shutdown).
    Abort,
    /// The engine failed this request; the message says why.
    Error(String),
}

impl FinishReason {
    /// The OpenAI name.
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error(_) => "error",
        }
    }
}

/// New output of one completion since its previous delta.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionDelta {
    /// Completion index within the request, `0..n`.
    pub index: usize,
    /// New text (never a broken UTF-8 character; stop strings already cut).
    pub text: String,
    pub token_ids: Vec<u32>,
    /// One entry per token in `token_ids` when logprobs were asked for.
    pub logprobs: Vec<TokenLogprob>,
    /// With completion 0's first delta when prompt logprobs were asked for: one entry per
    /// prompt token (the first None).
    pub prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
    /// Set on the completion's last delta.
    pub finish: Option<FinishReason>,
    /// With a `Stop` finish: the stop string that ended the text, when one did.
    pub stop_string: Option<String>,
}

/// What one engine step produced for one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineUpdate {
    pub deltas: Vec<CompletionDelta>,
    /// Time from arrival to first scheduling, sent once (with the first update) when known.
    pub queue_time: Option<Duration>,
    /// With the request's last update, when known: how many times it was preempted.
    pub num_preemptions: Option<u32>,
    /// With the request's last update, when known: prompt tokens found in the prefix cache
    /// when it was first scheduled.
    pub num_cached_tokens: Option<usize>,
}

/// Where a request's updates come from: polled by the response body itself, so that a token
/// reaches the socket without a hop through another task.
pub trait UpdateSource: Send {
    /// The next update; `Ready(None)` once the engine has nothing more for this request.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<EngineUpdate>>;
}

impl UpdateSource for mpsc::UnboundedReceiver<EngineUpdate> {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<EngineUpdate>> {
        self.poll_recv(cx)
    }
}

/// A submitted request: its id (for abort) and its stream of updates. The stream ends after
/// every completion's finishing delta; a stream that ends earlier means the engine died.
pub struct Submission {
    pub id: RequestId,
    pub updates: Box<dyn UpdateSource>,
}

impl Submission {
    /// A submission fed through a tokio channel.
    pub fn channel(id: RequestId, rx: mpsc::UnboundedReceiver<EngineUpdate>) -> Self {
        Submission { id, updates: Box::new(rx) }
    }
}

/// Gauges and counters the engine keeps (the server keeps the token counters and latencies).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    pub num_running: usize,
    pub num_waiting: usize,
    /// Fraction of KV blocks in use, 0..=1.
    pub kv_cache_usage: f64,
    /// Prompt tokens looked up in the prefix cache, and of those found (cumulative).
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub num_preemptions: u64,
    /// Sequences in the most recent step.
    pub batch_size: usize,
    /// Structured-output token masks computed, and the seconds they took (cumulative).
    pub guided_masks_total: u64,
    pub guided_mask_seconds_total: f64,
    /// Engine steps whose forward overlapped the engine's host work (async scheduling), and
    /// steps run synchronously (cumulative).
    pub async_steps: u64,
    pub sync_steps: u64,
    /// Tokens computed per engine step: entry `k` counts steps of `(2^(k-1), 2^k]` tokens
    /// (entry 0: one token; the last entry: all above), and their sum. Empty when unknown.
    pub iteration_tokens: Vec<u64>,
    pub iteration_tokens_sum: u64,
    /// The KV pool: tokens a block holds and blocks (0 when unknown).
    pub block_size: usize,
    pub num_blocks: usize,
    /// Bytes the backend holds for the model's weights (None when it does not count them).
    pub weights_bytes: Option<u64>,
    /// Speculative decoding (cumulative): verifications, draft tokens, accepted drafts, and
    /// accepted drafts per position (empty: speculation off).
    pub spec_decode_num_drafts: u64,
    pub spec_decode_num_draft_tokens: u64,
    pub spec_decode_num_accepted_tokens: u64,
    pub spec_decode_num_accepted_tokens_per_pos: Vec<u64>,
    /// The analytic work of the steps so far (vLLM's `estimated_*_per_gpu`), when the
    /// engine's model shape is known.
    pub step_estimate: Option<crate::step_estimate::StepEstimate>,
    /// The LoRA slots of the running and of the waiting requests, each once.
    pub running_lora_adapters: Vec<u32>,
    pub waiting_lora_adapters: Vec<u32>,
}

/// Why the engine refused a request outright.
#[derive(Debug, Clone, PartialEq)]
pub enum SubmitRefusal {
    /// The request can never run (bad parameters, too long for the pool): answered 400.
    Invalid(String),
    /// The engine's own queue is full: answered 429.
    Overloaded(String),
    /// The engine is gone or not loaded: answered 500.
    Stopped(String),
}

/// Why a LoRA adapter was not loaded or unloaded at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoraRefusal {
    /// No adapter at the path, or none of that id: answered 404 as vLLM does.
    NotFound(String),
    /// Anything else (an adapter that does not fit, no free slot): answered 400.
    Invalid(String),
}

/// What [`EngineClient::load_lora`] and [`EngineClient::unload_lora`] return.
pub type LoraFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, LoraRefusal>> + Send + 'a>>;

/// The engine, as the server sees it. Every method returns at once (no blocking on a step).
pub trait EngineClient: Send + Sync + 'static {
    /// Queues a request, or refuses it outright.
    fn submit(&self, req: GenerateRequest) -> Result<Submission, SubmitRefusal>;
    /// Stops a request and frees its KV blocks; unknown or finished ids are ignored.
    fn abort(&self, id: RequestId);
    fn stats(&self) -> EngineStats;
    /// True once the model is loaded and the engine loop runs.
    fn is_ready(&self) -> bool;
    /// Why the engine stopped serving for good (a lost device), if it did: /health and every
    /// generation request answer 503 with it from then on.
    fn failure(&self) -> Option<String> {
        None
    }
    /// The longest prompt + output the engine accepts, once it is loaded (it may be less than
    /// the model's context: the KV pool or `--max-model-len` can cap it).
    fn max_model_len(&self) -> Option<usize> {
        None
    }
    /// Loads the PEFT adapter in `dir` into the engine at run time; the id requests name it by.
    fn load_lora(&self, dir: PathBuf) -> LoraFuture<'_, u32> {
        let _ = dir;
        Box::pin(async { Err(LoraRefusal::Invalid("this engine cannot load LoRA adapters at run time".into())) })
    }
    /// Stops serving adapter `id` (its running requests finish under it).
    fn unload_lora(&self, id: u32) -> LoraFuture<'_, ()> {
        Box::pin(async move { Err(LoraRefusal::NotFound(format!("no LoRA adapter {id} is loaded"))) })
    }
}
