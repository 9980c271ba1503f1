// matmul: out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n])    (y = x W^T, torch.nn.Linear)
//   x f32 [m, k] (bound as vec4s by the prelude, which defines `x4(i)`: a storage buffer, or
//   a 64 KiB uniform window holding the dispatch's block of rows, whose same-address loads a
//   CPU-side Vulkan serves with one scalar load instead of one per lane); w weight [n, k] (bound as vec4s, read
//   by (row, column) through the prelude's `w_at_rc` / `w_oct_rc`, which hide whether it is
//   row-major or tiled: tiled, the lanes' rows of one step lie side by side); out f32 [m, n];
//   bias weight [n] (the prelude declares it and `bias_at`, or makes `bias_at` return 0).
// A weight larger than one storage binding is bound in row chunks: this dispatch sees rows
// [n0, n0 + rows) of w and writes those columns of out.
//
// One invocation per (RT output columns, block of MT rows of x): it walks its RT weight rows
// once and keeps MT x RT accumulators, so each weight element loaded serves MT tokens and each
// x element loaded serves RT columns (MT, RT come from the prelude: MT = 1, RT = 4 for decode
// at batch 1; MT = 4, RT = 4 from three rows up). Lanes of a workgroup share the same
// x rows, so the x loads are uniform; no workgroup memory and no barriers, which is what a
// CPU-side Vulkan (lavapipe) runs fastest. When k is a multiple of 8 every load brings 16
// bytes (eight bf16 weights, four x values): lavapipe pays per load instruction and lane.
// Workgroups of WG lanes (prelude). Grid: x = ceil(rows / (WG RT)), y = ceil(m / MT).
// Results go through the prelude's `store_out(row, col, v)`: out[row, col], or for a fused
// q/k/v weight the q, k or v output the column falls in; with `PAIRS` (a fused gate/up weight)
// each output is silu(gate) * up (with `GELU` gelu_tanh(gate) * up: the prelude's functions,
// silu_mul.wgsl's) of two of the lane's rows (see the end).
// With `KV_STAGE` (ROPE into caches kept in textures) the K and V rows go through workgroup
// memory, one barrier, and `kv_stage_flush` stores them a texel (four rows) at a time.
// With `NORM` (the prelude's `norm_in`), x is h * gamma and each row's results are scaled by
// 1 / rms of h's row (`norm_prologue`, before anything returns: it has a barrier) before the
// bias: the projection of rms_norm(h) * gamma.
// Check: cargo test -p tandem-wgpu --test ops -- matmul

struct Params {
    m: u32,      // rows of x in this dispatch (x is bound from its first one)
    n: u32,
    k: u32,
    n0: u32,
    rows: u32,
    out_row0: u32, // row of out that x's first bound row writes
    eps: f32,      // the input norm's (NORM)
    num_slots: u32, // the KV cache's (ROPE)
}

@group(0) @binding(0) var<uniform> p: Params;
// binding 1: x [m, k / 4], declared by the prelude
// binding 2: w [rows, k] (this chunk), declared by the prelude (a buffer or a texture)
@group(0) @binding(3) var<storage, read_write> out: array<f32>; // [m, n]

