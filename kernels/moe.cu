// moe.cu — a mixture of experts' routing and weighted combine (crates/core/src/backend.rs:
// `moe_route`, `moe_accumulate`; `moe_route_rows` / `moe_accumulate_rows` are the host
// arithmetic repeated here).
//
// moe_route: logits f32 [rows, experts] -> weights f32 [rows, experts]. One thread per row:
//   softmax (max subtracted, summed in index order), then top_k times the largest probability
//   not yet taken (lowest index on ties; untaken entries hold -1 meanwhile), the rest 0, the
//   taken ones divided by their sum (in the order taken) when `renormalize`.
//   Launch: grid (ceil(rows / 64)), block 64. expf, not __expf (as silu_mul).
// moe_accumulate: acc = w * y (first) or acc + w * y, w = weights[row, expert]; acc, y f32
//   [rows, dim]. One element per thread; no FMA (--fmad=false), as the reference.
//   Launch: grid (ceil(len / 256)), block 256.
// A row's result depends on that row alone: batch invariance.
// Check: op suite ops `moe_route`, `moe_accumulate`; kernels/emu (emu_test.cpp).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(64)
moe_route(const float* __restrict__ logits, float* __restrict__ weights, int rows, int experts, int top_k, int renormalize) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* l = logits + (size_t)r * experts;
    float* w = weights + (size_t)r * experts;
    float m = l[0];
    for (int i = 1; i < experts; ++i) m = fmaxf(m, l[i]);
    float s = 0.0f;
    for (int i = 0; i < experts; ++i) {
        s += expf(l[i] - m);
        w[i] = -1.0f;
    }
    float sum = 0.0f;
    const int k = top_k < experts ? top_k : experts;
    for (int j = 0; j < k; ++j) {
        int best = experts;
        float bp = 0.0f;
        for (int i = 0; i < experts; ++i) {
            if (w[i] < 0.0f) {
                const float p = expf(l[i] - m) / s;
                if (best == experts || p > bp) {
                    best = i;
                    bp = p;
                }
            }
        }
        w[best] = bp;
        sum += bp;
    }
    for (int i = 0; i < experts; ++i) {
        const float v = w[i];
        w[i] = v < 0.0f ? 0.0f : (renormalize ? v / sum : v);
    }
}

extern "C" __global__ void __launch_bounds__(256)
moe_accumulate(float* __restrict__ acc, const float* __restrict__ y, const float* __restrict__ weights, unsigned long long len,
               int dim, int expert, int experts, int first) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) {
        const float w = weights[(i / (size_t)dim) * (size_t)experts + expert];
        const float v = w * y[i];
        acc[i] = first ? v : acc[i] + v;
    }
}
