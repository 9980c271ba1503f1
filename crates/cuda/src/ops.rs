//! The op families of [`CudaBackend`] ([`Ops`], [`FusedOps`], [`Sampling`]): each checks its
//! buffers' kinds and lengths on the host and enqueues its kernels, itself or through the
//! launchers of attention.rs, matmul.rs, moe.rs and sampling.rs.

use cudarc::driver::PushKernelArg;
use tandem_core::backend::{AttnArgs, FusedOps, KvGeometry, Ops, Sampling, Storage};
use tandem_core::lora::LoraArgs;
use tandem_core::sampling::{RowMasks, SampleSpec, TokenLogprobs, SAMPLE_LANES, SPEC_WORDS};
use tandem_core::weights::TensorView;
use tandem_core::Result;

use crate::buf::{kv_scales, need, need_act, need_kv, need_weight, CudaBuf, Elem, KV_FP8_E4M3};
use crate::device::CudaBackend;
use crate::error::err;
use crate::launch::{cfg, i32_of, u32_of};
use crate::matmul::{self, GemmOut};
use crate::sampling::ARGMAX_CHUNK;
use crate::switches::Sampler;
use crate::workspace::IoScratch;

impl Ops for CudaBackend {
    fn embedding(
        &self,
        table: &CudaBuf,
        ids: &CudaBuf,
        out: &mut CudaBuf,
        num_tokens: usize,
        hidden: usize,
    ) -> Result<()> {
        const OP: &str = "embedding";
        if num_tokens == 0 || hidden == 0 {
            return Ok(());
        }
        if let Elem::Quant(layout) = table.elem {
            return self.quant_embedding(table, layout, ids, out, num_tokens, hidden);
        }
        let wi = need_weight(table, hidden, OP, "table")?;
        if !table.len.is_multiple_of(hidden) {
            return Err(err(format!("{OP}: table has {} elements, not a multiple of hidden = {hidden}", table.len)));
        }
        need(ids, Elem::U32, num_tokens, OP, "ids")?;
        need(out, Elem::F32, num_tokens * hidden, OP, "out")?;
        let k = &self.kernels.embedding[wi];
        let (t, h, v) = (
            i32_of(num_tokens, OP, "num_tokens")?,
            i32_of(hidden, OP, "hidden")?,
            i32_of(table.len / hidden, OP, "vocab")?,
        );
        let mut l = self.launch_args(&k.f);
        l.arg(&*table.mem).arg(&*ids.mem).arg(&mut *out.mem).arg(&t).arg(&h).arg(&v);
        // SAFETY: argument list matches the kernel signature; lengths checked above.
        let r = unsafe { l.launch(cfg((t as u32, 1, 1), 256)) };
        self.launched(k.name, r)
    }

