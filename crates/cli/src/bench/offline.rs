//! Runs a workload straight through an [`EngineHandle`] (no HTTP), keeping at most
//! `concurrency` requests in flight (`usize::MAX`: all submitted at once), and measures each
//! request from its submission: time to first token, gaps between tokens, end to end.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use tandem_engine::{EngineHandle, FinishReason, Guided, Request, SamplingParams};

use super::latency::{self, Summary};
use super::progress::Progress;
use super::workload::Prompt;

/// One request as the client saw it. Times in seconds from submission.
#[derive(Debug, Clone, Default)]
pub struct RequestRecord {
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    pub ttft: Option<f64>,
    /// Gaps between consecutive output tokens (or streamed chunks, over HTTP).
    pub itl: Vec<f64>,
    pub e2e: f64,
    pub error: Option<String>,
}

impl RequestRecord {
    /// Time per output token after the first: (e2e - ttft) / (tokens - 1).
    pub fn tpot(&self) -> Option<f64> {
        match (self.ttft, self.output_tokens) {
            (Some(t), n) if n > 1 => Some((self.e2e - t) / (n - 1) as f64),
            _ => None,
        }
    }
}

/// What a run measured, summed over its requests.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub records: Vec<RequestRecord>,
    pub wall_s: f64,
    /// Engine-side, offline runs only.
    pub kv_usage_peak: Option<f32>,
    pub preemptions: Option<u64>,
}

/// The figures a table shows, derived once.
#[derive(Debug, Clone)]
pub struct Figures {
    pub completed: usize,
    pub errors: usize,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    pub total_tokens_per_s: f64,
    pub ttft: Option<Summary>,
    pub tpot: Option<Summary>,
    pub itl: Option<Summary>,
    pub e2e: Option<Summary>,
}

impl RunResult {
    pub fn figures(&self) -> Figures {
        let ok: Vec<&RequestRecord> = self.records.iter().filter(|r| r.error.is_none()).collect();
        let prompt_tokens = ok.iter().map(|r| r.prompt_tokens).sum();
        let output_tokens = ok.iter().map(|r| r.output_tokens).sum();
        let per_s = |x: usize| if self.wall_s > 0.0 { x as f64 / self.wall_s } else { 0.0 };
        let itl: Vec<f64> = ok.iter().flat_map(|r| r.itl.iter().copied()).collect();
        Figures {
            completed: ok.len(),
            errors: self.records.len() - ok.len(),
            prompt_tokens,
            output_tokens,
            requests_per_s: per_s(ok.len()),
            output_tokens_per_s: per_s(output_tokens),
            total_tokens_per_s: per_s(prompt_tokens + output_tokens),
            ttft: latency::summarize_ms(&ok.iter().filter_map(|r| r.ttft).collect::<Vec<_>>()),
            tpot: latency::summarize_ms(&ok.iter().filter_map(|r| r.tpot()).collect::<Vec<_>>()),
            itl: latency::summarize_ms(&itl),
            e2e: latency::summarize_ms(&ok.iter().map(|r| r.e2e).collect::<Vec<_>>()),
        }
    }

    pub fn to_json(&self) -> Value {
        let f = self.figures();
        let first_error = self.records.iter().find_map(|r| r.error.clone());
        json!({
            "completed": f.completed,
            "errors": f.errors,
            "first_error": first_error,
            "wall_s": self.wall_s,
            "prompt_tokens": f.prompt_tokens,
            "output_tokens": f.output_tokens,
            "requests_per_s": f.requests_per_s,
            "output_tokens_per_s": f.output_tokens_per_s,
            "total_tokens_per_s": f.total_tokens_per_s,
            "kv_usage_peak": self.kv_usage_peak,
            "preemptions": self.preemptions,
            "ttft_ms": latency::to_json(f.ttft),
            "tpot_ms": latency::to_json(f.tpot),
            "itl_ms": latency::to_json(f.itl),
            "e2e_ms": latency::to_json(f.e2e),
        })
    }
}

fn greedy_forced(output_len: usize) -> SamplingParams {
    SamplingParams { temperature: 0.0, ignore_eos: true, max_tokens: Some(output_len), ..Default::default() }
}

/// A few short requests first, so shader compiles and first-touch costs stay out of the run.
/// Their prompts are the workload's reversed, so they leave no prefix-cache hits behind.
pub fn warm_up(handle: &EngineHandle, prompts: &[Prompt], n: usize) -> Result<()> {
    for p in prompts.iter().take(n) {
        let ids: Vec<u32> = p.ids.iter().rev().copied().collect();
        let mut s = handle
            .submit(Request { prompt: ids, params: greedy_forced(p.output_len.min(4)), priority: 0 })
            .context("warm-up request")?;
        while let Some(o) = s.blocking_recv() {
            if let Some(FinishReason::Error(e)) = &o.finish_reason {
                bail!("warm-up request failed: {e}");
            }
            if o.finished {
                break;
            }
        }
    }
    Ok(())
}

/// Runs every prompt, at most `concurrency` at a time; gives up after `timeout`.
pub fn run(
    handle: &EngineHandle,
    prompts: &[Prompt],
    concurrency: usize,
    label: &str,
    timeout: Duration,
) -> Result<RunResult> {
    run_guided(handle, prompts, &[], concurrency, label, timeout)
}

