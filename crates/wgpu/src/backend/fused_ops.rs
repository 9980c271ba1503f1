//! The `FusedOps` group of `WgpuBackend`: the q/k/v and gate/up projections fused at load,
//! norms and residual adds folded into projections, rope and the KV write in an epilogue.
//! Each falls back to the plain ops where its shapes or knobs rule the fused kernel out.

use tandem_core::backend::{FusedOps, KvDest, KvGeometry, NormIn, Ops, WeightAndBias};
use tandem_core::config::Activation;
use tandem_core::weights::TensorView;
use tandem_core::Result;

use super::matmul::{Out, GATE_UP_HALF};
use super::operand::{err, groups, to_u32, want_f32, want_kv, want_u32, want_weight};
use super::WgpuBackend;
use crate::buffer::{BufKind, WgpuBuf};
use crate::recorder::{Bind, Grid};
use crate::shaders::{self, Prelude};

/// `[rows of all, cols]` when the views are matrices of one dtype and one width.
pub(super) fn stack_shape(parts: &[&TensorView]) -> Option<Vec<usize>> {
    let cols = *parts.first()?.shape.get(1)?;
    let ok = parts.iter().all(|p| p.shape.len() == 2 && p.shape[1] == cols && p.dtype == parts[0].dtype);
    ok.then(|| vec![parts.iter().map(|p| p.shape[0]).sum(), cols])
}

impl FusedOps for WgpuBackend {
    /// One pass per row on CPU adapters (the lane kernel); elsewhere, or when dim % 8 != 0,
    /// the add and the norm as two ops.
    fn add_rms_norm(
        &self,
        acc: &mut WgpuBuf,
        x: &WgpuBuf,
        w: &WgpuBuf,
        out: &mut WgpuBuf,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        if !(self.lane_kernels && dim.is_multiple_of(8)) {
            return tandem_core::backend::add_then_rms_norm(self, acc, x, w, out, rows, dim, eps);
        }
        let op = "add_rms_norm";
        let acc_b = want_f32(op, "acc", acc, rows * dim)?;
        let x_b = want_f32(op, "x", x, rows * dim)?;
        let dtype = want_weight(op, "weight", w, dim)?;
        let out_b = want_f32(op, "out", out, rows * dim)?;
        to_u32(op, "rows * dim", rows * dim)?;
        if w.buf.size() > self.max_binding || w.tiled.is_some() {
            return Err(err(format!("{op}: weight {} must be a vector within one storage binding", w.label())));
        }
        let params = [rows as u32, dim as u32, eps.to_bits()];
        let binds = [Bind::all(acc_b), Bind::all(&w.buf), Bind::all(out_b), Bind::all(x_b)];
        let prelude = Prelude::new().weight4("w", dtype);
        self.rec.dispatch(shaders::ADD_RMS_NORM_LANE, &prelude, &params, &binds, Grid::Linear(groups(rows, 64)))
    }

    fn fuse_qkv(
        &self,
        q: &TensorView,
        k: &TensorView,
        v: &TensorView,
        bias: Option<[&TensorView; 3]>,
    ) -> Result<Option<WeightAndBias<WgpuBuf>>> {
        // Weights kept quantized run apart (the fused kernels read 16-bit rows).
        if !self.fuse || [q, k, v].iter().any(|t| t.quant.is_some()) {
            return Ok(None);
        }
        let Some(t) = stack_shape(&[q, k, v])
            .and_then(|shape| self.tiling(&shape, q.dtype))
            .filter(|t| self.in_one_binding(*t, q.dtype))
        else {
            return Ok(None);
        };
        let (nq, nkv) = (q.shape[0], k.shape[0]);
        if v.shape[0] != nkv {
            return Ok(None);
        }
        let name = q.name.replace("q_proj", "qkv_proj");
        let row = |r: usize| {
            let (src, i) = if r < nq {
                (q, r)
            } else if r < nq + nkv {
                (k, r - nq)
            } else {
                (v, r - nq - nkv)
            };
            t.row_of(q.dtype, src.bytes(), i)
        };
        let w = self.tiled_weight(q.dtype, t, Some(&name), self.texel_weights, &row)?;
        // Counted as held only once the fused weight is taken (a bias that cannot join declines it).
        let b = match bias {
            None => None,
            Some(bs) => {
                if bs.iter().any(|b| b.dtype != bs[0].dtype) {
                    return Ok(None);
                }
                let bytes: Vec<u8> = bs.iter().flat_map(|b| b.bytes().iter().copied()).collect();
                let len = bs.iter().map(|b| b.numel()).sum();
                Some(self.weight_from_bytes(
                    bs[0].dtype,
                    len,
                    &bytes,
                    Some(&name.replace("weight", "bias")),
                    None,
                    false,
                )?)
            }
        };
        Ok(Some((self.held(w), b.map(|b| self.held(b)))))
    }

