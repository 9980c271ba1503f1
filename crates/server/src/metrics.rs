//! Prometheus metrics under vLLM's names, rendered in the text exposition format (0.0.4).
//!
//! Written by hand rather than through prometheus-client: vLLM's names contain ':', which that
//! crate's registry does not let us keep verbatim, and the format is small. Counters the server
//! sees itself (tokens, latencies) live here; gauges of the engine's state are read from
//! [`EngineStats`] at scrape time. vLLM 0.32 has no throughput gauges (its v0 engine's
//! `avg_*_throughput_toks_per_s`): a dashboard takes the rate of the token counters.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::engine_client::EngineStats;

/// vLLM 0.32's bucket bounds (`vllm/v1/metrics/buckets.py`), so that a dashboard's quantiles
/// read the same.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] =
    &[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];
const ITERATION_TOKENS_BUCKETS: &[f64] =
    &[1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0];
const PARAMS_N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];
const PREEMPTIONS_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0];

/// vLLM's request-token buckets: 1, 2, 5, 10, 20, 50, ... up to `max_model_len`.
fn request_tokens_buckets(max_model_len: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1usize;
    loop {
        for m in [1usize, 2, 5] {
            match m.checked_mul(scale) {
                Some(v) if v <= max_model_len => out.push(v as f64),
                _ => return out,
            }
        }
        scale = scale.saturating_mul(10);
    }
}

#[derive(Debug)]
pub struct Histogram {
    bounds: Vec<f64>,
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
    fn new(bounds: &[f64]) -> Self {
        Histogram {
            bounds: bounds.to_vec(),
            inner: Mutex::new(HistogramState { counts: vec![0; bounds.len() + 1], ..Default::default() }),
        }
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
        render_histogram(out, name, help, labels, &self.bounds, &s.counts, s.sum);
    }
}

/// A histogram's exposition from per-bucket (not cumulative) counts, the last the `+Inf` one.
fn render_histogram(out: &mut String, name: &str, help: &str, labels: &str, bounds: &[f64], counts: &[u64], sum: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cum = 0;
    for (i, c) in counts.iter().enumerate() {
        cum += c;
        let le = bounds.get(i).map_or("+Inf".to_string(), |b| format_float(*b));
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cum}");
    }
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}\n{name}_count{{{labels}}} {cum}", format_float(sum));
}

/// Prometheus floats: Go's shortest form, with `+Inf`/`-Inf`/`NaN` spelled out.
fn format_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else {
        format!("{v}")
    }
}

/// Label values escape backslash, double quote and newline.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// One finished request (one choice: vLLM counts each of `n` completions as a request) as
/// vLLM's per-request histograms see it. Times are `None` where the request never got there.
#[derive(Debug, Clone, Default)]
pub struct FinishedRequest {
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache at admission, when the engine says.
    pub cached_tokens: Option<usize>,
    pub generation_tokens: usize,
    pub max_tokens_param: usize,
    /// First scheduled to first token, first to last token, first scheduled to last token.
    pub prefill: Option<f64>,
    pub decode: Option<f64>,
    pub inference: Option<f64>,
}

#[derive(Debug)]
pub struct Metrics {
    /// `model_name="…",engine="0"`: vLLM's labels (one engine).
    labels: String,
    model_label: String,
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    /// Finished requests by reason: stop, length, abort, error.
    pub finished: [AtomicU64; 4],
    /// Requests refused because the queue was full (vLLM's `max_num_queued_reqs`).
    pub admission_rejected: AtomicU64,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub queue: Histogram,
    pub request_prompt_tokens: Histogram,
    pub request_generation_tokens: Histogram,
    pub request_max_generation_tokens: Histogram,
    pub request_params_n: Histogram,
    pub request_params_max_tokens: Histogram,
    pub time_per_output_token: Histogram,
    pub prefill_time: Histogram,
    pub decode_time: Histogram,
    pub inference_time: Histogram,
    pub request_preemptions: Histogram,
    /// vLLM's `vllm:request_prefill_kv_computed_tokens`: per request, prompt tokens whose KV
    /// was computed (not found in the prefix cache).
    pub request_prefill_kv_computed: Histogram,
    /// `vllm:tool_call_parser_invocations_total`, see [`ToolParseTally`].
    tool_parses: Arc<ToolParseCounts>,
}

/// vLLM's `request_type` label of the tool-parser counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolRequestType {
    ChatCompletions,
    Responses,
    Other,
}

impl ToolRequestType {
    const ALL: [ToolRequestType; 3] =
        [ToolRequestType::ChatCompletions, ToolRequestType::Responses, ToolRequestType::Other];

