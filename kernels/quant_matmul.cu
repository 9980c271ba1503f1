// quant_matmul.cu — matmul and embedding on weights kept in a GGUF block layout, as FP8 e4m3
// runs with their scales, or as int4 groups with their scales and zero points.
//
//   out[r, c] = Σ_k x[r, k] · w[c, k] (+ bias[c])   w: n rows of GGUF blocks, x [m, k] (f32|bf16|f16),
//                                                   out f32 [m, n]
//   out[t, :] = table[ids[t], :]                     table: vocab rows of GGUF blocks, out f32 [T, hidden]
//
// A weight row is its GGUF bytes as stored (rows one after another, a block never spans two
// rows: tandem_core::quant_layout). Values are decoded in registers, 32 at a time (a "unit":
// a whole Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 block, or one of the eight 32-value sub-blocks of a
// Q4_K/Q5_K/Q6_K super-block, or an FP8 run: its f32 scale, then 32 e4m3 bytes as the checkpoint
// stores them, crates/core/src/fp8.rs `pack_blocks`; or a quarter, half or whole of an int4
// group of 128, 64 or 32, crates/core/src/int4.rs), with crates/core/src/quant_block.rs's arithmetic (ggml's order:
// a sub-block's scale `d * sc` first, then `scale * q - dmin * m`; no FMA: NVRTC runs with
// --fmad=false), so a decoded weight has the bits the reference decodes. Activations are not
// quantized: x is widened to f32 and the dot is f32.
//
// Matmul launch: grid (ceil(n / QM_WARPS), ceil(m / QM_ROWS)), block 32 * QM_WARPS. A warp owns
// one output column and QM_ROWS rows of x: lane l decodes units l, l + 32, l + 64, ... of the
// column's weight row (each unit once for all QM_ROWS rows), adds each unit's 32 products in
// ascending k into its own f32 sum per row, and the 32 lane sums are folded by warp_sum's fixed
// xor tree. Batch invariance: a row's arithmetic is that sequence whatever m is and whichever
// rows share its block (no split K, no atomics), so row r has the same bits alone or in any
// batch. The prefill path (m > QM_ROWS) is this GEMV over blocks of QM_ROWS rows: each weight
// row is read ceil(m / QM_ROWS) times (from L2 mostly). FP8, int4, Q8_0, Q4_0 and Q6_K have a
// tensor-core path that decodes tiles into shared memory as bf16 (kernels/quant_mma.cu, behind
// the switch TANDEM_CUDA_QUANT_TC=1, off by default: other bits); the layouts with a min
// (Q4_1, Q5_1, Q4_K, Q5_K) and Q5_0 have none yet.
//
// Embedding launch: grid (T), block 256: threads stride over the row's units; an id >= vocab
// writes a NaN row (as embedding.cu).
//
// Check: kernels/emu/quant_test.h (every layout against a host decode of the same blocks, and
// the batch-invariance property); on the fake driver and a GPU, the op suite's `quant_matmul`.
#include "common.cuh"

typedef unsigned char u8;

#define QM_WARPS 4
#define QM_ROWS 8

__device__ __forceinline__ float qm_f16(const u8* p) { return f16_bits_to_f32((u16)(p[0] | (p[1] << 8))); }

// x[i] widened to f32; `code` is load_bias's (1 f32, 2 bf16, 3 f16).
__device__ __forceinline__ float qm_x(const void* x, int code, size_t i) {
    switch (code) {
        case 2: return to_f32(static_cast<const bf16_t*>(x)[i]);
        case 3: return to_f32(static_cast<const f16_t*>(x)[i]);
        default: return static_cast<const float*>(x)[i];
    }
}

