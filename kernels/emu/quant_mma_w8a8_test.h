// quant_mma_w8a8_test.h — checks kernels/quant_mma_w8a8.cu (FP8 weights x per-token e4m3
// activations on the emulated m16n8k32 e4m3 mma) and the emulator's model of that mma:
//   - cuda_emu.h's e4m3 decode against kv_fp8_test.h's copy of fp8.rs' decode, all 256 bytes
//     (NaN for both S.1111.111 bytes), and a single emulated mma against a host loop over the
//     PTX fragment layout;
//   - the matmul against a double-precision dot of the unquantized x and the exactly decoded
//     weights (e4m3 * run scale), per element within the derived bound: e4m3 rounding of
//     x / s_r moves a normal value by at most 2^-4 of itself and a subnormal one (|x / s_r| <
//     2^-6) by at most 2^-10 * s_r, so |err| <= Σ_k |w| * max(2^-4 |x|, 2^-10 s_r), plus the
//     f32 sums (k * 2^-23 of Σ|x w|, a loose allowance);
//   - bitwise against a host model of the kernel header's order (host e4m3 encode, 32 products
//     a run in ascending k from 0 — the emulator's mma order —, runs folded with their scales,
//     then times s_r and + bias);
//   - batch invariance: each row of an m-row matmul has the bits of the same row run alone, for
//     m inside the m16 tile, across it and over the m64 tile; bf16 x gives the bits of its f32
//     widening; an all-zero row gives zeros (the floor on s_r).
// Included by emu_test.cpp after quant_mma_test.h; reports through the `check(name, ok)` it is
// given.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace w8a8test {
using quanttest::Check;

using MatmulFn = void (*)(const u8*, const void*, int, const void*, int, float*, int, int, int);

inline float run_scale(const uint8_t* run) {
    float s;
    std::memcpy(&s, run, 4);
    return s;
}

inline float host_row_scale(const float* x, int k) {
    float a = 0.0f;
    for (int i = 0; i < k; ++i) a = std::fmax(a, std::fabs(x[i]));
    return std::fmax(a / 448.0f, 1.0f / (448.0f * 512.0f));
}

// The header's order on the host.
inline std::vector<float> host_contract(const std::vector<uint8_t>& w, const std::vector<float>& x, const float* bias,
                                        int m, int n, int k) {
    std::vector<float> out((size_t)m * n);
    const size_t row_bytes = (size_t)(k / 32) * 36;
    for (int r = 0; r < m; ++r) {
        const float s = host_row_scale(&x[(size_t)r * k], k);
        for (int c = 0; c < n; ++c) {
            float total = 0.0f;
            for (int j = 0; j < k / 32; ++j) {
                const uint8_t* run = w.data() + (size_t)c * row_bytes + (size_t)j * 36;
                float part = 0.0f;
                for (int e = 0; e < 32; ++e) {
                    const uint8_t q = kvfp8test::host_encode(kvfp8test::E4M3, x[(size_t)r * k + 32 * j + e] / s);
                    part = part + (float)(kvfp8test::host_decode(kvfp8test::E4M3, q) *
                                          kvfp8test::host_decode(kvfp8test::E4M3, run[4 + e]));
                }
                const float p = part * run_scale(run);
                total = total + p;
            }
            const float v = total * s;
            out[(size_t)r * n + c] = bias ? v + bias[c] : v;
        }
    }
    return out;
}

inline std::vector<float> run(const std::vector<uint8_t>& w, const void* x, int x_dtype, const float* bias, int m,
                              int n, int k) {
    std::vector<float> out((size_t)m * n, NAN);
    const int bm = m <= 16 ? 16 : 64;
    const MatmulFn f = m <= 16 ? quant_mma_w8a8_fp8_m16 : quant_mma_w8a8_fp8_m64;
    launch(dim3{(unsigned)((n + W8_BN - 1) / W8_BN), (unsigned)((m + bm - 1) / bm), 1}, dim3{32 * W8_WARPS, 1, 1},
           [&] { f(w.data(), x, x_dtype, bias, bias ? 1 : 0, out.data(), m, n, k); });
    return out;
}

// The emulator's e4m3 decode and one m16n8k32 e4m3 mma against the PTX fragment layout.
inline void check_mma(const Check& check) {
    bool dec = true;
    for (int b = 0; b < 256; ++b) {
        const double want = kvfp8test::host_decode(kvfp8test::E4M3, (uint8_t)b);
        const float got = emu::e4m3_to_f32((uint8_t)b);
        dec = dec && (std::isnan(want) ? std::isnan(got) : (double)got == want && std::signbit(got) == std::signbit(want));
    }
    check("w8a8: cuda_emu.h e4m3_to_f32 is fp8.rs' decode on all 256 bytes (NaN, -0 included)", dec);
    // A [16][32] and B [32][8] bytes (no NaN), C [16][8]; each lane builds its fragments.
    uint64_t seed = 99;
    uint8_t A[16][32], B[32][8];
    float C[16][8], D[16][8];
    for (auto& row : A)
        for (auto& v : row) v = (uint8_t)(quanttest::next(seed) % 0x7f) | (quanttest::next(seed) % 2 ? 0x80 : 0);
    for (auto& row : B)
        for (auto& v : row) v = (uint8_t)(quanttest::next(seed) % 0x7f) | (quanttest::next(seed) % 2 ? 0x80 : 0);
    for (auto& row : C)
        for (auto& v : row) v = (float)((int64_t)(quanttest::next(seed) >> 40) - (1 << 23)) / (float)(1 << 20);
    launch(dim3{1, 1, 1}, dim3{32, 1, 1}, [&] {
        const int l = (int)threadIdx.x, g = l / 4, t = l % 4;
        auto pack = [](const uint8_t* p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; };
        uint32_t a[4] = {pack(&A[g][4 * t]), pack(&A[g + 8][4 * t]), pack(&A[g][16 + 4 * t]), pack(&A[g + 8][16 + 4 * t])};
        uint8_t b0[4], b1[4];
        for (int i = 0; i < 4; ++i) {
            b0[i] = B[4 * t + i][g];
            b1[i] = B[16 + 4 * t + i][g];
        }
        uint32_t b[2] = {pack(b0), pack(b1)};
        float c[4] = {C[g][2 * t], C[g][2 * t + 1], C[g + 8][2 * t], C[g + 8][2 * t + 1]}, d[4];
        emu::mma_m16n8k32_e4m3(d, a, b, c);
        D[g][2 * t] = d[0];
        D[g][2 * t + 1] = d[1];
        D[g + 8][2 * t] = d[2];
        D[g + 8][2 * t + 1] = d[3];
    });
    bool same = true;
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 8; ++c) {
            float acc = C[r][c];
            for (int kk = 0; kk < 32; ++kk)
                acc = acc + (float)(kvfp8test::host_decode(kvfp8test::E4M3, A[r][kk]) *
                                    kvfp8test::host_decode(kvfp8test::E4M3, B[kk][c]));
            same = same && std::memcmp(&acc, &D[r][c], 4) == 0;
        }
    check("w8a8: emulated mma m16n8k32 e4m3 is the host loop over the PTX fragment layout, bitwise", same);
}

