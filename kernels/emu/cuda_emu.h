// cuda_emu.h — just enough of CUDA to run kernels/*.cu on the CPU, for a GPU-less box.
//
// Every CUDA thread of a block is a fiber: its own stack, run cooperatively on the one OS
// thread that called launch(), switching only at a barrier. Blocks run one after another, so
// a `__shared__` variable can be a plain function-local static (the fake driver's strict build
// interleaves a few blocks at barriers instead, swapping the `__shared__` section: see
// run_interleaved). __syncthreads is a barrier
// over the block's fibers, and warp-collective operations (shuffles, ldmatrix, mma) exchange
// through a per-warp slot array: each lane writes its words, one barrier over the warp's 32
// fibers, each lane reads what it needs. The slots are double-buffered (operation i uses set
// i & 1), so one barrier per operation is enough: a lane can only overwrite set i & 1 again at
// operation i + 2, after every lane has passed operation i + 1's barrier, i.e. finished
// reading operation i. This runs the real kernel code, including its barriers and reductions,
// in the same order as on a GPU. (It used to be one std::thread per CUDA thread with
// std::barrier; the futex waits and wakes cost more system time than the kernels took, and
// a barrier some thread never reached hung the test. Here that is reported and aborts.)
//
// Tensor-core and async-copy emulation (the kernels reach these through common.cuh):
//   - ldmatrix .x1/.x2/.x4 (.trans): lanes 8j..8j+7 give the row addresses of matrix j; lane l
//     gets, per matrix, the 2 elements at row l/4, columns 2(l%4), 2(l%4)+1 (transposed:
//     rows 2(l%4), 2(l%4)+1 of column l/4) — PTX ISA, "Warp-level matrix load instruction:
//     ldmatrix". Addresses must be 16-byte aligned and inside the block's dynamic shared
//     memory or a static __shared__ object (only alignment is checked).
//   - mma.sync m16n8k16 .row.col f32 += bf16|f16 x bf16|f16, with the fragment layouts of the PTX
//     ISA ("Matrix Fragments for mma.m16n8k16 with floating point type"): groupID g = lane>>2,
//     t = lane%4; A a0..a7: row g (a0,a1,a4,a5) or g+8, col 2t+(i&1) (+8 for i>=4); B b0..b3:
//     row (k) 2t+(i&1) (+8 for i>=2), col (n) g; C/D c0..c3: row g (c0,c1) or g+8, col 2t+(i&1).
//     Each product of two 16-bit floats is exact in f32; ASSUMPTION: the 16 products of one
//     element are added to the accumulator one after another in ascending k, each add rounded
//     to f32 (round to nearest). The hardware's internal order is not documented; the GPU op
//     suite must confirm the kernels' contract (row bits independent of m), which relies only on
//     the hardware computing every element of every mma the same way, not on this order.
//   - mma.sync m16n8k32 .row.col f32 += e4m3 x e4m3 (mma_m16n8k32_e4m3 below): the 8-bit
//     fragment layout, the same accumulation ASSUMPTION (32 exact products, ascending k).
//   - cp.async (16 bytes, .ca/.cg, src-size zero fill) with commit_group / wait_group: the copy
//     is deferred to the wait that covers its group, and the destination holds 0xFF bytes (NaN
//     as f32, bf16 and f16) until then, so a missing or too-weak wait reads NaN and fails a test.
//   - dynamic shared memory: launch(grid, block, f, shared_bytes) gives each block an arena of
//     that many bytes (128-byte aligned), filled with 0xFF before the block starts, so reading
//     shared memory nobody wrote also shows up as NaN.
//   - atomicAdd on float / unsigned (std::atomic_ref); __threadfence (a seq_cst fence).
//   - __ballot_sync (full mask): lane i's predicate in bit i.
// Limits: blockDim.x a multiple of 32, every lane of a warp reaches each warp-collective call
// (full masks only), a block returns early only as a whole (all true of our kernels).
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include <sys/mman.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#define TANDEM_HOST_EMU 1
#define __global__
#if defined(TANDEM_EMU_STRICT)
// Internal linkage for device functions, so that the `__shared__` objects of inline functions
// and templates are not in COMDAT groups, which cannot share a named section with the others.
#define __device__ static
#else
#define __device__
#endif
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#if defined(TANDEM_EMU_STRICT)
// The fake driver's build (crates/fake-cuda): every `__shared__` object lives in one section,
// poisoned (0xFF) before each block like the dynamic arena, so a block that reads shared memory
// it did not write sees NaN instead of a previous block's values or zeros.
#define __shared__ __attribute__((section("tandem_emu_shared"))) static
extern "C" char __start_tandem_emu_shared[] __attribute__((weak));
extern "C" char __stop_tandem_emu_shared[] __attribute__((weak));
#else
#define __shared__ static
#endif
#define __launch_bounds__(...)

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
struct float4 {
    float x, y, z, w;
};
struct uint4 {
    unsigned x, y, z, w;
};