    fn as_str(self) -> &'static str {
        match self {
            ToolRequestType::ChatCompletions => "chat_completions",
            ToolRequestType::Responses => "responses",
            ToolRequestType::Other => "other",
        }
    }
}

/// `vllm:tool_call_parser_invocations_total`, one counter a label combination.
type ToolParseCounts = [AtomicU64; 12];

fn tool_parse_index(request_type: ToolRequestType, streaming: bool, found_call: bool) -> usize {
    let t = ToolRequestType::ALL.iter().position(|&t| t == request_type).unwrap_or(2);
    t * 4 + usize::from(streaming) * 2 + usize::from(found_call)
}

/// Where one request counts its answers' reads by the tool-call parser (vLLM counts one a
/// choice read whole, one a delta read while streaming).
#[derive(Debug, Clone)]
pub struct ToolParseTally {
    counts: Arc<ToolParseCounts>,
    pub request_type: ToolRequestType,
}

impl ToolParseTally {
    pub fn count(&self, streaming: bool, found_call: bool) {
        self.counts[tool_parse_index(self.request_type, streaming, found_call)].fetch_add(1, Ordering::Relaxed);
    }
}

pub const FINISH_REASONS: [&str; 4] = ["stop", "length", "abort", "error"];

impl Metrics {
    /// Request-token histograms sized for a 2048-token context; see [`Metrics::for_model`].
    pub fn new(model_name: &str) -> Self {
        Self::for_model(model_name, 2048)
    }

    /// `max_model_len` bounds the request-token histograms' buckets, as in vLLM.
    pub fn for_model(model_name: &str, max_model_len: usize) -> Self {
        let name = escape_label(model_name);
        let tokens = request_tokens_buckets(max_model_len.max(1));
        Metrics {
            labels: format!("model_name=\"{name}\",engine=\"0\""),
            model_label: format!("model_name=\"{name}\""),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            finished: Default::default(),
            admission_rejected: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(REQUEST_BUCKETS),
            queue: Histogram::new(REQUEST_BUCKETS),
            request_prompt_tokens: Histogram::new(&tokens),
            request_generation_tokens: Histogram::new(&tokens),
            request_max_generation_tokens: Histogram::new(&tokens),
            request_params_n: Histogram::new(PARAMS_N_BUCKETS),
            request_params_max_tokens: Histogram::new(&tokens),
            time_per_output_token: Histogram::new(ITL_BUCKETS),
            prefill_time: Histogram::new(REQUEST_BUCKETS),
            decode_time: Histogram::new(REQUEST_BUCKETS),
            inference_time: Histogram::new(REQUEST_BUCKETS),
            request_preemptions: Histogram::new(PREEMPTIONS_BUCKETS),
            request_prefill_kv_computed: Histogram::new(&tokens),
            tool_parses: Default::default(),
        }
    }

    /// A request's tally of tool-parser reads.
    pub fn tool_parse_tally(&self, request_type: ToolRequestType) -> ToolParseTally {
        ToolParseTally { counts: self.tool_parses.clone(), request_type }
    }

    /// A finished request's histograms (vLLM's `FinishedRequestStats`).
    pub fn observe_finished(&self, r: &FinishedRequest) {
        self.request_prompt_tokens.observe(r.prompt_tokens as f64);
        self.request_generation_tokens.observe(r.generation_tokens as f64);
        if let Some(cached) = r.cached_tokens {
            self.request_prefill_kv_computed.observe(r.prompt_tokens.saturating_sub(cached) as f64);
        }
        if r.max_tokens_param > 0 {
            self.request_params_max_tokens.observe(r.max_tokens_param as f64);
        }
        if let (Some(p), Some(d), Some(i)) = (r.prefill, r.decode, r.inference) {
            self.prefill_time.observe(p);
            self.decode_time.observe(d);
            self.inference_time.observe(i);
            // vLLM: the prefill's token is not a decode's.
            self.time_per_output_token.observe(if r.generation_tokens > 1 {
                d / (r.generation_tokens - 1) as f64
            } else {
                0.0
            });
        }
    }

