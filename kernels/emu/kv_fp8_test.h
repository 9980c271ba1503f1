// kv_fp8_test.h — checks the FP8 KV cache kernels: common.cuh's fp8_encode / fp8_decode,
// kv_write_fp8e4m3 / _fp8e5m2, rope_kv_write_fp8*, paged_attention_partial_fp8*.
// - The codec against a host oracle written here the way crates/core writes it: the decode per
//   field (Fp8Format::decode), the encode as the nearest finite value, ties to the even byte,
//   saturated (what crates/core fp8_round's tests prove its encode is), every byte and a sweep
//   of f32 bit patterns; and the bytes fp8_round's own tests write down by hand.
// - kv_write: every stored byte is the oracle's byte of x / scale (scales 1 and not 1), a bad
//   slot and the slots not written untouched; rope_kv_write bitwise equal to rope then kv_write.
// - Attention over an fp8 cache against a double-precision attention over the decoded values
//   times the scales (NMSE), decodes and prefill chunks, GQA, a context past one partition, a
//   sliding window; and each token alone has the bits it has in the batch.
// Included by emu_test.cpp; reports through the `check(name, ok)` it is given.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace kvfp8test {
using Check = std::function<void(const std::string&, bool)>;

struct Format {
    const char* name;
    int man, bias;
    bool e4m3;
};
inline const Format E4M3{"e4m3", 3, 7, true}, E5M2{"e5m2", 2, 15, false};

// Fp8Format::decode, field by field in double.
inline double host_decode(const Format& f, uint8_t b) {
    const double sign = (b & 0x80) ? -1.0 : 1.0;
    const int e = (b & 0x7f) >> f.man, m = b & ((1 << f.man) - 1), e_max = (1 << (f.e4m3 ? 4 : 5)) - 1;
    if (f.e4m3 && e == e_max && m == 7) return NAN;
    if (!f.e4m3 && e == e_max) return m == 0 ? sign * INFINITY : NAN;
    const double frac = (double)m / (1 << f.man);
    return sign * (e == 0 ? frac * std::ldexp(1.0, 1 - f.bias) : (1.0 + frac) * std::ldexp(1.0, e - f.bias));
}

// The nearest finite byte to x, ties to the even byte, past the largest saturated; NaN: 0x7f.
inline uint8_t host_encode(const Format& f, float x) {
    const uint8_t sign = std::signbit(x) ? 0x80 : 0;
    if (std::isnan(x)) return sign | 0x7f;
    const double max = f.e4m3 ? 448.0 : 57344.0, a = std::min((double)std::fabs(x), max);
    uint8_t best = 0;
    for (int b = 0; b < 0x80; ++b) {
        const double v = host_decode(f, (uint8_t)b);
        if (!std::isfinite(v)) continue;
        const double d = std::fabs(v - a), db = std::fabs(host_decode(f, best) - a);
        if (d < db || (d == db && b % 2 == 0)) best = (uint8_t)b;
    }
    return sign | best;
}

inline uint8_t dev_encode(const Format& f, float x) {
    return (uint8_t)fp8_encode(x, f.man, f.bias, f.e4m3 ? 448.0f : 57344.0f);
}
inline float dev_decode(const Format& f, uint8_t b) { return fp8_decode(b, f.man, f.bias, f.e4m3); }

inline bool same(double a, float b) { return (std::isnan(a) && std::isnan(b)) || (a == (double)b && std::signbit(a) == std::signbit(b)); }

