// kv_write: k_cache[slots[t], :, :] = k[t, :, :] and likewise for v.
//   k, v f32 [T, kv_heads, head_dim]; caches f32 [num_slots, kv_heads, head_dim]
//   (= [num_blocks, block_size, kv_heads, head_dim]); slots u32 [T].
// One invocation per element of k; a slot past the cache is skipped (validated on the host).
// kv_write_t (entry point): the same into caches kept in textures, one invocation per vec4 of
// k (the prelude's k4_store / v4_store, Prelude::kv_cache; kv_dim % 4 == 0); also the entry
// point of an fp8 cache (Prelude::kv_cache_fp8: a vec4 is one u32 word, divided by the scale and
// rounded to fp8).
// Check: cargo test -p tandem-wgpu --test ops -- kv_write

struct Params {
    num_tokens: u32,
    kv_dim: u32,     // kv_heads * head_dim
    num_slots: u32,
    k_scale: f32,    // an fp8 cache's scales (the prelude's k4_store); 1.0 otherwise
    v_scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> k: array<f32>;              // [T, kv_dim]
@group(0) @binding(2) var<storage, read> v: array<f32>;              // [T, kv_dim]
@group(0) @binding(3) var<storage, read_write> k_cache: array<f32>;  // [num_slots, kv_dim]
@group(0) @binding(4) var<storage, read_write> v_cache: array<f32>;  // [num_slots, kv_dim]
@group(0) @binding(5) var<storage, read> slots: array<u32>;          // [T]
// The same bindings as vec4s (kv_write_t, and the prelude's k4_store for buffer caches).
@group(0) @binding(1) var<storage, read> k_in4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> v_in4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> k4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> v4: array<vec4<f32>>;

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

@compute @workgroup_size(64)
fn kv_write_t(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    let kv4 = p.kv_dim / 4u;
    if (i >= p.num_tokens * kv4) {
        return;
    }
    let t = i / kv4;
    let slot = slots[t];
    if (slot >= p.num_slots) {
        return;
    }
    let dst = slot * kv4 + (i - t * kv4);
    k4_store(dst, k_in4[i]);
    v4_store(dst, v_in4[i]);
}
