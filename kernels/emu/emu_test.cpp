// emu_test.cpp — runs every kernel of kernels/*.cu on the CPU (through cuda_emu.h) against a
// naive double-precision reference written here, on seeded random inputs with NaN-poisoned
// outputs. It proves the kernels' indexing, bounds, reductions and barriers; it does not prove
// GPU-specific behaviour (memory model, real warp scheduling, PTX codegen) — the op suite on a
// GPU does that. Run: kernels/emu/run.sh (g++ with C++20).
#include "cuda_emu.h"

#include "../add.cu"
#include "../argmax.cu"
#include "../embedding.cu"
#include "../gather_rows.cu"
#include "../kv_write.cu"
#include "../lora.cu"
#include "../matmul.cu"
#include "../moe.cu"
#include "../paged_attention.cu"
#include "../quant_matmul.cu"
#include "../quant_mma.cu"
#include "../quant_mma_w8a8.cu"
#include "../rms_norm.cu"
#include "../rope.cu"
#include "../sampling.cu"
#include "../silu_mul.cu"

#include <algorithm>
#include <cstdio>
#include <string>

#include "act16_test.h"
#include "attention_tc_test.h"
#include "fused_test.h"
#include "kv_fp8_test.h"
#include "attention_tc_fp8_test.h"
#include "matmul_test.h"
#include "moe_test.h"
#include "lora_test.h"
#include "primitives_test.h"
#include "quant_test.h"
#include "quant_mma_test.h"
#include "quant_mma_w8a8_test.h"

static int failures = 0, checks = 0;
static uint64_t rng_state = 12345;
static float rnd() {  // splitmix64 -> [-1, 1)
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}
static std::vector<float> rvec(size_t n, float s = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = rnd() * s;
    return v;
}
static std::vector<float> nans(size_t n) { return std::vector<float>(n, NAN); }

