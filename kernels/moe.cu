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
//
// THE ROUTED PATH (crates/cuda/src/moe.rs `moe_routed`, TANDEM_CUDA_MOE=routed): each expert
// runs over the tokens routed to it only, through matmul.cu's tile code, in a fixed number of
// launches per layer whatever the routing (so a decode step is still captured as a graph):
//   1. moe_select (a thread per token): a token's experts are those whose routing weight is
//      not 0 (moe_route leaves the others exactly 0), the first top_k of them in expert order:
//      rank[t, e] = its place j in that list, else -1; sel[t, j] = e (-1 past the last).
//   2. moe_count (a block per chunk of MOE_CHUNK tokens): cnt[chunk, e] = its tokens routed to e.
//   3. moe_offsets (one block): each expert's rows are a segment of the padded layout, in expert
//      order, starting at a multiple of the tile's rows `bm`; base[chunk, e] = the segment's
//      start + the tokens of earlier chunks routed to e; seg_end[e] = start + count;
//      tile_expert[i] = the expert whose segment holds row tile i, -1 for the unused tiles.
//   4. moe_scatter (a block per chunk): the tokens of expert e in ascending token index take
//      the rows base[chunk, e], base[chunk, e] + 1, ...: slot[t, j] = the row of token t's j-th
//      expert. Every order here is a token's index or an expert's: none depends on timing.
//   5. moe_gather_*: x's row t copied to each of its slots, in the tile kernel's operand format
//      (16-bit, rounded by f32_to_bits as the tile kernel or matmul_x round it, pitch kp = d
//      rounded up to 8, zero padded; or f32 for f32 weights).
//   6. the grouped GEMMs: moe_gemm_<dt>_m16 / _m64 (tensor cores; EPI_SILU for the fused
//      gate/up weight, EPI_PLAIN for down) and moe_gemm_f32 (the SIMT kernel: gate, up, then
//      silu_mul over the padded rows, then down). Block (x, y) is output tile x of row tile y;
//      it takes expert tile_expert[y]'s weight from a device table of pointers and runs
//      matmul_tc_impl / matmul_tiled_f32_impl unchanged with m = seg_end[e]: the tile's rows
//      are m0 = y * bm .. inside that expert's segment, rows from seg_end on are masked as any
//      m tail is. K is sliced by k_slices(n, k) as the plain GEMM slices it and folded in
//      registers (z = 1): by matmul.cu's contract a row's bits are those of the plain GEMM of
//      any m, so an expert's output for token t has the bits the every-expert path gives it.
//   7. moe_combine (a block per token): out[t, :] = w0 * y[slot0] + w1 * y[slot1] ... over the
//      token's experts in ascending expert id (the first term stored, then added; no FMA), the
//      order the every-expert path adds them in. The terms that path adds for the other
//      experts are w = 0 times a finite y, ±0, which leave a nonzero sum unchanged: the same
//      values, bits equal but for the sign of an exact zero (and a NaN or inf in an expert
//      that was not routed to, which the every-expert path would spread).
// Launch sizes depend on (tokens, experts, top_k, bm) only: rows = tokens * top_k +
// min(experts, tokens * top_k) * (bm - 1), tiles = rows / bm.
#include "common.cuh"
#define TANDEM_MATMUL_DEVICE_ONLY
#include "matmul.cu"

#define MOE_CHUNK 64
// Test hook, defined only by kernels/emu/moe_break_test.cpp: 1 perturbs the combine's second term.
#ifndef TANDEM_MOE_BREAK
#define TANDEM_MOE_BREAK 0
#endif

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

// ---- the routed path (see the top of this file) ----

extern "C" __global__ void __launch_bounds__(64)
moe_select(const float* __restrict__ weights, int* __restrict__ rank, int* __restrict__ sel, int rows, int experts, int top_k) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows) return;
    int j = 0;
    for (int e = 0; e < experts; ++e) {
        const bool on = weights[(size_t)t * experts + e] != 0.0f && j < top_k;
        rank[(size_t)t * experts + e] = on ? j : -1;
        if (on) sel[(size_t)t * top_k + j++] = e;
    }
    for (; j < top_k; ++j) sel[(size_t)t * top_k + j] = -1;
}

