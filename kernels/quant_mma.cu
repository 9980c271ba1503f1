// quant_mma.cu — matmul on quantized weights on the tensor cores: FP8 e4m3 runs with their
// scales (W8A16), int4 groups with their scales and zero points (AWQ, GPTQ,
// compressed-tensors), and every GGUF block layout (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
// Q6_K: llama.cpp's Q4_K_M and Q5_K_M mixes whole), dequantized tile by tile into shared memory
// as bf16 and fed to mma.sync.
//
//   out[r, c] = Σ_k x[r, k] · w[c, k] (+ bias[c])   w: n rows of blocks as kernels/quant_matmul.cu
//                                                   reads them, x [m, k] (f32|bf16|f16),
//                                                   out f32 [m, n]
//
// The same weights, the same bytes, as quant_matmul.cu's `fp8`, `int4_g*` and GGUF kernels
// (the register-dequant GEMV); this is the other way to multiply them, picked by
// the backend's switch TANDEM_CUDA_QUANT_TC=1 (crates/cuda/src/switches.rs). It is OFF by
// default: its bits differ from the GEMV's (a different summation order, x rounded to bf16,
// and, for every layout but FP8, the scale applied to a group's sum rather than to each
// weight), and no GPU has timed it yet.
//
// CONTRACT (fixed per (n, k), never dependent on m; kernels/emu/quant_mma_test.h tests it):
//   A weight row is cut into scale groups along k: an int4 group (G = 32, 64 or 128 values, its
//   f32 scale s and zero point z), a Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1 block (32 values, its f16 d
//   widened), 16 values of a Q6_K super-block (scale d * sc[i], one f32 product), a 32-value
//   sub-block s of a Q4_K or Q5_K super-block (scale d * sc[s], one f32 product), or an FP8 run
//   (32 values, scale 1). Within a group the weight's integer part is exact in bf16: q - z for
//   int4 (-255..15), q for Q8_0 (-128..127), q - 8 for Q4_0, q - 16 for Q5_0, q - 32 for Q6_K,
//   q itself (0..15 or 0..31) for the layouts with a min; for FP8 the weight is
//   the reference's decode bf16(e4m3 * scale) (crates/core/src/fp8.rs decode_block: what a
//   widened checkpoint holds; with the e4m3 value exact and the scale after the sum, an FP8
//   model's logits sat 2.8x farther from the reference's than the widened model's on the fake
//   driver, and the op suite's FP8 cases near their limit). x is rounded to bf16 (round to nearest even,
//   common.cuh f32_to_bf16_bits; f16 x is widened to f32 first, so it is rounded twice).
//   For every output element, group g gives a partial p_g: mma.sync m16n8k16 (f32 accumulate)
//   over the group's k16 steps in ascending k, starting from 0. The groups are folded in
//   ascending order, each with one f32 multiply then one f32 add (no FMA: --fmad=false and
//   explicit _rn intrinsics): total = 0; total = total + p_g * scale_g; ...; then + bias[c]
//   if there is one.
//   The layouts with a min (a value is scale_g * q + min_g: Q4_1 and Q5_1 min_g = m, the f16
//   widened; Q4_K and Q5_K min_g = -(dmin * mn[s]), one f32 product negated) add the min's term
//   min_g * Σ_{k in g} x[r, k] per group. Its x-sum X_g[r] is the row's bf16-rounded x over the
//   group, summed as p_g is with every weight 1: mma.sync m16n8k16 against an all-ones bf16
//   fragment over the group's k16 steps in ascending k from 0 (so it depends on row r's x
//   alone, never on the weights, the column or m). Group g's fold is then two steps, in this
//   order: total = total + p_g * scale_g; total = total + X_g[r] * min_g (each one f32
//   multiply then one f32 add). llama.cpp's MMQ carries the same term (its q8_1 x blocks keep
//   their sum beside their scale, multiplied by the weight block's min); here x is bf16 and
//   the sum an mma of its own.
//   The row tile (m16 for m <= 16, m64 above) changes how many rows share a block, never this
//   sequence: row r has the same bits alone, in any batch, and in either tile.
//   As for matmul.cu, this relies on the GPU computing every element of every mma the same
//   way (position in the tile and the other rows irrelevant): true of the emulator by
//   construction, to be confirmed on hardware (the op suite's quant_matmul with the switch on).
//   It does NOT promise the GEMV's bits, nor the reference's: the comparison is by tolerance.
//
// Launch (crates/cuda/src/quant_mma.rs): quant_mma_<layout>_m<BM>, grid (ceil(n / 64),
// ceil(m / BM)), block 128 (4 warps). A block owns BM rows x 64 columns; warp w the columns
// 16w .. 16w + 15 (two n8 fragments) for all BM rows (BM / 16 m16 fragments). K advances a
// stage at a time: BK = 32 in the m64 tile (QT_BK: one FP8 run or GGUF 32-block, a quarter,
// half or whole int4 group, an eighth of a K-quant super-block), BK = 128 in the m16 tile
// (QT_BK_M16: four such 32-wide steps). Each stage the block rounds x's BM x BK tile to bf16 in
// shared memory (rows >= m and columns >= k as zeros) and decodes the weight's 64 x BK tile
// there (two threads a column, 16 values of each 32-wide step each; columns >= n and steps
// past k as zeros), with the scale (and min) of each column's 16-value runs; a barrier; each
// warp runs its BK / 16 k16 steps of mma (those below k) into the group partials, folding them
// into the totals after each k16 step that ends a group; a barrier. Rows of shared memory are
// padded by 8 elements (BK + 8: 80 or 272 bytes) so a fragment load's 8 rows fall in distinct
// banks. The stage depth changes only how many k16 steps share a barrier, never the sequence
// of the contract. Single-buffered (two barriers a stage); the m16 tile's deeper stage is for
// decode, where every stage is a dependent round trip to memory (the perf model,
// xtask/src/perf_cases.rs quant_mma: m = 1, n = 6144, k = 4096 predicted 171 us at BK 32, the
// GEMV 19 us; docs/perf-model.md has the figures at BK 128).
//
// Check: kernels/emu/quant_mma_test.h (against a double dot of the host-decoded weights with
// bf16 x, bitwise against a host model of the contract's order, each row alone vs in a batch
// bitwise for m across both tiles); the op suite's `quant_matmul` on the fake driver and a GPU
// with TANDEM_CUDA_QUANT_TC=1.
#include "common.cuh"

