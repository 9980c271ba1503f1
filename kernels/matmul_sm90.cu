// matmul_sm90.cu — y = x · Wᵀ (+ bias) for prefill on Hopper: wgmma + TMA (sm_90a only).
//
// A VARIANT of kernels/matmul.cu's large-m tile kernels (TANDEM_CUDA_GEMM_LARGE=wgmma; off by
// default), in its own file because it exists only for sm_90a: NVRTC compiles this file for
// --gpu-architecture=sm_90a on an sm_90 device, and to an empty module elsewhere (the body is
// under __CUDA_ARCH_FEAT_SM90_ALL, which NVRTC defines for sm_90a). It keeps matmul.cu's CONTRACT (read it there): for bf16 / f16
// weights every output element is the same sequence of k16 steps in ascending k, accumulated
// in f32 from 0 at every K slice (slices of `slice_len`, a multiple of 32, from matmul.rs
// `k_slices`), slices folded in index order in registers, then + bias. The k16 steps here are
// wgmma m64n128k16 instead of mma.sync m16n8k16: the emulator (kernels/emu/wgmma.h) sums one
// k16 step of either in the same order, so there the bits are equal (kernels/emu/sm90_test.cpp
// checks it bitwise against the mma.sync kernel). On the GPU that equality is UNPROVEN until a
// GPU check compares the two bitwise (crates/cuda/tests gpu_wgmma, gpu/tune.sh): the hardware's
// order inside one instruction is undocumented and may differ between mma.sync and wgmma.
//
// Scope (the launcher, matmul.rs `wgmma_applies`, falls back to the mma.sync kernel
// otherwise): x stored in 16 bits (xa [m, kp], from matmul_x or the backend's activation
// storage), kp % 8 == 0 and k % 8 == 0 (TMA needs 16-byte row strides), k >= 1, m > 128 (one
// block per tile, no split K), no input norm (fused only at <= FUSE_NORM_MAX_TOKENS rows).
// Every epilogue of matmul.cu (`Epilogue`, the same kernel arguments as matmul_tc_*): EPI_PLAIN,
// EPI_QKV, EPI_QKV_ROPE (head_dim dividing 128: every head inside a 128-wide tile), EPI_SILU, EPI_GEGLU,
// EPI_RESID, each applied by matmul.cu's own functions (epilogue_store from the registers;
// epilogue_rope_tile / epilogue_silu_tile over a staged tile), so the bits are the mma.sync
// kernels' (sm90_test.cpp compares every output of each, bitwise).
//
// Block: 384 threads = 3 warpgroups, output tile 128 x 128 (BM x BN).
//   warpgroup 0, the producer: thread 0 walks the k tiles (BK = 64 columns, 128 bytes of a
//     16-bit row: one 128-byte swizzle atom wide); per tile it waits for the stage to be free
//     (mbarrier empty[s]), arms full[s] with the tile's bytes (arrive.expect_tx) and issues two
//     TMA copies (x's 128 x 64 box, w's 128 x 64 box, 128-byte swizzle, out of bounds as zeros:
//     the m, n and k edges). STAGES = 4 stages of 32 KiB.
//   warpgroups 1 and 2, the consumers: rows 64 c .. 64 c + 63 of the tile each; per k tile they
//     wait for full[s], issue one wgmma m64n128k16 per k16 step (ascending k; a step at or past
//     k is skipped: it would add exact zeros) and commit them as one group; then, with ONE
//     group kept in flight (as CUTLASS's Hopper main loop), wgmma.wait_group 1 (every group but
//     this tile's has completed) and each warp's lane 0 arrives on empty[] of the PREVIOUS
//     tile's stage (8 arrivals free it), so the tensor cores never wait for the release. Where a
//     K slice ends inside a tile, every step before it is waited for (wait_group 0) and the
//     slice folded (total = acc, then total += acc) before the next step; so at the end.
//   Epilogue: the accumulator layout gives warp v of a consumer its 16 rows x all 128 columns,
//     so the pairs the rope (head_dim / 2 apart) and silu (gate and up 32 apart) epilogues
//     combine lie in one warp: it stages its rows (+ bias) in its own 16 x 129 floats of shared
//     memory, __syncwarp, and runs the tile epilogue over them; the others store from registers.
//   Shared memory: 1024 bytes of alignment slack (the 128-byte swizzle is a function of address
//   bits 4-9, so each stage starts 1024-aligned), STAGES x (16 KiB of x + 16 KiB of w), the
//   2 x STAGES mbarriers, then 8 warps x 16 x 129 floats: WGMMA_SMEM_BYTES = 198208 (opt-in;
//   one block per SM, as the 384-thread bound and 132 KiB of stages already gave).
// The persistent, warp-specialised kernels `matmul_wgmma_ws_<dt>` (128 x 128 tiles) and
// `matmul_wgmma_ws256_<dt>` (128 x 256 tiles) (TANDEM_CUDA_GEMM_LARGE=wgmma_ws; off by default):
// the same arithmetic and epilogues per output tile as matmul_wgmma_<dt>, but
//   - a persistent tile scheduler: grid = min(tiles, SMs) blocks (matmul.rs passes the device's
//     SM count), block b takes tiles b, b + gridDim.x, ... of the row-major (row tile, column
//     tile) order; the producer's and the consumers' stage counter runs on across tiles (stage
//     it % STAGES, phase (it / STAGES) & 1), so the TMA loads of the next tile overlap this
//     tile's epilogue; the consumers release a tile's last stage once its wgmma group is done;
//   - 128 x 256 tiles (m64n256k16, 128 accumulators a consumer thread, 3 stages of 48 KiB) only
//     where the GEMM has ONE K slice (matmul.rs `wgmma_ws_wide`: slice_len >= k, e.g. the
//     lm_head): a fold needs a second set of 128 registers, which 384 threads cannot hold. The
//     producer warpgroup gives registers back (setmaxnreg.dec 40) and the consumers take them
//     (setmaxnreg.inc 232): 40 x 128 + 232 x 256 = 64512 of the SM's 65536;
//   - every epilogue stages the warp's rows (+ bias) in its 16 x 129 floats, a 128-column half
//     at a time (a 128 x 256 tile: two halves in turn; a head or a gate/up pair never crosses a
//     128-column boundary: head_dim divides 128, pairs lie in 64-column groups), then applies
//     matmul.cu's function for it (rope tile, silu tile, or epilogue_store element by element,
//     lanes along a row): one inlined copy of each, not one per accumulator register.
//   Shared memory: WGMMA_WS_SMEM(BN) (198208 bytes at 128, 214576 at 256).
// Test hooks (kernels/emu/sm90_test.cpp defines TANDEM_WGMMA_BREAK as a variable it sets from its
// argument, N = 1..9; everywhere else it is the constant 0; each must be caught):
//   1 a wrong accumulator fragment index in the epilogue, 2 the wgmma wait before a stage is
//   released dropped, 3 the consumers wait for full[s] with the wrong parity, 4 the descriptors
//   say no swizzle, 5 the producer arrives without expect_tx, 6 the staged tile (rope) without
//   the bias, 7 a warp's staged rows placed without its warpgroup's 64-row offset (rope, silu),
//   8 every epilogue stored as the plain one (qkv, rope, silu, residual), 9 the stage of the
//   tile whose wgmma group is still in flight released (not the previous tile's); the
//   persistent kernels: 10 the second 128-column half of a 128 x 256 tile stored over the first,
//   11 the accumulators not cleared between a block's tiles.
#include "common.cuh"
// matmul.cu's device code (Epilogue, RopeKv, epilogue_store and the staged-tile epilogues), not
// its kernels: the epilogues are applied by the same functions the mma.sync kernels call.
#define TANDEM_MATMUL_DEVICE_ONLY
#include "matmul.cu"

