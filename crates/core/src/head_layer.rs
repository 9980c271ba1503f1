//! The host f32 pieces a draft head's one layer is made of (EAGLE-3's [`crate::eagle3`],
//! MTP's [`crate::mtp`]): attention over the head's own per-sequence KV ([`HeadCache`]), the
//! gated MLP, RMS norm and HF's rotate-half rope, and the [`HeadModel`] protocol that proposes
//! drafts from a sequence's committed tokens and the target's hidden states.
//!
//! Every head reads row `i` as the token at position `i + 1` and a hidden input derived from
//! the target's kept hidden states at position `i` ([`HeadModel::hidden_in`]), at rope
//! position `i`, and predicts the token at `i + 2`; each further draft feeds back the head's
//! own output row ([`HeadModel::row`]) in place of the target's. That is vLLM's proposer for
//! both kinds of head.

/// One sequence's head KV: a K and a V row (`kv_heads * head_dim` each) per position, the
/// committed positions' rows first.
#[derive(Debug, Default, Clone)]
pub struct HeadCache {
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    pub(crate) len: usize,
}

impl HeadCache {
    /// Positions whose rows are kept.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The K and the V rows of positions `from..to` (of those kept).
    pub fn rows(&self, from: usize, to: usize) -> (&[f32], &[f32]) {
        let w = self.k.len() / self.len.max(1);
        let (a, b) = (from.min(self.len) * w, to.min(self.len) * w);
        (&self.k[a..b], &self.v[a..b])
    }

    /// Appends `n` positions' K and V rows (`k` and `v` of `n` rows each).
    pub fn extend(&mut self, k: &[f32], v: &[f32], n: usize) {
        self.k.extend_from_slice(k);
        self.v.extend_from_slice(v);
        self.len += n;
    }

    /// Keeps the first `n` positions' rows.
    pub fn truncate(&mut self, n: usize) {
        if n < self.len {
            let w = self.k.len() / self.len.max(1);
            self.k.truncate(n * w);
            self.v.truncate(n * w);
            self.len = n;
        }
    }
}

/// A draft head: the target layers it reads and one row of its layer.
pub trait HeadModel: Send {
    /// The target layers whose input hidden states the head reads, in order (the model's
    /// layer count names the last layer's output, before the final norm).
    fn aux_layers(&self) -> &[usize];

    /// Floats of one position's kept target states.
    fn aux_width(&self) -> usize;

    /// The hidden input of a committed row, from its position's kept target states.
    fn hidden_in(&self, aux: &[f32]) -> Vec<f32>;

    /// One head row at position `pos`: the token and the hidden input; appends its K/V to
    /// `cache` and returns the output a further draft feeds back and its greedy target id.
    fn row(&self, cache: &mut HeadCache, token: u32, hidden: &[f32], pos: usize) -> (Vec<f32>, u32);

    /// Up to `k` greedy draft tokens after `tokens` (the committed tokens `t_0..t_n-1`), from
    /// `aux`: the target's kept states of positions `aux_from..n-1` (one row of
    /// [`Self::aux_width`] each, the last token's not yet computed). Head rows of committed
    /// positions not yet in `cache` are computed and kept (so the caller may drop the aux rows
    /// before the last once this returns); the draft rows are dropped before returning. None:
    /// the aux rows do not match the tokens, or start after the cache's end.
    fn propose(
        &self,
        cache: &mut HeadCache,
        tokens: &[u32],
        aux: &[f32],
        aux_from: usize,
        k: usize,
    ) -> Option<Vec<u32>> {
        let rows =
            RowFns { hidden_in: &|a: &[f32]| self.hidden_in(a), row: &|c, t, h: &[f32], p| self.row(c, t, h, p) };
        propose_rows(self.aux_width(), &rows, cache, tokens, aux, aux_from, k)
    }
}

/// A head's two row functions, as [`HeadModel::hidden_in`] and [`HeadModel::row`].
pub(crate) struct RowFns<'a> {
    pub(crate) hidden_in: &'a dyn Fn(&[f32]) -> Vec<f32>,
    #[allow(clippy::type_complexity)] // the signature of HeadModel::row, spelled out once
    pub(crate) row: &'a dyn Fn(&mut HeadCache, u32, &[f32], usize) -> (Vec<f32>, u32),
}

/// [`HeadModel::propose`] over `f`'s rows (shared by the host heads and the device head).
pub(crate) fn propose_rows(
    w: usize,
    f: &RowFns<'_>,
    cache: &mut HeadCache,
    tokens: &[u32],
    aux: &[f32],
    aux_from: usize,
    k: usize,
) -> Option<Vec<u32>> {
    let rows = aux_from + aux.len() / w.max(1);
    if w == 0 || k == 0 || aux.is_empty() || !aux.len().is_multiple_of(w) || rows + 1 != tokens.len() {
        return None;
    }
    // The last committed row's output starts the drafts: recompute it.
    cache.truncate(rows - 1);
    if cache.len() < aux_from {
        return None;
    }
    let mut out = None;
    for i in cache.len()..rows {
        let hidden = (f.hidden_in)(&aux[(i - aux_from) * w..(i - aux_from + 1) * w]);
        out = Some((f.row)(cache, tokens[i + 1], &hidden, i));
    }
    let (mut fed, mut id) = out.expect("at least one row");
    let mut drafts = vec![id];
    while drafts.len() < k {
        let pos = rows + drafts.len() - 1;
        (fed, id) = (f.row)(cache, id, &fed, pos);
        drafts.push(id);
    }
    cache.truncate(rows);
    Some(drafts)
}

