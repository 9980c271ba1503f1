// quant_mma_w8a8.cu — FP8 e4m3 weights times activations quantized to e4m3 per token (W8A8),
// on the fp8 tensor cores of sm_89 and newer (mma.sync m16n8k32 e4m3 x e4m3, f32 accumulate), as
// vLLM runs an FP8 checkpoint there (a dynamic per-token activation scale, then
// out = acc * x_scale[row] * w_scale).
//
//   out[r, c] = Σ_k x[r, k] · w[c, k] (+ bias[c])   w: n rows of FP8 runs (crates/core/src/fp8.rs
//                                                   pack_blocks: f32 scale, 32 e4m3 bytes),
//                                                   x [m, k] (f32|bf16|f16), out f32 [m, n]
//
// The same weights, the same bytes, as quant_matmul.cu's `fp8` (the register-dequant GEMV, W8A16)
// and quant_mma.cu's `fp8` (bf16 mma on decoded weights); picked by TANDEM_CUDA_QUANT_TC=w8a8
// (crates/cuda/src/switches.rs) on a GPU of sm_89 or newer, OFF by default: x is rounded to 3
// mantissa bits (a relative error up to 2^-4 an element, against bf16's 2^-9), its bits differ
// from both other kernels', and no GPU has timed it. Every scale layout the loader reads (per
// tensor, per channel, 128 x 128 blocks) arrives as a scale per 32-value run of a row (a run
// never straddles a 128-block), so one kernel runs them all, the run's scale applied to its
// partial.
//
// CONTRACT (fixed per (n, k), never dependent on m; kernels/emu/quant_mma_w8a8_test.h tests it):
//   Row scale: amax_r = max_k |x[r, k]| (x as f32; f16 and bf16 widened exactly; a NaN element
//   is skipped by fmaxf, so it stays NaN through its byte), s_r = max(amax_r / 448,
//   1 / (448 * 512)) (vLLM's floor, so an all-zero row divides by a positive number). From row r
//   alone: a max is exact in any order, so its bits never depend on the batch.
//   Element: q[r, k] = e4m3(x[r, k] / s_r), IEEE f32 division, rounded to nearest even and
//   saturated to ±448 (common.cuh fp8_encode, the FP8 KV cache's encode, bit for bit).
//   For every output element, run j (k = 32j .. 32j + 31) gives a partial p_j: one mma.sync
//   m16n8k32 on e4m3 q and the run's 32 weight bytes, starting from 0 (so whatever the
//   hardware keeps inside one instruction covers 32 products, never the whole k: DeepSeek-V3's
//   report of fp8 mma accumulating in fewer than f32's bits is why). The runs fold in ascending
//   j, one f32 multiply then one f32 add each (no FMA: explicit _rn intrinsics):
//   total = 0; total = total + p_j * w_scale_j; ...; out = total * s_r (+ bias[c]).
//   The row tile (m16 for m <= 16, m64 above) changes how many rows share a block, never this
//   sequence: row r has the same bits alone, in any batch, and in either tile, given that the
//   GPU computes every element of every mma the same way (the emulator by construction; on
//   hardware unconfirmed: no GPU has run this file, gpu/tune.sh's `quant_tc w8a8` steps are the
//   first to). The order of the 32 products inside one mma is the hardware's and not public.
//   As cuda_emu.h's bf16 mma does (mma_m16n8k16: 16 exact products added to the accumulator
//   one at a time in ascending k, each add rounded to f32), its e4m3 mma (mma_m16n8k32_e4m3)
//   adds the 32 exact products in ascending k: emulated bits match a host model of that order,
//   while a GPU is held only to the tolerance against the dequantized product.
//
// Launch (crates/cuda/src/quant_mma_w8a8.rs): quant_mma_w8a8_fp8_m<BM>, grid (ceil(n / 64),
// ceil(m / BM)), block 128 (4 warps), the GEMV's argument list. First each warp takes rows
// w, w + 4, ... of the block's BM and finds their amax (lanes stride k, then a butterfly max);
// the scales go to shared memory. Then K advances 32 at a time: the block quantizes x's BM x 32
// tile to e4m3 bytes in shared memory (rows >= m as zeros; every column block quantizes the
// same rows alike, so the activation is never written back to global memory) and copies the
// weight's 64 x 32 bytes there (two threads a column, 16 bytes each, columns >= n as zeros)
// with each column's run scale; a barrier; warp w runs one m16n8k32 per m16 fragment and n8
// fragment of its 16 columns and folds it. Rows of shared memory are 48 bytes apart, so a
// fragment load's 8 rows x 4 words fall in 32 distinct banks. Single-buffered: the simple
// form, to be tuned once timed.
//
// Below sm_89 the mma does not exist: the kernels compile to a trap there and the backend never
// launches them (the switch falls back to quant_mma.cu's W8A16 with a log line).
#include "common.cuh"