#ifndef TANDEM_WGMMA_BREAK
#define TANDEM_WGMMA_BREAK 0
#endif
#ifdef TANDEM_HOST_EMU
#define __grid_constant__
#endif

#define WGMMA_BM 128
#define WGMMA_BN 128
#define WGMMA_BK 64
#define WGMMA_STAGES 4
#define WGMMA_THREADS 384
#define WGMMA_STAGE_ELEMS (WGMMA_BM * WGMMA_BK)  // per operand (BM == BN)
#define WGMMA_CS_FLOATS (16 * (WGMMA_BN + 1))  // one consumer warp's staged rows (rope, silu)
#define WGMMA_SMEM_BYTES (1024 + WGMMA_STAGES * 2 * WGMMA_STAGE_ELEMS * 2 + 2 * WGMMA_STAGES * 8 + 8 * WGMMA_CS_FLOATS * 4)

#if defined(TANDEM_HOST_EMU) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <typename T>
__device__ void matmul_wgmma_impl(const TmaMap* xmap, const TmaMap* wmap, const void* __restrict__ bias, int bias_dtype, const Epilogue& ep, int m,
                                  int n, int k, int slice_len, const RopeKv& rk) {
    TANDEM_DYNAMIC_SMEM(raw);
    unsigned char* base = raw + ((1024u - (smem_u32(raw) & 1023u)) & 1023u);
    u16* As = reinterpret_cast<u16*>(base);
    u16* Bs = As + WGMMA_STAGES * WGMMA_STAGE_ELEMS;
    u64* full = reinterpret_cast<u64*>(Bs + WGMMA_STAGES * WGMMA_STAGE_ELEMS);
    u64* empty = full + WGMMA_STAGES;
    const int wg = threadIdx.x / 128, m0 = blockIdx.y * WGMMA_BM, n0 = blockIdx.x * WGMMA_BN;
    const int nt = (k + WGMMA_BK - 1) / WGMMA_BK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < WGMMA_STAGES; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 8);  // one arrival per consumer warp
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) {  // the producer; its other threads have nothing to do
        if (threadIdx.x != 0) return;
        for (int i = 0; i < nt; ++i) {
            const int s = i % WGMMA_STAGES;
            // Round i / STAGES of stage s: the consumers freed it in the previous round (a
            // fresh barrier's parity-1 phase counts as complete, so round 0 does not wait).
            mbar_wait(&empty[s], ((i / WGMMA_STAGES) & 1) ^ 1);
            if (TANDEM_WGMMA_BREAK == 5) mbar_arrive(&full[s]);
            else mbar_arrive_expect_tx(&full[s], 2 * WGMMA_STAGE_ELEMS * 2);
            tma_load_2d(As + s * WGMMA_STAGE_ELEMS, xmap, i * WGMMA_BK, m0, &full[s]);
            tma_load_2d(Bs + s * WGMMA_STAGE_ELEMS, wmap, i * WGMMA_BK, n0, &full[s]);
        }
        return;
    }

    const int cw = wg - 1, lane = threadIdx.x & 31;
    const u32 swz = TANDEM_WGMMA_BREAK == 4 ? 0 : 1;  // 128-byte swizzle, as the TMA boxes are written
    float acc[64], total[64];
