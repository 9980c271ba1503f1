//! The `Ops` group of `WgpuBackend`: the op families every backend implements, each a WGSL
//! kernel dispatched after its buffers are checked on the host.

use tandem_core::backend::{AttnArgs, KvGeometry, Ops};
use tandem_core::lora::LoraArgs;
use tandem_core::Result;

use super::matmul::Out;
use super::operand::{err, groups, to_u32, want_f32, want_kv, want_u32, want_weight, KvPair};
use super::WgpuBackend;
use crate::buffer::{BufKind, WgpuBuf};
use crate::recorder::{Bind, Grid};
use crate::shaders::{self, Prelude};

impl Ops for WgpuBackend {
    fn embedding(
        &self,
        table: &WgpuBuf,
        ids: &WgpuBuf,
        out: &mut WgpuBuf,
        num_tokens: usize,
        hidden: usize,
    ) -> Result<()> {
        if let BufKind::Quant(_) = table.kind {
            return self.quant_embedding(table, ids, out, num_tokens, hidden);
        }
        let op = "embedding";
        if hidden == 0 {
            return Err(err("embedding: hidden size 0"));
        }
        let dtype = want_weight(op, "table", table, hidden)?;
        let ids_b = want_u32(op, "ids", ids, num_tokens)?;
        let out_b = want_f32(op, "out", out, num_tokens * hidden)?;
        let vocab = table.len / hidden;
        to_u32(op, "num_tokens * hidden", num_tokens * hidden)?;
        let prelude = Prelude::new().weight_matrix("w", dtype, Self::layout(table), 1);
        let kernel = if table.texels.is_some() { shaders::EMBEDDING_T } else { shaders::EMBEDDING };
        for c in self.chunks(op, table, vocab, hidden)? {
            let params = [num_tokens as u32, hidden as u32, c.row0 as u32, c.rows as u32];
            let binds = [Self::weight_bind(table, &c), Bind::all(ids_b), Bind::all(out_b)];
            self.rec.dispatch(kernel, &prelude, &params, &binds, Grid::Linear(groups(num_tokens * hidden, 64)))?;
        }
        Ok(())
    }

    fn gather_rows(&self, src: &WgpuBuf, rows: &WgpuBuf, out: &mut WgpuBuf, n: usize, dim: usize) -> Result<()> {
        let op = "gather_rows";
        if dim == 0 {
            return Ok(());
        }
        let src_b = want_f32(op, "src", src, dim)?;
        let rows_b = want_u32(op, "rows", rows, n)?;
        let out_b = want_f32(op, "out", out, n * dim)?;
        to_u32(op, "n * dim", n * dim)?;
        let params = [n as u32, dim as u32, (src.len / dim) as u32];
        let binds = [Bind::all(src_b), Bind::all(rows_b), Bind::all(out_b)];
        self.rec.dispatch(shaders::GATHER_ROWS, &Prelude::new(), &params, &binds, Grid::Linear(groups(n * dim, 64)))
    }

    fn rms_norm(&self, x: &WgpuBuf, w: &WgpuBuf, out: &mut WgpuBuf, rows: usize, dim: usize, eps: f32) -> Result<()> {
        let op = "rms_norm";
        let x_b = want_f32(op, "x", x, rows * dim)?;
        let dtype = want_weight(op, "weight", w, dim)?;
        let out_b = want_f32(op, "out", out, rows * dim)?;
        to_u32(op, "rows * dim", rows * dim)?;
        if w.buf.size() > self.max_binding {
            return Err(err(format!("rms_norm: weight {} exceeds one storage binding", w.label())));
        }
        if w.tiled.is_some() {
            return Err(err(format!("rms_norm: weight {} is a matrix, not a vector", w.label())));
        }
        let params = [rows as u32, dim as u32, eps.to_bits()];
        let binds = [Bind::all(x_b), Bind::all(&w.buf), Bind::all(out_b)];
        let prelude = Prelude::new().weight4("w", dtype);
        if self.lane_kernels && dim.is_multiple_of(8) {
            self.rec.dispatch(shaders::RMS_NORM_LANE, &prelude, &params, &binds, Grid::Linear(groups(rows, 64)))
        } else {
            self.rec.dispatch(shaders::RMS_NORM, &prelude, &params, &binds, Grid::Linear(rows as u64))
        }
    }

    fn add(&self, acc: &mut WgpuBuf, x: &WgpuBuf, len: usize) -> Result<()> {
        let op = "add";
        let acc_b = want_f32(op, "acc", acc, len)?;
        let x_b = want_f32(op, "x", x, len)?;
        to_u32(op, "len", len)?;
        let binds = [Bind::all(acc_b), Bind::all(x_b)];
        let vec4 = len.is_multiple_of(4);
        self.rec.dispatch(
            shaders::ADD,
            &Prelude::new().elems(vec4),
            &[len as u32],
            &binds,
            Grid::Linear(groups(if vec4 { len / 4 } else { len }, 64)),
        )
    }

