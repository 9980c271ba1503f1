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
//!
//! Here: the engine's state, building it, admitting requests, the step, and how requests and
//! completions end. The step's parts are submodules: `forward` (the model call, and the masks
//! computed meanwhile), `postprocess` (tokens into sequences and outputs), `overlap` (the
//! async-scheduling pipeline), `speculate` (drafts proposed before the schedule, verified
//! after the forward); `thread` runs the engine behind an [`EngineHandle`].

mod forward;
mod lora;
mod overlap;
mod postprocess;
mod speculate;
mod thread;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use tandem_core::ModelRunner;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use self::overlap::InFlight;
use self::speculate::Speculator;
pub(crate) use self::thread::Command;
use crate::adapters::Adapters;
use crate::admission::Admission;
pub use crate::admission::SubmitError;
use crate::block_manager::KvEvent;
use crate::config::prefill_limits;
pub use crate::config::{EngineConfig, EngineError};
use crate::detokenize::DecodeFn;
pub use crate::handle::EngineHandle;
use crate::metrics::{RequestMetrics, Stats};
use crate::request::RequestState;
pub use crate::request::{Request, RequestOutput, Usage};
pub use crate::request_stream::RequestStream;
use crate::sampling_params::SamplingParams;
use crate::scheduler::{BatchMode, Scheduler, SchedulerConfig, SchedulerOutput};
use crate::sequence::{FinishReason, GuideState, IdMap, RequestId, SeqId, Sequence};
use crate::worker::Worker;

