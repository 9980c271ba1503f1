// cuda_emu.h — just enough of CUDA to run kernels/*.cu on the CPU, for a GPU-less box.
//
// Every CUDA thread of a block is a std::thread; blocks run one after another, so a
// `__shared__` variable can be a plain function-local static. __syncthreads is a std::barrier
// over the block; warp shuffles exchange through a per-warp slot array between two barriers
// over the warp's 32 threads. That is slow (fine for test shapes) but runs the real kernel
// code, including its barriers and reductions, in the same order as on a GPU.
// Limits: blockDim.x a multiple of 32, every lane of a warp reaches each shuffle, a block
// returns early only as a whole (all true of our kernels); no atomics, no dynamic smem.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define TANDEM_HOST_EMU 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
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

namespace emu {
struct Warp {
    float vals[32];
    std::barrier<> bar{32};
};
struct Block {
    std::barrier<> bar;
    std::vector<std::unique_ptr<Warp>> warps;
    explicit Block(unsigned n) : bar((std::ptrdiff_t)n) {
        for (unsigned i = 0; i < n / 32; ++i) warps.emplace_back(new Warp());
    }
};
inline thread_local Block* block = nullptr;
}  // namespace emu

inline dim3 gridDim, blockDim;
inline thread_local dim3 threadIdx, blockIdx;

template <typename T>
inline T __ldg(const T* p) { return *p; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline void __syncthreads() { emu::block->bar.arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
    emu::Warp& w = *emu::block->warps[threadIdx.x / 32];
    const unsigned lane = threadIdx.x & 31;
    w.vals[lane] = v;
    w.bar.arrive_and_wait();
    const float r = w.vals[lane ^ (unsigned)o];
    w.bar.arrive_and_wait();
    return r;
}
template <typename A, typename B>
inline auto min(A a, B b) { return a < b ? a : b; }
inline void sincosf(float a, float* s, float* c) { *s = std::sin(a); *c = std::cos(a); }

// Runs f() as every thread of every block of the grid. One OS thread per CUDA thread of a
// block, reused for every block in turn; a barrier between blocks keeps the `static` shared
// memory of one block from being touched by the next.
template <typename F>
void launch(dim3 grid, dim3 block, F f) {
    gridDim = grid;
    blockDim = block;
    const unsigned n = block.x * block.y * block.z;
    emu::Block b(n);
    std::barrier<> between((std::ptrdiff_t)n);
    std::vector<std::thread> ts;
    ts.reserve(n);
    for (unsigned t = 0; t < n; ++t)
        ts.emplace_back([&, t] {
            emu::block = &b;
            threadIdx = dim3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
            for (unsigned bz = 0; bz < grid.z; ++bz)
                for (unsigned by = 0; by < grid.y; ++by)
                    for (unsigned bx = 0; bx < grid.x; ++bx) {
                        blockIdx = dim3{bx, by, bz};
                        f();
                        between.arrive_and_wait();
                    }
        });
    for (auto& th : ts) th.join();
}
