// quant_split_matmul: out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) with w kept quantized in
// the split layout (crates/wgpu/src/quant_split.rs; shaders/quant_split.wgsl decodes it).
//   x f32 [m, k] as vec4s, read by the prelude's `x4(i)` (a storage buffer, or at decode a
//   uniform window: lavapipe loads a uniform operand once for all lanes); qw the split rows,
//   tiled and held in a texture (the prelude declares it and `q_unit(i)`, unit i of the tiled
//   layout); out f32 [m, n]; bias weight [n] (the prelude declares it and `bias_at`, or makes
//   `bias_at` return 0).
// One invocation per (RT output columns, block of MT rows of x): the workgroup's WG lanes take
// RT runs of WG consecutive weight rows (lane li: rows li, li + WG, ...), so at each step the
// lanes' loads lie side by side in the tiled layout. For each block an invocation loads the
// header's unit once and each unit of quants once per row (aligned texels; Q6_K's scales unit
// once a block, Q5_K's / Q6_K's units of high bits once for the sub-blocks they serve), takes
// the unit's scales (`split_sub`: the block's, or a K-quant sub-block's), decodes four values
// at a time in registers, and each value serves the MT rows of x, each x vec4 the RT rows (at
// decode, RT > 1 is what keeps the x loads from dominating). The loops inside a block have
// constant trip counts (RT, QU, VJ, MT), so the driver can unroll them.
// Batch invariance: every accumulator sums its row's products in the same order (k ascending,
// four at a time through `dot`) whatever MT, m or the other rows, and in the order
// quant_matmul.wgsl sums them.
// Check: cargo test -p tandem-wgpu --test wgpu quant::

struct Params {
    m: u32,
    n: u32,
    k: u32,
    units: u32,   // units of a split row
    q_units: u32, // units of a row's quants (its headers start there)
}

@group(0) @binding(0) var<uniform> p: Params;
// binding 1: x (prelude: `x4(i)`)
// binding 2: qw, the texture (prelude)
@group(0) @binding(3) var<storage, read_write> out: array<f32>;  // [m, n]
// binding 4: bias [n], declared by the prelude when given

// Unit u of split row r in the tiled layout (crates/wgpu/src/buffer.rs `Tiled`, 64 rows a tile).
fn unit_at(r: u32, u: u32) -> vec4<u32> {
    return q_unit((((r >> 6u) * p.units + u) << 6u) | (r & 63u));
}

@compute @workgroup_size(WG)
fn quant_split_matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r0 = wg.x * WG * RT + li;
    let m0 = wg.y * MT;
    if (r0 >= p.n) {
        return;
    }
    let k4 = p.k / 4u;
    var acc: array<f32, MT * RT>;
    var xrow: array<u32, MT>;
    var row: array<u32, RT>;
    for (var mi = 0u; mi < MT; mi++) {
        // Rows past m repeat the last row; their results are not written.
        xrow[mi] = min(m0 + mi, p.m - 1u) * k4;
    }
    for (var t = 0u; t < RT; t++) {
        // Rows past n repeat the last row; their results are not written.
        row[t] = min(r0 + t * WG, p.n - 1u);
    }
    for (var i = 0u; i < MT * RT; i++) {
        acc[i] = 0.0;
    }
    let blocks = p.k / BLOCK_ELEMS;
    for (var b = 0u; b < blocks; b++) {
        let hh = b * HH;
        var hd: array<vec4<u32>, RT>;
        var hs: array<vec4<u32>, RT>;
        var hv: array<vec2<f32>, RT>;
        var hb: array<u32, RT>;
        for (var t = 0u; t < RT; t++) {
            hd[t] = unit_at(row[t], p.q_units + (hh >> 3u));
            hv[t] = split_head(hd[t], hh & 7u);
            hb[t] = split_bits(hd[t], hh & 7u);
            hs[t] = hd[t];
            if (SCALE_UNIT) {
                hs[t] = unit_at(row[t], b * QS + QS - 1u);
            }
        }
        var ta: array<vec4<u32>, RT>;
        for (var u = 0u; u < QU; u++) {
            var tu: array<vec4<u32>, RT>;
            var sv: array<vec2<f32>, RT>;
            var hx: array<vec2<u32>, RT>;
            for (var t = 0u; t < RT; t++) {
                tu[t] = unit_at(row[t], b * QS + u);
                // A unit of high bits serves SUBS_PER_HIGH sub-blocks: loaded at the first.
                if (HIGH_UNITS && u % SUBS_PER_HIGH == 0u) {
                    ta[t] = unit_at(row[t], b * QS + QU + u / SUBS_PER_HIGH);
                }
                sv[t] = split_sub(hs[t], hv[t], u);
                hx[t] = split_high(hb[t], ta[t], u);
            }
            let x0 = (b * QU + u) * VJ;
            for (var j = 0u; j < VJ; j++) {
                for (var mi = 0u; mi < MT; mi++) {
                    let xv = x4(xrow[mi] + x0 + j);
                    for (var t = 0u; t < RT; t++) {
                        acc[mi * RT + t] += dot(xv, split4(sv[t], hx[t], tu[t], j));
                    }
                }
            }
        }
    }
    for (var t = 0u; t < RT; t++) {
        let r = r0 + t * WG;
        if (r < p.n) {
            let bias = bias_at(r);
            for (var mi = 0u; mi < MT; mi++) {
                if (m0 + mi < p.m) {
                    out[(m0 + mi) * p.n + r] = acc[mi * RT + t] + bias;
                }
            }
        }
    }
}
