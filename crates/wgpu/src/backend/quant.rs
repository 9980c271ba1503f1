//! Weights kept in a GGUF block layout (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) or in
//! int4 groups (`tandem_core::int4`'s blocks, shaders/quant_int4.wgsl): the bytes go to the
//! device as they are, and the matmul and the embedding decode the blocks in registers
//! (shaders/quant_block.wgsl), so a weight takes its file's bytes, not the 2-4x of
//! its 16- or 32-bit values. The projections of such a model are never fused at load (the fused
//! kernels read 16-bit rows), so every projection comes here through `Ops::matmul`.
//!
//! Where the backend holds weights in textures (CPU adapters), the layouts that have one are
//! repacked at upload into the split layout (`crate::quant_split`: aligned units of quants,
//! the headers apart, rows tiled) and read by shaders/quant_split_matmul.wgsl and
//! quant_split_embedding.wgsl; `TANDEM_WGPU_QUANT_TEXELS=0` keeps the file's bytes in a buffer.

use tandem_core::quant_layout::QuantLayout;
use tandem_core::weights::TensorView;
use tandem_core::{DType, Error, Result};

use super::operand::{err, groups, to_u32, want_f32, want_u32, want_weight};
use super::{WgpuBackend, UNIFORM_WINDOW};
use crate::buffer::{BufKind, WgpuBuf};
use crate::quant_split::QuantSplit;
use crate::recorder::{Bind, Grid};
use crate::shaders::{self, Prelude};

/// Lanes per quant_matmul workgroup (one output column each).
const WG: u32 = 32;

/// Weight rows per lane of the split-layout matmul at decode (m <= 2). Measured on lavapipe
/// (SmolLM2 Q8_0 decode, bench.sh): 15.1 tokens/s with 4, 7.7 with 8.
const SPLIT_DECODE_RT: u32 = 4;

/// Rows `[row0, row0 + rows)` of a quantized weight and the byte range of its buffer bound.
pub(super) struct QuantChunk {
    pub(super) row0: usize,
    pub(super) rows: usize,
    pub(super) range: Option<(u64, u64)>,
}

impl WgpuBackend {
    /// A tensor kept in its GGUF layout: its bytes, padded to whole 16-byte units with at
    /// least one word past the last block (the decoders' unaligned reads may touch it).
    pub(super) fn upload_quantized(&self, t: &TensorView, layout: QuantLayout) -> Result<WgpuBuf> {
        let cols = t.shape.last().copied().unwrap_or(0);
        if !QuantLayout::GGUF.contains(&layout)
            && !matches!(layout, QuantLayout::Int4Group { .. } | QuantLayout::Fp8E4m3(_))
        {
            return Err(Error::tensor(&t.path, &t.name, format!("{} has no block decoder on wgpu", layout.name())));
        }
        let row = layout.row_bytes(cols).map_err(|m| Error::tensor(&t.path, &t.name, m))?;
        let rows = t.numel() / cols.max(1);
        if t.bytes().len() != rows * row {
            return Err(Error::tensor(
                &t.path,
                &t.name,
                format!(
                    "{} bytes for {rows} rows of {cols} {} values ({row} bytes each)",
                    t.bytes().len(),
                    layout.name()
                ),
            ));
        }
        if let Some(split) = QuantSplit::new(layout, &[rows, cols])
            .filter(|s| self.quant_texels && self.fits_texture(s.tiled(), DType::F32) && t.shape.len() == 2)
        {
            let bytes = split.split(t.bytes());
            let tiled = split.tiled();
            let mut w =
                self.texel_weight(DType::F32, Some(&t.name), tiled, &|r| tiled.row_of(DType::F32, &bytes, r))?;
            w.kind = BufKind::Quant(layout);
            w.len = t.numel();
            return Ok(w);
        }
        let what = format!("tensor `{}`", t.name);
        let size = (t.bytes().len() as u64 + 4).next_multiple_of(16);
        let buf = self.mapped_weight_buffer(&what, Some(&t.name), size)?;
        {
            let mut view = buf.get_mapped_range_mut(..).map_err(|e| err(format!("{what}: mapping for upload: {e}")))?;
            let mut padded = t.bytes().to_vec();
            padded.resize(size as usize, 0);
            view.copy_from_slice(&padded);
        }
        buf.unmap();
        Ok(WgpuBuf {
            buf,
            kind: BufKind::Quant(layout),
            len: t.numel(),
            name: Some(t.name.clone()),
            tiled: None,
            texels: None,
        })
    }

