//! The engine: requests in, streamed outputs out. Each [`Engine::step`] is three calls:
//! schedule, forward (one `ModelRunner::forward_sampled` for the whole flattened batch, which
//! returns token ids; `ModelRunner::forward` and host sampling instead when a row needs
//! penalties, `logit_bias`, bans, logprobs or prompt logprobs), postprocess (append, check
//! stops, emit outputs, free blocks). With `EngineConfig::async_scheduling` the engine
//! schedules step N+1 and sends it to a model worker thread ([`crate::worker`]) before it
//! postprocesses step N, so its host work runs while the model does (see [`Engine::step`]).
//!
//! [`Engine::spawn`] runs it on its own thread behind an [`EngineHandle`]; `submit` checks a
//! request at once (a request that can never fit is refused with an error, not queued) and
//! returns a [`RequestStream`]. The stream is a tokio unbounded channel: it can be awaited from
//! the server and read with `blocking_recv` from plain threads. Dropping a stream aborts its
//! request and frees its blocks.
//!
//! Invariant: every accepted request gets exactly one output with `finished == true`, whatever
//! happens (stop, length, abort, forward error, engine shutdown).
//!
//! A forward error fails its batch and the engine goes on, unless it is fatal
//! (`tandem_core::Error::is_fatal`: the device is lost): then every request, running or
//! waiting, fails with that error, and the engine refuses every later submission
//! (`SubmitError::Stopped` with the reason; [`EngineHandle::failure`] reports it).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tandem_core::ModelRunner;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::constraint::{apply_mask, mask_words};
use crate::detokenize::DecodeFn;
use crate::metrics::{RequestMetrics, Stats};
use crate::sampler::{
    apply_penalties, has_edits, logprobs, needs_host, penalty_edits, sample, spec, SampleSpec, TokenLogprobs,
};
use crate::sampling_params::SamplingParams;
use crate::scheduler::{BatchMode, LongPrefill, Policy, PrefillLimits, Scheduler, SchedulerConfig, SchedulerOutput};
use crate::sequence::{FinishReason, GuideState, IdMap, RequestId, SeqId, Sequence};
use crate::worker::{worker_gone, Worker, PLACEHOLDER};
use tandem_core::sampling::LogitEdit;
use tandem_core::sampling::RowMasks;

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
    /// Schedule step N+1 while the model runs step N (see [`Engine::step`]). Off by default
    /// here, so a library caller's `step()` emits the tokens of the step it ran; the server
    /// turns it on (`--async-scheduling`, its default).
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
    pub kv_events: Option<std::sync::mpsc::Sender<Vec<crate::block_manager::KvEvent>>>,
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
        }
    }
}