// NMSE against the reference, plus NaN/Inf and exact-equality modes.
static void expect(const std::string& what, const std::vector<float>& got, const std::vector<double>& want, double limit) {
    ++checks;
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        if (!std::isfinite(got[i])) {
            std::printf("FAIL %s: element %zu is %f\n", what.c_str(), i, got[i]);
            ++failures;
            return;
        }
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    const double e = num / (den > 0 ? den : 1e-30);
    if (!(e <= limit)) {
        std::printf("FAIL %s: NMSE %.3e > %.1e\n", what.c_str(), e, limit);
        ++failures;
    } else {
        std::printf("ok   %s: NMSE %.3e\n", what.c_str(), e);
    }
}
static void expect_true(const std::string& what, bool c) {
    ++checks;
    std::printf("%s %s\n", c ? "ok  " : "FAIL", what.c_str());
    if (!c) ++failures;
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static uint16_t to_f16(float f) {  // round to nearest even, normal range only (test values are small)
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const int exp = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (exp <= 0) return (uint16_t)sign;  // flush tiny values (not produced below)
    uint32_t h = ((uint32_t)exp << 10) | (man >> 13);
    const uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return (uint16_t)(sign | h);
}
// A weight in dtype dt (0 f32, 1 bf16, 2 f16): the stored bytes and the values they mean.
struct W {
    std::vector<float> f32;
    std::vector<uint16_t> h;
    std::vector<float> val;
    int dt;
    const void* ptr() const { return dt == 0 ? (const void*)f32.data() : (const void*)h.data(); }
};
static W weight(int dt, const std::vector<float>& v) {
    W w{{}, {}, {}, dt};
    if (dt == 0) {
        w.f32 = v;
        w.val = v;
    } else {
        for (float x : v) {
            const uint16_t b = dt == 1 ? to_bf16(x) : to_f16(x);
            w.h.push_back(b);
            w.val.push_back(dt == 1 ? bf16_bits_to_f32(b) : f16_bits_to_f32(b));
        }
    }
    return w;
}

// kernels/matmul.cu: emu/matmul_test.h (f64 reference with derived bounds, bitwise rows across m).
static void test_matmul() {
    mmtest::run_all(expect_true);
    // f32 weights: the SIMT kernel, every m.
    for (int m : {1, 17, 70})
        for (auto [n, k] : std::vector<std::pair<int, int>>{{77, 100}, {70, 37}}) {
            W w = weight(0, rvec((size_t)n * k, 1.0f / std::sqrt((float)k)));
            W b = weight(1, rvec(n, 0.5f));  // bf16 bias: exercises the mixed-dtype path
            auto x = rvec((size_t)m * k);
            auto out = nans((size_t)m * n + 37);
            launch(dim3{(unsigned)((n + 63) / 64), (unsigned)((m + 63) / 64), 1}, dim3{256, 1, 1},
                   [&] { matmul_tiled_f32(x.data(), (const float*)w.ptr(), b.ptr(), 2, out.data(), m, n, k); });
            std::vector<double> want((size_t)m * n);
            for (int r = 0; r < m; ++r)
                for (int c = 0; c < n; ++c) {
                    double s = b.val[c];
                    for (int kk = 0; kk < k; ++kk) s += (double)x[(size_t)r * k + kk] * w.val[(size_t)c * k + kk];
                    want[(size_t)r * n + c] = s;
                }
            const std::string name = "matmul_tiled_f32 m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
            expect(name, out, want, 1e-10);
            bool guard = true;
            for (size_t i = (size_t)m * n; i < out.size(); ++i) guard = guard && std::isnan(out[i]);
            expect_true(name + " leaves the guard alone", guard);
        }
}

static void test_small_ops() {
    {  // rms_norm bf16 w, dim not a multiple of the block
        const int rows = 5, dim = 300;
        auto x = rvec(rows * dim, 3.0f);
        W w = weight(1, rvec(dim));
        auto out = nans(rows * dim);
        launch(dim3{rows, 1, 1}, dim3{256, 1, 1}, [&] { rms_norm_bf16(x.data(), (const bf16_t*)w.ptr(), out.data(), 1, rows, dim, 1e-5f); });
        std::vector<double> want(rows * dim);
        for (int r = 0; r < rows; ++r) {
            double ss = 0;
            for (int i = 0; i < dim; ++i) ss += (double)x[r * dim + i] * x[r * dim + i];
            const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
            for (int i = 0; i < dim; ++i) want[r * dim + i] = x[r * dim + i] * inv * w.val[i];
        }
        expect("rms_norm_bf16", out, want, 1e-12);
    }
    {  // add, silu_mul
        const size_t n = 1000;
        auto a = rvec(n), b = rvec(n, 8.0f), o = nans(n);
        std::vector<double> want_add(n), want_silu(n);
        for (size_t i = 0; i < n; ++i) {
            want_add[i] = (double)a[i] + b[i];
            want_silu[i] = (double)b[i] / (1.0 + std::exp(-(double)b[i])) * a[i];
        }
        launch(dim3{(unsigned)((n + 255) / 256), 1, 1}, dim3{256, 1, 1}, [&] { silu_mul(b.data(), a.data(), o.data(), 1, n); });
        expect("silu_mul", o, want_silu, 1e-12);
        launch(dim3{(unsigned)((n + 255) / 256), 1, 1}, dim3{256, 1, 1}, [&] { add(a.data(), b.data(), n); });
        expect("add", a, want_add, 1e-14);
    }
    {  // gelu_tanh_mul (GeGLU) against the f64 tanh GELU and against the f32 reference order
       // (tandem_core::backend::gelu_tanh: the host's tanhf, so equal to a few ulp on the CPU),
       // gates to ±40 (tanh saturated), the last element alone in its block; scale bitwise.
        const size_t n = 1000;
        auto g = rvec(n, 12.0f), u = rvec(n, 2.0f), o = nans(n);
        g[0] = -40.0f, g[1] = 40.0f, g[2] = 0.0f;
        std::vector<double> want(n);
        std::vector<float> want32(n);
        const double c = std::sqrt(2.0 / M_PI);
        for (size_t i = 0; i < n; ++i) {
            const double x = g[i];
            want[i] = 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x))) * u[i];
            const float inner = 0.7978846f * (g[i] + 0.044715f * g[i] * g[i] * g[i]);
            want32[i] = 0.5f * g[i] * (1.0f + std::tanh(inner)) * u[i];
        }
        launch(dim3{(unsigned)((n + 255) / 256), 1, 1}, dim3{256, 1, 1}, [&] { gelu_tanh_mul(g.data(), u.data(), o.data(), 1, n); });
        expect("gelu_tanh_mul vs f64", o, want, 1e-12);
        ++checks;
        int worst_ulp = 0;
        for (size_t i = 0; i < n; ++i) {
            int32_t a, b;
            std::memcpy(&a, &o[i], 4), std::memcpy(&b, &want32[i], 4);
            worst_ulp = std::max(worst_ulp, std::abs(a - b));
        }
        if (worst_ulp > 4 || o[0] != 0.0f || o[1] != 40.0f * u[1] || o[2] != 0.0f) {
            std::printf("FAIL gelu_tanh_mul: %d ulp from the f32 reference order (limit 4), or a saturated gate wrong (%g %g %g)\n", worst_ulp, o[0], o[1], o[2]);
            ++failures;
        } else {
            std::printf("ok   gelu_tanh_mul: within %d ulp of the f32 reference order; g = -40, 40, 0 give 0, 40 up, 0\n", worst_ulp);
        }
        auto x = rvec(n + 8), x0 = x;
        launch(dim3{(unsigned)((n + 255) / 256), 1, 1}, dim3{256, 1, 1}, [&] { scale(x.data(), 33.941125f, n); });
        ++checks;
        bool same = true;
        for (size_t i = 0; i < n + 8; ++i) same = same && x[i] == (i < n ? x0[i] * 33.941125f : x0[i]);
        if (!same) {
            std::printf("FAIL scale: not x * factor in place over len (or wrote past it)\n");
            ++failures;
        } else {
            std::printf("ok   scale: x * factor bitwise over len, the values past it untouched\n");
        }
    }
    {  // rope, GQA shapes
        const int T = 3, qh = 6, kh = 2, D = 64;
        auto q = rvec(T * qh * D), k = rvec(T * kh * D);
        auto q0 = q, k0 = k;
        std::vector<unsigned> pos = {0, 17, 3000};
        std::vector<float> inv(D / 2);
        for (int i = 0; i < D / 2; ++i) inv[i] = (float)std::pow(10000.0, -2.0 * i / D);
        launch(dim3{T, 1, 1}, dim3{128, 1, 1}, [&] { rope(q.data(), k.data(), pos.data(), inv.data(), T, qh, kh, D); });
        auto ref = [&](std::vector<float>& x0, int heads) {
            std::vector<double> w(x0.size());
            for (int t = 0; t < T; ++t)
                for (int h = 0; h < heads; ++h)
                    for (int i = 0; i < D / 2; ++i) {
                        const double a = (double)(float)(pos[t] * inv[i]);
                        const size_t o = ((size_t)t * heads + h) * D;
                        w[o + i] = x0[o + i] * std::cos(a) - x0[o + i + D / 2] * std::sin(a);
                        w[o + i + D / 2] = x0[o + i + D / 2] * std::cos(a) + x0[o + i] * std::sin(a);
                    }
            return w;
        };
        expect("rope q", q, ref(q0, qh), 1e-12);
        expect("rope k", k, ref(k0, kh), 1e-12);
    }
    {  // embedding f16 with a bad id, gather_rows with a bad row
        const int vocab = 50, hidden = 70, T = 4;
        W tab = weight(2, rvec(vocab * hidden));
        std::vector<unsigned> ids = {3, 49, 0, 50};
        auto out = nans(T * hidden);
        launch(dim3{T, 1, 1}, dim3{256, 1, 1}, [&] { embedding_f16((const f16_t*)tab.ptr(), ids.data(), out.data(), T, hidden, vocab); });
        std::vector<double> want(3 * hidden);
        for (int t = 0; t < 3; ++t)
            for (int i = 0; i < hidden; ++i) want[t * hidden + i] = tab.val[ids[t] * hidden + i];
        expect("embedding_f16", out, want, 0.0);
        bool nan_row = true;
        for (int i = 0; i < hidden; ++i) nan_row = nan_row && std::isnan(out[3 * hidden + i]);
        expect_true("embedding: id >= vocab gives a NaN row", nan_row);
        std::vector<unsigned> rows = {2, 0};
        auto g = nans(2 * hidden);
        launch(dim3{2, 1, 1}, dim3{256, 1, 1}, [&] { gather_rows(out.data(), rows.data(), g.data(), 2, hidden, T); });
        std::vector<double> gw(2 * hidden);
        for (int i = 0; i < hidden; ++i) {
            gw[i] = out[2 * hidden + i];
            gw[hidden + i] = out[i];
        }
        expect("gather_rows", g, gw, 0.0);
    }
    {  // argmax: ties (lowest index), NaN (never wins), all-NaN row (last index), -inf
        const int vocab = 1500;
        std::vector<float> l = rvec(5 * vocab);
        l[0 * vocab + 700] = 5.0f;
        l[0 * vocab + 900] = 5.0f;
        l[0 * vocab + 100] = NAN;
        for (int j = 0; j < vocab; ++j) l[1 * vocab + j] = NAN;
        l[2 * vocab + 0] = NAN;
        l[2 * vocab + 1499] = 9.0f;
        for (int j = 0; j < vocab; ++j) l[3 * vocab + j] = -INFINITY;
        for (int j = 0; j < vocab; ++j) l[4 * vocab + j] = 1.0f;
        std::vector<unsigned> out(5, 12345);
        launch(dim3{5, 1, 1}, dim3{512, 1, 1}, [&] { argmax(l.data(), out.data(), 5, vocab); });
        expect_true("argmax tie -> lowest (700): " + std::to_string(out[0]), out[0] == 700);
        expect_true("argmax all NaN -> last (1499): " + std::to_string(out[1]), out[1] == 1499);
        expect_true("argmax NaN first, max last (1499): " + std::to_string(out[2]), out[2] == 1499);
        expect_true("argmax all -inf -> 0: " + std::to_string(out[3]), out[3] == 0);
        expect_true("argmax all equal -> 0: " + std::to_string(out[4]), out[4] == 0);
    }
    {  // argmax_partial + argmax_fold (TANDEM_CUDA_ARGMAX=multi) == argmax, id for id: vocabularies
       // below, at and across chunk edges; planted ties across chunks, NaNs, all-NaN, -inf rows.
        int rows_checked = 0, bad = 0;
        unsigned long long st = 0x9e3779b97f4a7c15ull;
        auto next = [&] { st ^= st << 13; st ^= st >> 7; st ^= st << 17; return st; };
        for (int vocab : {1, 255, 4095, 4096, 4097, 9000, 20000}) {
            const int rows = 7, chunks = (vocab + AMX_CHUNK - 1) / AMX_CHUNK;
            std::vector<float> l = rvec((size_t)rows * vocab);
            for (int r = 0; r < rows; ++r) {
                float* row = l.data() + (size_t)r * vocab;
                const int kind = r % 7;
                if (kind == 1) for (int j = 0; j < vocab; ++j) row[j] = NAN;
                if (kind == 2) for (int j = 0; j < vocab; ++j) row[j] = -INFINITY;
                if (kind == 3) for (int j = 0; j < vocab; ++j) row[j] = (float)(next() % 4);  // many ties
                if (kind == 4) for (int j = 0; j < vocab; j += 3) row[j] = NAN;
                if (kind == 5) { row[vocab - 1] = 9.0f; row[next() % vocab] = 9.0f; }  // a tie, one maybe in the last chunk
                if (kind == 6) { row[0] = NAN; row[vocab / 2] = INFINITY; }
            }
            std::vector<unsigned> one(rows, 12345), multi(rows, 54321);
            std::vector<u32> part((size_t)2 * rows * chunks, 0x7fc00007u);  // poisoned
            launch(dim3{(unsigned)rows, 1, 1}, dim3{512, 1, 1}, [&] { argmax(l.data(), one.data(), rows, vocab); });
            launch(dim3{(unsigned)chunks, (unsigned)rows, 1}, dim3{256, 1, 1}, [&] { argmax_partial(l.data(), part.data(), rows, vocab, chunks); });
            launch(dim3{(unsigned)rows, 1, 1}, dim3{256, 1, 1}, [&] { argmax_fold(part.data(), multi.data(), rows, chunks); });
            for (int r = 0; r < rows; ++r) bad += one[r] != multi[r];
            rows_checked += rows;
        }
        expect_true("argmax multi == argmax on " + std::to_string(rows_checked) + " rows (" + std::to_string(bad) + " differ)", bad == 0);
    }
}

