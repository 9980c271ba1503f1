//! What the engine reports: a snapshot of counters and gauges updated every step (the server
//! exports them, named like vLLM's), and per-request timings delivered with each request's
//! final output so the server can fill latency histograms.

use std::time::{Duration, Instant};

use crate::sequence::{FinishReason, SeqTimes};

/// Engine-wide counters (monotonic, `_total`) and gauges (current values).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub num_running: usize,
    pub num_waiting: usize,
    /// The LoRA slots the running and the waiting sequences use, each once, ascending.
    pub running_adapters: Vec<u32>,
    pub waiting_adapters: Vec<u32>,
    /// Fraction of KV blocks held by sequences, in [0, 1].
    pub kv_usage: f32,
    /// Highest `kv_usage` seen right after scheduling a step (the step's high-water mark, before
    /// finished sequences free their blocks), since the engine started.
    pub kv_usage_peak: f32,
    /// Prompt tokens looked up in the prefix cache (counted in tokens, like vLLM).
    pub prefix_cache_queries_total: u64,
    /// Of those, tokens whose KV was found cached.
    pub prefix_cache_hits_total: u64,
    pub preemptions_total: u64,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub steps_total: u64,
    /// Forwards sent to the model worker ahead of their postprocessing (async scheduling),
    /// and forwards run and postprocessed within their step (synchronous: async scheduling
    /// off, or a step that had to wait for host-side results).
    pub async_steps_total: u64,
    pub sync_steps_total: u64,
    /// Sequences in the last step's batch.
    pub batch_size: usize,
    pub forward_errors_total: u64,
    /// Completions ended, by reason (a request with `n > 1` counts `n`).
    pub requests_stop_total: u64,
    pub requests_length_total: u64,
    pub requests_abort_total: u64,
    pub requests_error_total: u64,
    /// Constraint masks computed (one per constrained row sampled, a draft row's included)
    /// and the seconds they took.
    pub guided_masks_total: u64,
    pub guided_mask_seconds_total: f64,
    /// The most recent mask times (at most [`MASK_SAMPLES`]), for percentiles.
    pub guided_mask_seconds: std::collections::VecDeque<f64>,
    /// Tokens computed per step (prompt chunks and decodes), as a histogram over powers of
    /// two: entry `k` counts steps of `(2^(k-1), 2^k]` tokens (entry 0: one token), the last
    /// entry everything above `2^(ITERATION_TOKEN_BINS - 2)`. Any power-of-two bucket bounds
    /// (vLLM's `vllm:iteration_tokens_total`) are sums of these.
    pub iteration_tokens: [u64; ITERATION_TOKEN_BINS],
    pub iteration_tokens_sum: u64,
    /// Speculative decoding (vLLM's `spec_decode_*` counters): sequence-steps verified with
    /// drafts, draft tokens verified, drafts accepted, and per draft position how often the
    /// draft there was accepted.
    pub spec_decode_num_drafts_total: u64,
    pub spec_decode_num_draft_tokens_total: u64,
    pub spec_decode_num_accepted_tokens_total: u64,
    pub spec_decode_num_accepted_tokens_per_pos: Vec<u64>,
    /// Attention work of the steps so far: keys attended, summed over every token computed
    /// (a token at position `p` attends to `p + 1`), and KV rows read, summed over each
    /// step's sequences (a sequence reads its context up to the chunk's end once a step).
    pub attended_keys_total: u64,
    pub kv_rows_read_total: u64,
}

/// Bins of [`Stats::iteration_tokens`]: up to 2^15 tokens a step, then one overflow bin.
pub const ITERATION_TOKEN_BINS: usize = 17;

/// Mask times kept for percentiles.
pub const MASK_SAMPLES: usize = 8192;

impl Stats {
    /// Records the mask times of one step.
    pub fn record_masks(&mut self, seconds: &[f64]) {
        self.guided_masks_total += seconds.len() as u64;
        for &t in seconds {
            self.guided_mask_seconds_total += t;
            if self.guided_mask_seconds.len() == MASK_SAMPLES {
                self.guided_mask_seconds.pop_front();
            }
            self.guided_mask_seconds.push_back(t);
        }
    }

