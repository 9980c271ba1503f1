// moe_test.h — the routed mixture of experts of kernels/moe.cu (moe_select .. moe_combine, the
// grouped GEMMs) on the emulator, launched as crates/cuda/src/moe.rs launches them (`routed`
// mirrors its `moe_routed`, `rows_max` its `routed_rows`), against
//   - the every-expert path (per expert: the plain GEMMs as matmul_test.h's `gemm` launches
//     them, then moe_accumulate over every expert): bitwise (the data has no exact zeros);
//   - f64 over the unrounded inputs (NMSE);
//   - itself across batch compositions: token t alone, among others, in another order: bitwise.
// Shapes: tokens not a multiple of the row tile, experts with no token, all tokens in one expert,
// every expert routed (top_k = experts), hidden not a multiple of 8 (x's pitch padded).
#pragma once
#include <cstring>
#include <string>
#include <vector>

namespace moetest {
using Check = std::function<void(const std::string&, bool)>;

struct Experts {
    int dt, E, top_k, d, inter;              // dt: 0 f32 weights, 1 bf16, 2 f16
    std::vector<std::vector<float>> g32, u32w, d32;      // f32 weights [inter, d], [inter, d], [d, inter]
    std::vector<std::vector<uint16_t>> g16, u16w, fused, d16;  // 16-bit: gate, up, fused gate/up, down
};

inline float wq(int dt, float v) { return dt == 0 ? v : mmtest::xround(dt, v); }  // a stored weight's value
inline uint16_t bits(int dt, float v) { return dt == 1 ? f32_to_bf16_bits(v) : f32_to_f16_bits(v); }

inline Experts make(int dt, int E, int top_k, int d, int inter) {
    Experts x{dt, E, top_k, d, inter, {}, {}, {}, {}, {}, {}, {}};
    const float sg = 1.0f / std::sqrt((float)d), sd = 1.0f / std::sqrt((float)inter);
    for (int e = 0; e < E; ++e) {
        std::vector<float> g((size_t)inter * d), u((size_t)inter * d), dn((size_t)d * inter);
        for (auto& v : g) v = wq(dt, mmtest::rnd() * sg);
        for (auto& v : u) v = wq(dt, mmtest::rnd() * sg);
        for (auto& v : dn) v = wq(dt, mmtest::rnd() * sd);
        x.g32.push_back(g);
        x.u32w.push_back(u);
        x.d32.push_back(dn);
        if (dt) {
            std::vector<uint16_t> gb, ub, db;
            for (float v : g) gb.push_back(bits(dt, v));
            for (float v : u) ub.push_back(bits(dt, v));
            for (float v : dn) db.push_back(bits(dt, v));
            x.fused.push_back(fusedtest::interleave_gate_up(gb, ub, inter, d));
            x.g16.push_back(gb);
            x.u16w.push_back(ub);
            x.d16.push_back(db);
        }
    }
    return x;
}

inline void tiled_f32(const float* x, const float* w, float* out, int m, int n, int k) {
    launch(dim3{(unsigned)((n + 63) / 64), (unsigned)((m + 63) / 64), 1}, dim3{256, 1, 1}, [&] { matmul_tiled_f32(x, w, w, 0, out, m, n, k); });
}

// The every-expert path (layers::Moe::forward with TANDEM_CUDA_MOE=dense): out [T, d].
inline std::vector<float> dense(const Experts& m, const float* x, const float* weights, int T) {
    const int d = m.d, inter = m.inter;
    std::vector<float> out((size_t)T * d, NAN), act((size_t)T * inter), y((size_t)T * d);
    for (int e = 0; e < m.E; ++e) {
        std::fill(act.begin(), act.end(), NAN);
        std::fill(y.begin(), y.end(), NAN);
        if (m.dt == 0) {
            std::vector<float> g((size_t)T * inter), u((size_t)T * inter);
            tiled_f32(x, m.g32[e].data(), g.data(), T, inter, d);
            tiled_f32(x, m.u32w[e].data(), u.data(), T, inter, d);
            const size_t len = (size_t)T * inter;
            launch(dim3{(unsigned)((len + 255) / 256), 1, 1}, dim3{256, 1, 1}, [&] { silu_mul(g.data(), u.data(), act.data(), 1, len); });
            tiled_f32(act.data(), m.d32[e].data(), y.data(), T, d, inter);
        } else {
            const int nf = (inter + 31) / 32 * 64;
            mmtest::gemm(m.dt, x, m.fused[e].data(), nullptr, T, nf, d, mmtest::k_slices(nf, d), Epilogue{act.data(), nullptr, nullptr, EPI_SILU, inter, 0}, false);
            mmtest::gemm(m.dt, act.data(), m.d16[e].data(), nullptr, T, d, inter, mmtest::k_slices(d, inter), Epilogue{y.data(), nullptr, nullptr, EPI_PLAIN, 0, 0}, false);
        }
        const unsigned long long n = (unsigned long long)T * d;
        launch(dim3{(unsigned)((n + 255) / 256), 1, 1}, dim3{256, 1, 1}, [&] { moe_accumulate(out.data(), y.data(), weights, n, d, e, m.E, e == 0); });
    }
    return out;
}

// moe.rs `routed_rows`: the padded layout's rows for T tokens (a multiple of bm).
inline int rows_max(int T, int E, int top_k, int bm) {
    const int routed = T * top_k, used = std::min(E, routed);
    return (routed + used * (bm - 1) + bm - 1) / bm * bm;
}

inline bool expert_tiles_ok = true;  // every run's tile map was consistent (checked below)

// The routed path: out [T, d]. bm: the row tile (16 or 64 for 16-bit weights; 64 for f32).
inline std::vector<float> routed(const Experts& m, const float* x, const float* weights, int T, int bm) {
    const int E = m.E, K = m.top_k, d = m.d, inter = m.inter;
    const int chunks = (T + MOE_CHUNK - 1) / MOE_CHUNK, rows = rows_max(T, E, K, bm), tiles = rows / bm;
    std::vector<int> rank((size_t)T * E, -7), sel((size_t)T * K, -7), cnt((size_t)chunks * E, -7), base((size_t)chunks * E, -7), seg(2 * E, -7),
        tile_expert(tiles, -7), slot((size_t)T * K, -7);
    launch(dim3{(unsigned)((T + 63) / 64), 1, 1}, dim3{64, 1, 1}, [&] { moe_select(weights, rank.data(), sel.data(), T, E, K); });
    launch(dim3{(unsigned)chunks, 1, 1}, dim3{128, 1, 1}, [&] { moe_count(rank.data(), cnt.data(), T, E); });
    launch(dim3{1, 1, 1}, dim3{128, 1, 1}, [&] { moe_offsets(cnt.data(), base.data(), seg.data(), tile_expert.data(), chunks, E, bm, tiles); });
    launch(dim3{(unsigned)chunks, 1, 1}, dim3{128, 1, 1}, [&] { moe_scatter(rank.data(), base.data(), slot.data(), T, E, K); });
    // The tile map: expert e's tiles cover its segment exactly, in expert order.
    for (int e = 0, t = 0; e < E; ++e) {
        const int n = seg[E + e] - seg[e];
        expert_tiles_ok = expert_tiles_ok && seg[e] % bm == 0 && n >= 0 && seg[e] == t * bm;
        for (int i = 0; i < (n + bm - 1) / bm; ++i, ++t) expert_tiles_ok = expert_tiles_ok && t < tiles && tile_expert[t] == e;
        if (e == E - 1)
            for (; t < tiles; ++t) expert_tiles_ok = expert_tiles_ok && tile_expert[t] == -1;
    }
    std::vector<float> out((size_t)T * d, NAN), y((size_t)rows * d, NAN);
    std::vector<unsigned long long> wg(E), wu(E), wd(E);
    if (m.dt == 0) {
        std::vector<float> xg((size_t)rows * d, NAN), g((size_t)rows * inter, NAN), u((size_t)rows * inter, NAN), act((size_t)rows * inter, NAN);
        launch(dim3{(unsigned)T, 1, 1}, dim3{256, 1, 1}, [&] { moe_gather(x, 0, xg.data(), sel.data(), slot.data(), d, d, K, 0); });
        for (int e = 0; e < E; ++e) {
            wg[e] = (unsigned long long)m.g32[e].data();
            wu[e] = (unsigned long long)m.u32w[e].data();
            wd[e] = (unsigned long long)m.d32[e].data();
        }
        const dim3 gi{(unsigned)((inter + 63) / 64), (unsigned)tiles, 1}, gd{(unsigned)((d + 63) / 64), (unsigned)tiles, 1};
        launch(gi, dim3{256, 1, 1}, [&] { moe_gemm_f32(xg.data(), wg.data(), tile_expert.data(), seg.data() + E, g.data(), inter, d); });
        launch(gi, dim3{256, 1, 1}, [&] { moe_gemm_f32(xg.data(), wu.data(), tile_expert.data(), seg.data() + E, u.data(), inter, d); });
        const size_t len = (size_t)rows * inter;
        launch(dim3{(unsigned)((len + 255) / 256), 1, 1}, dim3{256, 1, 1}, [&] { silu_mul(g.data(), u.data(), act.data(), 1, len); });
        launch(gd, dim3{256, 1, 1}, [&] { moe_gemm_f32(act.data(), wd.data(), tile_expert.data(), seg.data() + E, y.data(), d, inter); });
    } else {
        const int kp = (d + 7) / 8 * 8, nf = (inter + 31) / 32 * 64;
        std::vector<uint16_t> xg((size_t)rows * kp, 0xffff), act((size_t)rows * inter, 0xffff);
        launch(dim3{(unsigned)T, 1, 1}, dim3{256, 1, 1}, [&] { moe_gather(x, 0, xg.data(), sel.data(), slot.data(), d, kp, K, m.dt); });
        for (int e = 0; e < E; ++e) {
            wg[e] = (unsigned long long)m.fused[e].data();
            wd[e] = (unsigned long long)m.d16[e].data();
        }
        const mmtest::Slices su = mmtest::k_slices(nf, d), sd = mmtest::k_slices(d, inter);
        const dim3 gi{(unsigned)((nf + 63) / 64), (unsigned)tiles, 1}, gd{(unsigned)((d + 63) / 64), (unsigned)tiles, 1};
        float* ap = reinterpret_cast<float*>(act.data());
#define MOE_CALL(DT, NAME, SHAPE)                                                                                                              \
    do {                                                                                                                                       \
        launch(gi, dim3{SHAPE::THREADS, 1, 1}, [&] { moe_gemm_##DT##_##NAME(xg.data(), wg.data(), tile_expert.data(), seg.data() + E, ap, EPI_SILU, inter, 1, nf, d, kp, su.len, su.count); }, SHAPE::SMEM_BYTES); \
        launch(gd, dim3{SHAPE::THREADS, 1, 1}, [&] { moe_gemm_##DT##_##NAME(act.data(), wd.data(), tile_expert.data(), seg.data() + E, y.data(), EPI_PLAIN, 0, 0, d, inter, inter, sd.len, sd.count); }, SHAPE::SMEM_BYTES); \
    } while (0)
        if (m.dt == 1 && bm == 16) MOE_CALL(bf16, m16, GemmM16);
        else if (m.dt == 1) MOE_CALL(bf16, m64, GemmM64);
        else if (bm == 16) MOE_CALL(f16, m16, GemmM16);
        else MOE_CALL(f16, m64, GemmM64);
#undef MOE_CALL
    }
    launch(dim3{(unsigned)T, 1, 1}, dim3{256, 1, 1}, [&] { moe_combine(out.data(), y.data(), weights, sel.data(), slot.data(), d, E, K); });
    return out;
}

// Routing weights [T, E] from logits through moe_route (softmax, top-k, renormalised).
inline std::vector<float> route(const std::vector<float>& logits, int T, int E, int K) {
    std::vector<float> w((size_t)T * E, NAN);
    launch(dim3{(unsigned)((T + 63) / 64), 1, 1}, dim3{64, 1, 1}, [&] { moe_route(logits.data(), w.data(), T, E, K, 1); });
    return w;
}

// f64 over the unrounded x and the stored weights: NMSE of got.
inline double nmse_f64(const Experts& m, const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& got, int T) {
    const int d = m.d, inter = m.inter;
    double num = 0, den = 0;
    std::vector<double> a(inter);
    for (int t = 0; t < T; ++t) {
        std::vector<double> o(d, 0.0);
        for (int e = 0; e < m.E; ++e) {
            const double we = w[(size_t)t * m.E + e];
            if (we == 0) continue;
            for (int i = 0; i < inter; ++i) {
                double g = 0, u = 0;
                for (int k = 0; k < d; ++k) {
                    g += (double)x[(size_t)t * d + k] * m.g32[e][(size_t)i * d + k];
                    u += (double)x[(size_t)t * d + k] * m.u32w[e][(size_t)i * d + k];
                }
                a[i] = g / (1.0 + std::exp(-g)) * u;
            }
            for (int c = 0; c < d; ++c) {
                double s = 0;
                for (int i = 0; i < inter; ++i) s += a[i] * m.d32[e][(size_t)c * inter + i];
                o[c] += we * s;
            }
        }
        for (int c = 0; c < d; ++c) {
            const double g = got[(size_t)t * d + c];
            if (!std::isfinite(g)) return INFINITY;
            num += (g - o[c]) * (g - o[c]);
            den += o[c] * o[c];
        }
    }
    return num / (den > 0 ? den : 1e-30);
}

inline bool same(const std::vector<float>& a, const std::vector<float>& b) { return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0; }

// kind: 0 random routing, 1 every token to expert 3 first (top_k = 1: all tokens in one expert).
inline void test_case(const Check& check, int dt, int T, int E, int K, int d, int inter, int bm, int kind, bool vs_dense = true) {
    Experts m = make(dt, E, K, d, inter);
    std::vector<float> x((size_t)T * d), logits((size_t)T * E);
    for (auto& v : x) v = mmtest::rnd();
    for (auto& v : logits) v = mmtest::rnd() * 2.0f;
    if (kind == 1)
        for (int t = 0; t < T; ++t) logits[(size_t)t * E + 3] = 10.0f;
    const auto w = route(logits, T, E, K);
    const auto got = routed(m, x.data(), w.data(), T, bm);
    const char* dn = dt == 0 ? "f32" : dt == 1 ? "bf16" : "f16";
    char tag[160];
    std::snprintf(tag, sizeof tag, "moe routed %s T=%d E=%d top_k=%d d=%d inter=%d bm=%d%s", dn, T, E, K, d, inter, bm, kind == 1 ? " (all tokens in expert 3)" : "");
    const double e = nmse_f64(m, x, w, got, T), lim = dt == 0 ? 1e-11 : 1e-4;
    char buf[320];
    std::snprintf(buf, sizeof buf, "%s: NMSE vs f64 %.2e (limit %.0e); the tile map covers each expert's rows", tag, e, lim);
    check(buf, e <= lim && expert_tiles_ok);
    expert_tiles_ok = true;
    if (vs_dense) check(std::string(tag) + ": bitwise equal to the every-expert path", same(got, dense(m, x.data(), w.data(), T)));
    // Batch composition: token t alone, and the tokens in reverse order (other tokens share its
    // experts, its rows land elsewhere in the layout): token t's bytes unchanged.
    bool ok = true;
    for (int t : {0, T / 2, T - 1}) {
        const auto one = routed(m, &x[(size_t)t * d], &w[(size_t)t * E], 1, bm);
        ok = ok && std::memcmp(one.data(), &got[(size_t)t * d], 4 * d) == 0;
    }
    std::vector<float> xr((size_t)T * d), wr((size_t)T * E);
    for (int t = 0; t < T; ++t) {
        std::copy_n(&x[(size_t)(T - 1 - t) * d], d, &xr[(size_t)t * d]);
        std::copy_n(&w[(size_t)(T - 1 - t) * E], E, &wr[(size_t)t * E]);
    }
    const auto rev = routed(m, xr.data(), wr.data(), T, bm);
    for (int t = 0; t < T; ++t) ok = ok && std::memcmp(&rev[(size_t)(T - 1 - t) * d], &got[(size_t)t * d], 4 * d) == 0;
    check(std::string(tag) + ": a token's bytes alone == in the batch == in the reversed batch", ok);
}

inline void run_all(const Check& check) {
    // 37 tokens: not a multiple of 16 or 64; E = 16, top 2: experts with no token likely at T=3.
    test_case(check, 1, 37, 8, 2, 70, 40, 16, 0);
    test_case(check, 1, 37, 8, 2, 70, 40, 64, 0);
    test_case(check, 2, 70, 4, 4, 64, 96, 64, 0);  // every expert routed; 70 tokens: two chunks
    test_case(check, 1, 3, 16, 2, 72, 40, 16, 0);  // 3 tokens, 16 experts: most have none
    test_case(check, 1, 20, 8, 1, 40, 32, 16, 1);  // all tokens in one expert: two row tiles of it
    test_case(check, 0, 37, 8, 2, 70, 40, 64, 0);  // f32 weights: the SIMT kernel
    test_case(check, 0, 5, 8, 1, 33, 20, 64, 1);
}
}  // namespace moetest