// Paged attention: sequences own scattered blocks; every slot holds random K/V.
struct AttnCase {
    int bs, kvh, gqa, D;
    std::vector<std::pair<int, int>> seqs;  // (cached, query)
    int window = 0;                         // sliding window in keys (0: none)
};
// What the f64 reference computes for a case (any of them may be null).
struct AttnWant {
    std::vector<double>* cached = nullptr;  // over the values the cache holds (bf16: rounded)
    std::vector<double>* exact = nullptr;   // over the f32 values kv_write was given
    std::vector<double>* bound = nullptr;   // |cached - exact| bound per element (derived below)
};
// The bf16 cache's bound, per output element (t, h, d), derived for a cache whose every element
// x is stored as x(1 + e), |e| <= u = 2^-8 (bf16 keeps 8 significant bits, 7 stored and the
// implicit one; rounding to nearest is off by at most half an ulp, 2^-8 relative; test_kv_write
// measures it and shows that 2^-9 would be exceeded):
//   score_j moves by |delta_j| <= D_th = scale * max_j sum_i |q_i k_ji| u;
//   p'_j = p_j exp(delta_j) / sum_k p_k exp(delta_k), so |p'_j - p_j| <= p_j (exp(2 D_th) - 1);
//   o'_d - o_d = sum_j (p'_j - p_j) v'_jd + sum_j p_j (v'_jd - v_jd), |v'| <= (1 + u)|v|, so
//   |o'_d - o_d| <= A_d ((exp(2 D_th) - 1)(1 + u) + u),  A_d = sum_j p_j |v_jd|.
// The kernel's own f32 rounding is held apart (against `cached`, NMSE 1e-11); the comparison
// with `exact` allows it 2^-16 A_d on top (measured errors of f32 attention here are ~1e-7 A_d).
static const double KV_BF16_U = 1.0 / 256.0;
static const double KV_F32_SLACK = 1.0 / 65536.0;

static uint16_t rne_bf16_oracle(float f);

// The in-kernel combine (the last partition block folds) unless attn_two_launch: the former
// partial + paged_attention_combine launches, the oracle. Every launch must leave its counters 0.
static bool attn_two_launch = false, attn_counters_ok = true;
// Query heads per block (crates/cuda/src/backend.rs `pa_pack`: the largest p <= PA_MAX_PACK
// dividing the GQA group), unless attn_pack_override > 0.
static int attn_pack_override = 0;
static int pa_pack(int gqa) {
    for (int p = PA_MAX_PACK; p > 1; --p)
        if (gqa % p == 0) return p;
    return 1;
}