    /// Records one verification: `drafts` draft tokens, the first `accepted` of them kept.
    pub fn record_verification(&mut self, drafts: usize, accepted: usize) {
        self.spec_decode_num_drafts_total += 1;
        self.spec_decode_num_draft_tokens_total += drafts as u64;
        self.spec_decode_num_accepted_tokens_total += accepted as u64;
        let per_pos = &mut self.spec_decode_num_accepted_tokens_per_pos;
        if per_pos.len() < drafts {
            per_pos.resize(drafts, 0);
        }
        for n in &mut per_pos[..accepted] {
            *n += 1;
        }
    }

    /// Records the tokens of one step that computed any.
    pub fn record_iteration_tokens(&mut self, tokens: usize) {
        if tokens == 0 {
            return;
        }
        let bin = (tokens.next_power_of_two().trailing_zeros() as usize).min(ITERATION_TOKEN_BINS - 1);
        self.iteration_tokens[bin] += 1;
        self.iteration_tokens_sum += tokens as u64;
    }

    /// Records the attention work of one scheduled step: per sequence, its chunk of `tokens`
    /// starting at position `start`.
    pub fn record_attention(&mut self, chunks: impl IntoIterator<Item = (usize, usize)>) {
        for (start, tokens) in chunks {
            let (start, end) = (start as u64, (start + tokens) as u64);
            // Positions start..end attend to start+1 ..= end keys.
            self.attended_keys_total += (end * (end + 1) - start * (start + 1)) / 2;
            self.kv_rows_read_total += end;
        }
    }

    pub fn count_finish(&mut self, reason: &FinishReason) {
        match reason {
            FinishReason::Stop { .. } => self.requests_stop_total += 1,
            FinishReason::Length => self.requests_length_total += 1,
            FinishReason::Abort => self.requests_abort_total += 1,
            FinishReason::Error(_) => self.requests_error_total += 1,
        }
    }
}

/// Timings of one request (of its first completion when `n > 1`).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestMetrics {
    /// Arrival to first scheduled; None if it never left the queue.
    pub queue_time: Option<Duration>,
    /// Arrival to first output token.
    pub time_to_first_token: Option<Duration>,
    /// Seconds between consecutive output tokens.
    pub inter_token_seconds: Vec<f32>,
    /// Arrival to the final output.
    pub e2e: Duration,
    pub num_preemptions: u32,
    /// Prompt tokens found in the prefix cache at first admission; None if never admitted.
    pub num_cached_tokens: Option<usize>,
}

impl RequestMetrics {
    pub fn from_times(t: &SeqTimes, now: Instant, num_preemptions: u32) -> Self {
        RequestMetrics {
            queue_time: t.first_scheduled.map(|s| s - t.arrival),
            time_to_first_token: t.first_token.map(|s| s - t.arrival),
            inter_token_seconds: t.inter_token.clone(),
            e2e: now - t.arrival,
            num_preemptions,
            num_cached_tokens: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bin k holds (2^(k-1), 2^k] tokens; beyond 2^15 the overflow bin; empty steps are not steps.
    /// A 3-token prompt chunk from position 0 attends 1 + 2 + 3 keys and reads 3 KV rows; a
    /// decode at position 3 attends 4 and reads 4.
    #[test]
    fn attention_work_counts_keys_and_rows() {
        let mut s = Stats::default();
        s.record_attention([(0, 3), (3, 1)]);
        assert_eq!((s.attended_keys_total, s.kv_rows_read_total), (6 + 4, 3 + 4));
    }

    #[test]
    fn iteration_tokens_fall_in_power_of_two_bins() {
        let mut s = Stats::default();
        for t in [0, 1, 2, 3, 8, 9, 16384, 16385, 1 << 20] {
            s.record_iteration_tokens(t);
        }
        let mut want = [0u64; ITERATION_TOKEN_BINS];
        for k in [0, 1, 2, 3, 4, 14, 15, 16] {
            want[k] += 1;
        }
        assert_eq!(s.iteration_tokens, want);
        assert_eq!(s.iteration_tokens_sum, (1 + 2 + 3 + 8 + 9 + 16384 + 16385 + (1 << 20)) as u64);
    }
}