    fn matmul(
        &self,
        x: &WgpuBuf,
        w: &WgpuBuf,
        bias: Option<&WgpuBuf>,
        out: &mut WgpuBuf,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        if let BufKind::Quant(_) = w.kind {
            return self.quant_matmul(x, w, bias, out, m, n, k);
        }
        let out_b = want_f32("matmul", "out", out, m * n)?;
        self.matmul_to("matmul", x, w, bias, Out::Plain(out_b), None, m, n, k)
    }

    fn rope(
        &self,
        q: &mut WgpuBuf,
        k: &mut WgpuBuf,
        positions: &WgpuBuf,
        inv_freq: &WgpuBuf,
        num_tokens: usize,
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let op = "rope";
        if !head_dim.is_multiple_of(2) {
            return Err(err(format!("rope: head_dim {head_dim} is odd")));
        }
        let half = head_dim / 2;
        let q_b = want_f32(op, "q", q, num_tokens * q_heads * head_dim)?;
        let k_b = want_f32(op, "k", k, num_tokens * kv_heads * head_dim)?;
        let p_b = want_u32(op, "positions", positions, num_tokens)?;
        let f_b = want_f32(op, "inv_freq", inv_freq, half)?;
        let items = num_tokens * (q_heads + kv_heads) * half;
        to_u32(op, "tokens * heads * head_dim", num_tokens * (q_heads + kv_heads) * head_dim)?;
        let params = [num_tokens as u32, q_heads as u32, kv_heads as u32, head_dim as u32];
        let binds = [Bind::all(q_b), Bind::all(k_b), Bind::all(p_b), Bind::all(f_b)];
        // rope.wgsl's other entry points need the cache accessors to compile.
        let prelude = Prelude::new().sincos().kv_cache(6, false, true);
        self.rec.dispatch(shaders::ROPE, &prelude, &params, &binds, Grid::Linear(groups(items, 64)))
    }

    fn silu_mul(&self, gate: &WgpuBuf, up: &WgpuBuf, out: &mut WgpuBuf, len: usize) -> Result<()> {
        self.gated("silu_mul", [shaders::SILU_MUL, shaders::SILU_MUL4], gate, up, out, len)
    }

    fn gelu_tanh_mul(&self, gate: &WgpuBuf, up: &WgpuBuf, out: &mut WgpuBuf, len: usize) -> Result<()> {
        self.gated("gelu_tanh_mul", [shaders::GELU_TANH_MUL, shaders::GELU_TANH_MUL4], gate, up, out, len)
    }

    fn scale(&self, x: &mut WgpuBuf, factor: f32, len: usize) -> Result<()> {
        let op = "scale";
        let x_b = want_f32(op, "x", x, len)?;
        to_u32(op, "len", len)?;
        let params = [len as u32, factor.to_bits()];
        let vec4 = len.is_multiple_of(4);
        self.rec.dispatch(
            shaders::SCALE,
            &Prelude::new().elems(vec4),
            &params,
            &[Bind::all(x_b)],
            Grid::Linear(groups(if vec4 { len / 4 } else { len }, 64)),
        )
    }

    fn kv_write(
        &self,
        k: &WgpuBuf,
        v: &WgpuBuf,
        k_cache: &mut WgpuBuf,
        v_cache: &mut WgpuBuf,
        slots: &WgpuBuf,
        num_tokens: usize,
        g: KvGeometry,
    ) -> Result<()> {
        let op = "kv_write";
        let kv_dim = g.num_kv_heads * g.head_dim;
        let k_b = want_f32(op, "k", k, num_tokens * kv_dim)?;
        let v_b = want_f32(op, "v", v, num_tokens * kv_dim)?;
        let kv = want_kv(op, k_cache, v_cache, g)?;
        let s_b = want_u32(op, "slots", slots, num_tokens)?;
        to_u32(op, "cache elements", g.layer_elems())?;
        let [ks, vs] = kv.scales();
        let params = [num_tokens as u32, kv_dim as u32, g.slots() as u32, ks, vs];
        let [kc, vc] = kv.binds();
        let binds = [Bind::all(k_b), Bind::all(v_b), kc, vc, Bind::all(s_b)];
        let prelude = kv.prelude(Prelude::new(), 3, true);
        // A texel or fp8 cache is written a vec4 at a time (alloc_kv made head_dim a multiple
        // of 4): a texel is four elements, an fp8 word too.
        let vec4 = match kv {
            KvPair::Bufs(..) => None,
            KvPair::Texels(..) => Some(shaders::KV_WRITE_T),
            KvPair::Fp8(..) => Some(shaders::KV_WRITE_FP8),
        };
        match vec4 {
            Some(kernel) => {
                self.rec.dispatch(kernel, &prelude, &params, &binds, Grid::Linear(groups(num_tokens * kv_dim / 4, 64)))
            }
            None => self.rec.dispatch(
                shaders::KV_WRITE,
                &prelude,
                &params,
                &binds,
                Grid::Linear(groups(num_tokens * kv_dim, 64)),
            ),
        }
    }

