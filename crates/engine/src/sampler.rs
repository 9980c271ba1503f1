//! Turns one row of logits into one token: penalties and bans here, then
//! `tandem_core::sampling::sample_row` (greedy, or temperature with top-k / min-p / top-p and
//! one Philox draw keyed by (seed, completion, token index), the function the device kernels
//! compute too). Also the top-N logprobs of the raw logits (vLLM's default).
//!
//! Penalties, `logit_bias` and bans are per-token edits ([`penalty_edits`]), which the host
//! applies ([`apply_penalties`]) and a device applies where the logits are
//! (`Backend::sample_masked` with `RowMasks` edits), with the same bits.
//!
//! Which rows the model may sample where the logits are ([`needs_host`]): all but those with
//! edits under a constraint (prompt logprobs need every position's logits: the engine checks
//! those); logprobs come back with the ids ([`tandem_core::sampling::logprobs_row`]). The engine decides per step: one such row sends the whole step's
//! logits to the host, where the same functions give the same ids.

use std::collections::BTreeMap;

use tandem_core::sampling::LogitEdit;

use crate::sampling_params::SamplingParams;

pub use tandem_core::sampling::TokenLogprobs;

/// `log_softmax(logits)[token]` and the top `n`, from the raw logits:
/// [`tandem_core::sampling::logprobs_row`], which a device computes too.
pub fn logprobs(logits: &[f32], token: u32, n: usize) -> TokenLogprobs {
    tandem_core::sampling::logprobs_row(logits, token, n)
}

/// vLLM's rank of `token` in a row of logits: how many tokens are at least as likely (itself
/// included), so the most likely is 1; NaN logits never count.
pub fn rank(logits: &[f32], token: u32) -> u32 {
    let Some(&x) = logits.get(token as usize) else { return 0 };
    logits.iter().filter(|&&y| y >= x).count() as u32
}

/// Whether the row's logits are edited before sampling: a penalty, `logit_bias` or a ban.
pub fn has_edits(p: &SamplingParams, banned: &[u32]) -> bool {
    p.repetition_penalty != 1.0
        || p.presence_penalty != 0.0
        || p.frequency_penalty != 0.0
        || !p.logit_bias.is_empty()
        || !banned.is_empty()
}

/// The row's penalties, `logit_bias` and bans as one [`LogitEdit`] per token (ascending), in
/// vLLM's order and formulas: the repetition penalty on every token of the prompt and the
/// output, `frequency_penalty * count + presence_penalty` subtracted for each output token,
/// the bias added (a token named twice in `logit_bias`: the last value, as in a JSON map),
/// then the bans. Tokens at or past `vocab` are left out.
pub fn penalty_edits(
    p: &SamplingParams,
    prompt: &[u32],
    output: &[u32],
    banned: &[u32],
    vocab: usize,
) -> Vec<LogitEdit> {
    let mut edits: BTreeMap<u32, LogitEdit> = BTreeMap::new();
    let in_vocab = |t: &u32| (*t as usize) < vocab;
    fn at(edits: &mut BTreeMap<u32, LogitEdit>, t: u32) -> &mut LogitEdit {
        edits.entry(t).or_insert(LogitEdit { token: t, ..Default::default() })
    }
    if p.repetition_penalty != 1.0 {
        for &t in prompt.iter().chain(output).filter(|t| in_vocab(t)) {
            at(&mut edits, t).repetition = Some(p.repetition_penalty);
        }
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        let mut counts: BTreeMap<u32, u32> = BTreeMap::new();
        for &t in output.iter().filter(|t| in_vocab(t)) {
            *counts.entry(t).or_default() += 1;
        }
        for (t, c) in counts {
            at(&mut edits, t).subtract = Some(p.frequency_penalty * c as f32 + p.presence_penalty);
        }
    }
    for &(t, b) in p.logit_bias.iter().filter(|(t, _)| in_vocab(t)) {
        at(&mut edits, t).bias = Some(b);
    }
    for &t in banned.iter().filter(|t| in_vocab(t)) {
        at(&mut edits, t).ban = true;
    }
    edits.into_values().collect()
}