    fn gather_rows(&self, src: &CudaBuf, rows: &CudaBuf, out: &mut CudaBuf, n: usize, dim: usize) -> Result<()> {
        const OP: &str = "gather_rows";
        if n == 0 || dim == 0 {
            return Ok(());
        }
        need(src, Elem::F32, 0, OP, "src")?;
        need(rows, Elem::U32, n, OP, "rows")?;
        need(out, Elem::F32, n * dim, OP, "out")?;
        let f = &self.kernels.gather_rows.f;
        let (ni, di, sr) = (i32_of(n, OP, "n")?, i32_of(dim, OP, "dim")?, i32_of(src.len / dim, OP, "src rows")?);
        let mut l = self.launch_args(f);
        l.arg(&*src.mem).arg(&*rows.mem).arg(&mut *out.mem).arg(&ni).arg(&di).arg(&sr);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(cfg((ni as u32, 1, 1), 256)) };
        self.launched(OP, r)
    }

    fn rms_norm(&self, x: &CudaBuf, w: &CudaBuf, out: &mut CudaBuf, rows: usize, dim: usize, eps: f32) -> Result<()> {
        const OP: &str = "rms_norm";
        if rows == 0 || dim == 0 {
            return Ok(());
        }
        need(x, Elem::F32, rows * dim, OP, "x")?;
        let wi = need_weight(w, dim, OP, "w")?;
        let code = need_act(out, rows * dim, OP, "out")?;
        let k = &self.kernels.rms_norm[wi];
        let (ri, di) = (i32_of(rows, OP, "rows")?, i32_of(dim, OP, "dim")?);
        let mut l = self.launch_args(&k.f);
        l.arg(&*x.mem).arg(&*w.mem).arg(&mut *out.mem).arg(&code).arg(&ri).arg(&di).arg(&eps);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(cfg((ri as u32, 1, 1), 256)) };
        self.launched(k.name, r)
    }

    fn add(&self, acc: &mut CudaBuf, x: &CudaBuf, len: usize) -> Result<()> {
        const OP: &str = "add";
        if len == 0 {
            return Ok(());
        }
        need(acc, Elem::F32, len, OP, "acc")?;
        need(x, Elem::F32, len, OP, "x")?;
        let f = &self.kernels.add.f;
        let n = len as u64;
        let mut l = self.launch_args(f);
        l.arg(&mut *acc.mem).arg(&*x.mem).arg(&n);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(Self::elementwise_cfg(len, OP)?) };
        self.launched(OP, r)
    }

    fn matmul(
        &self,
        x: &CudaBuf,
        w: &CudaBuf,
        bias: Option<&CudaBuf>,
        out: &mut CudaBuf,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        need(out, Elem::F32, m * n, "matmul", "out")?;
        self.gemm("matmul", x, w, bias, GemmOut::Plain(out), m, n, k, None)
    }

    fn rope(
        &self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        positions: &CudaBuf,
        inv_freq: &CudaBuf,
        num_tokens: usize,
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        const OP: &str = "rope";
        if num_tokens == 0 || head_dim == 0 {
            return Ok(());
        }
        if !head_dim.is_multiple_of(2) {
            return Err(err(format!("{OP}: head_dim = {head_dim} is odd")));
        }
        need(q, Elem::F32, num_tokens * q_heads * head_dim, OP, "q")?;
        need(k, Elem::F32, num_tokens * kv_heads * head_dim, OP, "k")?;
        need(positions, Elem::U32, num_tokens, OP, "positions")?;
        need(inv_freq, Elem::F32, head_dim / 2, OP, "inv_freq")?;
        i32_of(num_tokens * (q_heads + kv_heads) * head_dim, OP, "elements")?;
        let f = &self.kernels.rope.f;
        let (t, qh, kh, d) = (
            i32_of(num_tokens, OP, "T")?,
            i32_of(q_heads, OP, "q_heads")?,
            i32_of(kv_heads, OP, "kv_heads")?,
            i32_of(head_dim, OP, "head_dim")?,
        );
        let mut l = self.launch_args(f);
        l.arg(&mut *q.mem).arg(&mut *k.mem).arg(&*positions.mem).arg(&*inv_freq.mem).arg(&t).arg(&qh).arg(&kh).arg(&d);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(cfg((t as u32, 1, 1), 128)) };
        self.launched(OP, r)
    }

    fn silu_mul(&self, gate: &CudaBuf, up: &CudaBuf, out: &mut CudaBuf, len: usize) -> Result<()> {
        const OP: &str = "silu_mul";
        if len == 0 {
            return Ok(());
        }
        need(gate, Elem::F32, len, OP, "gate")?;
        need(up, Elem::F32, len, OP, "up")?;
        let code = need_act(out, len, OP, "out")?;
        let f = &self.kernels.silu_mul.f;
        let n = len as u64;
        let mut l = self.launch_args(f);
        l.arg(&*gate.mem).arg(&*up.mem).arg(&mut *out.mem).arg(&code).arg(&n);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(Self::elementwise_cfg(len, OP)?) };
        self.launched(OP, r)
    }

    fn gelu_tanh_mul(&self, gate: &CudaBuf, up: &CudaBuf, out: &mut CudaBuf, len: usize) -> Result<()> {
        const OP: &str = "gelu_tanh_mul";
        if len == 0 {
            return Ok(());
        }
        need(gate, Elem::F32, len, OP, "gate")?;
        need(up, Elem::F32, len, OP, "up")?;
        let code = need_act(out, len, OP, "out")?;
        let f = &self.kernels.gelu_tanh_mul.f;
        let n = len as u64;
        let mut l = self.launch_args(f);
        l.arg(&*gate.mem).arg(&*up.mem).arg(&mut *out.mem).arg(&code).arg(&n);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(Self::elementwise_cfg(len, OP)?) };
        self.launched(OP, r)
    }

    fn scale(&self, x: &mut CudaBuf, factor: f32, len: usize) -> Result<()> {
        const OP: &str = "scale";
        if len == 0 {
            return Ok(());
        }
        need(x, Elem::F32, len, OP, "x")?;
        let f = &self.kernels.scale.f;
        let n = len as u64;
        let mut l = self.launch_args(f);
        l.arg(&mut *x.mem).arg(&factor).arg(&n);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(Self::elementwise_cfg(len, OP)?) };
        self.launched(OP, r)
    }

    fn moe_route(
        &self,
        logits: &CudaBuf,
        weights: &mut CudaBuf,
        rows: usize,
        experts: usize,
        top_k: usize,
        renormalize: bool,
    ) -> Result<()> {
        const OP: &str = "moe_route";
        if rows == 0 || experts == 0 {
            return Ok(());
        }
        need(logits, Elem::F32, rows * experts, OP, "logits")?;
        need(weights, Elem::F32, rows * experts, OP, "weights")?;
        let (ri, ei, ki, rn) = (
            i32_of(rows, OP, "rows")?,
            i32_of(experts, OP, "experts")?,
            i32_of(top_k.min(experts), OP, "top_k")?,
            renormalize as i32,
        );
        i32_of(rows * experts, OP, "rows * experts")?;
        let f = &self.kernels.moe_route.f;
        let mut l = self.stream.launch_builder(f);
        l.arg(&*logits.mem).arg(&mut *weights.mem).arg(&ri).arg(&ei).arg(&ki).arg(&rn);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(cfg((u32_of(rows.div_ceil(64), OP, "blocks")?, 1, 1), 64)) };
        self.launched(OP, r)
    }

    fn moe_accumulate(
        &self,
        acc: &mut CudaBuf,
        y: &CudaBuf,
        weights: &CudaBuf,
        rows: usize,
        dim: usize,
        expert: usize,
        experts: usize,
        first: bool,
    ) -> Result<()> {
        const OP: &str = "moe_accumulate";
        let len = rows * dim;
        if len == 0 {
            return Ok(());
        }
        if expert >= experts {
            return Err(err(format!("{OP}: expert {expert} of {experts}")));
        }
        need(acc, Elem::F32, len, OP, "acc")?;
        need(y, Elem::F32, len, OP, "y")?;
        need(weights, Elem::F32, rows * experts, OP, "weights")?;
        let (n, di, xi, ei, fi) = (
            len as u64,
            i32_of(dim, OP, "dim")?,
            i32_of(expert, OP, "expert")?,
            i32_of(experts, OP, "experts")?,
            first as i32,
        );
        let f = &self.kernels.moe_accumulate.f;
        let mut l = self.stream.launch_builder(f);
        l.arg(&mut *acc.mem).arg(&*y.mem).arg(&*weights.mem).arg(&n).arg(&di).arg(&xi).arg(&ei).arg(&fi);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(Self::elementwise_cfg(len, OP)?) };
        self.launched(OP, r)
    }

    fn lora(&self, args: &LoraArgs<'_, CudaBuf>, shrink: &mut CudaBuf, y: &mut CudaBuf) -> Result<()> {
        self.lora_update(args, shrink, y)
    }

    fn kv_write(
        &self,
        k: &CudaBuf,
        v: &CudaBuf,
        k_cache: &mut CudaBuf,
        v_cache: &mut CudaBuf,
        slots: &CudaBuf,
        num_tokens: usize,
        g: KvGeometry,
    ) -> Result<()> {
        const OP: &str = "kv_write";
        let row = g.num_kv_heads * g.head_dim;
        if num_tokens == 0 || row == 0 {
            return Ok(());
        }
        need(k, Elem::F32, num_tokens * row, OP, "k")?;
        need(v, Elem::F32, num_tokens * row, OP, "v")?;
        let kind = need_kv(k_cache, v_cache, g, OP)?;
        let kern = &self.kernels.kv_write[kind];
        need(slots, Elem::U32, num_tokens, OP, "slots")?;
        let f = &kern.f;
        let (t, rl, ns) = (i32_of(num_tokens, OP, "T")?, i32_of(row, OP, "kv_heads*head_dim")?, g.slots() as u64);
        let (ks, vs) = kv_scales(k_cache, v_cache);
        let mut l = self.launch_args(f);
        l.arg(&*k.mem)
            .arg(&*v.mem)
            .arg(&mut *k_cache.mem)
            .arg(&mut *v_cache.mem)
            .arg(&*slots.mem)
            .arg(&t)
            .arg(&rl)
            .arg(&ns);
        if kind >= KV_FP8_E4M3 {
            l.arg(&ks).arg(&vs);
        }
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(cfg((t as u32, 1, 1), 128)) };
        self.launched(kern.name, r)
    }

    fn paged_attention(&self, a: &AttnArgs<'_, Self>, out: &mut CudaBuf) -> Result<()> {
        self.attention(a, out)
    }
}

