// kv_write.cu — store this step's K and V rows into the paged cache.
//
//   k_cache[slots[t], h, :] = k[t, h, :];  v_cache[slots[t], h, :] = v[t, h, :]
//   k, v f32 [T, kv_heads, D]; caches f32 [num_blocks, block_size, kv_heads, D] viewed as
//   [num_slots, kv_heads, D]; slots u32 [T], slot = block_id * block_size + offset.
//
// The cache is f32 on CUDA: it matches the reference bit for bit and keeps attention free of
// conversions; bf16 would halve KV memory and is the obvious next step.
// Launch: grid (T), block 128; one slot row (kv_heads * D contiguous floats) per block.
// A slot >= num_slots is skipped (nothing is written out of bounds).
// Check: tandem-kernels-check --only kv_write; op suite op `kv_write` (reads the cache back).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(128)
kv_write(const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ k_cache,
         float* __restrict__ v_cache, const u32* __restrict__ slots, int num_tokens, int row_len,
         unsigned long long num_slots) {
    const int t = blockIdx.x;
    if (t >= num_tokens) return;
    const u32 slot = slots[t];
    if ((unsigned long long)slot >= num_slots) return;
    const float* ks = k + (size_t)t * row_len;
    const float* vs = v + (size_t)t * row_len;
    float* kd = k_cache + (size_t)slot * row_len;
    float* vd = v_cache + (size_t)slot * row_len;
    for (int i = threadIdx.x; i < row_len; i += blockDim.x) {
        kd[i] = ks[i];
        vd[i] = vs[i];
    }
}