extern "C" __global__ void __launch_bounds__(128)
moe_count(const int* __restrict__ rank, int* __restrict__ cnt, int rows, int experts) {
    const int c = blockIdx.x, t0 = c * MOE_CHUNK, t1 = min(rows, t0 + MOE_CHUNK);
    for (int e = threadIdx.x; e < experts; e += blockDim.x) {
        int n = 0;
        for (int t = t0; t < t1; ++t) n += rank[(size_t)t * experts + e] >= 0;
        cnt[(size_t)c * experts + e] = n;
    }
}

// One block of 128 threads. base [chunks, experts] (cnt's layout), seg [2, experts]: each
// expert's segment start, then its end (start + count); tile_expert [tiles].
extern "C" __global__ void __launch_bounds__(128)
moe_offsets(const int* __restrict__ cnt, int* __restrict__ base, int* __restrict__ seg, int* __restrict__ tile_expert, int chunks,
            int experts, int bm, int tiles) {
    int* seg_start = seg;
    int* seg_end = seg + experts;
    for (int e = threadIdx.x; e < experts; e += blockDim.x) {
        int run = 0;
        for (int c = 0; c < chunks; ++c) {
            base[(size_t)c * experts + e] = run;
            run += cnt[(size_t)c * experts + e];
        }
        seg_end[e] = run;  // the count, for now
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int start = 0, tile = 0;
        for (int e = 0; e < experts; ++e) {
            const int n = seg_end[e], nt = (n + bm - 1) / bm;
            seg_start[e] = start;
            seg_end[e] = start + n;
            for (int i = 0; i < nt && tile < tiles; ++i) tile_expert[tile++] = e;
            start += nt * bm;
        }
        for (; tile < tiles; ++tile) tile_expert[tile] = -1;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < experts; e += blockDim.x)
        for (int c = 0; c < chunks; ++c) base[(size_t)c * experts + e] += seg_start[e];
}

extern "C" __global__ void __launch_bounds__(128)
moe_scatter(const int* __restrict__ rank, const int* __restrict__ base, int* __restrict__ slot, int rows, int experts, int top_k) {
    const int c = blockIdx.x, t0 = c * MOE_CHUNK, t1 = min(rows, t0 + MOE_CHUNK);
    for (int e = threadIdx.x; e < experts; e += blockDim.x) {
        int p = base[(size_t)c * experts + e];
        for (int t = t0; t < t1; ++t) {
            const int j = rank[(size_t)t * experts + e];
            if (j >= 0) slot[(size_t)t * top_k + j] = p++;
        }
    }
}

// x [rows, d] (f32, or 16-bit bits when x16) -> xg [padded rows, kp] in the tile kernel's
// operand format: `fmt` 1 bf16, 2 f16 (from f32 x: rounded as matmul_x rounds; from 16-bit x:
// copied), 0 f32 (kp = d). Grid (rows), block 256.
extern "C" __global__ void __launch_bounds__(256)
moe_gather(const void* __restrict__ x, int x16, void* __restrict__ xg, const int* __restrict__ sel, const int* __restrict__ slot, int d,
           int kp, int top_k, int fmt) {
    const int t = blockIdx.x;
    for (int j = 0; j < top_k; ++j) {
        if (sel[(size_t)t * top_k + j] < 0) break;
        const size_t p = (size_t)slot[(size_t)t * top_k + j];
        for (int i = threadIdx.x; i < kp; i += blockDim.x) {
            if (fmt == 0) {
                static_cast<float*>(xg)[p * kp + i] = static_cast<const float*>(x)[(size_t)t * d + i];
            } else {
                u16 v = 0;
                if (i < d) {
                    if (x16) v = static_cast<const u16*>(x)[(size_t)t * d + i];
                    else {
                        const float f = static_cast<const float*>(x)[(size_t)t * d + i];
                        v = fmt == 1 ? f32_to_bits(bf16_t{}, f) : f32_to_bits(f16_t{}, f);
                    }
                }
                static_cast<u16*>(xg)[p * kp + i] = v;
            }
        }
    }
}

