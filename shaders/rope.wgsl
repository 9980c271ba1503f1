// rope: rotary embedding in place, HF "rotate half" layout (dimension i pairs with i + half).
//   q f32 [T, q_heads, head_dim], k f32 [T, kv_heads, head_dim], positions u32 [T],
//   inv_freq f32 [half], half = head_dim / 2; angle = f32(position) * inv_freq[i].
//   (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
// One invocation per (token, head of q then k, i < half).
// Angles reach thousands of radians, where a GPU's sin/cos is allowed to be inaccurate (Vulkan
// only bounds the error on [-pi, pi]); so the prelude's sincos reduces the angle by pi/2 in
// three exact-ish steps (Cody-Waite) and uses short polynomials on [-pi/4, pi/4] (Cephes).
// rope_kv_write (entry point of the same name): the same rotation fused with kv_write. q is
// rotated in place; k is rotated straight into k_cache[slots[t]] (k itself is left as it was)
// and v is copied into v_cache[slots[t]]. One dispatch per layer instead of two.
// rope_kv_write_t (entry point): the same into caches kept in textures (the prelude's
// k4_store / v4_store, Prelude::kv_cache): q's pairs as in rope_kv_write, then one invocation
// per vec4 of k and v (head_dim % 4 == 0), each element rotated with its partner half a head
// away; the same arithmetic, so the same values as rope_kv_write.
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
// The same bindings as vec4s (rope_kv_write_t, and the prelude's k4_store for buffer caches).
@group(0) @binding(5) var<storage, read> v_in4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> k4: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> v4: array<vec4<f32>>;

// sincos(a) -> (sin a, cos a) and rotate(x1, x2, sc) come from the prelude (Prelude::sincos;
// matmul's rope epilogue shares them).

// One (token t, head h of q then k, element i < half) per invocation, and its rotation.
struct Item {
    t: u32,
    h: u32,
    i: u32,
    sc: vec2<f32>, // (sin, cos) of the angle
}

fn item(idx: u32) -> Item {
    let half = p.head_dim / 2u;
    let heads = p.q_heads + p.kv_heads;
    let th = idx / half;
    let t = th / heads;
    let i = idx % half;
    return Item(t, th % heads, i, sincos(f32(positions[t]) * inv_freq[i]));
}

// Rotates the item's pair of q in place (h < q_heads).
fn rotate_q(it: Item) {
    let base = (it.t * p.q_heads + it.h) * p.head_dim + it.i;
    let y = rotate(q[base], q[base + p.head_dim / 2u], it.sc);
    q[base] = y.x;
    q[base + p.head_dim / 2u] = y.y;
}

// Item idx of rope and rope_kv_write into *it: false where there is nothing left to do (past
// the last item, or q's pair, which this rotates).
fn k_item(idx: u32, it: ptr<function, Item>) -> bool {
    if (idx >= p.num_tokens * (p.q_heads + p.kv_heads) * (p.head_dim / 2u)) {
        return false;
    }
    *it = item(idx);
    if ((*it).h < p.q_heads) {
        rotate_q(*it);
        return false;
    }
    return true;
}

@compute @workgroup_size(64)
fn rope(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    var it: Item;
    if (!k_item((wg.y * nwg.x + wg.x) * 64u + li, &it)) {
        return;
    }
    let base = (it.t * p.kv_heads + (it.h - p.q_heads)) * p.head_dim + it.i;
    let y = rotate(k[base], k[base + p.head_dim / 2u], it.sc);
    k[base] = y.x;
    k[base + p.head_dim / 2u] = y.y;
}

@compute @workgroup_size(64)
fn rope_kv_write(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) li: u32) {
    var it: Item;
    if (!k_item((wg.y * nwg.x + wg.x) * 64u + li, &it)) {
        return;
    }
    let slot = slots[it.t];
    // A slot past the cache is skipped (validated on the host), as in kv_write.
    if (slot >= p.num_slots) {
        return;
    }
    let half = p.head_dim / 2u;
    let kv_dim = p.kv_heads * p.head_dim;
    let src = it.t * kv_dim + (it.h - p.q_heads) * p.head_dim + it.i;
    let dst = slot * kv_dim + (it.h - p.q_heads) * p.head_dim + it.i;
    let y = rotate(k[src], k[src + half], it.sc);
    k_cache[dst] = y.x;
    k_cache[dst + half] = y.y;
    v_cache[dst] = v[src];
    v_cache[dst + half] = v[src + half];
}

// Element d of k's head starting at element `head` of token t's row, rotated.
fn k_rotated(t: u32, head: u32, d: u32) -> f32 {
    let half = p.head_dim / 2u;
    let lo = d < half;
    let i = select(d - half, d, lo);
    let y = rotate(k[head + i], k[head + i + half], sincos(f32(positions[t]) * inv_freq[i]));
    return select(y.y, y.x, lo);
}

@compute @workgroup_size(64)
fn rope_kv_write_t(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) li: u32) {
    let idx = (wg.y * nwg.x + wg.x) * 64u + li;
    let half = p.head_dim / 2u;
    let q_items = p.num_tokens * p.q_heads * half;
    if (idx < q_items) {
        let th = idx / half;
        let i = idx % half;
        let t = th / p.q_heads;
        rotate_q(Item(t, th % p.q_heads, i, sincos(f32(positions[t]) * inv_freq[i])));
        return;
    }
    let hv = p.head_dim / 4u;
    let kv4 = p.kv_heads * hv;
    let j = idx - q_items; // vec4 j of k and v: [T, kv_heads, head_dim / 4]
    if (j >= p.num_tokens * kv4) {
        return;
    }
    let t = j / kv4;
    let slot = slots[t];
    // A slot past the cache is skipped (validated on the host), as in kv_write.
    if (slot >= p.num_slots) {
        return;
    }
    let e = j - t * kv4;
    let head = t * kv4 * 4u + (e / hv) * p.head_dim;
    let d = (e % hv) * 4u;
    let y = vec4<f32>(k_rotated(t, head, d), k_rotated(t, head, d + 1u), k_rotated(t, head, d + 2u), k_rotated(t, head, d + 3u));
    k4_store(slot * kv4 + e, y);
    v4_store(slot * kv4 + e, v_in4[j]);
}
