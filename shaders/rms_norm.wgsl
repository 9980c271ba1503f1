// rms_norm: out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w
//   x, out f32 [rows, dim]; w weight [dim] (via the prelude's `w_at`).
// One workgroup of 64 per row: each lane sums the squares of a strided slice, then every lane
// adds the 64 partial sums itself (one barrier; cheaper than a tree on software Vulkan).
// Check: cargo test -p tandem-wgpu --test ops -- rms_norm

struct Params {
    rows: u32,
    dim: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;         // [rows, dim]
@group(0) @binding(2) var<storage, read> w: array<w_t>;         // [dim]
@group(0) @binding(3) var<storage, read_write> out: array<f32>; // [rows, dim]

var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn rms_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let row = wg.y * nwg.x + wg.x;
    // Uniform over the workgroup, so the barrier below is reached by all or none.
    if (row >= p.rows) {
        return;
    }
    let base = row * p.dim;
    var s = 0.0;
    for (var i = li; i < p.dim; i += 64u) {
        let v = x[base + i];
        s += v * v;
    }
    partial[li] = s;
    workgroupBarrier();
    var total = 0.0;
    for (var j = 0u; j < 64u; j++) {
        total += partial[j];
    }
    let inv = 1.0 / sqrt(total / f32(p.dim) + p.eps);
    for (var i = li; i < p.dim; i += 64u) {
        out[base + i] = x[base + i] * inv * w_at(i);
    }
}
