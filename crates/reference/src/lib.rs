//! The reference backend: plain Rust, f32 activations, f64 where a sum is long, written to be
//! read. It is the oracle the op conformance suite holds every other backend to, and it can
//! serve (slowly). Weights stay where the safetensors mapping put them and are widened to f32
//! as they are read. A weight kept quantized (a GGUF block layout, `tandem_core::quant_layout`)
//! is dequantized a row at a time into the same scratch row a bf16 weight is widened into, and
//! dotted in the same order: a matmul on it gives the bits of "dequantize, then multiply".
//!
//! The KV cache is f32 (bit for bit what was written) or FP8 (one byte an element, rounded as
//! [`tandem_core::fp8_round`] rounds, read back through the format's table times the scale).
//!
//! Architecture invariant: no `unsafe`, no SIMD intrinsics, no cleverness beyond splitting a
//! matmul's output rows across threads.

use std::ops::Range;
use std::sync::Arc;

use half::{bf16, f16};
use memmap2::Mmap;
use tandem_core::backend::{AttnArgs, DType, Device, FusedOps, KvDtype, KvGeometry, Ops, Sampling, Storage};
use tandem_core::error::{Error, Result};
use tandem_core::fp8::Fp8Format;
use tandem_core::fp8_round::{self, KV_SCALE};
use tandem_core::quant_layout::QuantLayout;
use tandem_core::weights::TensorView;

/// A buffer of the reference backend.
pub enum RefBuf {
    F32(Vec<f32>),
    U32(Vec<u32>),
    /// An fp8 KV cache: one byte an element, values stored divided by the scale.
    Fp8Kv(Fp8Format, f32, Vec<u8>),
    /// A weight in its stored dtype (or quantized layout), either still in the file mapping or owned.
    Weight {
        format: Format,
        bytes: WeightBytes,
    },
}

/// How a weight's bytes hold its values: a dtype, or a quantized layout decoding to f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    pub dtype: DType,
    pub quant: Option<QuantLayout>,
}

impl Format {
    fn plain(dtype: DType) -> Self {
        Format { dtype, quant: None }
    }

    /// Bytes of a row of `k` values.
    fn row_bytes(self, k: usize) -> Result<usize> {
        match self.quant {
            None => Ok(k * self.dtype.size()),
            Some(q) => q.row_bytes(k).map_err(err),
        }
    }

    /// Whole rows of `k` values in `len` bytes (a layout's rows must be whole blocks).
    fn rows_in(self, len: usize, k: usize) -> Result<usize> {
        Ok(len / self.row_bytes(k)?.max(1))
    }
}

pub enum WeightBytes {
    Mapped(Arc<Mmap>, Range<usize>),
    Owned(Vec<u8>),
}

impl RefBuf {
    fn weight_bytes(&self) -> Result<(Format, &[u8])> {
        match self {
            RefBuf::Weight { format, bytes: WeightBytes::Mapped(m, r) } => Ok((*format, &m[r.clone()])),
            RefBuf::Weight { format, bytes: WeightBytes::Owned(v) } => Ok((*format, v)),
            RefBuf::F32(v) => Ok((Format::plain(DType::F32), bytemuck::cast_slice(v))),
            RefBuf::U32(_) | RefBuf::Fp8Kv(..) => Err(err("a u32 or KV buffer was passed where a weight is expected")),
        }
    }
}

fn err(msg: impl Into<String>) -> Error {
    Error::backend("reference", msg)
}

/// A KV scale must be positive, finite and normal (`Storage::alloc_kv_scaled`).
fn check_kv_scale(scale: f32) -> Result<()> {
    if scale.is_normal() && scale > 0.0 {
        return Ok(());
    }
    Err(err(format!("alloc_kv: KV scale {scale} is not a positive, finite, normal number")))
}

