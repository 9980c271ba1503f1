// act16_test.h — activations stored in 16 bits (Backend::activation_dtype on CUDA): every
// producer of a tensor a tensor-core matmul reads (rms_norm, add_rms_norm, silu_mul, gelu_tanh_mul, the GEMM's
// EPI_SILU and EPI_RESID outputs) can store it in the weights' 16-bit format, and the GEMM can
// read it so. Storing is the GEMM's own rounding moved to the producer (common.cuh store_act
// and matmul_x both round with f32_to_bits), so each check is bitwise:
//   - a producer's 16-bit output equals its f32 output rounded to nearest even, element for
//     element (so nothing but the storage changed);
//   - the GEMM on x stored in 16 bits equals the GEMM on the f32 x, bit for bit, for every tile
//     kernel, split and register folds, m <= 128 (x through cp.async) and m > 128 (no matmul_x
//     pass), k % 8 == 0 and not (rows not 16-byte aligned: the plain-load branch);
//   - the chain rms_norm -> GEMM gives the same logits-like outputs both ways.
#pragma once
#include "fused_test.h"

namespace act16test {
using mmtest::Check;
using mmtest::Problem;

inline uint16_t round16(int dt, float v) { return dt == 1 ? f32_to_bf16_bits(v) : f32_to_f16_bits(v); }
inline std::vector<uint16_t> round_all(int dt, const std::vector<float>& v) {
    std::vector<uint16_t> o;
    o.reserve(v.size());
    for (float x : v) o.push_back(round16(dt, x));
    return o;
}
inline bool same16(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), 2 * a.size()) == 0;
}
inline const char* dname(int dt) { return dt == 1 ? "bf16" : "f16"; }
inline std::string shape(int m, int n, int k) { return " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k); }

// The GEMM with x stored in 16 bits against the same GEMM on f32 x.
inline void test_gemm_x16(const Check& check, int dt, int m, int n, int k, bool bias) {
    Problem p = mmtest::problem(dt, m, n, k, bias);
    const std::vector<uint16_t> x16 = round_all(dt, p.x);
    std::string kernel;
    const auto want = mmtest::run(dt, p.x.data(), p.w.data(), bias ? p.b.data() : nullptr, m, n, k, &kernel);
    std::vector<float> got((size_t)m * n, NAN);
    const Epilogue ep{got.data(), nullptr, nullptr, EPI_PLAIN, 0, 0};
    mmtest::counters_ok = mmtest::gemm(dt, nullptr, p.w.data(), bias ? p.b.data() : nullptr, m, n, k, mmtest::k_slices(n, k), ep, false, nullptr,
                                       NormIn{nullptr, 0, 0.0f}, RopeKv{}, x16.data()) &&
                          mmtest::counters_ok;
    check(std::string("matmul on x stored in ") + dname(dt) + shape(m, n, k) + (k % 8 ? " (rows not 16-byte aligned)" : "") + " " + kernel +
              ": bitwise equal to the GEMM on f32 x",
          fusedtest::same(got, want));
}

// EPI_SILU storing act in 16 bits: the f32 epilogue's values rounded.
inline void test_silu16(const Check& check, int dt, int m, int inter, int k) {
    fusedtest::GateUp g = fusedtest::gate_up_problem(dt, m, inter, k);
    const auto want = fusedtest::gate_up_silu(g, g.gate.x.data(), m, false);
    const int n = (inter + 31) / 32 * 64;
    std::vector<uint16_t> got((size_t)m * inter, 0xffff);
    Epilogue ep{reinterpret_cast<float*>(got.data()), nullptr, nullptr, EPI_SILU, inter, 0};
    ep.act16 = 1;
    mmtest::counters_ok = mmtest::gemm(dt, g.gate.x.data(), g.fused.data(), nullptr, m, n, k, mmtest::k_slices(n, k), ep, false) && mmtest::counters_ok;
    check(std::string("gate_up_silu (EPI_SILU) storing act in ") + dname(dt) + shape(m, inter, k) + ": the f32 epilogue's values rounded, bitwise",
          same16(got, round_all(dt, want)));
}

// EPI_RESID storing hg in 16 bits: h as before, hg the f32 epilogue's rounded.
inline void test_resid16(const Check& check, int dt, int m, int n, int k) {
    Problem p = mmtest::problem(dt, m, n, k, false);
    std::vector<float> h0((size_t)m * n);
    for (auto& v : h0) v = 4.0f * mmtest::rnd();
    std::vector<uint16_t> gamma;
    for (int i = 0; i < n; ++i) gamma.push_back(round16(dt, 1.0f + 0.5f * mmtest::rnd()));
    std::vector<float> h32 = h0, hg32((size_t)m * n, NAN), h16 = h0;
    std::vector<uint16_t> hg16((size_t)m * n, 0xffff);
    const Epilogue e32{h32.data(), hg32.data(), nullptr, EPI_RESID, 0, 0, gamma.data(), dt + 1};
    Epilogue e16{h16.data(), reinterpret_cast<float*>(hg16.data()), nullptr, EPI_RESID, 0, 0, gamma.data(), dt + 1};
    e16.act16 = 1;
    const auto sl = mmtest::k_slices(n, k);
    mmtest::counters_ok = mmtest::gemm(dt, p.x.data(), p.w.data(), nullptr, m, n, k, sl, e32, false) && mmtest::counters_ok;
    mmtest::counters_ok = mmtest::gemm(dt, p.x.data(), p.w.data(), nullptr, m, n, k, sl, e16, false) && mmtest::counters_ok;
    check(std::string("matmul_residual (EPI_RESID) storing hg in ") + dname(dt) + shape(m, n, k) + ": h bitwise the same, hg the f32 hg rounded",
          fusedtest::same(h16, h32) && same16(hg16, round_all(dt, hg32)));
}

// rms_norm, add_rms_norm, silu_mul and gelu_tanh_mul with out_code 2 / 3 against out_code 1, rounded.
inline void test_small16(const Check& check, int dt, int rows, int dim) {
    const int code = dt + 1;
    std::vector<float> h((size_t)rows * dim), x(h.size());
    for (auto& v : h) v = 3.0f * mmtest::rnd();
    for (auto& v : x) v = 2.0f * mmtest::rnd();
    std::vector<uint16_t> gamma;
    for (int i = 0; i < dim; ++i) gamma.push_back(round16(dt, 1.0f + 0.5f * mmtest::rnd()));
    const size_t len = h.size();
    std::vector<float> o32(len, NAN);
    std::vector<uint16_t> o16(len, 0xffff);
    auto norm = [&](void* out, int c) {
        launch(dim3{(unsigned)rows, 1, 1}, dim3{256, 1, 1}, [&] {
            if (dt == 1) rms_norm_bf16(h.data(), (const bf16_t*)gamma.data(), out, c, rows, dim, 1e-5f);
            else rms_norm_f16(h.data(), (const f16_t*)gamma.data(), out, c, rows, dim, 1e-5f);
        });
    };
    norm(o32.data(), 1);
    norm(o16.data(), code);
    const std::string tag = std::string(" in ") + dname(dt) + " rows=" + std::to_string(rows) + " dim=" + std::to_string(dim);
    check("rms_norm storing out" + tag + ": the f32 output rounded, bitwise", same16(o16, round_all(dt, o32)));
    std::vector<float> a32 = h, a16 = h;
    std::fill(o32.begin(), o32.end(), NAN);
    std::fill(o16.begin(), o16.end(), 0xffff);
    auto add_norm = [&](std::vector<float>& acc, void* out, int c) {
        launch(dim3{(unsigned)rows, 1, 1}, dim3{256, 1, 1}, [&] {
            if (dt == 1) add_rms_norm_bf16(acc.data(), x.data(), (const bf16_t*)gamma.data(), out, c, rows, dim, 1e-5f);
            else add_rms_norm_f16(acc.data(), x.data(), (const f16_t*)gamma.data(), out, c, rows, dim, 1e-5f);
        });
    };
    add_norm(a32, o32.data(), 1);
    add_norm(a16, o16.data(), code);
    check("add_rms_norm storing out" + tag + ": acc bitwise the same, out the f32 output rounded", fusedtest::same(a16, a32) && same16(o16, round_all(dt, o32)));
    std::fill(o32.begin(), o32.end(), NAN);
    std::fill(o16.begin(), o16.end(), 0xffff);
    const dim3 grid{(unsigned)((len + 255) / 256), 1, 1};
    launch(grid, dim3{256, 1, 1}, [&] { silu_mul(h.data(), x.data(), o32.data(), 1, len); });
    launch(grid, dim3{256, 1, 1}, [&] { silu_mul(h.data(), x.data(), o16.data(), code, len); });
    check("silu_mul storing out" + tag + ": the f32 output rounded, bitwise", same16(o16, round_all(dt, o32)));
    std::fill(o32.begin(), o32.end(), NAN);
    std::fill(o16.begin(), o16.end(), 0xffff);
    launch(grid, dim3{256, 1, 1}, [&] { gelu_tanh_mul(h.data(), x.data(), o32.data(), 1, len); });
    launch(grid, dim3{256, 1, 1}, [&] { gelu_tanh_mul(h.data(), x.data(), o16.data(), code, len); });
    check("gelu_tanh_mul storing out" + tag + ": the f32 output rounded, bitwise", same16(o16, round_all(dt, o32)));
}

// The chain a layer runs: rms_norm then the projection, with x stored in f32 and in 16 bits.
inline void test_chain(const Check& check, int dt, int m, int n, int k) {
    Problem p = mmtest::problem(dt, m, n, k, false);
    std::vector<uint16_t> gamma;
    for (int i = 0; i < k; ++i) gamma.push_back(round16(dt, 1.0f + 0.5f * mmtest::rnd()));
    const auto x32 = fusedtest::rms_normed(dt, p.x, gamma, m, k, 1e-5f);
    std::vector<uint16_t> x16((size_t)m * k, 0xffff);
    launch(dim3{(unsigned)m, 1, 1}, dim3{256, 1, 1}, [&] {
        if (dt == 1) rms_norm_bf16(p.x.data(), (const bf16_t*)gamma.data(), x16.data(), 2, m, k, 1e-5f);
        else rms_norm_f16(p.x.data(), (const f16_t*)gamma.data(), x16.data(), 3, m, k, 1e-5f);
    });
    const auto want = mmtest::run(dt, x32.data(), p.w.data(), nullptr, m, n, k);
    std::vector<float> got((size_t)m * n, NAN);
    const Epilogue ep{got.data(), nullptr, nullptr, EPI_PLAIN, 0, 0};
    mmtest::counters_ok = mmtest::gemm(dt, nullptr, p.w.data(), nullptr, m, n, k, mmtest::k_slices(n, k), ep, false, nullptr, NormIn{nullptr, 0, 0.0f},
                                       RopeKv{}, x16.data()) &&
                          mmtest::counters_ok;
    check(std::string("rms_norm then matmul with x stored in ") + dname(dt) + shape(m, n, k) + ": bitwise equal to the f32 chain", fusedtest::same(got, want));
}

inline void run_all(const Check& check) {
    // m16 / m64 / m128 kernels; split (k = 1000, 999) and register folds (m = 200, and k = 136's
    // one slice); k = 999 and 100 take the plain-load branch (rows not 16-byte aligned).
    test_gemm_x16(check, 1, 1, 200, 1000, false);
    test_gemm_x16(check, 2, 7, 77, 999, true);
    test_gemm_x16(check, 1, 17, 96, 136, true);
    test_gemm_x16(check, 1, 64, 70, 2048, false);
    test_gemm_x16(check, 2, 200, 70, 1000, true);
    test_gemm_x16(check, 1, 200, 64, 100, false);
    test_silu16(check, 1, 1, 70, 1000);
    test_silu16(check, 2, 17, 64, 999);
    test_silu16(check, 1, 200, 70, 136);
    test_resid16(check, 1, 1, 200, 1000);
    test_resid16(check, 2, 17, 72, 136);
    test_small16(check, 1, 5, 300);
    test_small16(check, 2, 3, 2049);
    test_chain(check, 1, 2, 96, 2048);
    test_chain(check, 2, 200, 64, 999);
    check("every act16 GEMM left its split-K counters at 0", mmtest::counters_ok);
}
}  // namespace act16test