#define QT_BN 64
#define QT_BK 32
#define QT_BK_M16 128
#define QT_WARPS 4

typedef unsigned char u8;

// The OCP e4m3fn value of byte b as f32 (S.1111.111 is NaN; no infinities).
__device__ __forceinline__ float qt_e4m3(u32 b) {
    // Selects, no early return: with the NaN case returned early, ptxas for sm_80 put 8 bytes of
    // quant_mma_fp8_m16 on the stack (a spill the kernel check refuses). The same bits.
    const u32 e = (b >> 3) & 15u, m = b & 7u, sign = (b & 0x80u) << 24;
    const float mag = e == 0u ? (float)m * 0.001953125f : __uint_as_float(((e + 120u) << 23) | (m << 20));
    const u32 bits = (e == 15u && m == 7u) ? 0x7fc00000u : __float_as_uint(mag);
    return __uint_as_float(bits | sign);
}

// Layouts (QtLayout: values and bytes a block, values a scale group):
//   FP8    crates/core/src/fp8.rs pack_blocks: f32 scale, 32 e4m3 bytes (36 bytes, group 32;
//          the weight bf16(e4m3 * scale), the group scale 1)
//   INT4   crates/core/src/int4.rs: f32 scale, zero byte, 3 pad bytes, G / 2 nibble bytes
//   Q8_0   ggml: f16 d, 32 i8 (34 bytes, group 32; integer part q, scale d)
//   Q4_0   ggml: f16 d, 16 bytes of nibbles, value j low and j + 16 high nibble of byte j
//          (18 bytes, group 32; integer part q - 8, scale d)
//   Q6_K   ggml: 128 bytes ql, 64 bytes qh, 16 i8 scales, f16 d (210 bytes, 256 values; group
//          16: integer part q - 32, scale d * sc[i], one f32 product, as quant_matmul.cu's d0)
//   Q4_1   ggml: f16 d, f16 m, 16 bytes of nibbles as Q4_0 (20 bytes, group 32; integer part q,
//          scale d, min m)
//   Q5_0   ggml: f16 d, u32 qh (little-endian bytes), 16 bytes of nibbles as Q4_0; value j's
//          fifth bit is bit j of qh (22 bytes, group 32; integer part q - 16, scale d)
//   Q5_1   ggml: f16 d, f16 m, u32 qh, 16 bytes of nibbles (24 bytes, group 32; integer part q,
//          scale d, min m)
//   Q4_K   ggml: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
//          (144 bytes, 256 values; group 32, sub-block s: integer part q, scale d * sc[s], min
//          -(dmin * mn[s]), each one f32 product, the min's negation exact)
//   Q5_K   ggml: as Q4_K with 32 bytes qh before the nibbles, value l of sub-block s having
//          fifth bit (qh[l] >> s) & 1 (176 bytes, 256 values; group 32, as Q4_K)
enum { QT_FP8, QT_INT4, QT_Q8_0, QT_Q4_0, QT_Q6_K, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q4_K, QT_Q5_K };

