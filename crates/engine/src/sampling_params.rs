//! What a request asks of sampling and stopping, with the defaults and ranges users know from
//! vLLM and the OpenAI API. [`SamplingParams::validate`] is the one range check (the engine, the
//! server and the `tandem` library all call it); its error names the offending field.

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Completions per prompt; they share the prompt's KV blocks.
    pub n: usize,
    /// 0 means greedy; so does anything below `tandem_core::sampling::GREEDY_BELOW` (1e-5).
    pub temperature: f32,
    /// 0 means no limit.
    pub top_k: usize,
    /// In (0, 1]; 1 keeps everything.
    pub top_p: f32,
    /// In [0, 1]; drops tokens below `min_p` times the best token's probability.
    pub min_p: f32,
    /// > 0; 1 is off. Applied to prompt and output tokens (vLLM's rule).
    pub repetition_penalty: f32,
    /// In [-2, 2]; applied to output tokens.
    pub presence_penalty: f32,
    /// In [-2, 2]; applied to output tokens, per occurrence.
    pub frequency_penalty: f32,
    /// Per-request seed; output token `j` of completion `i` draws Philox at (seed, i, j).
    pub seed: Option<u64>,
    /// Generation stops when the text contains one of these; it is not part of the output.
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// None: up to the model's context length.
    pub max_tokens: Option<usize>,
    /// EOS, stop tokens and stop strings are ignored before this many tokens.
    pub min_tokens: usize,
    /// Top-N log-probabilities per generated token (of the raw logits' log-softmax).
    pub logprobs: Option<usize>,
    /// Log-probabilities of the prompt's tokens (each given the ones before it), with the top N
    /// at each position: vLLM's `prompt_logprobs`, and completions' `echo` with `logprobs`.
    /// Such a request computes its whole prompt (no prefix-cache hit), as vLLM does.
    pub prompt_logprobs: Option<usize>,
    /// Added to the logits of these tokens before sampling (OpenAI's `logit_bias`; a token
    /// named twice takes the last value, as in a JSON map); logprobs stay those of the raw
    /// logits.
    pub logit_bias: Vec<(u32, f32)>,
    /// A stop string that ends the text stays in it (vLLM's `include_stop_str_in_output`).
    pub include_stop_str_in_output: bool,
    /// Constrained decoding: only tokens the constraint allows are sampled (structured output).
    pub guided: Option<crate::constraint::Guided>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            n: 1,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            max_tokens: Some(16),
            min_tokens: 0,
            logprobs: None,
            prompt_logprobs: None,
            logit_bias: Vec::new(),
            include_stop_str_in_output: false,
            guided: None,
        }
    }
}

/// Most top-N logprobs a request may ask for (vLLM's default cap is 20).
pub const MAX_LOGPROBS: usize = 20;
/// Most completions one request may ask for.
pub const MAX_N: usize = 128;
/// Highest temperature accepted (OpenAI's range).
pub const MAX_TEMPERATURE: f32 = 2.0;
/// Highest repetition penalty accepted.
pub const MAX_REPETITION_PENALTY: f32 = 10.0;

/// A sampling parameter out of range: `field` is its name as the server's JSON and
/// [`SamplingParams`] spell it, `message` says what is accepted and what was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidParam {
    pub field: &'static str,
    pub message: String,
}

impl InvalidParam {
    fn new(field: &'static str, message: String) -> Self {
        InvalidParam { field, message }
    }
}