inline dim3 gridDim, blockDim, blockIdx;

namespace emu {
// cp.async: deferred 16-byte copies grouped by commit; the destination is poisoned meanwhile.
struct Copy {
    void* dst;
    const void* src;
    int src_bytes;
    long group;  // -1 until committed
};

#if defined(__x86_64__)
// Saves the callee-saved registers on the current stack, stores its pointer in *from, loads
// `to` and restores what that stack saved (System V ABI: rbx, rbp, r12-r15; MXCSR and the x87
// control word are never changed by our code). Weak, so every test program may include this.
extern "C" void tandem_emu_switch(void** from, void* to);
asm(R"(
    .pushsection .text
    .weak tandem_emu_switch
    .type tandem_emu_switch, @function
tandem_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size tandem_emu_switch, .-tandem_emu_switch
    .popsection
)");
#endif

// One CUDA thread: its stack, its saved context, and the state CUDA keeps per thread.
struct Fiber {
    dim3 tid;
    unsigned phase = 0;  // collective operations this thread has done, for double buffering
    std::vector<Copy> pending;
    long committed = 0;
    bool done = false;
    bool pdl_waited = false, pdl_at_wait = false;  // PDL_WAIT passed / parked at it (pdl_wait)
    unsigned char* stack = nullptr;  // mmap'd, lowest page a guard
#if defined(__x86_64__)
    void* sp = nullptr;
#else
    ucontext_t ctx;
#endif
};
inline Fiber* cur = nullptr;  // the fiber running now; null outside a launch
inline unsigned long block_serial = 0;  // counts blocks run, so per-block side state (wgmma.h) knows a new block
inline unsigned long progress = 0;  // barrier arrivals and finished fibers, for deadlock detection

inline unsigned tid_x() { return cur ? cur->tid.x : 0u; }
[[noreturn]] inline void die(const char* what) {
    std::fprintf(stderr, "cuda_emu: %s (block %u,%u,%u thread %u)\n", what, blockIdx.x, blockIdx.y, blockIdx.z, tid_x());
    std::abort();
}

// Gives the OS thread back to launch()'s scheduler until it resumes this fiber.
inline void yield();

// A barrier over `count` fibers. The last to arrive opens it and goes on; the others yield
// until it has opened.
struct Barrier {
    unsigned count, arrived = 0;
    unsigned long generation = 0;
    explicit Barrier(unsigned n) : count(n) {}
    void arrive_and_wait() {
        ++progress;
        const unsigned long g = generation;
        if (++arrived == count) {
            arrived = 0;
            ++generation;
            return;
        }
        while (generation == g) yield();
    }
};
}  // namespace emu
#define threadIdx (emu::cur->tid)

namespace emu {

constexpr int SLOT_WORDS = 10;  // the most any collective writes per lane (mma: a[4], b[2], c[4])
struct Warp {
    uint32_t slots[2][32][SLOT_WORDS];
    Barrier bar{32};
};
struct Block {
    Barrier bar;
    std::vector<std::unique_ptr<Warp>> warps;
    unsigned char* smem = nullptr;
    size_t smem_bytes = 0;
    // wgmma.h's side state of the block running here (per thread: wgmma ops and fences; the TMA
    // copies pending), kept with the block so that interleaved blocks do not share it.
    std::shared_ptr<void> wgmma_side, tma_side;
    unsigned first = 0, threads = 0;  // its fibers: sched.fibers[first .. first + threads)
    explicit Block(unsigned n) : bar(n), threads(n) {
        for (unsigned i = 0; i < n / 32; ++i) warps.emplace_back(new Warp());
    }
};
inline Block* block = nullptr;

inline unsigned lane() { return threadIdx.x & 31; }

// Publishes this lane's words; returns the slot set of this operation, valid until the next one.
inline const uint32_t (*exchange(const uint32_t* mine, int n))[SLOT_WORDS] {
    if (blockDim.x % 32 != 0) die("warp-collective operation with blockDim.x not a multiple of 32");
    Warp& w = *block->warps[threadIdx.x / 32];
    auto& set = w.slots[cur->phase++ & 1];
    std::memcpy(set[lane()], mine, sizeof(uint32_t) * (size_t)n);
    w.bar.arrive_and_wait();
    return set;
}

template <typename T>
inline uint32_t bits_of(T v) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return u;
}
template <typename T>
inline T of_bits(uint32_t u) {
    T v;
    std::memcpy(&v, &u, 4);
    return v;
}
template <typename T>
inline T shfl(T v, unsigned src) {
    const uint32_t mine = bits_of(v);
    auto set = exchange(&mine, 1);
    return of_bits<T>(set[src & 31][0]);
}

