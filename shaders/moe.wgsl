// moe: a mixture of experts' routing and its weighted combine (crates/core/src/backend.rs,
// `moe_route` and `moe_accumulate`; `moe_route_rows` and `moe_accumulate_rows` are the host
// arithmetic these repeat).
// Check: cargo test -p tandem-cli --test cli -- ops_wgpu (the conformance suite's moe cases)

struct Params {
    a: u32, // moe_route: rows;        moe_accumulate: len = rows * dim
    b: u32, // moe_route: experts;     moe_accumulate: dim
    c: u32, // moe_route: top_k;       moe_accumulate: expert
    d: u32, // moe_route: renormalize; moe_accumulate: experts
    e: u32, //                         moe_accumulate: first (1: overwrite)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;       // [rows, experts]
@group(0) @binding(2) var<storage, read_write> weights: array<f32>; // [rows, experts]

// One invocation per row: softmax over the row (max subtracted, summed in index order), then
// top_k times the largest probability not yet taken (lowest index on ties; untaken entries
// hold -1 meanwhile), renormalised by the taken ones' sum (in the order taken) if asked.
@compute @workgroup_size(64)
fn moe_route(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) li: u32) {
    let r = (wg.y * nwg.x + wg.x) * 64u + li;
    if (r >= p.a) {
        return;
    }
    let n = p.b;
    let base = r * n;
    var m = logits[base];
    for (var i = 1u; i < n; i++) {
        m = max(m, logits[base + i]);
    }
    var s = 0.0;
    for (var i = 0u; i < n; i++) {
        s += exp(logits[base + i] - m);
        weights[base + i] = -1.0;
    }
    var sum = 0.0;
    for (var k = 0u; k < min(p.c, n); k++) {
        var best = n;
        var bp = 0.0;
        for (var i = 0u; i < n; i++) {
            if (weights[base + i] < 0.0) {
                let pi = exp(logits[base + i] - m) / s;
                if (best == n || pi > bp) {
                    best = i;
                    bp = pi;
                }
            }
        }
        weights[base + best] = bp;
        sum += bp;
    }
    for (var i = 0u; i < n; i++) {
        let w = weights[base + i];
        if (w < 0.0) {
            weights[base + i] = 0.0;
        } else if (p.d != 0u) {
            weights[base + i] = w / sum;
        }
    }
}

@group(0) @binding(1) var<storage, read_write> acc: array<f32>; // [rows, dim]
@group(0) @binding(2) var<storage, read> y: array<f32>;         // [rows, dim]
@group(0) @binding(3) var<storage, read> route: array<f32>;     // [rows, experts]

// One invocation per element: acc = w * y (first) or acc + w * y, w the row's weight of this expert.
@compute @workgroup_size(64)
fn moe_accumulate(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.a) {
        return;
    }
    let w = route[(i / p.b) * p.d + p.c];
    let v = w * y[i];
    if (p.e != 0u) {
        acc[i] = v;
    } else {
        acc[i] = acc[i] + v;
    }
}
