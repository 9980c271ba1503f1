// rope.cu — rotary position embedding, in place, HF "rotate half" layout.
//
//   for each head row x of q [T, q_heads, D] and k [T, kv_heads, D], i in [0, D/2):
//     a = positions[t] * inv_freq[i]          (f32, as HF computes it)
//     x[i]       = x[i] * cos(a) - x[i + D/2] * sin(a)
//     x[i + D/2] = x[i + D/2] * cos(a) + x[i] * sin(a)
//   positions u32 [T], inv_freq f32 [D/2]
//
// Launch: grid (T), block 128; threads stride over the (q_heads + kv_heads) * D/2 pairs of
// one token, so q and k are rotated by one launch. common.cuh rope_pair: sincosf (full range
// reduction, no fast math) because angles reach positions * 1 = thousands of radians.
// Check: tandem-kernels-check --only rope; op suite op `rope`.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(128)
rope(float* __restrict__ q, float* __restrict__ k, const u32* __restrict__ positions,
     const float* __restrict__ inv_freq, int num_tokens, int q_heads, int kv_heads, int head_dim) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    const int t = blockIdx.x;
    if (t >= num_tokens) return;
    const int half = head_dim >> 1;
    const float pos = (float)positions[t];
    const int pairs = (q_heads + kv_heads) * half;
    for (int e = threadIdx.x; e < pairs; e += blockDim.x) {
        const int hh = e / half, i = e - hh * half;
        float* row = hh < q_heads ? q + ((size_t)t * q_heads + hh) * head_dim
                                  : k + ((size_t)t * kv_heads + (hh - q_heads)) * head_dim;
        float y0, y1;
        rope_pair(row[i], row[i + half], pos, inv_freq[i], y0, y1);
        row[i] = y0;
        row[i + half] = y1;
    }
}
