//! One HTTP request's generation: its engine submissions (one per prompt), the merged stream of
//! their updates, and the bookkeeping done as updates pass (token counters, TTFT and
//! inter-token latency, the bounded queue).
//!
//! A [`Run`] is a drop guard: dropping it before every completion finished (the client went
//! away, the handler future was cancelled) aborts the unfinished engine requests at once, so
//! their KV blocks are freed. Its drop also writes the request's one log line.
//!
//! A run also keeps the request's time bound (`ServerConfig::request_timeout`, counted from
//! the request's arrival): once it passes, the next poll aborts every unfinished engine request
//! (their KV is freed then) and ends their choices with finish_reason "abort". What the client
//! sees: a stream gets those finishes and then `[DONE]` as usual (its headers left at once);
//! a whole response is 200 with the text produced so far when any token was produced, else
//! 408 (nothing was sent yet, so the status can still say it), see [`crate::pipeline::collect`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::engine_client::{
    CompletionDelta, EngineUpdate, FinishReason, GenerateRequest, RequestId, SubmitRefusal, UpdateSource,
};
use crate::error::ApiError;
use crate::state::AppState;

struct Sub {
    id: RequestId,
    rx: Box<dyn UpdateSource>,
    /// Completions of this prompt not finished yet.
    unfinished: usize,
    /// Counted in the server's queue until its first update.
    queued: bool,
    closed: bool,
}

impl Sub {
    fn done(&self) -> bool {
        self.closed || self.unfinished == 0
    }
}

/// The bound on what the server lets into the engine: `max_num_seqs` sequences may run and
/// `max_queued_requests` more may wait for admission beyond them (as vLLM and TGI users read
/// the flag). A request counts one sequence per prompt and completion (`prompts * n`).
struct Admission {
    running: usize,
    queued: usize,
}

impl Admission {
    fn of(c: &crate::ServerConfig) -> Self {
        Admission { running: c.max_num_seqs, queued: c.max_queued_requests }
    }

    fn cap(&self) -> usize {
        self.running + self.queued
    }

    /// A request larger than the whole bound could never be admitted: 400, not 429.
    fn check_size(&self, seqs: usize, prompts: usize, prompt_param: &str) -> Result<(), ApiError> {
        if seqs <= self.cap() {
            return Ok(());
        }
        let param = if prompts > 1 { prompt_param } else { "n" };
        Err(ApiError::invalid(
            param,
            format!(
                "this request needs {seqs} sequences ({prompts} prompt(s) x n = {}), more than this server ever admits at once ({} running + {} queued); send fewer prompts or completions per request",
                seqs / prompts.max(1),
                self.running,
                self.queued
            ),
        ))
    }
}

/// The request's time bound; its timer is armed on the first poll (it needs the runtime).
#[derive(Default)]
struct Deadline {
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    passed: bool,
}

pub struct Run {
    state: Arc<AppState>,
    deadline: Deadline,
    subs: Vec<Sub>,
    /// Completions per prompt; choice `p * n + i` is completion `i` of prompt `p`.
    pub n: usize,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Per choice: how it finished, once it has.
    pub finishes: Vec<Option<FinishReason>>,
    last_token: Vec<Option<Instant>>,
    /// Per choice: its first token's time and its tokens; per prompt: its length, `max_tokens`,
    /// queue time and preemptions (these two come with its last update), for vLLM's
    /// per-request histograms, observed when a prompt's last choice ends.
    first_token_at: Vec<Option<Instant>>,
    choice_tokens: Vec<usize>,
    prompt_lens: Vec<usize>,
    max_tokens: Vec<usize>,
    prompt_queue: Vec<Option<Duration>>,
    preemptions: Vec<Option<u32>>,
    /// Per prompt: its prompt tokens found in the prefix cache, from the engine's last update.
    cached_tokens: Vec<Option<usize>>,
    /// When the engine requests were submitted (their queue time counts from there).
    submitted: Instant,
    start: Instant,
    first_token: Option<Instant>,
    queue_time: Option<Duration>,
    /// For the log line: "cmpl-…", "chatcmpl-…".
    pub label: String,
}

