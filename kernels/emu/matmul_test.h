// matmul_test.h — the matmul kernels of kernels/matmul.cu on the emulator, launched the way
// crates/cuda/src/matmul.rs launches them (`gemm` mirrors its `gemm`; `k_slices` mirrors its
// `k_slices`, and both sides test the same table of values).
//
// Bounds, per output element, with p_k = xr_k * w_k the products of the ROUNDED operands
// (xr = x rounded to the weight format exactly as matmul_x does), P = sum |p_k| + |bias|:
//   tight:  |got - sum p_k - bias| <= (k + slices + 2) * 2^-24 * P * 1.01
//     every product is exact in f32 (16-bit significands), so only the f32 adds round: at most
//     k adds inside the mmas (zero-padded steps add exact zeros), slices - 1 folds, one bias
//     add; each add errs by at most 2^-24 of a partial sum, and every partial sum is <= P.
//   loose:  |got - sum x_k w_k - bias| <= tight + u * sum |x_k w_k| + 2^-25 * sum |w_k|  (f16)
//     x rounds with relative error u = 2^-9 (bf16) or 2^-11 (f16, normal range), plus an
//     absolute 2^-25 for f16 subnormals; the weights are stored values, not rounded here.
// Bitwise: the contract says a row's bits never depend on the other rows; row r is compared
// byte for byte across batch sizes that take different kernels (m16 / m64 / m128) and the
// split (workspace fold) and in-block (register fold) paths.
#pragma once
#include <algorithm>
#include <functional>
#include <string>

