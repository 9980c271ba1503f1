// moe_break_test.cpp — proves that the routed MoE checks (moe_test.h) catch a combine that
// adds a wrong term: built by run.sh with -DTANDEM_MOE_BREAK=1 (the second expert's term scaled
// by 1 + 2^-23, within every tolerance: only the bitwise comparison with the every-expert path
// can see it), it succeeds only if some check fails. Built without the define it runs the
// checks as emu_test.cpp does (a quick way to run them alone).
#include "cuda_emu.h"

#include "../matmul.cu"
#include "../moe.cu"
#include "../rms_norm.cu"
#include "../rope.cu"
#include "../kv_write.cu"
#include "../silu_mul.cu"

#include <cstdio>
#include <string>

#include "matmul_test.h"
#include "fused_test.h"
#include "moe_test.h"

int main() {
    int checks = 0, passed = 0;
    auto check = [&](const std::string& what, bool ok) {
        ++checks;
        if (ok) ++passed;
        std::printf("%s %s\n", ok ? "passed" : "FAILED", what.c_str());
    };
    moetest::run_all(check);
    std::printf("TANDEM_MOE_BREAK=%d: %d of %d checks failed\n", TANDEM_MOE_BREAK, checks - passed, checks);
    return TANDEM_MOE_BREAK == 0 ? (passed == checks ? 0 : 1) : (passed < checks ? 0 : 1);
}