static std::vector<float> run_attention(const AttnCase& c, bool bf16, AttnWant want, int only_token = -1) {
    const int H = c.kvh * c.gqa, D = c.D, bs = c.bs;
    int max_blocks = 0, blocks = 0;
    for (auto [ca, qu] : c.seqs) {
        max_blocks = std::max(max_blocks, (ca + qu + bs - 1) / bs + 1);
        blocks += (ca + qu + bs - 1) / bs;
    }
    const int num_blocks = blocks + 3, S = (int)c.seqs.size();
    uint64_t saved = rng_state;
    rng_state = 777;  // same cache and q for every call of the same case
    std::vector<unsigned> order(num_blocks);
    for (int i = 0; i < num_blocks; ++i) order[i] = (unsigned)((i * 7 + 3) % num_blocks);  // scattered, distinct (7 coprime)
    std::vector<unsigned> tables(S * max_blocks, 0), pos, tseq;
    int next = 0;
    for (int s = 0; s < S; ++s) {
        auto [ca, qu] = c.seqs[s];
        for (int j = 0; j < (ca + qu + bs - 1) / bs; ++j) tables[s * max_blocks + j] = order[next++];
        for (int p = ca; p < ca + qu; ++p) {
            pos.push_back(p);
            tseq.push_back(s);
        }
    }
    const size_t slots = (size_t)num_blocks * bs, row = (size_t)c.kvh * D;
    auto kx = rvec(slots * row), vx = rvec(slots * row);  // the f32 values kv_write is given
    auto q = rvec(pos.size() * H * D, 2.0f);
    rng_state = saved;
    // What the cache holds: kx itself (f32) or its bf16 rounding, and those values widened.
    std::vector<bf16_t> kb, vb;
    std::vector<float> kc = kx, vc = vx;
    if (bf16) {
        for (size_t i = 0; i < kx.size(); ++i) {
            kb.push_back(bf16_t{rne_bf16_oracle(kx[i])});
            vb.push_back(bf16_t{rne_bf16_oracle(vx[i])});
            kc[i] = bf16_bits_to_f32(kb[i].bits);
            vc[i] = bf16_bits_to_f32(vb[i].bits);
        }
    }
    if (only_token >= 0) {  // the same token alone in its batch
        q = std::vector<float>(q.begin() + (size_t)only_token * H * D, q.begin() + (size_t)(only_token + 1) * H * D);
        pos = {pos[only_token]};
        tseq = {tseq[only_token]};
    }
    const int T = (int)pos.size();
    int max_ctx = 0;
    for (unsigned p : pos) max_ctx = std::max(max_ctx, (int)p + 1);
    // The host's bound on partitions (crates/cuda/src/backend.rs, pa_max_parts).
    const int parts = max_ctx <= PA_MAX_SPLITS * PA_PART ? std::min(PA_MAX_SPLITS, (max_ctx + PA_MIN_PART - 1) / PA_MIN_PART)
                                                         : (max_ctx + PA_PART - 1) / PA_PART;
    auto out = nans((size_t)T * H * D);
    std::vector<float> po((size_t)T * H * parts * D, NAN), pm((size_t)T * H * parts * 2, NAN);
    std::vector<u32> counters((size_t)T * H, 0);
    u32* cp = attn_two_launch ? nullptr : counters.data();
    const float scale = 1.0f / std::sqrt((float)D);
    const int pack = attn_pack_override > 0 ? attn_pack_override : pa_pack(c.gqa);
    launch(dim3{(unsigned)T, (unsigned)(H / pack), (unsigned)parts}, dim3{(unsigned)(128 * pack), 1, 1}, [&] {
        if (bf16)
            paged_attention_partial_bf16(q.data(), kb.data(), vb.data(), pos.data(), tseq.data(), tables.data(), out.data(), po.data(),
                                         pm.data(), cp, T, H, c.kvh, D, bs, num_blocks, S, max_blocks, parts, scale, c.window);
        else
            paged_attention_partial_f32(q.data(), kc.data(), vc.data(), pos.data(), tseq.data(), tables.data(), out.data(), po.data(),
                                        pm.data(), cp, T, H, c.kvh, D, bs, num_blocks, S, max_blocks, parts, scale, c.window);
    });
    for (u32 v : counters) attn_counters_ok = attn_counters_ok && v == 0;
    if (parts > 1 && attn_two_launch)
        launch(dim3{(unsigned)T, (unsigned)H, 1}, dim3{128, 1, 1}, [&] {
            paged_attention_combine(po.data(), pm.data(), pos.data(), tseq.data(), out.data(), T, H, c.kvh, D, bs, S, max_blocks, parts, c.window);
        });
    // f64 attention of token t, head h over caches (ks, vs); also sum_j p_j |v_jd| and D_th.
    auto reference = [&](const std::vector<float>& ks, const std::vector<float>& vs, int t, int h, double* o, double* abs_pv,
                         double* dmax) {
        const int kh = h / c.gqa;
        const unsigned* tab = &tables[tseq[t] * max_blocks];
        const float* qt = &q[((size_t)t * H + h) * D];
        std::vector<double> sc(pos[t] + 1, 0.0);
        double mx = -INFINITY, dm = 0;
        // The sliding window (HF: key j seen when j > p - window).
        const unsigned lo = c.window > 0 && (int)pos[t] + 1 > c.window ? pos[t] + 1 - c.window : 0;
        for (unsigned j = lo; j <= pos[t]; ++j) {
            const size_t slot = (size_t)tab[j / bs] * bs + j % bs;
            double d = 0, a = 0;
            for (int i = 0; i < D; ++i) {
                d += (double)qt[i] * ks[slot * row + kh * D + i];
                a += std::fabs((double)qt[i] * ks[slot * row + kh * D + i]);
            }
            sc[j] = d * scale;
            dm = std::max(dm, a * scale * KV_BF16_U);
            mx = std::max(mx, sc[j]);
        }
        double den = 0;
        for (unsigned j = lo; j <= pos[t]; ++j) den += (sc[j] = std::exp(sc[j] - mx));
        for (int i = 0; i < D; ++i) o[i] = abs_pv[i] = 0;
        for (unsigned j = lo; j <= pos[t]; ++j) {
            const size_t slot = (size_t)tab[j / bs] * bs + j % bs;
            for (int i = 0; i < D; ++i) {
                o[i] += sc[j] / den * vs[slot * row + kh * D + i];
                abs_pv[i] += sc[j] / den * std::fabs((double)vs[slot * row + kh * D + i]);
            }
        }
        *dmax = dm;
    };
    for (auto* w : {want.cached, want.exact, want.bound})
        if (w) w->assign((size_t)T * H * D, 0.0);
    std::vector<double> o(D), apv(D);
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h) {
            const size_t at = ((size_t)t * H + h) * D;
            double dm;
            if (want.cached) {
                reference(kc, vc, t, h, o.data(), apv.data(), &dm);
                std::copy(o.begin(), o.end(), want.cached->begin() + at);
            }
            if (want.exact || want.bound) {
                reference(kx, vx, t, h, o.data(), apv.data(), &dm);
                for (int i = 0; i < D; ++i) {
                    if (want.exact) (*want.exact)[at + i] = o[i];
                    if (want.bound) (*want.bound)[at + i] = apv[i] * ((std::exp(2 * dm) - 1) * (1 + KV_BF16_U) + KV_BF16_U + KV_F32_SLACK);
                }
            }
        }
    return out;
}

// Every element within its bound; prints the largest error as a fraction of its bound.
static void expect_within(const std::string& what, const std::vector<float>& got, const std::vector<double>& want,
                          const std::vector<double>& bound) {
    ++checks;
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        const double r = std::fabs(got[i] - want[i]) / bound[i];
        if (!(r <= worst)) {  // NaN lands here and stays the worst
            worst = r;
            at = i;
        }
    }
    if (!(worst <= 1.0)) {
        std::printf("FAIL %s: element %zu off by %.3e, bound %.3e (%.2fx)\n", what.c_str(), at, std::fabs(got[at] - want[at]), bound[at], worst);
        ++failures;
    } else {
        std::printf("ok   %s: largest error %.1f%% of its bound\n", what.c_str(), 100 * worst);
    }
}

static std::string case_name(const AttnCase& c) {
    std::string name = "bs=" + std::to_string(c.bs) + " kvh=" + std::to_string(c.kvh) + " gqa=" + std::to_string(c.gqa) +
                       " D=" + std::to_string(c.D) + " seqs=";
    for (auto [a, b] : c.seqs) name += std::to_string(a) + "+" + std::to_string(b) + ",";
    if (c.window > 0) name += " window=" + std::to_string(c.window);
    return name;
}