#pragma unroll
    for (int q = 0; q < 64; ++q) acc[q] = total[q] = 0.0f;
    bool first_slice = true;
    int next_fold = slice_len;
    // The stage of the previous k tile, not released yet: its wgmma group may still be in flight.
    int held = -1;
    auto release = [&](int st) {
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[st]);
    };
    for (int i = 0; i < nt; ++i) {
        const int s = i % WGMMA_STAGES;
        mbar_wait(&full[s], ((i / WGMMA_STAGES) & 1) ^ (TANDEM_WGMMA_BREAK == 3 ? 1 : 0));
        // This warpgroup's 64 rows of x start 64 rows (8 KiB, 8 atoms) into the stage.
        const u32 a0 = smem_u32(As + s * WGMMA_STAGE_ELEMS) + (u32)cw * 64 * 128, b0 = smem_u32(Bs + s * WGMMA_STAGE_ELEMS);
        wgmma_fence_regs(acc);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < WGMMA_BK / 16; ++j) {
            const int kc = i * WGMMA_BK + 16 * j;
            if (kc >= k) break;
            if (kc == next_fold) {  // a K slice ends before this step: fold it (matmul.cu's order)
                next_fold += slice_len;
                wgmma_commit();
                wgmma_wait<0>();
                wgmma_fence_regs(acc);
#pragma unroll
                for (int q = 0; q < 64; ++q) {
                    total[q] = first_slice ? acc[q] : total[q] + acc[q];
                    acc[q] = 0.0f;
                }
                first_slice = false;
                wgmma_fence_regs(acc);
                wgmma_fence();
            }
            // K-major, 8-row atoms 1024 bytes apart (SBO); step j starts 32 bytes into the row.
            wgmma_m64n128k16(T{}, acc, wgmma_desc(a0 + 32 * j, 16, 1024, swz), wgmma_desc(b0 + 32 * j, 16, 1024, swz));
        }
        wgmma_commit();
        // One group in flight (CUTLASS's Hopper main loop): every group but this tile's has
        // completed, so the previous tile's stage has been read and may be refilled while the
        // tensor cores work on this one.
        if (TANDEM_WGMMA_BREAK != 2) wgmma_wait<1>();
        wgmma_fence_regs(acc);
        if (TANDEM_WGMMA_BREAK == 9) {
            release(s);  // the bug: this tile's group is still in flight
        } else {
            if (held >= 0) release(held);
            held = s;
        }
    }  // the last tile's stage is never released: the producer loads nothing more
    wgmma_wait<0>();
    wgmma_fence_regs(acc);
    if (nt > 0)
