// primitives_test.h — checks the emulation of the warp-collective and asynchronous primitives
// (kernels/emu/cuda_emu.h through the common.cuh wrappers) against the PTX ISA's definitions,
// written out here independently of the emulator: typed shuffles, ldmatrix x1/x2/x4 (.trans),
// mma.sync m16n8k16 bf16/f16 (fragment layouts, exact products, f32 accumulation in ascending
// k), cp.async (poisoned until its wait_group, zero fill) and the poisoned dynamic smem arena.
// Included by emu_test.cpp; reports through the `check(name, ok)` it is given.
#pragma once
#include <functional>
#include <string>

namespace primtest {
using Check = std::function<void(const std::string&, bool)>;

inline uint16_t bf16_of(float f) { return f32_to_bf16_bits(f); }

inline void shuffles(const Check& check) {
    std::vector<unsigned> u(32);
    std::vector<int> iv(32);
    std::vector<float> fv(32);
    launch(dim3{1, 1, 1}, dim3{32, 1, 1}, [&] {
        const unsigned l = threadIdx.x;
        u[l] = __shfl_xor_sync(0xffffffffu, 0x80000000u | (l * 7u), 5);
        iv[l] = __shfl_sync(0xffffffffu, -(int)l - 1, (int)(31 - l));
        fv[l] = __shfl_down_sync(0xffffffffu, (float)l + 0.5f, 3u);
    });
    bool ok = true;
    for (unsigned l = 0; l < 32; ++l) {
        ok = ok && u[l] == (0x80000000u | ((l ^ 5u) * 7u));
        ok = ok && iv[l] == -(int)(31 - l) - 1;
        ok = ok && fv[l] == (l + 3 < 32 ? (float)(l + 3) + 0.5f : (float)l + 0.5f);
    }
    check("emu: typed shuffles (u32 xor, int indexed, float down) carry all 32 bits", ok);
}

// A 32 x 8 matrix of distinct u16 in dynamic shared memory, rows 16-byte aligned; matrix j of
// an ldmatrix is rows 8j .. 8j+7, each lane pointing at row `lane`.
inline void ldmatrix_layouts(const Check& check) {
    for (int num : {1, 2, 4})
        for (bool trans : {false, true}) {
            std::vector<uint32_t> got(32 * 4, 0);
            launch(
                dim3{1, 1, 1}, dim3{32, 1, 1},
                [&] {
                    TANDEM_DYNAMIC_SMEM(raw);
                    uint16_t* M = reinterpret_cast<uint16_t*>(raw);
                    const unsigned l = threadIdx.x;
                    for (int c = 0; c < 8; ++c) M[l * 8 + c] = (uint16_t)(1000 + l * 8 + c);
                    __syncthreads();
                    u32 r[4] = {0, 0, 0, 0};
                    const void* row = M + l * 8;
                    if (num == 1 && !trans) ldmatrix_x1(r[0], row);
                    if (num == 1 && trans) ldmatrix_x1_trans(r[0], row);
                    if (num == 2 && !trans) ldmatrix_x2(*reinterpret_cast<u32(*)[2]>(r), row);
                    if (num == 2 && trans) ldmatrix_x2_trans(*reinterpret_cast<u32(*)[2]>(r), row);
                    if (num == 4 && !trans) ldmatrix_x4(r, row);
                    if (num == 4 && trans) ldmatrix_x4_trans(r, row);
                    for (int j = 0; j < 4; ++j) got[l * 4 + j] = r[j];
                },
                32 * 8 * 2);
            bool ok = true;
            for (unsigned l = 0; l < 32; ++l)
                for (int j = 0; j < num; ++j) {
                    // PTX: lane l holds row l/4, elements 2(l%4) and 2(l%4)+1 of each 8x8 matrix;
                    // .trans delivers the transposed matrix the same way.
                    const unsigned g = l / 4, t = l % 4;
                    auto at = [&](unsigned row, unsigned col) { return (uint32_t)(1000 + (8 * j + row) * 8 + col); };
                    const uint32_t lo = trans ? at(2 * t, g) : at(g, 2 * t), hi = trans ? at(2 * t + 1, g) : at(g, 2 * t + 1);
                    ok = ok && got[l * 4 + j] == (lo | (hi << 16));
                }
            check("emu: ldmatrix .x" + std::to_string(num) + (trans ? ".trans" : "") + " gives the PTX ISA fragment", ok);
        }
}

// mma m16n8k16: fragments built from the PTX ISA's formulas; D = A B + C compared bitwise with
// a sequential f32 sum in ascending k (the emulator's stated assumption) and with f64.
template <typename T>
inline void mma_layout(const Check& check, const char* name, uint64_t seed) {
    uint64_t s = seed;
    auto rnd = [&] {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return (float)((s >> 40) & 0xffffff) / 16777216.0f * 4.0f - 2.0f;
    };
    uint16_t A[16][16], B[16][8];
    float C[16][8];
    for (auto& r : A)
        for (auto& v : r) v = f32_to_bits(T{}, rnd());
    for (auto& r : B)
        for (auto& v : r) v = f32_to_bits(T{}, rnd());
    for (auto& r : C)
        for (auto& v : r) v = rnd();
    auto val = [](uint16_t h) { return to_f32(T{h}); };
    float D[16][8];
    launch(dim3{1, 1, 1}, dim3{32, 1, 1}, [&] {
        const int l = (int)threadIdx.x, g = l >> 2, t = l & 3;
        u32 a[4], b[2];
        float d[4];
        for (int reg = 0; reg < 4; ++reg) {  // a_{2 reg}, a_{2 reg + 1}
            const int i = 2 * reg;
            const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
            const int col = t * 2 + (i >= 4 ? 8 : 0);
            a[reg] = (u32)A[row][col] | ((u32)A[row][col + 1] << 16);
        }
        for (int reg = 0; reg < 2; ++reg) {  // b_{2 reg}, b_{2 reg + 1}: row (k) 2t (+8), col g
            const int row = t * 2 + (reg ? 8 : 0);
            b[reg] = (u32)B[row][g] | ((u32)B[row + 1][g] << 16);
        }
        for (int i = 0; i < 4; ++i) d[i] = C[i < 2 ? g : g + 8][2 * t + (i & 1)];
        mma_16816(T{}, d, a, b);
        for (int i = 0; i < 4; ++i) D[i < 2 ? g : g + 8][2 * t + (i & 1)] = d[i];
    });
    bool bitwise = true, close = true;
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 8; ++c) {
            float seq = C[r][c];
            double exact = C[r][c], mag = std::fabs(C[r][c]);
            for (int kk = 0; kk < 16; ++kk) {
                seq = seq + val(A[r][kk]) * val(B[kk][c]);
                exact += (double)val(A[r][kk]) * val(B[kk][c]);
                mag += std::fabs((double)val(A[r][kk]) * val(B[kk][c]));
            }
            bitwise = bitwise && std::memcmp(&seq, &D[r][c], 4) == 0;
            close = close && std::fabs(D[r][c] - exact) <= 17 * 0x1p-24 * mag;
        }
    check(std::string("emu: mma m16n8k16 ") + name + " = sequential f32 sum over ascending k (bitwise)", bitwise);
    check(std::string("emu: mma m16n8k16 ") + name + " within 17 f32 roundings of the f64 product", close);
}

