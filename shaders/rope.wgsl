// rope: rotary embedding in place, HF "rotate half" layout (dimension i pairs with i + half).
//   q f32 [T, q_heads, head_dim], k f32 [T, kv_heads, head_dim], positions u32 [T],
//   inv_freq f32 [half], half = head_dim / 2; angle = f32(position) * inv_freq[i].
//   (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
// One invocation per (token, head of q then k, i < half).
// Angles reach thousands of radians, where a GPU's sin/cos is allowed to be inaccurate (Vulkan
// only bounds the error on [-pi, pi]); so the angle is reduced by pi/2 in three exact-ish steps
// (Cody-Waite) and sin/cos are short polynomials on [-pi/4, pi/4] (Cephes sinf/cosf).
// Check: cargo test -p tandem-wgpu --test ops -- rope

struct Params {
    num_tokens: u32,
    q_heads: u32,
    kv_heads: u32,
    head_dim: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;   // [T, q_heads, head_dim]
@group(0) @binding(2) var<storage, read_write> k: array<f32>;   // [T, kv_heads, head_dim]
@group(0) @binding(3) var<storage, read> positions: array<u32>; // [T]
@group(0) @binding(4) var<storage, read> inv_freq: array<f32>;  // [head_dim / 2]

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
