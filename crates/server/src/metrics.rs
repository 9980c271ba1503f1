//! Prometheus metrics under vLLM's names, rendered in the text exposition format (0.0.4).
//!
//! Written by hand rather than through prometheus-client: vLLM's names contain ':', which that
//! crate's registry does not let us keep verbatim, and the format is small. Counters the server
//! sees itself (tokens, latencies) live here; gauges of the engine's state are read from
//! [`EngineStats`] at scrape time.
//!
//! vLLM's throughput gauges (`vllm:avg_prompt_throughput_toks_per_s`,
//! `vllm:avg_generation_throughput_toks_per_s`) are rates of the token counters over a recent
//! window: from a sample of the counters taken at least [`THROUGHPUT_WINDOW`] before the scrape
//! (or the oldest there is: start-up, or the previous scrape when scrapes are rarer) to now.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::engine_client::EngineStats;

/// vLLM's bucket bounds, extended downwards for small models on a CPU.
const TTFT_BUCKETS: &[f64] = &[0.0005, 0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0];
const ITL_BUCKETS: &[f64] = &[0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
const REQUEST_BUCKETS: &[f64] = &[0.001, 0.01, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0];

#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    inner: Mutex<HistogramState>,
}

#[derive(Debug, Default, Clone)]
struct HistogramState {
    /// Per bucket, not cumulative: `counts[i]` holds observations in `(bounds[i-1], bounds[i]]`;
    /// the last entry is the `+Inf` overflow.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, inner: Mutex::new(HistogramState { counts: vec![0; bounds.len() + 1], ..Default::default() }) }
    }

    pub fn observe(&self, v: f64) {
        let i = self.bounds.iter().position(|&b| v <= b).unwrap_or(self.bounds.len());
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        s.counts[i] += 1;
        s.sum += v;
        s.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).count
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let s = self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (i, c) in s.counts.iter().enumerate() {
            cum += c;
            let le = self.bounds.get(i).map_or("+Inf".to_string(), |b| format_float(*b));
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}\n{name}_count{{{labels}}} {}", format_float(s.sum), s.count);
    }
}

/// Prometheus floats: Go's shortest form, with `+Inf`/`-Inf`/`NaN` spelled out.
fn format_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else {
        format!("{v}")
    }
}

/// Label values escape backslash, double quote and newline.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The span the throughput gauges average over, when scrapes come at least this often.
pub const THROUGHPUT_WINDOW: Duration = Duration::from_secs(10);
/// Samples of the counters are kept at most this often, so that fast scrapers keep few.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// The token counters at one instant.
#[derive(Debug, Clone, Copy)]
struct TokenSample {
    at: Instant,
    prompt: u64,
    generation: u64,
}

#[derive(Debug)]
pub struct Metrics {
    model_label: String,
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    /// Finished requests by reason: stop, length, abort, error.
    pub finished: [AtomicU64; 4],
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub queue: Histogram,
    /// Oldest first; never empty (the first is taken at start-up).
    samples: Mutex<VecDeque<TokenSample>>,
}

pub const FINISH_REASONS: [&str; 4] = ["stop", "length", "abort", "error"];

impl Metrics {
    pub fn new(model_name: &str) -> Self {
        Metrics {
            model_label: format!("model_name=\"{}\"", escape_label(model_name)),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            finished: Default::default(),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(REQUEST_BUCKETS),
            queue: Histogram::new(REQUEST_BUCKETS),
            samples: Mutex::new(VecDeque::from([TokenSample { at: Instant::now(), prompt: 0, generation: 0 }])),
        }
    }

    /// Prompt and generation tokens per second over the recent window ending at `now`
    /// (see the module comment); records a sample of the counters when the newest is old.
    pub fn throughput(&self, now: Instant) -> (f64, f64) {
        let cur = TokenSample { at: now, prompt: self.prompt_tokens.load(Ordering::Relaxed), generation: self.generation_tokens.load(Ordering::Relaxed) };
        let mut q = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        // Keep the newest sample at least a window old as the base, and none older.
        while q.len() > 1 && q[1].at + THROUGHPUT_WINDOW <= now {
            q.pop_front();
        }
        let base = q[0];
        if q.back().is_some_and(|b| b.at + SAMPLE_EVERY <= now) {
            q.push_back(cur);
        }
        drop(q);
        let secs = now.saturating_duration_since(base.at).as_secs_f64();
        if secs <= 0.0 {
            return (0.0, 0.0);
        }
        // Counters only grow; saturate anyway so a sample taken out of order reads 0, not huge.
        ((cur.prompt.saturating_sub(base.prompt)) as f64 / secs, (cur.generation.saturating_sub(base.generation)) as f64 / secs)
    }