inline void cp_async_groups(const Check& check) {
    alignas(16) static float src[3][4] = {{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}};
    bool before = true, partial = true, after = true, zero = true;
    launch(
        dim3{1, 1, 1}, dim3{32, 1, 1},
        [&] {
            TANDEM_DYNAMIC_SMEM(raw);
            float* dst = reinterpret_cast<float*>(raw);
            if (threadIdx.x == 0) {
                bool fresh = true;
                for (int i = 0; i < 16; ++i) fresh = fresh && std::isnan(dst[i]);
                before = before && fresh;  // the arena starts poisoned
                cp_async_cg16(dst, src[0], 16);
                cp_async_commit();
                cp_async_ca16(dst + 4, src[1], 16);
                cp_async_commit();
                cp_async_cg16(dst + 8, src[2], 0);  // src-size 0: zero fill
                cp_async_commit();
                for (int i = 0; i < 12; ++i) before = before && std::isnan(dst[i]);
                cp_async_wait<2>();  // only the oldest group is guaranteed
                partial = dst[0] == 1 && dst[3] == 4 && std::isnan(dst[4]) && std::isnan(dst[8]);
                cp_async_wait<0>();
                after = dst[4] == 5 && dst[7] == 8;
                zero = dst[8] == 0 && dst[11] == 0;
            }
        },
        64);
    check("emu: cp.async destination poisoned (NaN) until its wait_group", before);
    check("emu: cp.async wait_group 2 completes only the oldest of 3 groups", partial);
    check("emu: cp.async wait_group 0 completes everything", after);
    check("emu: cp.async src-size 0 fills zeros", zero);
}

inline void run_all(const Check& check) {
    shuffles(check);
    ldmatrix_layouts(check);
    mma_layout<bf16_t>(check, "bf16", 1);
    mma_layout<f16_t>(check, "f16", 2);
    cp_async_groups(check);
}
}  // namespace primtest