    fn paged_attention(&self, a: &AttnArgs<'_, Self>, out: &mut WgpuBuf) -> Result<()> {
        let op = "paged_attention";
        let g = a.geometry;
        let (t, nh, hd) = (a.num_tokens, a.num_heads, g.head_dim);
        if g.num_kv_heads == 0 || nh % g.num_kv_heads != 0 {
            return Err(err(format!("{op}: {nh} heads are not a multiple of {} kv heads", g.num_kv_heads)));
        }
        if hd == 0 || hd > 256 {
            return Err(err(format!("{op}: head_dim {hd} outside 1..=256")));
        }
        if t > 0 && (a.num_seqs == 0 || a.max_blocks == 0) {
            return Err(err(format!("{op}: {t} tokens but {} sequences of {} blocks", a.num_seqs, a.max_blocks)));
        }
        let q_b = want_f32(op, "q", a.q, t * nh * hd)?;
        let kv = want_kv(op, a.k_cache, a.v_cache, g)?;
        let p_b = want_u32(op, "positions", a.positions, t)?;
        let s_b = want_u32(op, "token_seq", a.token_seq, t)?;
        let bt = want_u32(op, "block_tables", a.block_tables, a.num_seqs * a.max_blocks)?;
        let o_b = want_f32(op, "out", out, t * nh * hd)?;
        to_u32(op, "cache elements", g.layer_elems())?;
        to_u32(op, "q elements", t * nh * hd)?;
        let params = [
            t as u32,
            nh as u32,
            g.num_kv_heads as u32,
            hd as u32,
            g.block_size as u32,
            a.max_blocks as u32,
            a.num_seqs as u32,
            g.slots() as u32,
            a.scale.to_bits(),
            to_u32(op, "window", a.window)?,
            kv.scales()[0],
            kv.scales()[1],
        ];
        let [kc, vc] = kv.binds();
        let binds = [Bind::all(q_b), kc, vc, Bind::all(p_b), Bind::all(s_b), Bind::all(bt), Bind::all(o_b)];
        // An fp8 cache is bound as buffers, as an f32 one is.
        let (lane_kernel, group_kernel) = match kv.texels() {
            true => (shaders::PAGED_ATTENTION_LANE_T, shaders::PAGED_ATTENTION_T),
            false => (shaders::PAGED_ATTENTION_LANE, shaders::PAGED_ATTENTION),
        };
        // Loop iterations per invocation (see LAVAPIPE_LOOP_LIMIT), counted as if nothing were
        // unrolled: the lane kernel runs hd/4 (1 + gq) twice and 3 gq + 1 more per key of its
        // eighth of the keys, the workgroup kernel hd + 5 * 64 + 1 per tile of 64 keys. (A lane
        // kernel that walked all keys in one lane gave NaN at context 1024, head_dim 128 on
        // lavapipe: 1024 x 65 iterations, just past the limit.)
        let keys = a.max_context.max(1);
        let hv = hd / 4;
        let lane_iters =
            |gq: usize| keys.div_ceil(8) * (2 * hv * (1 + gq) + 3 * gq + 1) + 3 * gq * hv + 8 * 2 * gq + 32;
        let group_iters = keys.div_ceil(64) * (hd + 5 * 64 + 1) + 4;
        let fits = |gq: usize| self.loop_limit.is_none_or(|l| lane_iters(gq) <= l);
        // The lane kernel serves GQ query heads of one kv head per workgroup, so each K and V
        // load serves them all: the largest divisor of the group whose GQ x head_dim/4 private
        // vec4s stay within UNROLL_VEC4S (the compiler unrolls the loops over them, which keeps
        // them in registers but costs compile time: without a shader cache, lavapipe built the
        // op suite's 16 attention cases in 88 s with groups up to 128 vec4s, in 4 s with this
        // cap; SmolLM2's 3 heads x 16 fit it) and whose merge buffer fits workgroup memory.
        const UNROLL_VEC4S: usize = 48;
        let group = nh / g.num_kv_heads;
        let wg_bytes = |gq: usize| (8 * gq * hv * 16 + 2 * 8 * gq * 4) as u64;
        let max_wg = self.rec.gpu.limits.max_compute_workgroup_storage_size as u64;
        let gq = (1..=group)
            .rev()
            .filter(|&d| group.is_multiple_of(d) && (d == 1 || d * hv <= UNROLL_VEC4S))
            .find(|&d| wg_bytes(d) <= max_wg && fits(d));
        match gq {
            Some(gq) if self.lane_kernels && hd % 4 == 0 => {
                let prelude = Prelude::new().constant("HV", hv as u32).constant("GQ", gq as u32);
                let prelude = kv.prelude(prelude, 2, false).lane_attention(hv, gq);
                self.rec.dispatch(lane_kernel, &prelude, &params, &binds, Grid::Linear((t * nh / gq) as u64))
            }
            _ => {
                self.check_loops(op, &format!("context {keys}, head_dim {hd}"), group_iters)?;
                // The lane kernel's declarations in the same file need HV and GQ to compile.
                let prelude = Prelude::new().constant("HV", hv.max(1) as u32).constant("GQ", 1);
                let prelude = kv.prelude(prelude, 2, false).lane_attention(hv.max(1), 1);
                self.rec.dispatch(group_kernel, &prelude, &params, &binds, Grid::Linear((t * nh) as u64))
            }
        }
    }