impl SamplingParams {
    /// Greedy decoding of at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        SamplingParams { temperature: 0.0, max_tokens: Some(max_tokens), ..Default::default() }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature < tandem_core::sampling::GREEDY_BELOW
    }

    /// Checks every range; the one check shared by the engine, the server and the `tandem`
    /// library, so each accepts and refuses the same values.
    pub fn validate(&self) -> Result<(), InvalidParam> {
        let bad = |field: &'static str, message: String| Err(InvalidParam::new(field, message));
        let floats = [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("repetition_penalty", self.repetition_penalty),
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ];
        if let Some((field, v)) = floats.into_iter().find(|(_, v)| !v.is_finite()) {
            return bad(field, format!("`{field}` must be a finite number, got {v}"));
        }
        if !(1..=MAX_N).contains(&self.n) {
            return bad("n", format!("`n` must be in [1, {MAX_N}], got {}", self.n));
        }
        if !(0.0..=MAX_TEMPERATURE).contains(&self.temperature) {
            return bad(
                "temperature",
                format!("`temperature` must be in [0, {MAX_TEMPERATURE}], got {}", self.temperature),
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("`top_p` must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", format!("`min_p` must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty <= MAX_REPETITION_PENALTY) {
            return bad(
                "repetition_penalty",
                format!(
                    "`repetition_penalty` must be in (0, {MAX_REPETITION_PENALTY}], got {}",
                    self.repetition_penalty
                ),
            );
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return bad(
                "presence_penalty",
                format!("`presence_penalty` must be in [-2, 2], got {}", self.presence_penalty),
            );
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return bad(
                "frequency_penalty",
                format!("`frequency_penalty` must be in [-2, 2], got {}", self.frequency_penalty),
            );
        }
        // Scoring a prompt (echo with logprobs) may generate nothing.
        if self.max_tokens == Some(0) && self.prompt_logprobs.is_none() {
            return bad(
                "max_tokens",
                "`max_tokens` must be at least 1 unless prompt logprobs are asked for, got 0".into(),
            );
        }
        if let Some(m) = self.max_tokens.filter(|&m| self.min_tokens > m) {
            return bad("min_tokens", format!("`min_tokens` ({}) must not exceed `max_tokens` ({m})", self.min_tokens));
        }
        if let Some(k) = self.logprobs.filter(|&k| k > MAX_LOGPROBS) {
            return bad("logprobs", format!("`logprobs` must be in [0, {MAX_LOGPROBS}], got {k}"));
        }
        if let Some(k) = self.prompt_logprobs.filter(|&k| k > MAX_LOGPROBS) {
            return bad("prompt_logprobs", format!("`prompt_logprobs` must be in [0, {MAX_LOGPROBS}], got {k}"));
        }
        if let Some((t, b)) = self.logit_bias.iter().find(|(_, b)| !b.is_finite() || !(-100.0..=100.0).contains(b)) {
            return bad("logit_bias", format!("`logit_bias` of token {t} must be in [-100, 100], got {b}"));
        }
        if self.stop.iter().any(|s| s.is_empty()) {
            return bad("stop", "`stop` strings must not be empty".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_the_field() {
        assert!(SamplingParams::default().validate().is_ok());
        let edges = SamplingParams {
            n: MAX_N,
            temperature: MAX_TEMPERATURE,
            repetition_penalty: MAX_REPETITION_PENALTY,
            logprobs: Some(MAX_LOGPROBS),
            ..Default::default()
        };
        assert!(edges.validate().is_ok(), "the ends of each range are accepted");
        let bad = |f: fn(&mut SamplingParams), field: &str, range: &str| {
            let mut p = SamplingParams::default();
            f(&mut p);
            let e = p.validate().unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.message.starts_with(&format!("`{field}`")) && e.message.contains(range), "{e}");
        };
        bad(|p| p.top_p = 0.0, "top_p", "(0, 1]");
        bad(|p| p.top_p = 1.5, "top_p", "(0, 1]");
        bad(|p| p.temperature = -0.1, "temperature", "[0, 2]");
        bad(|p| p.temperature = 2.5, "temperature", "[0, 2]");
        bad(|p| p.temperature = f32::NAN, "temperature", "finite");
        bad(|p| p.top_p = f32::INFINITY, "top_p", "finite");
        bad(|p| p.n = 0, "n", "[1, 128]");
        bad(|p| p.n = 129, "n", "[1, 128]");
        bad(|p| p.min_p = 2.0, "min_p", "[0, 1]");
        bad(|p| p.repetition_penalty = 0.0, "repetition_penalty", "(0, 10]");
        bad(|p| p.repetition_penalty = 11.0, "repetition_penalty", "(0, 10]");
        bad(|p| p.presence_penalty = 3.0, "presence_penalty", "[-2, 2]");
        bad(|p| p.frequency_penalty = -3.0, "frequency_penalty", "[-2, 2]");
        bad(|p| p.max_tokens = Some(0), "max_tokens", "at least 1");
        bad(|p| p.min_tokens = 100, "min_tokens", "must not exceed");
        bad(|p| p.logprobs = Some(50), "logprobs", "[0, 20]");
        bad(|p| p.stop = vec![String::new()], "stop", "must not be empty");
        bad(|p| p.prompt_logprobs = Some(21), "prompt_logprobs", "[0, 20]");
        bad(|p| p.logit_bias = vec![(3, 101.0)], "logit_bias", "[-100, 100]");
        let score_only = SamplingParams { max_tokens: Some(0), prompt_logprobs: Some(0), ..Default::default() };
        assert!(score_only.validate().is_ok(), "max_tokens 0 scores the prompt");
    }
}
