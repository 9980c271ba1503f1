// kv_write.cu — store this step's K and V rows into the paged cache.
//
//   k_cache[slots[t], h, :] = kv(k[t, h, :]);  v_cache[slots[t], h, :] = kv(v[t, h, :])
//   k, v f32 [T, kv_heads, D]; caches [num_blocks, block_size, kv_heads, D] viewed as
//   [num_slots, kv_heads, D]; slots u32 [T], slot = block_id * block_size + offset.
//
// Four element types (crates/cuda/src/ops.rs picks by the cache buffer's kind):
//   kv_write_bf16 (the default): kv() rounds to bf16, nearest even (common.cuh
//     f32_to_bf16_bits, the weights' rounding): half the bytes of every KV read, a relative
//     error of at most 2^-9 per stored element;
//   kv_write_f32: kv() is the identity, bit for bit the reference (kept for checks);
//   kv_write_fp8e4m3 / _fp8e5m2 (two more arguments: the layer's k_scale, v_scale): kv() is
//     x / scale rounded to the format's nearest even byte, saturated (common.cuh kv_store,
//     crates/core fp8_round's bytes exactly).
// rope_kv_write_<kv> (Backend::rope_kv_write, and the second launch of qkv_rope_kv_write) is
// rope and this write in one launch: q rotated in place, k rotated (common.cuh rope_pair, rope's
// bits) and stored with v through the same store_kv, so the cache holds the bits rope then
// kv_write would leave; k itself is left as it was (the Backend contract allows either).
// Launch: grid (T), block 128; one slot row (kv_heads * D contiguous elements) per block.
// A slot >= num_slots is skipped (nothing is written out of bounds).
// Launch (rope_kv_write): grid (T), block 128; threads stride over q's pairs, then over k's
// pairs and v's row. A slot >= num_slots writes nothing to the cache (q is still rotated).
// Check: tandem-kernels-check --only kv_write; kernels/emu (test_kv_write: bits equal the
// round-to-nearest-even of each value; test_fused: rope_kv_write bitwise equal to rope then
// kv_write); op suite ops `kv_write`, `rope_kv_write` (read the cache back).
#include "common.cuh"

template <typename KV>
__device__ __forceinline__ void kv_write_impl(const float* __restrict__ k, const float* __restrict__ v, KV* __restrict__ k_cache,
                                              KV* __restrict__ v_cache, const u32* __restrict__ slots, int num_tokens,
                                              int row_len, unsigned long long num_slots, float k_scale, float v_scale) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    const int t = blockIdx.x;
    if (t >= num_tokens) return;
    const u32 slot = slots[t];
    if ((unsigned long long)slot >= num_slots) return;
    const float* ks = k + (size_t)t * row_len;
    const float* vs = v + (size_t)t * row_len;
    KV* kd = k_cache + (size_t)slot * row_len;
    KV* vd = v_cache + (size_t)slot * row_len;
    for (int i = threadIdx.x; i < row_len; i += blockDim.x) {
        kv_store(kd + i, ks[i], k_scale);
        kv_store(vd + i, vs[i], v_scale);
    }
}

#define KV_WRITE(NAME, KV)                                                                                          \
    extern "C" __global__ void __launch_bounds__(128)                                                               \
        kv_write_##NAME(const float* __restrict__ k, const float* __restrict__ v, KV* __restrict__ k_cache,        \
                        KV* __restrict__ v_cache, const u32* __restrict__ slots, int num_tokens, int row_len,       \
                        unsigned long long num_slots) {                                                             \
        kv_write_impl<KV>(k, v, k_cache, v_cache, slots, num_tokens, row_len, num_slots, 1.0f, 1.0f);              \
    }
KV_WRITE(f32, float)
KV_WRITE(bf16, bf16_t)

// The fp8 caches: the layer's K and V scales follow the arguments above.
#define KV_WRITE_FP8(NAME, KV)                                                                                      \
    extern "C" __global__ void __launch_bounds__(128)                                                               \
        kv_write_##NAME(const float* __restrict__ k, const float* __restrict__ v, KV* __restrict__ k_cache,        \
                        KV* __restrict__ v_cache, const u32* __restrict__ slots, int num_tokens, int row_len,       \
                        unsigned long long num_slots, float k_scale, float v_scale) {                               \
        kv_write_impl<KV>(k, v, k_cache, v_cache, slots, num_tokens, row_len, num_slots, k_scale, v_scale);        \
    }
