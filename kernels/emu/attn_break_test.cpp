// attn_break_test.cpp — proves that attention_tc_test.h catches what the tensor-core attention
// can get wrong: built by run.sh with -DTANDEM_PAT_BREAK=1 (q's A fragment with rows g and g + 8
// swapped for the upper dims: a wrong fragment index), =2 (the cp.async wait dropped), =3 (the
// split jobs' partials folded newest first: within every bound, so only the bitwise comparison
// of split and chunk jobs can catch it), =4 (a chunk job's rows all take its first token's
// partition length: the same tokens alone differ in the last bits); and with
// -DTANDEM_PATD_BREAK=1..5 for the tc_deep variant's own code: =1 (each K step waits for one
// stage fewer than the ring's depth), =2 (the ring's wrong stage read), =3 and =4 as above, =5
// (the sliding window's keys before a row's first key, in its first tile, not masked); and with
// -DTANDEM_PATS_BREAK=1..2 for the tc_shared variant's chunk blocks: =1 (the block barrier after
// each tile's cp.async wait dropped: warps read the sub-tiles other warps copy, which the
// emulator's drifting warps find not yet landed), =2 (the ring's wrong stage read).
// It succeeds only if some check of the broken kernel's variant catches the break, and for tc
// (whose d256 kernel is the same code with q read from shared memory, break 1 there swapping
// the same fragments) also some head_dim 256 check; which checks caught it is printed.
#include "cuda_emu.h"

#include "../paged_attention.cu"

#include <cstdio>
#include <string>

#include "attention_tc_test.h"

int main() {
    int checks = 0, failed = 0, failed256 = 0;
    const bool deep = TANDEM_PATD_BREAK != 0, shared = TANDEM_PATS_BREAK != 0, tc_only = !deep && !shared;
    pattest::run_all(shared ? pattest::tc_shared() : deep ? pattest::tc_deep() : pattest::tc(), [&](const std::string& what, bool ok) {
        ++checks;
        if (!ok) {
            ++failed;
            failed256 += what.find("D=256") != std::string::npos;
            std::printf("failed (as it must) %s\n", what.c_str());
        }
    });
    const std::string at256 = tc_only ? " (" + std::to_string(failed256) + " at head_dim 256)" : "";
    std::printf("%s=%d: %d of %d checks caught the break%s\n", shared ? "TANDEM_PATS_BREAK" : deep ? "TANDEM_PATD_BREAK" : "TANDEM_PAT_BREAK",
                shared ? TANDEM_PATS_BREAK : deep ? TANDEM_PATD_BREAK : TANDEM_PAT_BREAK, failed, checks, at256.c_str());
    return failed > 0 && (!tc_only || failed256 > 0) ? 0 : 1;
}