__device__ __forceinline__ u32 qm_u32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// The (scale, min) pair j of Q4_K / Q5_K from their 12 scale bytes (quant_block.rs scale_min_k4).
__device__ __forceinline__ void qm_scale_min_k4(const u8* sc, int j, int& s, int& m) {
    if (j < 4) {
        s = sc[j] & 63;
        m = sc[j + 4] & 63;
    } else {
        s = (sc[j + 4] & 0x0f) | ((sc[j - 4] >> 6) << 4);
        m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}

// Layout codes (the kernel name's suffix): block elements and bytes (QLayout), and `qm_decode`
// of sub-block s of one block (32 values) into v, an overload per layout.
enum { QL_Q8_0, QL_Q4_0, QL_Q4_1, QL_Q5_0, QL_Q5_1, QL_Q4_K, QL_Q5_K, QL_Q6_K, QL_FP8, QL_INT4_G32, QL_INT4_G64, QL_INT4_G128 };

template <int L> struct QLayout;

template <> struct QLayout<QL_Q8_0> {
    static constexpr int elems = 32, bytes = 34;
};
__device__ __forceinline__ void qm_decode(QLayout<QL_Q8_0>, const u8* b, int, float* v) {
    const float d = qm_f16(b);
    for (int l = 0; l < 32; ++l) v[l] = d * (float)(signed char)b[2 + l];
}

template <> struct QLayout<QL_Q4_0> {
    static constexpr int elems = 32, bytes = 18;
};
__device__ __forceinline__ void qm_decode(QLayout<QL_Q4_0>, const u8* b, int, float* v) {
    const float d = qm_f16(b);
    for (int j = 0; j < 16; ++j) {
        const int q = b[2 + j];
        v[j] = d * (float)((q & 0x0f) - 8);
        v[j + 16] = d * (float)((q >> 4) - 8);
    }
}

template <> struct QLayout<QL_Q4_1> {
    static constexpr int elems = 32, bytes = 20;
};
__device__ __forceinline__ void qm_decode(QLayout<QL_Q4_1>, const u8* b, int, float* v) {
    const float d = qm_f16(b), m = qm_f16(b + 2);
    for (int j = 0; j < 16; ++j) {
        const int q = b[4 + j];
        v[j] = d * (float)(q & 0x0f) + m;
        v[j + 16] = d * (float)(q >> 4) + m;
    }
}

// The 5-bit values of Q5_0 / Q5_1: low nibbles as Q4_0's, bit i of qh is element i's fifth bit.
__device__ __forceinline__ void qm_q5_values(const u8* qh_bytes, const u8* qs, int* q) {
    const u32 h = qm_u32(qh_bytes);
    for (int j = 0; j < 16; ++j) {
        q[j] = (qs[j] & 0x0f) | (((h >> j) & 1) << 4);
        q[j + 16] = (qs[j] >> 4) | (((h >> (j + 16)) & 1) << 4);
    }
}

template <> struct QLayout<QL_Q5_0> {
    static constexpr int elems = 32, bytes = 22;
};
__device__ __forceinline__ void qm_decode(QLayout<QL_Q5_0>, const u8* b, int, float* v) {
    const float d = qm_f16(b);
    int q[32];
    qm_q5_values(b + 2, b + 6, q);
    for (int l = 0; l < 32; ++l) v[l] = d * (float)(q[l] - 16);
}

template <> struct QLayout<QL_Q5_1> {
    static constexpr int elems = 32, bytes = 24;
};
__device__ __forceinline__ void qm_decode(QLayout<QL_Q5_1>, const u8* b, int, float* v) {
    const float d = qm_f16(b), m = qm_f16(b + 2);
    int q[32];
    qm_q5_values(b + 4, b + 8, q);
    for (int l = 0; l < 32; ++l) v[l] = d * (float)q[l] + m;
}

// Q4_K and Q5_K share the header (d, dmin, 12 scale bytes) and the nibble layout; Q5_K adds 32
// bytes of fifth bits before the nibbles.
template <bool FIVE>
__device__ __forceinline__ void qm_decode_k45(const u8* b, int s, float* v) {
    const float d = qm_f16(b), dmin = qm_f16(b + 2);
    int sc, mn;
    qm_scale_min_k4(b + 4, s, sc, mn);
    const float d1 = d * (float)sc, m1 = dmin * (float)mn;
    const u8* qh = b + 16;
    const u8* qs = b + (FIVE ? 48 : 16) + (s / 2) * 32;
    const int shift = 4 * (s % 2);
    for (int l = 0; l < 32; ++l) {
        int q = (qs[l] >> shift) & 0x0f;
        if (FIVE) q |= ((qh[l] >> s) & 1) << 4;
        v[l] = d1 * (float)q - m1;
    }
}

template <> struct QLayout<QL_Q4_K> {
    static constexpr int elems = 256, bytes = 144;
};
__device__ __forceinline__ void qm_decode(QLayout<QL_Q4_K>, const u8* b, int s, float* v) {
    qm_decode_k45<false>(b, s, v);
}

template <> struct QLayout<QL_Q5_K> {
    static constexpr int elems = 256, bytes = 176;
};
__device__ __forceinline__ void qm_decode(QLayout<QL_Q5_K>, const u8* b, int s, float* v) {
    qm_decode_k45<true>(b, s, v);
}

// Q6_K: 128 bytes ql, 64 bytes qh, 16 i8 scales (one per 16 values), f16 d. Sub-block s is
// quarter s % 4 of half s / 4.
template <> struct QLayout<QL_Q6_K> {
    static constexpr int elems = 256, bytes = 210;
};
__device__ __forceinline__ void qm_decode(QLayout<QL_Q6_K>, const u8* b, int s, float* v) {
    const float d = qm_f16(b + 208);
    const int h = s / 4, q4 = s % 4;
    const u8* ql = b + h * 64 + (q4 % 2) * 32;
    const u8* qh = b + 128 + h * 32;
    const int lshift = 4 * (q4 / 2), hshift = 2 * q4;
    const float d0 = d * (float)(signed char)b[192 + h * 8 + q4 * 2];
    const float d1 = d * (float)(signed char)b[192 + h * 8 + q4 * 2 + 1];
    for (int l = 0; l < 32; ++l) {
        const int q = (((ql[l] >> lshift) & 0x0f) | (((qh[l] >> hshift) & 3) << 4)) - 32;
        v[l] = (l < 16 ? d0 : d1) * (float)q;
    }
}

// FP8 e4m3 (36 bytes, 32 values): f32 scale, 32 e4m3fn bytes; x = bf16(e4m3(q) * scale), the
// product in f32 then rounded to the nearest bf16 (crates/core/src/fp8.rs decode_block): the bits
// the widened weight holds.
template <> struct QLayout<QL_FP8> {
    static constexpr int elems = 32, bytes = 36;
};
__device__ __forceinline__ float qm_e4m3(u32 b) {
    const u32 e = (b >> 3) & 15u, m = b & 7u;
    if (e == 15u && m == 7u) return __uint_as_float(0x7fc00000u | ((b & 0x80u) << 24));
    const float v = e == 0u ? (float)m * 0.001953125f : __uint_as_float(((e + 120u) << 23) | (m << 20));
    return (b & 0x80u) ? -v : v;
}
__device__ __forceinline__ void qm_decode(QLayout<QL_FP8>, const u8* b, int, float* v) {
    const float scale = __uint_as_float(qm_u32(b));
    for (int l = 0; l < 32; ++l) v[l] = bf16_bits_to_f32(f32_to_bf16_bits(qm_e4m3(b[4 + l]) * scale));
}

// Int4 groups (crates/core/src/int4.rs): per group of G inputs an f32 scale (bytes 0..4), the zero
// point as a byte (byte 4), 3 bytes of padding, then G / 2 bytes of nibbles, input 2j in the low
// nibble of byte j and 2j + 1 in its high one. A value is (q - z) * s: the difference exact in
// f32, one rounding in the product (int4.rs block_int4, the reference's bits). Blocks are 24, 40
// or 72 bytes and rows whole blocks, and the weight is an allocation of its own (quant.rs hands
// the buffer's start), so the scale and each unit's 16 nibble bytes (at 8 + 16 s) are 8-byte
// aligned: they are read as 32-bit words.
template <int G> struct QInt4 {
    static constexpr int elems = G, bytes = 8 + G / 2;
};
template <> struct QLayout<QL_INT4_G32> : QInt4<32> {};
template <> struct QLayout<QL_INT4_G64> : QInt4<64> {};
template <> struct QLayout<QL_INT4_G128> : QInt4<128> {};
__device__ __forceinline__ void qm_decode_int4(const u8* b, int s, float* v) {
    const float scale = __uint_as_float(*reinterpret_cast<const u32*>(b));
    const float z = (float)b[4];
    const u32* q = reinterpret_cast<const u32*>(b + 8 + 16 * s);
    for (int w = 0; w < 4; ++w) {
        const u32 word = q[w];
        for (int i = 0; i < 8; ++i) v[8 * w + i] = ((float)((word >> (4 * i)) & 15u) - z) * scale;
    }
}
__device__ __forceinline__ void qm_decode(QLayout<QL_INT4_G32>, const u8* b, int s, float* v) {
    qm_decode_int4(b, s, v);
}
__device__ __forceinline__ void qm_decode(QLayout<QL_INT4_G64>, const u8* b, int s, float* v) {
    qm_decode_int4(b, s, v);
}
__device__ __forceinline__ void qm_decode(QLayout<QL_INT4_G128>, const u8* b, int s, float* v) {
    qm_decode_int4(b, s, v);
}

// Unit u of a row starting at `row`: its block's bytes and the sub-block within.
template <int L>
__device__ __forceinline__ void qm_decode_unit(const u8* row, int u, float* v) {
    constexpr int per = QLayout<L>::elems / 32;
    qm_decode(QLayout<L>(), row + (size_t)(u / per) * QLayout<L>::bytes, u % per, v);
}

template <int L>
__device__ void quant_matmul_impl(const u8* __restrict__ w, const void* __restrict__ x, int x_dtype,
                                  const void* __restrict__ bias, int bias_dtype, float* __restrict__ out, int m,
                                  int n, int k) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int col = blockIdx.x * QM_WARPS + warp;
    const int row0 = blockIdx.y * QM_ROWS;
    if (col >= n || row0 >= m) return;
    const int rows = min(QM_ROWS, m - row0);
    const size_t row_bytes = (size_t)(k / QLayout<L>::elems) * QLayout<L>::bytes;
    const u8* wrow = w + (size_t)col * row_bytes;
    const int units = k / 32;
    float acc[QM_ROWS];
    for (int r = 0; r < QM_ROWS; ++r) acc[r] = 0.0f;
    for (int u = lane; u < units; u += 32) {
        float v[32];
        qm_decode_unit<L>(wrow, u, v);
        for (int r = 0; r < QM_ROWS; ++r) {
            if (r >= rows) break;
            const size_t at = (size_t)(row0 + r) * k + (size_t)u * 32;
            float s = acc[r];
            for (int l = 0; l < 32; ++l) s += v[l] * qm_x(x, x_dtype, at + l);
            acc[r] = s;
        }
    }
    for (int r = 0; r < QM_ROWS; ++r) {
        if (r >= rows) break;
        float s = warp_sum(acc[r]);
        if (lane == 0) {
            if (bias_dtype != 0) s += load_bias(bias, bias_dtype, col);
            out[(size_t)(row0 + r) * n + col] = s;
        }
    }
}