impl Run {
    /// Submits one engine request per prompt. Fails with 429 when the queue is full (nothing
    /// submitted then), and with 400, 429 or 500 when the engine refuses (see
    /// [`SubmitRefusal`]); `prompt_param` names the prompt's field in such errors.
    pub fn start(
        state: Arc<AppState>,
        reqs: Vec<GenerateRequest>,
        prompt_param: &str,
        label: String,
        start: Instant,
    ) -> Result<Run, ApiError> {
        let k = reqs.len();
        let seqs = k * reqs.first().map_or(1, |r| r.params.sampling.n);
        let admit = Admission::of(&state.config);
        admit.check_size(seqs, k, prompt_param)?;
        let before = state.in_flight.fetch_add(seqs, Ordering::SeqCst);
        if before + seqs > admit.cap() {
            state.in_flight.fetch_sub(seqs, Ordering::SeqCst);
            state.metrics.admission_rejected.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::overloaded(before.saturating_sub(admit.running), 1));
        }
        state.queued.fetch_add(k, Ordering::SeqCst);
        let n = reqs.first().map_or(1, |r| r.params.sampling.n);
        let mut run = Run {
            state: state.clone(),
            deadline: Deadline::default(),
            subs: Vec::with_capacity(k),
            n,
            prompt_tokens: reqs.iter().map(|r| r.prompt.len()).sum(),
            completion_tokens: 0,
            finishes: vec![None; k * n],
            last_token: vec![None; k * n],
            first_token_at: vec![None; k * n],
            choice_tokens: vec![0; k * n],
            prompt_lens: reqs.iter().map(|r| r.prompt.len()).collect(),
            // Resolved before submission (`job.rs`): always set.
            max_tokens: reqs.iter().map(|r| r.params.sampling.max_tokens.unwrap_or(0)).collect(),
            prompt_queue: vec![None; k],
            preemptions: vec![None; k],
            cached_tokens: vec![None; k],
            submitted: Instant::now(),
            start,
            first_token: None,
            queue_time: None,
            label,
        };
        state.tokens_in_flight.fetch_add(run.prompt_tokens * n, Ordering::Relaxed);
        for (i, req) in reqs.into_iter().enumerate() {
            match state.engine.submit(req) {
                Ok(s) => {
                    state.live.lock().unwrap_or_else(|e| e.into_inner()).insert(s.id);
                    run.subs.push(Sub { id: s.id, rx: s.updates, unfinished: n, queued: true, closed: false });
                }
                Err(e) => {
                    // Release the slots of the prompts never submitted; `run`'s drop aborts
                    // those that were.
                    state.queued.fetch_sub(k - i, Ordering::SeqCst);
                    state.in_flight.fetch_sub((k - i) * n, Ordering::SeqCst);
                    let param = if k > 1 { format!("{prompt_param}[{i}]") } else { prompt_param.to_string() };
                    return Err(match e {
                        SubmitRefusal::Invalid(m) => ApiError::invalid(&param, m),
                        SubmitRefusal::Overloaded(m) => {
                            state.metrics.admission_rejected.fetch_add(1, Ordering::Relaxed);
                            ApiError { message: m, ..ApiError::overloaded(0, 1) }
                        }
                        SubmitRefusal::Stopped(m) => ApiError::internal(format!("the engine refused the request: {m}")),
                    });
                }
            }
        }
        state.metrics.prompt_tokens.fetch_add(run.prompt_tokens as u64, Ordering::Relaxed);
        Ok(run)
    }

    /// The next update of any prompt, tagged with the prompt's index; `None` once every
    /// completion has finished. A prompt whose stream ends early gets an `Error` finish; once
    /// the request's time bound passes, every unfinished prompt is aborted and gets `Abort`.
    pub fn poll_update(&mut self, cx: &mut Context<'_>) -> Poll<Option<(usize, EngineUpdate)>> {
        self.poll_deadline(cx);
        let mut all_done = true;
        for p in 0..self.subs.len() {
            if self.subs[p].done() {
                continue;
            }
            all_done = false;
            if self.deadline.passed {
                self.state.engine.abort(self.subs[p].id);
                match self.end_early(p, FinishReason::Abort) {
                    Some(upd) => return Poll::Ready(Some((p, upd))),
                    None => continue,
                }
            }
            match self.subs[p].rx.poll_next(cx) {
                Poll::Ready(Some(upd)) => {
                    self.account(p, &upd);
                    return Poll::Ready(Some((p, upd)));
                }
                Poll::Ready(None) => match self
                    .end_early(p, FinishReason::Error("the engine stopped before finishing this request".into()))
                {
                    Some(upd) => return Poll::Ready(Some((p, upd))),
                    None => continue,
                },
                Poll::Pending => {}
            }
        }
        if all_done {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }

    /// Arms the time bound's timer, or notes that it has passed (the timer wakes `cx` then).
    fn poll_deadline(&mut self, cx: &mut Context<'_>) {
        if self.deadline.passed {
            return;
        }
        // A bound too far to represent is no bound.
        let Some(at) = self.state.config.request_timeout.and_then(|t| self.start.checked_add(t)) else { return };
        let timer = self.deadline.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at.into())));
        if timer.as_mut().poll(cx).is_ready() {
            self.deadline.passed = true;
            self.deadline.timer = None;
        }
    }

    /// Closes prompt `p`'s stream and finishes its unfinished choices with `reason`; `None`
    /// when none was unfinished.
    fn end_early(&mut self, p: usize, reason: FinishReason) -> Option<EngineUpdate> {
        self.subs[p].closed = true;
        let deltas: Vec<CompletionDelta> = (0..self.n)
            .filter(|&i| self.finishes[p * self.n + i].is_none())
            .map(|index| CompletionDelta {
                index,
                text: String::new(),
                token_ids: vec![],
                logprobs: vec![],
                prompt_logprobs: None,
                finish: Some(reason.clone()),
                stop_string: None,
            })
            .collect();
        if deltas.is_empty() {
            return None;
        }
        let upd = EngineUpdate { deltas, ..Default::default() };
        self.account(p, &upd);
        Some(upd)
    }

    /// True once the request's time bound has passed (its unfinished choices were aborted).
    pub fn timed_out(&self) -> bool {
        self.deadline.passed
    }

    pub async fn next_update(&mut self) -> Option<(usize, EngineUpdate)> {
        std::future::poll_fn(|cx| self.poll_update(cx)).await
    }

    fn account(&mut self, p: usize, upd: &EngineUpdate) {
        let now = Instant::now();
        let m = &self.state.metrics;
        let sub = &mut self.subs[p];
        if sub.queued {
            sub.queued = false;
            self.state.queued.fetch_sub(1, Ordering::SeqCst);
        }
        if let Some(q) = upd.queue_time {
            m.queue.observe(q.as_secs_f64());
            self.queue_time.get_or_insert(q);
            self.prompt_queue[p] = Some(q);
        }
        if upd.num_preemptions.is_some() {
            self.preemptions[p] = upd.num_preemptions;
        }
        if upd.num_cached_tokens.is_some() {
            self.cached_tokens[p] = upd.num_cached_tokens;
        }
        for d in &upd.deltas {
            let c = p * self.n + d.index;
            if c >= self.finishes.len() || self.finishes[c].is_some() {
                continue; // an engine bug; never index out of bounds on it
            }
            if !d.token_ids.is_empty() {
                self.completion_tokens += d.token_ids.len();
                self.state.tokens_in_flight.fetch_add(d.token_ids.len(), Ordering::Relaxed);
                self.choice_tokens[c] += d.token_ids.len();
                self.first_token_at[c].get_or_insert(now);
                m.generation_tokens.fetch_add(d.token_ids.len() as u64, Ordering::Relaxed);
                match self.last_token[c] {
                    Some(prev) => m.itl.observe((now - prev).as_secs_f64()),
                    None if self.first_token.is_none() => {
                        self.first_token = Some(now);
                        m.ttft.observe((now - self.start).as_secs_f64());
                    }
                    None => {}
                }
                self.last_token[c] = Some(now);
            }
            if let Some(f) = &d.finish {
                m.count_finished(f.as_str());
                self.finishes[c] = Some(f.clone());
                self.subs[p].unfinished -= 1;
                self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
                if self.subs[p].unfinished == 0 {
                    self.observe_prompt(p);
                }
            }
        }
    }

    /// vLLM's per-request histograms for prompt `p`'s choices, once all have ended. The
    /// phases count from when the engine first scheduled the prompt (submission plus its
    /// queue time); a prompt never scheduled has no phase times.
    fn observe_prompt(&self, p: usize) {
        let m = &self.state.metrics;
        let scheduled = self.prompt_queue[p].map(|q| self.submitted + q);
        let mut most = 0;
        for c in p * self.n..(p + 1) * self.n {
            let tokens = self.choice_tokens[c];
            most = most.max(tokens);
            let phases = match (scheduled, self.first_token_at[c], self.last_token[c]) {
                (Some(s), Some(first), Some(last)) => Some((
                    first.saturating_duration_since(s).as_secs_f64(),
                    (last - first).as_secs_f64(),
                    last.saturating_duration_since(s).as_secs_f64(),
                )),
                _ => None,
            };
            m.observe_finished(&crate::metrics::FinishedRequest {
                prompt_tokens: self.prompt_lens[p],
                cached_tokens: self.cached_tokens[p],
                generation_tokens: tokens,
                max_tokens_param: self.max_tokens[p],
                prefill: phases.map(|t| t.0),
                decode: phases.map(|t| t.1),
                inference: phases.map(|t| t.2),
            });
        }
        m.request_max_generation_tokens.observe(most as f64);
        m.request_params_n.observe(self.n as f64);
        if let Some(k) = self.preemptions[p] {
            m.request_preemptions.observe(k as f64);
        }
    }

    /// The first engine error among the choices, if any.
    pub fn error(&self) -> Option<&str> {
        self.finishes.iter().find_map(|f| match f {
            Some(FinishReason::Error(e)) => Some(e.as_str()),
            _ => None,
        })
    }

    pub fn aborted(&self) -> bool {
        self.finishes.iter().any(|f| matches!(f, Some(FinishReason::Abort)))
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.state.tokens_in_flight.fetch_sub(self.prompt_tokens * self.n + self.completion_tokens, Ordering::Relaxed);
        let mut cancelled = false;
        {
            let mut live = self.state.live.lock().unwrap_or_else(|e| e.into_inner());
            for s in &self.subs {
                live.remove(&s.id);
                if !s.done() {
                    cancelled = true;
                    self.state.engine.abort(s.id);
                }
                self.state.in_flight.fetch_sub(s.unfinished, Ordering::SeqCst);
                if s.queued {
                    self.state.queued.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
        if cancelled {
            for _ in self.finishes.iter().filter(|f| f.is_none()) {
                self.state.metrics.count_finished("abort");
            }
        }
        let total = self.start.elapsed();
        self.state.metrics.e2e.observe(total.as_secs_f64());
        // 499: nginx's "client closed request".
        let status = if cancelled {
            499
        } else if self.error().is_some() {
            500
        } else if self.timed_out() {
            408
        } else if self.aborted() {
            503
        } else {
            200
        };
        // Milliseconds to the microsecond; "-" when the request never got that far.
        let ms = |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.3}", d.as_secs_f64() * 1e3));
        tracing::info!(
            id = %self.label,
            status,
            prompt_tokens = self.prompt_tokens,
            completion_tokens = self.completion_tokens,
            queue_ms = %ms(self.queue_time),
            ttft_ms = %ms(self.first_token.map(|t| t - self.start)),
            total_ms = %ms(Some(total)),
            "request finished"
        );
    }
}
