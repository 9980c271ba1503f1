// kv_write.cu — store this step's K and V rows into the paged cache.
//
//   k_cache[slots[t], h, :] = kv(k[t, h, :]);  v_cache[slots[t], h, :] = kv(v[t, h, :])
//   k, v f32 [T, kv_heads, D]; caches [num_blocks, block_size, kv_heads, D] viewed as
//   [num_slots, kv_heads, D]; slots u32 [T], slot = block_id * block_size + offset.
//
// Two element types (crates/cuda/src/backend.rs picks by the cache buffer's kind):
//   kv_write_bf16 (the default): kv() rounds to bf16, nearest even (common.cuh
//     f32_to_bf16_bits, the weights' rounding): half the bytes of every KV read, a relative
//     error of at most 2^-9 per stored element;
//   kv_write_f32: kv() is the identity, bit for bit the reference (kept for checks).
// The rope_kv_write and qkv_rope_kv_write defaults end here on CUDA (rope, then this kernel),
// so every K/V the cache holds went through this one rounding.
// Launch: grid (T), block 128; one slot row (kv_heads * D contiguous elements) per block.
// A slot >= num_slots is skipped (nothing is written out of bounds).
// Check: tandem-kernels-check --only kv_write; kernels/emu (test_kv_write: bits equal the
// round-to-nearest-even of each value); op suite op `kv_write` (reads the cache back).
#include "common.cuh"

template <typename KV>
__device__ __forceinline__ void kv_write_impl(const float* __restrict__ k, const float* __restrict__ v, KV* __restrict__ k_cache,
                                              KV* __restrict__ v_cache, const u32* __restrict__ slots, int num_tokens,
                                              int row_len, unsigned long long num_slots) {
    const int t = blockIdx.x;
    if (t >= num_tokens) return;
    const u32 slot = slots[t];
    if ((unsigned long long)slot >= num_slots) return;
    const float* ks = k + (size_t)t * row_len;
    const float* vs = v + (size_t)t * row_len;
    KV* kd = k_cache + (size_t)slot * row_len;
    KV* vd = v_cache + (size_t)slot * row_len;
    for (int i = threadIdx.x; i < row_len; i += blockDim.x) {
        store_kv(kd + i, ks[i]);
        store_kv(vd + i, vs[i]);
    }
}

#define KV_WRITE(NAME, KV)                                                                                          \
    extern "C" __global__ void __launch_bounds__(128)                                                               \
        kv_write_##NAME(const float* __restrict__ k, const float* __restrict__ v, KV* __restrict__ k_cache,        \
                        KV* __restrict__ v_cache, const u32* __restrict__ slots, int num_tokens, int row_len,       \
                        unsigned long long num_slots) {                                                             \
        kv_write_impl<KV>(k, v, k_cache, v_cache, slots, num_tokens, row_len, num_slots);                          \
    }
KV_WRITE(f32, float)
KV_WRITE(bf16, bf16_t)
