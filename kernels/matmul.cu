// matmul.cu — y = x · Wᵀ (+ bias), the projection of torch.nn.Linear.
//
//   out[r, c] = sum_k x[r, k] * w[c, k] (+ bias[c])
//   x f32 [m, k]; w [n, k] row-major (bf16|f16|f32); bias [n] (any weight dtype, or none); out f32 [m, n]
//
// CONTRACT (what makes a token's bits independent of its batch; emu_test.cpp tests it bitwise):
//   For bf16 and f16 weights every output element is computed on the tensor cores as the same
//   sequence of k16 steps in ascending k, accumulated in f32 (mma.sync m16n8k16, C = A·B + C),
//   from x rounded to the weight's 16-bit format (round to nearest even) and the weights as
//   stored. K may be cut into `slices` of `slice_len` (a multiple of 32) whose count and bounds
//   depend only on (n, k) — never on m, on the other rows of the step, or on occupancy
//   (crates/cuda/src/backend.rs `k_slices`); each slice starts from 0, and slices are folded in
//   index order: total = p0; total += p1; ...; then + bias[c] if there is a bias. Whether the
//   fold happens in registers (one block walks every slice) or in a second pass over a
//   workspace (`matmul_fold`, one block per slice) gives the same bits. Tile shapes change with
//   m (the m16 / m64 / m128 kernels); the reduction order does not, so row r of a step has the
//   same bits alone, in any batch, and in either kernel. This relies on the GPU computing every
//   element of every mma the same way (position in the tile and neighbours irrelevant) — true
//   of the emulator by construction, to be confirmed on hardware by tests/gpu_invariance.rs.
//   It does NOT promise bitwise agreement with the CPU reference (the hardware's summation order
//   inside one mma is undocumented): the reference comparison is by tolerance.
//   f32 weights take `matmul_tiled_f32` for every m: one fma chain over k = 0..k-1 per output
//   (f32 CUDA cores, exact-f32 quality, not fast; only checks and tiny models use f32 weights).
//
// Launch (backend.rs `matmul`):
//   1. matmul_x_<dt>: x f32 [m, k] -> xa [m, kp] 16-bit (kp = k rounded up to 8, zero padded),
//      so every row of xa is 16-byte aligned for cp.async. grid (m), block 256.
//   2. matmul_tc_<dt>_m<BM>: output tile BM x 64 per block, grid (ceil(n/64), ceil(m/BM), z).
//        m16  (m <= 16):   4 warps, each 16x16;  4-stage cp.async pipeline; decode
//        m64  (m <= 128):  4 warps, each 32x32;  4 stages
//        m128 (m > 128):   8 warps, each 32x32;  3 stages; prefill
//      z = slices (one slice per block, partial sums to the workspace `part` [slices, m, n])
//      for m <= 128 when slices > 1, so a decode step has ceil(n/64) * slices blocks in flight
//      (about 264, two per SM on the H200, for every n <= 16896); else z = 1 and each block
//      folds its slices in registers and writes out.
//   3. matmul_fold (only when z > 1): out = p0 + p1 + ... (+ bias), grid ceil(m*n/256).
//   Shared memory (dynamic): per stage BM x 32 of xa and 64 x 32 of w, rows padded to 40
//   elements (80 bytes), so the 8 row addresses of every ldmatrix fall in 8 distinct 16-byte
//   bank groups (no conflicts). k % 8 != 0 breaks the 16-byte alignment of w's rows: those
//   tiles of w are loaded element by element (predicated), the rest of the pipeline unchanged.
//   The k tail of the last tile is zero-filled (cp.async src-size 0), adding exact zeros.
// Check: tandem-kernels-check --only matmul (PTX mma count, registers, spills); emu_test.cpp
// `test_matmul` (f64 reference with derived bf16/f16 bounds, bitwise rows across m); op suite
// ops `matmul` on a GPU.
#include "common.cuh"

#define GEMM_BN 64
#define GEMM_BK 32
#define GEMM_PITCH 40  // elements per shared-memory row: 80 bytes, see above

