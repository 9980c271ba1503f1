//! Speculative decoding: draft tokens proposed cheaply on the host, verified by the target
//! model in one forward, kept only where the target agrees, so a greedy answer is bitwise the
//! same with speculation on as off, and a sampled one keeps its distribution (a seeded one its
//! very tokens).
//!
//! Why it can be exact: Tandem's kernels are batch-invariant (a row's logits do not depend on
//! what else is in the forward, nor on how a sequence's tokens are chunked), so the logits the
//! target gives position `p` in a verification forward are the logits it would give `p` in a
//! plain decode step. Greedy acceptance by exact match then keeps precisely the tokens plain
//! decoding would have produced.
//!
//! How a step runs with drafts:
//! 1. Propose (`Engine::propose_drafts`, before the schedule): each running decode sequence
//!    that [`drafts_allowed`] gets up to `k` draft tokens from the [`DraftProposer`] (or the
//!    [`DraftHead`], which reads the target's hidden states that each forward keeps) in
//!    `Sequence::draft` (kept outside `Sequence::tokens`, which hold only what is committed).
//!    `k` is cut so that the bonus token still fits `max_tokens`, and adapts to load and to
//!    acceptance ([`draft_length`]: fewer drafts as the running batch grows, none for a
//!    sequence whose recent drafts were mostly rejected); and when the running decodes with
//!    `k + 1` tokens each would not fit the token budget, each gets `budget / decodes - 1`
//!    drafts (none when that is 0).
//! 2. Schedule: a decode with `d` drafts is one chunk of `1 + d` tokens (its last committed
//!    token, then the drafts) under the token budget; its block table grows to hold them, and
//!    every position gets a logit row (the extra `d` rows come out of the runner's spare logit
//!    rows, which prompt logprobs use too). Budget or rows short: fewer drafts.
//! 3. Forward: each of the `1 + d` rows is sampled as a plain decode would sample it, where
//!    the logits are (or on the host from the logits, when some other row of the step needs
//!    the host): row `i` with the request's own spec for output token `j + i` (`j`: its outputs
//!    so far), so id `i` is the token the target draws after the committed tokens and drafts
//!    `0..i`.
//! 4. Verify ([`accepted_len`]): `a` = how many leading drafts equal the target's ids. The
//!    target's ids `0..=a` are committed one by one through the ordinary emit path, so EOS,
//!    stop tokens, stop strings, `max_tokens` and the context limit end the sequence at the
//!    same token as without speculation (what follows is dropped).
//! 5. Roll back (`Scheduler::settle_drafts`): the KV of the last committed token and the `a`
//!    accepted drafts is kept (`num_computed_tokens` counts them); the slots of rejected drafts
//!    are simply written over when those positions are computed with the real tokens; blocks
//!    allocated only for rejected drafts go back to the pool; and the prefix cache registers a
//!    block only once every token in it is committed and computed, so it never records a block
//!    holding a rejected draft.
//!
//! Preemption drops a sequence's drafts with its blocks; an abort or a finished sequence frees
//! its blocks as always, drafts included.
//!
//! Sampled requests (temperature above [`tandem_core::sampling::GREEDY_BELOW`], with top-k,
//! top-p and min-p as the sampler applies them) are verified by the same rule, which is
//! rejection sampling for a draft that is a point mass. Let `p` be the target's processed
//! distribution at a drafted position and `d` the draft (n-gram and suffix drafts are
//! deterministic, and so are a draft head's greedy drafts given the committed tokens: the
//! draft distribution `q` puts all its mass on `d`). Standard speculative
//! sampling accepts `d` with probability `min(1, p(d) / q(d)) = p(d)`, and on rejection draws
//! from the residual `max(0, p - q)` renormalised, which is `p` with `d` removed. Here the
//! target's token `x` is drawn from `p` with the request's own keyed uniform (seed, completion,
//! token index), and `d` is accepted iff `x == d`; otherwise `x` is the token. Then
//! `P(accept) = P(x = d) = p(d)`, and given a rejection `x` is distributed as `p` conditioned
//! on `x != d`: `p` with `d` removed, renormalised. After `d` drafts all accepted, the bonus
//! token is `x` at the last row, a draw from `p` there. So the rule is the standard one, and
//! more: every token is the draw that plain decoding makes from the same logits with the same
//! key (the logits are bitwise the same, see above), so a seeded sampled request gives the
//! same tokens with speculation on as off, not only the same distribution, and the
//! architecture's rule that a sampled token is a function of (seed, completion, token index)
//! and its row's logits holds with drafts too.
//!
//! Who gets drafts ([`drafts_allowed`]): every request but those with prompt logprobs, greedy
//! or sampled. Row `i` of a drafted decode is sampled with the
//! penalties, `logit_bias` and bans of output token `j + i` as if drafts `0..i` had been
//! emitted (the output they count is the committed output followed by those drafts, and a
//! `min_tokens` ban lifts at the row where it would lift), and its logprobs, when asked, are
//! that row's, so every emitted token and its logprobs are what plain decoding gives. A
//! request with `n > 1` drafts in each completion on its own (each is its own sequence once
//! forked). Structured output drafts as vLLM's does: the drafts are checked on a copy of the
//! sequence's constraint (`Constraint::fork`), kept up to the first it rejects (or the first
//! that completes the grammar), and the mask of each row (what the constraint allows after
//! the drafts before it) is kept with them, so row `i` is sampled under the mask plain
//! decoding would have had at output token `j + i`; the real constraint takes only the
//! emitted tokens. Prompt logprobs are scheduled with no drafts (`k = 0`), so they run
//! exactly as without speculation. While any sequence may get drafts the engine does not overlap steps
//! (async scheduling): proposing needs the previous step's tokens.
//!
//! Counters (vLLM's): drafts (sequence-steps verified with at least one draft), draft tokens,
//! accepted tokens, and accepted tokens per draft position, in [`crate::Stats`].