/// A continuous-batching engine over one model runner (see the module docs).
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
    admission: Admission,
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
    kv_events: Option<Sender<Vec<KvEvent>>>,
    /// Speculative decoding, when configured (`EngineConfig::speculative`).
    speculator: Option<Speculator>,
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
        let mut adapters = Adapters::new(&runner.lora_slots());
        if !cfg.lora_modules.is_empty() {
            if !adapters.enabled() {
                return Err(EngineError::Config("LoRA modules named, but the model has no LoRA slots".into()));
            }
            adapters.name_at_start(&cfg.lora_modules).map_err(EngineError::Config)?;
        }
        adapters.set_max_cpu(cfg.max_cpu_loras);
        let admission = Admission {
            vocab: model.vocab_size,
            max_model_len,
            num_blocks: geo.num_blocks,
            block_size: geo.block_size,
            static_mode: matches!(cfg.mode, BatchMode::Static { .. }),
            max_pending: cfg.max_pending_requests,
            adapters: adapters.known(),
        };
        let prefill = prefill_limits(&cfg, max_model_len)?;
        if let Some(s) = &cfg.speculative {
            s.validate().map_err(EngineError::Config)?;
        }
        let stats = Stats {
            spec_decode_num_accepted_tokens_per_pos: vec![
                0;
                cfg.speculative
                    .as_ref()
                    .map_or(0, |s| s.num_speculative_tokens)
            ],
            ..Stats::default()
        };
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
        scheduler.adapters = adapters;
        let (eos, vocab) = (model.eos_token_ids.clone(), model.vocab_size);
        let mut runner = runner;
        let speculator = cfg
            .speculative
            .clone()
            .map(|s| {
                Speculator::new(s, &mut *runner, cfg.enable_prefix_caching.then_some((geo.block_size, geo.num_blocks)))
            })
            .transpose()
            .map_err(EngineError::Config)?;
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
            admission,
            requests: IdMap::default(),
            stats: Arc::new(Mutex::new(stats)),
            pending: Arc::new(AtomicUsize::new(0)),
            next_request: Arc::new(AtomicU64::new(1)),
            next_seq: 1,
            next_arrival: 0,
            seed: cfg.seed,
            generation_tokens: 0,
            failure: Arc::new(OnceLock::new()),
            speculator,
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
        self.add_request_with_adapter(req, None)
    }

    /// As [`Self::add_request`], under LoRA slot `adapter` (see [`EngineHandle::submit_with_adapter`]).
    pub fn add_request_with_adapter(
        &mut self,
        req: Request,
        adapter: Option<u32>,
    ) -> Result<RequestStream, SubmitError> {
        if let Some(f) = self.failure.get() {
            return Err(SubmitError::Stopped(f.clone()));
        }
        let max_tokens = self.admission.check(&req, adapter)?;
        self.admission.reserve(&self.pending)?;
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = unbounded_channel();
        self.enqueue(id, req, adapter, max_tokens, tx, Instant::now());
        Ok(RequestStream::new(id, rx, None))
    }

    fn enqueue(
        &mut self,
        id: RequestId,
        req: Request,
        adapter: Option<u32>,
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
        seq.adapter = adapter;
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
    /// assuming each row sampled in N gains exactly one token (a
    /// [`PLACEHOLDER`](crate::worker::PLACEHOLDER) the model worker replaces with the id it
    /// sampled, before it runs N+1), send N+1 to the worker, then take N's ids and postprocess
    /// them (emit, stops, detokenize) while the worker runs N+1. So a call emits the tokens of
    /// the step the call before sent, and a call that has nothing to schedule drains the
    /// pipeline (`has_work` stays true until it is empty). A row of N+1 whose sequence
    /// finished in N is discarded, never emitted; a finished sequence's blocks are freed once
    /// no step in flight writes them. Whenever the next step depends on host-side results (a
    /// row needs logits on the host, a constraint, prompt logprobs: anything
    /// [`needs_host`](crate::sampler::needs_host) or a guide), the pipeline is drained first
    /// and the step runs synchronously, so every request's outputs are the same in both modes.
    /// Returns the sequences sent or landed, whichever is more.
    pub fn step(&mut self) -> usize {
        self.swap_in_adapters();
        let ran = if self.async_scheduling { self.step_overlapped() } else { self.step_sync() };
        if let Some(tx) = &self.kv_events {
            let events = self.scheduler.bm.take_events();
            if !events.is_empty() {
                let _ = tx.send(events);
            }
        }
        self.free_unused_adapters();
        self.update_stats();
        if let Ok(mut st) = self.stats.lock() {
            st.steps_total += 1;
        }
        ran
    }

    fn step_sync(&mut self) -> usize {
        self.propose_drafts();
        let out = self.scheduler.schedule(Instant::now());
        self.record_attention(&out);
        // The step's KV high-water mark: taken now, before finished sequences free blocks.
        let scheduled_usage = self.scheduler.bm.usage();
        if !out.is_empty() {
            let sampled = self.forward(&out);
            self.postprocess(&out, sampled);
        }
        self.record_step(out.seqs.len(), out.num_tokens, scheduled_usage, false);
        out.seqs.len()
    }

    /// The attention work of a step just scheduled (its sequences' computed counts are still
    /// the chunks' starts).
    fn record_attention(&self, out: &SchedulerOutput) {
        let chunks =
            out.seqs.iter().filter_map(|s| self.scheduler.seq(s.seq).map(|q| (q.num_computed_tokens, s.num_tokens)));
        if let Ok(mut st) = self.stats.lock() {
            st.record_attention(chunks);
        }
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

    /// Starts completions 1..n of a request off its first sequence's computed prompt.
    fn fork_completions(&mut self, parent: SeqId, rid: RequestId, n: usize) {
        let Some(p) = self.scheduler.seq(parent) else { return };
        let (prompt, params, max_tokens, priority, arrival, adapter) =
            (p.prompt().to_vec(), p.params.clone(), p.max_tokens, p.priority, p.times.arrival, p.adapter);
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
            child.adapter = adapter;
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
            if let Some(h) = self.speculator.as_mut().and_then(Speculator::head) {
                h.fork(parent, child.id);
            }
            self.scheduler.fork(parent, child);
        }
    }

    /// Ends one completion: frees its blocks, and sends `o` (the request's last message when
    /// this was its last live completion).
    fn end_seq(&mut self, id: SeqId, reason: FinishReason, mut o: RequestOutput) {
        let now = Instant::now();
        let Some(seq) = self.scheduler.remove(id) else { return };
        if let Some(sp) = &mut self.speculator {
            sp.record_output(&seq);
        }
        let Some(r) = self.requests.get_mut(&seq.request_id) else { return };
        r.live.retain(|&s| s != id);
        if seq.index == 0 {
            let mut m = RequestMetrics::from_times(&seq.times, now, seq.num_preemptions);
            m.num_cached_tokens = seq.num_cached_tokens;
            r.metrics = Some(m);
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
            if s.adapters.enabled() {
                (st.running_adapters, st.waiting_adapters) = s.adapters_in_use();
            }
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

/// Tokens a sequence may not produce yet: EOS (unless ignored) and its stop tokens, while it
/// has fewer than `min_tokens` outputs.
fn banned(eos: &[u32], seq: &Sequence) -> Vec<u32> {
    banned_at(eos, seq, seq.num_output_tokens())
}

/// The tokens `seq` may not produce as output token `index` (its stop tokens under
/// `min_tokens`); [`banned`] at its next index.
fn banned_at(eos: &[u32], seq: &Sequence, index: usize) -> Vec<u32> {
    let p = &seq.params;
    if index >= p.min_tokens {
        return vec![];
    }
    eos.iter().filter(|_| !p.ignore_eos).chain(&p.stop_token_ids).copied().collect()
}

/// Starts a guided sequence's constraint (a no-op for the others).
fn start_guide(seq: &mut Sequence) -> Result<(), String> {
    if let Some(g) = &seq.params.guided {
        seq.guide = Some(GuideState { constraint: g.0.start()?, mask: None, drafted: None });
    }
    Ok(())
}