// Test hooks, defined only by kernels/emu/break_test.cpp to prove the emulator catches the
// bug: 1 swaps two B fragments (a wrong fragment index), 2 drops the cp.async wait.
#ifndef TANDEM_GEMM_BREAK
#define TANDEM_GEMM_BREAK 0
#endif

// x f32 -> the 16-bit operand format, rows padded with zeros to kp (a multiple of 8).
template <typename T>
__device__ void matmul_x_impl(const float* __restrict__ x, u16* __restrict__ xa, int m, int k, int kp) {
    const int r = blockIdx.x;
    if (r >= m) return;
    for (int i = threadIdx.x; i < kp; i += blockDim.x)
        xa[(size_t)r * kp + i] = i < k ? f32_to_bits(T{}, x[(size_t)r * k + i]) : (u16)0;
}

template <int BM_, int WM_, int WN_, int STAGES_>
struct GemmShape {
    static constexpr int BM = BM_, BN = GEMM_BN, BK = GEMM_BK, P = GEMM_PITCH, STAGES = STAGES_;
    static constexpr int WM = WM_, WN = WN_, WARPS_N = BN / WN, WARPS = (BM / WM) * WARPS_N, THREADS = WARPS * 32;
    static constexpr int MI = WM / 16, NJ = WN / 8;  // mma tiles per warp
    static constexpr int A_ELEMS = BM * P, B_ELEMS = BN * P;
    static constexpr int SMEM_BYTES = STAGES * (A_ELEMS + B_ELEMS) * 2;
    static_assert(WN % 16 == 0 && WM % 16 == 0, "one ldmatrix.x4 feeds one m16 tile of A or two n8 tiles of B");
    static_assert(SMEM_BYTES <= 48 * 1024, "more needs cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
};

// Copies k-tile kt (columns 32 kt .. 32 kt + 31) of xa and w into one pipeline stage.
template <typename S>
__device__ __forceinline__ void gemm_load_tile(u16* As, u16* Bs, const u16* __restrict__ xa, const u16* __restrict__ w, int m, int n,
                                               int k, int kp, int m0, int n0, int kt) {
    const int tid = threadIdx.x, k0 = kt * S::BK;
    // xa: BM rows x 4 chunks of 8 elements; kp is a multiple of 8, so a chunk is wholly in or out.
#pragma unroll
    for (int c = tid; c < S::BM * 4; c += S::THREADS) {
        const int r = c >> 2, kc = k0 + (c & 3) * 8;
        const bool ok = m0 + r < m && kc < kp;
        const u16* src = ok ? xa + (size_t)(m0 + r) * kp + kc : xa;
        cp_async_ca16(As + r * S::P + (c & 3) * 8, src, ok ? 16 : 0);
    }
    if ((k & 7) == 0) {
#pragma unroll
        for (int c = tid; c < S::BN * 4; c += S::THREADS) {
            const int r = c >> 2, kc = k0 + (c & 3) * 8;
            const bool ok = n0 + r < n && kc < k;
            const u16* src = ok ? w + (size_t)(n0 + r) * k + kc : w;
            cp_async_cg16(Bs + r * S::P + (c & 3) * 8, src, ok ? 16 : 0);
        }
    } else {
        // Rows of w are not 16-byte aligned: plain predicated loads, visible after the barrier
        // that precedes this stage's use like the asynchronous ones.
        for (int e = tid; e < S::BN * S::BK; e += S::THREADS) {
            const int r = e / S::BK, kk = e % S::BK;
            const bool ok = n0 + r < n && k0 + kk < k;
            Bs[r * S::P + kk] = ok ? w[(size_t)(n0 + r) * k + k0 + kk] : (u16)0;
        }
    }
}

// One block: output tile [m0, m0 + BM) x [n0, n0 + 64). With gridDim.z > 1 the block owns slice
// blockIdx.z alone and writes its partial sums to part; otherwise it walks every slice,
// folding each into `total` as it ends, and writes out (+ bias).
template <typename T, typename S>
__device__ void matmul_tc_impl(const u16* __restrict__ xa, const u16* __restrict__ w, const void* __restrict__ bias, int bias_dtype,
                               float* __restrict__ out, float* __restrict__ part, int m, int n, int k, int kp, int slice_len, int slices) {
    TANDEM_DYNAMIC_SMEM(smem_raw);
    u16* As = reinterpret_cast<u16*>(smem_raw);
    u16* Bs = As + S::STAGES * S::A_ELEMS;
    const int m0 = blockIdx.y * S::BM, n0 = blockIdx.x * S::BN;
    const bool split = gridDim.z > 1;
    const int s_begin = split ? (int)blockIdx.z : 0, s_end = split ? (int)blockIdx.z + 1 : slices;
    const int tiles_per_slice = slice_len / S::BK;
    const int kt_begin = s_begin * tiles_per_slice;
    const int k_end = min(k, s_end * slice_len);
    const int nt = k_end > kt_begin * S::BK ? (k_end + S::BK - 1) / S::BK - kt_begin : 0;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm0 = (warp / S::WARPS_N) * S::WM, wn0 = (warp % S::WARPS_N) * S::WN;
    float acc[S::MI][S::NJ][4], total[S::MI][S::NJ][4];
#pragma unroll
    for (int i = 0; i < S::MI; ++i)
#pragma unroll
        for (int j = 0; j < S::NJ; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = total[i][j][q] = 0.0f;

    // Prologue: tiles 0 .. STAGES-2 in flight, one commit group each (empty groups keep the count).
#pragma unroll
    for (int s = 0; s < S::STAGES - 1; ++s) {
        if (s < nt) gemm_load_tile<S>(As + s * S::A_ELEMS, Bs + s * S::B_ELEMS, xa, w, m, n, k, kp, m0, n0, kt_begin + s);
        cp_async_commit();
    }
    bool first_slice = true;
    for (int i = 0; i < nt; ++i) {
#if TANDEM_GEMM_BREAK != 2
        cp_async_wait<S::STAGES - 2>();  // this thread's copies of tile i have landed
#endif
        __syncthreads();  // ... everyone's have; and everyone is done with tile i - 1's stage
        {
            const int next = i + S::STAGES - 1, st = next % S::STAGES;
            if (next < nt) gemm_load_tile<S>(As + st * S::A_ELEMS, Bs + st * S::B_ELEMS, xa, w, m, n, k, kp, m0, n0, kt_begin + next);
            cp_async_commit();
        }
        const u16* a_st = As + (i % S::STAGES) * S::A_ELEMS;
        const u16* b_st = Bs + (i % S::STAGES) * S::B_ELEMS;
#pragma unroll
        for (int kk = 0; kk < S::BK; kk += 16) {
            u32 af[S::MI][4], bfr[S::NJ][2];
#pragma unroll
            for (int mi = 0; mi < S::MI; ++mi)  // matrices: rows 0-7 / 8-15 x cols 0-7, then cols 8-15
                ldmatrix_x4(af[mi], a_st + (wm0 + mi * 16 + (lane & 15)) * S::P + kk + (lane >> 4) * 8);
#pragma unroll
            for (int nj = 0; nj < S::NJ; nj += 2) {  // matrices: n 0-7 x k 0-7, k 8-15, then n 8-15
                u32 r[4];
                ldmatrix_x4(r, b_st + (wn0 + nj * 8 + (lane & 7) + ((lane >> 4) << 3)) * S::P + kk + ((lane >> 3) & 1) * 8);
#if TANDEM_GEMM_BREAK == 1
                bfr[nj][0] = r[0]; bfr[nj][1] = r[2]; bfr[nj + 1][0] = r[1]; bfr[nj + 1][1] = r[3];
#else
                bfr[nj][0] = r[0]; bfr[nj][1] = r[1]; bfr[nj + 1][0] = r[2]; bfr[nj + 1][1] = r[3];
#endif
            }
#pragma unroll
            for (int mi = 0; mi < S::MI; ++mi)
#pragma unroll
                for (int nj = 0; nj < S::NJ; ++nj) mma_16816(T{}, acc[mi][nj], af[mi], bfr[nj]);
        }
        if ((kt_begin + i + 1) % tiles_per_slice == 0 || i == nt - 1) {  // a slice ends: fold it in
#pragma unroll
            for (int mi = 0; mi < S::MI; ++mi)
#pragma unroll
                for (int nj = 0; nj < S::NJ; ++nj)
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        total[mi][nj][q] = first_slice ? acc[mi][nj][q] : total[mi][nj][q] + acc[mi][nj][q];
                        acc[mi][nj][q] = 0.0f;
                    }
            first_slice = false;
        }
    }
    // Accumulator fragment: c0, c1 at row g, columns 2t, 2t+1; c2, c3 at row g + 8.
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < S::MI; ++mi)
#pragma unroll
        for (int nj = 0; nj < S::NJ; ++nj)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int r = m0 + wm0 + mi * 16 + g + 8 * (q >> 1), c = n0 + wn0 + nj * 8 + 2 * t + (q & 1);
                if (r >= m || c >= n) continue;
                const float v = total[mi][nj][q];
                if (split) part[((size_t)blockIdx.z * m + r) * n + c] = v;
                else out[(size_t)r * n + c] = bias_dtype ? v + load_bias(bias, bias_dtype, c) : v;
            }
}