template <int KIND, int G> struct QtLayout {
    static constexpr bool kq = KIND == QT_Q6_K || KIND == QT_Q4_K || KIND == QT_Q5_K;
    static constexpr int elems = kq ? 256 : KIND == QT_INT4 ? G : 32;
    static constexpr int bytes = KIND == QT_FP8    ? 36
                                 : KIND == QT_INT4 ? 8 + G / 2
                                 : KIND == QT_Q8_0 ? 34
                                 : KIND == QT_Q4_0 ? 18
                                 : KIND == QT_Q4_1 ? 20
                                 : KIND == QT_Q5_0 ? 22
                                 : KIND == QT_Q5_1 ? 24
                                 : KIND == QT_Q4_K ? 144
                                 : KIND == QT_Q5_K ? 176
                                                   : 210;
    static constexpr int group = KIND == QT_Q6_K ? 16 : KIND == QT_INT4 ? G : 32;
    // A value is scale * q + min: the group's x-sum is folded with the min.
    static constexpr bool has_min = KIND == QT_Q4_1 || KIND == QT_Q5_1 || KIND == QT_Q4_K || KIND == QT_Q5_K;
};

// Sub-block s's 6-bit scale and min of a Q4_K / Q5_K block's 12 bytes (ggml's packing).
__device__ __forceinline__ void qt_scale_min_k4(const u8* q, int s, int& sc, int& mn) {
    if (s < 4) {
        sc = q[s] & 63;
        mn = q[s + 4] & 63;
    } else {
        sc = (q[s + 4] & 15) | ((q[s - 4] >> 6) << 4);
        mn = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
    }
}

__device__ __forceinline__ float qt_f16(const u8* p) { return f16_bits_to_f32((u16)(p[0] | (p[1] << 8))); }

