// rms_norm: out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w
//   x, out f32 [rows, dim]; w weight [dim] (bound as vec4s; the prelude's `w_at`, `w_oct`).
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
@group(0) @binding(2) var<storage, read> w: array<w_t>;         // [dim] (16-byte words)
@group(0) @binding(3) var<storage, read_write> out: array<f32>; // [rows, dim]

var<workgroup> partial: array<f32, 64>;

// 1 / rms of a row whose squares sum to `sq`.
fn inv_rms(sq: f32) -> f32 {
    return 1.0 / sqrt(sq / f32(p.dim) + p.eps);
}

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
    let inv = inv_rms(total);
    for (var i = li; i < p.dim; i += 64u) {
        out[base + i] = x[base + i] * inv * w_at(i);
    }
}

// rms_norm_lane: the same with one invocation per row and 16-byte loads (dim % 8 == 0); no
// workgroup memory and no barrier. Chosen on CPU adapters, where those cost most.
@group(0) @binding(1) var<storage, read> x4: array<vec4<f32>>;         // [rows, dim / 4]
@group(0) @binding(3) var<storage, read_write> out4: array<vec4<f32>>; // [rows, dim / 4]

// The lane kernels' output: vec4s i and i + 1 of the row at `base`, (a, b) normed by inv and
// scaled by w (i even).
fn store_normed_pair(base: u32, i: u32, inv: f32, a: vec4<f32>, b: vec4<f32>) {
    let wv = w_oct(i * 4u);
    out4[base + i] = a * inv * wv[0];
    out4[base + i + 1u] = b * inv * wv[1];
}

@compute @workgroup_size(64)
fn rms_norm_lane(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) li: u32) {
    let row = (wg.y * nwg.x + wg.x) * 64u + li;
    if (row >= p.rows) {
        return;
    }
    let dv = p.dim / 4u;
    let base = row * dv;
    var s4 = vec4<f32>(0.0);
    for (var i = 0u; i < dv; i++) {
        let v = x4[base + i];
        s4 += v * v;
    }
    let inv = inv_rms(s4.x + s4.y + s4.z + s4.w);
    for (var i = 0u; i < dv; i += 2u) {
        store_normed_pair(base, i, inv, x4[base + i], x4[base + i + 1u]);
    }
}

// add_rms_norm_lane: the residual add and the norm after it in one pass, one invocation per
// row (dim % 8 == 0): acc[r, :] += x[r, :], then out[r, :] = rms_norm(acc[r, :]) * w. The
// model calls it after attention and after the MLP, so a layer launches two kernels fewer.
@group(0) @binding(1) var<storage, read_write> acc4: array<vec4<f32>>; // [rows, dim / 4], updated
@group(0) @binding(4) var<storage, read> add4: array<vec4<f32>>;       // [rows, dim / 4]

@compute @workgroup_size(64)
fn add_rms_norm_lane(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) li: u32) {
    let row = (wg.y * nwg.x + wg.x) * 64u + li;
    if (row >= p.rows) {
        return;
    }
    let dv = p.dim / 4u;
    let base = row * dv;
    var s4 = vec4<f32>(0.0);
    for (var i = 0u; i < dv; i++) {
        let v = acc4[base + i] + add4[base + i];
        acc4[base + i] = v;
        s4 += v * v;
    }
    let inv = inv_rms(s4.x + s4.y + s4.z + s4.w);
    for (var i = 0u; i < dv; i += 2u) {
        store_normed_pair(base, i, inv, acc4[base + i], acc4[base + i + 1u]);
    }
}