fn f32s(b: &RefBuf) -> Result<&[f32]> {
    match b {
        RefBuf::F32(v) => Ok(v),
        _ => Err(err("expected an f32 buffer")),
    }
}
fn f32s_mut(b: &mut RefBuf) -> Result<&mut [f32]> {
    match b {
        RefBuf::F32(v) => Ok(v),
        _ => Err(err("expected an f32 buffer")),
    }
}
fn u32s(b: &RefBuf) -> Result<&[u32]> {
    match b {
        RefBuf::U32(v) => Ok(v),
        _ => Err(err("expected a u32 buffer")),
    }
}
/// One layer's K or V cache as attention reads it: f32 values, or fp8 bytes and their values'
/// table (scale applied).
enum KvRead<'a> {
    F32(&'a [f32]),
    Fp8(&'a [u8], Box<[f32; 256]>),
}

impl<'a> KvRead<'a> {
    fn of(b: &'a RefBuf) -> Result<Self> {
        match b {
            RefBuf::F32(v) => Ok(KvRead::F32(v)),
            RefBuf::Fp8Kv(f, scale, v) => {
                Ok(KvRead::Fp8(v, Box::new(std::array::from_fn(|i| fp8_round::dequantize(*f, i as u8, *scale)))))
            }
            _ => Err(err("expected a KV cache buffer")),
        }
    }
    fn len(&self) -> usize {
        match self {
            KvRead::F32(v) => v.len(),
            KvRead::Fp8(v, _) => v.len(),
        }
    }
    /// Elements `o..o + n`: borrowed when f32, decoded into `scratch` when fp8.
    fn row<'s>(&'s self, o: usize, n: usize, scratch: &'s mut Vec<f32>) -> &'s [f32] {
        match self {
            KvRead::F32(v) => &v[o..o + n],
            KvRead::Fp8(v, table) => {
                scratch.clear();
                scratch.extend(v[o..o + n].iter().map(|&b| table[b as usize]));
                scratch
            }
        }
    }
}

fn need(what: &str, have: usize, want: usize) -> Result<()> {
    if have < want {
        return Err(err(format!("{what}: buffer has {have} elements, op needs {want}")));
    }
    Ok(())
}

/// A weight matrix's row `[k]` widened (or dequantized) to f32 into `dst`; the caller has
/// checked that `bytes` holds the row ([`Format::rows_in`]).
fn widen_row(format: Format, bytes: &[u8], row: usize, k: usize, dst: &mut [f32]) -> Result<()> {
    let rb = format.row_bytes(k)?;
    let src = bytes.get(row * rb..(row + 1) * rb).ok_or_else(|| err(format!("weight row {row} is out of range")))?;
    if let Some(q) = format.quant {
        return q.dequantize(src, &mut dst[..k]).map_err(err);
    }
    match format.dtype {
        DType::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::BF16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        DType::F16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
    }
    Ok(())
}

/// Dot product: eight f32 lanes (so the compiler can vectorise), summed in f64 at the end.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    let mut s: f64 = lanes.iter().map(|&l| l as f64).sum();
    for (x, y) in ra.iter().zip(rb) {
        s += (*x as f64) * (*y as f64);
    }
    s as f32
}

pub struct RefBackend {
    threads: usize,
    /// Bytes of the weights uploaded so far (`Device::weight_bytes`): the file's bytes, which
    /// stay mapped (quantized ones too).
    weight_bytes: std::sync::atomic::AtomicU64,
}

impl RefBackend {
    pub fn new() -> Self {
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        RefBackend { threads, weight_bytes: Default::default() }
    }
}

