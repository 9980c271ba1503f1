//! A request as the engine sees it: what a caller submits ([`Request`]), what its stream
//! carries back ([`RequestOutput`], with [`Usage`] on the last message), and the engine's
//! record of an open request (its channel and its live completions).

use std::ops::Range;

use tokio::sync::mpsc::UnboundedSender;

use crate::metrics::RequestMetrics;
use crate::sampler::TokenLogprobs;
use crate::sampling_params::SamplingParams;
use crate::sequence::{FinishReason, RequestId, SeqId};

/// What a caller submits.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// Lower is served first under the `priority` policy.
    pub priority: i32,
}

/// Tokens a request took: its prompt, and the outputs of all its completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// One message of a request's stream: what completion `index` produced since the last one.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestOutput {
    pub request_id: RequestId,
    pub index: usize,
    pub token_ids: Vec<u32>,
    pub text: String,
    /// One entry per token in `token_ids` when logprobs were asked for.
    pub logprobs: Vec<TokenLogprobs>,
    /// With completion 0's first message, when prompt logprobs were asked for: one entry per
    /// prompt token, the first None.
    pub prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
    /// With `prompt_logprobs`: per prompt position its token's rank (see
    /// [`crate::sampler::rank`]); 0 for the first position, which has no logprob.
    pub prompt_ranks: Vec<u32>,
    /// Set when completion `index` ended.
    pub finish_reason: Option<FinishReason>,
    /// The last message of the request: every completion has ended.
    pub finished: bool,
    pub usage: Option<Usage>,
    pub metrics: Option<RequestMetrics>,
}

impl RequestOutput {
    pub(crate) fn new(request_id: RequestId, index: usize) -> Self {
        RequestOutput {
            request_id,
            index,
            token_ids: vec![],
            text: String::new(),
            logprobs: vec![],
            prompt_logprobs: None,
            prompt_ranks: Vec::new(),
            finish_reason: None,
            finished: false,
            usage: None,
            metrics: None,
        }
    }
}

/// An open request: where its outputs go and which of its completions are still running.
pub(crate) struct RequestState {
    pub(crate) tx: UnboundedSender<RequestOutput>,
    /// Completions not yet ended.
    pub(crate) live: Vec<SeqId>,
    /// Completion indices not forked yet (1..n until the prompt is computed).
    pub(crate) unforked: Range<usize>,
    pub(crate) prompt_tokens: usize,
    pub(crate) completion_tokens: usize,
    pub(crate) metrics: Option<RequestMetrics>,
}
