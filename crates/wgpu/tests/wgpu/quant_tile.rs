//! The prefill tile kernel of quantized weights (src/backend/quant_tile.rs,
//! shaders/quant_tile.wgsl), turned on here from 8 rows of x up (`WgpuOptions::quant_tile_m`;
//! it is off by default): every row of its result is the bits of the same row computed alone
//! (m = 1, the GEMV kernels), for the layouts whose tile pipelines lavapipe compiles in
//! seconds (Q8_0, Q4_0, Q5_0; Q4_1, Q5_1 and Q4_K took 100-150 s each, see
//! docs/results/2026-12-07-wgpu-quant-prefill), in either form the weight takes (the split layout in a texture, the
//! file's blocks in a buffer, bound whole or in row chunks), with and without a bias, at m
//! around the threshold and past one workgroup's rows, and for n and k that are not whole tiles.

use crate::common;

use std::path::PathBuf;

use common::Rng;
use tandem_core::backend::prelude::*;
use tandem_core::quant_layout::QuantLayout;
use tandem_core::weights::Weights;
use tandem_core::DType;
use tandem_wgpu::{WgpuBackend, WgpuBuf, WgpuOptions};

/// The layouts checked (see the module docs).
fn layouts() -> Vec<QuantLayout> {
    vec![QuantLayout::Q8_0, QuantLayout::Q4_0, QuantLayout::Q5_0]
}

/// A backend with the tile kernel from 8 rows up.
fn tiled(opts: WgpuOptions) -> Option<WgpuBackend> {
    common::open(WgpuOptions { quant_tile_m: Some(8), ..opts })
}

fn upload(b: &WgpuBackend, layout: QuantLayout, n: usize, k: usize, bytes: &[u8]) -> WgpuBuf {
    let mut ws = Weights::empty();
    ws.insert_quantized("w", layout, &[n, k], bytes, PathBuf::from("<test>")).unwrap();
    b.upload_weight(&ws.get("w", &[n, k]).unwrap()).unwrap()
}

fn matmul(b: &WgpuBackend, x: &[f32], w: &WgpuBuf, bias: Option<&WgpuBuf>, m: usize, n: usize, k: usize) -> Vec<u32> {
    let mut xb = b.alloc_f32(m * k).unwrap();
    b.write_f32(&mut xb, &x[..m * k]).unwrap();
    let mut out = b.alloc_f32(m * n).unwrap();
    b.write_f32(&mut out, &vec![common::POISON; m * n]).unwrap();
    b.matmul(&xb, w, bias, &mut out, m, n, k).unwrap();
    b.read_f32(&out, m * n).unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Every row of an m-row matmul (the tile kernel from the threshold up) against the same row
/// alone.
fn check(
    b: &WgpuBackend,
    what: &str,
    layouts: &[QuantLayout],
    shapes: &[(usize, usize)],
    ms: &[usize],
    with_bias: bool,
) {
    let mut rng = Rng::new("quant tile");
    for &layout in layouts {
        for &(n, k) in shapes {
            if !k.is_multiple_of(layout.block_elems()) {
                continue;
            }
            let bytes = crate::quant::random_blocks(layout, n * k / layout.block_elems(), &mut rng);
            let w = upload(b, layout, n, k, &bytes);
            let bias_vals = rng.vec(n, 1.0);
            let bias = b.weight_from_f32(DType::BF16, &bias_vals).unwrap();
            let mmax = ms.iter().copied().max().unwrap();
            let x = rng.vec(mmax * k, 1.0);
            for bias in [None, Some(&bias)].into_iter().take(1 + usize::from(with_bias)) {
                let alone: Vec<Vec<u32>> = (0..mmax).map(|r| matmul(b, &x[r * k..], &w, bias, 1, n, k)).collect();
                for &m in ms {
                    let got = matmul(b, &x, &w, bias, m, n, k);
                    for (r, want) in alone.iter().take(m).enumerate() {
                        assert_eq!(
                            &got[r * n..(r + 1) * n],
                            &want[..],
                            "{what}: {} n {n} k {k} m {m} row {r} bias {}",
                            layout.name(),
                            bias.is_some()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn the_tile_kernel_gives_the_bits_of_one_row_at_a_time() {
    let Some(b) = tiled(WgpuOptions::default()) else { return };
    let b = &b;
    // n = 70: two whole tiles of 32 weight rows and a part; k = 512: 64-value steps, 288: 32.
    check(b, "default", &layouts(), &[(70, 512)], &[7, 8, 33], false);
    check(b, "bias, k of 32-value steps", &[QuantLayout::Q8_0, QuantLayout::Q4_0], &[(40, 288)], &[9, 40], true);
}

#[test]
fn the_tile_kernel_reads_a_weight_in_a_buffer_whole_or_in_row_chunks() {
    let Some(plain) = tiled(WgpuOptions { texel_weights: Some(false), ..Default::default() }) else {
        return;
    };
    check(&plain, "buffer", &layouts(), &[(70, 512)], &[8, 37], false);
    let Some(chunked) =
        tiled(WgpuOptions { texel_weights: Some(false), max_storage_binding: Some(16384), ..Default::default() })
    else {
        return;
    };
    check(&chunked, "row chunks", &[QuantLayout::Q8_0, QuantLayout::Q5_0], &[(301, 256)], &[9, 12], true);
}