/// [`penalty_edits`] applied in place: what the device's `logit_edits` computes too.
pub fn apply_penalties(logits: &mut [f32], p: &SamplingParams, prompt: &[u32], output: &[u32], banned: &[u32]) {
    for e in penalty_edits(p, prompt, output, banned, logits.len()) {
        let x = &mut logits[e.token as usize];
        *x = e.apply(*x);
    }
}

pub use tandem_core::backend::argmax_row as argmax;
pub use tandem_core::sampling::SampleSpec;

/// The sampling spec of output token `token_index` of completion `completion` of a request
/// whose draws are keyed by `seed`.
pub fn spec(p: &SamplingParams, seed: u64, completion: usize, token_index: usize) -> SampleSpec {
    SampleSpec {
        temperature: p.temperature,
        top_k: u32::try_from(p.top_k).unwrap_or(u32::MAX),
        top_p: p.top_p,
        min_p: p.min_p,
        seed,
        completion: completion as u32,
        token_index: token_index as u32,
    }
}

/// Whether a row must be sampled on the host: the device samplers apply edits and a
/// constraint's mask and return logprobs (`ModelRunner::forward_sampled_logprobs`), but a row
/// with both edits and a constraint samples on the host, which can tell that a ban took every
/// token the constraint allows (an error for the request, not a token).
pub fn needs_host(p: &SamplingParams, banned: &[u32], guided: bool) -> bool {
    guided && has_edits(p, banned)
}

