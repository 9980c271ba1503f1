//! An EAGLE-3 head whose weights live on the backend ([`DeviceHead`]): each row's matmuls
//! (`fc`, q/k/v, o, the MLP and the `lm_head` over the draft vocabulary, the costly part on a
//! real model), norms, rope and the argmax run as the backend's [`Ops`], so the logits never
//! come back, only the draft id.
//!
//! What still crosses: a row's hidden input goes up, its roped K and V rows and its query come
//! back so that the attention runs over the sequence's [`HeadCache`] on the host (a few
//! hundred floats a row; the cache keeps the protocol every head shares, prefix-cache hits
//! included), the attention's output goes up, and the row's pre-norm output comes back (a
//! further draft feeds it in). The host [`Eagle3Head`] is the oracle: the same arithmetic, in
//! another summation order, so ids equal but for near ties.
//!
//! The q/k/v projections read `[input_norm(embed); hidden_norm(hidden)]`: there is no concat op,
//! so each weight is split into its two column halves and the two products added.

use std::cell::RefCell;

use crate::backend::{Backend, DType};
use crate::eagle3::Eagle3Head;
use crate::error::Result;
use crate::head_layer::{propose_rows, HeadAttention, HeadCache, RowFns};

/// An EAGLE-3 head's weights on backend `B` (f32, row-major `[out, in]`).
pub struct DeviceHead<B: Backend> {
    hidden: usize,
    aux_width: usize,
    eps: f32,
    draft_vocab: usize,
    inter: usize,
    norm_before_residual: bool,
    /// The attention's shape (no weights): the host part of each row.
    attn: HeadAttention,
    d2t: Vec<i64>,
    embed: B::Buf,
    fc: B::Buf,
    input_norm: B::Buf,
    hidden_norm: B::Buf,
    /// q, k and v, each as its columns over the embedding half and over the hidden half.
    qkv: [[B::Buf; 2]; 3],
    o: B::Buf,
    inv_freq: B::Buf,
    post_norm: B::Buf,
    gate: B::Buf,
    up: B::Buf,
    down: B::Buf,
    norm: B::Buf,
    lm_head: B::Buf,
}

/// Columns `from..from + width` of `w` (`[rows, cols]`).
fn columns(w: &[f32], cols: usize, from: usize, width: usize) -> Vec<f32> {
    w.chunks_exact(cols).flat_map(|r| r[from..from + width].iter().copied()).collect()
}

impl<B: Backend> DeviceHead<B> {
    /// Uploads `head`'s weights to `b`.
    pub fn upload(b: &B, head: &Eagle3Head) -> Result<Self> {
        let up = |v: &[f32]| b.weight_from_f32(DType::F32, v);
        let d = head.hidden;
        let halves =
            |w: &[f32]| -> Result<[B::Buf; 2]> { Ok([up(&columns(w, 2 * d, 0, d))?, up(&columns(w, 2 * d, d, d))?]) };
        let a = &head.attn;
        Ok(DeviceHead {
            hidden: d,
            aux_width: head.aux_layers.len() * head.target_hidden,
            eps: head.eps,
            draft_vocab: head.draft_vocab,
            inter: head.mlp.inter,
            norm_before_residual: head.norm_before_residual,
            attn: HeadAttention {
                heads: a.heads,
                kv_heads: a.kv_heads,
                head_dim: a.head_dim,
                inv_freq: a.inv_freq.clone(),
                q: Vec::new(),
                k: Vec::new(),
                v: Vec::new(),
                bias: None,
                o: Vec::new(),
                out: a.out,
            },
            d2t: head.d2t.clone(),
            embed: up(&head.embed)?,
            fc: up(&head.fc)?,
            input_norm: up(&head.input_norm)?,
            hidden_norm: up(&head.hidden_norm)?,
            qkv: [halves(&a.q)?, halves(&a.k)?, halves(&a.v)?],
            o: up(&a.o)?,
            inv_freq: {
                let mut f = b.alloc_f32(a.inv_freq.len())?;
                b.write_f32(&mut f, &a.inv_freq)?;
                f
            },
            post_norm: up(&head.post_norm)?,
            gate: up(&head.mlp.gate)?,
            up: up(&head.mlp.up)?,
            down: up(&head.mlp.down)?,
            norm: up(&head.norm)?,
            lm_head: up(&head.lm_head)?,
        })
    }

    /// Floats of one position's kept target states.
    pub fn aux_width(&self) -> usize {
        self.aux_width
    }

    /// [`crate::head_layer::HeadModel::propose`] with this head's rows on `b`.
    pub fn propose(
        &self,
        b: &B,
        cache: &mut HeadCache,
        tokens: &[u32],
        aux: &[f32],
        aux_from: usize,
        k: usize,
    ) -> Result<Option<Vec<u32>>> {
        // The row functions cannot fail: the first error is kept and the rows after it are
        // empty, and the proposal is then that error.
        let failed = RefCell::new(None);
        let keep = |r: Result<(Vec<f32>, u32)>| match r {
            Ok(v) => v,
            Err(e) => {
                failed.borrow_mut().get_or_insert(e);
                (vec![0.0; self.hidden], 0)
            }
        };
        let hidden_in = |a: &[f32]| keep(self.hidden_in(b, a).map(|h| (h, 0))).0;
        let row = |c: &mut HeadCache, t: u32, h: &[f32], p: usize| {
            if failed.borrow().is_some() {
                return (vec![0.0; self.hidden], 0);
            }
            keep(self.row(b, c, t, h, p))
        };
        let drafts =
            propose_rows(self.aux_width, &RowFns { hidden_in: &hidden_in, row: &row }, cache, tokens, aux, aux_from, k);
        match failed.into_inner() {
            Some(e) => Err(e),
            None => Ok(drafts),
        }
    }