    fn moe_route(
        &self,
        logits: &WgpuBuf,
        weights: &mut WgpuBuf,
        rows: usize,
        experts: usize,
        top_k: usize,
        renormalize: bool,
    ) -> Result<()> {
        let op = "moe_route";
        if rows == 0 || experts == 0 {
            return Ok(());
        }
        let l_b = want_f32(op, "logits", logits, rows * experts)?;
        let w_b = want_f32(op, "weights", weights, rows * experts)?;
        to_u32(op, "rows * experts", rows * experts)?;
        let params = [rows as u32, experts as u32, top_k.min(experts) as u32, renormalize as u32];
        self.rec.dispatch(
            shaders::MOE_ROUTE,
            &Prelude::new(),
            &params,
            &[Bind::all(l_b), Bind::all(w_b)],
            Grid::Linear(groups(rows, 64)),
        )
    }

    fn moe_accumulate(
        &self,
        acc: &mut WgpuBuf,
        y: &WgpuBuf,
        weights: &WgpuBuf,
        rows: usize,
        dim: usize,
        expert: usize,
        experts: usize,
        first: bool,
    ) -> Result<()> {
        let op = "moe_accumulate";
        if rows == 0 || dim == 0 {
            return Ok(());
        }
        if expert >= experts {
            return Err(err(format!("{op}: expert {expert} of {experts}")));
        }
        let a_b = want_f32(op, "acc", acc, rows * dim)?;
        let y_b = want_f32(op, "y", y, rows * dim)?;
        let w_b = want_f32(op, "weights", weights, rows * experts)?;
        to_u32(op, "rows * dim", rows * dim)?;
        let params = [(rows * dim) as u32, dim as u32, expert as u32, experts as u32, first as u32];
        self.rec.dispatch(
            shaders::MOE_ACCUMULATE,
            &Prelude::new(),
            &params,
            &[Bind::all(a_b), Bind::all(y_b), Bind::all(w_b)],
            Grid::Linear(groups(rows * dim, 64)),
        )
    }

    fn lora(&self, args: &LoraArgs<'_, WgpuBuf>, shrink: &mut WgpuBuf, y: &mut WgpuBuf) -> Result<()> {
        self.segmented_lora(args, shrink, y)
    }
}

impl WgpuBackend {
    /// A gated activation `out = act(gate) * up` over f32 `[len]` by its scalar and vec4 kernels
    /// (the vec4 one where len is a multiple of 4).
    pub(super) fn gated(
        &self,
        op: &str,
        [scalar, vec4]: [shaders::Kernel; 2],
        gate: &WgpuBuf,
        up: &WgpuBuf,
        out: &mut WgpuBuf,
        len: usize,
    ) -> Result<()> {
        let g_b = want_f32(op, "gate", gate, len)?;
        let u_b = want_f32(op, "up", up, len)?;
        let o_b = want_f32(op, "out", out, len)?;
        to_u32(op, "len", len)?;
        let binds = [Bind::all(g_b), Bind::all(u_b), Bind::all(o_b)];
        match len % 4 {
            0 => self.rec.dispatch(
                vec4,
                &Prelude::new().gated_acts(),
                &[len as u32],
                &binds,
                Grid::Linear(groups(len / 4, 64)),
            ),
            _ => self.rec.dispatch(
                scalar,
                &Prelude::new().gated_acts(),
                &[len as u32],
                &binds,
                Grid::Linear(groups(len, 64)),
            ),
        }
    }
}
