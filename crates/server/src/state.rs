//! What every request handler shares: the configuration, the engine, the tokenizer, the
//! counters the metrics and the load reports read, and the stored Responses answers.
//!
//! It knows nothing of routes or wire formats: the router and the wire modules read it, it
//! reads neither.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, OnceLock};

use tandem_core::tokenizer::Tokenizer;
use tandem_structured::Structured;

use crate::config::ServerConfig;
use crate::engine_client::{EngineClient, RequestId};
use crate::metrics::Metrics;
use crate::response_store::ResponseStore;

/// What every request handler shares.
pub struct AppState {
    pub config: ServerConfig,
    pub engine: Arc<dyn EngineClient>,
    pub tokenizer: Arc<Tokenizer>,
    pub model_name: String,
    pub metrics: Metrics,
    /// Engine requests submitted that have produced no output yet (a gauge).
    pub queued: AtomicUsize,
    /// Sequences (prompts x completions) submitted and not finished: bounded by
    /// `max_num_seqs + max_queued_requests` (see `run.rs`).
    pub in_flight: AtomicUsize,
    /// Prompt tokens (times `n`) and generated tokens of the requests in flight: the load
    /// SGLang's `/get_load` reports as `num_tokens` (see `worker_api.rs`).
    pub tokens_in_flight: AtomicUsize,
    /// Engine requests in flight, so that shutdown can abort what outlives its deadline.
    pub live: Mutex<HashSet<RequestId>>,
    /// Source of response ids.
    pub next_id: AtomicU64,
    /// What compiles structured-output specs for this model's tokenizer, once the binary gave
    /// it (see [`crate::Server::set_structured`]); `Err` says why there is none (a tokenizer
    /// llguidance cannot read), and structured requests are answered 400 with it.
    pub structured: OnceLock<Result<Arc<Structured>, String>>,
    /// Stored `/v1/responses` answers (`store`, `previous_response_id`).
    pub responses: ResponseStore,
    /// The LoRA adapters served, by name.
    pub lora: crate::lora::LoraTable,
}

impl AppState {
    /// The context limit in force: the engine's once it is loaded (the KV pool or
    /// `--max-model-len` may cap the model's), else the configured one.
    pub fn max_model_len(&self) -> usize {
        self.engine.max_model_len().unwrap_or(self.config.max_model_len)
    }

    /// Whether `name` is one this server answers to as a request's `model`.
    pub fn serves(&self, name: &str) -> bool {
        name == self.model_name
            || self.config.served_model_names.iter().chain(&self.config.model_aliases).any(|n| n == name)
    }

    /// What a request's `model` asks for: `Some(None)` the base model, `Some(Some(slot))` a
    /// LoRA adapter, `None` nothing served here.
    pub fn resolve(&self, name: &str) -> Option<Option<u32>> {
        if self.serves(name) {
            return Some(None);
        }
        self.lora.slot(name).map(Some)
    }

    /// The name answers report for a request under `adapter`: the adapter's, or the model's.
    pub fn answer_model(&self, adapter: Option<u32>) -> String {
        adapter.and_then(|s| self.lora.name_of(s)).unwrap_or_else(|| self.model_name.clone())
    }

    /// The structured-output compiler, or why this server has none.
    pub fn structured(&self) -> Result<&Arc<Structured>, &str> {
        match self.structured.get() {
            Some(Ok(s)) => Ok(s),
            Some(Err(why)) => Err(why),
            None => {
                Err("this server was started without structured-output support (no tokenizer was given to it for that)")
            }
        }
    }
}