    fn qkv_proj(
        &self,
        x: &WgpuBuf,
        w: &WgpuBuf,
        bias: Option<&WgpuBuf>,
        q: &mut WgpuBuf,
        k: &mut WgpuBuf,
        v: &mut WgpuBuf,
        m: usize,
        nq: usize,
        nkv: usize,
        hidden: usize,
        norm: Option<NormIn<'_, WgpuBuf>>,
    ) -> Result<()> {
        let op = "qkv_proj";
        let q_b = want_f32(op, "q", q, m * nq)?;
        let k_b = want_f32(op, "k", k, m * nkv)?;
        let v_b = want_f32(op, "v", v, m * nkv)?;
        to_u32(op, "m * (nq + 2 nkv)", m * (nq + 2 * nkv))?;
        self.matmul_to(
            op,
            x,
            w,
            bias,
            Out::Split { q: q_b, k: k_b, v: v_b, nq, nkv },
            norm.map(|n| (n.h, n.eps)),
            m,
            nq + 2 * nkv,
            hidden,
        )
    }

    fn fuse_gate_up(&self, gate: &TensorView, up: &TensorView) -> Result<Option<WgpuBuf>> {
        // Weights kept quantized run apart (the fused kernels read 16-bit rows).
        if !self.fuse || gate.shape != up.shape || gate.dtype != up.dtype || gate.quant.is_some() || up.quant.is_some()
        {
            return Ok(None);
        }
        let [inter, cols] = gate.shape[..] else { return Ok(None) };
        // Blocks of GATE_UP_HALF gate rows, then the up rows of the same outputs; the last
        // block padded with zero rows (see matmul.wgsl, PAIRS).
        let h = GATE_UP_HALF;
        let rows = inter.div_ceil(h) * 2 * h;
        let Some(t) = self.tiling(&[rows, cols], gate.dtype).filter(|t| self.in_one_binding(*t, gate.dtype)) else {
            return Ok(None);
        };
        let row = |r: usize| {
            let (block, i) = (r / (2 * h), r % (2 * h));
            let (src, out) = if i < h { (gate, block * h + i) } else { (up, block * h + i - h) };
            if out < inter {
                t.row_of(gate.dtype, src.bytes(), out)
            } else {
                None
            }
        };
        let name = gate.name.replace("gate_proj", "gate_up_proj");
        self.tiled_weight(gate.dtype, t, Some(&name), self.texel_weights, &row).map(|w| Some(self.held(w)))
    }

