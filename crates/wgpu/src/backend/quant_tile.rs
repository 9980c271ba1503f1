//! The prefill matmul of a quantized weight (shaders/quant_tile.wgsl): from
//! `TANDEM_WGPU_QUANT_TILE_M` rows of x up (`WgpuOptions::quant_tile_m`; off by default: on
//! lavapipe it was not faster than the GEMV kernels and its pipelines compile slowly for the
//! decoders with `d * q + m` or K-quant scales, see docs/results/2026-12-07-wgpu-quant-prefill),
//! a workgroup decodes a tile of the weight once into
//! workgroup memory and uses it for up to 32 rows of x, where the GEMV-shaped kernels
//! (quant_matmul.wgsl, quant_split_matmul.wgsl) decode every weight value again for each block
//! of at most 8 rows. It reads either form a quantized weight takes on wgpu (the split layout in
//! a texture, the file's blocks in a buffer, bound whole or in row chunks).
//!
//! Its sums are those kernels' (k ascending, four at a time, the same decoded values), so a
//! row's result is the same bits from either kernel and in any batch: picking it by m changes
//! no output (tests/wgpu/quant.rs `the_tile_kernel_gives_the_bits_of_one_row_at_a_time`).

use tandem_core::quant_layout::QuantLayout;
use tandem_core::{DType, Result};

use super::operand::{err, groups};
use super::WgpuBackend;
use crate::buffer::WgpuBuf;
use crate::recorder::{Bind, Grid};
use crate::shaders::{self, Prelude};

/// Most rows of x a workgroup takes (its lanes).
const TM_MAX: usize = 32;

/// Most workgroup memory the tile takes: wgpu's default limit (16 KiB), which every adapter
/// gives.
const TILE_BYTES: usize = 16384;

/// A workgroup's tile: `tm` rows of x (lanes), `tn` weight rows, `kc` values of k a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TileShape {
    tm: usize,
    tn: usize,
    kc: usize,
}

impl TileShape {
    /// Loop iterations of one invocation (lavapipe's limit counts them all, as if nothing
    /// were unrolled): per step the fill, the x loads, and per weight row its dots.
    fn iterations(self, k: usize) -> usize {
        let kc4 = self.kc / 4;
        k / self.kc * (self.tn * kc4 / self.tm + kc4 + self.tn * (1 + kc4)) + 2 * self.tn + 2
    }
}

impl WgpuBackend {
    /// The tile for an `m`-row matmul of a weight `[_, k]`, or `None` to keep the GEMV kernels:
    /// m under the threshold, k not a whole number of 32-value steps, or (on lavapipe) a k too
    /// long for the loop limit even with 8 weight rows a workgroup.
    pub(super) fn quant_tile_shape(&self, m: usize, k: usize) -> Option<TileShape> {
        if self.quant_tile_m == 0 || m < self.quant_tile_m {
            return None;
        }
        let tm = m.next_power_of_two().clamp(8, TM_MAX);
        let mut tn = self.quant_tile_n;
        let kc = [self.quant_tile_kc, 64, 32]
            .into_iter()
            .find(|&c| c >= 32 && c % 32 == 0 && k.is_multiple_of(c) && tn * c * 4 <= TILE_BYTES)?;
        while self.loop_limit.is_some_and(|l| TileShape { tm, tn, kc }.iterations(k) > l) {
            if tn <= 8 {
                return None;
            }
            tn /= 2;
        }
        Some(TileShape { tm, tn, kc })
    }

    /// `out = x w^T (+ bias)` with w kept quantized `[n, k]` in `layout` (`row_bytes` a row in
    /// the file's blocks), by the tile kernel. The operands are checked by the caller
    /// (`quant_matmul`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn quant_tile_matmul(
        &self,
        tile: TileShape,
        x: &wgpu::Buffer,
        w: &WgpuBuf,
        bias: Option<(&WgpuBuf, DType)>,
        out: &wgpu::Buffer,
        (m, n, k): (usize, usize, usize),
        (layout, row_bytes): (QuantLayout, usize),
    ) -> Result<()> {
        let op = "matmul";
        let split = Self::split_of(w).filter(|_| w.texels.is_some());
        let prelude = Prelude::new()
            .constant("TM", tile.tm as u32)
            .constant("TN", tile.tn as u32)
            .constant("KC", tile.kc as u32)
            .quant_tile_weight(layout, split)
            .ok_or_else(|| err(format!("{op}: {} has no block decoder", layout.name())))?
            .optional_weight("bias", 4, bias.map(|b| b.1));
        let kernel = shaders::quant_tile_kernel(split.is_some(), bias.is_some());
        if let (Some(split), Some(tx)) = (split, &w.texels) {
            let params =
                [m as u32, n as u32, k as u32, split.units_per_row() as u32, split.quant_units() as u32, 0, n as u32];
            let mut binds = vec![Bind::all(x), Bind::Texels(&tx.view), Bind::all(out)];
            binds.extend(bias.map(|(b, _)| Bind::all(&b.buf)));
            let grid = Grid::XY(groups(n, tile.tn), groups(m, tile.tm));
            return self.rec.dispatch(kernel, &prelude, &params, &binds, grid);
        }
        for c in self.quant_chunks(op, w, n, row_bytes)? {
            let params = [m as u32, n as u32, k as u32, row_bytes as u32, 0, c.row0 as u32, c.rows as u32];
            let mut binds = vec![Bind::all(x), Bind::range(&w.buf, c.range), Bind::all(out)];
            binds.extend(bias.map(|(b, _)| Bind::all(&b.buf)));
            let grid = Grid::XY(groups(c.rows, tile.tn), groups(m, tile.tm));
            self.rec.dispatch(kernel, &prelude, &params, &binds, grid)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_iteration_count_grows_with_k_and_the_tile() {
        let t = TileShape { tm: 32, tn: 32, kc: 64 };
        // 576 / 64 = 9 steps of 32 * 16 / 32 fills, 16 x loads and 32 * 17 dot loops.
        assert_eq!(t.iterations(576), 9 * (16 + 16 + 32 * 17) + 66);
        assert!(t.iterations(8192) > TileShape { tn: 8, ..t }.iterations(8192));
    }
}