static void test_attention() {
    std::vector<AttnCase> cases = {
        {16, 2, 1, 64, {{0, 1}, {14, 1}, {16, 1}, {32, 1}, {99, 1}}},  // decode, mid-block ends
        {32, 2, 4, 128, {{30, 1}, {64, 1}, {199, 1}}},                  // GQA 4, head_dim 128
        {16, 1, 3, 64, {{20, 13}, {5, 40}}},                            // prefill chunks over a prefix, GQA 3
        {16, 2, 1, 96, {{3, 2}}},                                       // head_dim not a power of two
        {16, 1, 2, 256, {{40, 2}}},                                     // head_dim > 128 path
        // Sliding windows (before the last two: the batch-invariance checks below take those):
        // contexts shorter and longer than the window, spans of several partitions, window 1.
        {16, 2, 2, 64, {{0, 1}, {20, 1}, {300, 1}, {290, 17}, {700, 1}}, 100},
        {16, 1, 2, 96, {{1100, 1}, {1000, 40}}, 600},
        {16, 1, 1, 64, {{5, 3}, {70, 2}}, 1},
        {16, 2, 4, 64, {{0, 1}, {16, 1}, {300, 1}, {290, 17}}},         // contexts 1, 17, 301, a chunk to 307; GQA 4
        {16, 1, 2, 64, {{600, 1}, {1100, 1}, {500, 30}}},               // split path: contexts > 512
    };
    std::vector<std::vector<float>> f32_out;
    for (auto& c : cases) {
        std::vector<double> want;
        f32_out.push_back(run_attention(c, false, {&want, nullptr, nullptr}));
        expect("paged_attention f32 cache " + case_name(c), f32_out.back(), want, 1e-11);
    }
    // A bf16 cache: the kernel's arithmetic against f64 over the values the cache holds (as
    // tight as f32), and against f64 over the unrounded values within the derived bound.
    for (size_t ci = 0; ci < cases.size(); ++ci) {
        const AttnCase& c = cases[ci];
        std::vector<double> cached, exact, bound;
        auto got = run_attention(c, true, {&cached, &exact, &bound});
        expect("paged_attention bf16 cache vs its values " + case_name(c), got, cached, 1e-11);
        expect_within("paged_attention bf16 cache vs unrounded " + case_name(c), got, exact, bound);
        expect("paged_attention bf16 cache vs unrounded, NMSE under the op suite's limit 5e-5", got, exact, 5e-5);
        expect_true("paged_attention bf16 cache output != f32 cache output (the rounding is real) " + case_name(c),
                    std::memcmp(got.data(), f32_out[ci].data(), sizeof(float) * got.size()) != 0);
    }
    // The in-kernel combine against the two-launch combine, bit for bit, for both caches, on
    // every case (the split ones combine several partitions, incl. a 1-partition token).
    for (bool bf16 : {false, true}) {
        bool same = true;
        for (auto& c : cases) {
            auto fused = run_attention(c, bf16, {});
            attn_two_launch = true;
            auto two = run_attention(c, bf16, {});
            attn_two_launch = false;
            same = same && std::memcmp(fused.data(), two.data(), sizeof(float) * fused.size()) == 0;
        }
        expect_true(std::string("paged_attention ") + (bf16 ? "bf16" : "f32") +
                        " cache: in-kernel combine (last partition block) bitwise equal to partial + combine launches, every case",
                    same);
    }
    // Heads packed per block (pack 2, 3, 4 where the group allows) against one head per block,
    // bit for bit, for both caches and both combines, on every case.
    for (bool bf16 : {false, true}) {
        bool same = true;
        int packed = 0;
        for (auto& c : cases) {
            if (pa_pack(c.gqa) == 1) continue;
            for (bool two : {false, true}) {
                attn_two_launch = two;
                auto got = run_attention(c, bf16, {});
                attn_pack_override = 1;
                auto one = run_attention(c, bf16, {});
                attn_pack_override = 0;
                same = same && std::memcmp(got.data(), one.data(), sizeof(float) * got.size()) == 0;
                ++packed;
            }
            attn_two_launch = false;
        }
        expect_true(std::string("paged_attention ") + (bf16 ? "bf16" : "f32") + " cache: GQA heads packed per block bitwise equal to one head per block (" +
                        std::to_string(packed) + " runs)",
                    same && packed >= 8);
    }
    expect_true("paged_attention: every launch left its arrival counters at 0", attn_counters_ok);
    // Batch invariance: each token alone gives bit-identical output, for both caches: the split
    // case, and the case of contexts 1, 17, 301 (one partition up to 64 keys, several above).
    for (bool bf16 : {false, true}) {
        for (size_t ci : {cases.size() - 5, cases.size() - 4, cases.size() - 2, cases.size() - 1}) {
            const AttnCase& c = cases[ci];
            auto batch = run_attention(c, bf16, {});
            const int H = c.kvh * c.gqa, D = c.D;
            int T = 0;
            for (auto [a, b] : c.seqs) T += b;
            for (int t : {0, 1, 2, T - 1}) {
                auto alone = run_attention(c, bf16, {}, t);
                bool same = std::memcmp(alone.data(), batch.data() + (size_t)t * H * D, sizeof(float) * H * D) == 0;
                expect_true(std::string("paged_attention ") + (bf16 ? "bf16" : "f32") + " cache token " + std::to_string(t) + " of " +
                                case_name(c) + " alone == in batch (bitwise)",
                            same);
            }
        }
    }
}

// Round to nearest even, found another way than common.cuh's integer trick: the two bf16
// neighbours of f (truncation and the next one away from zero), the nearer in f64, the even one
// on a tie; the neighbour past the largest finite bf16 is inf, worth 2^128 in the comparison
// (where IEEE rounding puts the overflow threshold). NaN: quiet, sign kept.
static uint16_t rne_bf16_oracle(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (std::isnan(f)) return (uint16_t)((u >> 16) | 0x0040u);
    if (std::isinf(f)) return (uint16_t)(u >> 16);
    const uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);  // same sign, one ulp further out
    auto value = [](uint16_t b) {
        if ((b & 0x7fffu) == 0x7f80u) return std::ldexp(b & 0x8000u ? -1.0 : 1.0, 128);
        return (double)bf16_bits_to_f32(b);
    };
    const double dl = std::fabs((double)f - value(lo)), dh = std::fabs((double)f - value(hi));
    if (dl < dh) return lo;
    if (dh < dl) return hi;
    return (lo & 1u) ? hi : lo;
}

