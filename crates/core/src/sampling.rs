//! Turning one row of logits into one token id, defined so that the host and a device kernel
//! (kernels/sampling.cu) compute the same id bit for bit: greedy, or temperature with top-k,
//! min-p and top-p, drawing one uniform number from Philox4x32-10.
//!
//! **The draw** is a pure function of (seed, completion index, token index): counter
//! `[token_index, completion, 0, 0]`, key `[seed_lo, seed_hi]`, the top 24 bits of the first
//! output word as a uniform in [0, 1). No stream state: a seed gives the same tokens whatever
//! shares the batch, after a preemption and recompute, and on every backend.
//!
//! **The arithmetic** is f32, in a fixed order a 256-thread block reproduces exactly: no
//! sort, no library `exp` (device and host `expf` differ in the last bits), no fused
//! multiply-add. Each row:
//! 1. `m` = the largest logit that is not NaN; not finite (all NaN / -inf, or +inf): argmax.
//! 2. `w_i = exp_f32((x_i - m) * inv_t)` with `inv_t = 1 / temperature`: the best token weighs
//!    1, nothing overflows at any accepted temperature, NaN logits weigh 0.
//! 3. top-k (by logit, ties at the k-th value kept, as vLLM's mask does), then min-p
//!    (`w_i >= min_p`, the best weighing 1), then top-p: the tokens whose logit is at least the
//!    largest threshold `tau` that keeps a mass of `top_p` times the mass left by the first two.
//!    Thresholds are found by bisection over the logits' order-preserving u32 keys (32 passes
//!    each), masses are sums in [`lanes`] order, so no sort is needed.
//! 4. The token: the kept weights laid out lane after lane (lane `t` holds indices `t, t + 256,
//!    ...`), the first whose running sum exceeds `u` times their total.
//!
//! Greedy below [`GREEDY_BELOW`]: see there.

use crate::backend::argmax_row;

/// Threads of the device kernel's block, and so the number of lanes the host sums in.
pub const SAMPLE_LANES: usize = 256;

/// Temperatures below this are greedy (vLLM's `_SAMPLING_EPS`, 1e-5). With the best logit
/// subtracted first every positive temperature is numerically safe, but below 1e-5 a token
/// keeps a nonzero f32 weight only if its logit is within 87 * 1e-5 ≈ 9e-4 of the best (the
/// weight `exp((x - m) / T)` is flushed to 0 under e^-87): that is inside the logits' own
/// numeric error (bf16 weights move logits by ~1e-2), so sampling there would only choose
/// among ties made of rounding noise. Greedy is what such a temperature asks for.
pub const GREEDY_BELOW: f32 = 1e-5;

/// How one logit row becomes a token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleSpec {
    /// Below [`GREEDY_BELOW`] (0 included): greedy, no draw.
    pub temperature: f32,
    /// 0: no limit.
    pub top_k: u32,
    /// In (0, 1]; 1: off.
    pub top_p: f32,
    /// In [0, 1]; 0: off.
    pub min_p: f32,
    pub seed: u64,
    /// Which completion of the request (its `n` index).
    pub completion: u32,
    /// Which output token of that completion (0 for the first).
    pub token_index: u32,
}

/// u32 words per row in the device's spec buffer ([`SampleSpec::to_words`]).
pub const SPEC_WORDS: usize = 8;

impl SampleSpec {
    pub fn greedy() -> Self {
        SampleSpec { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0, completion: 0, token_index: 0 }
    }

    pub fn is_greedy(&self) -> bool {
        // NaN is greedy too; validation refuses it before it gets here.
        self.temperature.is_nan() || self.temperature < GREEDY_BELOW
    }

    /// The f32 `1 / temperature`, or 0 for greedy: what the device kernel receives, so host
    /// and device scale by the same number.
    pub fn inv_temperature(&self) -> f32 {
        if self.is_greedy() {
            0.0
        } else {
            1.0 / self.temperature
        }
    }

    /// The uniform number this row draws.
    pub fn uniform(&self) -> f32 {
        uniform(self.seed, self.completion, self.token_index)
    }

    /// The row as kernels/sampling.cu reads it: `[inv_t, top_k, top_p, min_p, seed_lo,
    /// seed_hi, completion, token_index]` (floats as their bits; inv_t 0 means greedy).
    pub fn to_words(&self) -> [u32; SPEC_WORDS] {
        [
            self.inv_temperature().to_bits(),
            self.top_k,
            self.top_p.to_bits(),
            self.min_p.to_bits(),
            self.seed as u32,
            (self.seed >> 32) as u32,
            self.completion,
            self.token_index,
        ]
    }
}

const PHILOX_M: [u32; 2] = [0xD251_1F53, 0xCD9E_8D57];
const PHILOX_W: [u32; 2] = [0x9E37_79B9, 0xBB67_AE85];