@compute @workgroup_size(WG)
fn matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    // This invocation's rows of w: RT of them, WG apart, so each x load serves RT rows.
    let r0 = wg.x * WG * RT + li;
    let m0 = wg.y * MT;
    var norm_inv: array<f32, MT>;
    if (NORM) {
        norm_inv = norm_prologue(li, p.out_row0 + m0, p.out_row0 + p.m - 1u);
    }
    // With KV_STAGE the epilogue has a barrier: every lane goes on (rows past the end are
    // clamped below and never stored).
    if (r0 >= p.rows && !KV_STAGE) {
        return;
    }
    var acc: array<f32, MT * RT>;
    var xrow: array<u32, MT>;
    var wrow: array<u32, RT>;
    for (var mi = 0u; mi < MT; mi++) {
        // Rows past m repeat the last row; their results are not written.
        xrow[mi] = min(m0 + mi, p.m - 1u) * p.k;
    }
    for (var t = 0u; t < RT; t++) {
        // Rows past the chunk repeat its last row; their results are not written.
        wrow[t] = min(r0 + t * WG, p.rows - 1u);
    }
    for (var i = 0u; i < MT * RT; i++) {
        acc[i] = 0.0;
    }
    if ((p.k & 7u) == 0u) {
        for (var j = 0u; j < p.k; j += 8u) {
            var wv: array<mat2x4<f32>, RT>;
            for (var t = 0u; t < RT; t++) {
                wv[t] = w_oct_rc(wrow[t], j, p.k);
            }
            for (var mi = 0u; mi < MT; mi++) {
                let o = (xrow[mi] + j) >> 2u;
                let x0 = x4(o);
                let x1 = x4(o + 1u);
                for (var t = 0u; t < RT; t++) {
                    acc[mi * RT + t] += dot(x0, wv[t][0]) + dot(x1, wv[t][1]);
                }
            }
        }
    } else {
        for (var j = 0u; j < p.k; j++) {
            for (var mi = 0u; mi < MT; mi++) {
                let o = xrow[mi] + j;
                let xv = x4(o >> 2u)[o & 3u];
                for (var t = 0u; t < RT; t++) {
                    acc[mi * RT + t] += xv * w_at_rc(wrow[t], j, p.k);
                }
            }
        }
    }
    if (NORM) {
        for (var mi = 0u; mi < MT; mi++) {
            for (var t = 0u; t < RT; t++) {
                acc[mi * RT + t] *= norm_inv[mi];
            }
        }
    }
    if (PAIRS) {
        // A fused gate/up weight (MatmulOut::GateUp): each block of WG * RT rows holds WG * RT / 2
        // gate rows then the up rows of the same outputs, so this lane's rows t and t + RT / 2
        // are the gate and up rows of output column wg.x * WG * RT / 2 + t * WG + li (p.n
        // columns; the weight's rows past them are zero padding).
        for (var t = 0u; t < RT / 2u; t++) {
            let col = wg.x * WG * (RT / 2u) + t * WG + li;
            if (col < p.n) {
                for (var mi = 0u; mi < MT; mi++) {
                    if (m0 + mi < p.m) {
                        let g = acc[mi * RT + t];
                        let u = acc[mi * RT + t + RT / 2u];
                        if (GELU) {
                            store_out(p.out_row0 + m0 + mi, col, gelu_tanh(g) * u);
                        } else {
                            store_out(p.out_row0 + m0 + mi, col, silu(g) * u);
                        }
                    }
                }
            }
        }
        return;
    }
    if (ROPE) {
        // A fused q/k/v weight with rope and the KV write (MatmulOut::SplitRope): every head's
        // rows lie in one lane (head_dim divides WG * RT, and HALF is a multiple of WG), so
        // the rope partner of row r (element i < HALF of its head) is this lane's row
        // t + HALF / WG. Each pair is stored once, from its first row.
        for (var t = 0u; t < RT; t++) {
            let r = r0 + t * WG;
            let i = (t * WG) % (2u * HALF) + li;
            if (i < HALF && r < p.rows) {
                let b1 = bias_at(r);
                let b2 = bias_at(r + HALF);
                for (var mi = 0u; mi < MT; mi++) {
                    if (m0 + mi < p.m) {
                        store_rope(p.out_row0 + m0 + mi, r, i, acc[mi * RT + t] + b1, acc[mi * RT + t + HALF / WG] + b2, mi * WG * RT + t * WG + li);
                    }
                }
            }
        }
        if (KV_STAGE) {
            // Caches in textures (a texel is four rows, in four lanes): staged, then stored.
            workgroupBarrier();
            kv_stage_flush(wg.x * WG * RT, m0, li);
        }
        return;
    }
    for (var t = 0u; t < RT; t++) {
        let r = r0 + t * WG;
        if (r < p.rows) {
            let b = bias_at(p.n0 + r);
            for (var mi = 0u; mi < MT; mi++) {
                if (m0 + mi < p.m) {
                    store_out(p.out_row0 + m0 + mi, p.n0 + r, acc[mi * RT + t] + b);
                }
            }
        }
    }
}