#define W8_BN 64
#define W8_BK 32
#define W8_PITCH 48
#define W8_WARPS 4
#define W8_RUN_BYTES 36

#if defined(TANDEM_HOST_EMU) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890)
#define W8_HAS_FP8_MMA 1
#endif

typedef unsigned char u8;

// x[i] as f32; `code` is load_bias's (1 f32, 2 bf16, 3 f16).
__device__ __forceinline__ float w8_x(const void* x, int code, size_t i) {
    switch (code) {
        case 2: return to_f32(static_cast<const bf16_t*>(x)[i]);
        case 3: return to_f32(static_cast<const f16_t*>(x)[i]);
        default: return static_cast<const float*>(x)[i];
    }
}

// A row's scale from its amax: amax / 448, at least 1 / (448 * 512).
__device__ __forceinline__ float w8_row_scale(float amax) {
    return fmaxf(amax / 448.0f, 1.0f / (448.0f * 512.0f));
}

// The e4m3 byte of x / s (the FP8 KV cache's encode).
__device__ __forceinline__ u32 w8_quant(float x, float s) { return fp8_encode(x / s, 3, 7, 448.0f); }

#ifdef TANDEM_HOST_EMU
__device__ __forceinline__ float w8_fold(float total, float part, float scale) { return total + part * scale; }
__device__ __forceinline__ float w8_mul(float a, float b) { return a * b; }
__device__ __forceinline__ float w8_add(float a, float b) { return a + b; }
#else
__device__ __forceinline__ float w8_fold(float total, float part, float scale) {
    return __fadd_rn(total, __fmul_rn(part, scale));
}
__device__ __forceinline__ float w8_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float w8_add(float a, float b) { return __fadd_rn(a, b); }
#endif