inline void run_all(const Check& check) {
    check_mma(check);
    const quanttest::Layout* Lp = nullptr;
    for (const auto& l : quanttest::layouts())
        if (l.code == QL_FP8) Lp = &l;
    const quanttest::Layout& L = *Lp;
    uint64_t seed = 8484;
    using quanttest::next;
    for (auto [m, n, k] : std::vector<std::tuple<int, int, int>>{
             {1, 7, 512}, {13, 70, 768}, {16, 64, 256}, {17, 9, 256}, {70, 130, 512}}) {
        auto w = quanttest::random_rows(L, n, k, next(seed));
        std::vector<float> x((size_t)m * k), bias(n);
        // Rows of different magnitudes (scales 2^-6 .. 2^6), so each row's own scale matters.
        for (int r = 0; r < m; ++r) {
            const float mag = std::ldexp(1.0f, (r % 13) - 6);
            for (int i = 0; i < k; ++i)
                x[(size_t)r * k + i] = mag * (float)((int64_t)(next(seed) >> 40) - (1 << 23)) / (float)(1 << 23);
        }
        for (auto& v : bias) v = (float)((int64_t)(next(seed) >> 40) - (1 << 23)) / (float)(1 << 24);
        if (m > 1) std::fill(x.begin() + (size_t)(m / 2) * k, x.begin() + (size_t)(m / 2 + 1) * k, 0.0f);
        const std::string tag = "quant_mma_w8a8 m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" +
                                std::to_string(k);
        auto got = run(w, x.data(), 1, bias.data(), m, n, k);
        const size_t row_bytes = (size_t)(k / 32) * 36;
        bool within = true, zero_row = true;
        double worst = 0;
        for (int r = 0; r < m; ++r) {
            const float s = host_row_scale(&x[(size_t)r * k], k);
            for (int c = 0; c < n; ++c) {
                double want = bias[c], bound = 0, mag = 0;
                for (int i = 0; i < k; ++i) {
                    const uint8_t* run = w.data() + (size_t)c * row_bytes + (size_t)(i / 32) * 36;
                    const double wv = kvfp8test::host_decode(kvfp8test::E4M3, run[4 + i % 32]) * run_scale(run);
                    const double xv = x[(size_t)r * k + i];
                    want += xv * wv;
                    bound += std::fabs(wv) * std::max(std::ldexp(std::fabs(xv), -4), std::ldexp((double)s, -10));
                    mag += std::fabs(xv * wv);
                }
                bound += mag * k * std::ldexp(1.0, -23) + std::fabs(want) * std::ldexp(1.0, -23);
                const double g = got[(size_t)r * n + c], e = std::fabs(g - want);
                within = within && std::isfinite(g) && e <= bound;
                if (bound > 0) worst = std::max(worst, e / bound);
                if (m > 1 && r == m / 2) zero_row = zero_row && got[(size_t)r * n + c] == bias[c];
            }
        }
        check(tag + " (f32 x, bias): every element within the e4m3-activation bound of the f64 product (worst " +
                  std::to_string(worst) + " of it)",
              within);
        if (m > 1) check(tag + ": the all-zero row gives the bias", zero_row);
        auto model = host_contract(w, x, bias.data(), m, n, k);
        check(tag + ": the bits of the header's order (host model, emulator mma order)",
              quanttest::same_bits(got.data(), model.data(), got.size()));
        bool inv = true;
        for (int r = 0; r < m; ++r) {
            auto one = run(w, &x[(size_t)r * k], 1, bias.data(), 1, n, k);
            inv = inv && quanttest::same_bits(one.data(), &got[(size_t)r * n], n);
        }
        check(tag + ": every row alone has its batch bits", inv);
        std::vector<uint16_t> xb(x.size());
        std::vector<float> xw(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
            xb[i] = f32_to_bf16_bits(x[i]);
            xw[i] = bf16_bits_to_f32(xb[i]);
        }
        auto gb = run(w, xb.data(), 2, nullptr, m, n, k);
        auto gw = run(w, xw.data(), 1, nullptr, m, n, k);
        check(tag + ": bf16 x gives the bits of its f32 widening, no bias the bias-free sum",
              quanttest::same_bits(gb.data(), gw.data(), gb.size()) &&
                  !quanttest::same_bits(gw.data(), got.data(), gw.size()));
    }
}
}  // namespace w8a8test
