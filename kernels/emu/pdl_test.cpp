// pdl_test.cpp — the emulator's model of programmatic dependent launch (cuda_emu.h `Pdl`, what
// the fake driver does for a launch with the programmatic-stream-serialization attribute): the
// dependent grid runs first, and its primary runs from inside it once the first block is parked
// at PDL_WAIT. Real kernels (add.cu then rms_norm.cu, as a decode step chains them) give the
// sequential bits; a dependent that reads its primary's output above its wait, and the real
// pair with the wait defeated (`pdl.late`: the primary runs after the dependent's first block),
// give wrong bits, which is what the model is for. Built strict by run.sh, and run in index
// order and in the fake driver's interleaved order (there with add then argmax.cu: the `__shared__`
// of a template kernel such as rms_norm's is in .bss in a plain build, shared across interleaved
// blocks; the fake driver's build moves it into the poisoned section, crates/fake-cuda/build.rs).
#include "cuda_emu.h"
#include "../add.cu"
#include "../argmax.cu"
#include "../rms_norm.cu"

#include <cstring>
#include <string>
#include <vector>

namespace {
int failures = 0;
void check(bool ok, const std::string& what) {
    std::printf("%s pdl: %s\n", ok ? "ok  " : "FAIL", what.c_str());
    if (!ok) ++failures;
}

constexpr int ROWS = 8, DIM = 256;

struct Bufs {
    std::vector<float> acc, x, w, out;
    Bufs() : acc(ROWS * DIM), x(ROWS * DIM), w(DIM), out(ROWS * DIM, 0.0f) {
        for (int i = 0; i < ROWS * DIM; ++i) {
            acc[i] = 0.25f * (float)((i * 7) % 13) - 1.0f;
            x[i] = 0.125f * (float)((i * 5) % 11) + 0.5f;
        }
        for (int i = 0; i < DIM; ++i) w[i] = 1.0f + 0.01f * (float)i;
    }
};

void run_add(Bufs& b) {
    float* acc = b.acc.data();
    const float* x = b.x.data();
    launch(dim3{(ROWS * DIM + 255) / 256}, dim3{256}, [=] { add(acc, x, (unsigned long long)ROWS * DIM); });
}
void run_norm(Bufs& b) {
    const float* acc = b.acc.data();
    const float* w = b.w.data();
    float* out = b.out.data();
    launch(dim3{ROWS}, dim3{256}, [=] { rms_norm_f32(acc, w, out, 0, ROWS, DIM, 1e-5f); });
}
void primary_add(void* p) { run_add(*(Bufs*)p); }

// add then argmax over each row of acc: acc peaks at column 5, x moves each row's peak to 100 + r.
struct Argmax {
    std::vector<float> acc, x;
    std::vector<u32> ids;
    Argmax() : acc(ROWS * DIM), x(ROWS * DIM, 0.0f), ids(ROWS, 0) {
        for (int i = 0; i < ROWS * DIM; ++i) acc[i] = (i % DIM) == 5 ? 1.0f : 0.001f * (float)(i % 17);
        for (int r = 0; r < ROWS; ++r) x[r * DIM + 100 + r] = 10.0f;
    }
};
void argmax_add(void* p) {
    Argmax& a = *(Argmax*)p;
    float* acc = a.acc.data();
    const float* x = a.x.data();
    launch(dim3{(ROWS * DIM + 255) / 256}, dim3{256}, [=] { add(acc, x, (unsigned long long)ROWS * DIM); });
}
// The rows whose argmax saw the added peak.
int argmax_rows_right(bool late) {
    Argmax a;
    emu::pdl.primary = argmax_add;
    emu::pdl.arg = &a;
    emu::pdl.late = late;
    const float* acc = a.acc.data();
    u32* ids = a.ids.data();
    launch(dim3{ROWS}, dim3{512}, [=] { argmax(acc, ids, ROWS, DIM); });
    emu::pdl.late = false;
    int right = 0;
    for (int r = 0; r < ROWS; ++r) right += a.ids[r] == (u32)(100 + r);
    return right;
}

// Reads its input above the wait (wrong), or below it (right).
template <bool EARLY>
void copy_kernel(const float* in, float* out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = 0.0f;
    if (EARLY) v = in[i];
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    if (!EARLY) v = in[i];
    out[i] = v;
}
struct Pair {
    std::vector<float> a, b;
    Pair() : a(4 * 64, 1.0f), b(4 * 64, 0.0f) {}
};
void primary_fill(void* p) {
    float* a = ((Pair*)p)->a.data();
    launch(dim3{4}, dim3{64}, [=] {
        PDL_WAIT();
        a[blockIdx.x * blockDim.x + threadIdx.x] = 2.0f;
    });
}
template <bool EARLY>
bool copy_sees_primary() {
    Pair p;
    emu::pdl.ran_late = false;
    emu::pdl.primary = primary_fill;
    emu::pdl.arg = &p;
    const float* in = p.a.data();
    float* out = p.b.data();
    launch(dim3{4}, dim3{64}, [=] { copy_kernel<EARLY>(in, out); });
    for (float v : p.b)
        if (v != 2.0f) return false;
    return true;
}

void run_all(const char* order, bool norm) {
    const std::string o = order;
    check(argmax_rows_right(false) == ROWS, o + ": add -> argmax as dependent launches: every row's argmax sees the add");
    check(argmax_rows_right(true) < ROWS, o + ": deliberate break (the wait defeated): argmax's first block saw acc before add (caught)");
    check(copy_sees_primary<false>(), o + ": a dependent reading below its wait sees the primary's output");
    check(!copy_sees_primary<true>(), o + ": a dependent reading above its wait sees stale memory (caught)");
    if (!norm) return;
    Bufs ref;
    run_add(ref);
    run_norm(ref);

    Bufs m;
    emu::pdl.primary = primary_add;
    emu::pdl.arg = &m;
    const unsigned long long waits = emu::pdl.waits;
    run_norm(m);
    check(!emu::pdl.primary && !emu::pdl.ran_late, o + ": add ran from inside rms_norm, at its first block's wait");
    check(emu::pdl.waits - waits == (unsigned long long)ROWS * 256, o + ": every rms_norm thread waited once (" + std::to_string(emu::pdl.waits - waits) + ")");
    check(std::memcmp(m.out.data(), ref.out.data(), sizeof(float) * ROWS * DIM) == 0 && m.acc == ref.acc,
          o + ": add -> rms_norm as dependent launches: the sequential bits");

    Bufs late;
    emu::pdl.primary = primary_add;
    emu::pdl.arg = &late;
    emu::pdl.late = true;
    run_norm(late);
    emu::pdl.late = false;
    check(emu::pdl.ran_late && late.acc == ref.acc, o + ": deliberate break (the wait defeated): add still ran once, after rms_norm's first block");
    check(std::memcmp(late.out.data(), ref.out.data(), sizeof(float) * ROWS * DIM) != 0,
          o + ": deliberate break: rms_norm's first block read acc before add wrote it, and the bits differ (caught)");

}
}  // namespace

int main() {
    run_all("index order", true);
    emu::block_order_seed = 0x51ed;
    run_all("interleaved order", false);
    emu::block_order_seed = 0;
    if (failures) {
        std::printf("pdl: %d check(s) failed\n", failures);
        return 1;
    }
    return 0;
}
