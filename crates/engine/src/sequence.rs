//! One sequence: a prompt and the tokens generated after it, how far its KV cache is computed,
//! its block table, its sampling state and its timings. A request with `n > 1` owns `n`
//! sequences (completion `index` 0..n).

use std::sync::Arc;
use std::time::Instant;

use crate::detokenize::OutputText;
use crate::sampler::TokenLogprobs;
use crate::sampling_params::SamplingParams;

pub type RequestId = u64;
pub type SeqId = u64;

/// Ids are handed out in sequence, so they hash to themselves: the engine looks sequences up
/// a few times per step each, and SipHash would be most of the scheduler's time.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = x;
    }
}

/// A map keyed by sequence or request id.
pub type IdMap<V> = std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<IdHasher>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqStatus {
    Waiting,
    Running,
    Finished,
}

/// Why a completion ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, a stop token id, or the stop string given.
    Stop {
        stop_string: Option<String>,
        stop_token: Option<u32>,
    },
    /// `max_tokens`, or the context or pool limit.
    Length,
    Abort,
    Error(String),
}

impl FinishReason {
    /// The OpenAI name of the reason.
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop { .. } => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error(_) => "error",
        }
    }
}

/// Wall-clock marks of one sequence.
#[derive(Debug, Clone)]
pub struct SeqTimes {
    pub arrival: Instant,
    pub first_scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    /// Seconds between consecutive output tokens.
    pub inter_token: Vec<f32>,
}

#[derive(Debug)]
pub struct Sequence {
    pub id: SeqId,
    pub request_id: RequestId,
    /// Completion index within the request.
    pub index: usize,
    /// Prompt then output ids.
    pub tokens: Vec<u32>,
    pub num_prompt_tokens: usize,
    /// Tokens whose K and V are in the cache. Catches up with `tokens.len()` step by step.
    pub num_computed_tokens: usize,
    pub block_table: Vec<u32>,
    /// Chained prefix hashes of the leading full blocks (see `BlockManager::cache_full_blocks`).
    pub block_hashes: Vec<u64>,
    /// The LoRA adapter this sequence runs under, by its never-reused id
    /// ([`crate::adapters::Adapters`]; None: the base model).
    pub adapter: Option<u32>,
    pub status: SeqStatus,
    pub params: Arc<SamplingParams>,
    /// Output tokens allowed (the request's `max_tokens`, or what the context leaves).
    pub max_tokens: usize,
    /// Lower is served first (vLLM's convention).
    pub priority: i32,
    /// Order of arrival, unique per sequence; breaks priority ties.
    pub arrival_order: u64,
    /// Keys this completion's draws (with `index` and the output token's index).
    pub seed: u64,
    pub text: OutputText,
    pub times: SeqTimes,
    /// Scheduler step at which the sequence last resumed after a preemption.
    pub resumed_at_step: Option<u64>,
    pub num_preemptions: u32,
    /// Prompt tokens found in the prefix cache when the sequence was first admitted (None
    /// until then); the rest of the prompt's KV was computed.
    pub num_cached_tokens: Option<usize>,
    /// Scheduler step that last gave this sequence tokens to compute (0: never).
    pub scheduled_at_step: u64,
    /// Whether the `n - 1` siblings were forked off this sequence already.
    pub forked: bool,
    /// Logprobs of the newest token, waiting to be streamed.
    pub pending_logprobs: Vec<TokenLogprobs>,
    /// Prompt logprobs gathered so far (completion 0 of a request that asks): entry `p` is
    /// token `p` given tokens `0..p`; entry 0 is None (nothing comes before it). Taken when the
    /// first output is sent.
    pub prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
    /// With `prompt_logprobs`, entry `p`'s token's rank among the vocabulary at that position
    /// (1 the most likely; vLLM's `rank`: tokens at least as likely counted); entry 0 is 0.
    pub prompt_ranks: Vec<u32>,
    /// The constraint of a guided request, and the mask it gave for this step's sample.
    pub guide: Option<GuideState>,
    /// Draft tokens to verify after `tokens` this step (speculative decoding): not committed,
    /// cleared once the step is verified or the sequence is preempted.
    pub draft: Vec<u32>,
}