/// Picks the next token from (penalised) logits: [`tandem_core::sampling::sample_row`].
pub fn sample(logits: &[f32], s: &SampleSpec) -> u32 {
    tandem_core::sampling::sample_row(logits, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams::default();
        f(&mut p);
        p
    }

    #[test]
    fn greedy_takes_argmax_whatever_the_key() {
        let l = vec![0.1, 3.0, 2.0];
        for i in 0..20 {
            assert_eq!(sample(&l, &spec(&SamplingParams::greedy(1), 9, 0, i)), 1);
        }
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let l = vec![0.5, 1.0, 4.0, 3.9, -1.0];
        for i in 0..50 {
            assert_eq!(sample(&l, &spec(&params(|p| p.top_k = 1), 3, 0, i)), 2);
            assert_eq!(sample(&l, &spec(&params(|p| p.top_p = 0.01), 3, 0, i)), 2);
        }
    }

    #[test]
    fn temperature_sampling_follows_the_distribution() {
        // p = softmax([ln 1, ln 3]) = [0.25, 0.75]
        let l = vec![0.0f32, 3f32.ln()];
        let n = 20000;
        let ones = (0..n).filter(|&i| sample(&l, &spec(&SamplingParams::default(), 42, 0, i)) == 1).count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.02, "{frac}");
    }

    /// The draw is a function of (seed, completion, token index): a seed and index give one
    /// token however often it is asked; completions and seeds differ.
    #[test]
    fn the_draw_is_keyed_by_seed_completion_and_token() {
        let l: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let text = |seed: u64, c: usize| {
            (0..40).map(|i| sample(&l, &spec(&SamplingParams::default(), seed, c, i))).collect::<Vec<_>>()
        };
        assert_eq!(text(5, 0), text(5, 0));
        assert_ne!(text(5, 0), text(5, 1));
        assert_ne!(text(5, 0), text(6, 0));
    }

    /// Issue 15 finding 4: temperature 1e-38 or 1e-45 passes validation; the old sampler
    /// divided the logits by it first (inf, then inf - inf = NaN) and returned garbage.
    #[test]
    fn tiny_temperatures_give_the_greedy_token() {
        let l = vec![1.0f32, 5.0, -3.0, 4.9, 2.0];
        for t in [1e-45f32, 1e-38, 1e-20, 1e-6] {
            let p = params(|p| p.temperature = t);
            assert!(p.validate().is_ok());
            for i in 0..100 {
                assert_eq!(sample(&l, &spec(&p, 1, 0, i)), 1, "temperature {t:e}");
            }
        }
    }

    #[test]
    fn rows_with_edits_under_a_constraint_need_the_host() {
        assert!(!needs_host(&SamplingParams::default(), &[], false));
        assert!(!needs_host(
            &params(|p| {
                p.top_k = 5;
                p.top_p = 0.5;
                p.min_p = 0.1;
            }),
            &[],
            true
        ));
        assert!(!needs_host(&params(|p| p.logprobs = Some(0)), &[], true));
        for p in [
            params(|p| p.repetition_penalty = 1.1),
            params(|p| p.presence_penalty = 0.5),
            params(|p| p.frequency_penalty = -0.5),
            params(|p| p.logit_bias = vec![(3, 1.0)]),
        ] {
            assert!(has_edits(&p, &[]) && !needs_host(&p, &[], false) && needs_host(&p, &[], true), "{p:?}");
        }
        assert!(has_edits(&SamplingParams::default(), &[2]) && needs_host(&SamplingParams::default(), &[2], true));
        assert!(!has_edits(&SamplingParams::default(), &[]));
    }

    /// One edit a token, ascending, every stage merged into it; a token named twice in
    /// logit_bias takes the last value; tokens past the vocabulary are left out.
    #[test]
    fn penalty_edits_merge_per_token() {
        let p = params(|p| {
            p.repetition_penalty = 1.5;
            p.frequency_penalty = 0.5;
            p.presence_penalty = 0.25;
            p.logit_bias = vec![(4, 1.0), (9, 3.0), (4, -2.0)];
        });
        let e = penalty_edits(&p, &[7, 2, 7, 99], &[2, 2, 5], &[5, 100], 10);
        let tokens: Vec<u32> = e.iter().map(|e| e.token).collect();
        assert_eq!(tokens, vec![2, 4, 5, 7, 9]);
        assert_eq!(
            e[0],
            LogitEdit { token: 2, repetition: Some(1.5), subtract: Some(0.5 * 2.0 + 0.25), bias: None, ban: false }
        );
        assert_eq!(e[1], LogitEdit { token: 4, bias: Some(-2.0), ..Default::default() });
        assert_eq!(
            e[2],
            LogitEdit { token: 5, repetition: Some(1.5), subtract: Some(0.5 + 0.25), bias: None, ban: true }
        );
        assert_eq!(e[3].repetition, Some(1.5));
        assert!(penalty_edits(&SamplingParams::default(), &[1, 2], &[3], &[], 10).is_empty());
    }

    #[test]
    fn penalties_follow_vllm_formulas() {
        let mut l = vec![2.0, -2.0, 1.0, 1.0];
        let p = params(|p| {
            p.repetition_penalty = 2.0;
            p.frequency_penalty = 0.5;
            p.presence_penalty = 0.25;
        });
        apply_penalties(&mut l, &p, &[0, 1], &[2, 2], &[3]);
        assert_eq!(l[0], 1.0); // positive: divided
        assert_eq!(l[1], -4.0); // negative: multiplied
        assert_eq!(l[2], 0.5 - 2.0 * 0.5 - 0.25); // repetition, then frequency x2, then presence
        assert_eq!(l[3], f32::NEG_INFINITY); // banned
    }

    #[test]
    fn rank_counts_tokens_at_least_as_likely() {
        let row = [0.5, 2.0, f32::NAN, 2.0, -1.0];
        assert_eq!([0, 1, 3, 4].map(|t| rank(&row, t)), [3, 2, 2, 4]);
        assert_eq!(rank(&row, 9), 0, "outside the row");
    }

    #[test]
    fn logprobs_are_log_softmax_of_raw_logits() {
        let l = vec![1.0f32, 2.0, 3.0];
        let lp = logprobs(&l, 0, 2);
        let z = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        assert!((lp.logprob as f64 - (1.0 - z)).abs() < 1e-6);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![2, 1]);
        assert!((lp.top[0].1 as f64 - (3.0 - z)).abs() < 1e-6);
    }
}
