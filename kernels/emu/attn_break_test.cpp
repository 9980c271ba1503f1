// attn_break_test.cpp — proves that attention_tc_test.h catches what the tensor-core attention
// can get wrong: built by run.sh with -DTANDEM_PAT_BREAK=1 (q's A fragment with rows g and g + 8
// swapped for the upper dims: a wrong fragment index), =2 (the cp.async wait dropped), =3 (the
// split jobs' partials folded newest first: within every bound, so only the bitwise comparison
// of split and chunk jobs can catch it), =4 (a chunk job's rows all take its first token's
// partition length: the same tokens alone differ in the last bits). It succeeds only if some
// check catches the break; which checks must catch it is printed.
#include "cuda_emu.h"

#include "../paged_attention.cu"

#include <cstdio>
#include <string>

#include "attention_tc_test.h"

int main() {
    int checks = 0, failed = 0;
    pattest::run_all([&](const std::string& what, bool ok) {
        ++checks;
        if (!ok) {
            ++failed;
            std::printf("failed (as it must) %s\n", what.c_str());
        }
    });
    std::printf("TANDEM_PAT_BREAK=%d: %d of %d checks caught the break\n", TANDEM_PAT_BREAK, failed, checks);
    return failed > 0 ? 0 : 1;
}