inline void codec(const Check& check) {
    for (const Format* f : {&E4M3, &E5M2}) {
        size_t bad_dec = 0, bad_rt = 0;
        for (int b = 0; b < 256; ++b) {
            const float v = dev_decode(*f, (uint8_t)b);
            bad_dec += !same(host_decode(*f, (uint8_t)b), v);
            if (std::isfinite(v)) bad_rt += dev_encode(*f, v) != b;
        }
        check(std::string("fp8 ") + f->name + ": every byte decodes as Fp8Format::decode (" + std::to_string(bad_dec) + " wrong)", bad_dec == 0);
        check(std::string("fp8 ") + f->name + ": every finite byte round-trips (" + std::to_string(bad_rt) + " wrong)", bad_rt == 0);
        // Every f32 bit pattern stepping by a prime: signs, binades, subnormals, overflow, inf.
        size_t bad_enc = 0, n = 0;
        for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 65521) {
            float x;
            const uint32_t u = (uint32_t)bits;
            std::memcpy(&x, &u, 4);
            if (std::isnan(x)) continue;
            ++n;
            bad_enc += dev_encode(*f, x) != host_encode(*f, x);
        }
        // Exact ties between neighbours go to the even byte.
        size_t bad_tie = 0;
        for (int b = 0; b < 0x7e; ++b) {
            const double lo = host_decode(*f, (uint8_t)b), hi = host_decode(*f, (uint8_t)(b + 1));
            if (!std::isfinite(hi)) continue;
            const float mid = (float)((lo + hi) / 2);
            bad_tie += dev_encode(*f, mid) != (b % 2 == 0 ? b : b + 1);
        }
        check(std::string("fp8 ") + f->name + ": encode is the nearest byte over " + std::to_string(n) + " values (" + std::to_string(bad_enc) +
                  " wrong), ties to even (" + std::to_string(bad_tie) + " wrong)",
              bad_enc == 0 && bad_tie == 0 && n > 60000);
        check(std::string("fp8 ") + f->name + ": NaN encodes to a NaN byte", std::isnan(dev_decode(*f, dev_encode(*f, NAN))));
    }
    // The bytes crates/core fp8_round's tests write down by hand.
    const std::pair<float, uint8_t> e4[] = {{1.0625f, 0x38}, {1.1875f, 0x3a}, {1.07f, 0x39}, {449.0f, 0x7e}, {480.0f, 0x7e}, {1e9f, 0x7e},
                                            {INFINITY, 0x7e}, {-449.0f, 0xfe}, {-INFINITY, 0xfe}, {std::ldexp(1.0f, -10), 0x00},
                                            {std::ldexp(1.0f, -10) * 1.01f, 0x01}, {7.5f * std::ldexp(1.0f, -9), 0x08}};
    bool ok = dev_encode(E5M2, 1e9f) == 0x7b;
    for (auto [x, b] : e4) ok &= dev_encode(E4M3, x) == b;
    check("fp8: the bytes fp8_round's tests name (ties, saturation, subnormal ties)", ok);
}

inline uint64_t next(uint64_t& s) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
inline float unit(uint64_t& s) { return (float)(next(s) >> 40) / (float)(1u << 24) * 2.0f - 1.0f; }