    fn gate_up_act(
        &self,
        act: Activation,
        x: &WgpuBuf,
        w: &WgpuBuf,
        out: &mut WgpuBuf,
        m: usize,
        inter: usize,
        hidden: usize,
        norm: Option<NormIn<'_, WgpuBuf>>,
    ) -> Result<()> {
        let op = "gate_up_act";
        let out_b = want_f32(op, "out", out, m * inter)?;
        let rows = inter.div_ceil(GATE_UP_HALF) * 2 * GATE_UP_HALF;
        match w.tiled {
            Some(t) if t.rows == rows && t.cols == hidden => {}
            _ => {
                return Err(err(format!(
                    "{op}: weight {} is not a fused [{inter}, {hidden}] gate/up pair from fuse_gate_up",
                    w.label()
                )))
            }
        }
        let gelu = act == Activation::GeluTanh;
        self.matmul_to(op, x, w, None, Out::GateUp(out_b, gelu), norm.map(|n| (n.h, n.eps)), m, inter, hidden)
    }

    fn fuses_norm(&self, hidden: usize, tokens: usize) -> bool {
        // Every block of a projection's columns recomputes the norm of its rows (a workgroup
        // prologue): at one or two tokens that costs less than the add_rms_norm dispatches it
        // saves; at a 128-token prefill it made the prefill about 10% slower (docs/bench-cpu.md).
        self.fuse_norm && hidden.is_multiple_of(4) && tokens <= self.fuse_norm_rows
    }

    fn matmul_residual(
        &self,
        x: &WgpuBuf,
        w: &WgpuBuf,
        h: &mut WgpuBuf,
        next_norm: Option<(&WgpuBuf, &mut WgpuBuf)>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        let op = "matmul_residual";
        if !self.fuse_norm {
            return Err(err(format!("{op}: residual fusion is off (TANDEM_WGPU_FUSE_NORM=0)")));
        }
        let h_b = want_f32(op, "h", h, m * n)?;
        let next_norm = match next_norm {
            Some((g, hg)) => {
                if g.buf.size() > self.max_binding || g.tiled.is_some() {
                    return Err(err(format!(
                        "{op}: norm weight {} must be a vector within one storage binding",
                        g.label()
                    )));
                }
                Some((g, want_f32(op, "hg", hg, m * n)?))
            }
            None => None,
        };
        self.matmul_to(op, x, w, None, Out::Residual { h: h_b, next_norm }, None, m, n, k)
    }

    fn qkv_rope_kv_write(
        &self,
        x: &WgpuBuf,
        w: &WgpuBuf,
        bias: Option<&WgpuBuf>,
        q: &mut WgpuBuf,
        k: &mut WgpuBuf,
        v: &mut WgpuBuf,
        m: usize,
        nq: usize,
        hidden: usize,
        norm: Option<NormIn<'_, WgpuBuf>>,
        kv: KvDest<'_, WgpuBuf>,
    ) -> Result<()> {
        let op = "qkv_rope_kv_write";
        let g = kv.geometry;
        let (hd, nkv) = (g.head_dim, g.num_kv_heads * g.head_dim);
        if hd == 0 || !hd.is_multiple_of(2) || !nq.is_multiple_of(hd) {
            return Err(err(format!("{op}: head_dim {hd} must be even and divide nq {nq}")));
        }
        // The epilogue needs each head's rows in one lane (see matmul.wgsl's ROPE) and f32
        // caches; otherwise (or with TANDEM_WGPU_FUSE_ROPE=0) the projection and rope_kv_write
        // run apart (an fp8 cache is written by kv_write's encoder).
        let (wg, rt, _) = self.matmul_block(op, false, m, hidden, norm.is_some())?;
        let fp8 = matches!(kv.k_cache.kind, BufKind::KvFp8(..));
        if fp8 || !(self.fuse_rope && ((wg * rt) as usize).is_multiple_of(hd) && (hd / 2).is_multiple_of(wg as usize)) {
            self.qkv_proj(x, w, bias, q, k, v, m, nq, nkv, hidden, norm)?;
            return self.rope_kv_write(
                q,
                k,
                v,
                kv.k_cache,
                kv.v_cache,
                kv.positions,
                kv.inv_freq,
                kv.slots,
                m,
                nq / hd,
                g,
            );
        }
        let q_b = want_f32(op, "q", q, m * nq)?;
        let caches = want_kv(op, kv.k_cache, kv.v_cache, g)?;
        if caches.texels() && !hd.is_multiple_of(4) {
            return Err(err(format!(
                "{op}: caches in textures need head_dim % 4 == 0 (head_dim {hd}; alloc_kv says so)"
            )));
        }
        let p_b = want_u32(op, "positions", kv.positions, m)?;
        let f_b = want_f32(op, "inv_freq", kv.inv_freq, hd / 2)?;
        let s_b = want_u32(op, "slots", kv.slots, m)?;
        to_u32(op, "cache elements", g.layer_elems())?;
        to_u32(op, "m * (nq + 2 nkv)", m * (nq + 2 * nkv))?;
        let out = Out::SplitRope { q: q_b, nq, nkv, head_dim: hd, caches, kv: [p_b, f_b, s_b], num_slots: g.slots() };
        self.matmul_to(op, x, w, bias, out, norm.map(|n| (n.h, n.eps)), m, nq + 2 * nkv, hidden)
    }

