//! FP8 e4m3 weights kept in 8 bits (`tandem_core::fp8::pack_blocks`: runs of 32 values of a
//! row, each its f32 scale then its bytes) for the `quant_matmul` op: random weights whose
//! scales follow each of the three layouts checkpoints use (one scale for the tensor, one per
//! output row, one per 128 x 128 block), made by quantizing random values as an FP8 checkpoint
//! is made (a scale maps its block's largest |w| to 448), then packed by the loader's own code.

use tandem_core::fp8::{pack_blocks, Fp8Format, BLOCK_ELEMS};
use tandem_core::quant_layout::Fp8Scales;

use crate::rng::Rng;

/// e4m3's largest finite value.
const E4M3_MAX: f32 = 448.0;

/// The block a scale of `scales` covers on a `[rows, k]` weight.
fn block_of(scales: Fp8Scales, rows: usize, k: usize) -> [usize; 2] {
    match scales {
        Fp8Scales::Tensor => [rows, k],
        Fp8Scales::Channel => [1, k],
        Fp8Scales::Block => [128, 128],
    }
}

/// The nearest finite e4m3 byte to `x` (|x| <= 448; ties to the even code).
fn encode(x: f32, table: &[f32; 256]) -> u8 {
    let a = x.abs().min(E4M3_MAX);
    let i = table[..0x7f].partition_point(|&v| v < a);
    let code = if i == 0 || table[i] == a {
        i
    } else {
        let (lo, hi) = (a - table[i - 1], table[i] - a);
        if lo < hi || (lo == hi && (i - 1) % 2 == 0) {
            i - 1
        } else {
            i
        }
    };
    code as u8 | if x.is_sign_negative() { 0x80 } else { 0 }
}

/// `blocks` kept runs of a weight with rows of `k` values (so `blocks * 32 / k` rows) whose
/// values are normal of deviation 1 / √k, quantized with `scales`' grid.
pub fn random_fp8_blocks(scales: Fp8Scales, blocks: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let rows = blocks * BLOCK_ELEMS / k;
    let w = rng.normals(rows * k, 1.0 / (k as f32).sqrt());
    let [br, bc] = block_of(scales, rows, k);
    let grid_cols = k.div_ceil(bc);
    let mut scale = vec![0f32; rows.div_ceil(br) * grid_cols];
    for (i, v) in w.iter().enumerate() {
        let s = &mut scale[(i / k / br) * grid_cols + (i % k) / bc];
        *s = s.max(v.abs() / E4M3_MAX);
    }
    let table = Fp8Format::E4M3.table();
    let q: Vec<u8> = w
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let s = scale[(i / k / br) * grid_cols + (i % k) / bc];
            if s > 0.0 {
                encode(v / s, &table)
            } else {
                0
            }
        })
        .collect();
    pack_blocks(&q, rows, k, &scale, [br, bc]).expect("k is whole runs and the blocks are whole runs")
}