// Half h (values 16h .. 16h + 15) of the 32-value step at offset `off` of a block, as bf16 bits
// of the integer part into v; returns the scale of those 16 values. FP8 blocks are 4-byte
// aligned (36 bytes), int4 blocks 8-byte aligned (24, 40, 72 bytes; the weight is an allocation
// of its own): read as words. The GGUF blocks (34, 18, 210 bytes) are read byte by byte.
// For the layouts with a min, `mn` receives the min of those 16 values (else it is left alone).
template <int KIND, int G>
__device__ __forceinline__ float qt_decode_half(const u8* blk, int off, int h, u16* v, float& mn) {
    if (KIND == QT_Q4_1) {
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = f32_to_bf16_bits((float)((blk[4 + i] >> (4 * h)) & 15));
        mn = qt_f16(blk + 2);
        return qt_f16(blk);
    }
    if (KIND == QT_Q5_0 || KIND == QT_Q5_1) {
        const int o = KIND == QT_Q5_0 ? 2 : 4;
        const u32 qh = (u32)blk[o] | ((u32)blk[o + 1] << 8) | ((u32)blk[o + 2] << 16) | ((u32)blk[o + 3] << 24);
        const int bias = KIND == QT_Q5_0 ? 16 : 0;
#pragma unroll
        for (int i = 0; i < 16; ++i)
            v[i] = f32_to_bf16_bits(
                (float)((((blk[o + 4 + i] >> (4 * h)) & 15) | (int)(((qh >> (16 * h + i)) & 1u) << 4)) - bias));
        if (KIND == QT_Q5_1) mn = qt_f16(blk + 2);
        return qt_f16(blk);
    }
    if (KIND == QT_Q4_K || KIND == QT_Q5_K) {
        const int s = off / 32;
        const u8* qs = blk + (KIND == QT_Q5_K ? 48 : 16) + (s / 2) * 32 + 16 * h;
        const int shift = 4 * (s % 2);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            int q = (qs[i] >> shift) & 15;
            if (KIND == QT_Q5_K) q |= ((blk[16 + 16 * h + i] >> s) & 1) << 4;
            v[i] = f32_to_bf16_bits((float)q);
        }
        int sc, m6;
        qt_scale_min_k4(blk + 4, s, sc, m6);
        mn = -(qt_f16(blk + 2) * (float)m6);
        return qt_f16(blk) * (float)sc;
    }
    if (KIND == QT_Q8_0) {
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = f32_to_bf16_bits((float)(signed char)blk[2 + 16 * h + i]);
        return qt_f16(blk);
    }
    if (KIND == QT_Q4_0) {
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = f32_to_bf16_bits((float)(((blk[2 + i] >> (4 * h)) & 15) - 8));
        return qt_f16(blk);
    }
    if (KIND == QT_Q6_K) {
        // Sub-block s = off / 32 is quarter s % 4 of half s / 4 (quant_matmul.cu's Q6_K).
        const int s = off / 32, hf = s / 4, q4 = s % 4;
        const u8* ql = blk + hf * 64 + (q4 % 2) * 32 + 16 * h;
        const u8* qh = blk + 128 + hf * 32 + 16 * h;
        const int lshift = 4 * (q4 / 2), hshift = 2 * q4;
#pragma unroll
        for (int i = 0; i < 16; ++i)
            v[i] = f32_to_bf16_bits((float)((((ql[i] >> lshift) & 15) | (((qh[i] >> hshift) & 3) << 4)) - 32));
        return qt_f16(blk + 208) * (float)(signed char)blk[192 + off / 16 + h];
    }
    const float scale = __uint_as_float(*reinterpret_cast<const u32*>(blk));
    if (KIND == QT_FP8) {
        // The reference's decode, bf16(e4m3 * scale) (one f32 product, then round to nearest
        // even): the weight a widened checkpoint holds; its group scale is then 1.
        const u32* q = reinterpret_cast<const u32*>(blk + 4 + 16 * h);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const u32 word = q[w];
#pragma unroll
            for (int i = 0; i < 4; ++i) v[4 * w + i] = f32_to_bf16_bits(qt_e4m3((word >> (8 * i)) & 0xffu) * scale);
        }
        return 1.0f;
    } else {
        const int z = blk[4];
        const u32* q = reinterpret_cast<const u32*>(blk + 8 + off / 2 + 8 * h);
#pragma unroll
        for (int w = 0; w < 2; ++w) {
            const u32 word = q[w];
#pragma unroll
            for (int i = 0; i < 8; ++i) v[8 * w + i] = f32_to_bf16_bits((float)((int)((word >> (4 * i)) & 15u) - z));
        }
    }
    return scale;
}

// x[i] rounded to bf16 bits; `code` is load_bias's (1 f32, 2 bf16, 3 f16).
__device__ __forceinline__ u16 qt_x(const void* x, int code, size_t i) {
    switch (code) {
        case 2: return static_cast<const bf16_t*>(x)[i].bits;
        case 3: return f32_to_bf16_bits(to_f32(static_cast<const f16_t*>(x)[i]));
        default: return f32_to_bf16_bits(static_cast<const float*>(x)[i]);
    }
}

// One f32 multiply, one f32 add, each rounded (never contracted; the host emulation is plain
// C++, which g++ does not contract without an FMA target).
#ifdef TANDEM_HOST_EMU
__device__ __forceinline__ float qt_fold(float total, float part, float scale) { return total + part * scale; }
__device__ __forceinline__ float qt_add(float a, float b) { return a + b; }
#else
__device__ __forceinline__ float qt_fold(float total, float part, float scale) {
    return __fadd_rn(total, __fmul_rn(part, scale));
}
__device__ __forceinline__ float qt_add(float a, float b) { return __fadd_rn(a, b); }
#endif

__device__ __forceinline__ u32 qt_pair(const u16* p) { return *reinterpret_cast<const u32*>(p); }

// The k depth of a block's stage: the m64 tile's QT_BK, the m16 tile's QT_BK_M16 (four 32-wide
// steps a stage, so a decode's block has four times the bytes in flight a round trip).
template <int BM> struct QtStage {
    static constexpr int bk = BM == 16 ? QT_BK_M16 : QT_BK;
    static constexpr int pitch = bk + 8;  // shared-memory row in elements, 16 bytes of padding
};