impl Default for RefBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Device for RefBackend {
    fn name(&self) -> &'static str {
        "reference"
    }

    fn weight_bytes(&self) -> Option<u64> {
        Some(self.weight_bytes.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl Storage for RefBackend {
    type Buf = RefBuf;

    fn upload_weight(&self, t: &TensorView) -> Result<RefBuf> {
        let (map, range) = t.mapping();
        self.weight_bytes.fetch_add(range.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(RefBuf::Weight { format: Format { dtype: t.dtype, quant: t.quant }, bytes: WeightBytes::Mapped(map, range) })
    }
    fn weight_from_f32(&self, dtype: DType, values: &[f32]) -> Result<RefBuf> {
        Ok(RefBuf::Weight { format: Format::plain(dtype), bytes: WeightBytes::Owned(dtype.from_f32(values)) })
    }
    fn alloc_f32(&self, len: usize) -> Result<RefBuf> {
        Ok(RefBuf::F32(vec![0.0; len]))
    }
    fn alloc_u32(&self, len: usize) -> Result<RefBuf> {
        Ok(RefBuf::U32(vec![0; len]))
    }
    fn kv_dtypes(&self) -> &'static [KvDtype] {
        &[KvDtype::F32, KvDtype::Fp8E4m3, KvDtype::Fp8E5m2]
    }
    fn alloc_kv(&self, g: KvGeometry) -> Result<RefBuf> {
        Ok(RefBuf::F32(vec![0.0; g.layer_elems()]))
    }
    fn alloc_kv_as(&self, g: KvGeometry, dtype: KvDtype) -> Result<RefBuf> {
        match dtype.fp8() {
            Some(f) => Ok(RefBuf::Fp8Kv(f, KV_SCALE, vec![0; g.layer_elems()])),
            None if dtype == KvDtype::F32 => self.alloc_kv(g),
            None => Err(err(format!(
                "alloc_kv: a {} KV cache is not supported here (this backend stores f32, fp8_e4m3, fp8_e5m2)",
                dtype.name()
            ))),
        }
    }
    fn alloc_kv_scaled(&self, g: KvGeometry, dtype: KvDtype, scale: f32) -> Result<RefBuf> {
        check_kv_scale(scale)?;
        match self.alloc_kv_as(g, dtype)? {
            RefBuf::Fp8Kv(f, _, v) => Ok(RefBuf::Fp8Kv(f, scale, v)),
            _ if scale == 1.0 => self.alloc_kv_as(g, dtype),
            _ => Err(err(format!("alloc_kv: a {} KV cache takes no scale ({scale})", dtype.name()))),
        }
    }
    fn write_f32(&self, buf: &mut RefBuf, data: &[f32]) -> Result<()> {
        let dst = f32s_mut(buf)?;
        need("write_f32", dst.len(), data.len())?;
        dst[..data.len()].copy_from_slice(data);
        Ok(())
    }
    fn write_u32(&self, buf: &mut RefBuf, data: &[u32]) -> Result<()> {
        let RefBuf::U32(dst) = buf else { return Err(err("write_u32 into a non-u32 buffer")) };
        need("write_u32", dst.len(), data.len())?;
        dst[..data.len()].copy_from_slice(data);
        Ok(())
    }
    fn read_f32(&self, buf: &RefBuf, len: usize) -> Result<Vec<f32>> {
        let v = f32s(buf)?;
        need("read_f32", v.len(), len)?;
        Ok(v[..len].to_vec())
    }
    fn read_u32(&self, buf: &RefBuf, len: usize) -> Result<Vec<u32>> {
        let v = u32s(buf)?;
        need("read_u32", v.len(), len)?;
        Ok(v[..len].to_vec())
    }
    fn read_kv(&self, buf: &RefBuf, g: KvGeometry) -> Result<Vec<f32>> {
        let kv = KvRead::of(buf)?;
        need("read_kv", kv.len(), g.layer_elems())?;
        Ok(kv.row(0, g.layer_elems(), &mut Vec::new()).to_vec())
    }
}

impl Ops for RefBackend {
    fn embedding(&self, table: &RefBuf, ids: &RefBuf, out: &mut RefBuf, t: usize, hidden: usize) -> Result<()> {
        let (format, bytes) = table.weight_bytes()?;
        let rows = format.rows_in(bytes.len(), hidden)?;
        let ids = u32s(ids)?;
        let out = f32s_mut(out)?;
        need("embedding ids", ids.len(), t)?;
        need("embedding out", out.len(), t * hidden)?;
        for (i, &id) in ids[..t].iter().enumerate() {
            if id as usize >= rows {
                return Err(err(format!("embedding: token id {id} >= {rows} rows")));
            }
            widen_row(format, bytes, id as usize, hidden, &mut out[i * hidden..(i + 1) * hidden])?;
        }
        Ok(())
    }

    fn gather_rows(&self, src: &RefBuf, rows: &RefBuf, out: &mut RefBuf, n: usize, dim: usize) -> Result<()> {
        let (src, rows, out) = (f32s(src)?, u32s(rows)?, f32s_mut(out)?);
        need("gather_rows out", out.len(), n * dim)?;
        for (i, &r) in rows[..n].iter().enumerate() {
            let r = r as usize;
            need("gather_rows src", src.len(), (r + 1) * dim)?;
            out[i * dim..(i + 1) * dim].copy_from_slice(&src[r * dim..(r + 1) * dim]);
        }
        Ok(())
    }

    fn rms_norm(&self, x: &RefBuf, w: &RefBuf, out: &mut RefBuf, rows: usize, dim: usize, eps: f32) -> Result<()> {
        let (format, wb) = w.weight_bytes()?;
        need("rms_norm w", format.rows_in(wb.len(), dim)?, 1)?;
        let mut wf = vec![0f32; dim];
        widen_row(format, wb, 0, dim, &mut wf)?;
        let (x, out) = (f32s(x)?, f32s_mut(out)?);
        need("rms_norm x", x.len(), rows * dim)?;
        need("rms_norm out", out.len(), rows * dim)?;
        for r in 0..rows {
            let xr = &x[r * dim..(r + 1) * dim];
            let ms = xr.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / dim as f64;
            let inv = (1.0 / (ms + eps as f64).sqrt()) as f32;
            for (o, (&v, &g)) in out[r * dim..(r + 1) * dim].iter_mut().zip(xr.iter().zip(&wf)) {
                *o = g * (v * inv);
            }
        }
        Ok(())
    }

    fn add(&self, acc: &mut RefBuf, x: &RefBuf, len: usize) -> Result<()> {
        let (acc, x) = (f32s_mut(acc)?, f32s(x)?);
        need("add", acc.len().min(x.len()), len)?;
        for (a, b) in acc[..len].iter_mut().zip(&x[..len]) {
            *a += *b;
        }
        Ok(())
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
        let (format, wb) = w.weight_bytes()?;
        need("matmul w rows", format.rows_in(wb.len(), k)?, n)?;
        let bias = match bias {
            Some(b) => {
                let (bd, bb) = b.weight_bytes()?;
                need("matmul bias", bd.rows_in(bb.len(), n)?, 1)?;
                let mut v = vec![0f32; n];
                widen_row(bd, bb, 0, n, &mut v)?;
                Some(v)
            }
            None => None,
        };
        let (x, out) = (f32s(x)?, f32s_mut(out)?);
        need("matmul x", x.len(), m * k)?;
        need("matmul out", out.len(), m * n)?;
        // Split the output columns (weight rows) across threads; each thread widens one weight
        // row at a time and dots it with every input row.
        let chunk = n.div_ceil(self.threads).max(1);
        let mut cols: Result<Vec<Vec<f32>>> = Ok(Vec::new());
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .step_by(chunk)
                .map(|start| {
                    let end = (start + chunk).min(n);
                    let bias = bias.as_deref();
                    s.spawn(move || -> Result<Vec<f32>> {
                        let mut row = vec![0f32; k];
                        let mut res = vec![0f32; m * (end - start)]; // [m, end-start]
                        for j in start..end {
                            widen_row(format, wb, j, k, &mut row)?;
                            let b = bias.map_or(0.0, |b| b[j]);
                            for i in 0..m {
                                res[i * (end - start) + (j - start)] = dot(&x[i * k..(i + 1) * k], &row) + b;
                            }
                        }
                        Ok(res)
                    })
                })
                .collect();
            cols = handles.into_iter().map(|h| h.join().expect("matmul worker panicked")).collect::<Result<_>>();
        });
        let cols = cols?;
        for (ci, res) in cols.iter().enumerate() {
            let start = ci * chunk;
            let width = res.len() / m.max(1);
            for i in 0..m {
                out[i * n + start..i * n + start + width].copy_from_slice(&res[i * width..(i + 1) * width]);
            }
        }
        Ok(())
    }

    fn rope(
        &self,
        q: &mut RefBuf,
        k: &mut RefBuf,
        positions: &RefBuf,
        inv_freq: &RefBuf,
        t: usize,
        qh: usize,
        kvh: usize,
        hd: usize,
    ) -> Result<()> {
        let (pos, freq) = (u32s(positions)?, f32s(inv_freq)?);
        let half = hd / 2;
        need("rope inv_freq", freq.len(), half)?;
        need("rope positions", pos.len(), t)?;
        for (buf, heads) in [(f32s_mut(q)?, qh), (f32s_mut(k)?, kvh)] {
            need("rope x", buf.len(), t * heads * hd)?;
            for ti in 0..t {
                for h in 0..heads {
                    let x = &mut buf[(ti * heads + h) * hd..(ti * heads + h + 1) * hd];
                    for i in 0..half {
                        // As HF: the angle is an f32 product, its cos/sin taken from there.
                        let angle = (pos[ti] as f32 * freq[i]) as f64;
                        let (sin, cos) = (angle.sin() as f32, angle.cos() as f32);
                        let (a, b) = (x[i], x[i + half]);
                        x[i] = a * cos - b * sin;
                        x[i + half] = b * cos + a * sin;
                    }
                }
            }
        }
        Ok(())
    }

    fn silu_mul(&self, gate: &RefBuf, up: &RefBuf, out: &mut RefBuf, len: usize) -> Result<()> {
        let (g, u, o) = (f32s(gate)?, f32s(up)?, f32s_mut(out)?);
        need("silu_mul", g.len().min(u.len()).min(o.len()), len)?;
        for i in 0..len {
            let x = g[i];
            o[i] = x / (1.0 + (-x).exp()) * u[i];
        }
        Ok(())
    }

    fn gelu_tanh_mul(&self, gate: &RefBuf, up: &RefBuf, out: &mut RefBuf, len: usize) -> Result<()> {
        let (g, u, o) = (f32s(gate)?, f32s(up)?, f32s_mut(out)?);
        need("gelu_tanh_mul", g.len().min(u.len()).min(o.len()), len)?;
        for i in 0..len {
            o[i] = tandem_core::backend::gelu_tanh(g[i]) * u[i];
        }
        Ok(())
    }

    fn scale(&self, x: &mut RefBuf, factor: f32, len: usize) -> Result<()> {
        let x = f32s_mut(x)?;
        need("scale", x.len(), len)?;
        x[..len].iter_mut().for_each(|v| *v *= factor);
        Ok(())
    }

    fn kv_write(
        &self,
        k: &RefBuf,
        v: &RefBuf,
        kc: &mut RefBuf,
        vc: &mut RefBuf,
        slots: &RefBuf,
        t: usize,
        g: KvGeometry,
    ) -> Result<()> {
        let w = g.num_kv_heads * g.head_dim;
        let slots = u32s(slots)?;
        need("kv_write slots", slots.len(), t)?;
        for (src, dst) in [(f32s(k)?, kc), (f32s(v)?, vc)] {
            need("kv_write src", src.len(), t * w)?;
            for (i, &s) in slots[..t].iter().enumerate() {
                let s = s as usize;
                if s >= g.slots() {
                    return Err(err(format!("kv_write: slot {s} >= {} slots", g.slots())));
                }
                let src = &src[i * w..(i + 1) * w];
                match dst {
                    RefBuf::F32(d) => d[s * w..(s + 1) * w].copy_from_slice(src),
                    RefBuf::Fp8Kv(f, scale, d) => {
                        for (o, &x) in d[s * w..(s + 1) * w].iter_mut().zip(src) {
                            *o = fp8_round::quantize(*f, x, *scale);
                        }
                    }
                    _ => return Err(err("kv_write: expected a KV cache buffer")),
                }
            }
        }
        Ok(())
    }

    fn paged_attention(&self, a: &AttnArgs<'_, Self>, out: &mut RefBuf) -> Result<()> {
        let g = a.geometry;
        let (hd, heads, kvh, bs) = (g.head_dim, a.num_heads, g.num_kv_heads, g.block_size);
        let group = heads / kvh;
        let (q, kc, vc) = (f32s(a.q)?, KvRead::of(a.k_cache)?, KvRead::of(a.v_cache)?);
        let (pos, tseq, tables) = (u32s(a.positions)?, u32s(a.token_seq)?, u32s(a.block_tables)?);
        let out = f32s_mut(out)?;
        need("attention q", q.len(), a.num_tokens * heads * hd)?;
        need("attention k_cache", kc.len().min(vc.len()), g.layer_elems())?;
        need("attention tables", tables.len(), a.num_seqs * a.max_blocks)?;
        need("attention positions", pos.len().min(tseq.len()), a.num_tokens)?;
        need("attention out", out.len(), a.num_tokens * heads * hd)?;
        let mut scores = Vec::new();
        let mut row = Vec::new();
        for t in 0..a.num_tokens {
            let (p, s) = (pos[t] as usize, tseq[t] as usize);
            if s >= a.num_seqs || p / bs >= a.max_blocks {
                return Err(err(format!("attention: token {t} (seq {s}, position {p}) outside the block tables")));
            }
            let table = &tables[s * a.max_blocks..(s + 1) * a.max_blocks];
            if let Some(b) = table[..=p / bs].iter().find(|&&b| b as usize >= g.num_blocks) {
                return Err(err(format!("attention: token {t} uses block {b} of {} blocks", g.num_blocks)));
            }
            // The sliding window: keys j with j > p - window (HF's sliding_window_overlay).
            let lo = if a.window > 0 { (p + 1).saturating_sub(a.window) } else { 0 };
            for h in 0..heads {
                let kh = h / group;
                let qv = &q[(t * heads + h) * hd..(t * heads + h + 1) * hd];
                let key = |j: usize| {
                    let slot = table[j / bs] as usize * bs + j % bs;
                    (slot * kvh + kh) * hd
                };
                scores.clear();
                for j in lo..=p {
                    let o = key(j);
                    scores.push(dot(qv, kc.row(o, hd, &mut row)) as f64 * a.scale as f64);
                }
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let mut denom = 0.0;
                for sc in scores.iter_mut() {
                    *sc = (*sc - max).exp();
                    denom += *sc;
                }
                let o = &mut out[(t * heads + h) * hd..(t * heads + h + 1) * hd];
                let mut acc = vec![0f64; hd];
                for (j, w) in scores.iter().enumerate() {
                    let vr = vc.row(key(lo + j), hd, &mut row);
                    for (av, &x) in acc.iter_mut().zip(vr) {
                        *av += w * x as f64;
                    }
                }
                for (d, av) in acc.iter().enumerate() {
                    o[d] = (av / denom) as f32;
                }
            }
        }
        Ok(())
    }
}