static void test_kv_write() {
    const int nb = 5, bs = 16, kvh = 2, D = 64, T = 7;
    const size_t row = kvh * D, slots = (size_t)nb * bs;
    std::vector<unsigned> sl = {0, 17, 79, 33, 34, 5, 1000};  // the last one is out of range: skipped
    {
        auto kc = rvec(slots * row), vc = rvec(slots * row);
        auto k0 = kc, v0 = vc;
        auto k = rvec(T * row), v = rvec(T * row);
        launch(dim3{T, 1, 1}, dim3{128, 1, 1}, [&] { kv_write_f32(k.data(), v.data(), kc.data(), vc.data(), sl.data(), T, (int)row, slots); });
        std::vector<double> wk(k0.begin(), k0.end()), wv(v0.begin(), v0.end());
        for (int t = 0; t < T; ++t)
            if (sl[t] < slots)
                for (size_t i = 0; i < row; ++i) {
                    wk[sl[t] * row + i] = k[t * row + i];
                    wv[sl[t] * row + i] = v[t * row + i];
                }
        expect("kv_write f32 k (bad slot skipped, others untouched)", kc, wk, 0.0);
        expect("kv_write f32 v", vc, wv, 0.0);
    }
    // bf16: values over 2^-140..2^100 (normals, subnormals) and the edge cases of rounding.
    auto k = rvec(T * row), v = rvec(T * row);
    for (size_t i = 0; i < k.size(); ++i) {
        k[i] = std::ldexp(k[i], (int)(i * 37 % 241) - 140);
        v[i] = std::ldexp(v[i], (int)(i * 53 % 31) - 15);
    }
    const uint32_t edge[] = {
        0x3f808000u,  // a tie between 0x3f80 and 0x3f81: to even (0x3f80)
        0x3f818000u,  // a tie between 0x3f81 and 0x3f82: to even (0x3f82)
        0x3f808001u,  // just above the tie: up
        0xbf818000u,  // negative tie: to even, magnitude up
        0x7f7fffffu,  // the largest f32: past the largest bf16 + half an ulp, so inf
        0x7f7f7fffu,  // just under that threshold: the largest finite bf16
        0x00000001u,  // the smallest subnormal: to +0
        0x00018000u,  // a subnormal tie
        0x80000000u,  // -0
        0x7f800000u, 0xff800000u,  // inf, -inf
        0x7f800001u,  // a signalling NaN, whose truncation would read as inf: must stay NaN
        0xffc00000u,  // a negative quiet NaN
    };
    for (size_t i = 0; i < sizeof(edge) / sizeof(edge[0]); ++i) {
        std::memcpy(&k[i], &edge[i], 4);
        std::memcpy(&v[row + i], &edge[i], 4);
    }
    std::vector<bf16_t> kc(slots * row, bf16_t{0x7fffu}), vc(slots * row, bf16_t{0x7fffu});  // NaN: never a result
    launch(dim3{T, 1, 1}, dim3{128, 1, 1}, [&] { kv_write_bf16(k.data(), v.data(), kc.data(), vc.data(), sl.data(), T, (int)row, slots); });
    size_t wrong = 0, untouched_wrong = 0, checked = 0;
    double worst_rel = 0;
    std::vector<bool> written(slots, false);
    for (int t = 0; t < T; ++t) {
        if (sl[t] >= slots) continue;
        written[sl[t]] = true;
        for (size_t i = 0; i < row; ++i)
            for (auto [x, c] : {std::pair{k[t * row + i], kc[sl[t] * row + i]}, std::pair{v[t * row + i], vc[sl[t] * row + i]}}) {
                wrong += c.bits != rne_bf16_oracle(x);
                const float back = bf16_bits_to_f32(c.bits);
                // Relative error of a normal value within range (not subnormal, not overflowing).
                if (std::isfinite(back) && std::fabs(x) >= std::ldexp(1.0f, -126)) {
                    worst_rel = std::max(worst_rel, std::fabs(((double)back - x) / x));
                    ++checked;
                }
            }
    }
    for (size_t s = 0; s < slots; ++s)
        if (!written[s])
            for (size_t i = 0; i < row; ++i) untouched_wrong += kc[s * row + i].bits != 0x7fffu || vc[s * row + i].bits != 0x7fffu;
    expect_true("kv_write bf16: every stored element is round-to-nearest-even of its f32 value (" + std::to_string(wrong) + " wrong)",
                wrong == 0);
    expect_true("kv_write bf16: relative error <= 2^-8 over " + std::to_string(checked) + " normal values (worst " +
                    std::to_string(worst_rel * 256) + " x 2^-8: above 2^-9, so 2^-8 is the bound)",
                checked > 1000 && worst_rel <= KV_BF16_U && worst_rel > KV_BF16_U / 2);
    expect_true("kv_write bf16: slots not written (and the bad slot) untouched (" + std::to_string(untouched_wrong) + " changed)",
                untouched_wrong == 0);
    // The oracle itself on the edge cases, by hand.
    const uint16_t edge_want[] = {0x3f80, 0x3f82, 0x3f81, 0xbf82, 0x7f80, 0x7f7f, 0x0000, 0x0002, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0};
    bool oracle_ok = true;
    for (size_t i = 0; i < sizeof(edge) / sizeof(edge[0]); ++i) {
        float f;
        std::memcpy(&f, &edge[i], 4);
        oracle_ok &= rne_bf16_oracle(f) == edge_want[i] && kc[i].bits == edge_want[i];
    }
    expect_true("kv_write bf16: ties to even, overflow to inf, subnormals, signed zero, inf and NaN as written by hand", oracle_ok);
}