template <typename KV>
inline void kv_write_case(const Check& check, const Format& f, float ks, float vs) {
    const int nb = 5, bs = 16, kvh = 2, D = 64, T = 7;
    const size_t row = kvh * D, slots = (size_t)nb * bs;
    std::vector<unsigned> sl = {0, 17, 79, 33, 34, 5, 1000};  // the last is out of range: skipped
    uint64_t s = 99;
    std::vector<float> k(T * row), v(T * row);
    for (size_t i = 0; i < k.size(); ++i) {
        // Magnitudes from 2^-24 (subnormal, or zero) to 2^20 (saturated in e4m3).
        k[i] = std::ldexp(unit(s), (int)(i * 37 % 45) - 24);
        v[i] = std::ldexp(unit(s), (int)(i * 53 % 23) - 12);
    }
    const float edge[] = {1.0625f, 1.1875f, -0.0f, INFINITY, -INFINITY, NAN, 1e30f, -1e-30f};
    for (size_t i = 0; i < sizeof(edge) / sizeof(edge[0]); ++i) k[i] = v[row + i] = edge[i];
    std::vector<KV> kc(slots * row, KV{0x55}), vc(slots * row, KV{0x55});
    launch(dim3{T, 1, 1}, dim3{128, 1, 1}, [&] {
        if constexpr (std::is_same_v<KV, fp8e4m3_t>)
            kv_write_fp8e4m3(k.data(), v.data(), kc.data(), vc.data(), sl.data(), T, (int)row, slots, ks, vs);
        else
            kv_write_fp8e5m2(k.data(), v.data(), kc.data(), vc.data(), sl.data(), T, (int)row, slots, ks, vs);
    });
    size_t wrong = 0, untouched = 0;
    std::vector<bool> written(slots, false);
    for (int t = 0; t < T; ++t) {
        if (sl[t] >= slots) continue;
        written[sl[t]] = true;
        for (size_t i = 0; i < row; ++i) {
            wrong += kc[sl[t] * row + i].bits != host_encode(f, k[t * row + i] / ks);
            wrong += vc[sl[t] * row + i].bits != host_encode(f, v[t * row + i] / vs);
        }
    }
    for (size_t sl2 = 0; sl2 < slots; ++sl2)
        if (!written[sl2])
            for (size_t i = 0; i < row; ++i) untouched += kc[sl2 * row + i].bits != 0x55 || vc[sl2 * row + i].bits != 0x55;
    const std::string tag = std::string("kv_write fp8") + f.name + " scales " + std::to_string(ks) + "/" + std::to_string(vs);
    check(tag + ": every byte is the nearest-even, saturated byte of x / scale (" + std::to_string(wrong) + " wrong)", wrong == 0);
    check(tag + ": slots not written (and the bad slot) untouched (" + std::to_string(untouched) + " changed)", untouched == 0);

    // rope_kv_write: the cache bytes of rope then kv_write, q rotated as rope rotates it.
    const int qh = 4, P = 3;
    std::vector<float> q(T * qh * D), inv(D / 2);
    for (auto& x : q) x = unit(s) * 3.0f;
    for (int i = 0; i < D / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / D);
    std::vector<unsigned> pos = {0, 5, 17, 300, 4095, 1, P};
    std::vector<float> q1 = q, k1 = k, q2 = q, k2 = k;
    std::vector<KV> kc1(slots * row, KV{0x55}), vc1 = kc1, kc2 = kc1, vc2 = kc1;
    launch(dim3{T, 1, 1}, dim3{128, 1, 1}, [&] {
        if constexpr (std::is_same_v<KV, fp8e4m3_t>)
            rope_kv_write_fp8e4m3(q1.data(), k1.data(), v.data(), kc1.data(), vc1.data(), pos.data(), inv.data(), sl.data(), T, qh, kvh, D, slots, ks, vs);
        else
            rope_kv_write_fp8e5m2(q1.data(), k1.data(), v.data(), kc1.data(), vc1.data(), pos.data(), inv.data(), sl.data(), T, qh, kvh, D, slots, ks, vs);
    });
    launch(dim3{T, 1, 1}, dim3{128, 1, 1}, [&] { rope(q2.data(), k2.data(), pos.data(), inv.data(), T, qh, kvh, D); });
    launch(dim3{T, 1, 1}, dim3{128, 1, 1}, [&] {
        if constexpr (std::is_same_v<KV, fp8e4m3_t>)
            kv_write_fp8e4m3(k2.data(), v.data(), kc2.data(), vc2.data(), sl.data(), T, (int)row, slots, ks, vs);
        else
            kv_write_fp8e5m2(k2.data(), v.data(), kc2.data(), vc2.data(), sl.data(), T, (int)row, slots, ks, vs);
    });
    bool eq = std::memcmp(q1.data(), q2.data(), q1.size() * 4) == 0;
    for (size_t i = 0; i < kc1.size(); ++i) eq &= kc1[i].bits == kc2[i].bits && vc1[i].bits == vc2[i].bits;
    check("rope_" + tag + ": bitwise rope then kv_write", eq);
}

struct Seq {
    int cached, queried;
};

