//! Each kernel's machine code: the bytes of its `.text.<kernel>` section in the cubin ptxas 13.0
//! makes of today's kernels (sm_90; the wgmma kernels sm_90a), read with `readelf -S` from the
//! cubins `cargo xtask kernels` leaves (bf16 kernels; `tc` is tc_d64's, the timed one).
//! The performance model's fetch term: a kernel's code comes to each SM through its
//! instruction caches from L2, a cost of every launch that more warps do not hide.

/// The `.text` bytes of the kernel the model calls `name` (None: not measured, no fetch term:
/// the wgmma attention and quant_mma kernels, the multi-CTA sampler).
pub fn text_bytes(name: &str) -> Option<f64> {
    let b = match name {
        "m16" => 274_560,
        "m16_s8" => 428_928,
        "m16_x1" => 183_552,
        "m16_gemv4" => 173_568,
        "m16_gemv8" => 196_096,
        "m64" => 576_384,
        "m64_occ4" => 535_808,
        "m128" => 534_144,
        "m128_occ2" => 573_696,
        "m128_n128" => 969_984,
        "m128_w64" => 1_257_088,
        "wgmma" => 571_520,
        // matmul_wgmma_ws_bf16 (128 x 128 tiles); its 128 x 256 form is 66,304.
        "wgmma_ws" => 73_472,
        "moe_gemm_m16" => 73_984,
        "moe_gemm_m64" => 85_632,
        "tc" => 245_376,
        "tc_d256" => 293_120,
        "tc_deep" => 185_472,
        "tc_shared" => 229_632,
        "partial" => 41_088,
        "argmax" => 2_432,
        "argmax_multi" => 9_728,
        "sample_bisect" => 33_920,
        "sample_radix" => 55_552,
        "q4_k" => 26_624,
        "q8_0" => 24_576,
        "fp8" => 36_352,
        _ => return None,
    };
    Some(b as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf_cases::TILES;

    /// Every GEMM tile the lab can time has its code size: a tile without one would be
    /// predicted without the fetch term, cheaper than its peers for no reason.
    #[test]
    fn every_gemm_tile_has_its_code_size() {
        for t in TILES {
            assert!(text_bytes(t.kernel.name).is_some_and(|b| b > 0.0), "{}", t.kernel.name);
        }
        for name in ["wgmma", "wgmma_ws", "tc", "partial"] {
            assert!(text_bytes(name).is_some(), "{name}");
        }
        assert_eq!(text_bytes("no such kernel"), None);
    }
}