    /// The values of a quantized weight (tests and tools): its bytes read back and decoded.
    pub(super) fn read_quantized(&self, buf: &WgpuBuf, layout: QuantLayout, len: usize) -> Result<Vec<f32>> {
        let block = layout.block_elems();
        let whole = len.next_multiple_of(block).min(buf.len);
        let bytes = layout.row_bytes(whole).map_err(|m| err(format!("read_f32: {}: {m}", buf.label())))?;
        let raw = match (Self::split_of(buf), &buf.texels) {
            (Some(split), Some(tx)) => {
                let tiled = split.tiled();
                split.join(&tiled.untile(DType::F32, &self.read_texels(tx, tiled.bytes(DType::F32))?))
            }
            _ => self.rec.read(&buf.buf, (bytes as u64).next_multiple_of(4))?,
        };
        let mut out = vec![0f32; whole];
        layout.dequantize(&raw[..bytes], &mut out).map_err(|m| err(format!("read_f32: {}: {m}", buf.label())))?;
        out.truncate(len);
        Ok(out)
    }

    /// The split layout of a quantized weight held in a texture (`None`: the file's bytes in a
    /// buffer).
    pub(super) fn split_of(w: &WgpuBuf) -> Option<QuantSplit> {
        let (BufKind::Quant(layout), Some(t), true) = (w.kind, w.tiled, w.texels.is_some()) else { return None };
        QuantSplit::new(layout, &[t.rows, w.len / t.rows])
    }

    /// The layout and row bytes of a quantized weight `[rows, cols]`, checked against its length.
    fn want_quant(op: &str, what: &str, w: &WgpuBuf, rows: usize, cols: usize) -> Result<(QuantLayout, usize)> {
        let BufKind::Quant(layout) = w.kind else {
            return Err(err(format!("{op}: {what} must be a quantized weight, got {}", w.label())));
        };
        let row = layout.row_bytes(cols).map_err(|m| err(format!("{op}: {what} {}: {m}", w.label())))?;
        if w.len < rows * cols {
            return Err(err(format!("{op}: {what} needs {} elements, {} has {}", rows * cols, w.label(), w.len)));
        }
        Ok((layout, row))
    }

    /// How a quantized weight of `rows` rows of `row_bytes` is bound: whole when it fits one
    /// storage binding, else in chunks of whole rows whose offsets meet the adapter's alignment.
    pub(super) fn quant_chunks(&self, op: &str, w: &WgpuBuf, rows: usize, row_bytes: usize) -> Result<Vec<QuantChunk>> {
        if w.buf.size() <= self.max_binding {
            return Ok(vec![QuantChunk { row0: 0, rows, range: None }]);
        }
        let align = self.rec.gpu.limits.min_storage_buffer_offset_alignment as usize;
        let step = align / gcd(row_bytes, align);
        // Room for the word past the last block that the decoders may read.
        let per = (self.max_binding as usize).saturating_sub(16) / row_bytes / step * step;
        if per == 0 {
            return Err(err(format!(
                "{op}: weight {}: {step} rows of {row_bytes} bytes exceed the largest storage binding ({} bytes)",
                w.label(),
                self.max_binding
            )));
        }
        let mut out = Vec::new();
        for r in (0..rows).step_by(per) {
            let n = per.min(rows - r);
            let off = (r * row_bytes) as u64;
            let size = ((n * row_bytes) as u64 + 4).next_multiple_of(4).min(w.buf.size() - off);
            out.push(QuantChunk { row0: r, rows: n, range: Some((off, size)) });
        }
        Ok(out)
    }