#ifdef W8_HAS_FP8_MMA
// d = a * b on one m16n8k32 e4m3 tile, from zero (A row-major 16x32, B column-major 32x8).
__device__ __forceinline__ void w8_mma(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
#ifdef TANDEM_HOST_EMU
    const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    emu::mma_m16n8k32_e4m3(d, a, b, zero);
#else
    d[0] = d[1] = d[2] = d[3] = 0.0f;
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

template <int BM>
__device__ void w8a8_impl(const u8* __restrict__ w, const void* __restrict__ x, int x_dtype,
                          const void* __restrict__ bias, int bias_dtype, float* __restrict__ out, int m, int n, int k) {
    constexpr int MF = BM / 16;
    __shared__ u32 xs[BM * W8_PITCH / 4];
    __shared__ u32 ws[W8_BN * W8_PITCH / 4];
    __shared__ float wscale[W8_BN];
    __shared__ float xscale[BM];
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int col0 = blockIdx.x * W8_BN, row0 = blockIdx.y * BM;
    const size_t row_bytes = (size_t)(k / W8_BK) * W8_RUN_BYTES;
    for (int r = warp; r < BM; r += W8_WARPS) {
        float a = 0.0f;
        if (row0 + r < m)
            for (int i = lane; i < k; i += 32) a = fmaxf(a, fabsf(w8_x(x, x_dtype, (size_t)(row0 + r) * k + i)));
        a = warp_max(a);
        if (lane == 0) xscale[r] = w8_row_scale(a);
    }
    __syncthreads();
    float total[MF][2][4];
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) total[i][j][e] = 0.0f;
    // The weight column this thread copies and which 16 bytes of the run.
    const int wc = tid / 2, wh = tid % 2;
    for (int k0 = 0; k0 < k; k0 += W8_BK) {
        // x: 4 consecutive values a word, BM rows x 8 words.
        for (int i = tid; i < BM * (W8_BK / 4); i += 32 * W8_WARPS) {
            const int r = i / (W8_BK / 4), c = 4 * (i % (W8_BK / 4));
            u32 word = 0;
            if (row0 + r < m) {
                const float s = xscale[r];
                const size_t at = (size_t)(row0 + r) * k + k0 + c;
#pragma unroll
                for (int b = 0; b < 4; ++b) word |= w8_quant(w8_x(x, x_dtype, at + b), s) << (8 * b);
            }
            xs[r * (W8_PITCH / 4) + c / 4] = word;
        }
        {
            u32 v[4] = {0u, 0u, 0u, 0u};
            float s = 0.0f;
            if (col0 + wc < n) {
                const u32* run = reinterpret_cast<const u32*>(w + (size_t)(col0 + wc) * row_bytes +
                                                              (size_t)(k0 / W8_BK) * W8_RUN_BYTES);
                s = __uint_as_float(run[0]);
#pragma unroll
                for (int i = 0; i < 4; ++i) v[i] = run[1 + 4 * wh + i];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) ws[wc * (W8_PITCH / 4) + 4 * wh + i] = v[i];
            if (wh == 0) wscale[wc] = s;
        }
        __syncthreads();
        u32 b[2][2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const u32* bp = &ws[(warp * 16 + j * 8 + g) * (W8_PITCH / 4) + t];
            b[j][0] = bp[0];
            b[j][1] = bp[4];
        }
        float s[2][2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            s[j][0] = wscale[warp * 16 + j * 8 + 2 * t];
            s[j][1] = wscale[warp * 16 + j * 8 + 2 * t + 1];
        }
#pragma unroll
        for (int i = 0; i < MF; ++i) {
            const u32* ap = &xs[(i * 16 + g) * (W8_PITCH / 4) + t];
            const u32 a[4] = {ap[0], ap[8 * (W8_PITCH / 4)], ap[4], ap[8 * (W8_PITCH / 4) + 4]};
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                float part[4];
                w8_mma(part, a, b[j]);
#pragma unroll
                for (int e = 0; e < 4; ++e) total[i][j][e] = w8_fold(total[i][j][e], part[e], s[j][e & 1]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int rr = i * 16 + g + 8 * (e >> 1);
                const int r = row0 + rr, c = col0 + warp * 16 + j * 8 + 2 * t + (e & 1);
                if (r >= m || c >= n) continue;
                float v = w8_mul(total[i][j][e], xscale[rr]);
                if (bias_dtype != 0) v = w8_add(v, load_bias(bias, bias_dtype, c));
                out[(size_t)r * n + c] = v;
            }
}
#endif

#ifdef W8_HAS_FP8_MMA
#define W8A8_BODY(BM) w8a8_impl<BM>(w, x, x_dtype, bias, bias_dtype, out, m, n, k)
#else
#define W8A8_BODY(BM) __trap()
#endif

#define QUANT_MMA_W8A8_KERNEL(BM)                                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * W8_WARPS)                                                   \
        quant_mma_w8a8_fp8_m##BM(const u8* w, const void* x, int x_dtype, const void* bias, int bias_dtype,       \
                                 float* out, int m, int n, int k) {                                               \
        W8A8_BODY(BM);                                                                                            \
    }
QUANT_MMA_W8A8_KERNEL(16)
QUANT_MMA_W8A8_KERNEL(64)