namespace mmtest {
using Check = std::function<void(const std::string&, bool)>;

struct Slices {
    int count, len;
};
// crates/cuda/src/matmul.rs `k_slices`: a function of (n, k) only.
inline Slices k_slices(int n, int k) {
    const int target_blocks = 264, min_slice = 256;
    const int n_tiles = (n + 63) / 64;
    const int want = (target_blocks + n_tiles - 1) / n_tiles;
    const int by_k = std::max(1, k / min_slice);
    int s = std::min(want, by_k);
    const int per = (k + s - 1) / s;
    const int len = std::max(32, (per + 31) / 32 * 32);
    s = std::max(1, (k + len - 1) / len);
    return {s, len};
}

inline uint64_t rng = 99;
inline float rnd() {  // splitmix64 -> [-1, 1)
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

// The variants the GPU check times (matmul.rs `GemmVariants`, TANDEM_CUDA_GEMM_LARGE / _MID /
// _SMALL): large 0 = m128, 1 = m128_n128, 2 = m128_occ2 (the default), 3 = m128_w64; mid 0 = m64,
// 1 = m64_occ4 (the default); small 0 = m16 (the default), 1 = m16_s8, 2 = m16_gemv4,
// 3 = m16_gemv8 (k % 8 == 0 only: elsewhere m16, as the launcher falls back), 4 = m16_x1.
// emu_test.cpp runs the
// matmul, fused and act16 tests with the defaults, then once per other set of variants.
inline int large_variant = 2, mid_variant = 1, small_variant = 0;
// The output tile's width the epilogue needs (matmul.rs `rope_tile_cols`): 128 only for the
// rope epilogue at a head_dim that does not divide 64, so every head lies in one tile.
inline int tile_cols(const Epilogue& ep, const RopeKv& rk) { return ep.kind == EPI_QKV_ROPE && rk.head_dim > 0 && 64 % rk.head_dim != 0 ? 128 : 64; }
struct Tile {
    int bm, bn;
    const char* suffix;
};
// The tile kernel for m rows when the epilogue needs tiles `cols` wide (matmul.rs `gemm_kernel_of`).
inline Tile pick_tile(int m, int cols, bool k8 = true) {
    if (m <= 16 && cols != 128 && small_variant == 4) return Tile{16, 64, "m16_x1"};
    if (m <= 16 && cols != 128 && small_variant >= 2 && k8)  // the GEMV variants need 16-byte aligned weight rows
        return small_variant == 2 ? Tile{16, 64, "m16_gemv4"} : Tile{16, 64, "m16_gemv8"};
    if (m <= 16) return cols == 128 ? Tile{16, 128, "m16_n128"} : small_variant == 1 ? Tile{16, 64, "m16_s8"} : Tile{16, 64, "m16"};
    if (m <= 128) return cols == 128 ? Tile{64, 128, "m64_n128"} : mid_variant == 1 ? Tile{64, 64, "m64_occ4"} : Tile{64, 64, "m64"};
    if (large_variant == 1) return Tile{128, 128, "m128_n128"};
    if (large_variant == 3) return Tile{128, 128, "m128_w64"};
    if (cols == 128) return Tile{64, 128, "m64_n128"};
    return large_variant == 2 ? Tile{128, 64, "m128_occ2"} : Tile{128, 64, "m128"};
}

// One GEMM launched as matmul.rs `gemm` launches it: x f32 read by the tile kernel itself
// for m <= 128 (else matmul_x first), split K folded in-kernel by the last slice's block through
// `counters` (zeroed once, as the backend zeroes them at load; each launch must leave them 0
// again, checked here). `legacy` is the former two-launch path, the oracle: matmul_x, the tile
// kernel writing partials only (counters null), then matmul_fold (plain epilogue only).
// Returns false when a counter was left nonzero.
// With x16, x is stored in the weight's 16-bit format ([m, k], the backend's activation
// storage): x is not read, the tile kernel takes x16 as xa with kp = k, for every m.
inline bool gemm(int dt, const float* x, const uint16_t* w, const uint16_t* bias, int m, int n, int k, Slices sl, const Epilogue& ep, bool legacy,
                 std::string* kernel = nullptr, NormIn nm = NormIn{nullptr, 0, 0.0f}, RopeKv rk = RopeKv{}, const uint16_t* x16 = nullptr) {
    const int kp = x16 ? k : (k + 7) / 8 * 8;
    const Tile tile = pick_tile(m, tile_cols(ep, rk), k % 8 == 0);
    const int bn = tile.bn, bm = tile.bm;
    const std::string suffix = tile.suffix;
    const bool direct = !legacy && m <= 128 && !x16;
    std::vector<uint16_t> xa((size_t)m * kp + 8, 0xffff);
    if (!direct && !x16)
        launch(dim3{(unsigned)m, 1, 1}, dim3{256, 1, 1}, [&] {
            if (dt == 1) matmul_x_bf16(x, xa.data(), m, k, kp);
            else matmul_x_f16(x, xa.data(), m, k, kp);
        });
    const bool split = m <= 128 && sl.count > 1;
    const unsigned z = split ? (unsigned)sl.count : 1;
    std::vector<float> part(split ? (size_t)sl.count * m * n : 1, NAN);
    const dim3 grid{(unsigned)((n + bn - 1) / bn), (unsigned)((m + bm - 1) / bm), z};
    std::vector<u32> counters((size_t)grid.x * grid.y, 0);
    const int bias_code = bias ? dt + 1 : 0;  // load_bias: 2 bf16, 3 f16
    const void* bp = bias ? (const void*)bias : (const void*)w;
    float* pp = part.data();
    u32* cp = legacy ? nullptr : counters.data();
    const u16* xp = x16 ? x16 : xa.data();
    const float* xd = direct ? x : nullptr;
    const std::string name = std::string("matmul_tc_") + (dt == 1 ? "bf16" : "f16") + "_" + suffix;
    if (kernel) *kernel = name + (split ? " split " + std::to_string(sl.count) : " slices " + std::to_string(sl.count)) + (legacy ? " two-launch" : "");
#define MM_CALL(DT, NAME, SHAPE)                                                                                              \
    launch(grid, dim3{SHAPE::THREADS, 1, 1}, [&] { matmul_tc_##DT##_##NAME(xd, xp, w, bp, bias_code, ep.out0, ep.out1, ep.out2, ep.kind, ep.n0, ep.n1, ep.gamma, ep.gamma_dtype, ep.act16, pp, cp, m, n, k, kp, sl.len, sl.count, nm.gamma, nm.dtype, nm.eps, rk); }, \
           SHAPE::SMEM_BYTES)
#define MM_PICK(NAME, SHAPE)                           \
    if (suffix == #NAME) {                             \
        if (dt == 1) MM_CALL(bf16, NAME, SHAPE);       \
        else MM_CALL(f16, NAME, SHAPE);                \
    }
    MM_PICK(m16, GemmM16)
    MM_PICK(m64, GemmM64)
    MM_PICK(m128, GemmM128)
    MM_PICK(m16_n128, GemmM16N128)
    MM_PICK(m64_n128, GemmM64N128)
    MM_PICK(m128_n128, GemmM128N128)
    MM_PICK(m128_occ2, GemmM128Occ2)
    MM_PICK(m64_occ4, GemmM64Occ4)
    MM_PICK(m16_s8, GemmM16S8)
    MM_PICK(m128_w64, GemmM128W64)
#undef MM_PICK
#define MM_GEMV(DT, NAME, SHAPE)                                                                                              \
    launch(grid, dim3{SHAPE::THREADS, 1, 1}, [&] { matmul_tc_##DT##_##NAME(xd, xp, w, bp, bias_code, ep.out0, ep.out1, ep.out2, ep.kind, ep.n0, ep.n1, ep.gamma, ep.gamma_dtype, ep.act16, pp, cp, m, n, k, kp, sl.len, sl.count, nm.gamma, nm.dtype, nm.eps, rk); }, \
           gemv_smem_bytes<SHAPE>(m, k, sl.len, split))
#define MM_PICK(NAME, SHAPE)                           \
    if (suffix == #NAME) {                             \
        if (dt == 1) MM_GEMV(bf16, NAME, SHAPE);       \
        else MM_GEMV(f16, NAME, SHAPE);                \
    }
    MM_PICK(m16_gemv4, GemvD4)
    MM_PICK(m16_gemv8, GemvD8)
    MM_PICK(m16_x1, GemvX1)
#undef MM_PICK
#undef MM_GEMV
#undef MM_CALL
    if (split && legacy)
        launch(dim3{(unsigned)(((size_t)m * n + 255) / 256), 1, 1}, dim3{256, 1, 1},
               [&] { matmul_fold(pp, bp, bias_code, ep.out0, m, n, sl.count); });
    return std::all_of(counters.begin(), counters.end(), [](u32 c) { return c == 0; });
}

inline bool counters_ok = true;  // every gemm() so far left its counters at 0

// dt: 1 bf16, 2 f16. Returns out [m, n]; `kernel` names the tile kernel it took.
inline std::vector<float> run(int dt, const float* x, const uint16_t* w, const uint16_t* bias, int m, int n, int k, std::string* kernel = nullptr,
                              bool legacy = false) {
    std::vector<float> out((size_t)m * n, NAN);
    const Epilogue ep{out.data(), nullptr, nullptr, EPI_PLAIN, 0, 0};
    counters_ok = gemm(dt, x, w, bias, m, n, k, k_slices(n, k), ep, legacy, kernel) && counters_ok;
    return out;
}

struct Problem {
    int dt, m, n, k;
    bool bias;
    std::vector<float> x;
    std::vector<uint16_t> w, b;
};
inline Problem problem(int dt, int m, int n, int k, bool bias) {
    Problem p{dt, m, n, k, bias, {}, {}, {}};
    const float ws = 1.0f / std::sqrt((float)k);
    for (size_t i = 0; i < (size_t)n * k; ++i) p.w.push_back((dt == 1 ? f32_to_bf16_bits(rnd() * ws) : f32_to_f16_bits(rnd() * ws)));
    if (bias)
        for (int i = 0; i < n; ++i) p.b.push_back(dt == 1 ? f32_to_bf16_bits(rnd() * 0.5f) : f32_to_f16_bits(rnd() * 0.5f));
    p.x.resize((size_t)m * k);
    for (auto& v : p.x) v = rnd();
    return p;
}
inline float wval(int dt, uint16_t h) { return dt == 1 ? bf16_bits_to_f32(h) : f16_bits_to_f32(h); }
inline float xround(int dt, float v) { return wval(dt, dt == 1 ? f32_to_bf16_bits(v) : f32_to_f16_bits(v)); }

// got [m, n] of problem p (computed with `slices` K slices) against f64, with the bounds above.
inline void check_f64(const Check& check, const std::string& kernel, const Problem& p, const std::vector<float>& got, int slices) {
    const double u = p.dt == 1 ? 0x1p-9 : 0x1p-11;
    double worst_tight = 0, worst_loose = 0, num = 0, den = 0;
    bool finite = true;
    for (int r = 0; r < p.m; ++r)
        for (int c = 0; c < p.n; ++c) {
            const double b = p.bias ? wval(p.dt, p.b[c]) : 0.0;
            double sr = b, su = b, mag_r = std::fabs(b), mag_u = 0, mag_w = 0;
            for (int kk = 0; kk < p.k; ++kk) {
                const double w = wval(p.dt, p.w[(size_t)c * p.k + kk]), xv = p.x[(size_t)r * p.k + kk];
                const double xr = xround(p.dt, (float)xv);
                sr += xr * w;
                su += xv * w;
                mag_r += std::fabs(xr * w);
                mag_u += std::fabs(xv * w);
                mag_w += std::fabs(w);
            }
            const double g = got[(size_t)r * p.n + c];
            finite = finite && std::isfinite(g);
            const double tight = (p.k + slices + 2) * 0x1p-24 * mag_r * 1.01;
            const double loose = tight + u * mag_u + (p.dt == 2 ? 0x1p-25 * mag_w : 0.0);
            worst_tight = std::max(worst_tight, std::fabs(g - sr) / tight);
            worst_loose = std::max(worst_loose, std::fabs(g - su) / loose);
            num += (g - su) * (g - su);
            den += su * su;
        }
    char buf[320];
    std::snprintf(buf, sizeof buf, "%s m=%d n=%d k=%d%s: |err|/bound rounded %.3f, unrounded %.3f, NMSE vs f32 inputs %.2e", kernel.c_str(), p.m,
                  p.n, p.k, p.bias ? " bias" : "", worst_tight, worst_loose, num / (den > 0 ? den : 1));
    check(buf, finite && worst_tight <= 1.0 && worst_loose <= 1.0);
}

// The launch path (x read in-kernel for m <= 128, in-kernel fold) against f64, and bitwise
// against the former two-launch path (matmul_x + tile kernel + matmul_fold).
// (break_test.cpp's builds break both paths alike, so they skip the bitwise half.)
inline void against_f64(const Check& check, const Problem& p, bool vs_two_launch = true) {
    std::string kernel;
    auto got = run(p.dt, p.x.data(), p.w.data(), p.bias ? p.b.data() : nullptr, p.m, p.n, p.k, &kernel);
    check_f64(check, kernel, p, got, k_slices(p.n, p.k).count);
    if (!vs_two_launch) return;
    auto old = run(p.dt, p.x.data(), p.w.data(), p.bias ? p.b.data() : nullptr, p.m, p.n, p.k, nullptr, true);
    check(kernel + " m=" + std::to_string(p.m) + " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k) +
              ": bitwise equal to matmul_x + tile kernel + matmul_fold (x in-kernel, fold in-kernel)",
          std::memcmp(got.data(), old.data(), sizeof(float) * got.size()) == 0);
}

// Row r of every batch (and alone, m = 1) has the same bytes.
inline void rows_bitwise(const Check& check, int dt, int n, int k) {
    Problem p = problem(dt, 777, n, k, true);
    const float* x = p.x.data();
    const uint16_t *w = p.w.data(), *b = p.b.data();
    std::vector<std::pair<int, std::vector<float>>> batches;
    std::string kinds;
    for (int m : {7, 17, 64, 200, 777}) {
        std::string kernel;
        batches.push_back({m, run(dt, x, w, b, m, n, k, &kernel)});
        kinds += " " + std::to_string(m) + ":" + kernel.substr(kernel.rfind('_') + 1);
    }
    bool same = true;
    int compared = 0;
    for (int r : {0, 3, 6, 16, 63, 150, 199, 776}) {
        std::string kernel;
        const auto alone = run(dt, x + (size_t)r * k, w, b, 1, n, k, &kernel);
        for (auto& [m, out] : batches)
            if (r < m) {
                same = same && std::memcmp(alone.data(), out.data() + (size_t)r * n, sizeof(float) * n) == 0;
                ++compared;
            }
    }
    check("matmul rows bitwise equal alone (m=1) and in batches of m=7..777 (" + std::to_string(compared) + " row pairs, n=" + std::to_string(n) +
              " k=" + std::to_string(k) + ", slices " + std::to_string(k_slices(n, k).count) + "," + kinds + ")",
          same);
}

inline void slices_table(const Check& check) {
    // The same table is asserted by crates/cuda/src/matmul.rs `k_slices_depend_on_n_and_k_only`.
    struct Row {
        int n, k, count, len;
    };
    const Row rows[] = {{72, 40, 1, 64}, {72, 1000, 3, 352}, {200, 1000, 3, 352}, {2048, 2048, 8, 256}, {128256, 2048, 1, 2048}, {4096, 14336, 5, 2880}, {72, 0, 1, 32}};
    bool ok = true;
    for (auto r : rows) {
        const Slices s = k_slices(r.n, r.k);
        ok = ok && s.count == r.count && s.len == r.len;
        if (s.count != r.count || s.len != r.len) std::printf("  k_slices(%d, %d) = (%d, %d), table says (%d, %d)\n", r.n, r.k, s.count, s.len, r.count, r.len);
    }
    check("matmul k_slices matches the table shared with matmul.rs", ok);
    // matmul.rs GEMM_M16 / GEMM_M64 / GEMM_M128 launch with these threads and dynamic smem.
    check("matmul tile kernels' threads and shared memory match matmul.rs GEMM_M*",
          GemmM16::THREADS == 128 && GemmM16::SMEM_BYTES == 25600 && GemmM64::THREADS == 128 && GemmM64::SMEM_BYTES == 40960 &&
              GemmM128::THREADS == 256 && GemmM128::SMEM_BYTES == 46080 && GemmM16N128::THREADS == 256 && GemmM16N128::SMEM_BYTES == 46080 &&
              GemmM64N128::THREADS == 256 && GemmM64N128::SMEM_BYTES == 46080 && GemmM16N128::BN == 128 && GemmM64N128::BN == 128 &&
              GemmM128N128::THREADS == 256 && GemmM128N128::SMEM_BYTES == 147456 && GemmM128N128::BN == 128 && GemmM128Occ2::THREADS == 256 &&
              GemmM128Occ2::SMEM_BYTES == 94208 && GemmM64Occ4::THREADS == 128 && GemmM64Occ4::SMEM_BYTES == 47104 &&
              GemmM16S8::THREADS == 128 && GemmM16S8::SMEM_BYTES == 51200);
    check("matmul m128_w64's threads and shared memory match matmul.rs GEMM_M128_W64",
          GemmM128W64::THREADS == 128 && GemmM128W64::SMEM_BYTES == 188416 && GemmM128W64::BN == 128 && GemmM128W64::BM == 128);
    // matmul.rs `gemv_smem` (test `gemv_variants_plan`) computes the GEMV variants' shared memory per launch so.
    check("matmul GEMV variants' threads and shared memory per launch match matmul.rs gemv_smem",
          GemvD4::THREADS == 128 && GemvD8::THREADS == 128 && gemv_smem_bytes<GemvD4>(1, 2048, 256, true) == 4688 &&
              gemv_smem_bytes<GemvD4>(16, 2048, 2048, false) == 69952 && gemv_smem_bytes<GemvD8>(7, 1000, 352, true) == 9200 &&
              gemv_smem_bytes<GemvD8>(3, 40, 64, false) == 4592 && GemvX1::THREADS == 128 && gemv_smem_bytes<GemvX1>(1, 2048, 256, true) == 25168 &&
              gemv_smem_bytes<GemvX1>(16, 1001, 352, true) == 36160);
}

// k = 0: no k tile at all; out must be exactly the bias (or zero).
inline void empty_k(const Check& check) {
    Problem p = problem(1, 3, 72, 0, true);
    const auto got = run(1, p.x.data(), p.w.data(), p.b.data(), 3, 72, 0);
    bool ok = true;
    for (int r = 0; r < 3; ++r)
        for (int c = 0; c < 72; ++c) ok = ok && got[(size_t)r * 72 + c] == bf16_bits_to_f32(p.b[c]);
    check("matmul k=0 gives exactly the bias", ok);
}

inline void run_all(const Check& check) {
    slices_table(check);
    empty_k(check);
    // m = 1, 7, 16, 17, 64, 200, 777 over awkward n and k (none a multiple of the 64-column
    // tile; k = 1001 and 999 break 16-byte alignment; k = 1000 and 999 split into 3 slices).
    against_f64(check, problem(1, 1, 72, 40, false));
    against_f64(check, problem(1, 7, 200, 1001, true));
    against_f64(check, problem(1, 16, 72, 1000, true));
    against_f64(check, problem(1, 17, 200, 136, false));
    against_f64(check, problem(1, 64, 72, 999, true));
    against_f64(check, problem(1, 200, 200, 136, true));
    against_f64(check, problem(1, 777, 72, 40, true));
    against_f64(check, problem(2, 7, 72, 1000, true));
    against_f64(check, problem(2, 17, 72, 37, false));
    against_f64(check, problem(2, 200, 72, 1000, true));
    rows_bitwise(check, 1, 72, 1000);
    rows_bitwise(check, 2, 72, 136);
    check("matmul: every launch left its split-K arrival counters at 0 (ready for the next)", counters_ok);
}
}  // namespace mmtest