// sampling.cu: Philox against Random123's published answers; greedy and degenerate rows give
// argmax's ids; a sampled row is a function of its spec alone (the same row alone and among
// others, the same id). Bitwise agreement with the Rust host sampler on random rows is
// crates/cuda/tests/sampling_emu.rs (through sample_io.cpp).
static void test_sampling() {
    struct Kat { u32 ctr[4], key[2], want[4]; };
    const Kat kats[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
        {{~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}, {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
        {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}, {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
    };
    for (const Kat& k : kats) {
        u32 c[4] = {k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]};
        philox4x32_10(c[0], c[1], c[2], c[3], k.key[0], k.key[1]);
        expect_true("philox4x32-10 known answer " + std::to_string(k.want[0]), std::memcmp(c, k.want, 16) == 0);
    }
    const int vocab = 700, rows = 4;
    auto l = rvec((size_t)rows * vocab, 4.0f);
    for (int j = 0; j < vocab; ++j) l[2 * vocab + j] = NAN;  // row 2: all NaN
    l[3 * vocab + 5] = INFINITY;                              // row 3: +inf wins
    auto spec = [](float inv_t, u32 top_k, float top_p, float min_p, u32 tok) {
        float f[4] = {inv_t, 0, top_p, min_p};
        u32 w[8];
        std::memcpy(w, f, 16);
        w[1] = top_k;
        w[4] = 77; w[5] = 1; w[6] = 0; w[7] = tok;
        return std::vector<u32>(w, w + 8);
    };
    std::vector<u32> specs;
    for (auto s : {spec(0.0f, 0, 1.0f, 0.0f, 0), spec(1.0f, 40, 0.9f, 0.05f, 3), spec(1.0f, 0, 1.0f, 0.0f, 4), spec(2.0f, 0, 0.5f, 0.0f, 5)})
        specs.insert(specs.end(), s.begin(), s.end());
    std::vector<u32> ids(rows, 0xffffffffu), greedy(rows, 0xffffffffu);
    launch(dim3{rows, 1, 1}, dim3{SMP_THREADS, 1, 1}, [&] { sample(l.data(), specs.data(), ids.data(), rows, vocab); });
    launch(dim3{rows, 1, 1}, dim3{512, 1, 1}, [&] { argmax(l.data(), greedy.data(), rows, vocab); });
    expect_true("sample greedy row == argmax", ids[0] == greedy[0]);
    expect_true("sample all-NaN row == argmax (" + std::to_string(ids[2]) + ")", ids[2] == greedy[2]);
    expect_true("sample +inf row == its index (" + std::to_string(ids[3]) + ")", ids[3] == 5);
    expect_true("sample row 1 in range", ids[1] < (u32)vocab && l[vocab + ids[1]] == l[vocab + ids[1]]);
    std::vector<u32> rids(rows, 0xffffffffu);
    launch(dim3{rows, 1, 1}, dim3{SMP_THREADS, 1, 1}, [&] { sample_radix(l.data(), specs.data(), rids.data(), rows, vocab); });
    expect_true("sample_radix == sample on the same rows", rids == ids);
    // TANDEM_CUDA_SAMPLER=multi: the twelve launches in the launcher's order, on a workspace of
    // garbage; and row 1 alone (its workspace row 0) gives the same id.
    auto multi = [&](const float* lg, const u32* sp, u32* out, int n) {
        std::vector<u32> ws((size_t)n * SMC_WORDS, 0xa5a5a5a5u);
        const dim3 grid{SMC_CTAS, (unsigned)n, 1}, block{SMP_THREADS, 1, 1};
        launch(grid, block, [&] { sample_mc_max(lg, ws.data(), n, vocab, sp, (const int*)sp, 0); });
        for (int p = 0; p < 4; ++p) launch(grid, block, [&] { sample_mc_topk(lg, sp, ws.data(), n, vocab, sp, (const int*)sp, 0, p); });
        for (int q = 0; q < SMC_PASSES; ++q) launch(grid, block, [&] { sample_mc_topp(lg, sp, ws.data(), n, vocab, sp, (const int*)sp, 0, q); });
        launch(dim3{(unsigned)n, 1, 1}, block, [&] { sample_mc_draw(lg, sp, ws.data(), out, n, vocab, sp, (const int*)sp, 0); });
    };
    std::vector<u32> mids(rows, 0xffffffffu), mone(1, 0xffffffffu);
    multi(l.data(), specs.data(), mids.data(), rows);
    expect_true("sample_mc_* == sample on the same rows", mids == ids);
    multi(l.data() + vocab, specs.data() + 8, mone.data(), 1);
    expect_true("sample_mc_* row alone == in batch", mone[0] == ids[1]);
    // Row 1 alone: the same id as among the others.
    std::vector<u32> one(1, 0xffffffffu);
    launch(dim3{1, 1, 1}, dim3{SMP_THREADS, 1, 1}, [&] { sample(l.data() + vocab, specs.data() + 8, one.data(), 1, vocab); });
    expect_true("sample row alone == in batch", one[0] == ids[1]);
}


// The fused small ops: add_rms_norm == add then rms_norm, rope_kv_write == rope then kv_write,
// bit for bit, and each against f64.
static void test_fused_small_ops() {
    for (auto [rows, dim] : std::vector<std::pair<int, int>>{{5, 300}, {3, 2049}}) {
        auto h = rvec((size_t)rows * dim, 3.0f), x = rvec((size_t)rows * dim, 2.0f);
        W w = weight(1, rvec(dim));
        auto h1 = h, h2 = h, o1 = nans((size_t)rows * dim), o2 = nans((size_t)rows * dim);
        launch(dim3{(unsigned)rows, 1, 1}, dim3{256, 1, 1}, [&] { add_rms_norm_bf16(h1.data(), x.data(), (const bf16_t*)w.ptr(), o1.data(), 1, rows, dim, 1e-5f); });
        const size_t len = (size_t)rows * dim;
        launch(dim3{(unsigned)((len + 255) / 256), 1, 1}, dim3{256, 1, 1}, [&] { add(h2.data(), x.data(), len); });
        launch(dim3{(unsigned)rows, 1, 1}, dim3{256, 1, 1}, [&] { rms_norm_bf16(h2.data(), (const bf16_t*)w.ptr(), o2.data(), 1, rows, dim, 1e-5f); });
        std::vector<double> want(len), want_h(len);
        for (int r = 0; r < rows; ++r) {
            double ss = 0;
            for (int i = 0; i < dim; ++i) {
                want_h[(size_t)r * dim + i] = (double)h[(size_t)r * dim + i] + x[(size_t)r * dim + i];
                ss += want_h[(size_t)r * dim + i] * want_h[(size_t)r * dim + i];
            }
            const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
            for (int i = 0; i < dim; ++i) want[(size_t)r * dim + i] = want_h[(size_t)r * dim + i] * inv * w.val[i];
        }
        const std::string name = "add_rms_norm_bf16 rows=" + std::to_string(rows) + " dim=" + std::to_string(dim);
        expect(name + " out", o1, want, 1e-12);
        expect(name + " acc", h1, want_h, 1e-14);
        expect_true(name + ": out and acc bitwise equal to add then rms_norm", std::memcmp(o1.data(), o2.data(), 4 * len) == 0 &&
                                                                                    std::memcmp(h1.data(), h2.data(), 4 * len) == 0);
    }
    // rope_kv_write: GQA, a bad slot (q still rotated, nothing written), both caches.
    const int T = 4, qh = 6, kh = 2, D = 64, nb = 3, bs = 16;
    const size_t row = (size_t)kh * D, slots = (size_t)nb * bs;
    std::vector<unsigned> pos = {0, 17, 3000, 5}, sl = {3, 40, 47, 1000};
    std::vector<float> inv(D / 2);
    for (int i = 0; i < D / 2; ++i) inv[i] = (float)std::pow(10000.0, -2.0 * i / D);
    const auto q0 = rvec((size_t)T * qh * D), k0 = rvec((size_t)T * row), v0 = rvec((size_t)T * row);
    for (bool bf16 : {false, true}) {
        auto q1 = q0, q2 = q0, k1 = k0, k2 = k0;
        const std::string name = std::string("rope_kv_write_") + (bf16 ? "bf16" : "f32");
        bool same_cache;
        if (bf16) {
            std::vector<bf16_t> kc1(slots * row, bf16_t{0x7fffu}), vc1 = kc1, kc2 = kc1, vc2 = kc1;
            launch(dim3{T, 1, 1}, dim3{128, 1, 1}, [&] { rope_kv_write_bf16(q1.data(), k1.data(), v0.data(), kc1.data(), vc1.data(), pos.data(), inv.data(), sl.data(), T, qh, kh, D, slots); });
            launch(dim3{T, 1, 1}, dim3{128, 1, 1}, [&] { rope(q2.data(), k2.data(), pos.data(), inv.data(), T, qh, kh, D); });
            launch(dim3{T, 1, 1}, dim3{128, 1, 1}, [&] { kv_write_bf16(k2.data(), v0.data(), kc2.data(), vc2.data(), sl.data(), T, (int)row, slots); });
            same_cache = std::memcmp(kc1.data(), kc2.data(), 2 * kc1.size()) == 0 && std::memcmp(vc1.data(), vc2.data(), 2 * vc1.size()) == 0;
        } else {
            auto kc1 = nans(slots * row), vc1 = nans(slots * row), kc2 = nans(slots * row), vc2 = nans(slots * row);
            launch(dim3{T, 1, 1}, dim3{128, 1, 1}, [&] { rope_kv_write_f32(q1.data(), k1.data(), v0.data(), kc1.data(), vc1.data(), pos.data(), inv.data(), sl.data(), T, qh, kh, D, slots); });
            launch(dim3{T, 1, 1}, dim3{128, 1, 1}, [&] { rope(q2.data(), k2.data(), pos.data(), inv.data(), T, qh, kh, D); });
            launch(dim3{T, 1, 1}, dim3{128, 1, 1}, [&] { kv_write_f32(k2.data(), v0.data(), kc2.data(), vc2.data(), sl.data(), T, (int)row, slots); });
            // NaN == NaN bitwise here: the untouched slots keep their poison in both.
            same_cache = std::memcmp(kc1.data(), kc2.data(), 4 * kc1.size()) == 0 && std::memcmp(vc1.data(), vc2.data(), 4 * vc1.size()) == 0;
            // f64: token 1's k in its slot, rotated.
            std::vector<float> got(kc1.begin() + (size_t)sl[1] * row, kc1.begin() + (size_t)(sl[1] + 1) * row);
            std::vector<double> want(row);
            for (int h = 0; h < kh; ++h)
                for (int i = 0; i < D / 2; ++i) {
                    const double a = (double)(float)(pos[1] * inv[i]);
                    const size_t o = (size_t)row + h * D;
                    want[h * D + i] = k0[o + i] * std::cos(a) - k0[o + i + D / 2] * std::sin(a);
                    want[h * D + i + D / 2] = k0[o + i + D / 2] * std::cos(a) + k0[o + i] * std::sin(a);
                }
            expect(name + " k in the cache vs f64", got, want, 1e-12);
        }
        expect_true(name + ": q and both caches bitwise equal to rope then kv_write (bad slot 1000 skipped)",
                    same_cache && std::memcmp(q1.data(), q2.data(), 4 * q1.size()) == 0);
    }
}

// moe_route against softmax / top-k / renormalise in double (ties: the lower index), one row
// alone giving the bits it gives among others; moe_accumulate, first and adding.
static void test_moe() {
    for (auto [rows, E, K, renorm] : std::vector<std::tuple<int, int, int, int>>{{37, 8, 2, 1}, {5, 128, 8, 0}, {3, 4, 4, 1}}) {
        auto l = rvec((size_t)rows * E, 3.0f);
        for (int r = 0; r < rows; r += 2) l[(size_t)r * E + E - 1] = l[(size_t)r * E + 1] = 10.0f;  // a tie at the top
        auto w = nans((size_t)rows * E);
        launch(dim3{(unsigned)((rows + 63) / 64), 1, 1}, dim3{64, 1, 1}, [&] { moe_route(l.data(), w.data(), rows, E, K, renorm); });
        std::vector<double> want((size_t)rows * E, 0.0);
        for (int r = 0; r < rows; ++r) {
            const float* x = &l[(size_t)r * E];
            double m = x[0], s = 0;
            for (int i = 1; i < E; ++i) m = std::max(m, (double)x[i]);
            for (int i = 0; i < E; ++i) s += std::exp(x[i] - m);
            std::vector<int> idx(E);
            for (int i = 0; i < E; ++i) idx[i] = i;
            std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return x[a] > x[b]; });
            double sum = 0;
            for (int j = 0; j < K; ++j) sum += std::exp(x[idx[j]] - m) / s;
            for (int j = 0; j < K; ++j) want[(size_t)r * E + idx[j]] = std::exp(x[idx[j]] - m) / s / (renorm ? sum : 1.0);
        }
        expect("moe_route E=" + std::to_string(E) + " k=" + std::to_string(K), w, want, 1e-12);
        bool tie_low = true;
        for (int r = 0; r < rows; r += 2) tie_low &= w[(size_t)r * E + 1] > 0.0f && (K > 1 || w[(size_t)r * E + E - 1] == 0.0f);
        expect_true("moe_route ties: the lower index first", tie_low);
        auto one = nans(E);
        const int r = rows - 1;
        launch(dim3{1, 1, 1}, dim3{64, 1, 1}, [&] { moe_route(&l[(size_t)r * E], one.data(), 1, E, K, renorm); });
        expect_true("moe_route: a row alone gives its bits in the batch", std::memcmp(one.data(), &w[(size_t)r * E], E * sizeof(float)) == 0);
    }
    {
        const int rows = 7, dim = 100, E = 4;
        auto acc = rvec((size_t)rows * dim), y = rvec((size_t)rows * dim), wt = rvec((size_t)rows * E);
        std::vector<double> want_first((size_t)rows * dim), want_add((size_t)rows * dim);
        for (int r = 0; r < rows; ++r)
            for (int i = 0; i < dim; ++i) {
                const size_t j = (size_t)r * dim + i;
                want_first[j] = (double)(wt[(size_t)r * E + 2] * y[j]);
                want_add[j] = (double)acc[j] + (double)(wt[(size_t)r * E + 3] * y[j]);
            }
        auto o = nans((size_t)rows * dim);
        const unsigned long long n = (unsigned long long)rows * dim;
        launch(dim3{(unsigned)((n + 255) / 256), 1, 1}, dim3{256, 1, 1}, [&] { moe_accumulate(o.data(), y.data(), wt.data(), n, dim, 2, E, 1); });
        expect("moe_accumulate first", o, want_first, 0.0);
        launch(dim3{(unsigned)((n + 255) / 256), 1, 1}, dim3{256, 1, 1}, [&] { moe_accumulate(acc.data(), y.data(), wt.data(), n, dim, 3, E, 0); });
        expect("moe_accumulate add", acc, want_add, 1e-14);
    }
}

