//! Turns one row of logits into one token: penalties, then greedy or temperature sampling with
//! top-k / top-p / min-p, from a per-sequence PRNG so a seed reproduces its text whatever else
//! is in the batch. Also the top-N logprobs of the raw logits (vLLM's default).

use std::collections::HashMap;

use crate::sampling_params::SamplingParams;

/// splitmix64: tiny, fast, and good enough to draw one uniform number per sampled token.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    /// The stream of completion `index` of a request seeded with `seed`.
    pub fn for_completion(seed: u64, index: usize) -> Self {
        let mut r = Rng(seed ^ (index as u64).wrapping_mul(0xA24B_AED4_963E_E407));
        r.next_u64(); // decorrelate neighbouring seeds
        r
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Log-probabilities of one generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// The `n` most likely tokens, best first.
    pub top: Vec<(u32, f32)>,
}

/// `log_softmax(logits)[token]` and the top `n`, from the raw logits.
pub fn logprobs(logits: &[f32], token: u32, n: usize) -> TokenLogprobs {
    let max = logits.iter().copied().filter(|x| !x.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().filter(|x| !x.is_nan()).map(|&x| ((x - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    let lp = |x: f32| (x as f64 - lse) as f32;
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n);
    if n > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let key = |i: &u32| logits[*i as usize];
        let by_desc = |a: &u32, b: &u32| key(b).total_cmp(&key(a)).then(a.cmp(b));
        if n < idx.len() {
            idx.select_nth_unstable_by(n, by_desc);
            idx.truncate(n);
        }
        idx.sort_unstable_by(by_desc);
        top = idx.into_iter().map(|i| (i, lp(logits[i as usize]))).collect();
    }
    TokenLogprobs { token, logprob: lp(logits[token as usize]), top }
}

/// Penalties, `logit_bias` and token bans, applied in place (vLLM's order and formulas).
pub fn apply_penalties(logits: &mut [f32], p: &SamplingParams, prompt: &[u32], output: &[u32], banned: &[u32]) {
    if p.repetition_penalty != 1.0 {
        let mut seen: Vec<u32> = prompt.iter().chain(output).copied().filter(|&t| (t as usize) < logits.len()).collect();
        seen.sort_unstable();
        seen.dedup();
        for t in seen {
            let x = &mut logits[t as usize];
            *x = if *x > 0.0 { *x / p.repetition_penalty } else { *x * p.repetition_penalty };
        }
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in output.iter().filter(|&&t| (t as usize) < logits.len()) {
            *counts.entry(t).or_default() += 1;
        }
        for (t, c) in counts {
            logits[t as usize] -= p.frequency_penalty * c as f32 + p.presence_penalty;
        }
    }
    for &(t, b) in &p.logit_bias {
        if let Some(x) = logits.get_mut(t as usize) {
            *x += b;
        }
    }
    for &t in banned {
        if let Some(x) = logits.get_mut(t as usize) {
            *x = f32::NEG_INFINITY;
        }
    }
}

pub use tandem_core::backend::argmax_row as argmax;

/// Picks the next token from penalised logits. Greedy when temperature is 0 (no draw from the
/// PRNG); otherwise exactly one draw, so a seeded stream advances one step per token.
pub fn sample(logits: &mut [f32], p: &SamplingParams, rng: &mut Rng) -> u32 {
    if p.is_greedy() {
        return argmax(logits);
    }
    let u = rng.next_f64();
    let inv_t = 1.0 / p.temperature;
    // [candidates] (id, scaled logit); NaN and -inf never win.
    let mut cand: Vec<(u32, f32)> =
        logits.iter().enumerate().filter(|(_, x)| x.is_finite()).map(|(i, &x)| (i as u32, x * inv_t)).collect();
    if cand.is_empty() {
        return argmax(logits);
    }
    let by_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if p.top_k > 0 && p.top_k < cand.len() {
        cand.select_nth_unstable_by(p.top_k, by_desc);
        cand.truncate(p.top_k);
    }
    let needs_order = p.top_p < 1.0 || p.min_p > 0.0 || p.top_k > 0;
    if needs_order {
        cand.sort_unstable_by(by_desc);
    }
    let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let mut probs: Vec<f64> = cand.iter().map(|c| ((c.1 - max) as f64).exp()).collect();
    let total: f64 = probs.iter().sum();
    let mut keep = probs.len();
    if p.min_p > 0.0 {
        // Sorted, so the best is first and the survivors are a prefix.
        let floor = p.min_p as f64 * probs[0];
        keep = probs.iter().take_while(|&&q| q >= floor).count().max(1);
    }
    if p.top_p < 1.0 {
        let mut cum = 0.0;
        let want = p.top_p as f64 * total;
        let mut k = 0;
        while k < keep {
            cum += probs[k];
            k += 1;
            if cum >= want {
                break;
            }
        }
        keep = k.max(1);
    }
    probs.truncate(keep);
    let kept: f64 = probs.iter().sum();
    let mut target = u * kept;
    for (i, q) in probs.iter().enumerate() {
        if target < *q {
            return cand[i].0;
        }
        target -= q;
    }
    cand[keep - 1].0 // rounding left a sliver past the end
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
    fn greedy_takes_argmax_without_drawing() {
        let mut rng = Rng::new(1);
        let before = rng.clone().next_u64();
        let mut l = vec![0.1, 3.0, 2.0];
        assert_eq!(sample(&mut l, &SamplingParams::greedy(1), &mut rng), 1);
        assert_eq!(rng.next_u64(), before);
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let l = vec![0.5, 1.0, 4.0, 3.9, -1.0];
        for s in 0..50 {
            let mut rng = Rng::new(s);
            assert_eq!(sample(&mut l.clone(), &params(|p| p.top_k = 1), &mut rng), 2);
            assert_eq!(sample(&mut l.clone(), &params(|p| p.top_p = 0.01), &mut rng), 2);
        }
    }

    #[test]
    fn min_p_and_top_k_restrict_the_support() {
        let l = vec![5.0, 4.9, 0.0, -3.0, 4.8];
        let mut seen = [0u32; 5];
        let mut rng = Rng::new(7);
        for _ in 0..2000 {
            seen[sample(&mut l.clone(), &params(|p| p.min_p = 0.5), &mut rng) as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0 && seen[4] > 0);
        assert_eq!((seen[2], seen[3]), (0, 0), "below min_p * p_max");
        let mut seen = [0u32; 5];
        for _ in 0..2000 {
            seen[sample(&mut l.clone(), &params(|p| p.top_k = 2), &mut rng) as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0);
        assert_eq!(seen[2] + seen[3] + seen[4], 0);
    }

    #[test]
    fn temperature_sampling_follows_the_distribution() {
        // p = softmax([ln 1, ln 3]) = [0.25, 0.75]
        let l = vec![0.0f32, 3f32.ln()];
        let mut rng = Rng::new(42);
        let n = 20000;
        let ones = (0..n).filter(|_| sample(&mut l.clone(), &SamplingParams::default(), &mut rng) == 1).count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.02, "{frac}");
    }

    #[test]
    fn same_seed_same_stream_and_completions_differ() {
        let draw = |r: &mut Rng| (0..8).map(|_| r.next_u64()).collect::<Vec<_>>();
        assert_eq!(draw(&mut Rng::for_completion(5, 0)), draw(&mut Rng::for_completion(5, 0)));
        assert_ne!(draw(&mut Rng::for_completion(5, 0)), draw(&mut Rng::for_completion(5, 1)));
        assert_ne!(draw(&mut Rng::for_completion(5, 0)), draw(&mut Rng::for_completion(6, 0)));
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
    fn logprobs_are_log_softmax_of_raw_logits() {
        let l = vec![1.0f32, 2.0, 3.0];
        let lp = logprobs(&l, 0, 2);
        let z = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        assert!((lp.logprob as f64 - (1.0 - z)).abs() < 1e-6);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![2, 1]);
        assert!((lp.top[0].1 as f64 - (3.0 - z)).abs() < 1e-6);
    }
}