inline void ldmatrix(uint32_t* regs, int num, bool trans, const void* row_addr) {
    const uintptr_t a = (uintptr_t)row_addr;
    if (a & 15) die("ldmatrix: row address not 16-byte aligned");
    const uint32_t mine[2] = {(uint32_t)a, (uint32_t)(a >> 32)};
    auto set = exchange(mine, 2);
    auto row = [&](unsigned l) { return (const uint16_t*)((uintptr_t)set[l][0] | ((uintptr_t)set[l][1] << 32)); };
    const unsigned g = lane() >> 2, t = lane() & 3;
    for (int j = 0; j < num; ++j) {
        uint16_t lo, hi;
        if (!trans) {
            lo = row(8 * j + g)[2 * t];
            hi = row(8 * j + g)[2 * t + 1];
        } else {
            lo = row(8 * j + 2 * t)[g];
            hi = row(8 * j + 2 * t + 1)[g];
        }
        regs[j] = (uint32_t)lo | ((uint32_t)hi << 16);
    }
}

// The two 16-bit float formats the tensor cores take, widened exactly.
inline float bf16_to_f32(uint16_t h) { return of_bits<float>((uint32_t)h << 16); }
inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) return of_bits<float>(sign) + (sign ? -1.0f : 1.0f) * (float)man * 5.9604644775390625e-8f;
    if (exp == 31) return of_bits<float>(sign | 0x7f800000u | (man << 13));
    return of_bits<float>(sign | ((exp + 112) << 23) | (man << 13));
}

// d = a * b + c for one m16n8k16 tile; `is_f16` picks the operand format.
inline void mma_m16n8k16(float* d, const uint32_t* a, const uint32_t* b, const float* c, bool is_f16) {
    uint32_t mine[SLOT_WORDS];
    std::memcpy(mine, a, 16);
    std::memcpy(mine + 4, b, 8);
    std::memcpy(mine + 6, c, 16);
    auto set = exchange(mine, SLOT_WORDS);
    auto elem = [&](uint32_t word, int half) {
        const uint16_t h = (uint16_t)(half ? word >> 16 : word & 0xffffu);
        return is_f16 ? f16_to_f32(h) : bf16_to_f32(h);
    };
    // A[r][kk] lives in lane 4(r%8) + (kk%8)/2, register (r>=8) + 2(kk>=8), half kk&1.
    auto A = [&](int r, int kk) { return elem(set[4 * (r & 7) + ((kk & 7) >> 1)][(r >> 3) + 2 * (kk >> 3)], kk & 1); };
    // B[kk][col] lives in lane 4 col + (kk%8)/2, register 4 + (kk>=8), half kk&1.
    auto B = [&](int kk, int col) { return elem(set[4 * col + ((kk & 7) >> 1)][4 + (kk >> 3)], kk & 1); };
    const int g = (int)lane() >> 2, t = (int)lane() & 3;
    for (int i = 0; i < 4; ++i) {
        const int r = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float acc = c[i];
        for (int kk = 0; kk < 16; ++kk) {
            const float p = A(r, kk) * B(kk, col);  // exact: 8- or 11-bit significands
            acc = acc + p;
        }
        d[i] = acc;
    }
}

// The OCP e4m3fn byte b as f32, from the format (sign, 4 exponent bits of bias 7, 3 mantissa
// bits; exponent 0 subnormal, S.1111.111 NaN, no infinities): crates/core fp8.rs's decode.
inline float e4m3_to_f32(uint8_t b) {
    const uint32_t e = (b >> 3) & 15u, m = b & 7u;
    if (e == 15 && m == 7) return of_bits<float>(0x7fc00000u | ((uint32_t)(b & 0x80u) << 24));
    const float mag = e == 0 ? (float)m * 0.001953125f : of_bits<float>(((e + 120u) << 23) | (m << 20));
    return (b & 0x80u) ? -mag : mag;
}