#pragma unroll
        for (int q = 0; q < 64; ++q) total[q] = first_slice ? acc[q] : total[q] + acc[q];

    // Accumulator fragment (PTX ISA, wgmma m64nNk16 D): register q at row 16 v + g + 8 ((q / 2) % 2),
    // column 8 (q / 4) + 2 t + q % 2 of the warpgroup's 64 x 128 tile (v: warp in the group).
    // So warp v holds whole rows: its 16 rows x 128 columns, every column of the tile.
    const int v = (threadIdx.x % 128) / 32, g = lane >> 2, t = lane & 3;
    const int wr0 = m0 + (TANDEM_WGMMA_BREAK == 7 ? 0 : 64 * cw) + 16 * v;  // the warp's first row
    if (TANDEM_WGMMA_BREAK != 8 && (ep.kind == EPI_QKV_ROPE || ep.kind == EPI_SILU || ep.kind == EPI_GEGLU)) {
        // A rope pair (head_dim / 2 apart) and a gate/up pair (32 apart) lie in one row, so in
        // one warp: the warp stages its 16 rows (+ bias, as qkv_proj stores it; silu has none)
        // in its own words of shared memory and applies matmul.cu's tile epilogue to them.
        float* Cs = reinterpret_cast<float*>(empty + WGMMA_STAGES) + (4 * cw + v) * WGMMA_CS_FLOATS;
        const bool add_bias = bias_dtype && TANDEM_WGMMA_BREAK != 6;
#pragma unroll
        for (int q = 0; q < 64; ++q) {
            const int rl = g + 8 * ((q / 2) % 2), cl = 8 * (q / 4) + 2 * t + q % 2, c = n0 + cl;
            Cs[rl * (WGMMA_BN + 1) + cl] = add_bias && c < n ? total[q] + load_bias(bias, bias_dtype, c) : total[q];
        }
        __syncwarp();
        if (ep.kind == EPI_QKV_ROPE) epilogue_rope_tile<16, WGMMA_BN, 32>(Cs, lane, wr0, n0, m, n, ep, rk);
        else epilogue_silu_tile<T, 16, WGMMA_BN, 32>(Cs, lane, wr0, n0, m, ep);
        return;
    }
#pragma unroll
    for (int q = 0; q < 64; ++q) {
        const bool bad = TANDEM_WGMMA_BREAK == 1;  // swaps the row and column bits of q
        const int r = wr0 + g + 8 * (bad ? q % 2 : (q / 2) % 2), c = n0 + 8 * (q / 4) + 2 * t + (bad ? (q / 2) % 2 : q % 2);
        if (r >= m || c >= n) continue;
        const float val = bias_dtype ? total[q] + load_bias(bias, bias_dtype, c) : total[q];
        if (TANDEM_WGMMA_BREAK == 8) ep.out0[(size_t)r * n + c] = val;  // the bug: every epilogue taken as the plain one
        else epilogue_store<T>(ep, r, c, n, val);
    }
}

#define MATMUL_WGMMA(DT, T)                                                                                                          \
    extern "C" __global__ void __launch_bounds__(WGMMA_THREADS, 1)                                                                  \
        matmul_wgmma_##DT(const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap, const void* bias, int bias_dtype, \
                          float* out0, float* out1, float* out2, int epi, int en0, int en1, const void* ep_gamma, int ep_gamma_dtype,   \
                          int ep_act16, int m, int n, int k, int slice_len, RopeKv rope_kv) {                                       \
        const Epilogue ep{out0, out1, out2, epi, en0, en1, ep_gamma, ep_gamma_dtype, ep_act16};                                      \
        matmul_wgmma_impl<T>(&xmap, &wmap, bias, bias_dtype, ep, m, n, k, slice_len, rope_kv);                                      \
    }
MATMUL_WGMMA(bf16, bf16_t)
MATMUL_WGMMA(f16, f16_t)
// ---- the persistent, warp-specialised kernels (header: "The persistent ...") ----------------
#define WGMMA_WS_STAGES(BN) ((BN) == 256 ? 3 : 4)
#define WGMMA_WS_SMEM(BN) (1024 + WGMMA_WS_STAGES(BN) * (WGMMA_BM + (BN)) * WGMMA_BK * 2 + 2 * WGMMA_WS_STAGES(BN) * 8 + 8 * WGMMA_CS_FLOATS * 4)