/// A sequence's constraint and its mask for the row being sampled.
pub struct GuideState {
    pub constraint: Box<dyn crate::constraint::Constraint>,
    /// Computed while the step's forward runs; taken when the row is sampled.
    pub mask: Option<Result<Vec<u32>, String>>,
    /// The masks of a drafted decode's rows, computed when its drafts were checked.
    pub drafted: Option<DraftMasks>,
}

/// The masks of a decode's rows under its drafts: `masks[i]` is what the constraint allows
/// after the committed tokens and drafts `0..i` (one more mask than drafts kept). Valid while
/// the sequence has `at` committed tokens.
#[derive(Debug, Clone)]
pub struct DraftMasks {
    pub at: usize,
    pub masks: Vec<Vec<u32>>,
    /// The seconds each mask took.
    pub seconds: Vec<f64>,
}

impl std::fmt::Debug for GuideState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuideState").field("mask", &self.mask.as_ref().map(|m| m.as_ref().map(|m| m.len()))).finish()
    }
}

impl Sequence {
    /// Where this sequence's prefix-hash chain starts (`BlockManager::find_cached_prefix_under`).
    pub fn cache_root(&self) -> u64 {
        crate::block_manager::adapter_root(self.adapter)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: SeqId,
        request_id: RequestId,
        index: usize,
        prompt: Vec<u32>,
        params: Arc<SamplingParams>,
        max_tokens: usize,
        priority: i32,
        arrival_order: u64,
        seed: u64,
        arrival: Instant,
    ) -> Self {
        Sequence {
            id,
            request_id,
            index,
            num_prompt_tokens: prompt.len(),
            text: OutputText::new(&prompt),
            tokens: prompt,
            num_computed_tokens: 0,
            num_cached_tokens: None,
            block_table: Vec::new(),
            block_hashes: Vec::new(),
            adapter: None,
            status: SeqStatus::Waiting,
            max_tokens,
            priority,
            arrival_order,
            seed,
            times: SeqTimes {
                arrival,
                first_scheduled: None,
                first_token: None,
                last_token: None,
                inter_token: Vec::new(),
            },
            resumed_at_step: None,
            num_preemptions: 0,
            scheduled_at_step: 0,
            forked: index > 0,
            pending_logprobs: Vec::new(),
            prompt_logprobs: (index == 0 && params.prompt_logprobs.is_some()).then(|| vec![None]),
            prompt_ranks: vec![0],
            guide: None,
            draft: Vec::new(),
            params,
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }
    pub fn prompt(&self) -> &[u32] {
        &self.tokens[..self.num_prompt_tokens]
    }
    pub fn output(&self) -> &[u32] {
        &self.tokens[self.num_prompt_tokens..]
    }
    pub fn num_output_tokens(&self) -> usize {
        self.tokens.len() - self.num_prompt_tokens
    }
    /// Tokens still to run through the model before the next sample.
    pub fn num_uncomputed(&self) -> usize {
        self.tokens.len() - self.num_computed_tokens
    }
    /// Every computed position of this sequence needs its logits until the prompt's logprobs
    /// are gathered; its chunks then count one logit row per token.
    pub fn wants_prompt_logits(&self) -> bool {
        self.prompt_logprobs.as_ref().is_some_and(|l| l.len() < self.num_prompt_tokens)
    }
    /// Scheduling order: lower key first (priority, then arrival).
    pub fn key(&self) -> (i32, u64) {
        (self.priority, self.arrival_order)
    }

    /// Records one new output token and its time.
    pub fn append_token(&mut self, id: u32, now: Instant) {
        self.commit_token(None, id, now);
    }

    /// Records an output token: appended, or (overlapped engine) written over the placeholder
    /// at `at` that stood for it while its step was in flight.
    pub fn commit_token(&mut self, at: Option<usize>, id: u32, now: Instant) {
        match at {
            Some(p) => self.tokens[p] = id,
            None => self.tokens.push(id),
        }
        if let Some(prev) = self.times.last_token {
            self.times.inter_token.push((now - prev).as_secs_f32());
        } else {
            self.times.first_token = Some(now);
        }
        self.times.last_token = Some(now);
    }
}
