// sm90_attention_test.cpp — the wgmma prefill attention (kernels/paged_attention_sm90.cu) on the
// emulator, run by run.sh: attention_tc_test.h's whole suite on the variant (f64 within the
// derived bound; bitwise equal to paged_attention_tc for chunk blocks and the host's mix of
// split and chunk jobs; split jobs, chunk jobs, 1-token chunks and each token alone bitwise
// equal; bad block ids and tokens of no sequence): GQA 1 to 20, head_dim 64 / 128 / 256, block
// 16 / 32, contexts mid-block, cached prefixes, sliding windows, several partitions. Plus a
// prefill of 200 tokens from 0 (several chunk blocks of 128 rows, every ring stage reused).
// Run with an argument N = 1..PAW_BREAKS it breaks the kernel with paged_attention_sm90.cu's
// test hook N (TANDEM_PAW_BREAK is this program's variable), runs a few cases in a child
// process each and succeeds only if every one of them catches it (a failed check or an abort).
#include "cuda_emu.h"

static int paw_break = 0;
constexpr int PAW_BREAKS = 3;
#define TANDEM_PAW_BREAK paw_break
#include "../paged_attention.cu"
#include "../paged_attention_sm90.cu"

#include <cstdio>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include "attention_tc_test.h"

namespace {
int checks = 0, failures = 0;
void check(const std::string& what, bool ok) {
    ++checks;
    if (!ok) ++failures;
    if (paw_break) std::printf("%s %s\n", ok ? "passed (bad: the break went unnoticed)" : "failed (as it must)", what.c_str());
    else std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
}

// As the host launches it (crates/cuda/src/attention.rs): 384 threads, chunk blocks of 8 tw
// tokens (the test's grid, sized for tc_shared's 4 tw, only adds blocks that return at once),
// then tc's kernel for the split tokens.
pattest::Variant wgmma() {
    pattest::Variant v{"paged_attention_wgmma", paged_attention_wgmma_d64, paged_attention_wgmma_d128, paged_attention_wgmma_d256, PAW_THREADS / 32,
                       PAT_SPLITS, [](int D) { return (size_t)(D == 64 ? PawCfg<64>::SMEM : D == 128 ? PawCfg<128>::SMEM : PawCfg<256>::SMEM); },
                       [](int D) { return D > 128 ? 2 : 1; }, true, true};
    return v;
}

// The variant against paged_attention_tc, bitwise, as the host mixes the jobs and as chunks only.
bool equal_to_tc(const pattest::Case& c) {
    const pattest::Data d = pattest::build(c);
    const int lead = pattest::leading_decodes(d);
    auto got = pattest::run(wgmma(), d, lead), want = pattest::run(pattest::tc(), d, lead);
    auto chunk = pattest::run(wgmma(), d, 0), want_chunk = pattest::run(pattest::tc(), d, 0);
    return pattest::same(got, want.data(), got.size()) && pattest::same(chunk, want_chunk.data(), got.size());
}

template <typename F>
void in_child(const std::string& what, F f) {
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        f();
        std::fflush(stdout);
        _exit(failures == 0 ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    check("(child) " + what + (WIFSIGNALED(st) ? ": the emulator aborted" : ""), WIFEXITED(st) && WEXITSTATUS(st) == 0);
}
}  // namespace

int main(int argc, char** argv) {
    paw_break = argc > 1 ? std::atoi(argv[1]) : 0;
    if (paw_break < 0 || paw_break > PAW_BREAKS) return 2;
    const pattest::Case long_prefill{16, 2, 4, 128, {{0, 200}}};
    if (!paw_break) {
        check("paged_attention_wgmma shared memory: 98,560 bytes at D 64, 147,680 at 128, 213,184 at 256 (attention.rs WGMMA_ATTN_SMEM)",
              PawCfg<64>::SMEM == 98560 && PawCfg<128>::SMEM == 147680 && PawCfg<256>::SMEM == 213184);
        pattest::run_all(wgmma(), check);
        check("paged_attention_wgmma bitwise equal to paged_attention_tc, a 200-token prefill from 0 (GQA 4, D 128: 7 chunk blocks a KV head)",
              equal_to_tc(long_prefill));
        check("paged_attention_wgmma bitwise equal to paged_attention_tc, GQA 1, D 64, 150 tokens over a 70-key prefix",
              equal_to_tc(pattest::Case{32, 2, 1, 64, {{70, 150}, {3, 1}}}));
        std::printf("sm90 attention: %d checks, %d failed\n", checks, failures);
        return failures == 0 ? 0 : 1;
    }
    // Contexts of more tiles than ring stages, so that every stage is refilled (break 2 needs it).
    in_child("paged_attention_wgmma prefill over a prefix, GQA 4, D 128", [&] { check("bitwise equal to tc", equal_to_tc(pattest::Case{16, 2, 4, 128, {{300, 40}}})); });
    in_child("paged_attention_wgmma prefill over a prefix, GQA 2, D 64", [&] { check("bitwise equal to tc", equal_to_tc(pattest::Case{16, 2, 2, 64, {{300, 100}}})); });
    in_child("paged_attention_wgmma sliding window, GQA 2, D 256", [&] {
        check("bitwise equal to tc", equal_to_tc(pattest::Case{32, 1, 2, 256, {{300, 70}}, -1, 128}));
    });
    std::printf("TANDEM_PAW_BREAK=%d: %d of %d checks caught the break\n", paw_break, failures, checks);
    return failures == checks ? 0 : 1;
}