    pub fn count_finished(&self, reason: &str) {
        if let Some(i) = FINISH_REASONS.iter().position(|r| *r == reason) {
            self.finished[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The whole exposition, engine gauges included.
    pub fn render(&self, stats: &EngineStats, server_queued: usize) -> String {
        let l = &self.model_label;
        let mut out = String::with_capacity(8192);
        let mut gauge = |name: &str, help: &str, v: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{l}}} {}", format_float(v));
        };
        gauge("vllm:num_requests_running", "Number of requests in model execution batches.", stats.num_running as f64);
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", stats.num_waiting as f64);
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", stats.kv_cache_usage);
        gauge("tandem:batch_size", "Sequences in the most recent engine step.", stats.batch_size as f64);
        let (prompt_rate, generation_rate) = self.throughput(Instant::now());
        gauge("vllm:avg_prompt_throughput_toks_per_s", "Average prefill throughput in tokens/s.", prompt_rate);
        gauge("vllm:avg_generation_throughput_toks_per_s", "Average generation throughput in tokens/s.", generation_rate);
        gauge("tandem:server_queued_requests", "Requests submitted by the server without output yet (bounded by max_queued_requests).", server_queued as f64);
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name}_total {help}\n# TYPE {name}_total counter\n{name}_total{{{l}}} {v}");
        };
        counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", stats.prefix_cache_queries);
        counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", stats.prefix_cache_hits);
        counter("vllm:num_preemptions", "Cumulative number of preemptions from the engine.", stats.num_preemptions);
        counter("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens.load(Ordering::Relaxed));
        counter("vllm:generation_tokens", "Number of generation tokens processed.", self.generation_tokens.load(Ordering::Relaxed));
        counter("tandem:async_steps", "Engine steps sent to the model ahead of the previous step's postprocessing (async scheduling).", stats.async_steps);
        counter("tandem:sync_steps", "Engine steps whose forward and postprocessing ran one after the other (async scheduling off, or a step that needed host-side results).", stats.sync_steps);
        counter("tandem:structured_output_masks", "Token masks computed for structured output (one per constrained token).", stats.guided_masks_total);
        let _ = writeln!(
            out,
            "# HELP tandem:structured_output_mask_seconds_total Time spent computing structured-output masks (beside the forward, on helper threads).\n# TYPE tandem:structured_output_mask_seconds_total counter\ntandem:structured_output_mask_seconds_total{{{l}}} {}",
            format_float(stats.guided_mask_seconds_total)
        );
        let _ = writeln!(out, "# HELP vllm:request_success_total Count of finished requests by finish reason.\n# TYPE vllm:request_success_total counter");
        for (i, r) in FINISH_REASONS.iter().enumerate() {
            let _ = writeln!(out, "vllm:request_success_total{{{l},finished_reason=\"{r}\"}} {}", self.finished[i].load(Ordering::Relaxed));
        }
        self.ttft.render(&mut out, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", l);
        self.itl.render(&mut out, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", l);
        self.e2e.render(&mut out, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", l);
        self.queue.render(&mut out, "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", l);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_end_in_inf() {
        let m = Metrics::new("m\"x");
        for v in [0.0002, 0.003, 0.003, 5000.0] {
            m.ttft.observe(v);
        }
        let text = m.render(&EngineStats::default(), 0);
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"0.0005\"} 1\n"), "{text}");
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"0.005\"} 3\n"));
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"2560\"} 3\n"));
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"+Inf\"} 4\n"));
        assert!(text.contains("vllm:time_to_first_token_seconds_count{model_name=\"m\\\"x\"} 4\n"));
    }

    #[test]
    fn throughput_is_the_counters_rate_over_the_recent_window() {
        let m = Metrics::new("m");
        let t0 = m.samples.lock().unwrap()[0].at;
        let s = Duration::from_secs;
        m.prompt_tokens.store(100, Ordering::Relaxed);
        m.generation_tokens.store(50, Ordering::Relaxed);
        // Since start-up: 100 and 50 tokens in 2 s; this scrape keeps a sample at +2 s.
        assert_eq!(m.throughput(t0 + s(2)), (50.0, 25.0));
        // Scrapes every second from +3 s to +12 s, with 10 generation tokens each second.
        for k in 3..=12u64 {
            m.generation_tokens.store(50 + 10 * (k - 2), Ordering::Relaxed);
            m.throughput(t0 + s(k));
        }
        // At +13 s the base is the sample of +3 s (the newest at least 10 s old): the 100 prompt
        // tokens of the first 2 s no longer count.
        m.generation_tokens.store(160, Ordering::Relaxed);
        assert_eq!(m.throughput(t0 + s(13)), (0.0, 10.0));
        assert!(m.samples.lock().unwrap().len() <= 12, "few samples kept");
        // A scraper that comes back after a minute gets the rate since its previous scrape.
        m.generation_tokens.store(760, Ordering::Relaxed);
        assert_eq!(m.throughput(t0 + s(73)), (0.0, 10.0));
        // Nothing new since: 0, not the old rate.
        assert_eq!(m.throughput(t0 + s(90)).1, 0.0);
    }

    /// The engine's step counters of async scheduling, as Prometheus counters.
    #[test]
    fn async_and_sync_steps_are_counters() {
        let text = Metrics::new("m").render(&EngineStats { async_steps: 7, sync_steps: 2, ..Default::default() }, 0);
        assert!(text.contains("# TYPE tandem:async_steps_total counter\ntandem:async_steps_total{model_name=\"m\"} 7\n"), "{text}");
        assert!(text.contains("tandem:sync_steps_total{model_name=\"m\"} 2\n"), "{text}");
    }
}
