// quant_mma_test.h — checks kernels/quant_mma.cu, for FP8 e4m3 runs, int4 groups of 32, 64
// and 128, and GGUF Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K blocks (the blocks
// quant_test.h draws): the matmul against a double-precision dot of x rounded to bf16 and the
// host-decoded weights (NMSE), bitwise against a host model of the kernel header's order (each
// group's k16 partials in ascending k from 0, then total = total + partial * scale, and for
// the layouts with a min total = total + xsum * min, in group order, then + bias; the mma's
// own order as the emulator defines it), and batch invariance: each row of an m-row matmul has the bits of the
// same row run alone, for m inside the m16 tile, across it and over the m64 tile; bf16 x gives
// the bits of its f32 widening. Included by emu_test.cpp after quant_test.h; reports through
// the `check(name, ok)` it is given.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace quantmmatest {
using quanttest::Check;
using quanttest::Layout;

using MatmulFn = void (*)(const u8*, const void*, int, const void*, int, float*, int, int, int);

struct Kind {
    int code;        // quant_test.h's layout code
    MatmulFn f[2];   // the m16 and m64 kernels
};

inline const std::vector<Kind>& kinds() {
    static const std::vector<Kind> all = {
        {QL_FP8, {quant_mma_fp8_m16, quant_mma_fp8_m64}},
        {QL_INT4_G32, {quant_mma_int4_g32_m16, quant_mma_int4_g32_m64}},
        {QL_INT4_G64, {quant_mma_int4_g64_m16, quant_mma_int4_g64_m64}},
        {QL_INT4_G128, {quant_mma_int4_g128_m16, quant_mma_int4_g128_m64}},
        {QL_Q8_0, {quant_mma_q8_0_m16, quant_mma_q8_0_m64}},
        {QL_Q4_0, {quant_mma_q4_0_m16, quant_mma_q4_0_m64}},
        {QL_Q6_K, {quant_mma_q6_k_m16, quant_mma_q6_k_m64}},
        {QL_Q4_1, {quant_mma_q4_1_m16, quant_mma_q4_1_m64}},
        {QL_Q5_0, {quant_mma_q5_0_m16, quant_mma_q5_0_m64}},
        {QL_Q5_1, {quant_mma_q5_1_m16, quant_mma_q5_1_m64}},
        {QL_Q4_K, {quant_mma_q4_k_m16, quant_mma_q4_k_m64}},
        {QL_Q5_K, {quant_mma_q5_k_m16, quant_mma_q5_k_m64}},
    };
    return all;
}

