// attention_tc_test.h — paged_attention_tc_d{64,128,256} and its variant paged_attention_tc_deep_d{64,128}
// (kernels/paged_attention.cu) on the emulator: against an f64 reference within a derived bound,
// and bit for bit across the ways a token can be served (a split job or a chunk job, any chunk
// width, alone or in any batch). Every check runs once per variant (`Variant`).
// Included by emu_test.cpp (and attn_break_test.cpp) after the kernels.
#pragma once

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace pattest {

using Check = std::function<void(const std::string&, bool)>;

struct Case {
    int bs, kvh, gqa, D;
    std::vector<std::pair<int, int>> seqs;  // (cached, query) per sequence
    int bad_block_seq = -1;                 // this sequence's block 1 gets a bad id
    int window = 0;                         // sliding window in keys (0: none)
};

// A case's inputs: scattered blocks, random K/V in a bf16 cache (the values the kernel reads),
// random q.
struct Data {
    Case c;
    int H, S, T, max_blocks, num_blocks;
    std::vector<unsigned> tables, pos, tseq;
    std::vector<bf16_t> k, v;
    std::vector<float> q;
};

inline uint64_t& rng() {
    static uint64_t s = 99;
    return s;
}
inline float rnd() {
    uint64_t z = (rng() += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (float)((double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

inline Data build(const Case& c) {
    Data d{c, c.kvh * c.gqa, (int)c.seqs.size(), 0, 0, 0, {}, {}, {}, {}, {}, {}};
    int blocks = 0;
    for (auto [ca, qu] : c.seqs) {
        d.max_blocks = std::max(d.max_blocks, (ca + qu + c.bs - 1) / c.bs + 1);
        blocks += (ca + qu + c.bs - 1) / c.bs;
    }
    d.num_blocks = blocks + 3;
    d.tables.assign((size_t)d.S * d.max_blocks, 0);
    int next = 0;
    for (int s = 0; s < d.S; ++s) {
        auto [ca, qu] = c.seqs[s];
        for (int j = 0; j < (ca + qu + c.bs - 1) / c.bs; ++j) d.tables[(size_t)s * d.max_blocks + j] = (unsigned)((next++ * 7 + 3) % d.num_blocks);
        if (s == c.bad_block_seq) d.tables[(size_t)s * d.max_blocks + 1] = (unsigned)d.num_blocks + 5;
        for (int p = ca; p < ca + qu; ++p) {
            d.pos.push_back((unsigned)p);
            d.tseq.push_back((unsigned)s);
        }
    }
    d.T = (int)d.pos.size();
    rng() = 4242;
    const size_t n = (size_t)d.num_blocks * c.bs * c.kvh * c.D;
    for (size_t i = 0; i < n; ++i) d.k.push_back(bf16_t{f32_to_bf16_bits(rnd())});
    for (size_t i = 0; i < n; ++i) d.v.push_back(bf16_t{f32_to_bf16_bits(rnd())});
    for (size_t i = 0; i < (size_t)d.T * d.H * c.D; ++i) d.q.push_back(2.0f * rnd());
    return d;
}

using PatKernel = void (*)(const float*, const bf16_t*, const bf16_t*, const u32*, const u32*, const u32*, float*, float*, float*, u32*, int, int,
                          int, int, int, int, int, int, int, int, float, int);
// How the host launches each variant (crates/cuda/src/attention.rs): its kernels, warps a
// block, partitions at most (pat_max_parts), dynamic shared memory; `shared`: tc_shared's grid
// (chunk blocks of PATS_WARPS * tw tokens, then split blocks of PAT_WARPS jobs), run with the
// emulator's warps drifting apart between block barriers (emu::warp_greedy).
// d256: null where the variant has none (its cases are skipped). halves(D): the warp jobs a
// row's output dims are cut into (tc at d256: 2; each half counts and keeps partials as a row).
struct Variant {
    const char* name;
    PatKernel d64, d128, d256;
    int warps, splits;
    size_t (*smem)(int D);
    int (*halves)(int D);
    bool shared = false;
    // The variant's kernel serves only the chunk tokens; the split tokens are tc's, launched
    // after it with num_tokens = n_split (the wgmma variant, crates/cuda/src/attention.rs).
    bool split_by_tc = false;
};
inline Variant tc() {
    return {"paged_attention_tc", paged_attention_tc_d64, paged_attention_tc_d128, paged_attention_tc_d256, PAT_WARPS, PAT_SPLITS,
            [](int D) { return (size_t)PAT_WARPS * (D > 128 ? 3 : 2) * PAT_SUB * (D + 8) * 2; }, [](int D) { return D > 128 ? 2 : 1; }};
}
inline Variant tc_deep() {
    return {"paged_attention_tc_deep", paged_attention_tc_deep_d64, paged_attention_tc_deep_d128, nullptr, 1, PATD_SPLITS,
            [](int D) { return (size_t)(D == 64 ? PatdCfg<64>::SMEM : PatdCfg<128>::SMEM); }, [](int) { return 1; }};
}
inline Variant tc_shared() {
    return {"paged_attention_tc_shared", paged_attention_tc_shared_d64, paged_attention_tc_shared_d128, nullptr, PATS_WARPS, PAT_SPLITS,
            [](int D) { return (size_t)(D == 64 ? PatsCfg<64>::SMEM : PatsCfg<128>::SMEM); }, [](int) { return 1; }, true};
}
inline PatKernel kernel_of(const Variant& v, int D) { return D == 64 ? v.d64 : D == 128 ? v.d128 : v.d256; }

// The host's bound on partitions (crates/cuda/src/attention.rs, pat_max_parts).
inline int max_parts(const Variant& v, int max_ctx) { return std::max(1, std::min(v.splits, (max_ctx + PAT_MIN_PART - 1) / PAT_MIN_PART)); }

inline bool counters_ok = true;

// Runs the kernel as the host launches it: tokens [0, n_split) as split jobs, the rest in
// chunks of `tw` tokens (0: the host's width, 16 / min(gqa, 16)). only >= 0: that token alone.
inline std::vector<float> run(const Variant& var, const Data& d, int n_split, int tw = 0, int only = -1) {
    const Case& c = d.c;
    std::vector<unsigned> pos = d.pos, tseq = d.tseq;
    std::vector<float> q = d.q;
    const size_t row = (size_t)d.H * c.D;
    if (only >= 0) {
        pos = {d.pos[only]};
        tseq = {d.tseq[only]};
        q.assign(d.q.begin() + (ptrdiff_t)(only * row), d.q.begin() + (ptrdiff_t)((only + 1) * row));
    }
    const int T = (int)pos.size();
    n_split = std::min(n_split, T);
    int max_ctx = 1;
    for (unsigned p : pos) max_ctx = std::max(max_ctx, (int)p + 1);
    const int parts = max_parts(var, max_ctx), HG = (c.gqa + 15) / 16, halves = var.halves(c.D), groups = c.kvh * HG * halves;
    if (tw == 0) tw = 16 / std::min(c.gqa, 16);
    std::vector<float> out((size_t)T * row, NAN), po((size_t)std::max(n_split, 1) * d.H * parts * c.D, NAN),
        pm((size_t)std::max(n_split, 1) * d.H * halves * parts * 2, NAN);
    std::vector<u32> counters((size_t)std::max(n_split, 1) * groups, 0);
    const long warps = (long)((T - n_split + tw - 1) / tw) * groups + (long)n_split * groups * parts;
    const long split_jobs = (long)n_split * groups * parts, bt = (long)PATS_WARPS * tw;
    const unsigned blocks = var.shared ? (unsigned)std::max(1L, (T - n_split + bt - 1) / bt * groups + (split_jobs + PAT_WARPS - 1) / PAT_WARPS)
                                       : (unsigned)std::max(1L, (warps + var.warps - 1) / var.warps);
    emu::warp_greedy = var.shared;
    const size_t smem = var.smem(c.D);
    const float scale = 1.0f / std::sqrt((float)c.D);
    launch(dim3{blocks, 1, 1}, dim3{(unsigned)var.warps * 32, 1, 1}, [&] {
        auto f = kernel_of(var, c.D);
        f(q.data(), d.k.data(), d.v.data(), pos.data(), tseq.data(), d.tables.data(), out.data(), po.data(), pm.data(), counters.data(), T, n_split,
          d.H, c.kvh, c.bs, d.num_blocks, d.S, d.max_blocks, parts, tw, scale, c.window);
    }, smem);
    emu::warp_greedy = false;
    if (var.split_by_tc && n_split > 0) {
        const Variant t = tc();
        const unsigned sb = (unsigned)((split_jobs + PAT_WARPS - 1) / PAT_WARPS);
        launch(dim3{sb, 1, 1}, dim3{PAT_WARPS * 32, 1, 1}, [&] {
            kernel_of(t, c.D)(q.data(), d.k.data(), d.v.data(), pos.data(), tseq.data(), d.tables.data(), out.data(), po.data(), pm.data(),
                              counters.data(), n_split, n_split, d.H, c.kvh, c.bs, d.num_blocks, d.S, d.max_blocks, parts, tw, scale, c.window);
        }, t.smem(c.D));
    }
    for (u32 v : counters) counters_ok = counters_ok && v == 0;
    return out;
}

// f64 attention over the cache's values with the f32 q, and each element's bound: q rounded to
// bf16 moves each score by at most D_th = scale * max_j sum_i |q_i k_ji| u (u = 2^-8, bf16's
// relative rounding bound), so each p by a factor within exp(+-2 D_th); p rounded to bf16 for the
// PV product moves the numerator by at most u A_d, A_d = sum_j p_j |v_jd| (the denominator l sums
// the unrounded p); the f32 arithmetic (exact bf16 products, f32 sums, exp2 of f32 scores) is
// allowed 2^-16 A_d on top:  |got - want| <= A_d ((exp(2 D_th) - 1)(1 + u) + u + 2^-16).
inline void reference(const Data& d, std::vector<double>& want, std::vector<double>& bound) {
    const Case& c = d.c;
    const int D = c.D;
    const double u = 1.0 / 256.0, scale = 1.0 / std::sqrt((double)D);
    want.assign((size_t)d.T * d.H * D, 0.0);
    bound.assign(want.size(), 0.0);
    const size_t srow = (size_t)c.kvh * D;
    for (int t = 0; t < d.T; ++t)
        for (int h = 0; h < d.H; ++h) {
            const int kh = h / c.gqa, n = (int)d.pos[t] + 1;
            const int lo = c.window > 0 && n > c.window ? n - c.window : 0;  // HF: keys j > p - window
            const unsigned* tab = &d.tables[(size_t)d.tseq[t] * d.max_blocks];
            const float* qt = &d.q[((size_t)t * d.H + h) * D];
            std::vector<double> sc(n);
            std::vector<size_t> slot(n);
            double mx = -INFINITY, dth = 0;
            for (int j = 0; j < n; ++j) {
                if (j < lo) {
                    sc[j] = -INFINITY;
                    continue;
                }
                slot[j] = ((size_t)tab[j / c.bs] * c.bs + j % c.bs) * srow + (size_t)kh * D;
                double dot = 0, ab = 0;
                for (int i = 0; i < D; ++i) {
                    const double kv = bf16_bits_to_f32(d.k[slot[j] + i].bits);
                    dot += qt[i] * kv;
                    ab += std::fabs(qt[i] * kv);
                }
                sc[j] = dot * scale;
                dth = std::max(dth, ab * scale * u);
                mx = std::max(mx, sc[j]);
            }
            double den = 0;
            for (auto& s : sc) den += (s = std::exp(s - mx));
            const size_t at = ((size_t)t * d.H + h) * D;
            for (int i = 0; i < D; ++i) {
                double o = 0, a = 0;
                for (int j = lo; j < n; ++j) {
                    const double vv = bf16_bits_to_f32(d.v[slot[j] + i].bits);
                    o += sc[j] / den * vv;
                    a += sc[j] / den * std::fabs(vv);
                }
                want[at + i] = o;
                bound[at + i] = a * ((std::exp(2 * dth) - 1) * (1 + u) + u + 1.0 / 65536.0);
            }
        }
}

inline bool within(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& bound, std::string& worst) {
    double w = 0, nse = 0, den = 0;
    size_t at = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        const double r = std::fabs(got[i] - want[i]) / bound[i];
        if (!(r <= w)) {
            w = r;
            at = i;
        }
        nse += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    char buf[160];
    std::snprintf(buf, sizeof buf, "largest error %.1f%% of its bound (element %zu), NMSE %.2e", 100 * w, at, nse / den);
    worst = buf;
    return w <= 1.0 && nse / den < 5e-5;
}

inline bool same(const std::vector<float>& a, const float* b, size_t n) { return std::memcmp(a.data(), b, 4 * n) == 0; }

inline std::string name(const Case& c) {
    std::string s = "bs=" + std::to_string(c.bs) + " kvh=" + std::to_string(c.kvh) + " gqa=" + std::to_string(c.gqa) + " D=" + std::to_string(c.D) + " seqs=";
    for (auto [a, b] : c.seqs) s += std::to_string(a) + "+" + std::to_string(b) + ",";
    if (c.window > 0) s += " window=" + std::to_string(c.window);
    return s;
}

// Tokens that are each a whole sequence, from the start (what the model passes as the split hint).
inline int leading_decodes(const Data& d) {
    int n = 0;
    while (n < d.T && (int)d.tseq[n] == n && (n + 1 == d.T || d.tseq[n + 1] != d.tseq[n])) ++n;
    return n;
}

inline std::vector<Case> cases() {
    return {
        {16, 2, 4, 64, {{0, 1}, {14, 1}, {16, 1}, {32, 1}, {99, 1}}},   // decodes, contexts ending mid-block
        {32, 2, 4, 128, {{30, 1}, {64, 1}, {199, 1}}},                   // head_dim 128
        {16, 1, 3, 64, {{20, 13}, {5, 40}}},                             // prefill chunks over a prefix, GQA 3 (5 tokens a chunk)
        {16, 2, 4, 64, {{0, 1}, {16, 1}, {300, 1}, {290, 17}}},          // decodes, then a chunk to 307
        {16, 1, 2, 64, {{600, 1}, {1100, 1}, {500, 30}}},                // several partitions (1101 keys: 128 a partition)
        {16, 1, 4, 64, {{1010, 30}}},                                    // a chunk whose partition length changes (1024 -> 1025 keys)
        {16, 1, 20, 64, {{40, 3}, {70, 1}}},                             // 20 heads a KV head: groups of 16 and 4
        {16, 2, 1, 128, {{5, 20}, {130, 1}}},                            // no GQA: 16 tokens a chunk
        {16, 1, 4, 64, {{2500, 1}, {7, 2}}},                             // 14 partitions of 192 keys (tc_deep: 20 of 128)
        // Sliding windows: contexts shorter and longer than the window, a span of several
        // partitions, chunks whose rows' windows start in different tiles, a window of 1 key.
        {16, 2, 4, 64, {{0, 1}, {20, 1}, {300, 1}, {290, 17}, {700, 1}}, -1, 100},
        {16, 1, 4, 128, {{1100, 1}, {1000, 40}}, -1, 600},
        {16, 2, 1, 128, {{60, 40}, {3, 1}}, -1, 64},
        {16, 1, 2, 64, {{5, 3}, {70, 20}}, -1, 1},
        {16, 2, 4, 64, {{0, 1}, {10, 1}, {40, 1}, {30, 20}}, -1, 16},    // window 16: contexts of 1-50 keys
        {32, 1, 3, 128, {{2100, 1}, {1980, 12}}, -1, 1500},              // a span past 1024 keys (tc_deep: 24 partitions of 64, tc: 12 of 128)
        {16, 1, 4, 64, {{2042, 20}}},                                    // tc_deep's partition length changes (2048 -> 2049 keys) inside a chunk
        {32, 1, 2, 128, {{5000, 1}, {700, 9}}},                          // head_dim 128, many ring turns (tc: 16 x 320, tc_deep: 27 x 192)
        {16, 2, 2, 64, {{0, 70}, {33, 45}, {7, 1}}},                    // prefills from 0 and over a prefix (tc_shared: blocks of 32 tokens, one across two sequences)
        // head_dim 256 (Gemma 2 and 3; tc only): decodes mid-block and over 11 partitions, GQA
        // 4 and 2, block 32, prefill chunks over a prefix, a chunk whose partition length
        // changes (1024 -> 1025 keys), sliding windows (Gemma 3's local layers, scaled down).
        {16, 1, 4, 256, {{0, 1}, {14, 1}, {99, 1}, {700, 1}, {40, 9}}},
        {32, 2, 2, 256, {{20, 13}, {5, 40}, {33, 1}}},
        {16, 1, 2, 256, {{1015, 12}}},
        {16, 1, 4, 256, {{0, 1}, {90, 1}, {300, 1}, {250, 20}}, -1, 128},
        {32, 1, 2, 256, {{700, 1}, {600, 11}}, -1, 512},
    };
}

inline void run_all(const Variant& var, const Check& check) {
    const std::string vn = var.name;
    for (const Case& c : cases()) {
        if (!kernel_of(var, c.D)) continue;
        const Data d = build(c);
        const int lead = leading_decodes(d);
        std::vector<double> want, bound;
        reference(d, want, bound);
        auto got = run(var, d, lead);
        std::string worst;
        const bool close = within(got, want, bound, worst);
        check(vn + " vs f64 within the derived bound, " + name(c) + ": " + worst, close);
        int max_span = 0;  // keys from the first one seen, rounded down to a 64-key tile
        for (unsigned p : d.pos) {
            const int n = (int)p + 1, lo = c.window > 0 && n > c.window ? n - c.window : 0;
            max_span = std::max(max_span, n - lo / PAT_TILE * PAT_TILE);
        }
        if (var.d64 == tc_deep().d64 && max_span <= 1024) {
            // Up to a 1024-key span both variants cut 64-key partitions: the same arithmetic, the same bits.
            auto base = run(tc(), d, lead);
            check(vn + " " + name(c) + ": bitwise equal to paged_attention_tc (the same partitions up to a 1024-key span)", same(got, base.data(), got.size()));
        }
        if (var.shared) {
            // tc_shared's per-row arithmetic is tc's at every length: its chunk blocks against
            // tc's chunk jobs (every token a chunk token, and the host's mix).
            auto base = run(tc(), d, lead), base_chunk = run(tc(), d, 0), chunk = run(var, d, 0);
            check(vn + " " + name(c) + ": bitwise equal to paged_attention_tc (chunk blocks, and the host's mix)",
                  same(got, base.data(), got.size()) && same(chunk, base_chunk.data(), got.size()));
        }
        const size_t n = got.size();
        // The same bits whichever jobs serve the tokens.
        auto all_split = run(var, d, d.T), all_chunk = run(var, d, 0), narrow = run(var, d, 0, 1);
        check(vn + " " + name(c) + ": split jobs, chunk jobs, 1-token chunks and the host's mix bitwise equal",
              same(got, all_split.data(), n) && same(got, all_chunk.data(), n) && same(got, narrow.data(), n));
        // Each token alone (a split job, as a decode step serves it) against the batch.
        bool alone_ok = true;
        const size_t row = (size_t)d.H * c.D;
        for (int t = 0; t < d.T; t += (d.T > 12 ? 5 : 1)) {
            auto one = run(var, d, 1, 0, t);
            alone_ok = alone_ok && same(one, got.data() + (size_t)t * row, row);
        }
        check(vn + " " + name(c) + ": every token alone == in the batch (bitwise)", alone_ok);
    }
    check(vn + ": every launch left its arrival counters at 0", counters_ok);

    // A bad block id (sequence 1's second block): NaN for the tokens whose context reaches it,
    // the other sequences' tokens untouched (bitwise equal to a clean run).
    for (int D : {64, 128, 256}) {
        if (!kernel_of(var, D)) continue;
        Case c{16, 2, 4, D, {{3, 1}, {10, 12}, {40, 1}}};
        const Data clean = build(c);
        c.bad_block_seq = 1;
        const Data badd = build(c);
        for (int n_split : {0, 3}) {
            auto ok = run(var, clean, n_split), bad = run(var, badd, n_split);
            bool pattern = true;
            const size_t row = (size_t)clean.H * D;
            for (int t = 0; t < clean.T; ++t) {
                const bool reaches = clean.tseq[t] == 1 && (int)clean.pos[t] >= 16;
                for (size_t i = 0; i < row; ++i) {
                    const float b = bad[t * row + i];
                    pattern = pattern && (reaches ? std::isnan(b) : std::memcmp(&b, &ok[t * row + i], 4) == 0);
                }
            }
            check(vn + " D=" + std::to_string(D) + " n_split=" + std::to_string(n_split) +
                      ": a bad block id gives NaN exactly where a context reaches it, bitwise the clean output elsewhere",
                  pattern);
        }
        // A token of a sequence that does not exist: its row is NaN.
        Data d = build(Case{16, 2, 4, D, {{3, 1}, {10, 2}}});
        d.tseq[2] = 7;
        for (int n_split : {0, 3}) {
            auto out = run(var, d, n_split);
            const size_t row = (size_t)d.H * D;
            bool nan_row = true, rest = true;
            for (size_t i = 0; i < row; ++i) nan_row = nan_row && std::isnan(out[2 * row + i]);
            for (size_t i = 0; i < 2 * row; ++i) rest = rest && std::isfinite(out[i]);
            check(vn + " D=" + std::to_string(D) + " n_split=" + std::to_string(n_split) + ": a token of no sequence gives a NaN row, the others finite",
                  nan_row && rest);
        }
    }
}

}  // namespace pattest
