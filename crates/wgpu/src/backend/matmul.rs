//! The matmul every projection runs through: `x w^T` with its epilogues (split q/k/v, paired
//! gate/up with the activation, rope and the KV write, the residual add), the block shape per
//! batch size, and the row chunks a weight larger than one storage binding is bound in.

use tandem_core::Result;

use super::operand::{err, groups, to_u32, want_f32, want_weight, KvPair};
use super::{WgpuBackend, UNIFORM_WINDOW};
use crate::buffer::{BufKind, Texels, WgpuBuf, TEXEL_ROW, TILE_ROWS};
use crate::recorder::{Bind, Grid};
use crate::shaders::{self, MatmulOut, MatrixLayout, Prelude};

/// Where a matmul writes (see `shaders::MatmulOut`).
#[derive(Clone, Copy)]
pub(super) enum Out<'a> {
    Plain(&'a wgpu::Buffer),
    Split {
        q: &'a wgpu::Buffer,
        k: &'a wgpu::Buffer,
        v: &'a wgpu::Buffer,
        nq: usize,
        nkv: usize,
    },
    /// A fused gate/up projection: out, and whether the activation is gelu_tanh (else silu).
    GateUp(&'a wgpu::Buffer, bool),
    /// A fused q/k/v projection with rope and the KV write in its epilogue (`MatmulOut::SplitRope`).
    SplitRope {
        q: &'a wgpu::Buffer,
        nq: usize,
        nkv: usize,
        head_dim: usize,
        caches: KvPair<'a>,
        kv: [&'a wgpu::Buffer; 3],
        num_slots: usize,
    },
    /// `h += x w^T`, and `hg = h * gamma` with the next norm's gamma (`MatmulOut::Residual`).
    Residual {
        h: &'a wgpu::Buffer,
        next_norm: Option<(&'a WgpuBuf, &'a wgpu::Buffer)>,
    },
}

/// A fused gate/up weight pairs blocks of this many gate rows with the up rows of the same
/// outputs; its kernel runs GATE_UP_WG lanes of GATE_UP_RT rows (WG * RT = 2 * HALF).
pub(super) const GATE_UP_HALF: usize = 64;
pub(super) const GATE_UP_WG: u32 = 16;
pub(super) const GATE_UP_RT: u32 = 8;

/// Rows `[row0, row0 + rows)` of a weight and the bytes of its buffer that hold them.
pub(super) struct Chunk {
    pub(super) row0: usize,
    pub(super) rows: usize,
    pub(super) range: Option<(u64, u64)>,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl WgpuBackend {
    /// The matmul's block for m rows of x and depth k: (WG lanes, RT weight rows and MT x rows
    /// per lane); `paired` for a fused gate/up weight, `norm` with an input norm prologue.
    pub(super) fn matmul_block(
        &self,
        op: &str,
        paired: bool,
        m: usize,
        k: usize,
        norm: bool,
    ) -> Result<(u32, u32, u32)> {
        // Rows of x (MT) and of w (RT) per invocation: MT x RT accumulators, each weight load
        // serving MT tokens. Measured on lavapipe at m = 128, k = 576: 4 x 4 took half the time
        // of 8 x 2 (weight loads are the cost), and with tiled weights 8 x 4 beats 4 x 4.
        let mt = match m {
            1 => 1,
            2 => 2,
            // Never more rows per lane than the batch has (rows past m are computed and dropped).
            _ => self.prefill_mt.min(m.next_power_of_two() as u32),
        };
        let mut rt = match m {
            1 | 2 => self.matmul_rt,
            _ => self.prefill_rt,
        };
        let mut wg = self.matmul_wg;
        let mut mt = mt;
        if paired {
            // The pairing needs WG * RT / 2 = GATE_UP_HALF, whatever the knobs say.
            (wg, rt, mt) = (GATE_UP_WG, GATE_UP_RT, mt.min(4));
        }
        // Loop iterations one invocation runs (every loop counts; see LOOP_LIMIT).
        let iterations = |mt: u32, rt: u32| -> usize {
            let (mt, rt) = (mt as usize, rt as usize);
            let setup = mt
                + rt
                + mt * rt
                + rt * (1 + mt)
                + if norm { mt * (k / 4 / wg as usize + wg as usize + rt + 2) } else { 0 };
            if k.is_multiple_of(8) {
                k / 8 * (1 + rt + mt + mt * rt) + setup
            } else {
                k * (1 + mt + mt * rt) + setup
            }
        };
        // Under a loop limit, halve the block (x rows first) until the loops fit; a paired
        // (gate/up) block keeps its rows.
        let min_rt = if paired { rt } else { 1 };
        while self.loop_limit.is_some_and(|l| iterations(mt, rt) > l) && mt * rt > min_rt {
            if mt >= rt || rt <= min_rt {
                mt = (mt / 2).max(1)
            } else {
                rt = (rt / 2).max(1)
            }
        }
        self.check_loops(op, &format!("k = {k}"), iterations(mt, rt))?;
        Ok((wg, rt, mt))
    }

    /// `x w^T (+ bias)` into `out`: n output columns, from w's rows (n of them, or for a fused
    /// weight the stacked/paired rows `out` describes). With `norm` = (h, eps), x is h * gamma
    /// and the results are scaled by 1 / rms(h) (`NormIn`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_to(
        &self,
        op: &str,
        x: &WgpuBuf,
        w: &WgpuBuf,
        bias: Option<&WgpuBuf>,
        out: Out<'_>,
        norm: Option<(&WgpuBuf, f32)>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        if m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            return Err(err("matmul: k = 0"));
        }
        // Weight rows: n, or the fused weight's (q, k, v stacked; gate/up paired and padded).
        let w_rows = match out {
            Out::GateUp(..) => n.div_ceil(GATE_UP_HALF) * 2 * GATE_UP_HALF,
            _ => n,
        };
        let x_b = want_f32(op, "x", x, m * k)?;
        let dtype = want_weight(op, "weight", w, w_rows * k)?;
        to_u32(op, "m * n", m * n)?;
        to_u32(op, "m * k", m * k)?;
        let bias_dtype = match bias {
            Some(b) => Some(want_weight(op, "bias", b, w_rows)?),
            None => None,
        };
        let norm_h = match norm {
            Some(_) if !k.is_multiple_of(4) => {
                return Err(err(format!("{op}: a fused norm needs k % 4 == 0 (k = {k}; fuses_norm says so)")))
            }
            Some((h, _)) => Some(want_f32(op, "norm h", h, m * k)?),
            None => None,
        };
        let gamma_dtype = match out {
            Out::Residual { next_norm: Some((g, _)), .. } => Some(want_weight(op, "norm weight", g, n)?),
            _ => None,
        };
        let (wg, rt, mt) = self.matmul_block(op, matches!(out, Out::GateUp(..)), m, k, norm.is_some())?;
        // x goes through a uniform buffer when k % 8 == 0: a 64 KiB window (every f32 buffer
        // is padded to hold one past its end), one dispatch per block of rows that fits, so
        // a prefill takes a few dispatches per matmul. Otherwise through storage, whole.
        // For a batch (m > 2) on an adapter that holds weights in textures, x is copied into a
        // texture instead: its loads are then image loads too (a uniform window's index comes
        // from the loop counter, which lavapipe does not see as uniform: every lane gathers),
        // and all m rows go in one dispatch. Measured on SmolLM2 prefill: see docs/bench-cpu.md.
        let x_rows = (m * k * 4).div_ceil(TEXEL_ROW * 16);
        // The scratch is shared: held locked from the copy to the last dispatch that reads it,
        // so a matmul recorded from another thread cannot copy its x in between.
        // Decode (m <= 2) never takes the lock.
        let mut scratch = match self.texel_weights && m > 2 && x_b.size() >= (x_rows * TEXEL_ROW * 16) as u64 {
            true => Some(self.x_scratch.lock().map_err(|_| err("x scratch lock poisoned"))?),
            false => None,
        };
        let x_tex = scratch.as_deref_mut().and_then(|g| self.x_scratch(g, x_rows));
        let window_rows = if x_tex.is_none() && self.uniform_x && k.is_multiple_of(8) {
            (UNIFORM_WINDOW as usize / (k * 4)) / mt as usize * mt as usize
        } else {
            0
        };
        let uniform_x = window_rows > 0;
        let prelude = Prelude::new().constant("MT", mt).constant("RT", rt).constant("WG", wg);
        let prelude = match &x_tex {
            Some(_) => prelude.x_texels("x", 1),
            None => prelude.x_vec4("x", 1, uniform_x.then_some((UNIFORM_WINDOW / 16) as u32)),
        };
        // Bindings from 4 on, in order: the bias, the outputs past `out`, the norm's h; their
        // access (the kernel's layout) and buffers are listed together so they cannot disagree.
        use shaders::Access::{Read as R, ReadWrite as RW};
        let mut extra: Vec<(shaders::Access, Bind)> = vec![];
        if let Some(b) = bias {
            extra.push((R, Bind::all(&b.buf)));
        }
        let first_out = 4 + extra.len() as u32;
        let to = match out {
            Out::Plain(_) => MatmulOut::Plain,
            Out::GateUp(_, gelu) => MatmulOut::GateUp { gelu },
            Out::Split { k: k_b, v: v_b, nq, nkv, .. } => {
                extra.extend([(RW, Bind::all(k_b)), (RW, Bind::all(v_b))]);
                MatmulOut::Split { nq: nq as u32, nkv: nkv as u32, k_binding: first_out }
            }
            Out::SplitRope { nq, nkv, head_dim, caches, kv, .. } => {
                let cache_access = if caches.texels() { shaders::Access::TexelsWrite } else { RW };
                extra.extend([cache_access; 2].into_iter().zip(caches.binds()));
                extra.extend([R, R, R].into_iter().zip(kv.map(Bind::all)));
                MatmulOut::SplitRope {
                    nq: nq as u32,
                    nkv: nkv as u32,
                    head_dim: head_dim as u32,
                    first: first_out,
                    texels: caches.texels(),
                }
            }
            Out::Residual { next_norm, .. } => MatmulOut::Residual {
                next_norm: next_norm.zip(gamma_dtype).map(|((g, hg), d)| {
                    extra.extend([(R, Bind::all(&g.buf)), (RW, Bind::all(hg))]);
                    (first_out, d)
                }),
            },
        };
        let norm_binding = norm_h.map(|h| {
            extra.push((R, Bind::all(h)));
            3 + extra.len() as u32
        });
        let extra_access: Vec<shaders::Access> = extra.iter().map(|(a, _)| *a).collect();
        let prelude = prelude
            .weight_matrix("w", dtype, Self::layout(w), 2)
            .optional_weight("bias", 4, bias_dtype)
            .matmul_out(to)
            .norm_in(norm_binding);
        let x_access = match (&x_tex, uniform_x) {
            (Some(_), _) => shaders::Access::Texels,
            (None, true) => shaders::Access::Uniform,
            (None, false) => shaders::Access::Read,
        };
        let kernel = shaders::matmul_kernel(x_access, w.texels.is_some(), &extra_access);
        if let Some(t) = &x_tex {
            self.rec.copy_to_texture(x_b, &t.texture, x_rows as u32)?;
        }
        let out_b = match out {
            Out::Plain(b)
            | Out::GateUp(b, _)
            | Out::Split { q: b, .. }
            | Out::SplitRope { q: b, .. }
            | Out::Residual { h: b, .. } => b,
        };
        let block = if uniform_x { window_rows } else { m };
        let eps = norm.map_or(0.0, |(_, e)| e);
        let num_slots = if let Out::SplitRope { num_slots, .. } = out { num_slots as u32 } else { 0 };
        let chunks = self.chunks(op, w, w_rows, k)?;
        if !matches!(out, Out::Plain(_)) && chunks.len() > 1 {
            return Err(err(format!(
                "{op}: fused weight {} is bound in chunks; fuse_* never makes such a weight",
                w.label()
            )));
        }
        for b0 in (0..m).step_by(block) {
            let rows_here = block.min(m - b0);
            let xb = match (&x_tex, uniform_x) {
                (Some(t), _) => Bind::Texels(&t.view),
                (None, true) => {
                    let off = (b0 * k * 4) as u64;
                    if off + UNIFORM_WINDOW > x_b.size() {
                        return Err(err(format!("matmul: x {} lacks the uniform window padding", x.label())));
                    }
                    Bind::range(x_b, Some((off, UNIFORM_WINDOW)))
                }
                (None, false) => Bind::all(x_b),
            };
            for c in &chunks {
                let params = [
                    rows_here as u32,
                    n as u32,
                    k as u32,
                    c.row0 as u32,
                    c.rows as u32,
                    b0 as u32,
                    eps.to_bits(),
                    num_slots,
                ];
                let mut binds = vec![xb, Self::weight_bind(w, c), Bind::all(out_b)];
                binds.extend(extra.iter().map(|(_, b)| *b));
                let grid = Grid::XY(groups(c.rows, (wg * rt) as usize), groups(rows_here, mt as usize));
                self.rec.dispatch(kernel, &prelude, &params, &binds, grid)?;
            }
        }
        Ok(())
    }

    /// The texture matmul copies a batch's x into, at least `rows` texture rows (grown as
    /// needed, kept; the caller holds the lock); `None` past the adapter's texture height.
    pub(super) fn x_scratch<'a>(&self, g: &'a mut Option<Texels>, rows: usize) -> Option<&'a Texels> {
        if rows > self.rec.gpu.limits.max_texture_dimension_2d as usize {
            return None;
        }
        if g.as_ref().is_none_or(|t| (t.texture.size().height as usize) < rows) {
            let max = self.rec.gpu.limits.max_texture_dimension_2d as usize;
            *g = Some(Texels::new(
                &self.rec.gpu.device,
                Some("tandem matmul x"),
                rows.next_power_of_two().min(max),
                wgpu::TextureUsages::COPY_DST,
            ));
        }
        g.as_ref()
    }

    /// How a weight matrix is laid out, for the prelude.
    pub(super) fn layout(w: &WgpuBuf) -> MatrixLayout {
        match (w.tiled, &w.texels) {
            (_, Some(_)) => MatrixLayout::Texels,
            (Some(_), None) => MatrixLayout::Tiled,
            (None, None) => MatrixLayout::RowMajor,
        }
    }

    /// The binding of chunk `c` of weight `w`.
    pub(super) fn weight_bind<'a>(w: &'a WgpuBuf, c: &Chunk) -> Bind<'a> {
        match &w.texels {
            Some(t) => Bind::Texels(&t.view),
            None => Bind::range(&w.buf, c.range),
        }
    }

    /// How a weight of `rows` rows of `row_elems` elements is bound: whole if it fits one
    /// storage binding, else in row chunks whose byte offsets meet the adapter's alignment.
    pub(super) fn chunks(&self, op: &str, w: &WgpuBuf, rows: usize, row_elems: usize) -> Result<Vec<Chunk>> {
        let BufKind::Weight(dtype) = w.kind else { return Err(err(format!("{op}: {} is not a weight", w.label()))) };
        if let Some(t) = w.tiled {
            if (t.rows, t.cols) != (rows, row_elems) {
                return Err(err(format!(
                    "{op}: weight {} is a [{}, {}] matrix; the op asked for [{rows}, {row_elems}]",
                    w.label(),
                    t.rows,
                    t.cols
                )));
            }
        }
        if w.texels.is_some() || w.buf.size() <= self.max_binding {
            return Ok(vec![Chunk { row0: 0, rows, range: None }]);
        }
        if let Some(t) = w.tiled {
            // Whole tiles per chunk: a chunk starts on a tile, so the kernel's tile arithmetic
            // on chunk-relative rows holds; a tile is a multiple of 1 KiB, so offsets align.
            let tile = t.tile_bytes(dtype);
            let per = self.max_binding / tile;
            if per == 0 || tile % self.rec.gpu.limits.min_storage_buffer_offset_alignment as u64 != 0 {
                return Err(err(format!("{op}: weight {}: a tile of {TILE_ROWS} rows is {tile} bytes, more than the largest storage binding ({} bytes)", w.label(), self.max_binding)));
            }
            let per_rows = per as usize * TILE_ROWS;
            let mut out = Vec::new();
            for r in (0..rows).step_by(per_rows) {
                let n = per_rows.min(rows - r);
                let off = (r / TILE_ROWS) as u64 * tile;
                out.push(Chunk { row0: r, rows: n, range: Some((off, n.div_ceil(TILE_ROWS) as u64 * tile)) });
            }
            return Ok(out);
        }
        let row_bytes = (row_elems * dtype.size()) as u64;
        let align = self.rec.gpu.limits.min_storage_buffer_offset_alignment.max(16) as u64;
        let step = align / gcd(align, row_bytes.max(1));
        let per = (self.max_binding / row_bytes.max(1)) / step * step;
        if per == 0 {
            return Err(err(format!(
                "{op}: weight {}: one row is {row_bytes} bytes; with offset alignment {align} no chunk fits the largest storage binding ({} bytes)",
                w.label(),
                self.max_binding
            )));
        }
        let mut out = Vec::new();
        let mut r = 0usize;
        while r < rows {
            let n = (per as usize).min(rows - r);
            let off = r as u64 * row_bytes;
            let len = (n as u64 * row_bytes).next_multiple_of(16).min(w.buf.size() - off);
            out.push(Chunk { row0: r, rows: n, range: Some((off, len)) });
            r += n;
        }
        Ok(out)
    }
}