/// As [`run`], prompt `i` constrained by `guides[i]` where that is given.
pub fn run_guided(
    handle: &EngineHandle,
    prompts: &[Prompt],
    guides: &[Option<Guided>],
    concurrency: usize,
    label: &str,
    timeout: Duration,
) -> Result<RunResult> {
    run_with(handle, prompts, guides, &[], concurrency, label, timeout)
}

/// As [`run`], prompt `i` under LoRA adapter `adapters[i]` where that is given.
pub fn run_adapters(
    handle: &EngineHandle,
    prompts: &[Prompt],
    adapters: &[Option<u32>],
    concurrency: usize,
    label: &str,
    timeout: Duration,
) -> Result<RunResult> {
    run_with(handle, prompts, &[], adapters, concurrency, label, timeout)
}

fn run_with(
    handle: &EngineHandle,
    prompts: &[Prompt],
    guides: &[Option<Guided>],
    adapters: &[Option<u32>],
    concurrency: usize,
    label: &str,
    timeout: Duration,
) -> Result<RunResult> {
    let guides: Arc<Vec<Option<Guided>>> =
        Arc::new((0..prompts.len()).map(|i| guides.get(i).cloned().flatten()).collect());
    let adapters: Arc<Vec<Option<u32>>> =
        Arc::new((0..prompts.len()).map(|i| adapters.get(i).copied().flatten()).collect());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let prompts: Arc<Vec<Prompt>> = Arc::new(prompts.to_vec());
    let n = prompts.len();
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(AtomicUsize::new(0));
    let before = handle.stats();
    let start = Instant::now();
    let mut progress = Progress::new(label, n);
    let records = rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..concurrency.clamp(1, n) {
            let (h, prompts, guides, adapters, next, done, tokens) = (handle.clone(), prompts.clone(), guides.clone(), adapters.clone(), next.clone(), done.clone(), tokens.clone());
            set.spawn(async move {
                let mut out = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(p) = prompts.get(i) else { break };
                    out.push((i, one_request(&h, p, guides[i].clone(), adapters[i], &tokens).await));
                    done.fetch_add(1, Ordering::Relaxed);
                }
                out
            });
        }
        let mut kv_peak = 0f32;
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut records = vec![RequestRecord::default(); n];
        let mut finished_workers = 0;
        let workers = set.len();
        while finished_workers < workers {
            tokio::select! {
                r = set.join_next() => match r {
                    Some(Ok(out)) => {
                        finished_workers += 1;
                        for (i, rec) in out {
                            records[i] = rec;
                        }
                    }
                    Some(Err(e)) => bail!("a benchmark task failed: {e}"),
                    None => break,
                },
                _ = tick.tick() => {
                    kv_peak = kv_peak.max(handle.stats().kv_usage);
                    let secs = start.elapsed().as_secs_f64();
                    progress.update(done.load(Ordering::Relaxed), &format!("{:.0} tok/s", tokens.load(Ordering::Relaxed) as f64 / secs));
                }
                _ = &mut deadline => bail!("{label}: timed out after {} s with {} of {n} requests done", timeout.as_secs(), done.load(Ordering::Relaxed)),
            }
        }
        Ok((records, kv_peak))
    });
    let wall_s = start.elapsed().as_secs_f64();
    let (records, kv_peak) = records?;
    let after = handle.stats();
    // The engine's own high-water mark catches steps between two samples (a short run can
    // finish inside one tick); the warm-up's requests are smaller than the run's.
    let kv_peak = kv_peak.max(after.kv_usage).max(after.kv_usage_peak);
    progress
        .finish(done.load(Ordering::Relaxed), &format!("{:.0} tok/s", tokens.load(Ordering::Relaxed) as f64 / wall_s));
    Ok(RunResult {
        records,
        wall_s,
        kv_usage_peak: Some(kv_peak),
        preemptions: Some(after.preemptions_total - before.preemptions_total),
    })
}

async fn one_request(
    h: &EngineHandle,
    p: &Prompt,
    guided: Option<Guided>,
    adapter: Option<u32>,
    tokens: &AtomicUsize,
) -> RequestRecord {
    let t0 = Instant::now();
    let mut rec = RequestRecord { prompt_tokens: p.ids.len(), ..Default::default() };
    let params = SamplingParams { guided, ..greedy_forced(p.output_len) };
    let mut stream = match h.submit_with_adapter(Request { prompt: p.ids.clone(), params, priority: 0 }, adapter) {
        Ok(s) => s,
        Err(e) => {
            rec.error = Some(e.to_string());
            return rec;
        }
    };
    let mut last = None;
    while let Some(o) = stream.recv().await {
        let now = t0.elapsed().as_secs_f64();
        if !o.token_ids.is_empty() {
            match last {
                None => rec.ttft = Some(now),
                Some(l) => rec.itl.push(now - l),
            }
            last = Some(now);
            rec.output_tokens += o.token_ids.len();
            tokens.fetch_add(o.token_ids.len(), Ordering::Relaxed);
        }
        match &o.finish_reason {
            Some(FinishReason::Error(e)) => rec.error = Some(e.clone()),
            Some(FinishReason::Abort) => rec.error = Some("aborted".into()),
            _ => {}
        }
        if o.finished {
            break;
        }
    }
    rec.e2e = t0.elapsed().as_secs_f64();
    if rec.error.is_none() && rec.output_tokens != p.output_len {
        rec.error = Some(format!("asked for {} tokens, got {}", p.output_len, rec.output_tokens));
    }
    rec
}