mod draft_head;
mod draft_length;
mod suffix;

use std::path::PathBuf;

pub use self::draft_head::DraftHead;
pub use self::draft_length::{load_cap, Acceptance, DRAFT_ROWS};
pub use self::suffix::{SuffixProposer, MAX_CACHED_TOKENS};
use crate::sequence::Sequence;

/// Where draft tokens come from (vLLM's `"method"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpeculativeMethod {
    /// Prompt lookup: the continuation of an earlier occurrence of the newest n-gram.
    Ngram,
    /// Suffix decoding: the most frequent continuation of the longest match of the newest
    /// tokens in the sequence and in earlier requests' outputs ([`SuffixProposer`]).
    Suffix,
    /// An EAGLE-3 draft head (a separate model directory, `"model"`), run on the target's
    /// hidden states ([`DraftHead`]).
    Eagle3,
    /// The MTP layers the target's own checkpoint ships (MiMo's `model.mtp_layers.N.*`), run
    /// on its last hidden states ([`DraftHead`]); `model` is the target's directory.
    Mtp,
}

impl SpeculativeMethod {
    /// vLLM's name of the method.
    pub fn as_str(&self) -> &'static str {
        match self {
            SpeculativeMethod::Ngram => "ngram",
            SpeculativeMethod::Suffix => "suffix",
            SpeculativeMethod::Eagle3 => "eagle3",
            SpeculativeMethod::Mtp => "mtp",
        }
    }
}

/// The methods `from_json` knows, for its error messages.
const METHODS: &str = "ngram, suffix, eagle3, mtp";

/// vLLM's `--speculative-config`, the part this engine honours. The n-gram fields apply to
/// `ngram`, the `suffix_decoding_*` fields to `suffix` (with vLLM's names and defaults),
/// `model` to `eagle3` and `mtp`.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeculativeConfig {
    pub method: SpeculativeMethod,
    /// The draft head's directory (`eagle3`), or the target's whose MTP layers draft (`mtp`:
    /// optional in the JSON, as in vLLM; the server fills in the model it serves).
    pub model: Option<PathBuf>,
    /// Most draft tokens per sequence and step (`k`).
    pub num_speculative_tokens: usize,
    /// Shortest n-gram looked up.
    pub prompt_lookup_min: usize,
    /// Longest n-gram looked up.
    pub prompt_lookup_max: usize,
    /// Longest match plus draft (vLLM's default 24).
    pub suffix_decoding_max_tree_depth: usize,
    /// Finished requests whose outputs are kept for lookup (vLLM's default 10000; 0: none).
    pub suffix_decoding_max_cached_requests: usize,
    /// A draft is at most this times its match's length (vLLM's default 1.0).
    pub suffix_decoding_max_spec_factor: f32,
    /// A draft stops before its estimated probability falls under this (vLLM's default 0.1).
    pub suffix_decoding_min_token_prob: f32,
    /// An EAGLE-3 head runs on the target's backend where the runner can hold its weights
    /// (`ModelRunner::load_draft_head`); false: on the host in f32, whatever the backend.
    /// Not a vLLM field: the library's choice only.
    pub head_on_device: bool,
}

