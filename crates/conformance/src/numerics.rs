//! [`Bf16Numerics`]: a backend that computes as its inner backend does, except that it rounds
//! where the CUDA backend rounds — each GEMM's activation operand to the weights' 16-bit type
//! (kernels/matmul.cu: the tensor cores take 16-bit operands), and K and V to bf16 as they enter
//! the cache (`kv_write_bf16`, round to nearest even). Wrapped around the reference, it gives on
//! the CPU the error those roundings alone put into a whole model's logits, which is what the
//! whole-model compare's limits for a bf16 backend are set from (`tandem compare --numerics
//! bf16`, docs/gpu-check.md). The oracle itself stays f32: this wraps it, it does not change it.
//! The roundings are the only difference from the reference; its summation orders stay.
//!
//! The storage stays the inner backend's (an f32 cache holding bf16-representable values), so
//! only the numerics are emulated, not the bytes: pool sizes and speed mean nothing here.

use half::{bf16, f16};
use tandem_core::backend::{AttnArgs, DType, Device, FusedOps, KvGeometry, Ops, Sampling, Storage};
use tandem_core::error::Result;
use tandem_core::weights::TensorView;
use tandem_reference::{RefBackend, RefBuf};

type B = RefBackend;

pub struct Bf16Numerics {
    inner: RefBackend,
}

impl Default for Bf16Numerics {
    fn default() -> Self {
        Self::new()
    }
}

impl Bf16Numerics {
    pub fn new() -> Self {
        Bf16Numerics { inner: RefBackend::new() }
    }

    /// `len` values of `x`, each rounded through `dtype` (bf16 or f16; round to nearest even).
    fn rounded(&self, x: &RefBuf, len: usize, dtype: DType) -> Result<RefBuf> {
        let mut v = self.inner.read_f32(x, len)?;
        for e in &mut v {
            *e = round_through(*e, dtype);
        }
        let mut out = self.inner.alloc_f32(len)?;
        self.inner.write_f32(&mut out, &v)?;
        Ok(out)
    }
}

/// `x` rounded to `dtype` and widened back; f32 (or anything else) unchanged.
pub fn round_through(x: f32, dtype: DType) -> f32 {
    match dtype {
        DType::BF16 => bf16::from_f32(x).to_f32(),
        DType::F16 => f16::from_f32(x).to_f32(),
        _ => x,
    }
}

fn inner_args<'a>(a: &AttnArgs<'a, Bf16Numerics>) -> AttnArgs<'a, B> {
    AttnArgs {
        q: a.q,
        k_cache: a.k_cache,
        v_cache: a.v_cache,
        positions: a.positions,
        token_seq: a.token_seq,
        block_tables: a.block_tables,
        num_tokens: a.num_tokens,
        num_seqs: a.num_seqs,
        max_blocks: a.max_blocks,
        max_context: a.max_context,
        decode_tokens: a.decode_tokens,
        num_heads: a.num_heads,
        geometry: a.geometry,
        scale: a.scale,
        window: a.window,
    }
}

