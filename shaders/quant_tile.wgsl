// quant_tile: out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) with w kept quantized, for a
// prefill (many rows of x): a workgroup decodes a tile of TN weight rows x KC values once into
// workgroup memory and every lane (one row of x each, TM lanes) uses it, so each weight value
// is decoded once per TM rows of x instead of once per row block of quant_matmul.wgsl.
//   x f32 [m, k] as vec4s; the weight through the prelude's `tile_w4(r, kk)`: values
//   kk..kk+3 of bound weight row r, decoded by shaders/quant_block.wgsl (`block_row4`, the
//   file's bytes in a buffer) or shaders/quant_split.wgsl (`split_row4`, the split layout in a
//   texture); out f32 [m, n]; bias weight [n] (the prelude declares it and `bias_at`, or makes
//   `bias_at` return 0).
// A weight larger than one storage binding is bound in row chunks: this dispatch sees rows
// [n0, n0 + rows) of w and writes those columns of out.
// One workgroup per (TN weight rows, TM rows of x). For each run of KC values of k the lanes
// decode the tile together (FILL vec4s each), meet at a barrier, and each lane adds the tile's
// products for its row of x to its TN accumulators; every lane reads the same tile entry at the
// same step, so on a CPU-side Vulkan the workgroup loads are uniform. Rows past m and weight
// rows past the chunk repeat the last one (no lane returns early: the barriers need them all);
// their results are not written.
// Batch invariance and the bits of the other kernels: every accumulator sums its row's products
// in the order quant_matmul.wgsl and quant_split_matmul.wgsl sum them (k ascending, four at a
// time through `dot`, the bias added last), of the same decoded values, so a row's result is
// the same bits whichever kernel ran and whatever the batch.
// Check: cargo test -p tandem-wgpu --test wgpu quant

struct Params {
    m: u32,
    n: u32,
    k: u32,
    row_bytes: u32, // bytes of a row of blocks (buffer), or units of a split row (texture)
    q_units: u32,   // units of a split row's quants (its headers start there)
    n0: u32,        // this dispatch's first weight row
    rows: u32,      // weight rows bound
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;    // [m, k / 4]
// binding 2: the weight (prelude)
@group(0) @binding(3) var<storage, read_write> out: array<f32>;  // [m, n]
// binding 4: bias [n], declared by the prelude when given

const KC4: u32 = KC / 4u;
// Tile vec4s each lane decodes per run of k.
const FILL: u32 = TN * KC4 / TM;

// The decoded tile: weight row c's values kk..kk+KC-1 at [c * KC4, (c + 1) * KC4).
var<workgroup> wt: array<vec4<f32>, TN * KC4>;

@compute @workgroup_size(TM)
fn quant_tile(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let c0 = wg.x * TN;
    let row = wg.y * TM + li;
    let k4 = p.k / 4u;
    let xr = min(row, p.m - 1u) * k4;
    var acc: array<f32, TN>;
    for (var c = 0u; c < TN; c++) {
        acc[c] = 0.0;
    }
    for (var kk = 0u; kk < p.k; kk += KC) {
        for (var f = 0u; f < FILL; f++) {
            let i = f * TM + li;
            let c = i / KC4;
            wt[i] = tile_w4(min(c0 + c, p.rows - 1u), kk + 4u * (i - c * KC4));
        }
        workgroupBarrier();
        var xv: array<vec4<f32>, KC4>;
        for (var j = 0u; j < KC4; j++) {
            xv[j] = x[xr + kk / 4u + j];
        }
        for (var c = 0u; c < TN; c++) {
            var a = acc[c];
            for (var j = 0u; j < KC4; j++) {
                a += dot(xv[j], wt[c * KC4 + j]);
            }
            acc[c] = a;
        }
        workgroupBarrier();
    }
    if (row < p.m) {
        for (var c = 0u; c < TN; c++) {
            let r = c0 + c;
            if (r < p.rows) {
                let col = p.n0 + r;
                out[row * p.n + col] = acc[c] + bias_at(col);
            }
        }
    }
}
