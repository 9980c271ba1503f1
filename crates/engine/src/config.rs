//! The engine's settings: batch limits, scheduling policy, prefill rules, KV events; and the
//! error a bad setting gives when the engine is built.
//!
//! Every limit left `None` takes the model runner's own (its `max_batch_tokens`, `max_seqs`,
//! the model's `max_position_embeddings`), so a default config always fits the runner.

use crate::block_manager::KvEvent;
use crate::scheduler::{BatchMode, LongPrefill, Policy, PrefillLimits};
use crate::speculative::SpeculativeConfig;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Token budget per step; None: the runner's `max_batch_tokens`.
    pub max_num_batched_tokens: Option<usize>,
    /// Sequences per step; None: the runner's `max_seqs`.
    pub max_num_seqs: Option<usize>,
    pub policy: Policy,
    pub mode: BatchMode,
    pub enable_prefix_caching: bool,
    pub resume_protect_steps: u64,
    /// Requests accepted but not finished before `submit` answers `Overloaded`; None: no bound.
    pub max_pending_requests: Option<usize>,
    /// Keys the draws of requests that bring no seed of their own.
    pub seed: u64,
    /// Longest prompt + output accepted; None: the model's `max_position_embeddings`. The
    /// engine takes the least of this, the model's and what the KV pool holds.
    pub max_model_len: Option<usize>,
    /// Schedule step N+1 while the model runs step N (see [`crate::Engine::step`]). Off by
    /// default here, so a library caller's `step()` emits the tokens of the step it ran; the
    /// server turns it on (`--async-scheduling`, its default).
    pub async_scheduling: bool,
    /// vLLM's `--long-prefill-token-threshold`. None: Tandem's default (a prefill chunk takes at
    /// most half the budget while someone waits: `LongPrefill::HalfWhileWaiting`), or, where
    /// `max_num_partial_prefills` > 1, 4% of max_model_len as vLLM sets it; Some(0): none.
    pub long_prefill_token_threshold: Option<usize>,
    /// vLLM's `--max-num-partial-prefills` (0: no limit).
    pub max_num_partial_prefills: usize,
    /// vLLM's `--max-long-partial-prefills` (0: no limit); at most `max_num_partial_prefills`.
    pub max_long_partial_prefills: usize,
    /// Where to send the prefix cache's changes, one batch per step that had any (KV-cache
    /// events for routers; see `tandem_server::kv_events`). None: not recorded.
    pub kv_events: Option<std::sync::mpsc::Sender<Vec<KvEvent>>>,
    /// Speculative decoding (see [`crate::speculative`]); None: off.
    pub speculative: Option<SpeculativeConfig>,
    /// vLLM's `--max-cpu-loras`: most CPU copies of LoRA adapters kept, the least recently
    /// used beyond it read again from their directory when needed (see [`crate::adapters`]);
    /// None: as many as the slots.
    pub max_cpu_loras: Option<usize>,
    /// The directories of the LoRA adapters named at start (`--lora-modules`), adapter `i`
    /// under id `i`: those below the model's slots are in slot `i` already, the others wait
    /// off the device for a slot; all may be swapped out.
    pub lora_modules: Vec<std::path::PathBuf>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_num_batched_tokens: None,
            max_num_seqs: None,
            policy: Policy::Fcfs,
            mode: BatchMode::Continuous,
            enable_prefix_caching: true,
            resume_protect_steps: 8,
            max_pending_requests: None,
            seed: 0,
            max_model_len: None,
            async_scheduling: false,
            long_prefill_token_threshold: None,
            max_num_partial_prefills: 0,
            max_long_partial_prefills: 0,
            kv_events: None,
            speculative: None,
            max_cpu_loras: None,
            lora_modules: Vec::new(),
        }
    }
}

/// The scheduler's [`PrefillLimits`] from the engine's settings (vLLM's rules: the long limit
/// at most the partial one; a threshold of 4% of max_model_len by default where more than one
/// partial prefill may run).
pub(crate) fn prefill_limits(cfg: &EngineConfig, max_model_len: usize) -> Result<PrefillLimits, EngineError> {
    let (n, l) = (cfg.max_num_partial_prefills, cfg.max_long_partial_prefills);
    if l > 0 && n > 0 && l > n {
        return Err(EngineError::Config(format!(
            "max_long_partial_prefills ({l}) must be <= max_num_partial_prefills ({n})"
        )));
    }
    let long = match cfg.long_prefill_token_threshold {
        Some(0) => LongPrefill::Off,
        Some(t) => LongPrefill::Threshold(t),
        None if n > 1 => LongPrefill::Threshold((max_model_len * 4 / 100).max(1)),
        None => PrefillLimits::tandem().long,
    };
    Ok(PrefillLimits { long, max_num_partial_prefills: n, max_long_partial_prefills: l })
}

/// A setting the engine cannot run with, or a thread it could not start.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EngineError {
    #[error("engine config: {0}")]
    Config(String),
}