    fn upload_f32(b: &B, v: &[f32]) -> Result<B::Buf> {
        let mut buf = b.alloc_f32(v.len())?;
        b.write_f32(&mut buf, v)?;
        Ok(buf)
    }

    /// `fc(aux)` on the device.
    fn hidden_in(&self, b: &B, aux: &[f32]) -> Result<Vec<f32>> {
        let x = Self::upload_f32(b, aux)?;
        let mut h = b.alloc_f32(self.hidden)?;
        b.matmul(&x, &self.fc, None, &mut h, 1, self.hidden, aux.len())?;
        b.read_f32(&h, self.hidden)
    }

    /// `out = w0 · x0 + w1 · x1` (`n` outputs, `k` inputs each).
    fn split_matmul(&self, b: &B, w: &[B::Buf; 2], x: [&B::Buf; 2], n: usize) -> Result<B::Buf> {
        let d = self.hidden;
        let mut out = b.alloc_f32(n)?;
        let mut t = b.alloc_f32(n)?;
        b.matmul(x[0], &w[0], None, &mut out, 1, n, d)?;
        b.matmul(x[1], &w[1], None, &mut t, 1, n, d)?;
        b.add(&mut out, &t, n)?;
        Ok(out)
    }

    /// One row at `pos` (as [`crate::head_layer::HeadModel::row`]): its K/V rows join `cache`.
    fn row(&self, b: &B, cache: &mut HeadCache, token: u32, hidden: &[f32], pos: usize) -> Result<(Vec<f32>, u32)> {
        let (d, eps, a) = (self.hidden, self.eps, &self.attn);
        let (qd, kvd) = (a.heads * a.head_dim, a.kv_heads * a.head_dim);
        let hid = Self::upload_f32(b, hidden)?;
        let mut ids = b.alloc_u32(1)?;
        b.write_u32(&mut ids, &[token])?;
        let mut e = b.alloc_f32(d)?;
        b.embedding(&self.embed, &ids, &mut e, 1, d)?;
        let mut x = b.alloc_f32(d)?;
        b.rms_norm(&e, &self.input_norm, &mut x, 1, d, eps)?;
        let mut hn = b.alloc_f32(d)?;
        b.rms_norm(&hid, &self.hidden_norm, &mut hn, 1, d, eps)?;
        let mut q = self.split_matmul(b, &self.qkv[0], [&x, &hn], qd)?;
        let mut k = self.split_matmul(b, &self.qkv[1], [&x, &hn], kvd)?;
        let v = self.split_matmul(b, &self.qkv[2], [&x, &hn], kvd)?;
        let mut p = b.alloc_u32(1)?;
        b.write_u32(&mut p, &[pos as u32])?;
        b.rope(&mut q, &mut k, &p, &self.inv_freq, 1, a.heads, a.kv_heads, a.head_dim)?;
        cache.extend(&b.read_f32(&k, kvd)?, &b.read_f32(&v, kvd)?, 1);
        let attn = Self::upload_f32(b, &a.attend(cache, &b.read_f32(&q, qd)?))?;
        let mut h = b.alloc_f32(d)?;
        b.matmul(&attn, &self.o, None, &mut h, 1, d, qd)?;
        b.add(&mut h, if self.norm_before_residual { &hn } else { &hid }, d)?;
        let mut x2 = b.alloc_f32(d)?;
        b.rms_norm(&h, &self.post_norm, &mut x2, 1, d, eps)?;
        let (mut g, mut u, mut act) = (b.alloc_f32(self.inter)?, b.alloc_f32(self.inter)?, b.alloc_f32(self.inter)?);
        b.matmul(&x2, &self.gate, None, &mut g, 1, self.inter, d)?;
        b.matmul(&x2, &self.up, None, &mut u, 1, self.inter, d)?;
        b.silu_mul(&g, &u, &mut act, self.inter)?;
        let mut down = b.alloc_f32(d)?;
        b.matmul(&act, &self.down, None, &mut down, 1, d, self.inter)?;
        b.add(&mut h, &down, d)?;
        let mut n = b.alloc_f32(d)?;
        b.rms_norm(&h, &self.norm, &mut n, 1, d, eps)?;
        let mut logits = b.alloc_f32(self.draft_vocab)?;
        b.matmul(&n, &self.lm_head, None, &mut logits, 1, self.draft_vocab, d)?;
        let best = b.argmax(&logits, 1, self.draft_vocab)?[0] as usize;
        Ok((b.read_f32(&h, d)?, (best as i64 + self.d2t[best]) as u32))
    }
}