impl SpeculativeConfig {
    /// N-gram prompt lookup with `k` drafts, looking up n-grams of 1 to 4 tokens.
    pub fn ngram(k: usize) -> Self {
        SpeculativeConfig {
            method: SpeculativeMethod::Ngram,
            model: None,
            num_speculative_tokens: k,
            prompt_lookup_min: 1,
            prompt_lookup_max: 4,
            suffix_decoding_max_tree_depth: 24,
            suffix_decoding_max_cached_requests: 10000,
            suffix_decoding_max_spec_factor: 1.0,
            suffix_decoding_min_token_prob: 0.1,
            head_on_device: true,
        }
    }

    /// Suffix decoding with at most `k` drafts and vLLM's defaults otherwise.
    pub fn suffix(k: usize) -> Self {
        SpeculativeConfig { method: SpeculativeMethod::Suffix, ..Self::ngram(k) }
    }

    /// An EAGLE-3 head in `dir` proposing `k` drafts.
    pub fn eagle3(dir: impl Into<PathBuf>, k: usize) -> Self {
        SpeculativeConfig { method: SpeculativeMethod::Eagle3, model: Some(dir.into()), ..Self::ngram(k) }
    }

    /// The MTP layers of the model in `dir` (the target's own directory) proposing `k` drafts.
    pub fn mtp(dir: impl Into<PathBuf>, k: usize) -> Self {
        SpeculativeConfig { method: SpeculativeMethod::Mtp, model: Some(dir.into()), ..Self::ngram(k) }
    }

    /// The config with `model` set to `target` (the served model's directory) where the method
    /// reads the target's own layers and no model was named (vLLM's default for `mtp`).
    pub fn for_target(mut self, target: &std::path::Path) -> Self {
        if self.method == SpeculativeMethod::Mtp && self.model.is_none() {
            self.model = Some(target.to_path_buf());
        }
        self
    }

