// interleave_test.cpp — the fake driver's block order (TANDEM_EMU_STRICT, a non-zero
// emu::block_order_seed): blocks of a grid interleave at barriers, each keeps its own
// `__shared__` objects and dynamic shared memory across the switches, and a fold by the last
// block to arrive sees its partials in orders that change with the seed. Built strict by run.sh.
#include "cuda_emu.h"

#include <set>
#include <string>

namespace {
constexpr unsigned BLOCKS = 12, THREADS = 64, STEPS = 6;

int failures = 0;
void check(bool ok, const std::string& what) {
    std::printf("%s interleave: %s\n", ok ? "ok  " : "FAIL", what.c_str());
    if (!ok) ++failures;
}

// Each block: STEPS barriers; at each, thread 0 logs (block, step) and every thread checks that
// the block's static and dynamic shared memory still hold what it wrote. Then a split fold:
// partial[b] = b + 1, a fence, a ticket; the block drawing the last ticket sums the partials.
struct Log {
    std::vector<std::pair<unsigned, unsigned>> events;
    float partial[BLOCKS];
    unsigned ticket = 0;
    unsigned folder = ~0u;
    float sum = 0;
    unsigned arrived_before_fold = 0;  // blocks that had finished when the folder folded
    unsigned finished = 0;
    bool shared_ok = true;
};

void kernel(Log* log) {
    __shared__ unsigned mine[THREADS];
    unsigned* dyn = (unsigned*)emu::dynamic_smem();
    mine[threadIdx.x] = blockIdx.x * 1000 + threadIdx.x;
    dyn[threadIdx.x] = blockIdx.x * 7 + threadIdx.x;
    for (unsigned s = 0; s < STEPS; ++s) {
        __syncthreads();
        if (threadIdx.x == 0) log->events.push_back({blockIdx.x, s});
        if (mine[threadIdx.x] != blockIdx.x * 1000 + threadIdx.x || dyn[threadIdx.x] != blockIdx.x * 7 + threadIdx.x) log->shared_ok = false;
    }
    __shared__ unsigned last;
    if (threadIdx.x == 0) {
        log->partial[blockIdx.x] = (float)(blockIdx.x + 1);
        __threadfence();
        last = atomicAdd(&log->ticket, 1u) == BLOCKS - 1;
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
        log->folder = blockIdx.x;
        log->arrived_before_fold = log->finished;
        float s = 0;
        for (unsigned b = 0; b < BLOCKS; ++b) s += log->partial[b];
        log->sum = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) ++log->finished;
}

// Whether some block logged a step between another block's first and last step.
bool interleaved(const Log& l) {
    for (unsigned b = 0; b < BLOCKS; ++b) {
        size_t first = l.events.size(), last = 0;
        for (size_t i = 0; i < l.events.size(); ++i)
            if (l.events[i].first == b) first = std::min(first, i), last = i;
        for (size_t i = first; i < last; ++i)
            if (l.events[i].first != b) return true;
    }
    return false;
}
}  // namespace

int main() {
    std::set<unsigned> folders;
    unsigned interleaved_runs = 0, early_folds = 0;
    for (unsigned long long seed = 1; seed <= 16; ++seed) {
        Log log;
        emu::block_order_seed = seed * 0x9e3779b97f4a7c15ull;
        launch(dim3{BLOCKS}, dim3{THREADS}, [&] { kernel(&log); }, THREADS * sizeof(unsigned));
        emu::block_order_seed = 0;
        const bool all = log.events.size() == BLOCKS * STEPS && log.finished == BLOCKS;
        if (!all || !log.shared_ok || log.sum != BLOCKS * (BLOCKS + 1) / 2 || log.folder >= BLOCKS) {
            check(false, "seed " + std::to_string(seed) + ": every block ran, kept its shared memory and the fold summed every partial");
            continue;
        }
        folders.insert(log.folder);
        interleaved_runs += interleaved(log);
        early_folds += log.arrived_before_fold < BLOCKS - 1;
    }
    check(failures == 0, "16 seeds: every block ran each step, kept its own __shared__ and dynamic shared memory, and the last block folded every partial");
    check(interleaved_runs == 16, "blocks interleave at barriers in " + std::to_string(interleaved_runs) + " of 16 seeds");
    check(early_folds > 0, "the last block folded while another block was still running in " + std::to_string(early_folds) + " of 16 seeds");
    check(folders.size() >= 4, "the folding block changes with the seed (" + std::to_string(folders.size()) + " different blocks over 16 seeds)");
    // Seed 0: index order, one block after another, as the emulator tests expect.
    Log seq;
    launch(dim3{BLOCKS}, dim3{THREADS}, [&] { kernel(&seq); }, THREADS * sizeof(unsigned));
    check(!interleaved(seq) && seq.folder == BLOCKS - 1 && seq.sum == BLOCKS * (BLOCKS + 1) / 2, "seed 0 runs the blocks in index order");
    return failures == 0 ? 0 : 1;
}