/// Philox4x32 with `rounds` rounds (Salmon et al., SC'11): 10 is the standard strength.
pub fn philox4x32(ctr: [u32; 4], key: [u32; 2], rounds: u32) -> [u32; 4] {
    let (mut c, mut k) = (ctr, key);
    for r in 0..rounds {
        if r > 0 {
            k = [k[0].wrapping_add(PHILOX_W[0]), k[1].wrapping_add(PHILOX_W[1])];
        }
        let p0 = PHILOX_M[0] as u64 * c[0] as u64;
        let p1 = PHILOX_M[1] as u64 * c[2] as u64;
        c = [(p1 >> 32) as u32 ^ c[1] ^ k[0], p1 as u32, (p0 >> 32) as u32 ^ c[3] ^ k[1], p0 as u32];
    }
    c
}

/// Uniform in [0, 1) with 24 random bits, exact in f32, for token `token_index` of completion
/// `completion` of a request seeded with `seed`.
pub fn uniform(seed: u64, completion: u32, token_index: u32) -> f32 {
    let r = philox4x32([token_index, completion, 0, 0], [seed as u32, (seed >> 32) as u32], 10);
    (r[0] >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// `e^z` for z <= 0 in plain f32 operations (kernels/sampling.cu `smp_exp` is the same
/// sequence): round-to-nearest multiplies and adds, a Cody-Waite reduction by ln 2 and a
/// degree-6 Taylor polynomial on |r| <= ln2/2 (relative error ~2e-7). Under e^-87 it is 0.
pub fn exp_f32(z: f32) -> f32 {
    if z.is_nan() || z <= -87.0 {
        return 0.0;
    }
    // The constants as bits, written the same way in kernels/sampling.cu.
    let log2e = f32::from_bits(0x3fb8_aa3b);
    let ln2_hi = f32::from_bits(0x3f31_7200); // 0.693145751953125: k * ln2_hi is exact for |k| < 128
    let ln2_lo = f32::from_bits(0x35bf_be8e); // ln 2 - ln2_hi
    let c = [0x3ab6_0b61u32, 0x3c08_8889, 0x3d2a_aaab, 0x3e2a_aaab].map(f32::from_bits); // 1/720, 1/120, 1/24, 1/6
    let k = (z * log2e + 0.5).floor();
    let r = (z - k * ln2_hi) - k * ln2_lo;
    let mut p = c[0];
    p = p * r + c[1];
    p = p * r + c[2];
    p = p * r + c[3];
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    // k in [-126, 0] here: 2^k is a normal float built from its exponent bits.
    p * f32::from_bits(((k as i32 + 127) as u32) << 23)
}

/// ln x for x >= 1 (finite), in f32 operations a device repeats bit for bit: x = 2^e f with
/// f in [sqrt(1/2), sqrt 2), ln f = 2 atanh(z), z = (f - 1) / (f + 1), |z| <= 0.172, by its
/// series to z^11 (the next term is under 2^-34 relative), then e ln 2 in two parts (e * ln2_hi
/// exact). Within 2 ulp of ln x; the logprobs' lse.
pub fn ln_f32(x: f32) -> f32 {
    let bits = x.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 127;
    let mut f = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    if f > f32::from_bits(0x3fb5_04f3) {
        f *= 0.5;
        e += 1;
    }
    let z = (f - 1.0) / (f + 1.0);
    let z2 = z * z;
    let c = [0x3dba_2e8cu32, 0x3de3_8e39, 0x3e12_4925, 0x3e4c_cccd, 0x3eaa_aaab].map(f32::from_bits); // 1/11, 1/9, 1/7, 1/5, 1/3
    let mut p = c[0];
    p = p * z2 + c[1];
    p = p * z2 + c[2];
    p = p * z2 + c[3];
    p = p * z2 + c[4];
    p = p * z2 + 1.0;
    let ln_f = (z + z) * p;
    let ef = e as f32;
    (ln_f + ef * f32::from_bits(0x35bf_be8e)) + ef * f32::from_bits(0x3f31_7200)
}

/// Log-probabilities of one sampled token, from the raw logits (vLLM's default).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// The `n` most likely tokens, best first.
    pub top: Vec<(u32, f32)>,
}

/// Most top logprobs a row may ask for (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// `log_softmax(logits)[token]` and the `n` most likely tokens (larger logit first, the lower
/// index on ties; NaN logits left out), defined so that kernels/sampling.cu `logprobs` gives
/// the same bits: m = the largest logit that is not NaN; s = the sum of exp_f32(x - m) over
/// the others in [`lanes`] order; logprob(x) = (x - m) - ln_f32(s). A row with no finite
/// largest logit gives NaN logprobs.
pub fn logprobs_row(logits: &[f32], token: u32, n: usize) -> TokenLogprobs {
    let m = logits.iter().fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    let w: Vec<f32> = logits.iter().map(|&x| if x.is_nan() { 0.0 } else { exp_f32(x - m) }).collect();
    let ln_s = if m.is_finite() { ln_f32(lanes(&w, |_| true)) } else { f32::NAN };
    let lp = |x: f32| if m.is_finite() { (x - m) - ln_s } else { f32::NAN };
    let mut idx: Vec<u32> = (0..logits.len() as u32).filter(|&i| !logits[i as usize].is_nan()).collect();
    let by_desc = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    let n = n.min(idx.len());
    if n > 0 && n < idx.len() {
        idx.select_nth_unstable_by(n - 1, by_desc);
    }
    idx.truncate(n);
    idx.sort_unstable_by(by_desc);
    let top = idx.into_iter().map(|i| (i, lp(logits[i as usize]))).collect();
    TokenLogprobs { token, logprob: logits.get(token as usize).map_or(f32::NAN, |&x| lp(x)), top }
}

/// [`logprobs_row`] of each row of `logits` (`[rows, vocab]`) at its sampled id where
/// `top_n[r]` asks (at most [`MAX_TOP_LOGPROBS`]): the host's logprobs of a step.
pub fn logprobs_rows(logits: &[f32], vocab: usize, ids: &[u32], top_n: &[Option<usize>]) -> Vec<Option<TokenLogprobs>> {
    let vocab = vocab.max(1);
    top_n
        .iter()
        .enumerate()
        .map(|(r, n)| n.map(|n| logprobs_row(&logits[r * vocab..(r + 1) * vocab], ids[r], n.min(MAX_TOP_LOGPROBS))))
        .collect()
}

/// An order-preserving key: `a < b` as floats iff `key(a) < key(b)` (NaN excluded).
pub fn key(x: f32) -> u32 {
    let b = x.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// The sum of `w[i]` over the kept indices as the kernel forms it: lane `t` adds its indices
/// `t, t + 256, ...` in order, then lanes are added pairwise (128 apart, 64 apart, ..., 1).
pub fn lanes(w: &[f32], keep: impl Fn(usize) -> bool) -> f32 {
    let mut lane = lane_sums(w, keep);
    tree_sum(&mut lane)
}

fn lane_sums(w: &[f32], keep: impl Fn(usize) -> bool) -> [f32; SAMPLE_LANES] {
    let mut lane = [0.0f32; SAMPLE_LANES];
    for (i, &wi) in w.iter().enumerate() {
        if keep(i) {
            lane[i % SAMPLE_LANES] += wi;
        }
    }
    lane
}

fn tree_sum(lane: &mut [f32; SAMPLE_LANES]) -> f32 {
    let mut half = SAMPLE_LANES / 2;
    while half > 0 {
        for t in 0..half {
            lane[t] += lane[t + half];
        }
        half /= 2;
    }
    lane[0]
}

/// The largest key `tau` with `ok(tau)`, for `ok` true at 0 and monotone (true up to some key,
/// false above): bit by bit from the top, as the kernel does.
fn bisect_key(ok: impl Fn(u32) -> bool) -> u32 {
    let mut tau = 0u32;
    for b in (0..32).rev() {
        let c = tau | (1 << b);
        if ok(c) {
            tau = c;
        }
    }
    tau
}

/// Sets every logit the mask forbids to -inf (`mask`: one bit a token, token `t` at bit
/// `t % 32` of word `t / 32`; words missing forbid); returns how many tokens stay allowed. What
/// the device kernels read for a masked row.
pub fn apply_mask(logits: &mut [f32], mask: &[u32]) -> usize {
    let mut allowed = 0;
    for (t, x) in logits.iter_mut().enumerate() {
        if mask.get(t / 32).is_some_and(|w| w >> (t % 32) & 1 == 1) {
            allowed += 1;
        } else {
            *x = f32::NEG_INFINITY;
        }
    }
    allowed
}

/// One token's logit edited before sampling (penalties, `logit_bias`, a ban), in vLLM's
/// order: the repetition penalty (`x / r` where `x > 0`, else `x * r`), then `x - subtract`
/// (`frequency_penalty * count + presence_penalty`, formed by the caller), then `x + bias`,
/// then -inf where banned. Each step is one rounded f32 operation, so the device kernel
/// (kernels/sampling.cu `logit_edits`) gives the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LogitEdit {
    pub token: u32,
    pub repetition: Option<f32>,
    pub subtract: Option<f32>,
    pub bias: Option<f32>,
    pub ban: bool,
}

/// u32 words of one [`LogitEdit`] on a device: token, flags (bit 0 repetition, 1 subtract,
/// 2 bias, 3 ban), then the three values as f32 bits.
pub const EDIT_WORDS: usize = 5;

impl LogitEdit {
    pub fn apply(&self, mut x: f32) -> f32 {
        if let Some(r) = self.repetition {
            x = if x > 0.0 { x / r } else { x * r };
        }
        if let Some(d) = self.subtract {
            x -= d;
        }
        if let Some(b) = self.bias {
            x += b;
        }
        if self.ban {
            x = f32::NEG_INFINITY;
        }
        x
    }
    pub fn to_words(&self) -> [u32; EDIT_WORDS] {
        let flags = u32::from(self.repetition.is_some())
            | u32::from(self.subtract.is_some()) << 1
            | u32::from(self.bias.is_some()) << 2
            | u32::from(self.ban) << 3;
        let bits = |v: Option<f32>| v.unwrap_or(0.0).to_bits();
        [self.token, flags, bits(self.repetition), bits(self.subtract), bits(self.bias)]
    }
}

/// What the rows of a step are sampled through besides their specs: the allowed-token masks
/// of some rows (structured output), packed so that only the constrained rows' bits travel:
/// row `r`'s mask is `bits[index[r] * words..][..words]` when `index[r] >= 0` (rows at -1 are
/// not masked); and each row's [`LogitEdit`]s (`edits[r]`, at most one per token; `edits`
/// empty: none), applied before the mask.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowMasks {
    pub words: usize,
    pub index: Vec<i32>,
    pub bits: Vec<u32>,
    pub edits: Vec<Vec<LogitEdit>>,
}