// Attention over an fp8 cache: returns out; fills want (f64 over the decoded values) when given.
template <typename KV>
inline std::vector<float> attention(const Format& f, int bs, int kvh, int gqa, int D, const std::vector<Seq>& seqs, int window, float ks,
                                    float vs, std::vector<double>* want, int only = -1) {
    const int H = kvh * gqa, S = (int)seqs.size();
    int max_blocks = 0, blocks = 0;
    for (auto [ca, qu] : seqs) {
        max_blocks = std::max(max_blocks, (ca + qu + bs - 1) / bs + 1);
        blocks += (ca + qu + bs - 1) / bs;
    }
    const int num_blocks = blocks + 3;
    std::vector<unsigned> tables(S * max_blocks, 0), pos, tseq;
    int nxt = 0;
    for (int si = 0; si < S; ++si) {
        for (int j = 0; j < (seqs[si].cached + seqs[si].queried + bs - 1) / bs; ++j)
            tables[si * max_blocks + j] = (unsigned)((nxt++ * 7 + 3) % num_blocks);
        for (int p = seqs[si].cached; p < seqs[si].cached + seqs[si].queried; ++p) {
            pos.push_back(p);
            tseq.push_back(si);
        }
    }
    const size_t slots = (size_t)num_blocks * bs, row = (size_t)kvh * D;
    uint64_t s = 4242;
    std::vector<KV> kc(slots * row), vc(slots * row);
    std::vector<double> kd(slots * row), vd(slots * row);  // what attention reads: byte value * scale
    for (size_t i = 0; i < kc.size(); ++i) {
        kc[i].bits = host_encode(f, unit(s) * 4.0f / ks);
        vc[i].bits = host_encode(f, unit(s) * 2.0f / vs);
        kd[i] = (double)(float)((float)host_decode(f, kc[i].bits) * ks);
        vd[i] = (double)(float)((float)host_decode(f, vc[i].bits) * vs);
    }
    std::vector<float> q(pos.size() * H * D);
    for (auto& x : q) x = unit(s) * 2.0f;
    if (only >= 0) {
        q = std::vector<float>(q.begin() + (size_t)only * H * D, q.begin() + (size_t)(only + 1) * H * D);
        pos = {pos[only]};
        tseq = {tseq[only]};
    }
    const int T = (int)pos.size();
    int max_ctx = 0;
    for (unsigned p : pos) max_ctx = std::max(max_ctx, (int)p + 1);
    const int parts = std::min(PA_MAX_SPLITS, (max_ctx + PA_MIN_PART - 1) / PA_MIN_PART);
    std::vector<float> out((size_t)T * H * D, NAN), po((size_t)T * H * parts * D, NAN), pm((size_t)T * H * parts * 2, NAN);
    std::vector<u32> counters((size_t)T * H, 0);
    int pack = 1;
    for (int p = PA_MAX_PACK; p > 1; --p)
        if (gqa % p == 0) {
            pack = p;
            break;
        }
    const float scale = 1.0f / std::sqrt((float)D);
    launch(dim3{(unsigned)T, (unsigned)(H / pack), (unsigned)parts}, dim3{(unsigned)(128 * pack), 1, 1}, [&] {
        if constexpr (std::is_same_v<KV, fp8e4m3_t>)
            paged_attention_partial_fp8e4m3(q.data(), kc.data(), vc.data(), pos.data(), tseq.data(), tables.data(), out.data(), po.data(), pm.data(),
                                            counters.data(), T, H, kvh, D, bs, num_blocks, S, max_blocks, parts, scale, window, ks, vs);
        else
            paged_attention_partial_fp8e5m2(q.data(), kc.data(), vc.data(), pos.data(), tseq.data(), tables.data(), out.data(), po.data(), pm.data(),
                                            counters.data(), T, H, kvh, D, bs, num_blocks, S, max_blocks, parts, scale, window, ks, vs);
    });
    if (want) {
        want->assign(out.size(), 0.0);
        for (int t = 0; t < T; ++t)
            for (int h = 0; h < H; ++h) {
                const int kh = h / gqa;
                const unsigned* tab = &tables[tseq[t] * max_blocks];
                const unsigned lo = window > 0 && (int)pos[t] + 1 > window ? pos[t] + 1 - window : 0;
                std::vector<double> sc(pos[t] + 1, 0.0);
                double mx = -INFINITY, den = 0;
                for (unsigned j = lo; j <= pos[t]; ++j) {
                    const size_t at = ((size_t)tab[j / bs] * bs + j % bs) * row + kh * D;
                    double d = 0;
                    for (int i = 0; i < D; ++i) d += (double)q[((size_t)t * H + h) * D + i] * kd[at + i];
                    mx = std::max(mx, sc[j] = d * scale);
                }
                for (unsigned j = lo; j <= pos[t]; ++j) den += (sc[j] = std::exp(sc[j] - mx));
                for (unsigned j = lo; j <= pos[t]; ++j) {
                    const size_t at = ((size_t)tab[j / bs] * bs + j % bs) * row + kh * D;
                    for (int i = 0; i < D; ++i) (*want)[((size_t)t * H + h) * D + i] += sc[j] / den * vd[at + i];
                }
            }
    }
    bool zero = true;
    for (u32 c : counters) zero &= c == 0;
    if (!zero) out.assign(out.size(), NAN);  // a launch must leave its counters 0
    return out;
}