/// The scheduler's [`PrefillLimits`] from the engine's settings (vLLM's rules: the long limit
/// at most the partial one; a threshold of 4% of max_model_len by default where more than one
/// partial prefill may run).
fn prefill_limits(cfg: &EngineConfig, max_model_len: usize) -> Result<PrefillLimits, EngineError> {
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

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EngineError {
    #[error("engine config: {0}")]
    Config(String),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubmitError {
    #[error("invalid sampling parameter: {0}")]
    InvalidParams(#[from] crate::sampling_params::InvalidParam),
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
    #[error("the engine has stopped: {0}")]
    Stopped(String),
}

/// What a caller submits.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// Lower is served first under the `priority` policy.
    pub priority: i32,
}

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
    fn new(request_id: RequestId, index: usize) -> Self {
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

/// What a step's forward brought back: token ids (sampled by the model) or logits.
enum Sampled {
    Ids(Vec<u32>),
    /// Ids, and the logprobs of the rows that asked (computed where the logits are).
    IdsLogprobs(Vec<u32>, Vec<Option<TokenLogprobs>>),
    Logits(Vec<f32>),
}

/// A row's token, or its logits to sample it from on the host.
enum Pick<'a> {
    /// Sampled where the logits are, with its logprobs when the request asked.
    Token(u32, Option<TokenLogprobs>),
    Row(&'a mut [f32]),
}

/// A step sampled where the logits are: one spec per sampled row, the edited rows' edits, and
/// each row's logprob count (None: not asked).
struct DeviceSampling {
    specs: Vec<SampleSpec>,
    edits: Vec<(usize, Vec<LogitEdit>)>,
    top_n: Vec<Option<usize>>,
}

impl DeviceSampling {
    /// Only ids: what an overlapped step (the worker) can do.
    fn ids_only(&self) -> bool {
        self.edits.is_empty() && self.top_n.iter().all(Option::is_none)
    }
}

/// Tokens a sequence may not produce yet: EOS (unless ignored) and its stop tokens, while it
/// has fewer than `min_tokens` outputs.
fn banned(eos: &[u32], seq: &Sequence) -> Vec<u32> {
    let p = &seq.params;
    if seq.num_output_tokens() >= p.min_tokens {
        return vec![];
    }
    eos.iter().filter(|_| !p.ignore_eos).chain(&p.stop_token_ids).copied().collect()
}

/// Starts a guided sequence's constraint (a no-op for the others).
fn start_guide(seq: &mut Sequence) -> Result<(), String> {
    if let Some(g) = &seq.params.guided {
        seq.guide = Some(GuideState { constraint: g.0.start()?, mask: None });
    }
    Ok(())
}

/// A constrained row of a step whose mask is to be computed on a helper thread while the
/// forward runs: (its index among the sampled rows, its sequence, its constraint).
type MaskJob = (usize, SeqId, Box<dyn crate::constraint::Constraint>);

/// A computed mask, with the constraint that gave it (handed back to its sequence).
struct MaskDone {
    row: usize,
    seq: SeqId,
    constraint: Box<dyn crate::constraint::Constraint>,
    mask: Result<Vec<u32>, String>,
    seconds: f64,
}

/// The masks of `jobs`, over `threads` threads (see [`mask_threads`]).
fn compute_masks(jobs: Vec<MaskJob>, vocab: usize, threads: usize) -> Vec<MaskDone> {
    let one = |(row, seq, mut constraint): MaskJob| {
        let t0 = Instant::now();
        let mut mask = vec![u32::MAX; mask_words(vocab)];
        let mask = constraint.fill_mask(&mut mask).map(|()| mask);
        MaskDone { row, seq, constraint, mask, seconds: t0.elapsed().as_secs_f64() }
    };
    if threads <= 1 {
        return jobs.into_iter().map(one).collect();
    }
    // Many constrained rows: spread them over threads, leaving a core to the forward's host
    // side. Each mask depends only on its own constraint, so the split changes no result.
    let per = jobs.len().div_ceil(threads);
    let mut chunks: Vec<Vec<MaskJob>> = vec![];
    let mut it = jobs.into_iter().peekable();
    while it.peek().is_some() {
        chunks.push(it.by_ref().take(per).collect());
    }
    std::thread::scope(|sc| {
        let hs: Vec<_> =
            chunks.into_iter().map(|c| sc.spawn(move || c.into_iter().map(one).collect::<Vec<_>>())).collect();
        hs.into_iter().flat_map(|h| h.join().expect("computing a mask panicked")).collect()
    })
}

/// Threads for `jobs` masks on a machine of `cores`: at least 8 masks a thread (a mask takes
/// tens of microseconds, a thread start about as much), at most one fewer than the cores.
fn mask_threads(jobs: usize, cores: usize) -> usize {
    jobs.div_ceil(8).min(cores.saturating_sub(1)).max(1)
}

/// Whether a mask allows at least one token.
fn admits_some(mask: &[u32]) -> bool {
    mask.iter().any(|&w| w != 0)
}

/// Limits a request is checked against before it is queued.
#[derive(Debug, Clone)]
struct Limits {
    vocab: usize,
    max_model_len: usize,
    num_blocks: usize,
    block_size: usize,
    static_mode: bool,
    max_pending: Option<usize>,
}

impl Limits {
    /// Checks a request; returns the resolved `max_tokens`.
    fn check(&self, req: &Request) -> Result<usize, SubmitError> {
        req.params.validate().map_err(SubmitError::InvalidParams)?;
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
    fn reserve(&self, pending: &AtomicUsize) -> Result<(), SubmitError> {
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

struct RequestState {
    tx: UnboundedSender<RequestOutput>,
    /// Completions not yet ended.
    live: Vec<SeqId>,
    /// Completion indices not forked yet (1..n until the prompt is computed).
    unforked: std::ops::Range<usize>,
    prompt_tokens: usize,
    completion_tokens: usize,
    metrics: Option<RequestMetrics>,
}

/// A step sent to the model worker whose ids the engine has not taken yet (overlapped mode).
struct InFlight {
    /// The scheduler's step id.
    step: u64,
    out: SchedulerOutput,
    /// Per sampled row, in the order of the ids: its sequence and where its placeholder token
    /// sits in the sequence's tokens.
    rows: Vec<(SeqId, usize)>,
    /// The row of each sampled sequence: what the next step's placeholders refer to.
    row_of: IdMap<u32>,
    /// Each scheduled sequence's computed tokens after this step: blocks registered in the
    /// prefix cache once it has come back.
    computed: Vec<(SeqId, usize)>,
    reply: mpsc::Receiver<tandem_core::Result<Vec<u32>>>,
}

pub struct Engine {
    /// The model runner: the worker thread runs overlapped steps with it; a synchronous step
    /// locks it on the engine thread.
    runner: Arc<Mutex<Box<dyn ModelRunner>>>,
    worker: Worker,
    async_scheduling: bool,
    /// Overlapped mode: steps sent and not landed, oldest first (at most two, briefly).
    in_flight: VecDeque<InFlight>,
    scheduler: Scheduler,
    decode: DecodeFn,
    eos: Vec<u32>,
    vocab: usize,
    limits: Limits,
    requests: IdMap<RequestState>,
    stats: Arc<Mutex<Stats>>,
    /// Requests accepted and not finished (shared with handles for the overload check).
    pending: Arc<AtomicUsize>,
    next_request: Arc<AtomicU64>,
    next_seq: SeqId,
    next_arrival: u64,
    seed: u64,
    generation_tokens: u64,
    /// Set once by a fatal forward error; the engine serves nothing after it.
    failure: Arc<OnceLock<String>>,
    /// Where each step's prefix-cache changes go (`EngineConfig::kv_events`).
    kv_events: Option<std::sync::mpsc::Sender<Vec<crate::block_manager::KvEvent>>>,
}

impl Engine {
    pub fn new(runner: Box<dyn ModelRunner>, decode: DecodeFn, cfg: EngineConfig) -> Result<Self, EngineError> {
        let geo = runner.kv_geometry();
        let pick = |v: Option<usize>, cap: usize, name: &str| -> Result<usize, EngineError> {
            match v {
                None => Ok(cap),
                Some(0) => Err(EngineError::Config(format!("{name} must be positive"))),
                Some(x) if x > cap => {
                    Err(EngineError::Config(format!("{name} = {x} exceeds the model runner's limit of {cap}")))
                }
                Some(x) => Ok(x),
            }
        };
        let max_num_batched_tokens =
            pick(cfg.max_num_batched_tokens, runner.max_batch_tokens(), "max_num_batched_tokens")?;
        let max_num_seqs = pick(cfg.max_num_seqs, runner.max_seqs(), "max_num_seqs")?;
        if geo.num_blocks == 0 || !(geo.block_size == 16 || geo.block_size == 32) {
            return Err(EngineError::Config(format!(
                "KV pool of {} blocks of {} tokens: need >= 1 block of 16 or 32 tokens",
                geo.num_blocks, geo.block_size
            )));
        }
        if let BatchMode::Static { batch_size, .. } = cfg.mode {
            if batch_size == 0 || batch_size > max_num_seqs {
                return Err(EngineError::Config(format!(
                    "static batch_size {batch_size} must be in 1..={max_num_seqs} (max_num_seqs)"
                )));
            }
        }
        let model = runner.config();
        let pool_len = geo.slots();
        let max_model_len = cfg.max_model_len.unwrap_or(usize::MAX).min(model.max_position_embeddings).min(pool_len);
        if max_model_len == 0 {
            return Err(EngineError::Config("max_model_len must be positive".into()));
        }
        if pool_len < model.max_position_embeddings.min(cfg.max_model_len.unwrap_or(usize::MAX)) {
            tracing::info!(
                max_model_len,
                model = model.max_position_embeddings,
                "the KV pool holds {pool_len} tokens: max_model_len capped to {max_model_len}"
            );
        }
        let prompt_logit_rows = runner.max_logit_rows().saturating_sub(max_num_seqs);
        let limits = Limits {
            vocab: model.vocab_size,
            max_model_len,
            num_blocks: geo.num_blocks,
            block_size: geo.block_size,
            static_mode: matches!(cfg.mode, BatchMode::Static { .. }),
            max_pending: cfg.max_pending_requests,
        };
        let prefill = prefill_limits(&cfg, max_model_len)?;
        tracing::info!(?prefill, max_num_batched_tokens, "prefill scheduling");
        let mut scheduler = Scheduler::new(SchedulerConfig {
            max_num_batched_tokens,
            max_num_seqs,
            policy: cfg.policy,
            mode: cfg.mode,
            num_blocks: geo.num_blocks,
            block_size: geo.block_size,
            enable_prefix_caching: cfg.enable_prefix_caching,
            resume_protect_steps: cfg.resume_protect_steps,
            prompt_logit_rows,
            prefill,
        });
        let (eos, vocab) = (model.eos_token_ids.clone(), model.vocab_size);
        let runner = Arc::new(Mutex::new(runner));
        let worker = Worker::spawn(runner.clone())
            .map_err(|e| EngineError::Config(format!("cannot start the model worker thread: {e}")))?;
        if cfg.kv_events.is_some() {
            scheduler.bm.record_events();
        }
        Ok(Engine {
            kv_events: cfg.kv_events.clone(),
            eos,
            vocab,
            runner,
            worker,
            async_scheduling: cfg.async_scheduling,
            in_flight: VecDeque::new(),
            scheduler,
            decode,
            limits,
            requests: IdMap::default(),
            stats: Arc::new(Mutex::new(Stats::default())),
            pending: Arc::new(AtomicUsize::new(0)),
            next_request: Arc::new(AtomicU64::new(1)),
            next_seq: 1,
            next_arrival: 0,
            seed: cfg.seed,
            generation_tokens: 0,
            failure: Arc::new(OnceLock::new()),
        })
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }
    pub fn stats(&self) -> Stats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }
    /// Sequences to serve, or a step in flight whose results are still to be taken.
    pub fn has_work(&self) -> bool {
        self.scheduler.has_work() || !self.in_flight.is_empty()
    }
    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    /// Checks and queues a request (synchronous use; threads go through [`EngineHandle`]).
    pub fn add_request(&mut self, req: Request) -> Result<RequestStream, SubmitError> {
        if let Some(f) = self.failure.get() {
            return Err(SubmitError::Stopped(f.clone()));
        }
        let max_tokens = self.limits.check(&req)?;
        self.limits.reserve(&self.pending)?;
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = unbounded_channel();
        self.enqueue(id, req, max_tokens, tx, Instant::now());
        Ok(RequestStream { id, rx, abort: None, finished: false })
    }

    fn enqueue(
        &mut self,
        id: RequestId,
        req: Request,
        max_tokens: usize,
        tx: UnboundedSender<RequestOutput>,
        arrival: Instant,
    ) {
        let seed = self.request_seed(&req.params, id);
        let params = Arc::new(req.params);
        let mut seq = Sequence::new(
            self.next_seq,
            id,
            0,
            req.prompt,
            params,
            max_tokens,
            req.priority,
            self.next_arrival,
            seed,
            arrival,
        );
        let guide = start_guide(&mut seq);
        let state = RequestState {
            tx,
            live: vec![seq.id],
            unforked: 1..seq.params.n,
            prompt_tokens: seq.num_prompt_tokens,
            completion_tokens: 0,
            metrics: None,
        };
        self.next_seq += 1;
        self.next_arrival += 1;
        self.requests.insert(id, state);
        self.scheduler.add(seq);
        if let Err(e) = guide {
            self.end_request(id, FinishReason::Error(format!("cannot start the constraint: {e}")));
        }
    }

    /// The request's own seed, or one derived from the engine's seed and the request id.
    fn request_seed(&self, params: &SamplingParams, rid: RequestId) -> u64 {
        params.seed.unwrap_or_else(|| self.seed ^ rid.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// Ends a request at once, wherever its sequences are, and frees their blocks.
    pub fn abort(&mut self, id: RequestId) {
        self.end_request(id, FinishReason::Abort);
    }

    /// One engine step. Returns the number of sequences that ran.
    ///
    /// Synchronous (`async_scheduling` off): schedule, forward, postprocess; when `step`
    /// returns, the step's tokens are emitted.
    ///
    /// Overlapped (`async_scheduling` on): schedule step N+1 before step N's ids are known,
    /// assuming each row sampled in N gains exactly one token (a [`PLACEHOLDER`] the model
    /// worker replaces with the id it sampled, before it runs N+1), send N+1 to the worker,
    /// then take N's ids and postprocess them (emit, stops, detokenize) while the worker runs
    /// N+1. So a call emits the tokens of the step the call before sent, and a call that has
    /// nothing to schedule drains the pipeline (`has_work` stays true until it is empty). A
    /// row of N+1 whose sequence finished in N is discarded, never emitted; a finished
    /// sequence's blocks are freed once no step in flight writes them. Whenever the next step
    /// depends on host-side results (a row needs logits on the host, a constraint, prompt
    /// logprobs: anything [`needs_host`] or a guide), the pipeline is drained first and the
    /// step runs synchronously, so every request's outputs are the same in both modes.
    /// Returns the sequences sent or landed, whichever is more.
    pub fn step(&mut self) -> usize {
        let ran = if self.async_scheduling { self.step_overlapped() } else { self.step_sync() };
        if let Some(tx) = &self.kv_events {
            let events = self.scheduler.bm.take_events();
            if !events.is_empty() {
                let _ = tx.send(events);
            }
        }
        self.update_stats();
        if let Ok(mut st) = self.stats.lock() {
            st.steps_total += 1;
        }
        ran
    }

    fn step_sync(&mut self) -> usize {
        let out = self.scheduler.schedule(Instant::now());
        // The step's KV high-water mark: taken now, before finished sequences free blocks.
        let scheduled_usage = self.scheduler.bm.usage();
        if !out.is_empty() {
            let sampled = self.forward(&out);
            self.postprocess(&out, sampled);
        }
        self.record_step(out.seqs.len(), out.num_tokens, scheduled_usage, false);
        out.seqs.len()
    }

    fn step_overlapped(&mut self) -> usize {
        if !self.can_overlap() {
            let landed = self.land_all();
            return landed.max(self.step_sync());
        }
        let mut out = self.scheduler.schedule(Instant::now());
        let scheduled_usage = self.scheduler.bm.usage();
        let sent = out.seqs.len();
        let sent_tokens = out.num_tokens;
        if !out.is_empty() {
            match self.device_specs(&out) {
                Some(d) if d.ids_only() => self.dispatch(out, d.specs),
                _ => {
                    // `can_overlap` checks what `device_specs` does, so this is not reached;
                    // were it, the step runs synchronously once its placeholders are known.
                    self.land_all();
                    self.drop_ended(&mut out);
                    let sampled = self.forward(&out);
                    self.postprocess(&out, sampled);
                    self.record_step(sent, sent_tokens, scheduled_usage, false);
                    return sent;
                }
            }
        }
        // The step the last call sent: its ids come back while the worker runs this one.
        let mut landed = 0;
        while self.in_flight.len() > usize::from(sent > 0) {
            landed = landed.max(self.land_one());
        }
        self.record_step(sent, sent_tokens, scheduled_usage, true);
        sent.max(landed)
    }

    fn record_step(&self, batch: usize, tokens: usize, scheduled_usage: f32, overlapped: bool) {
        if let Ok(mut st) = self.stats.lock() {
            st.batch_size = batch;
            st.record_iteration_tokens(tokens);
            st.kv_usage_peak = st.kv_usage_peak.max(scheduled_usage);
            match (batch > 0, overlapped) {
                (false, _) => {}
                (true, true) => st.async_steps_total += 1,
                (true, false) => st.sync_steps_total += 1,
            }
        }
    }

    /// Whether the next step may be scheduled before the one in flight lands: no sequence
    /// needs what only the host has after a step (logits for host sampling or logprobs,
    /// prompt logprobs, a constraint's next mask), or edits its logits (penalties count the
    /// output so far, which includes the token still in flight). Checked over every sequence,
    /// waiting ones too, so that whatever the scheduler picks can be sampled on the device.
    fn can_overlap(&self) -> bool {
        self.failure.get().is_none()
            && self.scheduler.seqs().all(|s| {
                let b = banned(&self.eos, s);
                s.guide.is_none()
                    && s.params.guided.is_none()
                    && s.params.prompt_logprobs.is_none()
                    && s.params.logprobs.is_none()
                    && !needs_host(&s.params, &b, false)
                    && !has_edits(&s.params, &b)
            })
    }

    /// Removes the rows of sequences that ended since `out` was scheduled.
    fn drop_ended(&self, out: &mut SchedulerOutput) {
        out.seqs.retain(|s| self.scheduler.seq(s.seq).is_some());
        out.num_tokens = out.seqs.iter().map(|s| s.num_tokens).sum();
        out.num_logit_rows =
            out.seqs.iter().map(|s| if s.all_logits { s.num_tokens } else { usize::from(s.sample) }).sum();
        out.extra_logit_rows = out.seqs.iter().filter(|s| s.all_logits).map(|s| s.num_tokens - 1).sum();
    }

    /// Sends `out` to the worker without waiting, and moves the scheduler's view past it: its
    /// tokens count as computed and each sampled row's sequence gains a placeholder token.
    fn dispatch(&mut self, out: SchedulerOutput, specs: Vec<SampleSpec>) {
        let step = self.scheduler.current_step();
        let batch = self.scheduler.forward_batch(&out);
        // Placeholders come only from the step in flight (the one before lands before the
        // next schedule), so each refers to a row of the newest step sent.
        let prev = self.in_flight.back();
        let fill: Option<Vec<(u32, u32)>> = batch
            .tokens
            .iter()
            .enumerate()
            .filter(|(_, &t)| t == PLACEHOLDER)
            .map(|(i, _)| {
                prev.and_then(|p| p.row_of.get(&out.seqs[batch.token_seq[i] as usize].seq)).map(|&row| (i as u32, row))
            })
            .collect();
        let Some(fill) = fill else {
            self.land_all();
            return self.fail_batch(&out, "internal: a placeholder token that no step in flight gives");
        };
        let reply = self.worker.dispatch(batch, specs, fill);
        self.scheduler.dispatched(step);
        let (mut rows, mut row_of, mut computed) = (Vec::new(), IdMap::default(), Vec::with_capacity(out.seqs.len()));
        for s in &out.seqs {
            let Some(seq) = self.scheduler.seq_mut(s.seq) else { continue };
            seq.num_computed_tokens += s.num_tokens;
            computed.push((s.seq, seq.num_computed_tokens));
            if s.sample {
                row_of.insert(s.seq, rows.len() as u32);
                rows.push((s.seq, seq.tokens.len()));
                seq.tokens.push(PLACEHOLDER);
            }
        }
        self.in_flight.push_back(InFlight { step, out, rows, row_of, computed, reply });
    }

    /// Takes every step in flight.
    fn land_all(&mut self) -> usize {
        let mut landed = 0;
        while !self.in_flight.is_empty() {
            landed = landed.max(self.land_one());
        }
        landed
    }

    /// Waits for the oldest step in flight and postprocesses it: its blocks join the prefix
    /// cache, each row's id replaces its placeholder and is emitted (rows of sequences that
    /// ended meanwhile are dropped). Returns its number of sequences.
    fn land_one(&mut self) -> usize {
        let Some(f) = self.in_flight.pop_front() else { return 0 };
        let result = f.reply.recv().unwrap_or_else(|_| Err(worker_gone()));
        self.scheduler.landed(f.step, self.in_flight.front().map(|n| n.step));
        let rows = f.rows.len();
        let ids = match result {
            Ok(ids) if ids.len() == rows => Ok(ids),
            Ok(ids) => Err(format!("model returned {} token ids for {rows} rows", ids.len())),
            Err(e) => Err(self.forward_error(e)),
        };
        match ids {
            Ok(ids) => {
                for &(id, n) in &f.computed {
                    self.scheduler.cache_computed(id, n);
                }
                let now = Instant::now();
                for (&(id, at), token) in f.rows.iter().zip(ids) {
                    self.sample_and_emit(id, Pick::Token(token, None), Some(at), now);
                }
            }
            Err(e) => {
                self.fail_batch(&f.out, &e);
                if self.failure.get().is_some() {
                    self.fail_all(&e);
                }
            }
        }
        f.out.seqs.len()
    }

    /// Why the engine stopped for good (a fatal forward error), if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    /// A forward error as the batch's failure message; a fatal one also stops the engine.
    fn forward_error(&self, e: tandem_core::Error) -> String {
        if e.is_fatal() {
            let _ = self.failure.set(e.to_string());
        }
        e.to_string()
    }

    /// Runs the step's batch. Token ids come back from the model when every row can be sampled
    /// where the logits are; one row that needs the host (see [`needs_host`]) brings the whole
    /// step's logits back instead. Both give the same ids for a row without penalties.
    fn forward(&mut self, out: &SchedulerOutput) -> Result<Sampled, String> {
        let batch = self.scheduler.forward_batch(out);
        let rows = batch.logit_rows.len();
        // The constraints of the rows sampled this step give their masks while the model runs
        // (row: the index among the sampled rows, which is the spec's on the device path).
        let jobs: Vec<MaskJob> = out
            .seqs
            .iter()
            .filter(|s| s.sample)
            .enumerate()
            .filter_map(|(row, s)| {
                let seq = self.scheduler.seq_mut(s.seq)?;
                let g = seq.guide.take()?;
                Some((row, s.seq, g.constraint))
            })
            .collect();
        let device = self.device_specs(out);
        // Synchronous: the forward runs on this thread, the runner borrowed from the worker
        // (idle: nothing is in flight), which saves two thread hand-offs a step (measured
        // with benches/scheduler.rs, 256 decodes, null model, on a loaded 2-core machine:
        // ~580 us/step through the worker, ~410-460 us direct; noisy).
        let mut guard = match self.runner.lock() {
            Ok(g) => g,
            Err(_) => return Err(self.forward_error(worker_gone())),
        };
        let (vocab, runner) = (self.vocab, &mut **guard);
        let (result, masks) = std::thread::scope(|sc| {
            let mut handle = (!jobs.is_empty()).then(|| {
                sc.spawn(move || {
                    let threads = mask_threads(jobs.len(), std::thread::available_parallelism().map_or(1, |n| n.get()));
                    compute_masks(jobs, vocab, threads)
                })
            });
            let mut joined: Option<Vec<MaskDone>> = None;
            let join = |h: &mut Option<std::thread::ScopedJoinHandle<'_, Vec<MaskDone>>>| {
                h.take().map(|h| h.join().expect("computing a mask panicked")).unwrap_or_default()
            };
            let result = match device {
                Some(DeviceSampling { specs, edits, top_n })
                    if handle.is_some() || !edits.is_empty() || top_n.iter().any(Option::is_some) =>
                {
                    // Masked and edited rows sample on the device too: only their masks and
                    // edits go up.
                    let mut edits = Some(edits);
                    let mut provide = || {
                        let done = join(&mut handle);
                        let mut m = RowMasks::none(specs.len(), vocab);
                        for d in done.iter().filter(|d| d.mask.as_ref().is_ok_and(|m| admits_some(m))) {
                            m.set(d.row, d.mask.as_ref().expect("filtered on Ok"));
                        }
                        for (row, e) in edits.take().unwrap_or_default() {
                            m.set_edits(row, e);
                        }
                        joined = Some(done);
                        Ok(m)
                    };
                    if top_n.iter().any(Option::is_some) {
                        runner
                            .forward_sampled_logprobs(&batch, &specs, &mut provide, &top_n)
                            .map(|(ids, lps)| Sampled::IdsLogprobs(ids, lps))
                    } else {
                        runner.forward_sampled_masked(&batch, &specs, &mut provide).map(Sampled::Ids)
                    }
                }
                Some(DeviceSampling { specs, .. }) => runner.forward_sampled(&batch, &specs).map(Sampled::Ids),
                None => runner.forward(&batch).map(Sampled::Logits),
            };
            let masks = joined.take().unwrap_or_else(|| join(&mut handle));
            (result, masks)
        });
        drop(guard);
        let mut mask_seconds = Vec::with_capacity(masks.len());
        for d in masks {
            mask_seconds.push(d.seconds);
            if let Some(seq) = self.scheduler.seq_mut(d.seq) {
                seq.guide = Some(GuideState { constraint: d.constraint, mask: Some(d.mask) });
            }
        }
        if !mask_seconds.is_empty() {
            if let Ok(mut st) = self.stats.lock() {
                st.record_masks(&mask_seconds);
            }
        }
        match result.map_err(|e| self.forward_error(e))? {
            Sampled::Ids(ids) if ids.len() != rows => {
                Err(format!("model returned {} token ids for {rows} rows", ids.len()))
            }
            Sampled::IdsLogprobs(ids, lps) if ids.len() != rows || lps.len() != rows => {
                Err(format!("model returned {} token ids and {} logprobs for {rows} rows", ids.len(), lps.len()))
            }
            Sampled::Logits(l) if l.len() != rows * self.vocab => {
                Err(format!("model returned {} logits for {rows} rows of vocabulary {}", l.len(), self.vocab))
            }
            ok => Ok(ok),
        }
    }

    /// One spec per sampled row, or None when some row must be sampled on the host.
    /// The step's sampling specs and each edited row's edits (row: its index among the
    /// sampled rows) when every row can be sampled on the device; None: the host samples.
    fn device_specs(&self, out: &SchedulerOutput) -> Option<DeviceSampling> {
        let mut specs = Vec::with_capacity(out.seqs.len());
        let mut edits = vec![];
        let mut top_n = Vec::with_capacity(out.seqs.len());
        for s in out.seqs.iter().filter(|s| s.sample || s.all_logits) {
            // Prompt logprobs need every position's logits on the host.
            if s.all_logits {
                return None;
            }
            let seq = self.scheduler.seq(s.seq)?;
            let b = banned(&self.eos, seq);
            if needs_host(&seq.params, &b, seq.guide.is_some() || seq.params.guided.is_some()) {
                return None;
            }
            if has_edits(&seq.params, &b) {
                edits.push((specs.len(), penalty_edits(&seq.params, seq.prompt(), seq.output(), &b, self.vocab)));
            }
            top_n.push(seq.params.logprobs);
            specs.push(spec(&seq.params, seq.seed, seq.index, seq.num_output_tokens()));
        }
        Some(DeviceSampling { specs, edits, top_n })
    }

    fn postprocess(&mut self, out: &SchedulerOutput, sampled: Result<Sampled, String>) {
        let sampled = match sampled {
            Ok(s) => s,
            Err(e) => {
                self.fail_batch(out, &e);
                if self.failure.get().is_some() {
                    self.fail_all(&e);
                }
                return;
            }
        };
        self.scheduler.complete_step(out);
        let now = Instant::now();
        match sampled {
            Sampled::Ids(ids) => {
                let seqs = out.seqs.iter().filter(|s| s.sample).map(|s| s.seq);
                for (id, token) in seqs.zip(ids) {
                    self.sample_and_emit(id, Pick::Token(token, None), None, now);
                }
            }
            Sampled::IdsLogprobs(ids, lps) => {
                let seqs = out.seqs.iter().filter(|s| s.sample).map(|s| s.seq);
                for ((id, token), lp) in seqs.zip(ids).zip(lps) {
                    self.sample_and_emit(id, Pick::Token(token, lp), None, now);
                }
            }
            Sampled::Logits(mut logits) => {
                let mut rows = logits.chunks_exact_mut(self.vocab.max(1));
                for s in out.seqs.iter().filter(|s| s.sample || s.all_logits) {
                    if s.all_logits {
                        let chunk: Vec<&mut [f32]> = rows.by_ref().take(s.num_tokens).collect();
                        if let Some(row) = self.score_prompt(s.seq, s.num_tokens, chunk) {
                            self.sample_and_emit(s.seq, Pick::Row(row), None, now);
                        }
                    } else {
                        let row = rows.next().expect("forward checked the logits' length");
                        self.sample_and_emit(s.seq, Pick::Row(row), None, now);
                    }
                }
            }
        }
    }

    /// Records prompt logprobs from the rows of a chunk that computed every position (row `j`
    /// is position `start + j`, whose logits score token `start + j + 1`); returns the last row
    /// when the chunk also samples. Rows of positions scored before (a recompute after
    /// preemption) are skipped.
    fn score_prompt<'a>(&mut self, id: SeqId, n: usize, mut rows: Vec<&'a mut [f32]>) -> Option<&'a mut [f32]> {
        let seq = self.scheduler.seq_mut(id)?;
        let start = seq.num_computed_tokens - n;
        let k = seq.params.prompt_logprobs.unwrap_or(0);
        let sample = seq.num_computed_tokens == seq.num_tokens();
        let (tokens, p) = (&seq.tokens, seq.num_prompt_tokens);
        if let Some(lps) = seq.prompt_logprobs.as_mut() {
            for (j, row) in rows.iter().enumerate() {
                let next = start + j + 1;
                if next < p && lps.len() == next {
                    lps.push(Some(logprobs(row, tokens[next], k)));
                    seq.prompt_ranks.push(crate::sampler::rank(row, tokens[next]));
                }
            }
        }
        if sample {
            rows.pop()
        } else {
            None
        }
    }

    /// After a fatal error: every request left (waiting, or running outside the failed batch)
    /// fails too; nothing is ever scheduled on the lost device again.
    fn fail_all(&mut self, err: &str) {
        tracing::error!("the device is lost; the engine stops serving: {err}");
        let open: Vec<RequestId> = self.requests.keys().copied().collect();
        for r in open {
            self.end_request(r, FinishReason::Error(format!("the engine stopped after a fatal device error: {err}")));
        }
    }

    /// A failed forward fails every request that had a sequence in the batch; the engine goes
    /// on unless the error is fatal.
    fn fail_batch(&mut self, out: &SchedulerOutput, err: &str) {
        tracing::error!("forward failed for {} sequences: {err}", out.seqs.len());
        if let Ok(mut s) = self.stats.lock() {
            s.forward_errors_total += 1;
        }
        let reqs: Vec<RequestId> =
            out.seqs.iter().filter_map(|s| self.scheduler.seq(s.seq)).map(|s| s.request_id).collect();
        for r in reqs {
            self.end_request(r, FinishReason::Error(format!("model forward failed: {err}")));
        }
    }

    /// Turns a row's pick into the sequence's next token and emits it. `at`: where the
    /// token's placeholder sits (overlapped mode: the sequence's tokens already count it, and
    /// may hold the next step's placeholder after it); None: the token is appended.
    fn sample_and_emit(&mut self, id: SeqId, pick: Pick<'_>, at: Option<usize>, now: Instant) {
        let (eos, decode, max_model_len) = (&self.eos, &self.decode, self.limits.max_model_len);
        let Some(seq) = self.scheduler.seq_mut(id) else { return };
        let p = seq.params.clone();
        let prompt_logprobs = seq.prompt_logprobs.take();
        let prompt_ranks = if prompt_logprobs.is_some() { std::mem::take(&mut seq.prompt_ranks) } else { Vec::new() };
        if seq.max_tokens == 0 {
            // Scoring only (echo with max_tokens 0): the prompt's logprobs are the answer.
            let mut o = RequestOutput::new(seq.request_id, seq.index);
            o.prompt_logprobs = prompt_logprobs;
            o.prompt_ranks = prompt_ranks;
            return self.end_seq(id, FinishReason::Length, o);
        }
        // Output tokens before this one.
        let before = at.map_or(seq.num_output_tokens(), |a| a - seq.num_prompt_tokens);
        let under_min = before < p.min_tokens;
        let (token, raw, device_lp) = match pick {
            Pick::Token(t, lp) => {
                // Sampled on the device with the mask, when it was usable.
                if let Some(g) = seq.guide.as_mut() {
                    let usable = match g.mask.take() {
                        Some(Ok(mask)) if admits_some(&mask) => Ok(()),
                        Some(Ok(_)) => Err("the constraint admits no token here".to_string()),
                        Some(Err(e)) => Err(format!("the constraint failed: {e}")),
                        None => Err("no mask was computed for a constrained row".to_string()),
                    };
                    if let Err(e) = usable {
                        let o = RequestOutput::new(seq.request_id, seq.index);
                        return self.end_seq(id, FinishReason::Error(e), o);
                    }
                }
                (t, None, lp)
            }
            Pick::Row(row) => {
                let raw = p.logprobs.map(|_| row.to_vec());
                apply_penalties(row, &p, seq.prompt(), seq.output(), &banned(eos, seq));
                if let Some(g) = seq.guide.as_mut() {
                    let allowed = match g.mask.take() {
                        Some(Ok(mask)) => Ok(apply_mask(row, &mask)),
                        Some(Err(e)) => Err(format!("the constraint failed: {e}")),
                        None => Err("no mask was computed for a constrained row".to_string()),
                    };
                    // `row` is finite where allowed unless a ban took it too (EOS under min_tokens).
                    let usable = allowed.and_then(|_| match row.iter().any(|x| *x > f32::NEG_INFINITY) {
                        true => Ok(()),
                        false => Err("the constraint admits no token here".to_string()),
                    });
                    if let Err(e) = usable {
                        let o = RequestOutput::new(seq.request_id, seq.index);
                        return self.end_seq(id, FinishReason::Error(e), o);
                    }
                }
                (sample(row, &spec(&p, seq.seed, seq.index, seq.num_output_tokens())), raw, None)
            }
        };
        seq.commit_token(at, token, now);
        let mut guide_done = false;
        if let Some(g) = seq.guide.as_mut() {
            if let Err(e) = g.constraint.commit(token) {
                let o = RequestOutput::new(seq.request_id, seq.index);
                return self.end_seq(id, FinishReason::Error(format!("the constraint rejected token {token}: {e}")), o);
            }
            guide_done = g.constraint.is_finished();
        }

        let stops: &[String] = if under_min { &[] } else { &p.stop };
        let stop_token = !under_min && ((!p.ignore_eos && eos.contains(&token)) || p.stop_token_ids.contains(&token));
        let mut reason = None;
        if stop_token {
            reason = Some(FinishReason::Stop { stop_string: None, stop_token: Some(token) });
        } else if let Some(s) = seq.text.push_keeping(decode, token, stops, p.include_stop_str_in_output) {
            reason = Some(FinishReason::Stop { stop_string: Some(s), stop_token: None });
        } else if guide_done
            && !eos.is_empty()
            && !p.ignore_eos
            && before + 1 >= p.min_tokens
            && before + 2 <= seq.max_tokens
            && seq.num_prompt_tokens + before + 2 <= max_model_len
        {
            // The grammar is complete; as vLLM, the model samples the end-of-sequence token it
            // forces next (counted as an output token, left out of the text).
            if let Some(g) = seq.guide.as_mut() {
                g.constraint = Box::new(crate::constraint::EndOnly::new(eos.clone()));
            }
        } else if guide_done {
            // The grammar is complete: what it describes is whole (OpenAI's "stop").
            reason = Some(FinishReason::Stop { stop_string: None, stop_token: None });
        } else if before + 1 >= seq.max_tokens || seq.num_prompt_tokens + before + 1 >= max_model_len {
            reason = Some(FinishReason::Length);
        }
        if reason.is_some() {
            seq.text.finish(decode);
        }
        let mut o = RequestOutput::new(seq.request_id, seq.index);
        o.token_ids.push(token);
        o.text = seq.text.take_new(stops, reason.is_some());
        o.prompt_logprobs = prompt_logprobs;
        o.prompt_ranks = prompt_ranks;
        if let (Some(_), Some(lp)) = (p.logprobs, device_lp) {
            o.logprobs.push(lp);
        } else if let (Some(n), Some(raw)) = (p.logprobs, raw) {
            o.logprobs.push(logprobs(&raw, token, n));
        }
        let (rid, fork) = (seq.request_id, !seq.forked && p.n > 1);
        if fork {
            seq.forked = true;
        }
        self.generation_tokens += 1;
        if let Some(r) = self.requests.get_mut(&rid) {
            r.completion_tokens += 1;
        }
        if fork {
            self.fork_completions(id, rid, p.n);
        }
        match reason {
            Some(reason) => self.end_seq(id, reason, o),
            None => {
                // The receiver is gone: nobody wants this request any more.
                if self.requests.get(&rid).is_some_and(|r| r.tx.send(o).is_err()) {
                    self.abort(rid);
                }
            }
        }
    }

    /// Starts completions 1..n of a request off its first sequence's computed prompt.
    fn fork_completions(&mut self, parent: SeqId, rid: RequestId, n: usize) {
        let Some(p) = self.scheduler.seq(parent) else { return };
        let (prompt, params, max_tokens, priority, arrival) =
            (p.prompt().to_vec(), p.params.clone(), p.max_tokens, p.priority, p.times.arrival);
        let seed = self.request_seed(&params, rid);
        for index in 1..n {
            let mut child = Sequence::new(
                self.next_seq,
                rid,
                index,
                prompt.clone(),
                params.clone(),
                max_tokens,
                priority,
                self.next_arrival,
                seed,
                arrival,
            );
            if let Err(e) = start_guide(&mut child) {
                // Each completion starts its own constraint; one that cannot fails the request.
                return self.end_request(rid, FinishReason::Error(format!("cannot start the constraint: {e}")));
            }
            self.next_seq += 1;
            self.next_arrival += 1;
            if let Some(r) = self.requests.get_mut(&rid) {
                r.live.push(child.id);
                r.unforked = 0..0;
            }
            self.scheduler.fork(parent, child);
        }
    }

    /// Ends one completion: frees its blocks, and sends `o` (the request's last message when
    /// this was its last live completion).
    fn end_seq(&mut self, id: SeqId, reason: FinishReason, mut o: RequestOutput) {
        let now = Instant::now();
        let Some(seq) = self.scheduler.remove(id) else { return };
        let Some(r) = self.requests.get_mut(&seq.request_id) else { return };
        r.live.retain(|&s| s != id);
        if seq.index == 0 {
            r.metrics = Some(RequestMetrics::from_times(&seq.times, now, seq.num_preemptions));
        }
        if let Ok(mut s) = self.stats.lock() {
            s.count_finish(&reason);
        }
        o.finish_reason = Some(reason);
        if r.live.is_empty() {
            o.finished = true;
            o.usage = Some(Usage { prompt_tokens: r.prompt_tokens, completion_tokens: r.completion_tokens });
            o.metrics = r.metrics.take();
            let r = self.requests.remove(&seq.request_id).expect("looked up above");
            self.pending.fetch_sub(1, Ordering::AcqRel);
            // The gauges first: a client that has its final output must not then read /metrics
            // still counting its request (with async scheduling the step's own update comes
            // only after the next step is sent; serve_wgpu raced it).
            self.update_stats();
            let _ = r.tx.send(o); // a caller that left does not need its last message
        } else {
            let _ = r.tx.send(o);
        }
    }

    /// Ends every live completion of a request with `reason`.
    fn end_request(&mut self, rid: RequestId, reason: FinishReason) {
        let Some(r) = self.requests.get_mut(&rid) else { return };
        // Completions that never started still get their finish reason.
        for index in std::mem::replace(&mut r.unforked, 0..0) {
            let mut o = RequestOutput::new(rid, index);
            o.finish_reason = Some(reason.clone());
            let _ = r.tx.send(o);
        }
        for id in r.live.clone() {
            let index = self.scheduler.seq(id).map_or(0, |s| s.index);
            self.end_seq(id, reason.clone(), RequestOutput::new(rid, index));
        }
    }

    fn update_stats(&mut self) {
        let s = &self.scheduler;
        if let Ok(mut st) = self.stats.lock() {
            st.num_running = s.num_running();
            st.num_waiting = s.num_waiting();
            st.kv_usage = s.kv_usage();
            st.prefix_cache_queries_total = s.bm.prefix_queries_tokens;
            st.prefix_cache_hits_total = s.bm.prefix_hits_tokens;
            st.preemptions_total = s.num_preemptions;
            st.prompt_tokens_total = s.num_prompt_tokens;
            st.generation_tokens_total = self.generation_tokens;
        }
    }
}

impl Drop for Engine {
    /// Whatever stops the engine (shutdown, or a bug unwinding the thread), every request still
    /// open gets its final output.
    fn drop(&mut self) {
        for (rid, r) in self.requests.drain() {
            let mut o = RequestOutput::new(rid, 0);
            o.finish_reason = Some(FinishReason::Error("the engine stopped".into()));
            o.finished = true;
            o.usage = Some(Usage { prompt_tokens: r.prompt_tokens, completion_tokens: r.completion_tokens });
            let _ = r.tx.send(o);
        }
    }
}

enum Command {
    Submit { id: RequestId, req: Box<Request>, max_tokens: usize, tx: UnboundedSender<RequestOutput>, arrival: Instant },
    Abort(RequestId),
    Shutdown,
}

impl Engine {
    /// Runs the engine on its own thread.
    pub fn spawn(
        runner: Box<dyn ModelRunner>,
        decode: DecodeFn,
        cfg: EngineConfig,
    ) -> Result<EngineHandle, EngineError> {
        let engine = Engine::new(runner, decode, cfg)?;
        let (tx, rx) = mpsc::channel();
        let inner = HandleInner {
            cmd: tx,
            limits: engine.limits.clone(),
            stats: engine.stats.clone(),
            failure: engine.failure.clone(),
            pending: engine.pending.clone(),
            next_request: engine.next_request.clone(),
            thread: Mutex::new(None),
        };
        let thread = std::thread::Builder::new()
            .name("tandem-engine".into())
            .spawn(move || engine.run(rx))
            .map_err(|e| EngineError::Config(format!("cannot start the engine thread: {e}")))?;
        *inner.thread.lock().expect("fresh mutex") = Some(thread);
        Ok(EngineHandle { inner: Arc::new(inner) })
    }

    fn run(mut self, rx: mpsc::Receiver<Command>) {
        loop {
            // Take every command waiting; block only when there is nothing to do.
            loop {
                let cmd = if self.has_work() {
                    match rx.try_recv() {
                        Ok(c) => c,
                        Err(_) => break,
                    }
                } else {
                    match rx.recv() {
                        Ok(c) => c,
                        Err(_) => return,
                    }
                };
                if !self.handle(cmd) {
                    return;
                }
            }
            if self.step() == 0 && self.has_work() {
                // Nothing could run: a static batch is gathering, or every candidate is
                // protected from preemption for a few more steps.
                let wait = self
                    .scheduler
                    .next_deadline()
                    .map_or(Duration::from_millis(1), |d| d.saturating_duration_since(Instant::now()));
                if let Ok(cmd) = rx.recv_timeout(wait.max(Duration::from_micros(50))) {
                    if !self.handle(cmd) {
                        return;
                    }
                }
            }
        }
    }

    /// False on shutdown.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Submit { id, req, max_tokens, tx, arrival } => {
                self.enqueue(id, *req, max_tokens, tx, arrival);
                // Submitted before the handle saw the failure: it still gets its one final output.
                if let Some(f) = self.failure.get().cloned() {
                    self.end_request(
                        id,
                        FinishReason::Error(format!("the engine stopped after a fatal device error: {f}")),
                    );
                    self.update_stats();
                }
            }
            Command::Abort(id) => {
                self.abort(id);
                // The engine may go idle now; the gauges must not keep showing the aborted request.
                self.update_stats();
            }
            Command::Shutdown => {
                let open: Vec<RequestId> = self.requests.keys().copied().collect();
                for rid in open {
                    self.abort(rid);
                }
                self.update_stats();
                return false;
            }
        }
        true
    }
}

struct HandleInner {
    cmd: mpsc::Sender<Command>,
    limits: Limits,
    stats: Arc<Mutex<Stats>>,
    failure: Arc<OnceLock<String>>,
    pending: Arc<AtomicUsize>,
    next_request: Arc<AtomicU64>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// A cheap, cloneable handle to an engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    inner: Arc<HandleInner>,
}

impl EngineHandle {
    /// Checks the request now and queues it; its outputs arrive on the returned stream.
    pub fn submit(&self, req: Request) -> Result<RequestStream, SubmitError> {
        let h = &self.inner;
        if let Some(f) = h.failure.get() {
            return Err(SubmitError::Stopped(f.clone()));
        }
        let max_tokens = h.limits.check(&req)?;
        h.limits.reserve(&h.pending)?;
        let id = h.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = unbounded_channel();
        if h.cmd.send(Command::Submit { id, req: Box::new(req), max_tokens, tx, arrival: Instant::now() }).is_err() {
            h.pending.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::Stopped("the engine thread has exited".into()));
        }
        Ok(RequestStream { id, rx, abort: Some(h.cmd.clone()), finished: false })
    }

    /// Aborts a request wherever it is; its blocks are freed at the engine's next look at its
    /// commands (before its next step). Unknown or finished ids are ignored.
    pub fn abort(&self, id: RequestId) {
        let _ = self.inner.cmd.send(Command::Abort(id));
    }

    pub fn stats(&self) -> Stats {
        self.inner.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Why the engine stopped serving for good (a fatal device error), if it did; the server's
    /// /health answers 503 with it.
    pub fn failure(&self) -> Option<String> {
        self.inner.failure.get().cloned()
    }

    /// Longest prompt + output the engine accepts.
    pub fn max_model_len(&self) -> usize {
        self.inner.limits.max_model_len
    }

    /// The KV pool: tokens a block holds, and blocks.
    pub fn kv_blocks(&self) -> (usize, usize) {
        (self.inner.limits.block_size, self.inner.limits.num_blocks)
    }

    /// Aborts every open request, stops the thread and waits for it.
    pub fn shutdown(&self) {
        let _ = self.inner.cmd.send(Command::Shutdown);
        let thread = self.inner.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// The outputs of one request. Dropping it before the final output aborts the request.
pub struct RequestStream {
    id: RequestId,
    rx: UnboundedReceiver<RequestOutput>,
    abort: Option<mpsc::Sender<Command>>,
    finished: bool,
}

impl RequestStream {
    pub fn id(&self) -> RequestId {
        self.id
    }

    fn note(&mut self, o: Option<RequestOutput>) -> Option<RequestOutput> {
        if o.as_ref().is_none_or(|o| o.finished) {
            self.finished = true;
        }
        o
    }

    /// The next output; None after the final one.
    pub async fn recv(&mut self) -> Option<RequestOutput> {
        let o = self.rx.recv().await;
        self.note(o)
    }

    /// The next output, blocking this thread (not for use inside an async runtime).
    pub fn blocking_recv(&mut self) -> Option<RequestOutput> {
        let o = self.rx.blocking_recv();
        self.note(o)
    }

    /// Polls for the next output (what a `Stream` implementation needs); `Ready(None)` after
    /// the final one.
    pub fn poll_recv(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<RequestOutput>> {
        match self.rx.poll_recv(cx) {
            std::task::Poll::Ready(o) => std::task::Poll::Ready(self.note(o)),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }

    /// The next output if one is ready.
    pub fn try_recv(&mut self) -> Option<RequestOutput> {
        let o = self.rx.try_recv().ok();
        if o.as_ref().is_some_and(|o| o.finished) {
            self.finished = true;
        }
        o
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if let (false, Some(tx)) = (self.finished, &self.abort) {
            let _ = tx.send(Command::Abort(self.id));
        }
    }
}

#[cfg(test)]
mod mask_tests {
    use super::*;
    use crate::constraint::AllowedTokens;
    use crate::constraint::ConstraintFactory;

    #[test]
    fn mask_threads_leave_a_core_and_take_eight_masks_each() {
        assert_eq!(mask_threads(1, 16), 1);
        assert_eq!(mask_threads(8, 16), 1);
        assert_eq!(mask_threads(9, 16), 2);
        assert_eq!(mask_threads(64, 16), 8);
        assert_eq!(mask_threads(256, 16), 15);
        assert_eq!(mask_threads(64, 2), 1);
        assert_eq!(mask_threads(64, 1), 1);
    }

    /// Split over 4 threads (10 jobs each), every job comes back with its own mask.
    #[test]
    fn masks_computed_in_parallel_belong_to_their_rows() {
        let jobs: Vec<MaskJob> =
            (0..40).map(|i| (i, 100 + i as u64, AllowedTokens(vec![i as u32]).start().unwrap())).collect();
        let mut done = compute_masks(jobs, 64, 4);
        assert_eq!(done.len(), 40);
        done.sort_by_key(|d| d.row);
        for (i, d) in done.iter().enumerate() {
            assert_eq!((d.row, d.seq), (i, 100 + i as u64));
            let m = d.mask.as_ref().unwrap();
            assert_eq!(m.iter().map(|w| w.count_ones()).sum::<u32>(), 1);
            assert_eq!(m[i / 32] >> (i % 32) & 1, 1);
        }
    }
}