// d = a * b + c for one m16n8k32 tile of e4m3 operands (mma.sync.aligned.m16n8k32.row.col.f32.
// e4m3.e4m3.f32). Fragments, PTX ISA "Matrix Fragments for mma.m16n8k32" (8-bit types):
// A a0..a15 in 4 registers of 4 bytes (byte i%4 of register i/4): row g for registers 0 and 2,
// g + 8 for 1 and 3; col 4t + i%4 (+16 for registers 2, 3). B b0..b7 in 2 registers: row (k)
// 4t + i%4 (+16 for register 1), col (n) g. C/D as m16n8k16. Each product of two e4m3 values
// is exact in f32 (4-bit significands); ASSUMPTION, as for m16n8k16: the 32 products of one
// element are added to the accumulator one after another in ascending k, each add rounded to
// f32. The hardware's fp8 accumulation is not documented (and reported to keep fewer bits than
// f32 inside one instruction): kernels may rely on every element computed the same way, never
// on this order.
inline void mma_m16n8k32_e4m3(float* d, const uint32_t* a, const uint32_t* b, const float* c) {
    uint32_t mine[SLOT_WORDS];
    std::memcpy(mine, a, 16);
    std::memcpy(mine + 4, b, 8);
    std::memcpy(mine + 6, c, 16);
    auto set = exchange(mine, SLOT_WORDS);
    auto byte = [](uint32_t word, int i) { return (uint8_t)(word >> (8 * i)); };
    // A[r][kk] lives in lane 4(r%8) + (kk%16)/4, register (r>=8) + 2(kk>=16), byte kk%4.
    auto A = [&](int r, int kk) {
        return e4m3_to_f32(byte(set[4 * (r & 7) + ((kk & 15) >> 2)][(r >> 3) + 2 * (kk >> 4)], kk & 3));
    };
    // B[kk][col] lives in lane 4 col + (kk%16)/4, register 4 + (kk>=16), byte kk%4.
    auto B = [&](int kk, int col) { return e4m3_to_f32(byte(set[4 * col + ((kk & 15) >> 2)][4 + (kk >> 4)], kk & 3)); };
    const int g = (int)lane() >> 2, t = (int)lane() & 3;
    for (int i = 0; i < 4; ++i) {
        const int r = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float acc = c[i];
        for (int kk = 0; kk < 32; ++kk) {
            const float p = A(r, kk) * B(kk, col);  // exact: 4-bit significands
            acc = acc + p;
        }
        d[i] = acc;
    }
}

inline void cp_async16(void* dst, const void* src, int src_bytes) {
    if (((uintptr_t)dst & 15) || (src_bytes > 0 && ((uintptr_t)src & 15))) die("cp.async: address not 16-byte aligned");
    if (src_bytes < 0 || src_bytes > 16) die("cp.async: src-size outside 0..16");
    std::memset(dst, 0xff, 16);
    cur->pending.push_back({dst, src, src_bytes, -1});
}
inline void cp_async_commit() {
    for (auto& c : cur->pending)
        if (c.group < 0) c.group = cur->committed;
    ++cur->committed;
}
// Completes every committed group but the newest `n`.
inline void cp_async_wait(int n) {
    const long done_below = cur->committed - n;
    std::vector<Copy> keep;
    for (auto& c : cur->pending) {
        if (c.group >= 0 && c.group < done_below) {
            std::memcpy(c.dst, c.src, (size_t)c.src_bytes);
            std::memset((char*)c.dst + c.src_bytes, 0, (size_t)(16 - c.src_bytes));
        } else {
            keep.push_back(c);
        }
    }
    cur->pending.swap(keep);
}

inline unsigned char* dynamic_smem() {
    if (!block->smem) die("dynamic shared memory used but the launch gave none");
    return block->smem;
}
}  // namespace emu