inline float bits_f32(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float bf16_round(float v) { return bf16_bits_to_f32(f32_to_bf16_bits(v)); }

// Element e of a block split as the kernel multiplies it: the integer part (exact in bf16),
// the group's scale and its min (0 for the layouts without one; the value is q * scale + min),
// written per element from the formats (fp8.rs, int4.rs, ggml-quants.c).
inline void host_split(const Layout& L, const uint8_t* b, int e, float& q, float& scale, float& mn) {
    using quanttest::h16;
    mn = 0.0f;
    if (L.code == QL_Q4_1) {
        q = (float)(e < 16 ? b[4 + e] & 15 : b[4 + e - 16] >> 4);
        scale = h16(b);
        mn = h16(b + 2);
        return;
    }
    if (L.code == QL_Q5_0 || L.code == QL_Q5_1) {
        const int off = L.code == QL_Q5_0 ? 2 : 4;
        const uint32_t qh = (uint32_t)b[off] | ((uint32_t)b[off + 1] << 8) | ((uint32_t)b[off + 2] << 16) |
                            ((uint32_t)b[off + 3] << 24);
        const int low = e < 16 ? b[off + 4 + e] & 15 : b[off + 4 + e - 16] >> 4;
        q = (float)((low | (int)(((qh >> e) & 1) << 4)) - (L.code == QL_Q5_0 ? 16 : 0));
        scale = h16(b);
        if (L.code == QL_Q5_1) mn = h16(b + 2);
        return;
    }
    if (L.code == QL_Q4_K || L.code == QL_Q5_K) {
        const int s = e / 32, l = e % 32;
        const uint8_t* sc = b + 4;
        const int sc6 = s < 4 ? sc[s] & 63 : (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
        const int mn6 = s < 4 ? sc[s + 4] & 63 : (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
        const uint8_t* qs = b + (L.code == QL_Q5_K ? 48 : 16);
        int qi = (qs[(s / 2) * 32 + l] >> (4 * (s % 2))) & 15;
        if (L.code == QL_Q5_K) qi |= ((b[16 + l] >> s) & 1) << 4;
        q = (float)qi;
        scale = h16(b) * (float)sc6;
        mn = -(h16(b + 2) * (float)mn6);
        return;
    }
    if (L.code == QL_Q8_0) {
        q = (float)(int8_t)b[2 + e];
        scale = h16(b);
        return;
    }
    if (L.code == QL_Q4_0) {
        q = (float)((e < 16 ? b[2 + e] & 15 : b[2 + e - 16] >> 4) - 8);
        scale = h16(b);
        return;
    }
    if (L.code == QL_Q6_K) {
        const int h = e / 128, s = (e / 32) % 4, l = e % 32;
        const int low = (b[h * 64 + (s % 2) * 32 + l] >> (4 * (s / 2))) & 15;
        const int high = (b[128 + h * 32 + l] >> (2 * s)) & 3;
        q = (float)((low | (high << 4)) - 32);
        scale = h16(b + 208) * (float)(int8_t)b[192 + e / 16];
        return;
    }
    if (L.code == QL_FP8) {  // the reference's decode bf16(e4m3 * scale), scale 1
        q = quanttest::host_value(L, b, e);
        scale = 1.0f;
        return;
    }
    std::memcpy(&scale, b, 4);
    {
        q = (float)(((b[8 + e / 2] >> (4 * (e % 2))) & 15) - (int)b[4]);
    }
}

inline bool has_min(const Layout& L) {
    return L.code == QL_Q4_1 || L.code == QL_Q5_1 || L.code == QL_Q4_K || L.code == QL_Q5_K;
}

// The contract's order on the host: per group, 16-value steps each added one product at a
// time in ascending k (the emulator's mma), then the fold.
inline std::vector<float> host_contract(const Layout& L, const std::vector<uint8_t>& w, const std::vector<float>& x,
                                        const float* bias, int m, int n, int k) {
    std::vector<float> out((size_t)m * n);
    const size_t row_bytes = (size_t)(k / L.elems) * L.bytes;
    for (int r = 0; r < m; ++r)
        for (int c = 0; c < n; ++c) {
            float total = 0.0f;
            const int group = L.code == QL_Q6_K ? 16 : L.elems == 256 ? 32 : L.elems;  // K-quant sub-blocks
            for (int g0 = 0; g0 < k; g0 += group) {
                const uint8_t* blk = w.data() + (size_t)c * row_bytes + (size_t)(g0 / L.elems) * L.bytes;
                float part = 0.0f, xsum = 0.0f, scale = 0.0f, mn = 0.0f;
                for (int e = 0; e < group; ++e) {
                    float q;
                    host_split(L, blk, g0 % L.elems + e, q, scale, mn);
                    const float xv = bf16_round(x[(size_t)r * k + g0 + e]);
                    part = part + xv * q;
                    xsum = xsum + xv;
                }
                const float p = part * scale;
                total = total + p;
                if (has_min(L)) {
                    const float pm = xsum * mn;
                    total = total + pm;
                }
            }
            out[(size_t)r * n + c] = bias ? total + bias[c] : total;
        }
    return out;
}

inline std::vector<float> run(const Kind& K, const std::vector<uint8_t>& w, const void* x, int x_dtype,
                              const float* bias, int m, int n, int k) {
    std::vector<float> out((size_t)m * n, NAN);
    const int bm = m <= 16 ? 16 : 64;
    const MatmulFn f = K.f[m <= 16 ? 0 : 1];
    launch(dim3{(unsigned)((n + QT_BN - 1) / QT_BN), (unsigned)((m + bm - 1) / bm), 1}, dim3{32 * QT_WARPS, 1, 1},
           [&] { f(w.data(), x, x_dtype, bias, bias ? 1 : 0, out.data(), m, n, k); });
    return out;
}

inline void run_all(const Check& check) {
    uint64_t seed = 4242;
    using quanttest::next;
    for (const Kind& K : kinds()) {
        const Layout* Lp = nullptr;
        for (const Layout& l : quanttest::layouts())
            if (l.code == K.code) Lp = &l;
        const Layout& L = *Lp;
        const std::string tag = std::string("quant_mma ") + L.name + ": ";
        for (auto [m, n, k] : std::vector<std::tuple<int, int, int>>{
                 {1, 7, 512}, {13, 70, 768}, {16, 64, 256}, {17, 9, 256}, {70, 130, 512}, {1, 33, 832}, {9, 70, 832}}) {
            // k = 832 (26 steps of 32, a last m16 stage of 64): for the layouts whose blocks divide it.
            if (k % L.elems != 0) continue;
            auto w = quanttest::random_rows(L, n, k, next(seed));
            std::vector<float> x((size_t)m * k), bias(n);
            for (auto& v : x) v = (float)((int64_t)(next(seed) >> 40) - (1 << 23)) / (float)(1 << 23);
            for (auto& v : bias) v = (float)((int64_t)(next(seed) >> 40) - (1 << 23)) / (float)(1 << 24);
            auto got = run(K, w, x.data(), 1, bias.data(), m, n, k);
            const std::string shape = "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
            // Against the f64 dot of bf16(x) and the decoded weight ((q - z) * s or e4m3 * s, exact).
            double num = 0, den = 0;
            bool finite = true;
            const size_t row_bytes = (size_t)(k / L.elems) * L.bytes;
            for (int r = 0; r < m; ++r)
                for (int c = 0; c < n; ++c) {
                    double want = bias[c];
                    for (int i = 0; i < k; ++i) {
                        float q, s, mn;
                        host_split(L, w.data() + (size_t)c * row_bytes + (size_t)(i / L.elems) * L.bytes, i % L.elems, q,
                                   s, mn);
                        want += (double)bf16_round(x[(size_t)r * k + i]) * ((double)q * s + (double)mn);
                    }
                    const double g = got[(size_t)r * n + c];
                    finite = finite && std::isfinite(g);
                    num += (g - want) * (g - want);
                    den += want * want;
                }
            check(tag + shape + " (f32 x, bias) within 1e-10 NMSE of the f64 dot of bf16 x", finite && den > 0 &&
                                                                                                  num / den < 1e-10);
            auto model = host_contract(L, w, x, bias.data(), m, n, k);
            check(tag + shape + ": the bits of the header's order (host model)",
                  quanttest::same_bits(got.data(), model.data(), got.size()));
            bool inv = true;
            for (int r = 0; r < m; ++r) {
                auto one = run(K, w, &x[(size_t)r * k], 1, bias.data(), 1, n, k);
                inv = inv && quanttest::same_bits(one.data(), &got[(size_t)r * n], n);
            }
            check(tag + shape + ": every row alone has its batch bits", inv);
            std::vector<uint16_t> xb(x.size());
            std::vector<float> xw(x.size());
            for (size_t i = 0; i < x.size(); ++i) {
                xb[i] = f32_to_bf16_bits(x[i]);
                xw[i] = bf16_bits_to_f32(xb[i]);
            }
            auto gb = run(K, w, xb.data(), 2, nullptr, m, n, k);
            auto gw = run(K, w, xw.data(), 1, nullptr, m, n, k);
            check(tag + shape + ": bf16 x gives the bits of its f32 widening, no bias the bias-free sum",
                  quanttest::same_bits(gb.data(), gw.data(), gb.size()) &&
                      !quanttest::same_bits(gw.data(), got.data(), gw.size()));
        }
    }
}
}  // namespace quantmmatest