impl RowMasks {
    /// No row masked.
    pub fn none(rows: usize, vocab: usize) -> Self {
        RowMasks { words: vocab.div_ceil(32), index: vec![-1; rows], bits: vec![], edits: vec![] }
    }
    /// Edits row `r`'s logits with `edits` (at most one per token) before sampling.
    pub fn set_edits(&mut self, r: usize, edits: Vec<LogitEdit>) {
        if self.edits.is_empty() {
            self.edits = vec![vec![]; self.index.len()];
        }
        self.edits[r] = edits;
    }
    /// Row `r`'s edits (empty: none).
    pub fn row_edits(&self, r: usize) -> &[LogitEdit] {
        self.edits.get(r).map_or(&[], Vec::as_slice)
    }
    pub fn has_edits(&self) -> bool {
        self.edits.iter().any(|e| !e.is_empty())
    }
    /// The edits packed for a device: row `r`'s [`EDIT_WORDS`]-word records are
    /// `words[start[r] * EDIT_WORDS..start[r + 1] * EDIT_WORDS]` (`start` has rows + 1 entries).
    pub fn edit_words(&self) -> (Vec<u32>, Vec<u32>) {
        let rows = self.index.len();
        let mut start = Vec::with_capacity(rows + 1);
        let mut words = Vec::new();
        start.push(0);
        for r in 0..rows {
            for e in self.row_edits(r) {
                words.extend_from_slice(&e.to_words());
            }
            start.push((words.len() / EDIT_WORDS) as u32);
        }
        (start, words)
    }
    /// Masks row `r` with `mask` (`words` words).
    pub fn set(&mut self, r: usize, mask: &[u32]) {
        debug_assert_eq!(mask.len(), self.words);
        self.index[r] = (self.bits.len() / self.words.max(1)) as i32;
        self.bits.extend_from_slice(mask);
    }
    /// Row `r`'s mask, if it has one.
    pub fn row(&self, r: usize) -> Option<&[u32]> {
        let i = usize::try_from(*self.index.get(r)?).ok()?;
        self.bits.get(i * self.words..(i + 1) * self.words)
    }
    /// Nothing masked and nothing edited: plain sampling.
    pub fn is_empty(&self) -> bool {
        self.bits.is_empty() && !self.has_edits()
    }
    /// Checks the packing against a step of `rows` rows of `vocab` logits.
    pub fn check(&self, rows: usize, vocab: usize) -> Result<(), String> {
        if self.index.len() != rows || self.words != vocab.div_ceil(32) {
            return Err(format!(
                "masks for {} rows of {} words, step has {rows} rows of vocabulary {vocab}",
                self.index.len(),
                self.words
            ));
        }
        let count = self.bits.len() / self.words.max(1);
        if let Some(i) = self.index.iter().find(|&&i| i >= count as i32 || i < -1) {
            return Err(format!("mask index {i} outside the {count} masks given"));
        }
        if !self.edits.is_empty() && self.edits.len() != rows {
            return Err(format!("edits for {} rows, step has {rows}", self.edits.len()));
        }
        for (r, edits) in self.edits.iter().enumerate() {
            let mut tokens: Vec<u32> = edits.iter().map(|e| e.token).collect();
            tokens.sort_unstable();
            if let Some(t) = tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(format!("row {r} edits token {t}, beyond the vocabulary of {vocab}"));
            }
            if let Some(w) = tokens.windows(2).find(|w| w[0] == w[1]) {
                return Err(format!("row {r} edits token {} twice", w[0]));
            }
        }
        Ok(())
    }
}