template <typename T, int BN>
__device__ void matmul_wgmma_ws_impl(const TmaMap* xmap, const TmaMap* wmap, const void* __restrict__ bias, int bias_dtype, const Epilogue& ep, int m,
                                     int n, int k, int slice_len, const RopeKv& rk) {
    constexpr int STAGES = WGMMA_WS_STAGES(BN), A_ELEMS = WGMMA_BM * WGMMA_BK, B_ELEMS = BN * WGMMA_BK, ACC = BN / 2;
    // 128-wide tiles fold K slices in registers; 256-wide ones serve one-slice GEMMs only.
    constexpr bool FOLD = BN == 128;
    TANDEM_DYNAMIC_SMEM(raw);
    unsigned char* base = raw + ((1024u - (smem_u32(raw) & 1023u)) & 1023u);
    u16* As = reinterpret_cast<u16*>(base);
    u16* Bs = As + STAGES * A_ELEMS;
    u64* full = reinterpret_cast<u64*>(Bs + STAGES * B_ELEMS);
    u64* empty = full + STAGES;
    const int wg = threadIdx.x / 128;
    const int ntn = (n + BN - 1) / BN, ntiles = ((m + WGMMA_BM - 1) / WGMMA_BM) * ntn;
    const int nt = (k + WGMMA_BK - 1) / WGMMA_BK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 8);  // one arrival per consumer warp
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) {  // the producer: thread 0 walks every k tile of every tile of this block
        if (BN == 256) setmaxnreg_dec<40>();
        if (threadIdx.x != 0) return;
        int it = 0;
        for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
            const int m0 = (tile / ntn) * WGMMA_BM, n0 = (tile % ntn) * BN;
            for (int i = 0; i < nt; ++i, ++it) {
                const int s = it % STAGES;
                mbar_wait(&empty[s], ((it / STAGES) & 1) ^ 1);
                mbar_arrive_expect_tx(&full[s], (A_ELEMS + B_ELEMS) * 2);
                tma_load_2d(As + s * A_ELEMS, xmap, i * WGMMA_BK, m0, &full[s]);
                tma_load_2d(Bs + s * B_ELEMS, wmap, i * WGMMA_BK, n0, &full[s]);
            }
        }
        return;
    }
    if (BN == 256) setmaxnreg_inc<232>();

    const int cw = wg - 1, lane = threadIdx.x & 31;
    const int v = (threadIdx.x % 128) / 32, g = lane >> 2, t = lane & 3;
    float* Cs = reinterpret_cast<float*>(empty + STAGES) + (4 * cw + v) * WGMMA_CS_FLOATS;
    auto release = [&](int st) {
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[st]);
    };
    float acc[ACC], total[FOLD ? ACC : 1];
#pragma unroll
    for (int q = 0; q < ACC; ++q) acc[q] = 0.0f;
    int it = 0;
    for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        const int m0 = (tile / ntn) * WGMMA_BM, n0 = (tile % ntn) * BN;
        if (TANDEM_WGMMA_BREAK != 11) {
#pragma unroll
            for (int q = 0; q < ACC; ++q) acc[q] = 0.0f;
        }
        bool first_slice = true;
        int next_fold = slice_len, held = -1;
        for (int i = 0; i < nt; ++i, ++it) {
            const int s = it % STAGES;
            mbar_wait(&full[s], (it / STAGES) & 1);
            const u32 a0 = smem_u32(As + s * A_ELEMS) + (u32)cw * 64 * 128, b0 = smem_u32(Bs + s * B_ELEMS);
            wgmma_fence_regs(acc);
            wgmma_fence();
#pragma unroll
            for (int j = 0; j < WGMMA_BK / 16; ++j) {
                const int kc = i * WGMMA_BK + 16 * j;
                if (kc >= k) break;
                if constexpr (FOLD) {
                    if (kc == next_fold) {  // a K slice ends before this step: fold it (matmul.cu's order)
                        next_fold += slice_len;
                        wgmma_commit();
                        wgmma_wait<0>();
                        wgmma_fence_regs(acc);
#pragma unroll
                        for (int q = 0; q < ACC; ++q) {
                            total[q] = first_slice ? acc[q] : total[q] + acc[q];
                            acc[q] = 0.0f;
                        }
                        first_slice = false;
                        wgmma_fence_regs(acc);
                        wgmma_fence();
                    }
                }
                const u64 da = wgmma_desc(a0 + 32 * j, 16, 1024, 1), db = wgmma_desc(b0 + 32 * j, 16, 1024, 1);
                if constexpr (BN == 256) wgmma_m64n256k16(T{}, acc, da, db);
                else wgmma_m64n128k16(T{}, acc, da, db);
            }
            wgmma_commit();
            wgmma_wait<1>();  // every group but this k tile's has completed: free the previous stage
            wgmma_fence_regs(acc);
            if (held >= 0) release(held);
            held = s;
        }
        wgmma_wait<0>();
        wgmma_fence_regs(acc);
        if (held >= 0) release(held);  // the producer may refill it with the next tile's k tiles
        if constexpr (FOLD) {
            if (nt > 0)
#pragma unroll
                for (int q = 0; q < ACC; ++q) total[q] = first_slice ? acc[q] : total[q] + acc[q];
        }
        auto val = [&](int q) -> float {
            if constexpr (FOLD) return total[q];
            else return acc[q];
        };
        // Accumulator fragment as in matmul_wgmma_impl: register q at row 16 v + g + 8 ((q / 2) % 2),
        // column 8 (q / 4) + 2 t + q % 2; warp v holds its 16 rows x all BN columns. Every
        // epilogue goes through the warp's staged 16 x 128 floats (+ bias), one 128-column half
        // at a time, so each epilogue function is inlined once: the rope and silu tiles as in
        // matmul_wgmma_impl, the others by matmul.cu's epilogue_store from the staged values
        // (the same value the registers hold: total + bias, so the same bits).
        const int wr0 = m0 + 64 * cw + 16 * v;
        const bool add_bias = bias_dtype != 0;
