// rope: rotary embedding in place, HF "rotate half" layout (dimension i pairs with i + half).
//   q f32 [T, q_heads, head_dim], k f32 [T, kv_heads, head_dim], positions u32 [T],
//   inv_freq f32 [half], half = head_dim / 2; angle = f32(position) * inv_freq[i].
//   (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
// One invocation per (token, head of q then k, i < half).
// Angles reach thousands of radians, where a GPU's sin/cos is allowed to be inaccurate (Vulkan
// only bounds the error on [-pi, pi]); so the angle is reduced by pi/2 in three exact-ish steps
// (Cody-Waite) and sin/cos are short polynomials on [-pi/4, pi/4] (Cephes sinf/cosf).
// rope_kv_write (entry point of the same name): the same rotation fused with kv_write. q is
// rotated in place; k is rotated straight into k_cache[slots[t]] (k itself is left as it was)
// and v is copied into v_cache[slots[t]]. One dispatch per layer instead of two.
// Check: cargo test -p tandem-wgpu --test ops -- rope

struct Params {
    num_tokens: u32,
    q_heads: u32,
    kv_heads: u32,
    head_dim: u32,
    num_slots: u32, // rope_kv_write only
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;   // [T, q_heads, head_dim]
@group(0) @binding(2) var<storage, read_write> k: array<f32>;   // [T, kv_heads, head_dim]
@group(0) @binding(3) var<storage, read> positions: array<u32>; // [T]
@group(0) @binding(4) var<storage, read> inv_freq: array<f32>;  // [head_dim / 2]
// rope_kv_write only:
@group(0) @binding(5) var<storage, read> v: array<f32>;              // [T, kv_heads, head_dim]
@group(0) @binding(6) var<storage, read_write> k_cache: array<f32>;  // [num_slots, kv_heads, head_dim]
@group(0) @binding(7) var<storage, read_write> v_cache: array<f32>;  // [num_slots, kv_heads, head_dim]
@group(0) @binding(8) var<storage, read> slots: array<u32>;          // [T]

// (sin a, cos a) for any a up to ~1e5 rad, to a few ulps.
fn sincos(a: f32) -> vec2<f32> {
    let kf = round(a * 0.63661977236758134); // a / (pi/2)
    // pi/2 = DP1 + DP2 + DP3; DP1 has 8 significant bits, so kf * DP1 is exact for kf < 2^16.
    var r = a - kf * 1.5703125;
    r = r - kf * 4.837512969970703125e-4;
    r = r - kf * 7.549789948768648e-8;
    let z = r * r;
    let s = r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));
    let c = 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
    let quadrant = i32(kf) & 3;
    switch quadrant {
        case 0: { return vec2<f32>(s, c); }
        case 1: { return vec2<f32>(c, -s); }
        case 2: { return vec2<f32>(-s, -c); }
        default: { return vec2<f32>(-c, s); }
    }
}

@compute @workgroup_size(64)
fn rope(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let half = p.head_dim / 2u;
    let heads = p.q_heads + p.kv_heads;
    let idx = (wg.y * nwg.x + wg.x) * 64u + li;
    if (idx >= p.num_tokens * heads * half) {
        return;
    }
    let i = idx % half;
    let th = idx / half;
    let h = th % heads;
    let t = th / heads;
    let sc = sincos(f32(positions[t]) * inv_freq[i]);
    if (h < p.q_heads) {
        let base = (t * p.q_heads + h) * p.head_dim;
        let x1 = q[base + i];
        let x2 = q[base + i + half];
        q[base + i] = x1 * sc.y - x2 * sc.x;
        q[base + i + half] = x2 * sc.y + x1 * sc.x;
    } else {
        let base = (t * p.kv_heads + (h - p.q_heads)) * p.head_dim;
        let x1 = k[base + i];
        let x2 = k[base + i + half];
        k[base + i] = x1 * sc.y - x2 * sc.x;
        k[base + i + half] = x2 * sc.y + x1 * sc.x;
    }
}

@compute @workgroup_size(64)
fn rope_kv_write(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) li: u32) {
    let half = p.head_dim / 2u;
    let heads = p.q_heads + p.kv_heads;
    let idx = (wg.y * nwg.x + wg.x) * 64u + li;
    if (idx >= p.num_tokens * heads * half) {
        return;
    }
    let i = idx % half;
    let th = idx / half;
    let h = th % heads;
    let t = th / heads;
    let sc = sincos(f32(positions[t]) * inv_freq[i]);
    if (h < p.q_heads) {
        let base = (t * p.q_heads + h) * p.head_dim;
        let x1 = q[base + i];
        let x2 = q[base + i + half];
        q[base + i] = x1 * sc.y - x2 * sc.x;
        q[base + i + half] = x2 * sc.y + x1 * sc.x;
        return;
    }
    let slot = slots[t];
    // A slot past the cache is skipped (validated on the host), as in kv_write.
    if (slot >= p.num_slots) {
        return;
    }
    let kv_dim = p.kv_heads * p.head_dim;
    let src = t * kv_dim + (h - p.q_heads) * p.head_dim + i;
    let dst = slot * kv_dim + (h - p.q_heads) * p.head_dim + i;
    let x1 = k[src];
    let x2 = k[src + half];
    k_cache[dst] = x1 * sc.y - x2 * sc.x;
    k_cache[dst + half] = x2 * sc.y + x1 * sc.x;
    v_cache[dst] = v[src];
    v_cache[dst + half] = v[src + half];
}