    fn rope_kv_write(
        &self,
        q: &mut WgpuBuf,
        k: &mut WgpuBuf,
        v: &WgpuBuf,
        k_cache: &mut WgpuBuf,
        v_cache: &mut WgpuBuf,
        positions: &WgpuBuf,
        inv_freq: &WgpuBuf,
        slots: &WgpuBuf,
        num_tokens: usize,
        q_heads: usize,
        g: KvGeometry,
    ) -> Result<()> {
        let op = "rope_kv_write";
        let (kv_heads, head_dim) = (g.num_kv_heads, g.head_dim);
        if head_dim % 2 != 0 {
            return Err(err(format!("{op}: head_dim {head_dim} is odd")));
        }
        let half = head_dim / 2;
        let kv_dim = kv_heads * head_dim;
        let q_b = want_f32(op, "q", q, num_tokens * q_heads * head_dim)?;
        let k_b = want_f32(op, "k", k, num_tokens * kv_dim)?;
        let v_b = want_f32(op, "v", v, num_tokens * kv_dim)?;
        let kv = want_kv(op, k_cache, v_cache, g)?;
        if kv.fp8().is_some() {
            // rope.wgsl writes f32 caches only: an fp8 one takes rope, then kv_write's encoder.
            self.rope(q, k, positions, inv_freq, num_tokens, q_heads, kv_heads, head_dim)?;
            return self.kv_write(k, v, k_cache, v_cache, slots, num_tokens, g);
        }
        let p_b = want_u32(op, "positions", positions, num_tokens)?;
        let f_b = want_f32(op, "inv_freq", inv_freq, half)?;
        let s_b = want_u32(op, "slots", slots, num_tokens)?;
        to_u32(op, "tokens * heads * head_dim", num_tokens * (q_heads + kv_heads) * head_dim)?;
        to_u32(op, "cache elements", g.layer_elems())?;
        let params = [num_tokens as u32, q_heads as u32, kv_heads as u32, head_dim as u32, g.slots() as u32];
        let [kc, vc] = kv.binds();
        let binds =
            [Bind::all(q_b), Bind::all(k_b), Bind::all(p_b), Bind::all(f_b), Bind::all(v_b), kc, vc, Bind::all(s_b)];
        let prelude = Prelude::new().sincos().kv_cache(6, kv.texels(), true);
        match kv.texels() {
            // q's pairs, then k and v a vec4 at a time (see rope.wgsl).
            true => {
                let items = num_tokens * q_heads * half + num_tokens * kv_dim / 4;
                self.rec.dispatch(shaders::ROPE_KV_WRITE_T, &prelude, &params, &binds, Grid::Linear(groups(items, 64)))
            }
            false => {
                let items = num_tokens * (q_heads + kv_heads) * half;
                self.rec.dispatch(shaders::ROPE_KV_WRITE, &prelude, &params, &binds, Grid::Linear(groups(items, 64)))
            }
        }
    }
}