#pragma unroll 1
        for (int h = 0; h < BN / 128; ++h) {
            const int nh = n0 + (TANDEM_WGMMA_BREAK == 10 ? 0 : 128 * h);
            auto put = [&](int q, float x) {
                const int rl = g + 8 * ((q / 2) % 2), cl = 8 * (q / 4) + 2 * t + q % 2, c = nh + cl;
                Cs[rl * (WGMMA_BN + 1) + cl] = add_bias && c < n ? x + load_bias(bias, bias_dtype, c) : x;
            };
            if (h == 0) {
#pragma unroll
                for (int q = 0; q < 64; ++q) put(q, val(q));
            } else if constexpr (BN == 256) {
#pragma unroll
                for (int q = 0; q < 64; ++q) put(q, val(64 + q));
            }
            __syncwarp();
            if (ep.kind == EPI_QKV_ROPE) {
                epilogue_rope_tile<16, WGMMA_BN, 32>(Cs, lane, wr0, nh, m, n, ep, rk);
            } else if (ep.kind == EPI_SILU || ep.kind == EPI_GEGLU) {
                epilogue_silu_tile<T, 16, WGMMA_BN, 32>(Cs, lane, wr0, nh, m, ep);
            } else {
#pragma unroll 1
                for (int e = lane; e < 16 * WGMMA_BN; e += 32) {
                    const int rl = e / WGMMA_BN, cl = e % WGMMA_BN, r = wr0 + rl, c = nh + cl;
                    if (r < m && c < n) epilogue_store<T>(ep, r, c, n, Cs[rl * (WGMMA_BN + 1) + cl]);
                }
            }
            __syncwarp();  // Cs is rewritten by the next half or tile
        }
    }
}

#define MATMUL_WGMMA_WS(NAME, DT, T, BN)                                                                                            \
    extern "C" __global__ void __launch_bounds__(WGMMA_THREADS, 1)                                                                  \
        NAME##_##DT(const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap, const void* bias, int bias_dtype,      \
                    float* out0, float* out1, float* out2, int epi, int en0, int en1, const void* ep_gamma, int ep_gamma_dtype,         \
                    int ep_act16, int m, int n, int k, int slice_len, RopeKv rope_kv) {                                             \
        const Epilogue ep{out0, out1, out2, epi, en0, en1, ep_gamma, ep_gamma_dtype, ep_act16};                                      \
        matmul_wgmma_ws_impl<T, BN>(&xmap, &wmap, bias, bias_dtype, ep, m, n, k, slice_len, rope_kv);                               \
    }
MATMUL_WGMMA_WS(matmul_wgmma_ws, bf16, bf16_t, 128)
MATMUL_WGMMA_WS(matmul_wgmma_ws, f16, f16_t, 128)
MATMUL_WGMMA_WS(matmul_wgmma_ws256, bf16, bf16_t, 256)
MATMUL_WGMMA_WS(matmul_wgmma_ws256, f16, f16_t, 256)
#endif
