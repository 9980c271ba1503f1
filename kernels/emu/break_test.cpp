// break_test.cpp — proves that the emulator tests catch the two bugs tensor-core kernels are
// most prone to: built by run.sh with -DTANDEM_GEMM_BREAK=1 (two B fragments swapped: a wrong
// fragment index) and =2 (the cp.async wait dropped), it runs the matmul checks of
// matmul_test.h on a few shapes and succeeds only if EVERY one of them fails.
#include "cuda_emu.h"

#include "../matmul.cu"

#include <cstdio>
#include <string>

#include "matmul_test.h"

int main() {
    int checks = 0, passed = 0;
    auto check = [&](const std::string& what, bool ok) {
        ++checks;
        if (ok) ++passed;
        std::printf("%s %s\n", ok ? "passed (bad: the break went unnoticed)" : "failed (as it must)", what.c_str());
    };
    mmtest::against_f64(check, mmtest::problem(1, 1, 72, 40, false));
    mmtest::against_f64(check, mmtest::problem(1, 17, 72, 136, true));
    mmtest::against_f64(check, mmtest::problem(2, 200, 72, 64, true));
    std::printf("TANDEM_GEMM_BREAK=%d: %d of %d checks caught the break\n", TANDEM_GEMM_BREAK, checks - passed, checks);
    return passed == 0 ? 0 : 1;
}