    /// vLLM's `--speculative-config` JSON object. `method` is required, and
    /// `num_speculative_tokens` too for `ngram` and `eagle3`, `model` for `eagle3` (for `suffix` it defaults, as in vLLM, to
    /// `suffix_decoding_max_tree_depth`); an n-gram length left out takes the other's value,
    /// both left out take vLLM's 5. A method this engine does not have, any other field, or a
    /// field of the other method is refused by name.
    pub fn from_json(json: &str) -> Result<Self, String> {
        let v: serde_json::Value =
            serde_json::from_str(json).map_err(|e| format!("speculative config: not JSON: {e}"))?;
        let obj = v.as_object().ok_or("speculative config: expected a JSON object")?;
        let count = |field: &str| -> Result<Option<usize>, String> {
            match obj.get(field) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => x
                    .as_u64()
                    .map(|n| Some(n as usize))
                    .ok_or_else(|| format!("speculative config: {field} must be a non-negative integer, got {x}")),
            }
        };
        let number = |field: &str| -> Result<Option<f32>, String> {
            match obj.get(field) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => x
                    .as_f64()
                    .map(|n| Some(n as f32))
                    .ok_or_else(|| format!("speculative config: {field} must be a number, got {x}")),
            }
        };
        let method = match obj.get("method").map(|m| m.as_str()) {
            Some(Some("ngram")) => SpeculativeMethod::Ngram,
            Some(Some("suffix")) => SpeculativeMethod::Suffix,
            Some(Some("eagle3")) => SpeculativeMethod::Eagle3,
            Some(Some("mtp")) => SpeculativeMethod::Mtp,
            Some(Some(other)) => {
                return Err(format!("speculative config: method `{other}` is not supported (supported: {METHODS})"))
            }
            Some(None) => return Err("speculative config: method must be a string".into()),
            None => return Err(format!("speculative config: method is required (supported: {METHODS})")),
        };
        let ngram_fields = ["prompt_lookup_min", "prompt_lookup_max"];
        let suffix_fields = [
            "suffix_decoding_max_tree_depth",
            "suffix_decoding_max_cached_requests",
            "suffix_decoding_max_spec_factor",
            "suffix_decoding_min_token_prob",
        ];
        let head_fields = ["model"];
        let ngram_other = [&suffix_fields[..], &head_fields].concat();
        let suffix_other = [&ngram_fields[..], &head_fields].concat();
        let head_other = [&ngram_fields[..], &suffix_fields].concat();
        for field in obj.keys().map(String::as_str) {
            let (own, other) = match method {
                SpeculativeMethod::Ngram => (&ngram_fields[..], &ngram_other[..]),
                SpeculativeMethod::Suffix => (&suffix_fields[..], &suffix_other[..]),
                SpeculativeMethod::Eagle3 | SpeculativeMethod::Mtp => (&head_fields[..], &head_other[..]),
            };
            if other.contains(&field) {
                return Err(format!(
                    "speculative config: field `{field}` does not apply to method {}",
                    method.as_str()
                ));
            }
            if !own.contains(&field) && !["method", "num_speculative_tokens"].contains(&field) {
                return Err(format!("speculative config: field `{field}` is not supported"));
            }
        }
        let mut cfg = SpeculativeConfig { method, ..Self::ngram(0) };
        match method {
            SpeculativeMethod::Eagle3 => {
                cfg.num_speculative_tokens =
                    count("num_speculative_tokens")?.ok_or("speculative config: num_speculative_tokens is required")?;
                cfg.model = match obj.get("model") {
                    Some(serde_json::Value::String(m)) if !m.is_empty() => Some(PathBuf::from(m)),
                    Some(x) => return Err(format!("speculative config: model must be a directory name, got {x}")),
                    None => {
                        return Err(
                            "speculative config: model (the draft head's directory) is required for eagle3".into()
                        )
                    }
                };
            }
            SpeculativeMethod::Mtp => {
                cfg.num_speculative_tokens =
                    count("num_speculative_tokens")?.ok_or("speculative config: num_speculative_tokens is required")?;
                cfg.model = match obj.get("model") {
                    Some(serde_json::Value::String(m)) if !m.is_empty() => Some(PathBuf::from(m)),
                    None | Some(serde_json::Value::Null) => None,
                    Some(x) => return Err(format!("speculative config: model must be a directory name, got {x}")),
                };
            }
            SpeculativeMethod::Ngram => {
                cfg.num_speculative_tokens =
                    count("num_speculative_tokens")?.ok_or("speculative config: num_speculative_tokens is required")?;
                (cfg.prompt_lookup_min, cfg.prompt_lookup_max) =
                    match (count("prompt_lookup_min")?, count("prompt_lookup_max")?) {
                        (None, None) => (5, 5),
                        (Some(n), None) | (None, Some(n)) => (n, n),
                        (Some(a), Some(b)) => (a, b),
                    };
            }
            SpeculativeMethod::Suffix => {
                let c = &mut cfg;
                c.suffix_decoding_max_tree_depth =
                    count("suffix_decoding_max_tree_depth")?.unwrap_or(c.suffix_decoding_max_tree_depth);
                c.suffix_decoding_max_cached_requests =
                    count("suffix_decoding_max_cached_requests")?.unwrap_or(c.suffix_decoding_max_cached_requests);
                c.suffix_decoding_max_spec_factor =
                    number("suffix_decoding_max_spec_factor")?.unwrap_or(c.suffix_decoding_max_spec_factor);
                c.suffix_decoding_min_token_prob =
                    number("suffix_decoding_min_token_prob")?.unwrap_or(c.suffix_decoding_min_token_prob);
                c.num_speculative_tokens = count("num_speculative_tokens")?.unwrap_or(c.suffix_decoding_max_tree_depth);
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the settings; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.suffix_decoding_max_tree_depth == 0 {
            return Err("speculative config: suffix_decoding_max_tree_depth must be positive".into());
        }
        let factor = self.suffix_decoding_max_spec_factor;
        if !(factor.is_finite() && factor >= 0.0) {
            return Err(format!("speculative config: suffix_decoding_max_spec_factor ({factor}) must be >= 0"));
        }
        let p = self.suffix_decoding_min_token_prob;
        if !(0.0..=1.0).contains(&p) {
            return Err(format!("speculative config: suffix_decoding_min_token_prob ({p}) must be in [0, 1]"));
        }
        if self.method == SpeculativeMethod::Eagle3 && self.model.is_none() {
            return Err("speculative config: model (the draft head's directory) is required for eagle3".into());
        }
        if self.num_speculative_tokens == 0 {
            return Err("speculative config: num_speculative_tokens must be positive".into());
        }
        if self.prompt_lookup_min == 0 {
            return Err("speculative config: prompt_lookup_min must be positive".into());
        }
        if self.prompt_lookup_max < self.prompt_lookup_min {
            return Err(format!(
                "speculative config: prompt_lookup_max ({}) must be >= prompt_lookup_min ({})",
                self.prompt_lookup_max, self.prompt_lookup_min
            ));
        }
        Ok(())
    }

    /// The proposer this config describes, when its drafts come from the tokens alone (None:
    /// a draft head, which the engine runs on the target's hidden states).
    pub fn proposer(&self) -> Option<Box<dyn DraftProposer>> {
        Some(match self.method {
            SpeculativeMethod::Ngram => {
                Box::new(NgramProposer { min: self.prompt_lookup_min, max: self.prompt_lookup_max })
            }
            SpeculativeMethod::Eagle3 | SpeculativeMethod::Mtp => return None,
            SpeculativeMethod::Suffix => Box::new(SuffixProposer::new(
                self.suffix_decoding_max_tree_depth,
                self.suffix_decoding_max_spec_factor,
                self.suffix_decoding_min_token_prob,
                self.suffix_decoding_max_cached_requests,
            )),
        })
    }
}