/// [`sample_row`] of each row of `logits` (`[rows, vocab]`), each row's edits applied first
/// and masked rows' forbidden tokens then at -inf: the host's answer for such a step.
pub fn sample_rows_masked(logits: &[f32], vocab: usize, specs: &[SampleSpec], masks: &RowMasks) -> Vec<u32> {
    let vocab = vocab.max(1);
    logits
        .chunks_exact(vocab)
        .zip(specs)
        .enumerate()
        .map(|(r, (row, s))| {
            let edits = masks.row_edits(r);
            match masks.row(r) {
                None if edits.is_empty() => sample_row(row, s),
                m => {
                    let mut row = row.to_vec();
                    for e in edits {
                        if let Some(x) = row.get_mut(e.token as usize) {
                            *x = e.apply(*x);
                        }
                    }
                    if let Some(m) = m {
                        apply_mask(&mut row, m);
                    }
                    sample_row(&row, s)
                }
            }
        })
        .collect()
}

/// The token for one row of logits (see the module docs for the exact definition).
pub fn sample_row(logits: &[f32], s: &SampleSpec) -> u32 {
    if s.is_greedy() || logits.is_empty() {
        return argmax_row(logits);
    }
    let m = logits.iter().fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    if !m.is_finite() {
        return argmax_row(logits);
    }
    let inv_t = s.inv_temperature();
    let w: Vec<f32> = logits.iter().map(|&x| if x.is_nan() { 0.0 } else { exp_f32((x - m) * inv_t) }).collect();
    let keys: Vec<u32> = logits.iter().map(|&x| key(x)).collect();
    let valid = |i: usize| !logits[i].is_nan();

    let valid_count = logits.iter().filter(|x| !x.is_nan()).count();
    let tau_k = if s.top_k > 0 && (s.top_k as usize) < valid_count {
        bisect_key(|c| (0..logits.len()).filter(|&i| valid(i) && keys[i] >= c).count() >= s.top_k as usize)
    } else {
        0
    };
    let min_p = s.min_p;
    let base = |i: usize| valid(i) && keys[i] >= tau_k && w[i] >= min_p;
    let tau_p = if s.top_p < 1.0 {
        let want = s.top_p * lanes(&w, base);
        bisect_key(|c| lanes(&w, |i| base(i) && keys[i] >= c) >= want)
    } else {
        0
    };
    let kept = |i: usize| base(i) && keys[i] >= tau_p;

    let lane = lane_sums(&w, kept);
    let mut incl = [0.0f32; SAMPLE_LANES];
    let mut acc = 0.0f32;
    for t in 0..SAMPLE_LANES {
        acc += lane[t];
        incl[t] = acc;
    }
    let target = s.uniform() * acc;
    let chosen = (0..SAMPLE_LANES).find(|&t| incl[t] > target);
    let lane_idx = |t: usize| (t..logits.len()).step_by(SAMPLE_LANES);
    let last_positive = |t: usize| lane_idx(t).rev().find(|&i| kept(i) && w[i] > 0.0);
    let Some(c) = chosen else {
        // Rounding put the target at the very end: the last kept token of the last lane.
        let t = (0..SAMPLE_LANES).rev().find(|&t| lane[t] > 0.0).unwrap_or(0);
        return last_positive(t).unwrap_or_else(|| argmax_row(logits) as usize) as u32;
    };
    let local_target = target - if c > 0 { incl[c - 1] } else { 0.0 };
    let mut local = 0.0f32;
    for i in lane_idx(c) {
        if kept(i) {
            local += w[i];
            if local > local_target {
                return i as u32;
            }
        }
    }
    last_positive(c).unwrap_or_else(|| argmax_row(logits) as usize) as u32
}