impl Device for Bf16Numerics {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

impl Storage for Bf16Numerics {
    type Buf = RefBuf;
    fn matmul_operand(&self, weight: DType) -> DType {
        match weight {
            DType::BF16 | DType::F16 => weight,
            _ => DType::F32,
        }
    }
    fn upload_weight(&self, t: &TensorView) -> Result<RefBuf> {
        self.inner.upload_weight(t)
    }
    fn weight_from_f32(&self, dtype: DType, values: &[f32]) -> Result<RefBuf> {
        self.inner.weight_from_f32(dtype, values)
    }
    fn alloc_f32(&self, len: usize) -> Result<RefBuf> {
        self.inner.alloc_f32(len)
    }
    fn alloc_u32(&self, len: usize) -> Result<RefBuf> {
        self.inner.alloc_u32(len)
    }
    fn alloc_kv(&self, geometry: KvGeometry) -> Result<RefBuf> {
        self.inner.alloc_kv(geometry)
    }
    fn write_f32(&self, buf: &mut RefBuf, data: &[f32]) -> Result<()> {
        self.inner.write_f32(buf, data)
    }
    fn write_u32(&self, buf: &mut RefBuf, data: &[u32]) -> Result<()> {
        self.inner.write_u32(buf, data)
    }
    fn read_f32(&self, buf: &RefBuf, len: usize) -> Result<Vec<f32>> {
        self.inner.read_f32(buf, len)
    }
    fn read_u32(&self, buf: &RefBuf, len: usize) -> Result<Vec<u32>> {
        self.inner.read_u32(buf, len)
    }
    fn read_kv(&self, buf: &RefBuf, geometry: KvGeometry) -> Result<Vec<f32>> {
        self.inner.read_kv(buf, geometry)
    }
}

impl Ops for Bf16Numerics {
    fn embedding(
        &self,
        table: &RefBuf,
        ids: &RefBuf,
        out: &mut RefBuf,
        num_tokens: usize,
        hidden: usize,
    ) -> Result<()> {
        self.inner.embedding(table, ids, out, num_tokens, hidden)
    }
    fn gather_rows(&self, src: &RefBuf, rows: &RefBuf, out: &mut RefBuf, n: usize, dim: usize) -> Result<()> {
        self.inner.gather_rows(src, rows, out, n, dim)
    }
    fn rms_norm(&self, x: &RefBuf, w: &RefBuf, out: &mut RefBuf, rows: usize, dim: usize, eps: f32) -> Result<()> {
        self.inner.rms_norm(x, w, out, rows, dim, eps)
    }
    fn add(&self, acc: &mut RefBuf, x: &RefBuf, len: usize) -> Result<()> {
        self.inner.add(acc, x, len)
    }
    fn matmul(
        &self,
        x: &RefBuf,
        w: &RefBuf,
        bias: Option<&RefBuf>,
        out: &mut RefBuf,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        let dtype = match w {
            RefBuf::Weight { format, .. } => format.dtype,
            _ => DType::F32,
        };
        match self.matmul_operand(dtype) {
            DType::F32 => self.inner.matmul(x, w, bias, out, m, n, k),
            operand => self.inner.matmul(&self.rounded(x, m * k, operand)?, w, bias, out, m, n, k),
        }
    }
    fn rope(
        &self,
        q: &mut RefBuf,
        k: &mut RefBuf,
        positions: &RefBuf,
        inv_freq: &RefBuf,
        num_tokens: usize,
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        self.inner.rope(q, k, positions, inv_freq, num_tokens, q_heads, kv_heads, head_dim)
    }
    fn silu_mul(&self, gate: &RefBuf, up: &RefBuf, out: &mut RefBuf, len: usize) -> Result<()> {
        self.inner.silu_mul(gate, up, out, len)
    }
    fn gelu_tanh_mul(&self, gate: &RefBuf, up: &RefBuf, out: &mut RefBuf, len: usize) -> Result<()> {
        self.inner.gelu_tanh_mul(gate, up, out, len)
    }
    fn scale(&self, x: &mut RefBuf, factor: f32, len: usize) -> Result<()> {
        self.inner.scale(x, factor, len)
    }
    fn kv_write(
        &self,
        k: &RefBuf,
        v: &RefBuf,
        k_cache: &mut RefBuf,
        v_cache: &mut RefBuf,
        slots: &RefBuf,
        num_tokens: usize,
        geometry: KvGeometry,
    ) -> Result<()> {
        let len = num_tokens * geometry.num_kv_heads * geometry.head_dim;
        let (k, v) = (self.rounded(k, len, DType::BF16)?, self.rounded(v, len, DType::BF16)?);
        self.inner.kv_write(&k, &v, k_cache, v_cache, slots, num_tokens, geometry)
    }
    fn paged_attention(&self, args: &AttnArgs<'_, Self>, out: &mut RefBuf) -> Result<()> {
        self.inner.paged_attention(&inner_args(args), out)
    }
}

impl FusedOps for Bf16Numerics {}

impl Sampling for Bf16Numerics {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_nearest_even_in_the_weights_type() {
        // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one, 1.0.
        assert_eq!(round_through(1.0 + 2f32.powi(-8), DType::BF16), 1.0);
        assert_eq!(round_through(1.0 + 3.0 * 2f32.powi(-8), DType::BF16), 1.0 + 2f32.powi(-6));
        assert_eq!(round_through(1.0 + 2f32.powi(-11), DType::F16), 1.0);
        assert_eq!(round_through(0.1, DType::F32), 0.1);
    }
}