KV_WRITE_FP8(fp8e4m3, fp8e4m3_t)
KV_WRITE_FP8(fp8e5m2, fp8e5m2_t)

template <typename KV>
__device__ __forceinline__ void rope_kv_write_impl(float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                                   KV* __restrict__ k_cache, KV* __restrict__ v_cache, const u32* __restrict__ positions,
                                                   const float* __restrict__ inv_freq, const u32* __restrict__ slots, int num_tokens,
                                                   int q_heads, int kv_heads, int head_dim, unsigned long long num_slots,
                                                   float k_scale, float v_scale) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    const int t = blockIdx.x;
    if (t >= num_tokens) return;
    const int half = head_dim >> 1, row_len = kv_heads * head_dim;
    const float pos = (float)positions[t];
    float* qt = q + (size_t)t * q_heads * head_dim;
    for (int e = threadIdx.x; e < q_heads * half; e += blockDim.x) {
        const int hh = e / half, i = e - hh * half;
        float* row = qt + (size_t)hh * head_dim;
        float y0, y1;
        rope_pair(row[i], row[i + half], pos, inv_freq[i], y0, y1);
        row[i] = y0;
        row[i + half] = y1;
    }
    const u32 slot = slots[t];
    if ((unsigned long long)slot >= num_slots) return;
    const float* ks = k + (size_t)t * row_len;
    const float* vs = v + (size_t)t * row_len;
    KV* kd = k_cache + (size_t)slot * row_len;
    KV* vd = v_cache + (size_t)slot * row_len;
    for (int e = threadIdx.x; e < kv_heads * half; e += blockDim.x) {
        const int hh = e / half, i = e - hh * half;
        const size_t o = (size_t)hh * head_dim + i;
        float y0, y1;
        rope_pair(ks[o], ks[o + half], pos, inv_freq[i], y0, y1);
        kv_store(kd + o, y0, k_scale);
        kv_store(kd + o + half, y1, k_scale);
    }
    for (int i = threadIdx.x; i < row_len; i += blockDim.x) kv_store(vd + i, vs[i], v_scale);
}

#define ROPE_KV_WRITE(NAME, KV)                                                                                          \
    extern "C" __global__ void __launch_bounds__(128)                                                                    \
        rope_kv_write_##NAME(float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,          \
                             KV* __restrict__ k_cache, KV* __restrict__ v_cache, const u32* __restrict__ positions,    \
                             const float* __restrict__ inv_freq, const u32* __restrict__ slots, int num_tokens,        \
                             int q_heads, int kv_heads, int head_dim, unsigned long long num_slots) {                  \
        rope_kv_write_impl<KV>(q, k, v, k_cache, v_cache, positions, inv_freq, slots, num_tokens, q_heads, kv_heads, \
                               head_dim, num_slots, 1.0f, 1.0f);                                                       \
    }
ROPE_KV_WRITE(f32, float)
ROPE_KV_WRITE(bf16, bf16_t)

#define ROPE_KV_WRITE_FP8(NAME, KV)                                                                                      \
    extern "C" __global__ void __launch_bounds__(128)                                                                    \
        rope_kv_write_##NAME(float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,          \
                             KV* __restrict__ k_cache, KV* __restrict__ v_cache, const u32* __restrict__ positions,    \
                             const float* __restrict__ inv_freq, const u32* __restrict__ slots, int num_tokens,        \
                             int q_heads, int kv_heads, int head_dim, unsigned long long num_slots, float k_scale,     \
                             float v_scale) {                                                                          \
        rope_kv_write_impl<KV>(q, k, v, k_cache, v_cache, positions, inv_freq, slots, num_tokens, q_heads, kv_heads, \
                               head_dim, num_slots, k_scale, v_scale);                                                 \
    }
ROPE_KV_WRITE_FP8(fp8e4m3, fp8e4m3_t)
ROPE_KV_WRITE_FP8(fp8e5m2, fp8e5m2_t)