template <typename KV>
inline void attention_cases(const Check& check, const Format& f) {
    struct Case {
        int bs, kvh, gqa, D;
        std::vector<Seq> seqs;
        int window;
        float ks, vs;
    };
    const std::vector<Case> cases = {
        {16, 2, 1, 64, {{0, 1}, {14, 1}, {99, 1}}, 0, 1.0f, 1.0f},                // decodes, mid-block ends
        {16, 1, 4, 128, {{20, 13}, {5, 40}, {600, 1}}, 0, 0.05f, 0.03f},         // prefill chunks, GQA 4, split path, scales
        {32, 2, 3, 96, {{290, 17}, {700, 1}}, 100, 2.0f, 0.5f},                   // a window, GQA 3, head_dim 96
        {16, 1, 2, 256, {{40, 2}}, 0, 1.0f, 1.0f},                                // head_dim > 128
    };
    for (const Case& c : cases) {
        std::string name = std::string("paged_attention_partial_fp8") + f.name + " bs=" + std::to_string(c.bs) + " kvh=" + std::to_string(c.kvh) +
                           " gqa=" + std::to_string(c.gqa) + " D=" + std::to_string(c.D) + " window=" + std::to_string(c.window) +
                           " scales " + std::to_string(c.ks) + "/" + std::to_string(c.vs);
        std::vector<double> want;
        const auto got = attention<KV>(f, c.bs, c.kvh, c.gqa, c.D, c.seqs, c.window, c.ks, c.vs, &want);
        double num = 0, den = 0;
        bool finite = true;
        for (size_t i = 0; i < want.size(); ++i) {
            finite &= std::isfinite(got[i]);
            num += (got[i] - want[i]) * (got[i] - want[i]);
            den += want[i] * want[i];
        }
        const double nmse = num / den;
        char nm[32];
        std::snprintf(nm, sizeof nm, "%.2e", nmse);
        check(name + ": against f64 over the decoded cache, NMSE " + nm + " <= 1e-11", finite && nmse <= 1e-11);
        // Each token alone: the bits it has in the batch (decodes and chunk tokens alike).
        bool eq = true;
        int T = 0;
        for (auto [ca, qu] : c.seqs) T += qu;
        const size_t per = (size_t)c.kvh * c.gqa * c.D;
        for (int t = 0; t < T; t += (T > 8 ? 5 : 1)) {
            const auto alone = attention<KV>(f, c.bs, c.kvh, c.gqa, c.D, c.seqs, c.window, c.ks, c.vs, nullptr, t);
            eq &= std::memcmp(alone.data(), got.data() + t * per, per * 4) == 0;
        }
        check(name + ": each token alone has its bits in the batch", eq);
    }
}

inline void run_all(const Check& check) {
    codec(check);
    kv_write_case<fp8e4m3_t>(check, E4M3, 1.0f, 1.0f);
    kv_write_case<fp8e4m3_t>(check, E4M3, 0.37f, 3.0f);
    kv_write_case<fp8e5m2_t>(check, E5M2, 1.0f, 1.0f);
    kv_write_case<fp8e5m2_t>(check, E5M2, 0.0123f, 17.25f);
    attention_cases<fp8e4m3_t>(check, E4M3);
    attention_cases<fp8e5m2_t>(check, E5M2);
}
}  // namespace kvfp8test