    /// `out = x w^T (+ bias)` with w kept quantized `[n, k]`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn quant_matmul(
        &self,
        x: &WgpuBuf,
        w: &WgpuBuf,
        bias: Option<&WgpuBuf>,
        out: &mut WgpuBuf,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        let op = "matmul";
        if m == 0 || n == 0 {
            return Ok(());
        }
        let (layout, row_bytes) = Self::want_quant(op, "weight", w, n, k)?;
        let x_b = want_f32(op, "x", x, m * k)?;
        let out_b = want_f32(op, "out", out, m * n)?;
        to_u32(op, "m * n", m * n)?;
        to_u32(op, "m * k", m * k)?;
        to_u32(op, "weight bytes", n * row_bytes)?;
        let bias_dtype = bias.map(|b| want_weight(op, "bias", b, n)).transpose()?;
        if let Some(tile) = self.quant_tile_shape(m, k) {
            let bias = bias.zip(bias_dtype);
            return self.quant_tile_matmul(tile, x_b, w, bias, out_b, (m, n, k), (layout, row_bytes));
        }
        // x rows per invocation: each decoded weight value serves MT of them. Every loop counts
        // toward lavapipe's limit: k / 4 steps, each with MT dots.
        let iterations = |mt: usize| k / 4 * (1 + mt) + k / layout.block_elems() + 3 * mt;
        let mut mt = m.next_power_of_two().min(8);
        while mt > 1 && self.loop_limit.is_some_and(|l| iterations(mt) > l) {
            mt /= 2;
        }
        self.check_loops(op, &format!("k = {k}"), iterations(mt))?;
        if let (Some(split), Some(tx)) = (Self::split_of(w), &w.texels) {
            // Each lane takes RT rows, so one x load serves RT of them; at decode x also goes
            // through a uniform window (every f32 buffer is padded to hold one past its end).
            // Prefill with one row a lane took ~5x as long on lavapipe (see the knob).
            let (rt, uniform) = match m <= 2 {
                true => (
                    SPLIT_DECODE_RT,
                    self.uniform_x && (m * k * 4) as u64 <= UNIFORM_WINDOW && x_b.size() >= UNIFORM_WINDOW,
                ),
                false => (self.quant_prefill_rt, false),
            };
            let prelude = Prelude::new()
                .constant("MT", mt as u32)
                .constant("RT", rt)
                .constant("WG", WG)
                .x_vec4("x", 1, uniform.then_some((UNIFORM_WINDOW / 16) as u32))
                .quant_split(split, 2)
                .optional_weight("bias", 4, bias_dtype);
            let x_access = if uniform { shaders::Access::Uniform } else { shaders::Access::Read };
            let kernel = shaders::quant_split_matmul_kernel(x_access, bias.is_some());
            let params = [m as u32, n as u32, k as u32, split.units_per_row() as u32, split.quant_units() as u32];
            let xb = if uniform { Bind::range(x_b, Some((0, UNIFORM_WINDOW))) } else { Bind::all(x_b) };
            let mut binds = vec![xb, Bind::Texels(&tx.view), Bind::all(out_b)];
            if let Some(b) = bias {
                binds.push(Bind::all(&b.buf));
            }
            let grid = Grid::XY(groups(n, (WG * rt) as usize), groups(m, mt));
            return self.rec.dispatch(kernel, &prelude, &params, &binds, grid);
        }
        let prelude = Prelude::new()
            .constant("MT", mt as u32)
            .constant("WG", WG)
            .quant_block(layout)
            .ok_or_else(|| err(format!("{op}: {} has no block decoder", layout.name())))?
            .optional_weight("bias", 4, bias_dtype);
        let kernel = if bias.is_some() { shaders::QUANT_MATMUL_BIAS } else { shaders::QUANT_MATMUL };
        for c in self.quant_chunks(op, w, n, row_bytes)? {
            let params = [m as u32, n as u32, k as u32, row_bytes as u32, c.row0 as u32, c.rows as u32];
            let mut binds = vec![Bind::all(x_b), Bind::range(&w.buf, c.range), Bind::all(out_b)];
            if let Some(b) = bias {
                binds.push(Bind::all(&b.buf));
            }
            let grid = Grid::XY(groups(c.rows, WG as usize), groups(m, mt));
            self.rec.dispatch(kernel, &prelude, &params, &binds, grid)?;
        }
        Ok(())
    }

    /// `out[t, :] = table[ids[t], :]` with the table kept quantized `[vocab, hidden]`.
    pub(super) fn quant_embedding(
        &self,
        table: &WgpuBuf,
        ids: &WgpuBuf,
        out: &mut WgpuBuf,
        num_tokens: usize,
        hidden: usize,
    ) -> Result<()> {
        let op = "embedding";
        if hidden == 0 {
            return Err(err("embedding: hidden size 0"));
        }
        let vocab = table.len / hidden;
        let (layout, row_bytes) = Self::want_quant(op, "table", table, vocab, hidden)?;
        let ids_b = want_u32(op, "ids", ids, num_tokens)?;
        let out_b = want_f32(op, "out", out, num_tokens * hidden)?;
        to_u32(op, "num_tokens * hidden", num_tokens * hidden)?;
        if let (Some(split), Some(tx)) = (Self::split_of(table), &table.texels) {
            let prelude = Prelude::new().quant_split(split, 1);
            let params = [
                num_tokens as u32,
                hidden as u32,
                vocab as u32,
                split.units_per_row() as u32,
                split.quant_units() as u32,
            ];
            let binds = [Bind::Texels(&tx.view), Bind::all(ids_b), Bind::all(out_b)];
            let grid = Grid::Linear(groups(num_tokens * hidden / 4, 64));
            return self.rec.dispatch(shaders::QUANT_SPLIT_EMBEDDING, &prelude, &params, &binds, grid);
        }
        let prelude = Prelude::new()
            .quant_block(layout)
            .ok_or_else(|| err(format!("{op}: {} has no block decoder", layout.name())))?;
        for c in self.quant_chunks(op, table, vocab, row_bytes)? {
            let params = [num_tokens as u32, hidden as u32, c.row0 as u32, c.rows as u32, row_bytes as u32];
            let binds = [Bind::range(&table.buf, c.range), Bind::all(ids_b), Bind::all(out_b)];
            let grid = Grid::Linear(groups(num_tokens * hidden / 4, 64));
            self.rec.dispatch(shaders::QUANT_EMBEDDING, &prelude, &params, &binds, grid)?;
        }
        Ok(())
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