int main() {
    primtest::run_all(expect_true);
    test_moe();
    moetest::run_all(expect_true);
    loratest::run_all(expect_true);
    test_small_ops();
    test_kv_write();
    kvfp8test::run_all(expect_true);
    test_attention();
    pattest::run_all(pattest::tc(), expect_true);
    pattest::run_all(pattest::tc_deep(), expect_true);
    pattest::run_all(pattest::tc_shared(), expect_true);
    pattcfp8test::run_all(expect_true);
    test_matmul();
    fusedtest::run_all(expect_true);
    act16test::run_all(expect_true);
    // The GEMM variants the GPU check times (matmul.rs GemmVariants): the same checks, with
    // m > 128 on m128, m128_n128 or m128_w64, 17..128 rows on m64, up to 16 on m16_s8, m16_gemv4,
    // m16_gemv8 or m16_x1 (the defaults ran
    // above: m128_occ2, m64_occ4, m16). Their bitwise-across-m checks compare the variants'
    // rows with the other kernels': the same bits.
    for (auto [large, mid, small, tag] :
         std::vector<std::tuple<int, int, int, const char*>>{{0, 0, 1, "[m128, m64, m16_s8] "}, {1, 0, 0, "[m128_n128, m64] "}, {2, 1, 2, "[m16_gemv4] "}, {2, 1, 3, "[m16_gemv8] "}, {2, 1, 4, "[m16_x1] "}, {3, 1, 0, "[m128_w64] "}}) {
        mmtest::large_variant = large;
        mmtest::mid_variant = mid;
        mmtest::small_variant = small;
        const auto tagged = [&](const std::string& what, bool c) { expect_true(tag + what, c); };
        mmtest::run_all(tagged);
        fusedtest::run_all(tagged);
        act16test::run_all(tagged);
        // m128_w64 runs matmul_tc_impl's loop where k % 8 != 0 (the others' m > 128 cases have k % 8 == 0).
        if (large == 3) mmtest::against_f64(tagged, mmtest::problem(1, 150, 72, 999, true));
    }
    mmtest::large_variant = 2;
    mmtest::mid_variant = 1;
    mmtest::small_variant = 0;
    test_fused_small_ops();
    test_sampling();
    quanttest::run_all(expect_true);
    quantmmatest::run_all(expect_true);
    w8a8test::run_all(expect_true);
    std::printf("%d checks, %d failed\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