template <int KIND, int G, int BM>
__device__ void quant_mma_impl(const u8* __restrict__ w, const void* __restrict__ x, int x_dtype,
                               const void* __restrict__ bias, int bias_dtype, float* __restrict__ out, int m, int n,
                               int k) {
    using L = QtLayout<KIND, G>;
    constexpr int MF = BM / 16, BK = QtStage<BM>::bk, PITCH = QtStage<BM>::pitch, HALVES = BK / 16;
    // u32 words (fragments are read as 32-bit pairs), used as u16 elements.
    __shared__ u32 xs_words[BM * PITCH / 2];
    __shared__ u32 ws_words[QT_BN * PITCH / 2];
    __shared__ float ss[HALVES * QT_BN];  // the scale of each column's 16-value runs of the stage
    __shared__ float ms[L::has_min ? HALVES * QT_BN : 1];  // and their min, for the layouts with one
    u16* xs = reinterpret_cast<u16*>(xs_words);
    u16* ws = reinterpret_cast<u16*>(ws_words);
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int col0 = blockIdx.x * QT_BN, row0 = blockIdx.y * BM;
    const size_t row_bytes = (size_t)(k / L::elems) * L::bytes;
    float part[MF][2][4], total[MF][2][4];
    // The group's x-sum of each fragment row, for the layouts with a min: an n8 mma against
    // all-ones weights, so every column of it holds the same sum.
    float xsum[MF][4];
#pragma unroll
    for (int i = 0; i < MF; ++i) {
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) part[i][j][e] = total[i][j][e] = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; ++e) xsum[i][e] = 0.0f;
    }
    const u32 ones[2] = {0x3f803f80u, 0x3f803f80u};  // bf16 1.0 pairs
    // The weight column this thread decodes and which half of the step.
    const int wc = tid / 2, wh = tid % 2;
    for (int k0 = 0; k0 < k; k0 += BK) {
        // Past k (the last stage of a k that is no multiple of BK): zeros, and no mma below. The
        // m64 tile's stage is one 32-wide step, never past k: its code has no such test.
        constexpr bool tail = BK != QT_BK;
        for (int i = tid; i < BM * BK; i += 32 * QT_WARPS) {
            const int r = i / BK, c = i % BK;
            xs[r * PITCH + c] = row0 + r < m && (!tail || k0 + c < k) ? qt_x(x, x_dtype, (size_t)(row0 + r) * k + k0 + c) : (u16)0;
        }
#pragma unroll
        for (int st = 0; st < BK / QT_BK; ++st) {
            const int ks = k0 + st * QT_BK;
            u16 v[16];
            float s = 0.0f, mn = 0.0f;
            if (col0 + wc < n && (!tail || ks < k)) {
                const u8* blk = w + (size_t)(col0 + wc) * row_bytes + (size_t)(ks / L::elems) * L::bytes;
                s = qt_decode_half<KIND, G>(blk, ks % L::elems, wh, v, mn);
            } else {
#pragma unroll
                for (int i = 0; i < 16; ++i) v[i] = 0;
            }
#pragma unroll
            for (int i = 0; i < 16; ++i) ws[wc * PITCH + st * QT_BK + 16 * wh + i] = v[i];
            ss[(2 * st + wh) * QT_BN + wc] = s;
            if (L::has_min) ms[(2 * st + wh) * QT_BN + wc] = mn;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            if (tail && k0 + kk >= k) break;  // the same for the whole block
            u32 b[2][2];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const u16* bp = &ws[(warp * 16 + j * 8 + g) * PITCH + kk + 2 * t];
                b[j][0] = qt_pair(bp);
                b[j][1] = qt_pair(bp + 8);
            }
#pragma unroll
            for (int i = 0; i < MF; ++i) {
                const u16* ap = &xs[(i * 16 + g) * PITCH + kk + 2 * t];
                const u32 a[4] = {qt_pair(ap), qt_pair(ap + 8 * PITCH), qt_pair(ap + 8), qt_pair(ap + 8 * PITCH + 8)};
#pragma unroll
                for (int j = 0; j < 2; ++j) mma_16816(bf16_t{}, part[i][j], a, b[j]);
                if (L::has_min) mma_16816(bf16_t{}, xsum[i], a, ones);
            }
            // A group ends after this k16 step: fold it (16-value groups after each step).
            if ((k0 + kk + 16) % L::group == 0) {
                const float* sc = ss + (kk / 16) * QT_BN + warp * 16;
                const float* mc = ms + (L::has_min ? (kk / 16) * QT_BN + warp * 16 : 0);
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const float s0 = sc[j * 8 + 2 * t], s1 = sc[j * 8 + 2 * t + 1];
                    const float m0 = L::has_min ? mc[j * 8 + 2 * t] : 0.0f, m1 = L::has_min ? mc[j * 8 + 2 * t + 1] : 0.0f;
#pragma unroll
                    for (int i = 0; i < MF; ++i)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            total[i][j][e] = qt_fold(total[i][j][e], part[i][j][e], (e & 1) ? s1 : s0);
                            if (L::has_min) total[i][j][e] = qt_fold(total[i][j][e], xsum[i][e], (e & 1) ? m1 : m0);
                            part[i][j][e] = 0.0f;
                        }
                }
                if (L::has_min)
