// matmul.cu — y = x · Wᵀ (+ bias), the projection of torch.nn.Linear.
//
//   out[r, c] = sum_k x[r, k] * w[c, k] (+ bias[c])
//   x f32 [m, k]; w [n, k] row-major (f32|bf16|f16); bias [n] (any weight dtype, or none); out f32 [m, n]
//   Products and sums in f32 (fma).
//
// Two paths, chosen on the host by m:
//   matmul_vec_<dt>_m<MT> (m <= 16, decode): memory-bound on W, so W is streamed exactly once.
//     grid (ceil(n / 8)), block 256: one warp per output column c; lane l reads 8 consecutive
//     weights (16 bytes for bf16/f16) at k = 8l + 256i, so a warp reads 512 contiguous bytes
//     per step; the MT rows of x come from L1/L2. A butterfly sum over lanes ends each column.
//     MT in {1, 2, 4, 8, 16} is m rounded up; rows r >= m are skipped. k % 8 != 0 falls back
//     to a scalar loop (lane l takes k = l + 32i).
//   matmul_tiled_<dt> (m > 16, prefill): 64x64 output tile per block of 256 threads, 4x4
//     outputs per thread, k in steps of 16 staged through shared memory (W widened to f32 on
//     the way in). Every output is one sequential fma chain over k = 0..k-1.
// Within each path a row's result does not depend on m or on the other rows (no split of k
// that depends on the batch), so a token computes the same alone or in any batch of the same
// path. The two paths round differently from each other.
// Check: tandem-kernels-check --only matmul; op suite ops `matmul_decode` (m = 1..16) and
// `matmul_prefill` (m, n, k not multiples of any tile) for each weight dtype.
#include "common.cuh"

#define MV_WARPS 8

template <typename T, int MT>
__device__ void matmul_vec_impl(const float* __restrict__ x, const T* __restrict__ w, const void* __restrict__ bias,
                                int bias_dtype, float* __restrict__ out, int m, int n, int k) {
    const int lane = threadIdx.x & 31;
    const int c = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (c >= n) return;  // whole warp leaves together; no block barrier follows
    const T* wr = w + (size_t)c * k;
    float acc[MT];
#pragma unroll
    for (int r = 0; r < MT; ++r) acc[r] = 0.0f;
    if ((k & 7) == 0) {
#pragma unroll 4
        for (int k0 = lane * 8; k0 < k; k0 += 256) {
            float wv[8];
            load8(wr + k0, wv);
#pragma unroll
            for (int r = 0; r < MT; ++r) {
                if (r < m) {
                    const float4* xp = reinterpret_cast<const float4*>(x + (size_t)r * k + k0);
                    const float4 a = xp[0], b = xp[1];
                    float s = acc[r];
                    s = fmaf(wv[0], a.x, s); s = fmaf(wv[1], a.y, s);
                    s = fmaf(wv[2], a.z, s); s = fmaf(wv[3], a.w, s);
                    s = fmaf(wv[4], b.x, s); s = fmaf(wv[5], b.y, s);
                    s = fmaf(wv[6], b.z, s); s = fmaf(wv[7], b.w, s);
                    acc[r] = s;
                }
            }
        }
    } else {
        for (int kk = lane; kk < k; kk += 32) {
            const float wv = to_f32(wr[kk]);
#pragma unroll
            for (int r = 0; r < MT; ++r)
                if (r < m) acc[r] = fmaf(wv, x[(size_t)r * k + kk], acc[r]);
        }
    }
    const float b = load_bias(bias, bias_dtype, c);
#pragma unroll
    for (int r = 0; r < MT; ++r) {
        const float s = warp_sum(acc[r]);
        if (lane == 0 && r < m) out[(size_t)r * n + c] = s + b;
    }
}

#define TM 64
#define TN 64
#define TK 16

template <typename T>
__device__ void matmul_tiled_impl(const float* __restrict__ x, const T* __restrict__ w, const void* __restrict__ bias,
                                  int bias_dtype, float* __restrict__ out, int m, int n, int k) {
    // Transposed tiles ([k][row]) so the inner loop reads rows and columns as broadcasts and
    // consecutive words; +1 padding keeps the transposing stores free of bank conflicts.
    __shared__ float xs[TK][TM + 1];
    __shared__ float ws[TK][TN + 1];
    const int tid = threadIdx.x;
    const int tx = tid & 15, ty = tid >> 4;
    const int r0 = blockIdx.y * TM, c0 = blockIdx.x * TN;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < k; k0 += TK) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int e = tid + 256 * q;  // 1024 elements per tile
            const int rr = e >> 4, kk = e & 15;
            const int gk = k0 + kk;
            const int gr = r0 + rr, gc = c0 + rr;
            xs[kk][rr] = (gr < m && gk < k) ? x[(size_t)gr * k + gk] : 0.0f;
            ws[kk][rr] = (gc < n && gk < k) ? to_f32(w[(size_t)gc * k + gk]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TK; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = r0 + ty + 16 * i;
        if (r >= m) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int c = c0 + tx + 16 * j;
            if (c < n) out[(size_t)r * n + c] = acc[i][j] + load_bias(bias, bias_dtype, c);
        }
    }
}

#define MATMUL_VEC(DT, T, MT)                                                                          \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32)                                       \
        matmul_vec_##DT##_m##MT(const float* x, const T* w, const void* bias, int bias_dtype, float* out, \
                                int m, int n, int k) {                                                \
        matmul_vec_impl<T, MT>(x, w, bias, bias_dtype, out, m, n, k);                                 \
    }
#define MATMUL_DT(DT, T)                                                                               \
    MATMUL_VEC(DT, T, 1)                                                                               \
    MATMUL_VEC(DT, T, 2)                                                                               \
    MATMUL_VEC(DT, T, 4)                                                                               \
    MATMUL_VEC(DT, T, 8)                                                                               \
    MATMUL_VEC(DT, T, 16)                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                 \
        matmul_tiled_##DT(const float* x, const T* w, const void* bias, int bias_dtype, float* out,   \
                          int m, int n, int k) {                                                      \
        matmul_tiled_impl<T>(x, w, bias, bias_dtype, out, m, n, k);                                   \
    }
MATMUL_DT(f32, float)
MATMUL_DT(bf16, bf16_t)
MATMUL_DT(f16, f16_t)
