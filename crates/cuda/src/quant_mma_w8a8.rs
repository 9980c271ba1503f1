//! The launch plan of kernels/quant_mma_w8a8.cu: FP8 e4m3 weights times activations quantized
//! to e4m3 per token (W8A8, as vLLM runs FP8 checkpoints on sm_89+), on the fp8 tensor cores.
//! Picked by `TANDEM_CUDA_QUANT_TC=w8a8` ([`crate::switches`]) for FP8 weights on a GPU of
//! sm_89 or newer; below that the fp8 mma does not exist, and FP8 weights take
//! kernels/quant_mma.cu's W8A16 kernel instead, said once in the log.
//!
//! Off by default: rounding x to e4m3 costs up to 2^-4 of each element (bf16: 2^-9), its bits
//! are neither the GEMV's nor quant_mma.cu's, and no GPU has timed it. Batch invariance holds
//! by the kernel's contract (each row's scale from that row alone, one fold order per (n, k) for
//! both row tiles). The kernels take the GEMV's argument list, so
//! [`CudaBackend::quant_gemm`] launches them with the same arguments.

use std::sync::Once;

use tandem_core::quant_layout::QuantLayout;
use tandem_core::Result;

use crate::device::CudaBackend;
use crate::quant_mma::{tile_launch, QuantLaunch};

/// Output columns a block and warps a block (kernels/quant_mma_w8a8.cu `W8_BN`, `W8_WARPS`).
pub(crate) const W8_BN: usize = 64;
pub(crate) const W8_WARPS: usize = 4;

/// Whether a GPU of compute capability `arch` (`"89"`, `"90"`, `"120"`: major then minor) has
/// the e4m3 mma.sync (sm_89 and newer).
pub(crate) fn has_fp8_mma(arch: &str) -> bool {
    arch.parse::<u32>().is_ok_and(|a| a >= 89)
}

impl CudaBackend {
    /// The W8A8 kernel and its grid and block for an m x n matmul on `layout`, where the switch
    /// says w8a8, the layout is FP8 and the GPU has the fp8 mma; None: another kernel runs it.
    pub(crate) fn quant_mma_w8a8_plan(
        &self,
        op: &str,
        layout: QuantLayout,
        m: usize,
        n: usize,
    ) -> Result<Option<QuantLaunch<'_>>> {
        if !self.switches.quant_w8a8 || !matches!(layout, QuantLayout::Fp8E4m3(_)) {
            return Ok(None);
        }
        if !has_fp8_mma(&self.arch) {
            static SAID: Once = Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    "TANDEM_CUDA_QUANT_TC=w8a8: the GPU is sm_{}, below sm_89 (no fp8 mma); FP8 weights run as \
                     W8A16 (kernels/quant_mma.cu)",
                    self.arch
                )
            });
            return Ok(None);
        }
        tile_launch(&self.kernels.quant_mma_w8a8, op, m, n, W8_BN, W8_WARPS).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant_mma::QT_TILES;

    /// The constants match the kernel file, both row tiles have a kernel, and sm_89 is where
    /// the fp8 mma starts.
    #[test]
    fn constants_follow_the_kernel() {
        let src = include_str!("../../../kernels/quant_mma_w8a8.cu");
        assert!(src.contains(&format!("#define W8_BN {W8_BN}\n")));
        assert!(src.contains(&format!("#define W8_WARPS {W8_WARPS}\n")));
        assert!(src.contains("__CUDA_ARCH__ >= 890"));
        for bm in QT_TILES {
            assert!(src.contains(&format!("QUANT_MMA_W8A8_KERNEL({bm})")), "{bm}");
        }
        for (arch, fp8) in [("80", false), ("86", false), ("87", false), ("89", true), ("90", true), ("120", true)] {
            assert_eq!(has_fp8_mma(arch), fp8, "{arch}");
        }
        assert!(!has_fp8_mma("not a number"));
    }
}