template <typename T>
inline T __ldg(const T* p) { return *p; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline void __syncthreads() { emu::block->bar.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) {
    const uint32_t none = 0;
    emu::exchange(&none, 1);
}
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int o) { return emu::shfl(v, emu::lane() ^ (unsigned)o); }
template <typename T>
inline T __shfl_sync(unsigned, T v, int src) { return emu::shfl(v, (unsigned)src); }
// Every lane's predicate, lane i in bit i (full mask only, as everywhere here).
inline unsigned __ballot_sync(unsigned, int pred) {
    const uint32_t mine = pred ? 1u : 0u;
    auto set = emu::exchange(&mine, 1);
    unsigned bits = 0;
    for (unsigned l = 0; l < 32; ++l) bits |= set[l][0] << l;
    return bits;
}
template <typename T>
inline T __shfl_down_sync(unsigned, T v, unsigned d) {
    const unsigned l = emu::lane();
    const T r = emu::shfl(v, l + d < 32 ? l + d : l);
    return r;
}
// Blocks run one after another here, so a fence orders nothing the emulation could reorder;
// a seq_cst fence keeps the call honest.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
template <typename A, typename B>
inline auto min(A a, B b) { return a < b ? a : b; }
template <typename A, typename B>
inline auto max(A a, B b) { return a < b ? b : a; }
inline void sincosf(float a, float* s, float* c) { *s = std::sin(a); *c = std::cos(a); }

