// sample_io.cpp — kernels/sampling.cu under the host emulation, fed from a file, so that a Rust
// test (crates/cuda/tests/sampling_emu.rs) can hold the kernel against the host sampler
// (`tandem_core::sampling::sample_row`) bit for bit on inputs it generates.
// Usage: sample_io IN OUT. IN: u32 rows, u32 vocab, f32 logits [rows, vocab], u32 specs
// [rows, 8], then optionally the masks (u32 words, u32 count, i32 index [rows], u32 bits
// [count, words]: `sample_masked`; count 0 with no bits: none), then optionally the edits
// (u32 records, u32 start [rows + 1], u32 words [records, 5]: `logit_edits` first, the raw
// logits kept), then optionally the logprobs asked (u32 top_n [rows], 0xffffffff: none:
// `logit_restore`, then `logprobs` after sampling); OUT: u32 ids [rows], then, with edits, the
// edited logits f32 [rows, vocab], then, with logprobs, f32 lp [rows], u32 top ids [rows, 20]
// and f32 top logprobs [rows, 20]. All little-endian.
#include "cuda_emu.h"

#include "../sampling.cu"

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s IN OUT\n", argv[0]);
        return 2;
    }
    FILE* in = std::fopen(argv[1], "rb");
    if (!in) return 2;
    u32 dims[2];
    if (std::fread(dims, 4, 2, in) != 2) return 2;
    const size_t rows = dims[0], vocab = dims[1];
    std::vector<float> logits(rows * vocab);
    std::vector<u32> specs(rows * 8), ids(rows, 0xffffffffu);
    if (std::fread(logits.data(), 4, logits.size(), in) != logits.size()) return 2;
    if (std::fread(specs.data(), 4, specs.size(), in) != specs.size()) return 2;
    // Optional masks: u32 words, u32 count, i32 index [rows], u32 bits [count, words].
    u32 mh[2];
    const bool masked = std::fread(mh, 4, 2, in) == 2;
    std::vector<int> index(masked ? rows : 0);
    std::vector<u32> bits(masked ? (size_t)mh[0] * mh[1] : 0);
    if (masked && (std::fread(index.data(), 4, rows, in) != rows || std::fread(bits.data(), 4, bits.size(), in) != bits.size())) return 2;
    u32 records = 0;
    const bool edited = masked && std::fread(&records, 4, 1, in) == 1;
    std::vector<u32> start(edited ? rows + 1 : 0), words(edited ? (size_t)records * 5 : 0);
    if (edited && (std::fread(start.data(), 4, start.size(), in) != start.size() || std::fread(words.data(), 4, words.size(), in) != words.size())) return 2;
    std::vector<u32> top_n(rows);
    const bool want_lp = edited && std::fread(top_n.data(), 4, rows, in) == rows;
    std::fclose(in);
    std::vector<float> saved(words.size() / 5 + 1, NAN), edited_logits;
    if (edited) {
        launch(dim3{(unsigned)rows, 1, 1}, dim3{SMP_THREADS, 1, 1}, [&] { logit_edits(logits.data(), start.data(), words.data(), saved.data(), (int)rows, (int)vocab); });
        edited_logits = logits;
    }
    // TANDEM_CUDA_SAMPLER=radix: the radix variant (sample_radix / sample_masked_radix).
    const char* variant = std::getenv("TANDEM_CUDA_SAMPLER");
    const bool radix = variant && std::string(variant) == "radix";
    // TANDEM_CUDA_SAMPLER=multi: the many-CTA kernels in the launcher's order, on a workspace
    // filled with garbage (nothing may rely on it being zero).
    const bool multi = variant && std::string(variant) == "multi";
    if (multi) {
        std::vector<u32> ws(rows * SMC_WORDS, 0x3f00ff01u);
        const int mw = masked ? (int)mh[0] : 0;
        const u32* mb = masked ? bits.data() : specs.data();
        const int* mi = masked ? index.data() : (const int*)specs.data();
        const dim3 grid{SMC_CTAS, (unsigned)rows, 1}, block{SMP_THREADS, 1, 1};
        launch(grid, block, [&] { sample_mc_max(logits.data(), ws.data(), (int)rows, (int)vocab, mb, mi, mw); });
        for (int p = 0; p < 4; ++p) launch(grid, block, [&] { sample_mc_topk(logits.data(), specs.data(), ws.data(), (int)rows, (int)vocab, mb, mi, mw, p); });
        for (int q = 0; q < SMC_PASSES; ++q) launch(grid, block, [&] { sample_mc_topp(logits.data(), specs.data(), ws.data(), (int)rows, (int)vocab, mb, mi, mw, q); });
        launch(dim3{(unsigned)rows, 1, 1}, block, [&] { sample_mc_draw(logits.data(), specs.data(), ws.data(), ids.data(), (int)rows, (int)vocab, mb, mi, mw); });
    } else if (masked && radix)
        launch(dim3{(unsigned)rows, 1, 1}, dim3{SMP_THREADS, 1, 1}, [&] { sample_masked_radix(logits.data(), specs.data(), ids.data(), (int)rows, (int)vocab, bits.data(), index.data(), (int)mh[0]); });
    else if (masked)
        launch(dim3{(unsigned)rows, 1, 1}, dim3{SMP_THREADS, 1, 1}, [&] { sample_masked(logits.data(), specs.data(), ids.data(), (int)rows, (int)vocab, bits.data(), index.data(), (int)mh[0]); });
    else if (radix)
        launch(dim3{(unsigned)rows, 1, 1}, dim3{SMP_THREADS, 1, 1}, [&] { sample_radix(logits.data(), specs.data(), ids.data(), (int)rows, (int)vocab); });
    else
        launch(dim3{(unsigned)rows, 1, 1}, dim3{SMP_THREADS, 1, 1}, [&] { sample(logits.data(), specs.data(), ids.data(), (int)rows, (int)vocab); });
    std::vector<float> lp(rows, NAN), top_lp(rows * SMP_MAX_TOP, NAN);
    std::vector<u32> top_ids(rows * SMP_MAX_TOP, 0u);
    if (want_lp) {
        launch(dim3{(unsigned)rows, 1, 1}, dim3{SMP_THREADS, 1, 1}, [&] { logit_restore(logits.data(), start.data(), words.data(), saved.data(), (int)rows, (int)vocab); });
        launch(dim3{(unsigned)rows, 1, 1}, dim3{SMP_THREADS, 1, 1}, [&] { logprobs(logits.data(), ids.data(), top_n.data(), lp.data(), top_ids.data(), top_lp.data(), (int)rows, (int)vocab); });
    }
    FILE* out = std::fopen(argv[2], "wb");
    if (!out || std::fwrite(ids.data(), 4, rows, out) != rows) return 2;
    if (edited && std::fwrite(edited_logits.data(), 4, edited_logits.size(), out) != edited_logits.size()) return 2;
    if (want_lp && (std::fwrite(lp.data(), 4, rows, out) != rows || std::fwrite(top_ids.data(), 4, top_ids.size(), out) != top_ids.size() ||
                    std::fwrite(top_lp.data(), 4, top_lp.size(), out) != top_lp.size()))
        return 2;
    std::fclose(out);
    return 0;
}
