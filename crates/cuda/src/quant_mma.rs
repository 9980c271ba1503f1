//! The launch plan of kernels/quant_mma.cu: FP8 e4m3, int4-group and every GGUF layout (Q8_0,
//! Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) multiplied on the tensor cores (each 32-wide step
//! of the weight decoded to bf16 in shared memory and fed to mma.sync, the groups' partials
//! folded with their scales, and for the layouts with a min the groups' x-sums with their
//! mins, in ascending order), picked instead
//! of quant_matmul.cu's GEMV by `TANDEM_CUDA_QUANT_TC=1` ([`crate::switches`]).
//!
//! Off by default: the bits differ from the GEMV's (another summation order, and no bf16
//! rounding of the scaled FP8 weight), and no GPU has timed it. Batch invariance holds by the
//! kernel's contract: one reduction order per (n, k) for both row tiles (m16 up to 16 rows,
//! m64 above). The kernels take the GEMV's argument list, so [`CudaBackend::quant_gemm`]
//! launches either with the same arguments; only the kernel and the grid differ.

use tandem_core::quant_layout::QuantLayout;
use tandem_core::Result;

use cudarc::driver::CudaFunction;

use crate::device::CudaBackend;
use crate::error::err;
use crate::kernels::Kernel;
use crate::launch::u32_of;

/// Output columns a block and warps a block (kernels/quant_mma.cu `QT_BN`, `QT_WARPS`).
pub(crate) const QT_BN: usize = 64;
pub(crate) const QT_WARPS: usize = 4;

/// The row tiles, by [`Kernels::quant_mma`](crate::kernels::Kernels)'s second index.
pub(crate) const QT_TILES: [usize; 2] = [16, 64];

/// How many layouts kernels/quant_mma.cu runs: FP8 e4m3, int4 groups of 32, 64 and 128, GGUF
/// Q8_0, Q4_0, Q6_K, Q4_1, Q5_0, Q5_1, Q4_K and Q5_K.
pub(crate) const QUANT_MMA_KINDS: usize = 12;

/// Where `layout`'s kernels are in the quant_mma table; None for a layout only the GEMV runs.
pub(crate) fn mma_index(layout: QuantLayout) -> Option<usize> {
    match layout {
        QuantLayout::Fp8E4m3(_) => Some(0),
        QuantLayout::Int4Group { group: 32 } => Some(1),
        QuantLayout::Int4Group { group: 64 } => Some(2),
        QuantLayout::Int4Group { group: 128 } => Some(3),
        QuantLayout::Q8_0 => Some(4),
        QuantLayout::Q4_0 => Some(5),
        QuantLayout::Q6K => Some(6),
        QuantLayout::Q4_1 => Some(7),
        QuantLayout::Q5_0 => Some(8),
        QuantLayout::Q5_1 => Some(9),
        QuantLayout::Q4K => Some(10),
        QuantLayout::Q5K => Some(11),
        _ => None,
    }
}

/// A launch of one of the kernels: the kernel, its grid, its block's threads.
pub(crate) type QuantLaunch<'a> = (&'a Kernel<CudaFunction>, (u32, u32, u32), u32);

/// The row tile of an m-row matmul: its index in [`QT_TILES`].
pub(crate) fn tile_index(m: usize) -> usize {
    if m <= QT_TILES[0] {
        0
    } else {
        1
    }
}

impl CudaBackend {
    /// The tensor-core kernel and its grid and block for an m x n matmul on `layout`, where the
    /// switch is on and the layout has one; None: the GEMV runs it.
    pub(crate) fn quant_mma_plan(
        &self,
        op: &str,
        layout: QuantLayout,
        m: usize,
        n: usize,
    ) -> Result<Option<QuantLaunch<'_>>> {
        if !self.switches.quant_tc {
            return Ok(None);
        }
        if let Some(plan) = self.quant_mma_w8a8_plan(op, layout, m, n)? {
            return Ok(Some(plan));
        }
        let Some(ki) = mma_index(layout) else { return Ok(None) };
        tile_launch(&self.kernels.quant_mma[ki], op, m, n, QT_BN, QT_WARPS).map(Some)
    }
}

/// The launch of an m x n matmul on a family's row-tile kernels (`kernels` by [`QT_TILES`]):
/// the tile [`tile_index`] picks, a block of `warps` warps a `bn`-column by tile-row block.
pub(crate) fn tile_launch<'a>(
    kernels: &'a [Kernel<CudaFunction>; 2],
    op: &str,
    m: usize,
    n: usize,
    bn: usize,
    warps: usize,
) -> Result<QuantLaunch<'a>> {
    let ti = tile_index(m);
    let grid = (u32_of(n.div_ceil(bn), op, "blocks")?, u32_of(m.div_ceil(QT_TILES[ti]), op, "blocks")?, 1);
    if grid.1 > 65535 {
        return Err(err(format!("{op}: m = {m} needs more than 65535 row blocks")));
    }
    Ok((&kernels[ti], grid, (32 * warps) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_core::quant_layout::Fp8Scales;

    /// The constants match the kernel file, each layout with a kernel finds one, and the
    /// tile switches at 16 rows.
    #[test]
    fn constants_follow_the_kernel() {
        let src = include_str!("../../../kernels/quant_mma.cu");
        assert!(src.contains(&format!("#define QT_BN {QT_BN}\n")));
        assert!(src.contains(&format!("#define QT_WARPS {QT_WARPS}\n")));
        for bm in QT_TILES {
            assert!(src.contains(&format!("QUANT_MMA_KERNEL(fp8, QT_FP8, 32, {bm})")), "{bm}");
            for g in QuantLayout::INT4_GROUPS_CUDA {
                assert!(src.contains(&format!("QUANT_MMA_KERNEL(int4_g{g}, QT_INT4, {g}, {bm})")), "{g} {bm}");
            }
        }
        assert_eq!(mma_index(QuantLayout::Fp8E4m3(Fp8Scales::Block)), Some(0));
        for (i, g) in QuantLayout::INT4_GROUPS_CUDA.into_iter().enumerate() {
            assert_eq!(mma_index(QuantLayout::Int4Group { group: g }), Some(1 + i), "{g}");
        }
        assert_eq!(mma_index(QuantLayout::Int4Group { group: 256 }), None);
        let gguf = [
            (QuantLayout::Q8_0, 4, 32),
            (QuantLayout::Q4_0, 5, 32),
            (QuantLayout::Q6K, 6, 16),
            (QuantLayout::Q4_1, 7, 32),
            (QuantLayout::Q5_0, 8, 32),
            (QuantLayout::Q5_1, 9, 32),
            (QuantLayout::Q4K, 10, 32),
            (QuantLayout::Q5K, 11, 32),
        ];
        assert_eq!(gguf.len(), QuantLayout::GGUF.len());
        for (l, i, group) in gguf {
            assert_eq!(mma_index(l), Some(i), "{l:?}");
            let name = l.name().to_lowercase();
            for bm in QT_TILES {
                assert!(src.contains(&format!("QUANT_MMA_KERNEL({name}, QT_{}, {group}, {bm})", l.name())), "{l:?}");
            }
        }
        assert_eq!((tile_index(1), tile_index(16), tile_index(17), tile_index(4096)), (0, 0, 1, 1));
    }
}