// The grouped GEMM: block (x, y) is output tile x of row tile y, of expert tile_expert[y]
// (none: the block exits), whose weight is wtab[e]; seg_end [experts] (moe_offsets' seg +
// experts). x is read in 16 bits only: xg from moe_gather (pitch kp), or the gate/up GEMM's
// silu output, which the routed path always stores in the weight's 16-bit type (act16 = 1,
// pitch inter: by matmul.cu's contract the same bits as storing it in f32).
template <typename T, typename S>
__device__ void moe_gemm_tc_impl(const u16* __restrict__ xa, const unsigned long long* __restrict__ wtab, const int* __restrict__ tile_expert,
                                 const int* __restrict__ seg_end, float* out, int epi, int inter, int act16, int n, int k, int kp, int slice_len,
                                 int slices) {
    const int e = tile_expert[blockIdx.y];
    if (e < 0) return;
    const u16* w = reinterpret_cast<const u16*>(wtab[e]);
    const Epilogue ep{out, nullptr, nullptr, epi, inter, 0, nullptr, 0, act16};
    matmul_tc_impl<T, S>(nullptr, xa, w, w, 0, ep, nullptr, nullptr, seg_end[e], n, k, kp, slice_len, slices, NormIn{nullptr, 0, 0.0f}, RopeKv{});
}
#define MOE_GEMM_TC(DT, T, NAME, SHAPE)                                                                                       \
    extern "C" __global__ void __launch_bounds__(SHAPE::THREADS)                                                             \
        moe_gemm_##DT##_##NAME(const u16* xa, const unsigned long long* wtab, const int* tile_expert, const int* seg_end, float* out, \
                               int epi, int inter, int act16, int n, int k, int kp, int slice_len, int slices) {             \
        moe_gemm_tc_impl<T, SHAPE>(xa, wtab, tile_expert, seg_end, out, epi, inter, act16, n, k, kp, slice_len, slices);     \
    }
MOE_GEMM_TC(bf16, bf16_t, m16, GemmM16)
MOE_GEMM_TC(bf16, bf16_t, m64, GemmM64)
MOE_GEMM_TC(f16, f16_t, m16, GemmM16)
MOE_GEMM_TC(f16, f16_t, m64, GemmM64)

// f32 weights: matmul_tiled_f32 (64-row tiles) per expert; x f32 [padded rows, k].
extern "C" __global__ void __launch_bounds__(256)
moe_gemm_f32(const float* __restrict__ x, const unsigned long long* __restrict__ wtab, const int* __restrict__ tile_expert,
             const int* __restrict__ seg_end, float* __restrict__ out, int n, int k) {
    const int e = tile_expert[blockIdx.y];
    if (e < 0) return;
    const float* w = reinterpret_cast<const float*>(wtab[e]);
    matmul_tiled_f32_impl(x, w, w, 0, out, seg_end[e], n, k);
}

// out [rows, d] f32: token t's experts' outputs y [padded rows, d] scaled by its routing weights
// and added in ascending expert id (sel's order). Grid (rows), block 256.
extern "C" __global__ void __launch_bounds__(256)
moe_combine(float* __restrict__ out, const float* __restrict__ y, const float* __restrict__ weights, const int* __restrict__ sel,
            const int* __restrict__ slot, int d, int experts, int top_k) {
    const int t = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < top_k; ++j) {
            const int e = sel[(size_t)t * top_k + j];
            if (e < 0) break;
            const float v = weights[(size_t)t * experts + e] * y[(size_t)slot[(size_t)t * top_k + j] * d + i];
#if TANDEM_MOE_BREAK == 1
            acc = acc + v * (j == 1 ? 1.0000001f : 1.0f);  // the bug the emulator must catch: a wrong term
#else
            acc = j == 0 ? v : acc + v;
#endif
        }
        out[(size_t)t * d + i] = acc;
    }
}