    pub fn count_finished(&self, reason: &str) {
        if let Some(i) = FINISH_REASONS.iter().position(|r| *r == reason) {
            self.finished[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The whole exposition, engine gauges included.
    pub fn render(&self, stats: &EngineStats, server_queued: usize) -> String {
        let l = &self.labels;
        let mut out = String::with_capacity(16384);
        let mut gauge = |name: &str, help: &str, v: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{l}}} {}", format_float(v));
        };
        gauge("vllm:num_requests_running", "Number of requests in model execution batches.", stats.num_running as f64);
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", stats.num_waiting as f64);
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", stats.kv_cache_usage);
        gauge("tandem:batch_size", "Sequences in the most recent engine step.", stats.batch_size as f64);
        if let Some(bytes) = stats.weights_bytes {
            gauge(
                "tandem:model_weights_bytes",
                "Bytes the backend holds for the model's weights (quantized ones as stored).",
                bytes as f64,
            );
        }
        gauge(
            "tandem:server_queued_requests",
            "Requests submitted by the server without output yet (bounded by max_queued_requests).",
            server_queued as f64,
        );
        // Every waiting request waits for capacity: nothing here defers one (no LoRA budget,
        // no KV transfer).
        let _ = writeln!(out, "# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason.\n# TYPE vllm:num_requests_waiting_by_reason gauge");
        let _ = writeln!(out, "vllm:num_requests_waiting_by_reason{{{l},reason=\"capacity\"}} {}\nvllm:num_requests_waiting_by_reason{{{l},reason=\"deferred\"}} 0", stats.num_waiting);
        // No sleep mode: always awake.
        let _ = writeln!(out, "# HELP vllm:engine_sleep_state Engine sleep state; awake = 1 means engine is awake.\n# TYPE vllm:engine_sleep_state gauge");
        for (s, v) in [("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)] {
            let _ = writeln!(out, "vllm:engine_sleep_state{{{l},sleep_state=\"{s}\"}} {v}");
        }
        if stats.block_size > 0 {
            let _ = writeln!(
                out,
                "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{block_size=\"{}\",num_gpu_blocks=\"{}\",engine=\"0\"}} 1",
                stats.block_size, stats.num_blocks
            );
        }
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name}_total {help}\n# TYPE {name}_total counter\n{name}_total{{{l}}} {v}");
        };
        let prompt_tokens = self.prompt_tokens.load(Ordering::Relaxed);
        counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            stats.prefix_cache_queries,
        );
        counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            stats.prefix_cache_hits,
        );
        // No KV connector and no multi-modal inputs: these stay 0.
        counter("vllm:external_prefix_cache_queries", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.", 0);
        counter("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.", 0);
        counter("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.", 0);
        counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.", 0);
        counter("vllm:num_preemptions", "Cumulative number of preemptions from the engine.", stats.num_preemptions);
        counter("vllm:prompt_tokens", "Number of prefill tokens processed.", prompt_tokens);
        counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            stats.prefix_cache_hits,
        );
        counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            self.generation_tokens.load(Ordering::Relaxed),
        );
        counter(
            "tandem:async_steps",
            "Engine steps sent to the model ahead of the previous step's postprocessing (async scheduling).",
            stats.async_steps,
        );
        counter("tandem:sync_steps", "Engine steps whose forward and postprocessing ran one after the other (async scheduling off, or a step that needed host-side results).", stats.sync_steps);
        counter(
            "tandem:structured_output_masks",
            "Token masks computed for structured output (one per constrained token).",
            stats.guided_masks_total,
        );
        if !stats.spec_decode_num_accepted_tokens_per_pos.is_empty() {
            counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", stats.spec_decode_num_drafts);
            counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", stats.spec_decode_num_draft_tokens);
            counter(
                "vllm:spec_decode_num_accepted_tokens",
                "Number of accepted tokens.",
                stats.spec_decode_num_accepted_tokens,
            );
            let name = "vllm:spec_decode_num_accepted_tokens_per_pos_total";
            let _ = writeln!(out, "# HELP {name} Accepted tokens per draft position.\n# TYPE {name} counter");
            for (p, v) in stats.spec_decode_num_accepted_tokens_per_pos.iter().enumerate() {
                let _ = writeln!(out, "{name}{{{l},position=\"{p}\"}} {v}");
            }
        }
        let _ = writeln!(
            out,
            "# HELP tandem:structured_output_mask_seconds_total Time spent computing structured-output masks (beside the forward, on helper threads).\n# TYPE tandem:structured_output_mask_seconds_total counter\ntandem:structured_output_mask_seconds_total{{{l}}} {}",
            format_float(stats.guided_mask_seconds_total)
        );
        if let Some(e) = stats.step_estimate {
            for (name, help, v) in [
                ("vllm:estimated_flops_per_gpu_total", "Estimated floating-point operations of the engine's steps (analytic, from the model's shape; see docs/openai-compat.md).", e.flops),
                ("vllm:estimated_read_bytes_per_gpu_total", "Estimated bytes read from device memory by the engine's steps (weights once a step, KV context).", e.read_bytes),
                ("vllm:estimated_write_bytes_per_gpu_total", "Estimated bytes written to device memory by the engine's steps (KV of the tokens computed).", e.write_bytes),
            ] {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{l}}} {}", format_float(v));
            }
        }
        // Prompt tokens by where their KV came from: the local prefix cache, or computed.
        let cached = stats.prefix_cache_hits.min(prompt_tokens);
        let _ = writeln!(out, "# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.\n# TYPE vllm:prompt_tokens_by_source_total counter");
        for (src, v) in
            [("local_compute", prompt_tokens - cached), ("local_cache_hit", cached), ("external_kv_transfer", 0)]
        {
            let _ = writeln!(out, "vllm:prompt_tokens_by_source_total{{{l},source=\"{src}\"}} {v}");
        }
        let _ = writeln!(out, "# HELP vllm:prompt_tokens_cached_by_source_total Prefix-cache hit tokens by the cache tier that supplied them.\n# TYPE vllm:prompt_tokens_cached_by_source_total counter");
        for (src, v) in
            [("device", stats.prefix_cache_hits), ("host", 0), ("p2p", 0), ("disk", 0), ("external_unspecified", 0)]
        {
            let _ = writeln!(out, "vllm:prompt_tokens_cached_by_source_total{{{l},source=\"{src}\"}} {v}");
        }
        let _ = writeln!(out, "# HELP vllm:request_success_total Count of successfully processed requests.\n# TYPE vllm:request_success_total counter");
        for (i, r) in FINISH_REASONS.iter().enumerate() {
            let _ = writeln!(
                out,
                "vllm:request_success_total{{{l},finished_reason=\"{r}\"}} {}",
                self.finished[i].load(Ordering::Relaxed)
            );
        }
        let m = &self.model_label;
        let _ = writeln!(out, "# HELP vllm:tool_call_parser_invocations_total Tool-call parser invocations, by mode, outcome and request type.\n# TYPE vllm:tool_call_parser_invocations_total counter");
        for request_type in ToolRequestType::ALL {
            for streaming in [false, true] {
                for found_call in [true, false] {
                    let v =
                        self.tool_parses[tool_parse_index(request_type, streaming, found_call)].load(Ordering::Relaxed);
                    let mode = if streaming { "streaming" } else { "non_streaming" };
                    let outcome = if found_call { "tool_call" } else { "no_tool_call" };
                    let _ = writeln!(out, "vllm:tool_call_parser_invocations_total{{{m},mode=\"{mode}\",outcome=\"{outcome}\",request_type=\"{}\"}} {v}", request_type.as_str());
                }
            }
        }
        let _ = writeln!(out, "# HELP vllm:admission_rejections_total Requests rejected at admission because a queue limit was reached.\n# TYPE vllm:admission_rejections_total counter");
        let _ = writeln!(out, "vllm:admission_rejections_total{{{m},reason=\"max_num_queued_reqs\"}} {}\nvllm:admission_rejections_total{{{m},reason=\"max_num_queued_tokens\"}} 0", self.admission_rejected.load(Ordering::Relaxed));
        self.request_prompt_tokens.render(
            &mut out,
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            l,
        );
        self.request_generation_tokens.render(
            &mut out,
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            l,
        );
        self.request_prefill_kv_computed.render(
            &mut out,
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            l,
        );
        self.iteration_tokens(&mut out, stats);
        self.request_max_generation_tokens.render(
            &mut out,
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            l,
        );
        self.request_params_n.render(&mut out, "vllm:request_params_n", "Histogram of the n request parameter.", l);
        self.request_params_max_tokens.render(
            &mut out,
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            l,
        );
        self.ttft.render(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            l,
        );
        self.itl.render(
            &mut out,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            l,
        );
        self.time_per_output_token.render(
            &mut out,
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            l,
        );
        self.e2e.render(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            l,
        );
        self.queue.render(
            &mut out,
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            l,
        );
        self.inference_time.render(
            &mut out,
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            l,
        );
        self.prefill_time.render(
            &mut out,
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            l,
        );
        self.decode_time.render(
            &mut out,
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            l,
        );
        self.request_preemptions.render(
            &mut out,
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            l,
        );
        out
    }

    /// `vllm:iteration_tokens_total` from the engine's power-of-two bins: each of vLLM's
    /// bounds is a power of two, so its cumulative count is exact.
    fn iteration_tokens(&self, out: &mut String, stats: &EngineStats) {
        let bins = &stats.iteration_tokens;
        // Bin k holds (2^(k-1), 2^k]: the bins up to bound 2^j are 0..=j.
        let below = |bound: f64| bins.iter().take(bound.log2() as usize + 1).sum::<u64>();
        let mut counts = Vec::with_capacity(ITERATION_TOKENS_BUCKETS.len() + 1);
        let mut prev = 0;
        for &b in ITERATION_TOKENS_BUCKETS {
            let c = below(b);
            counts.push(c - prev);
            prev = c;
        }
        counts.push(bins.iter().sum::<u64>() - prev);
        render_histogram(
            out,
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            &self.labels,
            ITERATION_TOKENS_BUCKETS,
            &counts,
            stats.iteration_tokens_sum as f64,
        );
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
        let l = "model_name=\"m\\\"x\",engine=\"0\"";
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_bucket{{{l},le=\"0.001\"}} 1\n")), "{text}");
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_bucket{{{l},le=\"0.005\"}} 3\n")));
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_bucket{{{l},le=\"2560\"}} 3\n")));
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_bucket{{{l},le=\"+Inf\"}} 4\n")));
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_count{{{l}}} 4\n")));
    }

    /// vLLM's 1-2-5 request-token buckets up to max_model_len, and the iteration-token
    /// histogram summed exactly from the engine's power-of-two bins.
    #[test]
    fn request_token_buckets_and_iteration_tokens() {
        assert_eq!(request_tokens_buckets(256), [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0]);
        assert_eq!(request_tokens_buckets(1000), [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]);
        // Steps of 1, 2, 8, 9 and 40000 tokens.
        let mut bins = vec![0u64; 17];
        for k in [0, 1, 3, 4, 16] {
            bins[k] += 1;
        }
        let text = Metrics::new("m")
            .render(&EngineStats { iteration_tokens: bins, iteration_tokens_sum: 40020, ..Default::default() }, 0);
        let l = "model_name=\"m\",engine=\"0\"";
        for (le, want) in [("1", 1), ("8", 3), ("16", 4), ("16384", 4), ("+Inf", 5)] {
            assert!(
                text.contains(&format!("vllm:iteration_tokens_total_bucket{{{l},le=\"{le}\"}} {want}\n")),
                "{le}: {text}"
            );
        }
        assert!(text.contains(&format!("vllm:iteration_tokens_total_sum{{{l}}} 40020\n")));
    }

    /// vLLM's speculative-decoding counters, only when speculation is on.
    #[test]
    fn spec_decode_counters_when_speculating() {
        assert!(!Metrics::new("m").render(&EngineStats::default(), 0).contains("spec_decode"));
        let st = EngineStats {
            spec_decode_num_drafts: 5,
            spec_decode_num_draft_tokens: 12,
            spec_decode_num_accepted_tokens: 7,
            spec_decode_num_accepted_tokens_per_pos: vec![4, 3],
            ..Default::default()
        };
        let text = Metrics::new("m").render(&st, 0);
        for line in [
            "vllm:spec_decode_num_drafts_total{model_name=\"m\",engine=\"0\"} 5",
            "vllm:spec_decode_num_draft_tokens_total{model_name=\"m\",engine=\"0\"} 12",
            "vllm:spec_decode_num_accepted_tokens_total{model_name=\"m\",engine=\"0\"} 7",
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",engine=\"0\",position=\"1\"} 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
    }

    /// The weights' bytes as the backend holds them, a gauge, only where the backend counts them.
    #[test]
    fn model_weights_bytes_is_a_gauge_when_known() {
        assert!(!Metrics::new("m").render(&EngineStats::default(), 0).contains("model_weights_bytes"));
        let text = Metrics::new("m").render(&EngineStats { weights_bytes: Some(123456), ..Default::default() }, 0);
        assert!(text.contains("# TYPE tandem:model_weights_bytes gauge\n"), "{text}");
        assert!(text.contains("tandem:model_weights_bytes{model_name=\"m\",engine=\"0\"} 123456\n"), "{text}");
    }

    /// The engine's step counters of async scheduling, as Prometheus counters.
    #[test]
    fn async_and_sync_steps_are_counters() {
        let text = Metrics::new("m").render(&EngineStats { async_steps: 7, sync_steps: 2, ..Default::default() }, 0);
        assert!(
            text.contains(
                "# TYPE tandem:async_steps_total counter\ntandem:async_steps_total{model_name=\"m\",engine=\"0\"} 7\n"
            ),
            "{text}"
        );
        assert!(text.contains("tandem:sync_steps_total{model_name=\"m\",engine=\"0\"} 2\n"), "{text}");
    }
}
