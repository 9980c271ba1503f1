// lora.cu — each row's own LoRA adapter update from stacked per-slot factors (Punica's BGMV),
// two launches a projection (crates/core/src/lora/segmented.rs is the definition; `lora_rows`
// the host loop; crates/cuda/src/lora.rs the launcher).
//
// s = slots[t]; a row whose slot is >= max_loras (NO_SLOT = 0xffffffff) is left as it is.
// x [rows, in] f32, bf16 or f16 (the activation a matmul of A's type reads), A f32
// [max_loras, max_rank, in], B f32 [max_loras, out, max_rank], scales f32 [max_loras],
// shrink f32 [rows, max_rank], y f32 [rows, out].
//
// lora_shrink_{f32,bf16,f16}: shrink[t, j] = Σ_k x̃[t, k] · A[s, j, k], x̃ = x widened to f32
//   and rounded to `round_code`'s type (1 f32: none, 2 bf16, 3 f16; what kernels/matmul.cu
//   does to x for 16-bit weights). A warp per (t, j): lane l sums k = l, l + 32, ... in
//   ascending order, then warp_sum's fixed tree (a row with no slot stores 0).
//   Launch: grid (ceil(max_rank / 8), rows), block 256 (8 warps).
// lora_expand: y[t, o] = y[t, o] + scale[s] · Σ_j shrink[t, j] · B[s, o, j], j ascending (the
//   host loop's order and bits: no FMA, --fmad=false). A thread per (t, o).
//   Launch: grid (ceil(out / 256), rows), block 256.
// Every order above is fixed by the shapes: a row's bits never depend on the other rows.
// Check: op suite op `lora`; kernels/emu (emu_test.cpp, lora_test.h).
#include "common.cuh"

__device__ __forceinline__ float lora_round(int round_code, float v) {
    if (round_code == 2) return bf16_bits_to_f32(f32_to_bf16_bits(v));
    if (round_code == 3) return f16_bits_to_f32(f32_to_f16_bits(v));
    return v;
}

template <typename X>
__device__ __forceinline__ void lora_shrink_impl(const X* __restrict__ x, const float* __restrict__ a,
                                                 const u32* __restrict__ slots, float* __restrict__ shrink, int in,
                                                 int max_loras, int max_rank, int round_code) {
    const int t = blockIdx.y;
    const int j = blockIdx.x * 8 + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (j >= max_rank) return;
    const u32 s = slots[t];
    const size_t out_i = (size_t)t * max_rank + j;
    if (s >= (u32)max_loras) {
        if (lane == 0) shrink[out_i] = 0.0f;
        return;
    }
    const X* xr = x + (size_t)t * in;
    const float* ar = a + ((size_t)s * max_rank + j) * in;
    float acc = 0.0f;
    for (int k = lane; k < in; k += 32) acc += lora_round(round_code, to_f32(xr[k])) * ar[k];
    acc = warp_sum(acc);
    if (lane == 0) shrink[out_i] = acc;
}

#define LORA_SHRINK(NAME, X)                                                                                 \
    extern "C" __global__ void __launch_bounds__(256)                                                        \
        NAME(const X* __restrict__ x, const float* __restrict__ a, const u32* __restrict__ slots,             \
             float* __restrict__ shrink, int in, int max_loras, int max_rank, int round_code) {               \
        lora_shrink_impl<X>(x, a, slots, shrink, in, max_loras, max_rank, round_code);                       \
    }
LORA_SHRINK(lora_shrink_f32, float)
LORA_SHRINK(lora_shrink_bf16, bf16_t)
LORA_SHRINK(lora_shrink_f16, f16_t)

extern "C" __global__ void __launch_bounds__(256)
lora_expand(const float* __restrict__ shrink, const float* __restrict__ b, const u32* __restrict__ slots,
            const float* __restrict__ scales, float* __restrict__ y, int out, int max_loras, int max_rank) {
    const int t = blockIdx.y;
    const int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= out) return;
    const u32 s = slots[t];
    if (s >= (u32)max_loras) return;
    const float* u = shrink + (size_t)t * max_rank;
    const float* br = b + ((size_t)s * out + o) * max_rank;
    float acc = 0.0f;
    for (int j = 0; j < max_rank; ++j) acc += u[j] * br[j];
    const size_t i = (size_t)t * out + o;
    y[i] = y[i] + scales[s] * acc;
}