/// Proposes draft tokens for a sequence from its committed tokens (prompt then output).
pub trait DraftProposer: Send {
    /// At most `k` tokens likely to follow `tokens`; fewer or none when it has no guess.
    fn propose(&self, tokens: &[u32], k: usize) -> Vec<u32>;

    /// A finished sequence's output (every committed output token), for proposers that learn
    /// from earlier requests; the default keeps nothing.
    fn record_output(&mut self, _output: &[u32]) {}
}

/// Prompt lookup (vLLM's `ngram`): the longest suffix of the tokens, of length in
/// `[min, max]`, that also occurs earlier; the tokens that followed its latest earlier
/// occurrence are the drafts.
#[derive(Debug, Clone, Copy)]
pub struct NgramProposer {
    pub min: usize,
    pub max: usize,
}

impl DraftProposer for NgramProposer {
    fn propose(&self, tokens: &[u32], k: usize) -> Vec<u32> {
        let len = tokens.len();
        if k == 0 || self.min == 0 {
            return Vec::new();
        }
        for n in (self.min..=self.max.min(len.saturating_sub(1))).rev() {
            let suffix = &tokens[len - n..];
            // Latest earlier occurrence that has at least one token after it (a start before
            // `len - n`; the suffix itself is excluded).
            if let Some(start) = (0..len - n).rev().find(|&s| &tokens[s..s + n] == suffix) {
                let from = start + n;
                return tokens[from..(from + k).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

/// Whether a sequence may carry drafts: anything but prompt logprobs (see the module docs);
/// greedy or sampled, with logprobs, penalties, bans and `logit_bias`, structured output
/// (drafts cut where its constraint rejects one), any `n` (each completion drafts on its own).
pub fn drafts_allowed(seq: &Sequence) -> bool {
    seq.params.prompt_logprobs.is_none()
}

/// How many leading drafts the target's ids confirm (`ids[i]`: the target's token after the
/// committed tokens and drafts `0..i`, drawn from its processed distribution with the
/// request's key for that output token). For a sampled request this is rejection sampling of
/// point-mass drafts (the module docs have the argument); for a greedy one, exact match.
pub fn accepted_len(drafts: &[u32], ids: &[u32]) -> usize {
    drafts.iter().zip(ids).take_while(|(d, t)| d == t).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn ngram(min: usize, max: usize) -> NgramProposer {
        NgramProposer { min, max }
    }

    #[test]
    fn proposes_what_followed_the_longest_matching_suffix() {
        // Suffix [2, 3] occurred at 1..3, followed by 4, 5, 6.
        let t = [1, 2, 3, 4, 5, 6, 9, 2, 3];
        assert_eq!(ngram(1, 3).propose(&t, 3), vec![4, 5, 6]);
        assert_eq!(ngram(1, 3).propose(&t, 2), vec![4, 5]);
    }

    #[test]
    fn prefers_the_longer_ngram_and_the_latest_occurrence() {
        // 1-gram [3] latest earlier at 5 (followed by 8); 2-gram [2, 3] at 1 (followed by 4).
        let t = [1, 2, 3, 4, 0, 3, 8, 2, 3];
        assert_eq!(ngram(1, 2).propose(&t, 1), vec![4]);
        assert_eq!(ngram(1, 1).propose(&t, 1), vec![8]);
    }

    #[test]
    fn proposes_nothing_without_a_match_of_min_length() {
        assert!(ngram(1, 3).propose(&[1, 2, 3, 4], 3).is_empty());
        assert!(ngram(3, 3).propose(&[1, 2, 9, 1, 2], 3).is_empty());
        assert!(ngram(1, 3).propose(&[], 3).is_empty());
        assert!(ngram(1, 3).propose(&[5, 5], 0).is_empty());
    }

    #[test]
    fn drafts_stop_at_the_end_of_the_tokens() {
        // A repeated token: the drafts run up to the end of what is known.
        assert_eq!(ngram(1, 2).propose(&[7, 7, 7], 5), vec![7]);
        assert_eq!(ngram(1, 1).propose(&[7, 7, 7], 5), vec![7]);
        assert_eq!(ngram(1, 1).propose(&[4, 7, 1, 2, 7], 5), vec![1, 2, 7]);
    }

    #[test]
    fn acceptance_is_the_matching_prefix() {
        assert_eq!(accepted_len(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(accepted_len(&[1, 2, 3], &[1, 2, 3, 5]), 3);
        assert_eq!(accepted_len(&[1, 2, 3], &[9, 2, 3, 5]), 0);
        assert_eq!(accepted_len(&[], &[9]), 0);
    }

    #[test]
    fn vllm_json_is_read_and_what_is_not_honoured_is_refused_by_name() {
        let c = SpeculativeConfig::from_json(r#"{"method": "ngram", "num_speculative_tokens": 3}"#).unwrap();
        assert_eq!((c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max), (3, 5, 5));
        let c = SpeculativeConfig::from_json(
            r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 6}"#,
        )
        .unwrap();
        assert_eq!((c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max), (4, 2, 6));
        let c =
            SpeculativeConfig::from_json(r#"{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}"#)
                .unwrap();
        assert_eq!((c.prompt_lookup_min, c.prompt_lookup_max), (3, 3));
        for (json, names) in [
            (r#"{"method": "eagle3", "num_speculative_tokens": 3}"#, "model"),
            (r#"{"method": "eagle3", "model": "d"}"#, "num_speculative_tokens"),
            (r#"{"method": "eagle3", "model": 3, "num_speculative_tokens": 3}"#, "model"),
            (
                r#"{"method": "eagle3", "model": "d", "num_speculative_tokens": 3, "prompt_lookup_min": 2}"#,
                "prompt_lookup_min",
            ),
            (r#"{"method": "eagle", "num_speculative_tokens": 3}"#, "eagle"),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 3, "suffix_decoding_max_tree_depth": 8}"#,
                "suffix_decoding_max_tree_depth",
            ),
            (r#"{"method": "suffix", "prompt_lookup_max": 3}"#, "prompt_lookup_max"),
            (r#"{"method": "suffix", "suffix_decoding_max_tree_depth": 0}"#, "suffix_decoding_max_tree_depth"),
            (r#"{"method": "suffix", "suffix_decoding_min_token_prob": 1.5}"#, "suffix_decoding_min_token_prob"),
            (r#"{"method": "suffix", "suffix_decoding_max_spec_factor": -1}"#, "suffix_decoding_max_spec_factor"),
            (r#"{"method": "suffix", "suffix_decoding_max_spec_factor": "x"}"#, "suffix_decoding_max_spec_factor"),
            (
                r#"{"method": "suffix", "suffix_decoding_max_cached_requests": -1}"#,
                "suffix_decoding_max_cached_requests",
            ),
            (r#"{"method": "ngram", "num_speculative_tokens": 3, "model": "x"}"#, "model"),
            (r#"{"method": "ngram"}"#, "num_speculative_tokens"),
            (r#"{"num_speculative_tokens": 3}"#, "method"),
            (r#"{"method": "ngram", "num_speculative_tokens": -1}"#, "num_speculative_tokens"),
            (r#"{"method": "ngram", "num_speculative_tokens": 0}"#, "num_speculative_tokens"),
            (r#"[1]"#, "object"),
        ] {
            let e = SpeculativeConfig::from_json(json).unwrap_err();
            assert!(e.contains(names), "{json}: {e}");
        }
    }

    #[test]
    fn vllm_eagle3_json_names_the_head() {
        let c =
            SpeculativeConfig::from_json(r#"{"method": "eagle3", "model": "heads/e3", "num_speculative_tokens": 3}"#)
                .unwrap();
        assert_eq!(c, SpeculativeConfig::eagle3("heads/e3", 3));
        assert!(c.proposer().is_none(), "the engine runs a head, not a token proposer");
    }

    #[test]
    fn vllm_mtp_json_takes_the_target_as_its_model() {
        let c = SpeculativeConfig::from_json(r#"{"method": "mtp", "num_speculative_tokens": 2}"#).unwrap();
        assert_eq!((c.method, c.model, c.num_speculative_tokens), (SpeculativeMethod::Mtp, None, 2));
        let c =
            SpeculativeConfig::from_json(r#"{"method": "mtp", "model": "m", "num_speculative_tokens": 1}"#).unwrap();
        assert_eq!(c, SpeculativeConfig::mtp("m", 1));
        assert!(c.proposer().is_none(), "the engine runs the MTP layer, not a token proposer");
        let c = SpeculativeConfig::from_json(r#"{"method": "mtp", "num_speculative_tokens": 2}"#).unwrap();
        assert_eq!(c.for_target(Path::new("served")), SpeculativeConfig::mtp("served", 2));
        let named = SpeculativeConfig::mtp("m", 1).for_target(Path::new("served"));
        assert_eq!(named.model.as_deref(), Some(Path::new("m")), "a named model is kept");
        let e = SpeculativeConfig::eagle3("h", 1);
        assert_eq!(e.clone().for_target(Path::new("served")), e, "only mtp reads the target");
        for (json, names) in [
            (r#"{"method": "mtp"}"#, "num_speculative_tokens"),
            (r#"{"method": "mtp", "num_speculative_tokens": 2, "prompt_lookup_max": 3}"#, "prompt_lookup_max"),
            (r#"{"method": "mtp", "num_speculative_tokens": 2, "model": 5}"#, "model"),
        ] {
            let e = SpeculativeConfig::from_json(json).unwrap_err();
            assert!(e.contains(names), "{json}: {e}");
        }
    }

    #[test]
    fn vllm_suffix_json_takes_vllms_defaults() {
        let c = SpeculativeConfig::from_json(r#"{"method": "suffix"}"#).unwrap();
        assert_eq!(c, SpeculativeConfig::suffix(24), "num_speculative_tokens defaults to the tree depth");
        let c = SpeculativeConfig::from_json(
            r#"{"method": "suffix", "num_speculative_tokens": 6, "suffix_decoding_max_tree_depth": 16,
                "suffix_decoding_max_cached_requests": 0, "suffix_decoding_max_spec_factor": 2,
                "suffix_decoding_min_token_prob": 0.25}"#,
        )
        .unwrap();
        assert_eq!(c.method, SpeculativeMethod::Suffix);
        assert_eq!((c.num_speculative_tokens, c.suffix_decoding_max_tree_depth), (6, 16));
        assert_eq!(c.suffix_decoding_max_cached_requests, 0);
        assert_eq!((c.suffix_decoding_max_spec_factor, c.suffix_decoding_min_token_prob), (2.0, 0.25));
        let c = SpeculativeConfig::from_json(r#"{"method": "suffix", "suffix_decoding_max_tree_depth": 7}"#).unwrap();
        assert_eq!(c.num_speculative_tokens, 7);
    }

    #[test]
    fn validation_names_the_field() {
        assert!(SpeculativeConfig::ngram(3).validate().is_ok());
        let e = SpeculativeConfig { num_speculative_tokens: 0, ..SpeculativeConfig::ngram(3) }.validate();
        assert!(e.unwrap_err().contains("num_speculative_tokens"));
        let e = SpeculativeConfig { prompt_lookup_min: 5, ..SpeculativeConfig::ngram(3) }.validate();
        assert!(e.unwrap_err().contains("prompt_lookup_max"));
    }
}