#[cfg(test)]
mod tests {
    /// Only the constrained rows' masks are packed; a masked row samples among its allowed
    /// tokens only; a bad packing is refused.
    #[test]
    fn row_masks_pack_only_the_masked_rows() {
        let vocab = 40;
        let mut m = RowMasks::none(3, vocab);
        let mut allow = vec![0u32; 2];
        allow[1] |= 1 << (37 - 32);
        m.set(1, &allow);
        assert_eq!((m.words, m.index.clone(), m.bits.len()), (2, vec![-1, 0, -1], 2));
        assert!(m.check(3, vocab).is_ok());
        assert!(m.check(2, vocab).is_err() && m.check(3, 64 + 1).is_err());
        let logits: Vec<f32> = (0..3 * vocab).map(|i| (i % vocab) as f32).collect();
        let specs = [SampleSpec::greedy(); 3];
        assert_eq!(sample_rows_masked(&logits, vocab, &specs, &m), vec![39, 37, 39]);
        let bad = RowMasks { words: 2, index: vec![0, 1, -1], bits: vec![0; 2], edits: vec![] };
        assert!(bad.check(3, vocab).is_err(), "index 1 of a single mask");
    }

    /// ln_f32 is within 2 ulp of ln over [1, 2^24], exact at 1; logprobs are log_softmax within
    /// f32 rounding, the top tokens by logit then index, NaN left out.
    #[test]
    fn ln_and_logprobs_follow_their_definitions() {
        assert_eq!(ln_f32(1.0), 0.0);
        let mut x = 1.0f32;
        while x < 16_777_216.0 {
            let want = (x as f64).ln();
            let got = ln_f32(x) as f64;
            let ulp = (want as f32).abs() * f32::EPSILON;
            assert!((got - want).abs() <= 2.0 * ulp as f64 + 1e-30, "ln {x}: {got} vs {want}");
            x = f32::from_bits(x.to_bits() + 7919);
        }
        let logits = [1.0f32, 3.0, f32::NAN, 3.0, -2.0, f32::NEG_INFINITY];
        let l = logprobs_row(&logits, 4, 3);
        let lse = (1f64.exp() + 2.0 * 3f64.exp() + (-2f64).exp()).ln();
        assert!((l.logprob as f64 - (-2.0 - lse)).abs() < 1e-6, "{l:?}");
        assert_eq!(l.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 0]);
        assert!((l.top[0].1 as f64 - (3.0 - lse)).abs() < 1e-6 && l.top[0].1 == l.top[1].1);
        assert_eq!(logprobs_row(&logits, 5, 0).logprob, f32::NEG_INFINITY);
        assert_eq!(logprobs_row(&logits, 0, 10).top.len(), 5, "NaN left out");
        assert!(logprobs_row(&[f32::NAN; 3], 0, 2).logprob.is_nan());
    }

    /// An edit is vLLM's order of one-rounding f32 steps; a row's edits apply before its mask;
    /// the device packing holds each row's records in order; bad edits are refused.
    #[test]
    fn logit_edits_apply_in_order_and_pack_per_row() {
        let rep = LogitEdit { token: 0, repetition: Some(2.0), ..Default::default() };
        assert_eq!((rep.apply(3.0), rep.apply(-3.0), rep.apply(0.0)), (1.5, -6.0, 0.0));
        let all = LogitEdit { token: 0, repetition: Some(1.5), subtract: Some(0.25), bias: Some(1.0), ban: false };
        assert_eq!(all.apply(3.0), 3.0 / 1.5 - 0.25 + 1.0);
        assert_eq!(LogitEdit { ban: true, ..all }.apply(3.0), f32::NEG_INFINITY);
        // No edit, not even + 0.0: a -0.0 logit keeps its sign.
        assert_eq!(LogitEdit::default().apply(-0.0).to_bits(), (-0.0f32).to_bits());
        let vocab = 40;
        let mut m = RowMasks::none(3, vocab);
        assert!(m.is_empty());
        // Row 0: the best token (39) banned; row 2: token 3 lifted above the rest.
        m.set_edits(0, vec![LogitEdit { token: 39, ban: true, ..Default::default() }]);
        m.set_edits(
            2,
            vec![
                LogitEdit { token: 3, bias: Some(100.0), ..Default::default() },
                LogitEdit { token: 38, subtract: Some(1.0), ..Default::default() },
            ],
        );
        assert!(!m.is_empty() && m.has_edits() && m.check(3, vocab).is_ok());
        let logits: Vec<f32> = (0..3 * vocab).map(|i| (i % vocab) as f32).collect();
        let specs = [SampleSpec::greedy(); 3];
        assert_eq!(sample_rows_masked(&logits, vocab, &specs, &m), vec![38, 39, 3]);
        // A mask applies after the edits: row 2 allowed only 38 and 39 loses token 3's lift.
        let mut allow = vec![0u32; 2];
        allow[1] |= 0b11 << (38 - 32);
        m.set(2, &allow);
        assert_eq!(sample_rows_masked(&logits, vocab, &specs, &m)[2], 39);
        let (start, words) = m.edit_words();
        assert_eq!(start, vec![0, 1, 1, 3]);
        assert_eq!(words.len(), 3 * EDIT_WORDS);
        assert_eq!(&words[..2], &[39, 0b1000]);
        assert_eq!(&words[5..10], &[3, 0b100, 0, 0, 100.0f32.to_bits()]);
        let mut twice = RowMasks::none(1, vocab);
        twice.set_edits(
            0,
            vec![LogitEdit { token: 5, ..Default::default() }, LogitEdit { token: 5, ban: true, ..Default::default() }],
        );
        assert!(twice.check(1, vocab).unwrap_err().contains("twice"));
        let mut beyond = RowMasks::none(1, vocab);
        beyond.set_edits(0, vec![LogitEdit { token: 40, ban: true, ..Default::default() }]);
        assert!(beyond.check(1, vocab).unwrap_err().contains("beyond"));
    }

    use super::*;

    /// Random123's published known answers for philox4x32 (its kat_vectors file).
    #[test]
    fn philox_matches_random123_known_answers() {
        let pi_ctr = [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344];
        let pi_key = [0xa409_3822, 0x299f_31d0];
        assert_eq!(philox4x32([0; 4], [0; 2], 10), [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
        assert_eq!(philox4x32([u32::MAX; 4], [u32::MAX; 2], 10), [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]);
        assert_eq!(philox4x32(pi_ctr, pi_key, 10), [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]);
        // The 7-round answers check the round count and the key schedule's placement.
        assert_eq!(philox4x32([0; 4], [0; 2], 7), [0x5f6f_b709, 0x0d89_3f64, 0x4f12_1f81, 0x4f73_0a48]);
        assert_eq!(philox4x32(pi_ctr, pi_key, 7), [0x4dfc_caba, 0x190a_87f0, 0xc473_62ba, 0xb6b5_242a]);
    }

    #[test]
    fn uniform_is_in_range_and_keyed_by_all_three() {
        let u = uniform(5, 0, 0);
        assert!((0.0..1.0).contains(&u));
        assert_eq!(u, uniform(5, 0, 0));
        assert_ne!(u, uniform(5, 0, 1));
        assert_ne!(u, uniform(5, 1, 0));
        assert_ne!(u, uniform(6, 0, 0));
        assert_ne!(u, uniform(5 | 1 << 32, 0, 0), "the seed's high word counts");
        let mean = (0..10_000).map(|i| uniform(1, 0, i) as f64).sum::<f64>() / 10_000.0;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
    }

    #[test]
    fn exp_f32_is_close_to_exp() {
        let mut worst = 0.0f64;
        for i in 0..87_000 {
            let z = -(i as f32) / 1000.0;
            let rel = ((exp_f32(z) as f64 - (z as f64).exp()) / (z as f64).exp()).abs();
            worst = worst.max(rel);
        }
        assert!(worst < 5e-7, "worst relative error {worst:e}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-88.0), 0.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn key_preserves_order() {
        let xs = [f32::NEG_INFINITY, -3.5, -1e-30, -0.0, 0.0, 1e-30, 2.0, f32::MAX, f32::INFINITY];
        for p in xs.windows(2) {
            assert!(key(p[0]) < key(p[1]), "{p:?}");
        }
    }

    fn spec(f: impl FnOnce(&mut SampleSpec)) -> SampleSpec {
        let mut s = SampleSpec { temperature: 1.0, ..SampleSpec::greedy() };
        f(&mut s);
        s
    }

    #[test]
    fn follows_the_distribution() {
        // softmax([0, ln 3, ln 2 - 10 ...]): 0.25 / 0.75 for the two; put them in different lanes.
        let mut l = vec![-1e3f32; 600];
        l[3] = 0.0;
        l[300] = 3f32.ln();
        let n = 20_000;
        let ones = (0..n).filter(|&i| sample_row(&l, &spec(|s| s.token_index = i)) == 300).count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.015, "{frac}");
    }

    #[test]
    fn top_k_min_p_top_p_restrict_the_support() {
        let l = [5.0f32, 4.9, 0.0, -3.0, 4.8];
        let count = |s: SampleSpec| {
            let mut seen = [0u32; 5];
            for i in 0..3000 {
                seen[sample_row(&l, &SampleSpec { token_index: i, ..s }) as usize] += 1;
            }
            seen
        };
        let seen = count(spec(|s| s.min_p = 0.5));
        assert!(seen[0] > 0 && seen[1] > 0 && seen[4] > 0 && seen[2] + seen[3] == 0, "{seen:?}");
        let seen = count(spec(|s| s.top_k = 2));
        assert!(seen[0] > 0 && seen[1] > 0 && seen[2] + seen[3] + seen[4] == 0, "{seen:?}");
        // Probabilities 0.37 (5.0), 0.33 (4.9), 0.30 (4.8), 0.002, ~0: 0.6 needs the two best.
        let seen = count(spec(|s| s.top_p = 0.6));
        assert!(seen[0] > 0 && seen[1] > 0 && seen[2] + seen[3] + seen[4] == 0, "{seen:?}");
        for s in [spec(|s| s.top_k = 1), spec(|s| s.top_p = 0.01)] {
            assert_eq!(count(s)[0], 3000);
        }
        // Ties at the k-th logit are kept (vLLM's mask).
        let tied = [1.0f32, 2.0, 2.0, 0.0];
        let picks: std::collections::BTreeSet<u32> = (0..200)
            .map(|i| {
                sample_row(
                    &tied,
                    &spec(|s| {
                        s.top_k = 1;
                        s.token_index = i;
                    }),
                )
            })
            .collect();
        assert_eq!(picks.into_iter().collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn nan_and_banned_tokens_never_win_and_degenerate_rows_are_greedy() {
        let l = [f32::NAN, 1.0, f32::NEG_INFINITY, 1.0, f32::NAN];
        for i in 0..500 {
            let t = sample_row(&l, &spec(|s| s.token_index = i));
            assert!(t == 1 || t == 3, "{t}");
        }
        let all_bad = [f32::NAN, f32::NEG_INFINITY];
        assert_eq!(sample_row(&all_bad, &spec(|_| {})), argmax_row(&all_bad));
        let inf = [1.0, f32::INFINITY, 2.0];
        assert_eq!(sample_row(&inf, &spec(|_| {})), 1);
    }

    /// The draw follows vLLM's renormalised distribution after min-p, top-k and top-p, at a
    /// fixed set of draws (token indices 0..N of one seed), so the test is deterministic and
    /// could fail: a chi-square over the kept tokens, with every removed token never drawn.
    /// Expected probabilities in f64 from the definitions (softmax(x / T); min-p: p >= min_p *
    /// p_max; top-k; top-p on the renormalised rest: a token stays when the mass strictly above
    /// it is under top_p), not from the sampler's own arithmetic.
    #[test]
    fn draws_follow_the_renormalised_distribution() {
        let logits = [2.0f32, -1.0, 0.5, 1.6, -3.0, 0.9, 1.2, -0.2, 0.0, 2.3, -6.0, 0.3];
        let cases = [
            (1.0f32, 0u32, 1.0f32, 0.0f32),
            (0.8, 6, 1.0, 0.0),
            (1.0, 0, 0.8, 0.0),
            (1.3, 0, 1.0, 0.1),
            (0.9, 8, 0.85, 0.05),
        ];
        let n = 40_000u32;
        for (temperature, top_k, top_p, min_p) in cases {
            let t = temperature as f64;
            let pmax = logits.iter().map(|&x| (x as f64 / t).exp()).fold(0.0, f64::max);
            let z: f64 = logits.iter().map(|&x| (x as f64 / t).exp()).sum();
            let p: Vec<f64> = logits.iter().map(|&x| (x as f64 / t).exp() / z).collect();
            let mut kept: Vec<bool> = p.iter().map(|&q| q * z >= min_p as f64 * pmax).collect();
            if top_k > 0 {
                for i in 0..logits.len() {
                    kept[i] &= logits.iter().filter(|&&y| y > logits[i]).count() < top_k as usize;
                }
            }
            let mass: f64 = (0..p.len()).filter(|&i| kept[i]).map(|i| p[i]).sum();
            let base = kept.clone();
            for i in 0..p.len() {
                let above: f64 = (0..p.len()).filter(|&j| base[j] && logits[j] > logits[i]).map(|j| p[j]).sum();
                kept[i] &= above < top_p as f64 * mass;
            }
            let total: f64 = (0..p.len()).filter(|&i| kept[i]).map(|i| p[i]).sum();
            let mut seen = vec![0u32; logits.len()];
            for i in 0..n {
                let s = SampleSpec { temperature, top_k, top_p, min_p, seed: 0x5eed, completion: 1, token_index: i };
                seen[sample_row(&logits, &s) as usize] += 1;
            }
            let mut chi2 = 0.0;
            let mut df = 0;
            for i in 0..logits.len() {
                if !kept[i] {
                    assert_eq!(seen[i], 0, "token {i} removed by {:?} but drawn", (temperature, top_k, top_p, min_p));
                    continue;
                }
                let e = n as f64 * p[i] / total;
                chi2 += (seen[i] as f64 - e).powi(2) / e;
                df += 1;
            }
            assert!(df >= 2, "{df} tokens kept: the case tests nothing");
            // The 1e-6 upper tail of chi-square with up to 11 degrees of freedom is below 50.
            assert!(
                chi2 < 50.0,
                "chi-square {chi2:.1} over {df} tokens for {:?}: {seen:?}",
                (temperature, top_k, top_p, min_p)
            );
        }
    }

    /// Issue 15 finding 4: temperatures of 1e-38 and 1e-45 are accepted; the old sampler
    /// scaled the logits first (overflow to inf, then inf - inf = NaN) and drew garbage.
    #[test]
    fn tiny_temperatures_are_safe_and_greedy() {
        let l = [1.0f32, 5.0, -3.0, 4.99, 2.0, -40.0];
        for t in [1e-45f32, 1e-38, 1e-30, 1e-10, 9.9e-6, 1e-5, 1e-4] {
            for i in 0..200 {
                assert_eq!(
                    sample_row(
                        &l,
                        &spec(|s| {
                            s.temperature = t;
                            s.token_index = i;
                        })
                    ),
                    1,
                    "temperature {t:e}"
                );
            }
        }
        assert!(spec(|s| s.temperature = 9.9e-6).is_greedy());
        assert!(!spec(|s| s.temperature = 1e-5).is_greedy());
    }
}
