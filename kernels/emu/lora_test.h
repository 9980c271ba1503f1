// lora_test.h — the segmented LoRA update of kernels/lora.cu (lora_shrink_*, lora_expand) on the
// emulator, launched as crates/cuda/src/lora.rs launches them, against
//   - f64 over the same (rounded) inputs (NMSE);
//   - the host loop's expand order (crates/core/src/lora/segmented.rs `lora_rows`): y bitwise,
//     given the kernel's shrink;
//   - rows with no slot (NO_SLOT, or a slot >= max_loras): y bitwise unchanged;
//   - itself across batch compositions: row t alone, and the rows reversed: bitwise.
// Shapes: one row, a few, 37; slots of a rank below max_rank (zeros past it); max_rank not a
// multiple of the 8 warps of a shrink block; x stored as f32, bf16 or f16, rounded to bf16.
#pragma once
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace loratest {
using Check = std::function<void(const std::string&, bool)>;
constexpr u32 NO_SLOT = 0xffffffffu;

struct Problem {
    int T, in, out, L, R, xdt, round_code;  // xdt: 0 f32, 1 bf16, 2 f16 storage of x
    std::vector<float> x, a, b, scales, y;   // x: the stored values, widened
    std::vector<u32> slots;
};

inline float stored(int dt, float v) {
    if (dt == 1) return bf16_bits_to_f32(f32_to_bf16_bits(v));
    if (dt == 2) return f16_bits_to_f32(f32_to_f16_bits(v));
    return v;
}

inline Problem make(int T, int in, int out, int L, int R, int xdt, int round_code) {
    Problem p{T, in, out, L, R, xdt, round_code, {}, {}, {}, {}, {}, {}};
    p.a.assign((size_t)L * R * in, 0.0f);
    p.b.assign((size_t)L * out * R, 0.0f);
    for (int s = 0; s < L; ++s) {
        const int rank = s == 0 ? R : 1 + (int)((mmtest::rnd() * 0.5f + 0.5f) * (R - 1));
        for (int j = 0; j < rank; ++j) {
            for (int k = 0; k < in; ++k) p.a[((size_t)s * R + j) * in + k] = mmtest::rnd() / std::sqrt((float)in);
            for (int o = 0; o < out; ++o) p.b[((size_t)s * out + o) * R + j] = mmtest::rnd();
        }
    }
    for (int s = 0; s < L; ++s) p.scales.push_back(0.5f + 2.0f * (mmtest::rnd() * 0.5f + 0.5f));
    for (int t = 0; t < T; ++t) {
        const float u = mmtest::rnd();
        p.slots.push_back(u < -0.5f ? NO_SLOT : t == 1 ? (u32)L : (u32)((u * 0.5f + 0.5f) * L) % (u32)L);
    }
    for (size_t i = 0; i < (size_t)T * in; ++i) p.x.push_back(stored(xdt, mmtest::rnd()));
    for (size_t i = 0; i < (size_t)T * out; ++i) p.y.push_back(mmtest::rnd());
    return p;
}

// The two launches of lora.rs over rows [0, T) of x, slots, y (y updated in place); returns shrink.
inline std::vector<float> run(const Problem& p, const float* x, const u32* slots, float* y, int T) {
    std::vector<float> shrink((size_t)T * p.R, NAN);
    const size_t n = (size_t)T * p.in;
    std::vector<bf16_t> xb;
    std::vector<f16_t> xh;
    for (size_t i = 0; i < n && p.xdt == 1; ++i) xb.push_back(bf16_t{f32_to_bf16_bits(x[i])});
    for (size_t i = 0; i < n && p.xdt == 2; ++i) xh.push_back(f16_t{f32_to_f16_bits(x[i])});
    const dim3 gs{(unsigned)((p.R + 7) / 8), (unsigned)T, 1};
    launch(gs, dim3{256, 1, 1}, [&] {
        if (p.xdt == 1) lora_shrink_bf16(xb.data(), p.a.data(), slots, shrink.data(), p.in, p.L, p.R, p.round_code);
        else if (p.xdt == 2) lora_shrink_f16(xh.data(), p.a.data(), slots, shrink.data(), p.in, p.L, p.R, p.round_code);
        else lora_shrink_f32(x, p.a.data(), slots, shrink.data(), p.in, p.L, p.R, p.round_code);
    });
    const dim3 ge{(unsigned)((p.out + 255) / 256), (unsigned)T, 1};
    launch(ge, dim3{256, 1, 1}, [&] { lora_expand(shrink.data(), p.b.data(), slots, p.scales.data(), y, p.out, p.L, p.R); });
    return shrink;
}

inline float rounded(int round_code, float v) { return round_code == 2 ? stored(1, v) : round_code == 3 ? stored(2, v) : v; }

inline void test_case(const Check& check, int T, int in, int out, int L, int R, int xdt, int round_code) {
    const Problem p = make(T, in, out, L, R, xdt, round_code);
    std::vector<float> y = p.y;
    const auto shrink = run(p, p.x.data(), p.slots.data(), y.data(), T);
    char tag[160];
    std::snprintf(tag, sizeof tag, "lora T=%d in=%d out=%d max_loras=%d max_rank=%d x=%s round=%d", T, in, out, L, R,
                  xdt == 0 ? "f32" : xdt == 1 ? "bf16" : "f16", round_code);
    double num = 0, den = 0;
    bool untouched = true, host_order = true;
    for (int t = 0; t < T; ++t) {
        const u32 s = p.slots[t];
        for (int o = 0; o < out; ++o) {
            const size_t i = (size_t)t * out + o;
            if (s >= (u32)L) {
                untouched = untouched && std::memcmp(&y[i], &p.y[i], 4) == 0;
                continue;
            }
            double d = 0;
            for (int j = 0; j < R; ++j) {
                double u = 0;
                for (int k = 0; k < in; ++k)
                    u += (double)rounded(round_code, p.x[(size_t)t * in + k]) * p.a[((size_t)s * R + j) * in + k];
                d += u * p.b[((size_t)s * out + o) * R + j];
            }
            const double want = p.y[i] + p.scales[s] * d;
            num += (y[i] - want) * (y[i] - want);
            den += want * want;
            float acc = 0.0f;
            for (int j = 0; j < R; ++j) acc += shrink[(size_t)t * R + j] * p.b[((size_t)s * out + o) * R + j];
            const float h = p.y[i] + p.scales[s] * acc;
            host_order = host_order && std::memcmp(&h, &y[i], 4) == 0;
        }
    }
    const double e = den > 0 ? num / den : num;
    char buf[320];
    std::snprintf(buf, sizeof buf, "%s: NMSE vs f64 %.2e (limit 1e-10)", tag, e);
    check(buf, std::isfinite(e) && e <= 1e-10);
    check(std::string(tag) + ": rows with no slot keep y's bits", untouched);
    check(std::string(tag) + ": expand gives the host loop's bits", host_order);
    // Batch composition: row t alone, and the rows in reverse order: row t's bytes unchanged.
    bool same = true;
    for (int t : {0, T / 2, T - 1}) {
        std::vector<float> one(p.y.begin() + (size_t)t * out, p.y.begin() + (size_t)(t + 1) * out);
        run(p, &p.x[(size_t)t * in], &p.slots[t], one.data(), 1);
        same = same && std::memcmp(one.data(), &y[(size_t)t * out], 4 * (size_t)out) == 0;
    }
    std::vector<float> xr((size_t)T * in), yr((size_t)T * out);
    std::vector<u32> sr(T);
    for (int t = 0; t < T; ++t) {
        std::copy_n(&p.x[(size_t)(T - 1 - t) * in], in, &xr[(size_t)t * in]);
        std::copy_n(&p.y[(size_t)(T - 1 - t) * out], out, &yr[(size_t)t * out]);
        sr[t] = p.slots[T - 1 - t];
    }
    run(p, xr.data(), sr.data(), yr.data(), T);
    for (int t = 0; t < T; ++t) same = same && std::memcmp(&yr[(size_t)(T - 1 - t) * out], &y[(size_t)t * out], 4 * (size_t)out) == 0;
    check(std::string(tag) + ": a row's bytes alone == in the batch == in the reversed batch", same);
}

inline void run_all(const Check& check) {
    test_case(check, 1, 576, 576, 4, 16, 0, 1);
    test_case(check, 3, 576, 192, 4, 16, 0, 1);
    test_case(check, 37, 1536, 576, 4, 16, 1, 2);   // x stored bf16 (CUDA's activation), read as is
    test_case(check, 37, 576, 300, 2, 8, 0, 2);     // f32 x rounded to bf16 for bf16 A
    test_case(check, 5, 77, 45, 3, 5, 2, 3);        // f16, odd widths, max_rank 5
    test_case(check, 2, 64, 100, 1, 1, 0, 1);
}
}  // namespace loratest
