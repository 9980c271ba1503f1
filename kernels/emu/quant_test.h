// quant_test.h — checks kernels/quant_matmul.cu: for every GGUF layout, FP8 e4m3 and int4 groups
// of 32, 64 and 128, the embedding kernel's
// rows equal a host decode of the same random blocks bitwise (the host decode is written here
// per element, as ggml-quants.c's dequantize_row_* index it, not per unit as the kernel does),
// the matmul against a double-precision dot of those values (NMSE), with and without a bias,
// x in f32 and bf16, and batch invariance: each row of an m-row matmul has the bits of the same
// row run alone (m = 1), for m across the QM_ROWS boundary. Included by emu_test.cpp; reports
// through the `check(name, ok)` it is given.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace quanttest {
using Check = std::function<void(const std::string&, bool)>;

struct Layout {
    const char* name;
    int code, elems, bytes;
    std::vector<int> f16_at;  // where the block keeps f16 scales (drawn finite)
};

inline const std::vector<Layout>& layouts() {
    static const std::vector<Layout> all = {
        {"q8_0", QL_Q8_0, 32, 34, {0}},          {"q4_0", QL_Q4_0, 32, 18, {0}},
        {"q4_1", QL_Q4_1, 32, 20, {0, 2}},       {"q5_0", QL_Q5_0, 32, 22, {0}},
        {"q5_1", QL_Q5_1, 32, 24, {0, 2}},       {"q4_k", QL_Q4_K, 256, 144, {0, 2}},
        {"q5_k", QL_Q5_K, 256, 176, {0, 2}},     {"q6_k", QL_Q6_K, 256, 210, {208}},
        {"fp8", QL_FP8, 32, 36, {}},             {"int4_g32", QL_INT4_G32, 32, 24, {}},
        {"int4_g64", QL_INT4_G64, 64, 40, {}},   {"int4_g128", QL_INT4_G128, 128, 72, {}},
    };
    return all;
}

inline uint64_t next(uint64_t& s) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// An f16 bit pattern for 2^-e · (1 + frac / 1024): a small positive finite value.
inline uint16_t small_f16(uint64_t r) { return (uint16_t)(((15 - 6 - (int)(r % 4)) << 10) | (r >> 8) % 1024); }

inline std::vector<uint8_t> random_rows(const Layout& L, int rows, int cols, uint64_t seed) {
    std::vector<uint8_t> b((size_t)rows * cols / L.elems * L.bytes);
    for (auto& x : b) x = (uint8_t)next(seed);
    for (size_t blk = 0; blk < b.size(); blk += L.bytes)
        for (int at : L.f16_at) {
            const uint16_t h = small_f16(next(seed));
            b[blk + at] = (uint8_t)h;
            b[blk + at + 1] = (uint8_t)(h >> 8);
        }
    if (L.code == QL_FP8)  // a small positive f32 scale; no NaN bytes (S.1111.111)
        for (size_t blk = 0; blk < b.size(); blk += L.bytes) {
            const float s = std::ldexp(1.0f + (float)(next(seed) % 1024) / 1024.0f, -12);
            std::memcpy(&b[blk], &s, 4);
            for (int i = 4; i < 36; ++i)
                if ((b[blk + i] & 0x7f) == 0x7f) b[blk + i] -= 1;
        }
    if (L.code == QL_INT4_G32 || L.code == QL_INT4_G64 || L.code == QL_INT4_G128)
        // a small positive f32 scale, a zero point in 0..=16 (GPTQ's stored-minus-one zeros
        // reach 16), three bytes of padding
        for (size_t blk = 0; blk < b.size(); blk += L.bytes) {
            const float s = std::ldexp(1.0f + (float)(next(seed) % 1024) / 1024.0f, -10);
            std::memcpy(&b[blk], &s, 4);
            b[blk + 4] = (uint8_t)(next(seed) % 17);
            b[blk + 5] = b[blk + 6] = b[blk + 7] = 0;
        }
    return b;
}