impl FusedOps for RefBackend {}

impl Sampling for RefBackend {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_with_a_block_outside_the_pool_is_an_error() {
        let b = RefBackend::new();
        let g = KvGeometry { num_blocks: 2, block_size: 4, num_kv_heads: 1, head_dim: 2 };
        let (q, kc, vc) = (b.alloc_f32(2).unwrap(), b.alloc_kv(g).unwrap(), b.alloc_kv(g).unwrap());
        let mut pos = b.alloc_u32(1).unwrap();
        b.write_u32(&mut pos, &[5]).unwrap();
        let seq = b.alloc_u32(1).unwrap();
        let mut tables = b.alloc_u32(2).unwrap();
        b.write_u32(&mut tables, &[0, 7]).unwrap(); // block 7 of 2
        let args = AttnArgs {
            q: &q,
            k_cache: &kc,
            v_cache: &vc,
            positions: &pos,
            token_seq: &seq,
            block_tables: &tables,
            num_tokens: 1,
            num_seqs: 1,
            max_blocks: 2,
            max_context: 6,
            decode_tokens: 1,
            num_heads: 1,
            geometry: g,
            scale: 1.0,
            window: 0,
        };
        let mut out = b.alloc_f32(2).unwrap();
        let e = b.paged_attention(&args, &mut out).unwrap_err();
        assert!(e.to_string().contains("block 7"), "{e}");
    }

