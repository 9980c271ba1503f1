// quant_matmul: out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) with w kept in a GGUF block
// layout (quant_block.wgsl decodes it; the prelude picks the layout).
//   x f32 [m, k] as vec4s (k a multiple of the block, so of 32); qw the weight's bytes as u32
//   words, row r's blocks from byte r * p.row_bytes; out f32 [m, n]; bias weight [n] (the
//   prelude declares it and `bias_at`, or makes `bias_at` return 0).
// A weight larger than one storage binding is bound in row chunks: this dispatch sees rows
// [n0, n0 + rows) of w and writes those columns of out.
// One invocation per (output column, block of MT rows of x): it walks its weight row once,
// decoding four values at a time in registers, and each decoded value serves MT rows of x
// (MT = 1 at decode, more for a prefill: the weight is decoded once per MT tokens). No
// workgroup memory and no barriers.
// Batch invariance: every accumulator sums its row's products in the same order (k ascending,
// four at a time through `dot`) whatever MT, m or the other rows, so a row's result does not
// depend on the batch it is in (as matmul.wgsl).
// Check: cargo test -p tandem-wgpu --test ops -- quant

struct Params {
    m: u32,
    n: u32,
    k: u32,
    row_bytes: u32,
    n0: u32,   // this dispatch's first weight row (a weight larger than one binding is bound in row chunks)
    rows: u32, // weight rows bound
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;    // [m, k / 4]
@group(0) @binding(2) var<storage, read> qw: array<u32>;         // the blocks
@group(0) @binding(3) var<storage, read_write> out: array<f32>;  // [m, n]
// binding 4: bias [n], declared by the prelude when given

@compute @workgroup_size(WG)
fn quant_matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wg.x * WG + li;
    let col = p.n0 + r;
    let m0 = wg.y * MT;
    if (r >= p.rows) {
        return;
    }
    let k4 = p.k / 4u;
    var acc: array<f32, MT>;
    var xrow: array<u32, MT>;
    for (var mi = 0u; mi < MT; mi++) {
        // Rows past m repeat the last row; their results are not written.
        xrow[mi] = min(m0 + mi, p.m - 1u) * k4;
        acc[mi] = 0.0;
    }
    let row = r * p.row_bytes;
    let blocks = p.k / BLOCK_ELEMS;
    for (var b = 0u; b < blocks; b++) {
        let base = row + b * BLOCK_BYTES;
        let x0 = b * (BLOCK_ELEMS / 4u);
        for (var e = 0u; e < BLOCK_ELEMS; e += 4u) {
            let wv = decode4(base, e);
            let xo = x0 + (e >> 2u);
            for (var mi = 0u; mi < MT; mi++) {
                acc[mi] += dot(x[xrow[mi] + xo], wv);
            }
        }
    }
    let bias = bias_at(col);
    for (var mi = 0u; mi < MT; mi++) {
        if (m0 + mi < p.m) {
            out[(m0 + mi) * p.n + col] = acc[mi] + bias;
        }
    }
}
