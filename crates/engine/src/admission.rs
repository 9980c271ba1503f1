//! Admission: the checks a request passes before it is queued, on the caller's thread, so a
//! request that can never run is refused with an error rather than left waiting; and the
//! bound on requests pending at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use crate::request::Request;
use crate::sampling_params::InvalidParam;

/// Why a request was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubmitError {
    #[error("invalid sampling parameter: {0}")]
    InvalidParams(#[from] InvalidParam),
    #[error("prompt is empty")]
    EmptyPrompt,
    #[error("prompt token {index} is id {id}, outside the vocabulary of {vocab}")]
    TokenOutOfVocab { index: usize, id: u32, vocab: usize },
    #[error(
        "prompt ({prompt} tokens) + max_tokens ({max_tokens}) exceeds the maximum context of {max_model_len} tokens"
    )]
    TooLong { prompt: usize, max_tokens: usize, max_model_len: usize },
    #[error("request needs {needed} KV blocks ({copies} completion(s) of {tokens} tokens) but the pool has {pool}")]
    NeverFits { needed: usize, copies: usize, tokens: usize, pool: usize },
    #[error("overloaded: {pending} requests pending (limit {limit}); retry later")]
    Overloaded { pending: usize, limit: usize },
    /// `slot`: the adapter's id (its slot for the adapters loaded with the model).
    #[error("LoRA slot {slot} holds no adapter")]
    UnknownAdapter { slot: u32 },
    #[error("the engine has stopped: {0}")]
    Stopped(String),
}

/// What a request is checked against before it is queued.
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    pub(crate) vocab: usize,
    pub(crate) max_model_len: usize,
    pub(crate) num_blocks: usize,
    pub(crate) block_size: usize,
    /// A static batch reserves every completion's blocks at once.
    pub(crate) static_mode: bool,
    /// `EngineConfig::max_pending_requests`.
    pub(crate) max_pending: Option<usize>,
    /// The LoRA adapter ids a request may name ([`crate::adapters::Adapters`]).
    pub(crate) adapters: Arc<RwLock<Vec<u32>>>,
}

impl Admission {
    /// Checks a request; returns the resolved `max_tokens`.
    pub(crate) fn check(&self, req: &Request, adapter: Option<u32>) -> Result<usize, SubmitError> {
        req.params.validate().map_err(SubmitError::InvalidParams)?;
        if let Some(slot) = adapter {
            if !self.adapters.read().is_ok_and(|k| k.contains(&slot)) {
                return Err(SubmitError::UnknownAdapter { slot });
            }
        }
        let p = req.prompt.len();
        if p == 0 {
            return Err(SubmitError::EmptyPrompt);
        }
        if let Some((index, &id)) = req.prompt.iter().enumerate().find(|(_, &t)| t as usize >= self.vocab) {
            return Err(SubmitError::TokenOutOfVocab { index, id, vocab: self.vocab });
        }
        let max_tokens = req.params.max_tokens.unwrap_or(self.max_model_len.saturating_sub(p));
        let scoring = req.params.prompt_logprobs.is_some();
        if (max_tokens == 0 && !scoring) || p + max_tokens > self.max_model_len || p > self.max_model_len {
            return Err(SubmitError::TooLong { prompt: p, max_tokens, max_model_len: self.max_model_len });
        }
        // Each completion alone must fit the pool (preemption frees the rest); a static batch
        // reserves all completions at once.
        let copies = if self.static_mode { req.params.n } else { 1 };
        let needed = (p + max_tokens).div_ceil(self.block_size) * copies;
        if needed > self.num_blocks {
            return Err(SubmitError::NeverFits { needed, copies, tokens: p + max_tokens, pool: self.num_blocks });
        }
        Ok(max_tokens)
    }

    /// Counts one more pending request, unless the bound is reached.
    pub(crate) fn reserve(&self, pending: &AtomicUsize) -> Result<(), SubmitError> {
        let before = pending.fetch_add(1, Ordering::AcqRel);
        match self.max_pending {
            Some(limit) if before >= limit => {
                pending.fetch_sub(1, Ordering::AcqRel);
                Err(SubmitError::Overloaded { pending: before, limit })
            }
            _ => Ok(()),
        }
    }
}
