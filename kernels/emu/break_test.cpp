// break_test.cpp — proves that the emulator tests catch the two bugs tensor-core kernels are
// most prone to: built by run.sh with -DTANDEM_GEMM_BREAK=1 (two B fragments swapped: a wrong
// fragment index) and =2 (the cp.async wait dropped), it runs the matmul checks of
// matmul_test.h on a few shapes and succeeds only if EVERY one of them fails. =3 folds the split
// K in-kernel with the last block's own partial first (arrival order, not index order): within
// every bound, so only the bitwise comparisons with the two-launch fold can catch it. =4 starts
// the shared-memory slice total (TOTAL_SMEM kernels: m > 128 and 17..128 rows by default) from
// unwritten shared memory, which the emulator poisons. =5 makes the gate/up epilogue compute
// silu where it is asked for GeGLU (EPI_GEGLU): fused_test.h's GeGLU checks must all fail.
#include "cuda_emu.h"

#include "../matmul.cu"
#include "../kv_write.cu"
#include "../rms_norm.cu"
#include "../silu_mul.cu"

#include <cstdio>
#include <string>
#include <tuple>

#include "fused_test.h"
#include "matmul_test.h"

int main() {
    int checks = 0, passed = 0;
    auto check = [&](const std::string& what, bool ok) {
        ++checks;
        if (ok) ++passed;
        std::printf("%s %s\n", ok ? "passed (bad: the break went unnoticed)" : "failed (as it must)", what.c_str());
    };
#if TANDEM_GEMM_BREAK == 5
    fusedtest::run_geglu(check);
#elif TANDEM_GEMM_BREAK == 3
    // Only the split path folds in-kernel: m <= 128 with k split into 3 slices.
    for (auto [m, n, k] : {std::tuple{1, 72, 1000}, std::tuple{17, 200, 999}}) {
        mmtest::Problem p = mmtest::problem(1, m, n, k, true);
        auto got = mmtest::run(1, p.x.data(), p.w.data(), p.b.data(), m, n, k);
        auto old = mmtest::run(1, p.x.data(), p.w.data(), p.b.data(), m, n, k, nullptr, true);
        check("in-kernel fold bitwise equal to matmul_fold m=" + std::to_string(m) + " k=" + std::to_string(k),
              std::memcmp(got.data(), old.data(), 4 * got.size()) == 0);
    }
#elif TANDEM_GEMM_BREAK == 4
    // Register-folded slices (z = 1): m > 128, k = 1000 in 3 slices, and one slice.
    mmtest::against_f64(check, mmtest::problem(1, 200, 72, 1000, true), false);
    mmtest::against_f64(check, mmtest::problem(2, 129, 72, 136, false), false);
#else
    mmtest::against_f64(check, mmtest::problem(1, 1, 72, 40, false), false);
    mmtest::against_f64(check, mmtest::problem(1, 17, 72, 136, true), false);
    mmtest::against_f64(check, mmtest::problem(2, 200, 72, 64, true), false);
#endif
#if TANDEM_GEMM_BREAK != 4 && TANDEM_GEMM_BREAK != 5
    // The decode GEMV variants carry breaks 1 and 3 too (m16_gemv4, m16_gemv8, m16_x1), and 2
    // (m16_x1 only: the others have no cp.async); none has a shared-memory total (4).
    for (int v : {2, 3, 4}) {
        if (TANDEM_GEMM_BREAK == 2 && v != 4) continue;
        mmtest::small_variant = v;
        const std::string tag = v == 2 ? "[m16_gemv4] " : v == 3 ? "[m16_gemv8] " : "[m16_x1] ";
#if TANDEM_GEMM_BREAK == 3
        mmtest::Problem p = mmtest::problem(1, 1, 72, 1000, true);
        auto got = mmtest::run(1, p.x.data(), p.w.data(), p.b.data(), 1, 72, 1000);
        auto old = mmtest::run(1, p.x.data(), p.w.data(), p.b.data(), 1, 72, 1000, nullptr, true);
        check(tag + "in-kernel fold bitwise equal to matmul_fold m=1 k=1000", std::memcmp(got.data(), old.data(), 4 * got.size()) == 0);
#else
        mmtest::against_f64([&](const std::string& what, bool ok) { check(tag + what, ok); }, mmtest::problem(1, 1, 72, 40, false), false);
        mmtest::against_f64([&](const std::string& what, bool ok) { check(tag + what, ok); }, mmtest::problem(2, 7, 72, 1000, true), false);
#endif
    }
    mmtest::small_variant = 0;
#endif
#if TANDEM_GEMM_BREAK != 3 && TANDEM_GEMM_BREAK != 5
    // The large-m loop variant (m128_w64) carries breaks 1, 2 and 4 in its own loop (3 is the
    // split fold, m <= 128 only; 5 the GeGLU epilogue, run_geglu above): m > 128, k = 1000 in 3 slices (a fold between the two k tiles
    // of a group) and one slice.
    mmtest::large_variant = 3;
    for (auto [dt, m, k] : {std::tuple{1, 200, 1000}, std::tuple{2, 129, 136}})
        mmtest::against_f64([&](const std::string& what, bool ok) { check("[m128_w64] " + what, ok); }, mmtest::problem(dt, m, 72, k, true), false);
    mmtest::large_variant = 2;
#endif
    std::printf("TANDEM_GEMM_BREAK=%d: %d of %d checks caught the break\n", TANDEM_GEMM_BREAK, checks - passed, checks);
    return passed == 0 ? 0 : 1;
}