impl FusedOps for CudaBackend {
    /// kernels/rms_norm.cu `add_rms_norm_<w>`: one launch, the bits of add then rms_norm.
    fn add_rms_norm(
        &self,
        acc: &mut CudaBuf,
        x: &CudaBuf,
        w: &CudaBuf,
        out: &mut CudaBuf,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "add_rms_norm";
        if rows == 0 || dim == 0 {
            return Ok(());
        }
        need(acc, Elem::F32, rows * dim, OP, "acc")?;
        need(x, Elem::F32, rows * dim, OP, "x")?;
        let wi = need_weight(w, dim, OP, "w")?;
        let code = need_act(out, rows * dim, OP, "out")?;
        let k = &self.kernels.add_rms_norm[wi];
        let (ri, di) = (i32_of(rows, OP, "rows")?, i32_of(dim, OP, "dim")?);
        i32_of(rows * dim, OP, "rows*dim")?;
        let mut l = self.launch_args(&k.f);
        l.arg(&mut *acc.mem).arg(&*x.mem).arg(&*w.mem).arg(&mut *out.mem).arg(&code).arg(&ri).arg(&di).arg(&eps);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(cfg((ri as u32, 1, 1), 256)) };
        self.launched(k.name, r)
    }

    /// One [nq + 2 nkv, hidden] weight (bf16/f16 only; f32 weights are not fused), gathered on
    /// the device from the three mappings.
    fn fuse_qkv(
        &self,
        q: &TensorView,
        k: &TensorView,
        v: &TensorView,
        bias: Option<[&TensorView; 3]>,
    ) -> Result<Option<tandem_core::backend::WeightAndBias<CudaBuf>>> {
        // Under cuBLASLt every projection is a plain GEMM (cublaslt.rs).
        if self.cublaslt.is_some() {
            return Ok(None);
        }
        self.fuse_qkv_weights(q, k, v, bias)
    }

    /// One GEMM whose epilogue routes each column to q, k or v (kernels/matmul.cu EPI_QKV).
    /// With `norm`, the GEMM forms rms_norm(h) * gamma itself (x is not read).
    fn qkv_proj(
        &self,
        x: &CudaBuf,
        w: &CudaBuf,
        bias: Option<&CudaBuf>,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        v: &mut CudaBuf,
        m: usize,
        nq: usize,
        nkv: usize,
        hidden: usize,
        norm: Option<tandem_core::backend::NormIn<'_, CudaBuf>>,
    ) -> Result<()> {
        self.gemm("qkv_proj", x, w, bias, GemmOut::Qkv { q, k, v, nq, nkv }, m, nq + 2 * nkv, hidden, norm)
    }

    /// Gate and up interleaved in blocks of 32 rows (matmul.rs `fuse_gate_up_rows`).
    fn fuse_gate_up(&self, gate: &TensorView, up: &TensorView) -> Result<Option<CudaBuf>> {
        if self.cublaslt.is_some() {
            return Ok(None);
        }
        self.fuse_gate_up_weight(gate, up)
    }

    /// One GEMM whose epilogue writes act(gate) * up (kernels/matmul.cu EPI_SILU, EPI_GEGLU).
    /// With `norm`, the GEMM forms rms_norm(h) * gamma itself (x is not read).
    fn gate_up_act(
        &self,
        act: tandem_core::config::Activation,
        x: &CudaBuf,
        w: &CudaBuf,
        out: &mut CudaBuf,
        m: usize,
        inter: usize,
        hidden: usize,
        norm: Option<tandem_core::backend::NormIn<'_, CudaBuf>>,
    ) -> Result<()> {
        self.gemm(
            "gate_up_act",
            x,
            w,
            None,
            GemmOut::GateUp { out, inter, act },
            m,
            matmul::fuse_gate_up_rows(inter),
            hidden,
            norm,
        )
    }

    /// Up to FUSE_NORM_MAX_TOKENS tokens (see there): a layer is then 5 launches. The fused
    /// path gives the unfused path's bits (kernels/matmul.cu `norm_prologue`, EPI_RESID), so
    /// which one a step takes never changes a token.
    /// Never under cuBLASLt, which has no norm prologue.
    fn fuses_norm(&self, _hidden: usize, tokens: usize) -> bool {
        self.cublaslt.is_none() && tokens <= matmul::FUSE_NORM_MAX_TOKENS
    }

    /// One GEMM whose epilogue adds into h and writes h * gamma (kernels/matmul.cu EPI_RESID).
    fn matmul_residual(
        &self,
        x: &CudaBuf,
        w: &CudaBuf,
        h: &mut CudaBuf,
        next_norm: Option<(&CudaBuf, &mut CudaBuf)>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        if w.elem == Elem::F32 {
            return Err(err("matmul_residual: f32 weights take the SIMT kernel, which has no residual epilogue (the model fuses norms only with fused 16-bit projections)"));
        }
        self.gemm("matmul_residual", x, w, None, GemmOut::Residual { h, hg: next_norm }, m, n, k, None)
    }

    /// One GEMM with rope and the cache write in its epilogue (kernels/matmul.cu EPI_QKV_ROPE)
    /// where every head fits one output tile (head_dim divides 64, or 128 on the 128-wide
    /// kernels), else qkv_proj then rope_kv_write: the same bits either way. An fp8 cache always
    /// takes the second path (the epilogue stores f32 or bf16).
    fn qkv_rope_kv_write(
        &self,
        x: &CudaBuf,
        w: &CudaBuf,
        bias: Option<&CudaBuf>,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        v: &mut CudaBuf,
        m: usize,
        nq: usize,
        hidden: usize,
        norm: Option<tandem_core::backend::NormIn<'_, CudaBuf>>,
        kv: tandem_core::backend::KvDest<'_, CudaBuf>,
    ) -> Result<()> {
        const OP: &str = "qkv_rope_kv_write";
        let g = kv.geometry;
        if g.head_dim == 0 || !nq.is_multiple_of(g.head_dim) {
            return Err(err(format!("{OP}: nq {nq} is not a multiple of head_dim {}", g.head_dim)));
        }
        let nkv = g.num_kv_heads * g.head_dim;
        // An fp8 cache takes the unfused path: the GEMM epilogue stores f32 or bf16 only.
        let fp8 = need_kv(kv.k_cache, kv.v_cache, g, OP)? >= KV_FP8_E4M3;
        if matmul::rope_in_epilogue(g.head_dim) && w.elem != Elem::F32 && !fp8 {
            return self.gemm(OP, x, w, bias, GemmOut::QkvRope { q, nq, nkv, kv }, m, nq + 2 * nkv, hidden, norm);
        }
        self.qkv_proj(x, w, bias, q, k, v, m, nq, nkv, hidden, norm)?;
        self.rope_kv_write(q, k, v, kv.k_cache, kv.v_cache, kv.positions, kv.inv_freq, kv.slots, m, nq / g.head_dim, g)
    }

    /// kernels/kv_write.cu `rope_kv_write_<kv>`: rope and the cache write in one launch; k is
    /// left unrotated (the contract allows it: read K from the cache).
    fn rope_kv_write(
        &self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        v: &CudaBuf,
        k_cache: &mut CudaBuf,
        v_cache: &mut CudaBuf,
        positions: &CudaBuf,
        inv_freq: &CudaBuf,
        slots: &CudaBuf,
        num_tokens: usize,
        q_heads: usize,
        g: KvGeometry,
    ) -> Result<()> {
        const OP: &str = "rope_kv_write";
        let (kvh, d) = (g.num_kv_heads, g.head_dim);
        if num_tokens == 0 || d == 0 {
            return Ok(());
        }
        if !d.is_multiple_of(2) {
            return Err(err(format!("{OP}: head_dim = {d} is odd")));
        }
        need(q, Elem::F32, num_tokens * q_heads * d, OP, "q")?;
        need(k, Elem::F32, num_tokens * kvh * d, OP, "k")?;
        need(v, Elem::F32, num_tokens * kvh * d, OP, "v")?;
        let kind = need_kv(k_cache, v_cache, g, OP)?;
        let kern = &self.kernels.rope_kv_write[kind];
        let (ks, vs) = kv_scales(k_cache, v_cache);
        need(positions, Elem::U32, num_tokens, OP, "positions")?;
        need(inv_freq, Elem::F32, d / 2, OP, "inv_freq")?;
        need(slots, Elem::U32, num_tokens, OP, "slots")?;
        i32_of(num_tokens * (q_heads + kvh) * d, OP, "elements")?;
        let (t, qh, kh, di, ns) = (
            i32_of(num_tokens, OP, "T")?,
            i32_of(q_heads, OP, "q_heads")?,
            i32_of(kvh, OP, "kv_heads")?,
            i32_of(d, OP, "head_dim")?,
            g.slots() as u64,
        );
        let mut l = self.launch_args(&kern.f);
        l.arg(&mut *q.mem)
            .arg(&*k.mem)
            .arg(&*v.mem)
            .arg(&mut *k_cache.mem)
            .arg(&mut *v_cache.mem)
            .arg(&*positions.mem)
            .arg(&*inv_freq.mem)
            .arg(&*slots.mem);
        l.arg(&t).arg(&qh).arg(&kh).arg(&di).arg(&ns);
        if kind >= KV_FP8_E4M3 {
            l.arg(&ks).arg(&vs);
        }
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(cfg((t as u32, 1, 1), 128)) };
        self.launched(kern.name, r)
    }

    fn moe_prepare(
        &self,
        experts: &[tandem_core::backend::MoeExpert<'_, CudaBuf>],
        hidden: usize,
        inter: usize,
    ) -> Result<Option<CudaBuf>> {
        self.moe_table(experts, hidden, inter)
    }

    fn moe_routed(
        &self,
        table: &CudaBuf,
        experts: &[tandem_core::backend::MoeExpert<'_, CudaBuf>],
        x: &CudaBuf,
        weights: &CudaBuf,
        out: &mut CudaBuf,
        rows: usize,
        hidden: usize,
        inter: usize,
        top_k: usize,
    ) -> Result<()> {
        self.moe_routed_impl(table, experts, x, weights, out, rows, hidden, inter, top_k)
    }
}

impl Sampling for CudaBackend {
    fn argmax(&self, logits: &CudaBuf, rows: usize, vocab: usize) -> Result<Vec<u32>> {
        const OP: &str = "argmax";
        if rows == 0 {
            return Ok(vec![]);
        }
        if vocab == 0 {
            return Err(err(format!("{OP}: vocab = 0")));
        }
        need(logits, Elem::F32, rows * vocab, OP, "logits")?;
        let (ri, vi) = (i32_of(rows, OP, "rows")?, i32_of(vocab, OP, "vocab")?);
        i32_of(rows * vocab, OP, "rows*vocab")?;
        let mut io = self.io_scratch(rows, 0, OP)?;
        let IoScratch { ids: Some(ids), argmax_part, fixed, .. } = &mut *io else {
            return Err(err(format!("{OP}: id buffer missing after allocation")));
        };
        if self.switches.argmax_multi {
            let chunks = vocab.div_ceil(ARGMAX_CHUNK);
            let words = 2 * rows * chunks;
            if !*fixed && argmax_part.as_ref().is_none_or(|b| b.len < words) {
                *argmax_part = Some(self.alloc(Elem::U32, words)?);
            }
            // A workspace reserved for fewer logits than these: the one-CTA kernel, same ids.
            if let Some(part) = argmax_part.as_mut().filter(|b| b.len >= words) {
                let ci = i32_of(chunks, OP, "chunks")?;
                let mut l = self.launch_args(&self.kernels.argmax_partial.f);
                l.arg(&*logits.mem).arg(&mut *part.mem).arg(&ri).arg(&vi).arg(&ci);
                // SAFETY: grid (chunks, rows): CTA (c, r) reads row r's logits [c * 4096,
                // min(vocab, (c + 1) * 4096)) and writes words r * chunks + c and rows * chunks +
                // r * chunks + c of `part` (2 * rows * chunks words, checked above).
                let r = unsafe { l.launch(cfg((ci as u32, ri as u32, 1), 256)) };
                self.launched(self.kernels.argmax_partial.name, r)?;
                let mut l = self.launch_args(&self.kernels.argmax_fold.f);
                l.arg(&*part.mem).arg(&mut *ids.mem).arg(&ri).arg(&ci);
                // SAFETY: reads the pairs argmax_partial wrote; writes ids[0..rows].
                let r = unsafe { l.launch(cfg((ri as u32, 1, 1), 256)) };
                self.launched(self.kernels.argmax_fold.name, r)?;
                return self.read_u32(ids, rows);
            }
        }
        let mut l = self.launch_args(&self.kernels.argmax.f);
        l.arg(&*logits.mem).arg(&mut *ids.mem).arg(&ri).arg(&vi);
        // SAFETY: as in embedding; ids holds at least `rows` words.
        let r = unsafe { l.launch(cfg((ri as u32, 1, 1), 512)) };
        self.launched(OP, r)?;
        self.read_u32(ids, rows)
    }

    /// kernels/sampling.cu: one block of 256 threads per row; only the specs (32 bytes a row)
    /// go up and the ids come back. Greedy-only steps take the argmax kernel.
    fn sample(&self, logits: &CudaBuf, rows: usize, vocab: usize, specs: &[SampleSpec]) -> Result<Vec<u32>> {
        const OP: &str = "sample";
        if specs.len() != rows {
            return Err(err(format!("{OP}: {} specs for {rows} rows", specs.len())));
        }
        if specs.iter().all(SampleSpec::is_greedy) {
            return self.argmax(logits, rows, vocab);
        }
        if vocab == 0 {
            return Err(err(format!("{OP}: vocab = 0")));
        }
        need(logits, Elem::F32, rows * vocab, OP, "logits")?;
        let (ri, vi) = (i32_of(rows, OP, "rows")?, i32_of(vocab, OP, "vocab")?);
        i32_of(rows * vocab, OP, "rows*vocab")?;
        let words: Vec<u32> = specs.iter().flat_map(SampleSpec::to_words).collect();
        debug_assert_eq!(words.len(), rows * SPEC_WORDS);
        let mut io = self.io_scratch(rows, words.len(), OP)?;
        let IoScratch { ids: Some(_), specs: Some(spec_buf), .. } = &mut *io else {
            return Err(err(format!("{OP}: id or spec buffer missing after allocation")));
        };
        self.write_u32(spec_buf, &words)?;
        if self.switches.sampler == Sampler::Multi && self.sample_multi(&mut io, logits, rows, vocab, false)? {
            let IoScratch { ids: Some(ids), .. } = &*io else { return Err(err(format!("{OP}: id buffer missing"))) };
            return self.read_u32(ids, rows);
        }
        let IoScratch { ids: Some(ids), specs: Some(spec_buf), .. } = &mut *io else {
            return Err(err(format!("{OP}: id or spec buffer missing after allocation")));
        };
        let f =
            if self.switches.sampler == Sampler::Radix { &self.kernels.sample_radix.f } else { &self.kernels.sample.f };
        let mut l = self.stream.launch_builder(f);
        l.arg(&*logits.mem).arg(&*spec_buf.mem).arg(&mut *ids.mem).arg(&ri).arg(&vi);
        // SAFETY: as in embedding; specs hold SPEC_WORDS words a row, ids one a row.
        let r = unsafe { l.launch(cfg((ri as u32, 1, 1), SAMPLE_LANES as u32)) };
        self.launched(OP, r)?;
        self.read_u32(ids, rows)
    }

    fn sample_masked(
        &self,
        logits: &CudaBuf,
        rows: usize,
        vocab: usize,
        specs: &[SampleSpec],
        masks: &RowMasks,
    ) -> Result<Vec<u32>> {
        const OP: &str = "sample_masked";
        if masks.is_empty() {
            return self.sample(logits, rows, vocab, specs);
        }
        masks.check(rows, vocab).map_err(|m| err(format!("{OP}: {m}")))?;
        if specs.len() != rows || vocab == 0 {
            return Err(err(format!("{OP}: {} specs for {rows} rows of vocabulary {vocab}", specs.len())));
        }
        need(logits, Elem::F32, rows * vocab, OP, "logits")?;
        if masks.has_edits() && !self.edit_logits(logits, rows, vocab, masks)? {
            // More edits than the reserved records: the host, with the same ids.
            let v = self.read_f32(logits, rows * vocab)?;
            return Ok(tandem_core::sampling::sample_rows_masked(&v, vocab, specs, masks));
        }
        self.sample_edited(logits, rows, vocab, specs, masks)
    }

    fn sample_logprobs(
        &self,
        logits: &CudaBuf,
        rows: usize,
        vocab: usize,
        specs: &[SampleSpec],
        masks: &RowMasks,
        top_n: &[Option<usize>],
    ) -> Result<(Vec<u32>, Vec<Option<TokenLogprobs>>)> {
        self.sample_with_logprobs(logits, rows, vocab, specs, masks, top_n)
    }
}
