//! What a request asks of sampling and stopping, with the defaults and ranges users know from
//! vLLM and the OpenAI API. [`SamplingParams::validate`] names the offending field.

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
    /// Added to the logits of these tokens before sampling (OpenAI's `logit_bias`); logprobs
    /// stay those of the raw logits.
    pub logit_bias: Vec<(u32, f32)>,
    /// A stop string that ends the text stays in it (vLLM's `include_stop_str_in_output`).
    pub include_stop_str_in_output: bool,
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
        }
    }
}

/// Most top-N logprobs a request may ask for (vLLM's default cap is 20).
pub const MAX_LOGPROBS: usize = 20;

impl SamplingParams {
    /// Greedy decoding of at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        SamplingParams { temperature: 0.0, max_tokens: Some(max_tokens), ..Default::default() }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature < tandem_core::sampling::GREEDY_BELOW
    }

    pub fn validate(&self) -> Result<(), String> {
        let finite = |v: f32, name: &str| if v.is_finite() { Ok(()) } else { Err(format!("{name} must be a finite number, got {v}")) };
        finite(self.temperature, "temperature")?;
        finite(self.top_p, "top_p")?;
        finite(self.min_p, "min_p")?;
        finite(self.repetition_penalty, "repetition_penalty")?;
        finite(self.presence_penalty, "presence_penalty")?;
        finite(self.frequency_penalty, "frequency_penalty")?;
        if self.n < 1 {
            return Err(format!("n must be at least 1, got {}", self.n));
        }
        if self.temperature < 0.0 {
            return Err(format!("temperature must be >= 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if self.repetition_penalty <= 0.0 {
            return Err(format!("repetition_penalty must be > 0, got {}", self.repetition_penalty));
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return Err(format!("presence_penalty must be in [-2, 2], got {}", self.presence_penalty));
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err(format!("frequency_penalty must be in [-2, 2], got {}", self.frequency_penalty));
        }
        // Scoring a prompt (echo with logprobs) may generate nothing.
        if self.max_tokens == Some(0) && self.prompt_logprobs.is_none() {
            return Err("max_tokens must be at least 1 unless prompt logprobs are asked for, got 0".into());
        }
        if let Some(m) = self.max_tokens {
            if self.min_tokens > m {
                return Err(format!("min_tokens ({}) must not exceed max_tokens ({m})", self.min_tokens));
            }
        }
        if let Some(k) = self.logprobs {
            if k > MAX_LOGPROBS {
                return Err(format!("logprobs must be at most {MAX_LOGPROBS}, got {k}"));
            }
        }
        if let Some(k) = self.prompt_logprobs {
            if k > MAX_LOGPROBS {
                return Err(format!("prompt_logprobs must be at most {MAX_LOGPROBS}, got {k}"));
            }
        }
        if let Some((t, b)) = self.logit_bias.iter().find(|(_, b)| !b.is_finite() || !(-100.0..=100.0).contains(b)) {
            return Err(format!("logit_bias of token {t} must be in [-100, 100], got {b}"));
        }
        if let Some(s) = self.stop.iter().find(|s| s.is_empty()) {
            return Err(format!("stop strings must not be empty, got {s:?}"));
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
        let bad = |f: fn(&mut SamplingParams), field: &str| {
            let mut p = SamplingParams::default();
            f(&mut p);
            let e = p.validate().unwrap_err();
            assert!(e.starts_with(field), "{e}");
        };
        bad(|p| p.top_p = 0.0, "top_p");
        bad(|p| p.top_p = 1.5, "top_p");
        bad(|p| p.temperature = -0.1, "temperature");
        bad(|p| p.temperature = f32::NAN, "temperature");
        bad(|p| p.n = 0, "n must");
        bad(|p| p.min_p = 2.0, "min_p");
        bad(|p| p.repetition_penalty = 0.0, "repetition_penalty");
        bad(|p| p.presence_penalty = 3.0, "presence_penalty");
        bad(|p| p.frequency_penalty = -3.0, "frequency_penalty");
        bad(|p| p.max_tokens = Some(0), "max_tokens");
        bad(|p| p.min_tokens = 100, "min_tokens");
        bad(|p| p.logprobs = Some(50), "logprobs");
        bad(|p| p.stop = vec![String::new()], "stop");
        bad(|p| p.prompt_logprobs = Some(21), "prompt_logprobs");
        bad(|p| p.logit_bias = vec![(3, 101.0)], "logit_bias");
        let score_only = SamplingParams { max_tokens: Some(0), prompt_logprobs: Some(0), ..Default::default() };
        assert!(score_only.validate().is_ok(), "max_tokens 0 scores the prompt");
    }
}