namespace emu {
constexpr size_t STACK_BYTES = 256 * 1024;  // per fiber; the kernels keep a few KiB of locals
constexpr size_t GUARD_BYTES = 4096;        // PROT_NONE below each stack: an overflow faults

struct Scheduler {
    std::vector<std::unique_ptr<Fiber>> fibers;  // kept across launches, stacks reused
    unsigned live = 0;                           // fibers of this launch
    void (*entry)(void*) = nullptr;              // runs the kernel body as `cur`
    void* arg = nullptr;
#if defined(__x86_64__)
    void* sp = nullptr;
#else
    ucontext_t ctx;
#endif
};
#if defined(TANDEM_EMU_STRICT)
// Never destroyed: in the fake driver a kernel may still be running on another thread while the
// process exits and runs static destructors.
inline Scheduler& sched = *new Scheduler();
#else
inline Scheduler sched;
#endif

// Non-zero: launch() runs a grid's blocks in an order shuffled from this seed (the fake
// driver sets it per launch); zero: in index order, as the emulator tests expect.
inline unsigned long long block_order_seed = 0;
inline unsigned long long splitmix64(unsigned long long& s) {
    unsigned long long z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

inline void yield() {
    Fiber* f = cur;
#if defined(__x86_64__)
    tandem_emu_switch(&f->sp, sched.sp);
#else
    swapcontext(&f->ctx, &sched.ctx);
#endif
}

[[noreturn]] inline void fiber_main() {
    sched.entry(sched.arg);
    cur->pending.clear();  // copies never waited for never land
    cur->done = true;
    ++progress;
    yield();
    die("a finished fiber was resumed");
}

// Points fiber `f` at the start of fiber_main on a fresh stack.
inline void reset(Fiber& f) {
    if (!f.stack) {
        void* m = mmap(nullptr, STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) die("mmap of a fiber stack failed");
        if (mprotect(m, GUARD_BYTES, PROT_NONE) != 0) die("mprotect of a fiber stack guard failed");
        f.stack = (unsigned char*)m;
    }
    f.phase = 0;
    f.pending.clear();
    f.committed = 0;
    f.done = false;
    f.pdl_waited = f.pdl_at_wait = false;
#if defined(__x86_64__)
    // tandem_emu_switch pops six registers and returns: the return address is fiber_main, at
    // a 16-byte aligned slot, so fiber_main starts with rsp = 8 mod 16 as if called.
    uintptr_t top = ((uintptr_t)(f.stack + STACK_BYTES)) & ~(uintptr_t)15;
    void** slot = (void**)(top - 16);
    slot[0] = (void*)&fiber_main;
    slot[1] = nullptr;
    void** regs = slot - 6;
    for (int i = 0; i < 6; ++i) regs[i] = nullptr;
    f.sp = regs;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack + GUARD_BYTES;
    f.ctx.uc_stack.ss_size = STACK_BYTES - GUARD_BYTES;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, (void (*)())fiber_main, 0);
#endif
}

// warp_greedy (set by a test around a launch): each round runs one warp's fibers again and
// again until none of them moves (all parked at a block barrier, or returned) before the next
// warp starts, so warps drift apart as far as a GPU may let them between block barriers,
// instead of moving in step from one warp collective to the next. A block barrier that a
// kernel needs between one warp's shared-memory writes (or cp.async copies, which land at the
// issuing thread's wait) and another warp's reads is then seen missing: the reader finds the
// 0xFF poison.
inline bool warp_greedy = false;

// One round over fibers [first, first + count): each runs until it waits at a barrier or
// returns. Returns how many have returned; dies if nothing moved (a barrier nobody can open).
inline unsigned run_round(unsigned first, unsigned count) {
    const unsigned long before = progress;
    auto resume = [](unsigned i) {
        Fiber& f = *sched.fibers[i];
        if (f.done) return;
        cur = &f;
#if defined(__x86_64__)
        tandem_emu_switch(&sched.sp, f.sp);
#else
        swapcontext(&sched.ctx, &f.ctx);
#endif
        cur = nullptr;
    };
    if (warp_greedy && count % 32 == 0) {
        for (unsigned w = first; w < first + count; w += 32)
            for (unsigned long mark = progress - 1; mark != progress;) {
                mark = progress;
                for (unsigned i = w; i < w + 32; ++i) resume(i);
            }
    } else {
        for (unsigned i = first; i < first + count; ++i) resume(i);
    }
    unsigned done = 0;
    for (unsigned i = first; i < first + count; ++i) done += sched.fibers[i]->done ? 1u : 0u;
    if (done < count && progress == before) die("deadlock: a barrier some threads of the block never reach (an early return, or a divergent collective)");
    return done;
}

// Runs every fiber until each has returned: round robin, each until it waits at a barrier.
inline void run_block() {
    while (run_round(0, sched.live) < sched.live) {
    }
}

// Programmatic dependent launch (kernels/common.cuh PDL_WAIT / PDL_LAUNCH_DEPENDENTS). A launch
// the caller marks as a dependent (`pdl.primary` set: the fake driver, for a launch with the
// programmatic-stream-serialization attribute that follows another kernel) runs BEFORE its
// primary, which runs from inside it: once every thread of the first block to get there is
// parked at its PDL_WAIT (or has returned), the primary grid runs to completion, then the
// dependent goes on. So whatever a dependent reads before its wait it reads from memory its
// primary has not written yet (the previous step's values, or 0xFF poison), as a GPU may let
// it: a read of the primary's output above the wait gives wrong bits (the blocks resident
// beside the first, in the interleaved order, have run part of their prologue too). With
// `pdl.late` (a deliberate break), the primary runs only after the first block of the
// dependent has finished, as if that block had no wait at all. Per thread: at most one
// PDL_WAIT, and PDL_LAUNCH_DEPENDENTS only after it (our convention, kernels/README.md).
struct Pdl {
    void (*primary)(void*) = nullptr;  // runs the primary grid; cleared once it has run
    void* arg = nullptr;
    bool late = false;
    bool ran_late = false;  // the primary ran because no thread had waited for it
    unsigned long waits = 0, triggers = 0;  // PDL_WAIT / PDL_LAUNCH_DEPENDENTS calls, all launches
};
inline Pdl pdl;
inline Scheduler* pdl_sched = nullptr;  // the primary's fibers, kept for the next time

// Runs the pending primary grid now, from inside its dependent's launch: the emulator's state
// of the dependent (scheduler, fibers, block, dims, the `__shared__` section) is set aside and
// restored, the primary running on a second set of fibers.
inline void pdl_run_primary() {
    void (*f)(void*) = pdl.primary;
    void* arg = pdl.arg;
    pdl.primary = nullptr;
    if (!pdl_sched) pdl_sched = new Scheduler();
    Scheduler* const other = pdl_sched;
    Fiber* const c = cur;
    Block* const b = block;
    const dim3 g = gridDim, bd = blockDim, bi = blockIdx;
    const unsigned long serial = block_serial, prog = progress;
    const unsigned long long seed = block_order_seed;
    const Pdl saved = pdl;
#if defined(TANDEM_EMU_STRICT)
    const size_t sec = (size_t)(__stop_tandem_emu_shared - __start_tandem_emu_shared);
    std::vector<unsigned char> section(__start_tandem_emu_shared, __start_tandem_emu_shared + sec);
#endif
    std::swap(sched, *other);
    cur = nullptr;
    pdl = Pdl{};  // the primary's own counts are not the dependent's
    f(arg);
    std::swap(sched, *other);
    cur = c;
    block = b;
    gridDim = g;
    blockDim = bd;
    blockIdx = bi;
    block_serial = serial;
    progress = prog + 1;
    block_order_seed = seed;
    pdl = saved;
#if defined(TANDEM_EMU_STRICT)
    if (sec > 0) std::memcpy(__start_tandem_emu_shared, section.data(), sec);
#endif
}

inline void pdl_wait() {
    if (!cur) die("PDL_WAIT outside a kernel");
    if (cur->pdl_waited) die("PDL_WAIT twice in one thread");
    cur->pdl_waited = true;
    ++pdl.waits;
    if (!pdl.primary || pdl.late) return;
    cur->pdl_at_wait = true;
    ++progress;
    for (;;) {
        if (!pdl.primary) break;
        unsigned parked = 0;
        for (unsigned i = block->first; i < block->first + block->threads; ++i) {
            const Fiber& f = *sched.fibers[i];
            parked += f.done || f.pdl_at_wait;
        }
        if (parked == block->threads) {
            pdl_run_primary();
            break;
        }
        yield();
    }
    cur->pdl_at_wait = false;
}

inline void pdl_launch_dependents() {
    if (!cur) die("PDL_LAUNCH_DEPENDENTS outside a kernel");
    if (!cur->pdl_waited) die("PDL_LAUNCH_DEPENDENTS before this thread's PDL_WAIT");
    ++pdl.triggers;
}

// After each block: in the late mode (a deliberate break) the primary runs now.
inline void pdl_block_done() {
    if (pdl.primary && pdl.late) {
        pdl.ran_late = true;
        pdl_run_primary();
    }
}

// After the grid: a primary still pending (no thread waited) runs now, and that is recorded.
inline void pdl_launch_done() {
    if (pdl.primary) {
        pdl.ran_late = true;
        pdl_run_primary();
    }
}

#if defined(TANDEM_EMU_STRICT)
// The fake driver's order: 2 to 4 blocks of the grid (the "slots", drawn from the seed) are
// resident at once, and after each round of one slot's fibers (every fiber to its next barrier,
// warp-collective or block-wide) the next slot to run is drawn from the seed, so blocks interleave
// at barriers: a block can pass its arrival at a last-block fold while others are still midway,
// and the block that folds meets partials in many arrival orders. Each slot has its own fibers,
// barrier and warp state, dynamic arena and copy of the `__shared__` section (swapped in and out
// of the section when the slot changes, since a `__shared__` object is one static).
inline void run_interleaved(const std::vector<unsigned long long>& order, unsigned n, size_t shared_bytes, unsigned long long seed) {
    const size_t sec = (size_t)(__stop_tandem_emu_shared - __start_tandem_emu_shared);
    unsigned long long st = seed ^ 0x5bd1e995ull;
    const unsigned want = 2 + (unsigned)(splitmix64(st) % 3);
    const unsigned k = (unsigned)std::min<unsigned long long>(want, order.size());
    struct Slot {
        std::unique_ptr<Block> b;
        std::unique_ptr<unsigned char, decltype(&std::free)> arena{nullptr, &std::free};
        std::vector<unsigned char> section;
        dim3 idx;
        unsigned long serial = 0;  // block_serial while this slot's block runs
        bool busy = false;
    };
    std::vector<Slot> slots(k);
    auto& s = sched;
    while (s.fibers.size() < (size_t)n * k) s.fibers.emplace_back(new Fiber());
    for (Slot& sl : slots) {
        sl.b.reset(new Block(n));
        sl.b->first = (unsigned)(&sl - slots.data()) * n;
        if (shared_bytes > 0) {
            // 1024-byte aligned, as launch() gives (the 128-byte swizzle of wgmma.h needs it).
            sl.arena.reset((unsigned char*)std::aligned_alloc(1024, (shared_bytes + 1023) / 1024 * 1024));
            sl.b->smem = sl.arena.get();
            sl.b->smem_bytes = shared_bytes;
        }
        sl.section.assign(sec, 0xff);
    }
    size_t next = 0;
    int in = -1;  // the slot whose `__shared__` copy is in the section now
    auto start = [&](unsigned i) {
        Slot& sl = slots[i];
        const unsigned long long id = order[next++];
        sl.idx = dim3{(unsigned)(id % gridDim.x), (unsigned)(id / gridDim.x % gridDim.y), (unsigned)(id / ((unsigned long long)gridDim.x * gridDim.y))};
        if (sl.b->smem) std::memset(sl.b->smem, 0xff, sl.b->smem_bytes);
        std::fill(sl.section.begin(), sl.section.end(), (unsigned char)0xff);
        if (in == (int)i && sec > 0) std::memset(__start_tandem_emu_shared, 0xff, sec);
        sl.serial = ++block_serial;
        sl.b->bar = Barrier(n);
        for (auto& w : sl.b->warps) w->bar = Barrier(32);
        for (unsigned t = 0; t < n; ++t) {
            Fiber& f = *s.fibers[(size_t)i * n + t];
            reset(f);
            f.tid = dim3{t % blockDim.x, (t / blockDim.x) % blockDim.y, t / (blockDim.x * blockDim.y)};
        }
        sl.busy = true;
    };
    for (unsigned i = 0; i < k; ++i) start(i);
    for (unsigned busy = k; busy > 0;) {
        unsigned pick = (unsigned)(splitmix64(st) % busy), i = 0;
        for (;; ++i)
            if (slots[i].busy && pick-- == 0) break;
        Slot& sl = slots[i];
        if (in != (int)i && sec > 0) {
            if (in >= 0) std::memcpy(slots[in].section.data(), __start_tandem_emu_shared, sec);
            std::memcpy(__start_tandem_emu_shared, sl.section.data(), sec);
        }
        in = (int)i;
        blockIdx = sl.idx;
        block_serial = sl.serial;
        block = sl.b.get();
        if (run_round(i * n, n) == n) {
            pdl_block_done();
            if (next < order.size()) {
                start(i);
            } else {
                sl.busy = false;
                --busy;
            }
        }
    }
}
#endif
}  // namespace emu