/// A head layer's attention: q/k/v (with biases where the layer has them), rope, causal
/// attention over the sequence's [`HeadCache`] (grouped K/V heads), the output projection.
pub(crate) struct HeadAttention {
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) inv_freq: Vec<f32>,
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    /// q, k and v biases, where the layer has them.
    pub(crate) bias: Option<[Vec<f32>; 3]>,
    pub(crate) o: Vec<f32>,
    /// The output width.
    pub(crate) out: usize,
}

impl HeadAttention {
    /// The attention's output (after `o`) for input `x` at position `pos`; appends the row's
    /// K/V to `cache`.
    pub(crate) fn forward(&self, cache: &mut HeadCache, x: &[f32], pos: usize) -> Vec<f32> {
        let hd = self.head_dim;
        let mut q = matvec(&self.q, x, self.heads * hd);
        let mut kr = matvec(&self.k, x, self.kv_heads * hd);
        let mut vr = matvec(&self.v, x, self.kv_heads * hd);
        if let Some([qb, kb, vb]) = &self.bias {
            for (y, b) in [(&mut q, qb), (&mut kr, kb), (&mut vr, vb)] {
                y.iter_mut().zip(b).for_each(|(y, b)| *y += b);
            }
        }
        rope(&mut q, hd, pos, &self.inv_freq);
        rope(&mut kr, hd, pos, &self.inv_freq);
        cache.extend(&kr, &vr, 1);
        let attn = self.attend(cache, &q);
        matvec(&self.o, &attn, self.out)
    }

    /// Causal attention of roped query `q` (`heads * head_dim`) over every row of `cache`,
    /// before the output projection.
    pub(crate) fn attend(&self, cache: &HeadCache, q: &[f32]) -> Vec<f32> {
        let hd = self.head_dim;
        let (n, kvd, group) = (cache.len, self.kv_heads * hd, self.heads / self.kv_heads);
        let scale = 1.0 / (hd as f32).sqrt();
        let mut attn = vec![0f32; self.heads * hd];
        for h in 0..self.heads {
            let qh = &q[h * hd..(h + 1) * hd];
            let kvh = h / group;
            let scores: Vec<f32> =
                (0..n).map(|j| dot(qh, &cache.k[j * kvd + kvh * hd..j * kvd + (kvh + 1) * hd]) * scale).collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let p: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f32 = p.iter().sum();
            let out = &mut attn[h * hd..(h + 1) * hd];
            for (j, pj) in p.iter().enumerate() {
                let vj = &cache.v[j * kvd + kvh * hd..j * kvd + (kvh + 1) * hd];
                for (o, v) in out.iter_mut().zip(vj) {
                    *o += pj / sum * v;
                }
            }
        }
        attn
    }
}

/// A head layer's gated MLP (SiLU gate times up, then down).
pub(crate) struct HeadMlp {
    pub(crate) inter: usize,
    pub(crate) gate: Vec<f32>,
    pub(crate) up: Vec<f32>,
    pub(crate) down: Vec<f32>,
}

impl HeadMlp {
    /// Adds the MLP's output for input `x` to `h`.
    pub(crate) fn add_to(&self, h: &mut [f32], x: &[f32]) {
        let g = matvec(&self.gate, x, self.inter);
        let u = matvec(&self.up, x, self.inter);
        let act: Vec<f32> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
        let down = matvec(&self.down, &act, h.len());
        for (hi, m) in h.iter_mut().zip(down) {
            *hi += m;
        }
    }
}

pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `w · x` for `w` of `[rows, x.len()]`.
pub(crate) fn matvec(w: &[f32], x: &[f32], rows: usize) -> Vec<f32> {
    (0..rows).map(|r| dot(&w[r * x.len()..(r + 1) * x.len()], x)).collect()
}

pub(crate) fn rms_norm(x: &[f32], gamma: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter().zip(gamma).map(|(v, g)| v * r * g).collect()
}

/// The first largest logit's index, as torch.argmax.
pub(crate) fn argmax(logits: &[f32]) -> usize {
    logits.iter().enumerate().fold(0, |b, (i, &l)| if l > logits[b] { i } else { b })
}

/// HF's rotate-half rope of every `hd`-wide head in `x` at position `pos`.
fn rope(x: &mut [f32], hd: usize, pos: usize, inv_freq: &[f32]) {
    let half = hd / 2;
    for head in x.chunks_exact_mut(hd) {
        for (i, f) in inv_freq.iter().enumerate().take(half) {
            let (s, c) = (pos as f32 * f).sin_cos();
            let (a, b) = (head[i], head[i + half]);
            head[i] = a * c - b * s;
            head[i + half] = b * c + a * s;
        }
    }
}