inline float h16(const uint8_t* p) { return f16_bits_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

// Element e of one block, with ggml's formulas.
inline float host_value(const Layout& L, const uint8_t* b, int e) {
    switch (L.code) {
        case QL_Q8_0: return h16(b) * (float)(int8_t)b[2 + e];
        case QL_Q4_0: return h16(b) * (float)((e < 16 ? b[2 + e] & 15 : b[2 + e - 16] >> 4) - 8);
        case QL_Q4_1: return h16(b) * (float)(e < 16 ? b[4 + e] & 15 : b[4 + e - 16] >> 4) + h16(b + 2);
        case QL_Q5_0:
        case QL_Q5_1: {
            const int off = L.code == QL_Q5_0 ? 2 : 4;
            uint32_t qh;
            std::memcpy(&qh, b + off, 4);
            const uint8_t* qs = b + off + 4;
            const int q = (e < 16 ? qs[e] & 15 : qs[e - 16] >> 4) | (((qh >> e) & 1) << 4);
            return L.code == QL_Q5_0 ? h16(b) * (float)(q - 16) : h16(b) * (float)q + h16(b + 2);
        }
        case QL_Q4_K:
        case QL_Q5_K: {
            const int s = e / 32, l = e % 32;
            const uint8_t* sc = b + 4;
            int scale, mn;
            if (s < 4) {
                scale = sc[s] & 63;
                mn = sc[s + 4] & 63;
            } else {
                scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
                mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
            }
            const float d1 = h16(b) * (float)scale, m1 = h16(b + 2) * (float)mn;
            const uint8_t* qs = b + (L.code == QL_Q5_K ? 48 : 16);
            int q = (qs[(s / 2) * 32 + l] >> (4 * (s % 2))) & 15;
            if (L.code == QL_Q5_K) q |= ((b[16 + l] >> s) & 1) << 4;
            return d1 * (float)q - m1;
        }
        case QL_FP8: {  // the OCP e4m3fn value times the run's scale, rounded to bf16 (ties to even)
            float scale;
            std::memcpy(&scale, b, 4);
            const int q = b[4 + e], ex = (q >> 3) & 15, mant = q & 7;
            const float mag = ex == 0 ? std::ldexp((float)mant, -9) : std::ldexp(1.0f + (float)mant / 8.0f, ex - 7);
            const float v = ((q & 0x80) ? -mag : mag) * scale;
            uint32_t u;
            std::memcpy(&u, &v, 4);
            u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
            float r;
            std::memcpy(&r, &u, 4);
            return r;
        }
        case QL_INT4_G32:
        case QL_INT4_G64:
        case QL_INT4_G128: {  // (q - z) * s, q the low (e even) or high nibble of byte 8 + e / 2
            float scale;
            std::memcpy(&scale, b, 4);
            const int q = (b[8 + e / 2] >> (4 * (e % 2))) & 15;
            return (float)(q - (int)b[4]) * scale;
        }
        default: {  // Q6_K
            const int h = e / 128, s = (e / 32) % 4, l = e % 32;
            const int low = (b[h * 64 + (s % 2) * 32 + l] >> (4 * (s / 2))) & 15;
            const int high = (b[128 + h * 32 + l] >> (2 * s)) & 3;
            const float dl = h16(b + 208) * (float)(int8_t)b[192 + e / 16];
            return dl * (float)((low | (high << 4)) - 32);
        }
    }
}

inline std::vector<float> host_decode(const Layout& L, const std::vector<uint8_t>& bytes, size_t values) {
    std::vector<float> v(values);
    for (size_t i = 0; i < values; ++i) v[i] = host_value(L, bytes.data() + i / L.elems * L.bytes, (int)(i % L.elems));
    return v;
}

using MatmulFn = void (*)(const u8*, const void*, int, const void*, int, float*, int, int, int);
using EmbedFn = void (*)(const u8*, const u32*, float*, int, int, int);

inline MatmulFn matmul_of(int code) {
    const MatmulFn f[] = {quant_matmul_q8_0, quant_matmul_q4_0, quant_matmul_q4_1, quant_matmul_q5_0,
                          quant_matmul_q5_1, quant_matmul_q4_k, quant_matmul_q5_k, quant_matmul_q6_k, quant_matmul_fp8,
                          quant_matmul_int4_g32, quant_matmul_int4_g64, quant_matmul_int4_g128};
    return f[code];
}
inline EmbedFn embed_of(int code) {
    const EmbedFn f[] = {quant_embedding_q8_0, quant_embedding_q4_0, quant_embedding_q4_1, quant_embedding_q5_0,
                         quant_embedding_q5_1, quant_embedding_q4_k, quant_embedding_q5_k, quant_embedding_q6_k,
                         quant_embedding_fp8,   quant_embedding_int4_g32, quant_embedding_int4_g64,
                         quant_embedding_int4_g128};
    return f[code];
}

inline std::vector<float> run_matmul(const Layout& L, const std::vector<uint8_t>& w, const void* x, int x_dtype,
                                     const float* bias, int m, int n, int k) {
    std::vector<float> out((size_t)m * n, NAN);
    const MatmulFn f = matmul_of(L.code);
    launch(dim3{(unsigned)((n + QM_WARPS - 1) / QM_WARPS), (unsigned)((m + QM_ROWS - 1) / QM_ROWS), 1},
           dim3{32 * QM_WARPS, 1, 1}, [&] { f(w.data(), x, x_dtype, bias, bias ? 1 : 0, out.data(), m, n, k); });
    return out;
}

inline bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

inline void run_all(const Check& check) {
    uint64_t seed = 77;
    for (const Layout& L : layouts()) {
        const std::string tag = std::string("quant ") + L.name + ": ";
        // The embedding: rows (and a bad id) against the host decode, bitwise.
        {
            const int vocab = 5, hidden = 512;
            auto table = random_rows(L, vocab, hidden, next(seed));
            auto all = host_decode(L, table, (size_t)vocab * hidden);
            std::vector<u32> ids = {4, 0, 7, 2};
            std::vector<float> out(ids.size() * hidden, -1.0f);
            const EmbedFn f = embed_of(L.code);
            launch(dim3{(unsigned)ids.size(), 1, 1}, dim3{256, 1, 1},
                   [&] { f(table.data(), ids.data(), out.data(), (int)ids.size(), hidden, vocab); });
            bool ok = same_bits(out.data(), &all[4 * hidden], hidden) && same_bits(&out[hidden], &all[0], hidden) &&
                      same_bits(&out[3 * hidden], &all[2 * hidden], hidden);
            bool nan_row = true;
            for (int i = 0; i < hidden; ++i) nan_row = nan_row && std::isnan(out[2 * hidden + i]);
            bool finite = true;
            for (float v : all) finite = finite && std::isfinite(v);
            check(tag + "embedding rows equal the host decode bitwise, a bad id gives NaN", ok && nan_row && finite);
        }
        // The matmul against a double dot of the decoded values; then batch invariance.
        for (auto [m, n, k] : std::vector<std::tuple<int, int, int>>{{1, 7, 512}, {13, 9, 1536}, {37, 5, 256}}) {
            auto w = random_rows(L, n, k, next(seed));
            auto wv = host_decode(L, w, (size_t)n * k);
            std::vector<float> x((size_t)m * k), bias(n);
            for (auto& v : x) v = (float)((int64_t)(next(seed) >> 40) - (1 << 23)) / (float)(1 << 23);
            for (auto& v : bias) v = (float)((int64_t)(next(seed) >> 40) - (1 << 23)) / (float)(1 << 24);
            auto got = run_matmul(L, w, x.data(), 1, bias.data(), m, n, k);
            double num = 0, den = 0;
            bool finite = true;
            for (int r = 0; r < m; ++r)
                for (int c = 0; c < n; ++c) {
                    double want = bias[c];
                    for (int i = 0; i < k; ++i) want += (double)x[(size_t)r * k + i] * wv[(size_t)c * k + i];
                    const double g = got[(size_t)r * n + c];
                    finite = finite && std::isfinite(g);
                    num += (g - want) * (g - want);
                    den += want * want;
                }
            const std::string shape = "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
            check(tag + "matmul " + shape + " (f32 x, bias) within 1e-10 NMSE of the f64 dot",
                  finite && den > 0 && num / den < 1e-10);
            // Each row alone has the bits it has in the batch.
            bool inv = true;
            for (int r = 0; r < m; ++r) {
                auto one = run_matmul(L, w, &x[(size_t)r * k], 1, bias.data(), 1, n, k);
                inv = inv && same_bits(one.data(), &got[(size_t)r * n], n);
            }
            check(tag + "matmul " + shape + ": every row alone has its batch bits", inv);
            // bf16 x: the same as f32 x holding the bf16 values; no bias: the bias-free sum.
            std::vector<uint16_t> xb(x.size());
            std::vector<float> xw(x.size());
            for (size_t i = 0; i < x.size(); ++i) {
                xb[i] = f32_to_bf16_bits(x[i]);
                xw[i] = bf16_bits_to_f32(xb[i]);
            }
            auto gb = run_matmul(L, w, xb.data(), 2, nullptr, m, n, k);
            auto gw = run_matmul(L, w, xw.data(), 1, nullptr, m, n, k);
            check(tag + "matmul " + shape + ": bf16 x gives the bits of its f32 widening",
                  same_bits(gb.data(), gw.data(), gb.size()) && !same_bits(gw.data(), got.data(), gw.size()));
        }
    }
}
}  // namespace quanttest
