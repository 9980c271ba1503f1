// kv_write: k_cache[slots[t], :, :] = k[t, :, :] and likewise for v.
//   k, v f32 [T, kv_heads, head_dim]; caches f32 [num_slots, kv_heads, head_dim]
//   (= [num_blocks, block_size, kv_heads, head_dim]); slots u32 [T].
// One invocation per element of k; a slot past the cache is skipped (validated on the host).
// Check: cargo test -p tandem-wgpu --test ops -- kv_write

struct Params {
    num_tokens: u32,
    kv_dim: u32,     // kv_heads * head_dim
    num_slots: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> k: array<f32>;              // [T, kv_dim]
@group(0) @binding(2) var<storage, read> v: array<f32>;              // [T, kv_dim]
@group(0) @binding(3) var<storage, read_write> k_cache: array<f32>;  // [num_slots, kv_dim]
@group(0) @binding(4) var<storage, read_write> v_cache: array<f32>;  // [num_slots, kv_dim]
@group(0) @binding(5) var<storage, read> slots: array<u32>;          // [T]

@compute @workgroup_size(64)
fn kv_write(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.num_tokens * p.kv_dim) {
        return;
    }
    let t = i / p.kv_dim;
    let e = i - t * p.kv_dim;
    let slot = slots[t];
    if (slot >= p.num_slots) {
        return;
    }
    k_cache[slot * p.kv_dim + e] = k[i];
    v_cache[slot * p.kv_dim + e] = v[i];
}
