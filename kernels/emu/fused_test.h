// fused_test.h — the fused ops of the CUDA backend on the emulator: the q/k/v and gate/up
// epilogues of the tile kernel (kernels/matmul.cu), add_rms_norm (rms_norm.cu) and
// rope_kv_write (kv_write.cu), each against an f64 reference AND bitwise against the unfused
// composition it replaces, and the fused GEMMs' rows bitwise alone and in batches.
//
// The fused weights are laid out here as crates/cuda/src/matmul.rs `fuse_qkv_weights` and
// `fuse_gate_up_weight` lay them out at load. A fused GEMM slices K by its own (n, k) (k_slices of the
// fused width): the unfused oracle is run with that same slicing, which is the unfused path's
// exact arithmetic whenever k_slices agrees for the parts' widths (it does where k / 256 caps
// the count, as for hidden 2048 and q/k/v of 2048/256 columns).
#pragma once
#include "matmul_test.h"

namespace fusedtest {
using mmtest::Check;
using mmtest::Problem;

inline bool same(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

// Rows [r0, r0 + m) of a problem as a problem of its own (same weights).
inline Problem rows_of(const Problem& p, int r0, int m) {
    Problem q = p;
    q.m = m;
    q.x.assign(p.x.begin() + (size_t)r0 * p.k, p.x.begin() + (size_t)(r0 + m) * p.k);
    return q;
}

// q, k, v stacked as [nq + 2 nkv, k] (and their biases as [nq + 2 nkv]): `p` holds the fused
// weight; returns q, k, v of x through the qkv epilogue, or through three separate two-launch
// GEMMs (`legacy`) with the fused slicing.
struct Qkv {
    std::vector<float> q, k, v;
};
inline Qkv qkv(const Problem& p, int nq, int nkv, bool legacy) {
    const int n = nq + 2 * nkv;
    const mmtest::Slices sl = mmtest::k_slices(n, p.k);
    Qkv o{std::vector<float>((size_t)p.m * nq, NAN), std::vector<float>((size_t)p.m * nkv, NAN), std::vector<float>((size_t)p.m * nkv, NAN)};
    const uint16_t* b = p.bias ? p.b.data() : nullptr;
    if (!legacy) {
        const Epilogue ep{o.q.data(), o.k.data(), o.v.data(), EPI_QKV, nq, nkv};
        mmtest::counters_ok = mmtest::gemm(p.dt, p.x.data(), p.w.data(), b, p.m, n, p.k, sl, ep, false) && mmtest::counters_ok;
        return o;
    }
    const int offs[3] = {0, nq, nq + nkv}, widths[3] = {nq, nkv, nkv};
    float* outs[3] = {o.q.data(), o.k.data(), o.v.data()};
    for (int i = 0; i < 3; ++i) {
        const Epilogue ep{outs[i], nullptr, nullptr, EPI_PLAIN, 0, 0};
        mmtest::gemm(p.dt, p.x.data(), p.w.data() + (size_t)offs[i] * p.k, b ? b + offs[i] : nullptr, p.m, widths[i], p.k, sl, ep, true);
    }
    return o;
}

inline void test_qkv(const Check& check, int dt, int m, int nq, int nkv, int k, bool bias) {
    const int n = nq + 2 * nkv;
    Problem p = mmtest::problem(dt, m, n, k, bias);
    const Qkv got = qkv(p, nq, nkv, false), want = qkv(p, nq, nkv, true);
    std::vector<float> joined((size_t)m * n);
    for (int r = 0; r < m; ++r) {
        std::copy_n(got.q.begin() + (size_t)r * nq, nq, joined.begin() + (size_t)r * n);
        std::copy_n(got.k.begin() + (size_t)r * nkv, nkv, joined.begin() + (size_t)r * n + nq);
        std::copy_n(got.v.begin() + (size_t)r * nkv, nkv, joined.begin() + (size_t)r * n + nq + nkv);
    }
    const std::string name = "qkv_proj (EPI_QKV) " + std::string(dt == 1 ? "bf16" : "f16") + " nq=" + std::to_string(nq) + " nkv=" + std::to_string(nkv) +
                             " slices " + std::to_string(mmtest::k_slices(n, k).count);
    mmtest::check_f64(check, name, p, joined, mmtest::k_slices(n, k).count);
    check(name + " m=" + std::to_string(m) + " k=" + std::to_string(k) + ": q, k, v bitwise equal to three two-launch GEMMs",
          same(got.q, want.q) && same(got.k, want.k) && same(got.v, want.v));
}

// gate, up [inter, k] interleaved in blocks of 32 rows per 64-row tile (matmul.rs
// `fuse_gate_up_weight`); rows past inter in the last tile are zeros.
inline std::vector<uint16_t> interleave_gate_up(const std::vector<uint16_t>& gate, const std::vector<uint16_t>& up, int inter, int k) {
    const int tiles = (inter + 31) / 32;
    std::vector<uint16_t> w((size_t)tiles * 64 * k, 0);
    for (int j = 0; j < tiles; ++j)
        for (int i = 0; i < 32 && 32 * j + i < inter; ++i) {
            std::copy_n(gate.begin() + (size_t)(32 * j + i) * k, k, w.begin() + (size_t)(64 * j + i) * k);
            std::copy_n(up.begin() + (size_t)(32 * j + i) * k, k, w.begin() + (size_t)(64 * j + 32 + i) * k);
        }
    return w;
}

struct GateUp {
    Problem gate, up;  // the same x
    std::vector<uint16_t> fused;
    int inter;
};
inline GateUp gate_up_problem(int dt, int m, int inter, int k) {
    GateUp g{mmtest::problem(dt, m, inter, k, false), {}, {}, inter};
    g.up = mmtest::problem(dt, m, inter, k, false);
    g.up.x = g.gate.x;
    g.fused = interleave_gate_up(g.gate.w, g.up.w, inter, k);
    return g;
}
// Through the gate/up epilogue `epi` (EPI_SILU, or EPI_GEGLU: gelu_tanh), or (`legacy`) the gate
// and up GEMMs then silu_mul (gelu_tanh_mul) with the fused slicing.
inline std::vector<float> gate_up_silu(const GateUp& g, const float* x, int m, bool legacy, int epi = EPI_SILU) {
    const int k = g.gate.k, inter = g.inter, n = (inter + 31) / 32 * 64;
    const mmtest::Slices sl = mmtest::k_slices(n, k);
    std::vector<float> out((size_t)m * inter, NAN);
    if (!legacy) {
        const Epilogue ep{out.data(), nullptr, nullptr, epi, inter, 0};
        mmtest::counters_ok = mmtest::gemm(g.gate.dt, x, g.fused.data(), nullptr, m, n, k, sl, ep, false) && mmtest::counters_ok;
        return out;
    }
    std::vector<float> gv((size_t)m * inter, NAN), uv((size_t)m * inter, NAN);
    mmtest::gemm(g.gate.dt, x, g.gate.w.data(), nullptr, m, inter, k, sl, Epilogue{gv.data(), nullptr, nullptr, EPI_PLAIN, 0, 0}, true);
    mmtest::gemm(g.gate.dt, x, g.up.w.data(), nullptr, m, inter, k, sl, Epilogue{uv.data(), nullptr, nullptr, EPI_PLAIN, 0, 0}, true);
    const size_t len = (size_t)m * inter;
    if (epi == EPI_GEGLU) launch(dim3{(unsigned)((len + 255) / 256), 1, 1}, dim3{256, 1, 1}, [&] { gelu_tanh_mul(gv.data(), uv.data(), out.data(), 1, len); });
    else launch(dim3{(unsigned)((len + 255) / 256), 1, 1}, dim3{256, 1, 1}, [&] { silu_mul(gv.data(), uv.data(), out.data(), 1, len); });
    return out;
}

inline void test_gate_up(const Check& check, int dt, int m, int inter, int k, int epi = EPI_SILU) {
    GateUp g = gate_up_problem(dt, m, inter, k);
    const auto got = gate_up_silu(g, g.gate.x.data(), m, false, epi), want = gate_up_silu(g, g.gate.x.data(), m, true, epi);
    const bool geglu = epi == EPI_GEGLU;
    // f64 over the rounded x (the kernel's operands): only f32 accumulation and expf (tanhf) differ.
    double num = 0, den = 0;
    bool finite = true;
    for (int r = 0; r < m; ++r)
        for (int c = 0; c < inter; ++c) {
            double gs = 0, us = 0;
            for (int kk = 0; kk < k; ++kk) {
                const double xr = mmtest::xround(dt, g.gate.x[(size_t)r * k + kk]);
                gs += xr * mmtest::wval(dt, g.gate.w[(size_t)c * k + kk]);
                us += xr * mmtest::wval(dt, g.up.w[(size_t)c * k + kk]);
            }
            const double a = geglu ? 0.5 * gs * (1.0 + std::tanh(0.7978845608028654 * (gs + 0.044715 * gs * gs * gs))) : gs / (1.0 + std::exp(-gs));
            const double w = a * us, v = got[(size_t)r * inter + c];
            finite = finite && std::isfinite(v);
            num += (v - w) * (v - w);
            den += w * w;
        }
    char buf[256];
    const int n = (inter + 31) / 32 * 64;
    std::snprintf(buf, sizeof buf, "%s %s m=%d inter=%d k=%d slices %d: NMSE vs f64 %.2e (limit 1e-10); bitwise equal to gate, up GEMMs + %s",
                  geglu ? "gate_up GeGLU (EPI_GEGLU)" : "gate_up_silu (EPI_SILU)", dt == 1 ? "bf16" : "f16", m, inter, k, mmtest::k_slices(n, k).count, num / (den > 0 ? den : 1),
                  geglu ? "gelu_tanh_mul" : "silu_mul");
    check(buf, finite && num / (den > 0 ? den : 1) <= 1e-10 && same(got, want));
}

// Row r of the fused GEMMs: the same bytes alone (m = 1) and in batches over every tile kernel.
inline void fused_rows_bitwise(const Check& check, int dt, int k) {
    const int nq = 96, nkv = 40, inter = 70, M = 200;
    Problem p = mmtest::problem(dt, M, nq + 2 * nkv, k, true);
    GateUp g = gate_up_problem(dt, M, inter, k);
    std::vector<std::pair<int, Qkv>> qb;
    std::vector<std::pair<int, std::vector<float>>> gb;
    for (int m : {7, 17, 200}) {
        qb.push_back({m, qkv(rows_of(p, 0, m), nq, nkv, false)});
        gb.push_back({m, gate_up_silu(g, g.gate.x.data(), m, false)});
    }
    bool ok = true;
    int pairs = 0;
    for (int r : {0, 6, 16, 199}) {
        const Qkv alone = qkv(rows_of(p, r, 1), nq, nkv, false);
        const auto galone = gate_up_silu(g, g.gate.x.data() + (size_t)r * k, 1, false);
        for (auto& [m, o] : qb)
            if (r < m) {
                ok = ok && std::memcmp(alone.q.data(), o.q.data() + (size_t)r * nq, 4 * nq) == 0 &&
                     std::memcmp(alone.k.data(), o.k.data() + (size_t)r * nkv, 4 * nkv) == 0 &&
                     std::memcmp(alone.v.data(), o.v.data() + (size_t)r * nkv, 4 * nkv) == 0;
                ++pairs;
            }
        for (auto& [m, o] : gb)
            if (r < m) {
                ok = ok && std::memcmp(galone.data(), o.data() + (size_t)r * inter, 4 * inter) == 0;
                ++pairs;
            }
    }
    check("qkv_proj and gate_up_silu rows bitwise equal alone (m=1) and in batches of 7, 17, 200 (" + std::to_string(pairs) + " row pairs, k=" +
              std::to_string(k) + ")",
          ok);
}

// ---- The norms fused into the projections (Backend::fuses_norm) ----
// EPI_RESID: h += x W^T and hg = h * gamma, against matmul then the host's f32 add (the add of
// add_rms_norm) and product, bitwise.
inline void test_resid(const Check& check, int dt, int m, int n, int k, bool with_hg) {
    Problem p = mmtest::problem(dt, m, n, k, false);
    std::vector<float> h0((size_t)m * n);
    for (auto& v : h0) v = 4.0f * mmtest::rnd();
    std::vector<uint16_t> gamma;
    for (int i = 0; i < n; ++i) gamma.push_back(dt == 1 ? f32_to_bf16_bits(1.0f + 0.5f * mmtest::rnd()) : f32_to_f16_bits(1.0f + 0.5f * mmtest::rnd()));
    std::vector<float> h = h0, hg((size_t)m * n, NAN);
    Epilogue ep{h.data(), with_hg ? hg.data() : nullptr, nullptr, EPI_RESID, 0, 0, gamma.data(), dt + 1};
    mmtest::counters_ok = mmtest::gemm(dt, p.x.data(), p.w.data(), nullptr, m, n, k, mmtest::k_slices(n, k), ep, false) && mmtest::counters_ok;
    const auto o = mmtest::run(dt, p.x.data(), p.w.data(), nullptr, m, n, k);
    std::vector<float> want_h((size_t)m * n), want_hg((size_t)m * n, NAN);
    for (size_t i = 0; i < want_h.size(); ++i) {
        want_h[i] = h0[i] + o[i];
        if (with_hg) want_hg[i] = want_h[i] * mmtest::wval(dt, gamma[i % (size_t)n]);
    }
    const std::string name = std::string("matmul_residual (EPI_RESID) ") + (dt == 1 ? "bf16" : "f16") + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                             " k=" + std::to_string(k) + " slices " + std::to_string(mmtest::k_slices(n, k).count) + (with_hg ? " with hg" : " without hg");
    check(name + ": h and hg bitwise equal to matmul, then h + o and h * gamma", same(h, want_h) && (!with_hg || same(hg, want_hg)) &&
                                                                                    std::all_of(hg.begin(), hg.end(), [&](float v) { return with_hg || std::isnan(v); }));
}

// rms_norm.cu's output for h [m, k] with gamma (dt: 1 bf16, 2 f16), through the emulated kernel.
inline std::vector<float> rms_normed(int dt, const std::vector<float>& h, const std::vector<uint16_t>& gamma, int m, int k, float eps) {
    std::vector<float> out(h.size(), NAN);
    launch(dim3{(unsigned)m, 1, 1}, dim3{256, 1, 1}, [&] {
        if (dt == 1) rms_norm_bf16(h.data(), (const bf16_t*)gamma.data(), out.data(), 1, m, k, eps);
        else rms_norm_f16(h.data(), (const f16_t*)gamma.data(), out.data(), 1, m, k, eps);
    });
    return out;
}

struct Normed {
    std::vector<float> h;  // [m, k], rows of very different scales
    std::vector<uint16_t> gamma;
    float eps = 1e-5f;
};
inline Normed normed_input(int dt, int m, int k) {
    Normed nd;
    nd.h.resize((size_t)m * k);
    for (int r = 0; r < m; ++r) {
        const float scale = r % 3 == 0 ? 30.0f : r % 3 == 1 ? 1.0f : 0.01f;
        for (int i = 0; i < k; ++i) nd.h[(size_t)r * k + i] = scale * mmtest::rnd();
    }
    for (int i = 0; i < k; ++i) nd.gamma.push_back(dt == 1 ? f32_to_bf16_bits(1.0f + 0.5f * mmtest::rnd()) : f32_to_f16_bits(1.0f + 0.5f * mmtest::rnd()));
    return nd;
}

// The NormIn prologue: a projection of h with the norm inside gives, bit for bit, rms_norm then
// the projection, for the plain, q/k/v (with bias) and gate/up-silu epilogues.
inline void test_norm_in(const Check& check, int dt, int m, int k) {
    const Normed nd = normed_input(dt, m, k);
    const NormIn nm{nd.gamma.data(), dt + 1, nd.eps};
    const auto xn = rms_normed(dt, nd.h, nd.gamma, m, k, nd.eps);
    const std::string tag = std::string(dt == 1 ? "bf16" : "f16") + " m=" + std::to_string(m) + " k=" + std::to_string(k);
    {  // plain, n = 200 (not a tile multiple)
        Problem p = mmtest::problem(dt, m, 200, k, false);
        std::vector<float> got((size_t)m * 200, NAN);
        const Epilogue ep{got.data(), nullptr, nullptr, EPI_PLAIN, 0, 0};
        mmtest::counters_ok = mmtest::gemm(dt, nd.h.data(), p.w.data(), nullptr, m, 200, k, mmtest::k_slices(200, k), ep, false, nullptr, nm) && mmtest::counters_ok;
        const auto want = mmtest::run(dt, xn.data(), p.w.data(), nullptr, m, 200, k);
        check("norm in the projection (NormIn) plain " + tag + " slices " + std::to_string(mmtest::k_slices(200, k).count) + ": bitwise equal to rms_norm then matmul",
              same(got, want));
    }
    {  // q/k/v with bias
        const int nq = 96, nkv = 40, n = nq + 2 * nkv;
        Problem p = mmtest::problem(dt, m, n, k, true);
        Qkv got{std::vector<float>((size_t)m * nq, NAN), std::vector<float>((size_t)m * nkv, NAN), std::vector<float>((size_t)m * nkv, NAN)};
        const Epilogue ep{got.q.data(), got.k.data(), got.v.data(), EPI_QKV, nq, nkv};
        mmtest::counters_ok = mmtest::gemm(dt, nd.h.data(), p.w.data(), p.b.data(), m, n, k, mmtest::k_slices(n, k), ep, false, nullptr, nm) && mmtest::counters_ok;
        p.x = xn;
        const Qkv want = qkv(p, nq, nkv, false);
        check("norm in the projection (NormIn) qkv_proj with bias " + tag + ": bitwise equal to rms_norm then qkv_proj",
              same(got.q, want.q) && same(got.k, want.k) && same(got.v, want.v));
    }
    {  // gate/up silu
        const int inter = 70, n = (inter + 31) / 32 * 64;
        GateUp g = gate_up_problem(dt, m, inter, k);
        std::vector<float> got((size_t)m * inter, NAN);
        const Epilogue ep{got.data(), nullptr, nullptr, EPI_SILU, inter, 0};
        mmtest::counters_ok = mmtest::gemm(dt, nd.h.data(), g.fused.data(), nullptr, m, n, k, mmtest::k_slices(n, k), ep, false, nullptr, nm) && mmtest::counters_ok;
        const auto want = gate_up_silu(g, xn.data(), m, false);
        check("norm in the projection (NormIn) gate_up_silu " + tag + ": bitwise equal to rms_norm then gate_up_silu", same(got, want));
    }
}

// EPI_QKV_ROPE: the q/k/v GEMM with rope and the cache write in its epilogue, against
// qkv_proj (EPI_QKV) then the rope_kv_write kernel, bitwise: q, and both caches whole (the
// untouched slots too); one row's slot is out of range and must write nothing.
template <typename KV>
inline void test_qkv_rope(const Check& check, int dt, int m, int nq, int nkv, int k, int hd, bool bias) {
    const int n = nq + 2 * nkv, half = hd / 2;
    Problem p = mmtest::problem(dt, m, n, k, bias);
    const unsigned long long num_slots = (unsigned long long)m + 7;
    std::vector<u32> pos, slots;
    for (int r = 0; r < m; ++r) {
        pos.push_back((u32)((r * 977 + 13) % 5000));
        slots.push_back(r == m / 2 && m > 1 ? (u32)num_slots : (u32)((r * 5 + 3) % num_slots));  // distinct: 5 coprime to m + 7? checked below
    }
    std::vector<float> inv_freq;
    for (int i = 0; i < half; ++i) inv_freq.push_back((float)std::pow(10000.0, -2.0 * i / hd));
    std::vector<KV> kc0((size_t)num_slots * nkv), vc0((size_t)num_slots * nkv);
    for (size_t i = 0; i < kc0.size(); ++i) {
        store_kv(&kc0[i], mmtest::rnd());
        store_kv(&vc0[i], mmtest::rnd());
    }
    const bool cache_bf16 = sizeof(KV) == 2;
    // Fused.
    std::vector<float> q((size_t)m * nq, NAN);
    std::vector<KV> kc = kc0, vc = vc0;
    const Epilogue ep{q.data(), nullptr, nullptr, EPI_QKV_ROPE, nq, nkv};
    const RopeKv rk{pos.data(), inv_freq.data(), slots.data(), kc.data(), vc.data(), num_slots, hd, cache_bf16 ? 1 : 0};
    std::string kernel;
    mmtest::counters_ok = mmtest::gemm(dt, p.x.data(), p.w.data(), bias ? p.b.data() : nullptr, m, n, k, mmtest::k_slices(n, k), ep, false, &kernel, NormIn{nullptr, 0, 0.0f}, rk) && mmtest::counters_ok;
    // A head_dim that does not divide 64 must have taken a 128-wide kernel (else heads straddle tiles).
    // (m128_n128 and m128_w64, variants for m > 128, are 128 wide whatever head_dim is.)
    const bool w64 = kernel.find("m128_w64") != std::string::npos;
    const bool wide = kernel.find("_n128") != std::string::npos || w64, want_wide = 64 % hd != 0 || kernel.find("m128_n128") != std::string::npos || w64;
    // qkv_proj, then rope_kv_write.
    Qkv want = qkv(p, nq, nkv, false);
    std::vector<KV> kw = kc0, vw = vc0;
    launch(dim3{(unsigned)m, 1, 1}, dim3{128, 1, 1}, [&] {
        if constexpr (sizeof(KV) == 2)
            rope_kv_write_bf16(want.q.data(), want.k.data(), want.v.data(), kw.data(), vw.data(), pos.data(), inv_freq.data(), slots.data(), m, nq / hd, nkv / hd, hd, num_slots);
        else
            rope_kv_write_f32(want.q.data(), want.k.data(), want.v.data(), kw.data(), vw.data(), pos.data(), inv_freq.data(), slots.data(), m, nq / hd, nkv / hd, hd, num_slots);
    });
    std::vector<bool> seen(num_slots, false);
    bool distinct = true;
    for (u32 sl : slots)
        if (sl < num_slots) {
            distinct = distinct && !seen[sl];
            seen[sl] = true;
        }
    const bool caches = std::memcmp(kc.data(), kw.data(), sizeof(KV) * kc.size()) == 0 && std::memcmp(vc.data(), vw.data(), sizeof(KV) * vc.size()) == 0;
    const bool changed = std::memcmp(kc.data(), kc0.data(), sizeof(KV) * kc.size()) != 0;
    check("qkv_rope_kv_write (EPI_QKV_ROPE) " + std::string(dt == 1 ? "bf16" : "f16") + " m=" + std::to_string(m) + " nq=" + std::to_string(nq) + " nkv=" +
              std::to_string(nkv) + " k=" + std::to_string(k) + " head_dim=" + std::to_string(hd) + (bias ? " bias" : "") + (cache_bf16 ? " bf16 cache" : " f32 cache") +
              " (" + kernel + "): q and both caches bitwise equal to qkv_proj then rope_kv_write",
          distinct && changed && wide == want_wide && same(q, want.q) && caches);
}

// EPI_GEGLU's checks, also what TANDEM_GEMM_BREAK=5 (EPI_GEGLU computing silu) must fail.
inline void run_geglu(const Check& check) {
    test_gate_up(check, 1, 1, 70, 1000, EPI_GEGLU);
    test_gate_up(check, 2, 17, 70, 136, EPI_GEGLU);
    test_gate_up(check, 1, 200, 70, 136, EPI_GEGLU);
}

inline void run_all(const Check& check) {
    // Split (m <= 128, 3 slices at k = 1000 / 999) and register-fold (m = 200) paths; k = 999
    // breaks 16-byte alignment; n = 176 and inter = 70 are not multiples of the tiles.
    test_qkv(check, 1, 1, 96, 40, 1000, true);
    test_qkv(check, 1, 17, 96, 40, 999, false);
    test_qkv(check, 2, 200, 96, 40, 1000, true);
    test_qkv(check, 1, 64, 64, 32, 136, true);
    test_gate_up(check, 1, 1, 70, 1000);
    test_gate_up(check, 1, 16, 64, 999);
    test_gate_up(check, 2, 17, 70, 136);
    test_gate_up(check, 1, 200, 70, 1000);
    // GeGLU (Gemma): the same epilogue with gelu_tanh, against gelu_tanh_mul: split (k = 1000),
    // m64 (17 rows, f16), register fold (m = 200).
    run_geglu(check);
    fused_rows_bitwise(check, 1, 1000);
    // Residual add: split (k = 1000, 3 slices; k = 2048, 8) and one slice (k = 136), m16 / m64.
    test_resid(check, 1, 1, 200, 1000, true);
    test_resid(check, 1, 2, 64, 2048, true);
    test_resid(check, 2, 17, 72, 136, true);
    test_resid(check, 1, 5, 200, 999, false);
    // The norm prologue: k = 1000 and 999 (not multiples of 256 or 8), 2048 (8 per lane's
    // chain), 64 (fewer elements than rms_norm's threads); m across the m16 and m64 kernels.
    test_norm_in(check, 1, 1, 1000);
    test_norm_in(check, 1, 2, 2048);
    test_norm_in(check, 2, 3, 999);
    test_norm_in(check, 1, 16, 64);
    test_norm_in(check, 2, 17, 1000);
    test_norm_in(check, 1, 100, 136);
    // Rope and the cache write in the q/k/v epilogue: split (k = 1000) and register folds
    // (m = 200), m16 / m64 / m128; head_dim 32 with nq = 96, so a tile holds q and k heads.
    test_qkv_rope<bf16_t>(check, 1, 1, 128, 64, 1000, 64, false);
    test_qkv_rope<bf16_t>(check, 1, 5, 96, 32, 136, 32, true);
    test_qkv_rope<float>(check, 2, 17, 128, 64, 999, 64, true);
    test_qkv_rope<bf16_t>(check, 1, 200, 192, 64, 1000, 64, true);
    test_qkv_rope<float>(check, 1, 2, 64, 64, 2048, 16, false);
    // head_dim 128 (Llama-3.1-8B, Mistral, Qwen2-7B): the 128-wide kernels, m16_n128 up to 16
    // rows, m64_n128 above (m = 200: x through matmul_x, the slices folded in registers).
    // Split (k = 1000 / 999: 3 slices; k = 2048: 8) and one slice (k = 136); GQA 4 (512 / 128),
    // 3 (384 / 128), 2 (256 / 128) and 1 (256 / 256); bias; bf16 and f32 caches; f16 weights;
    // rows m / 2 of m = 2, 7, 16, ... write to an out-of-range slot.
    test_qkv_rope<bf16_t>(check, 1, 1, 512, 128, 1000, 128, false);
    test_qkv_rope<float>(check, 1, 2, 256, 128, 2048, 128, true);
    test_qkv_rope<bf16_t>(check, 2, 7, 512, 128, 136, 128, true);
    test_qkv_rope<float>(check, 1, 16, 256, 256, 999, 128, false);
    test_qkv_rope<bf16_t>(check, 2, 17, 512, 128, 1000, 128, true);
    test_qkv_rope<float>(check, 1, 64, 384, 128, 136, 128, false);
    test_qkv_rope<bf16_t>(check, 1, 200, 512, 128, 1000, 128, true);
    test_qkv_rope<float>(check, 2, 200, 256, 128, 136, 128, true);
}
}  // namespace fusedtest