// The fixed-order second pass of a split K: out = ((p0 + p1) + p2) ... (+ bias), like the
// in-register fold above.
__device__ void matmul_fold_impl(const float* __restrict__ part, const void* __restrict__ bias, int bias_dtype, float* __restrict__ out,
                                 int m, int n, int slices) {
    const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x, mn = (size_t)m * n;
    if (e >= mn) return;
    float v = part[e];
    for (int s = 1; s < slices; ++s) v = v + part[(size_t)s * mn + e];
    out[e] = bias_dtype ? v + load_bias(bias, bias_dtype, (int)(e % (size_t)n)) : v;
}

// SIMT f32 path for f32 weights: 64x64 output tile per block of 256 threads, 4x4 outputs per
// thread, k in steps of 16 staged through shared memory. Every output is one sequential fma
// chain over k = 0..k-1, whatever m is.
#define TM 64
#define TN 64
#define TK 16

__device__ void matmul_tiled_f32_impl(const float* __restrict__ x, const float* __restrict__ w, const void* __restrict__ bias,
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
            ws[kk][rr] = (gc < n && gk < k) ? w[(size_t)gc * k + gk] : 0.0f;
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

typedef GemmShape<16, 16, 16, 4> GemmM16;
typedef GemmShape<64, 32, 32, 4> GemmM64;
typedef GemmShape<128, 32, 32, 3> GemmM128;

#define MATMUL_TC(DT, T, NAME, SHAPE)                                                                                  \
    extern "C" __global__ void __launch_bounds__(SHAPE::THREADS)                                                     \
        matmul_tc_##DT##_##NAME(const u16* xa, const u16* w, const void* bias, int bias_dtype, float* out, float* part, \
                                int m, int n, int k, int kp, int slice_len, int slices) {                            \
        matmul_tc_impl<T, SHAPE>(xa, w, bias, bias_dtype, out, part, m, n, k, kp, slice_len, slices);                \
    }
#define MATMUL_DT(DT, T)                                                                                               \
    extern "C" __global__ void __launch_bounds__(256) matmul_x_##DT(const float* x, u16* xa, int m, int k, int kp) {  \
        matmul_x_impl<T>(x, xa, m, k, kp);                                                                           \
    }                                                                                                                \
    MATMUL_TC(DT, T, m16, GemmM16)                                                                                   \
    MATMUL_TC(DT, T, m64, GemmM64)                                                                                   \
    MATMUL_TC(DT, T, m128, GemmM128)
MATMUL_DT(bf16, bf16_t)
MATMUL_DT(f16, f16_t)

extern "C" __global__ void __launch_bounds__(256)
    matmul_fold(const float* part, const void* bias, int bias_dtype, float* out, int m, int n, int slices) {
    matmul_fold_impl(part, bias, bias_dtype, out, m, n, slices);
}
extern "C" __global__ void __launch_bounds__(256)
    matmul_tiled_f32(const float* x, const float* w, const void* bias, int bias_dtype, float* out, int m, int n, int k) {
    matmul_tiled_f32_impl(x, w, bias, bias_dtype, out, m, n, k);
}