template <int L>
__device__ void quant_embedding_impl(const u8* __restrict__ table, const u32* __restrict__ ids,
                                     float* __restrict__ out, int num_tokens, int hidden, int vocab) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    const int t = blockIdx.x;
    if (t >= num_tokens) return;
    const u32 id = ids[t];
    float* dst = out + (size_t)t * hidden;
    if (id >= (u32)vocab) {
        for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = nan_f32();
        return;
    }
    const size_t row_bytes = (size_t)(hidden / QLayout<L>::elems) * QLayout<L>::bytes;
    const u8* row = table + (size_t)id * row_bytes;
    for (int u = threadIdx.x; u < hidden / 32; u += blockDim.x) {
        float v[32];
        qm_decode_unit<L>(row, u, v);
        for (int l = 0; l < 32; ++l) dst[u * 32 + l] = v[l];
    }
}

#define QUANT_KERNELS(SUFFIX, L)                                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * QM_WARPS)                                                    \
        quant_matmul_##SUFFIX(const u8* w, const void* x, int x_dtype, const void* bias, int bias_dtype,           \
                              float* out, int m, int n, int k) {                                                   \
        quant_matmul_impl<L>(w, x, x_dtype, bias, bias_dtype, out, m, n, k);                                       \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        quant_embedding_##SUFFIX(const u8* table, const u32* ids, float* out, int num_tokens, int hidden,          \
                                 int vocab) {                                                                      \
        quant_embedding_impl<L>(table, ids, out, num_tokens, hidden, vocab);                                       \
    }
QUANT_KERNELS(q8_0, QL_Q8_0)
QUANT_KERNELS(q4_0, QL_Q4_0)
QUANT_KERNELS(q4_1, QL_Q4_1)
QUANT_KERNELS(q5_0, QL_Q5_0)
QUANT_KERNELS(q5_1, QL_Q5_1)
QUANT_KERNELS(q4_k, QL_Q4_K)
QUANT_KERNELS(q5_k, QL_Q5_K)
QUANT_KERNELS(q6_k, QL_Q6_K)
QUANT_KERNELS(fp8, QL_FP8)
QUANT_KERNELS(int4_g32, QL_INT4_G32)
QUANT_KERNELS(int4_g64, QL_INT4_G64)
QUANT_KERNELS(int4_g128, QL_INT4_G128)