    /// An fp8 cache holds each written value rounded as `fp8_round` rounds, and attention over
    /// it is attention over an f32 cache holding those rounded values, bit for bit.
    #[test]
    fn fp8_cache_is_an_f32_cache_of_the_rounded_values() {
        let b = RefBackend::new();
        let g = KvGeometry { num_blocks: 2, block_size: 4, num_kv_heads: 2, head_dim: 4 };
        let (t, w) = (5, 8);
        let val = |i: usize, s: f32| ((i * 37 % 23) as f32 - 11.0) * s + if i.is_multiple_of(7) { 600.0 } else { 0.0 };
        let kx: Vec<f32> = (0..t * w).map(|i| val(i, 0.173)).collect();
        let vx: Vec<f32> = (0..t * w).map(|i| val(i + 3, 0.291)).collect();
        let up = |v: &[f32]| {
            let mut x = b.alloc_f32(v.len()).unwrap();
            b.write_f32(&mut x, v).unwrap();
            x
        };
        let ups = |v: &[u32]| {
            let mut x = b.alloc_u32(v.len()).unwrap();
            b.write_u32(&mut x, v).unwrap();
            x
        };
        let (k, v) = (up(&kx), up(&vx));
        let slots = ups(&[4, 5, 6, 7, 0]);
        for dtype in [KvDtype::Fp8E4m3, KvDtype::Fp8E5m2] {
            let f = dtype.fp8().unwrap();
            let (mut kc, mut vc) = (b.alloc_kv_as(g, dtype).unwrap(), b.alloc_kv_as(g, dtype).unwrap());
            b.kv_write(&k, &v, &mut kc, &mut vc, &slots, t, g).unwrap();
            // The same values, rounded on the host, in an f32 cache.
            let (mut kf, mut vf) = (b.alloc_kv(g).unwrap(), b.alloc_kv(g).unwrap());
            let round = |x: &[f32]| x.iter().map(|&x| f.decode(fp8_round::encode(f, x))).collect::<Vec<_>>();
            b.kv_write(&up(&round(&kx)), &up(&round(&vx)), &mut kf, &mut vf, &slots, t, g).unwrap();
            assert_eq!(b.read_kv(&kc, g).unwrap(), b.read_kv(&kf, g).unwrap(), "{}", dtype.name());
            assert_eq!(b.read_kv(&vc, g).unwrap(), b.read_kv(&vf, g).unwrap(), "{}", dtype.name());
            if f == Fp8Format::E4M3 {
                // Token 0's first element (598.1, in slot 4) saturates to 448.
                assert_eq!(b.read_kv(&kc, g).unwrap()[4 * w], 448.0);
            }
            // Two tokens of one sequence at positions 3 and 4 (blocks 1 then 0).
            let q = up(&(0..2 * 4 * 4).map(|i| (i as f32 * 0.07).sin()).collect::<Vec<_>>());
            let (pos, seq, tables) = (ups(&[3, 4]), ups(&[0, 0]), ups(&[1, 0]));
            let args = |kc, vc| AttnArgs {
                q: &q,
                k_cache: kc,
                v_cache: vc,
                positions: &pos,
                token_seq: &seq,
                block_tables: &tables,
                num_tokens: 2,
                num_seqs: 1,
                max_blocks: 2,
                max_context: 8,
                decode_tokens: 0,
                num_heads: 4,
                geometry: g,
                scale: 0.5,
                window: 0,
            };
            let (mut o8, mut of) = (b.alloc_f32(32).unwrap(), b.alloc_f32(32).unwrap());
            b.paged_attention(&args(&kc, &vc), &mut o8).unwrap();
            b.paged_attention(&args(&kf, &vf), &mut of).unwrap();
            let (o8, of) = (b.read_f32(&o8, 32).unwrap(), b.read_f32(&of, 32).unwrap());
            assert_eq!(
                o8.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                of.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
        let Err(e) = b.alloc_kv_as(g, KvDtype::Bf16) else { panic!("a bf16 cache was allocated") };
        assert!(e.to_string().contains("bf16"), "{e}");
    }

    /// A sliding window of w keys: the token at position p sees keys p + 1 - w..=p (HF's
    /// `kv_idx > q_idx - sliding_window`). With q = 0 every seen key weighs the same, so the
    /// output is the mean of the seen V rows: V[j] = j here.
    #[test]
    fn sliding_window_sees_the_last_w_keys() {
        let b = RefBackend::new();
        let g = KvGeometry { num_blocks: 2, block_size: 4, num_kv_heads: 1, head_dim: 1 };
        let q = b.alloc_f32(1).unwrap();
        let mut kc = b.alloc_kv(g).unwrap();
        let mut vc = b.alloc_kv(g).unwrap();
        b.write_f32(&mut kc, &[0.0; 8]).unwrap();
        b.write_f32(&mut vc, &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]).unwrap();
        let mut pos = b.alloc_u32(1).unwrap();
        b.write_u32(&mut pos, &[6]).unwrap();
        let seq = b.alloc_u32(1).unwrap();
        let mut tables = b.alloc_u32(2).unwrap();
        b.write_u32(&mut tables, &[0, 1]).unwrap();
        for (window, want) in [(0, 3.0), (1, 6.0), (2, 5.5), (3, 5.0), (7, 3.0), (100, 3.0)] {
            let args = AttnArgs {
                q: &q,
                k_cache: &kc,
                v_cache: &vc,
                positions: &pos,
                token_seq: &seq,
                block_tables: &tables,
                num_tokens: 1,
                num_seqs: 1,
                max_blocks: 2,
                max_context: 7,
                decode_tokens: 1,
                num_heads: 1,
                geometry: g,
                scale: 1.0,
                window,
            };
            let mut out = b.alloc_f32(1).unwrap();
            b.paged_attention(&args, &mut out).unwrap();
            assert_eq!(b.read_f32(&out, 1).unwrap(), [want], "window {window}");
        }
    }
}