#pragma unroll
                    for (int i = 0; i < MF; ++i)
#pragma unroll
                        for (int e = 0; e < 4; ++e) xsum[i][e] = 0.0f;
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
                const int r = row0 + i * 16 + g + 8 * (e >> 1), c = col0 + warp * 16 + j * 8 + 2 * t + (e & 1);
                if (r >= m || c >= n) continue;
                float v = total[i][j][e];
                if (bias_dtype != 0) v = qt_add(v, load_bias(bias, bias_dtype, c));
                out[(size_t)r * n + c] = v;
            }
}

#define QUANT_MMA_KERNEL(SUFFIX, KIND, G, BM)                                                                      \
    extern "C" __global__ void __launch_bounds__(32 * QT_WARPS)                                                    \
        quant_mma_##SUFFIX##_m##BM(const u8* w, const void* x, int x_dtype, const void* bias, int bias_dtype,      \
                                   float* out, int m, int n, int k) {                                              \
        quant_mma_impl<KIND, G, BM>(w, x, x_dtype, bias, bias_dtype, out, m, n, k);                                \
    }
QUANT_MMA_KERNEL(fp8, QT_FP8, 32, 16)
QUANT_MMA_KERNEL(fp8, QT_FP8, 32, 64)
QUANT_MMA_KERNEL(int4_g32, QT_INT4, 32, 16)
QUANT_MMA_KERNEL(int4_g32, QT_INT4, 32, 64)
QUANT_MMA_KERNEL(int4_g64, QT_INT4, 64, 16)
QUANT_MMA_KERNEL(int4_g64, QT_INT4, 64, 64)
QUANT_MMA_KERNEL(int4_g128, QT_INT4, 128, 16)
QUANT_MMA_KERNEL(int4_g128, QT_INT4, 128, 64)
QUANT_MMA_KERNEL(q8_0, QT_Q8_0, 32, 16)
QUANT_MMA_KERNEL(q8_0, QT_Q8_0, 32, 64)
QUANT_MMA_KERNEL(q4_0, QT_Q4_0, 32, 16)
QUANT_MMA_KERNEL(q4_0, QT_Q4_0, 32, 64)
QUANT_MMA_KERNEL(q6_k, QT_Q6_K, 16, 16)
QUANT_MMA_KERNEL(q6_k, QT_Q6_K, 16, 64)
QUANT_MMA_KERNEL(q4_1, QT_Q4_1, 32, 16)
QUANT_MMA_KERNEL(q4_1, QT_Q4_1, 32, 64)
QUANT_MMA_KERNEL(q5_0, QT_Q5_0, 32, 16)
QUANT_MMA_KERNEL(q5_0, QT_Q5_0, 32, 64)
QUANT_MMA_KERNEL(q5_1, QT_Q5_1, 32, 16)
QUANT_MMA_KERNEL(q5_1, QT_Q5_1, 32, 64)
QUANT_MMA_KERNEL(q4_k, QT_Q4_K, 32, 16)
QUANT_MMA_KERNEL(q4_k, QT_Q4_K, 32, 64)
QUANT_MMA_KERNEL(q5_k, QT_Q5_K, 32, 16)
QUANT_MMA_KERNEL(q5_k, QT_Q5_K, 32, 64)