// Runs f() as every thread of every block of the grid: the block's threads as fibers on this
// OS thread (see the top of this file), one block after another. `shared_bytes` of dynamic
// shared memory are poisoned (0xFF) before each block.
template <typename F>
void launch(dim3 grid, dim3 block, F f, size_t shared_bytes = 0) {
    if (emu::cur) emu::die("launch from inside a kernel");
    gridDim = grid;
    blockDim = block;
    const unsigned n = block.x * block.y * block.z;
    emu::Block b(n);
    std::unique_ptr<unsigned char, decltype(&std::free)> arena(nullptr, &std::free);
    if (shared_bytes > 0) {
        // 1024-byte aligned: the 128-byte swizzle of TMA and wgmma (wgmma.h) is a function of
        // address bits 4-9, as on the GPU.
        arena.reset((unsigned char*)std::aligned_alloc(1024, (shared_bytes + 1023) / 1024 * 1024));
        b.smem = arena.get();
        b.smem_bytes = shared_bytes;
    }
    auto& s = emu::sched;
    while (s.fibers.size() < n) s.fibers.emplace_back(new emu::Fiber());
    s.live = n;
    s.entry = [](void* p) { (*(F*)p)(); };
    s.arg = &f;
    emu::block = &b;
    const unsigned long long blocks = (unsigned long long)grid.x * grid.y * grid.z;
    // Blocks in index order, or (block_order_seed != 0) in a Fisher-Yates shuffle drawn from
    // the seed, so a fold by the last block to arrive meets other arrival orders.
    std::vector<unsigned long long> order(blocks);
    for (unsigned long long i = 0; i < blocks; ++i) order[i] = i;
    if (emu::block_order_seed != 0) {
        unsigned long long st = emu::block_order_seed;
        for (unsigned long long i = blocks; i > 1; --i) std::swap(order[i - 1], order[emu::splitmix64(st) % i]);
    }
#if defined(TANDEM_EMU_STRICT)
    if (emu::block_order_seed != 0 && blocks > 1) {
        emu::run_interleaved(order, n, shared_bytes, emu::block_order_seed);
        emu::pdl_launch_done();
        emu::block = nullptr;
        return;
    }
#endif
    for (const unsigned long long id : order) {
        blockIdx = dim3{(unsigned)(id % grid.x), (unsigned)(id / grid.x % grid.y), (unsigned)(id / ((unsigned long long)grid.x * grid.y))};
        ++emu::block_serial;
        if (b.smem) std::memset(b.smem, 0xff, b.smem_bytes);
#if defined(TANDEM_EMU_STRICT)
        if (+__start_tandem_emu_shared != +__stop_tandem_emu_shared)
            std::memset(__start_tandem_emu_shared, 0xff, (size_t)(__stop_tandem_emu_shared - __start_tandem_emu_shared));
#endif
        for (unsigned t = 0; t < n; ++t) {
            emu::reset(*s.fibers[t]);
            s.fibers[t]->tid = dim3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
        }
        emu::run_block();
        emu::pdl_block_done();
    }
    emu::pdl_launch_done();
    emu::block = nullptr;
}

// Hopper (sm_90a): wgmma, TMA, mbarrier.
#include "wgmma.h"
