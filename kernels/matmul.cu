// matmul.cu — y = x · Wᵀ (+ bias), the projection of torch.nn.Linear.
//
//   out[r, c] = sum_k x[r, k] * w[c, k] (+ bias[c])
//   x [m, k] f32, or already in the weight's 16-bit format (the backend's activation storage,
//     Backend::activation_dtype); w [n, k] row-major (bf16|f16|f32); bias [n] (any weight
//     dtype, or none); out f32 [m, n]
//
// CONTRACT (what makes a token's bits independent of its batch; emu_test.cpp tests it bitwise):
//   For bf16 and f16 weights every output element is computed on the tensor cores as the same
//   sequence of k16 steps in ascending k, accumulated in f32 (mma.sync m16n8k16, C = A·B + C),
//   from x rounded to the weight's 16-bit format (round to nearest even) and the weights as
//   stored. K may be cut into `slices` of `slice_len` (a multiple of 32) whose count and bounds
//   depend only on (n, k) — never on m, on the other rows of the step, or on occupancy
//   (crates/cuda/src/matmul.rs `k_slices`); each slice starts from 0, and slices are folded in
//   index order: total = p0; total += p1; ...; then + bias[c] if there is a bias. Whether the
//   fold happens in registers (one block walks every slice) or in-kernel over a workspace (one
//   block per slice, the last to arrive folds) gives the same bits. Tile shapes change with
//   m (the m16 / m64 / m128 kernels) and, for the rope epilogue at head_dim 128, in width (the
//   _n128 kernels); the reduction order does not, so row r of a step has the same bits alone,
//   in any batch, and in any of the kernels. This relies on the GPU computing every
//   element of every mma the same way (position in the tile and neighbours irrelevant) — true
//   of the emulator by construction, to be confirmed on hardware by tests/cuda/gpu_invariance.rs.
//   It does NOT promise bitwise agreement with the CPU reference (the hardware's summation order
//   inside one mma is undocumented): the reference comparison is by tolerance.
//   x reaches the tensor cores rounded to the weight's format by f32_to_bits (nearest even),
//   whether the tile kernel rounds it itself (m <= 128), matmul_x did (m > 128), or its producer
//   stored it so (common.cuh store_act: rms_norm, silu_mul, the silu and residual epilogues
//   below): the same bits, so which storage a backend picks never changes a token.
//   f32 weights take `matmul_tiled_f32` for every m: one fma chain over k = 0..k-1 per output
//   (f32 CUDA cores, exact-f32 quality, not fast; only checks and tiny models use f32 weights).
//
// THE IN-KERNEL FOLD (split K, m <= 128) and why its bits are those of a separate fold pass:
//   every slice block of output tile (bx, by) writes its partial to part[z] and executes
//   __threadfence() (its writes are visible device-wide before anything it does next), then a
//   barrier, then thread 0 counts the block in with atomicAdd(&counters[tile], 1). The block
//   that gets slices - 1 back is the last: every other block's count came before its own in the
//   counter's single modification order, and each of those followed that block's fence, so all
//   partials are visible once the last block fences again (acquire side) and reads them
//   (volatile loads: from L2, never a stale L1 line). It reads ALL partials, its own included,
//   from the workspace in index order p0, p1, ... — never in arrival order — so the sum is
//   ((p0 + p1) + p2) ... exactly as the former matmul_fold pass summed it, whatever order the
//   blocks ran in. It then applies the epilogue and stores 0 to the counter: every block of this
//   launch has counted, and the next launch on the stream starts after this one ends, so the
//   counters (zeroed once at load) are 0 at every launch. kernels/emu checks the bits against
//   the two-launch path (matmul_fold, kept there as the oracle) and that the counters end at 0;
//   TANDEM_GEMM_BREAK=3 folds the last block's own partial first and must be caught.
//
// Epilogues (`Epilogue`, picked per launch, applied where the final value is formed, in either
// fold): EPI_PLAIN out [m, n] (+ bias); EPI_QKV routes fused column c to q / k / v (Backend
// qkv_proj, one GEMM for three); EPI_SILU takes the fused gate/up weight (in each 64-row tile,
// 32 gate rows then the same 32 up rows) and writes silu(gate) * up (EPI_GEGLU: gelu_tanh(gate)
// * up) with silu_mul.cu's formula (common.cuh gated_act), exchanging the tile through shared
// memory; EPI_RESID adds into the residual stream h and
// writes h * gamma of the next norm (Backend::matmul_residual). A fused GEMM slices K by its own
// (n, k), so it equals the unfused GEMMs bit for bit where k_slices gives the parts the same
// slicing. The input norm (NormIn, up to 128 rows) is a prologue: the block computes its rows'
// 1/rms exactly as rms_norm.cu does and feeds (h * inv) * gamma to the tensor cores, so a layer
// with its norms fused (Backend::fuses_norm) gives the unfused layer's bits. EPI_QKV_ROPE
// (Backend::qkv_rope_kv_write, head_dim dividing 128) rotates q and k and writes the KV cache
// with rope_kv_write's arithmetic: a decode layer is then 5 launches at 1-2 tokens. Each head
// must lie in one output tile: head_dim dividing 64 takes the 64-wide kernels, 128 the
// 128-wide `_n128` ones, which slice K exactly as the 64-wide kernel would (k_slices counts
// 64-column tiles whatever the launch's width), so their bits are the same.
//
// Launch (crates/cuda/src/matmul.rs `gemm`):
//   1. m > 128 and x f32 only: matmul_x_<dt>: x f32 [m, k] -> xa [m, kp] 16-bit (kp = k rounded
//      up to 8, zero padded), so every row of xa is 16-byte aligned for cp.async. grid (m),
//      block 256. Up to 128 rows the tile kernel loads x f32 through registers, rounds it, and
//      stores it to shared memory (columns >= k as zeros), so a decode GEMM is one launch.
//      x stored in 16 bits is xa itself (kp = k) for every m: cp.async where k % 8 == 0 (rows
//      16-byte aligned), else plain predicated loads (the tile kernel tells them by kp % 8).
//   2. matmul_tc_<dt>_m<BM>: output tile BM x 64 per block, grid (ceil(n/64), ceil(m/BM), z).
//        m16  (m <= 16):   4 warps, each 16x16;  4-stage cp.async pipeline; decode
//        m64  (m <= 128):  4 warps, each 32x32;  4 stages
//        m128 (m > 128):   8 warps, each 32x32;  3 stages; prefill
//      EPI_QKV_ROPE at head_dim 128: matmul_tc_<dt>_m<BM>_n128, tile BM x 128, grid
//      (ceil(n/128), ceil(m/BM), z), the same slices as the 64-wide launch (see GemmM16N128):
//        m16_n128 (m <= 16):  8 warps, each 16x16;  4 stages
//        m64_n128 (m > 16):   8 warps, each 32x32;  3 stages (m > 128 too: x through matmul_x)
//      z = slices (one slice per block, partial sums to the workspace `part` [slices, m, n],
//      folded in-kernel by the last block, above) for m <= 128 when slices > 1, so a decode
//      step has ceil(n/64) * slices blocks in flight (about 264, two per SM on the H200, for
//      every n <= 16896; half as many blocks of twice the warps for _n128); else z = 1 and
//      each block folds its slices in registers.
//   Shared memory (dynamic): per stage BM x 32 of xa and BN x 32 of w, rows padded to 40
//   elements (80 bytes), so the 8 row addresses of every ldmatrix fall in 8 distinct 16-byte
//   bank groups (no conflicts). k % 8 != 0 breaks the 16-byte alignment of w's rows: those
//   tiles of w are loaded element by element (predicated), the rest of the pipeline unchanged.
//   The k tail of the last tile is zero-filled (cp.async src-size 0), adding exact zeros.
// Check: tandem-kernels-check --only matmul (PTX mma count, registers, spills); emu_test.cpp
// `test_matmul` (f64 reference with derived bf16/f16 bounds, bitwise rows across m, bitwise
// against the two-launch path) and fused_test.h (the epilogues); op suite ops `matmul`,
// `qkv_proj`, `gate_up_silu` on a GPU.
#ifndef TANDEM_MATMUL_CU
#define TANDEM_MATMUL_CU
#include "common.cuh"

#define GEMM_BN 64
#define GEMM_BK 32
#define GEMM_PITCH 40  // elements per shared-memory row: 80 bytes, see above

// Test hooks, defined only by kernels/emu/break_test.cpp to prove the emulator catches the
// bug: 1 swaps two B fragments (a wrong fragment index), 2 drops the cp.async wait, 3 folds a
// split K in arrival order (the last block's own partial first), 4 starts the shared-memory
// slice total (TOTAL_SMEM) from what the block's shared memory held instead of the first slice,
// 5 computes EPI_GEGLU's activation as silu.
#ifndef TANDEM_GEMM_BREAK
#define TANDEM_GEMM_BREAK 0
#endif

// x f32 -> the 16-bit operand format, rows padded with zeros to kp (a multiple of 8).
template <typename T>
__device__ void matmul_x_impl(const float* __restrict__ x, u16* __restrict__ xa, int m, int k, int kp) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    const int r = blockIdx.x;
    if (r >= m) return;
    for (int i = threadIdx.x; i < kp; i += blockDim.x)
        xa[(size_t)r * kp + i] = i < k ? f32_to_bits(T{}, x[(size_t)r * k + i]) : (u16)0;
}

// BN_ is the output tile's width: GEMM_BN for every epilogue; 128 only for EPI_QKV_ROPE at a
// head_dim that does not divide 64 (128: Llama-3.1-8B, Mistral, Qwen2-7B), so each head's
// rotate-half partners, hd / 2 columns apart, sit in one tile (the `_n128` kernels below).
// TS_ (total in shared memory): the running fold of finished K slices, `total`, lives in
// shared memory after the pipeline's stages (BM x BN floats, each thread its own words, so no
// barrier) instead of a second register set beside `acc`: the same adds in the same order,
// about half the accumulator registers (the variants below; the defaults keep registers).
template <int BM_, int WM_, int WN_, int STAGES_, int BN_ = GEMM_BN, bool TS_ = false>
struct GemmShape {
    static constexpr int BM = BM_, BN = BN_, BK = GEMM_BK, P = GEMM_PITCH, STAGES = STAGES_;
    static constexpr int WM = WM_, WN = WN_, WARPS_N = BN / WN, WARPS = (BM / WM) * WARPS_N, THREADS = WARPS * 32;
    static constexpr int MI = WM / 16, NJ = WN / 8;  // mma tiles per warp
    static constexpr int A_ELEMS = BM * P, B_ELEMS = BN * P;
    static constexpr bool TOTAL_SMEM = TS_;
    static constexpr int PIPE_BYTES = STAGES * (A_ELEMS + B_ELEMS) * 2;
    static constexpr int SMEM_BYTES = PIPE_BYTES + (TS_ ? BM * BN * 4 : 0);
    static_assert(WN % 16 == 0 && WM % 16 == 0, "one ldmatrix.x4 feeds one m16 tile of A or two n8 tiles of B");
    // Above 48 KiB a launch needs the kernel's MAX_DYNAMIC_SHARED_SIZE_BYTES raised first: the
    // host does that at load for every kernel whose GemmKernel::smem is above it (backend.rs).
    static_assert(SMEM_BYTES <= 227 * 1024, "more than an sm_80/sm_90 block may have");
    static_assert(BM * (BN + 1) * 4 <= PIPE_BYTES, "the silu and rope epilogues stage the f32 tile in the pipeline's shared memory");
};

// The input norm folded into the projection (Backend::fuses_norm, NormIn): x is then h, the
// residual stream, and the tile kernel feeds the tensor cores rms_norm(h) * gamma as
// rms_norm.cu computes it, bit for bit: `inv` by the same 256-thread strided sums and the same
// block_sum tree (one warp per row plays the 8 warps of rms_norm's block: lane l of virtual
// warp j sums elements 32 j + l, 32 j + l + 256, ...; then warp_sum over each virtual warp,
// then warp_sum over the 8 results padded with zeros, as block_sum's second stage), and each
// element as (h * inv) * gamma. So the fused layer gives the unfused layer's bits, whatever m is.
struct NormIn {
    const void* gamma;  // [k], weight dtype code `dtype` (load_bias's)
    int dtype;          // 0: no norm, x is the projection's input as it is
    float eps;
};
template <typename S>
__device__ __forceinline__ void norm_prologue(const NormIn& nm, const float* __restrict__ h, int m, int k, int m0, float* s_inv) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int rl = warp; rl < S::BM && m0 + rl < m; rl += S::WARPS) {
        const float* hr = h + (size_t)(m0 + rl) * k;
        float mine = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            float ss = 0.0f;
            for (int i = 32 * j + lane; i < k; i += 256) ss = fmaf(hr[i], hr[i], ss);
            ss = warp_sum(ss);
            if (lane == j) mine = ss;
        }
        const float total = warp_sum(mine);
        if (lane == 0) s_inv[rl] = 1.0f / sqrtf(total / (float)k + nm.eps);
    }
    __syncthreads();
}

// This thread's 16-byte copies of every k tile where both operands take cp.async (x stored in
// 16 bits, rows of xa and w 16-byte aligned: the prefill and batched-decode path), worked out
// once per block: each k tile then costs a pointer add and a compare per copy, not the ~30
// instructions of row, column and 64-bit address arithmetic the Nsight Compute run of
// 2026-12-04 found the m128 kernel spending (issue slots 38% busy, the tensor pipes mostly idle).
// Chunk c of a tile is row c / 4, columns 8 (c % 4) .. + 7; thread t copies chunks t, t +
// THREADS, ... The same bytes land in the same places as in the general path below.
//
// One operand's copies: chunk i of this thread at k tile 0 starts at src[i] (valid where
// ok[i]: the chunk exists and its row is inside the operand), lands at element dst[i] of a
// stage, and covers columns col[i] .. + 7 of the k tile.
template <int N>
struct OperandPlan {
    const u16* src[N];
    int dst[N], col[N];
    bool ok[N];
};
template <typename S>
struct CopyPlan {
    static constexpr int A_N = (S::BM * 4 + S::THREADS - 1) / S::THREADS, B_N = (S::BN * 4 + S::THREADS - 1) / S::THREADS;
    OperandPlan<A_N> a;  // xa's BM rows (row stride kp)
    OperandPlan<B_N> b;  // w's BN rows (row stride k)
};
// ROWS rows of the tile from row r0 of an operand of `rows` rows, `ld` elements apart.
template <typename S, int ROWS, int N>
__device__ __forceinline__ void plan_operand(OperandPlan<N>& op, const u16* __restrict__ base, int rows, int r0, int ld) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const int c = threadIdx.x + i * S::THREADS, r = c >> 2, col = (c & 3) * 8;
        op.ok[i] = c < ROWS * 4 && r0 + r < rows;
        op.src[i] = op.ok[i] ? base + (size_t)(r0 + r) * ld + col : base;
        op.dst[i] = r * S::P + col;
        op.col[i] = col;
    }
}
template <typename S>
__device__ __forceinline__ void copy_plan(CopyPlan<S>& cp, const u16* __restrict__ xa, const u16* __restrict__ w, int m, int n, int k, int kp, int m0, int n0) {
    plan_operand<S, S::BM>(cp.a, xa, m, m0, kp);
    plan_operand<S, S::BN>(cp.b, w, n, n0, k);
}
// One operand's copies of k tile k0 / BK into a stage; columns >= klim are zero-filled. CG: the
// copy skips L1 (cp.async.cg: w, read once per block), else it may keep it there (.ca: xa).
template <typename S, int ROWS, bool CG, int N>
__device__ __forceinline__ void load_operand_planned(u16* stage, const OperandPlan<N>& op, const u16* __restrict__ base, int klim, int k0) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
        if (ROWS * 4 % S::THREADS != 0 && !(threadIdx.x + i * S::THREADS < ROWS * 4)) continue;
        const bool ok = op.ok[i] && k0 + op.col[i] < klim;
        if constexpr (CG) cp_async_cg16(stage + op.dst[i], ok ? op.src[i] + k0 : base, ok ? 16 : 0);
        else cp_async_ca16(stage + op.dst[i], ok ? op.src[i] + k0 : base, ok ? 16 : 0);
    }
}
template <typename S>
__device__ __forceinline__ void gemm_load_tile_planned(u16* As, u16* Bs, const CopyPlan<S>& cp, const u16* __restrict__ xa, const u16* __restrict__ w, int k,
                                                       int kp, int kt) {
    const int k0 = kt * S::BK;
    load_operand_planned<S, S::BM, false>(As, cp.a, xa, kp, k0);
    load_operand_planned<S, S::BN, true>(Bs, cp.b, w, k, k0);
}

// Which operands gemm_load_tile copies: x's tile, w's, or both.
#define TILE_X 1
#define TILE_W 2
#define TILE_XW 3

// Copies k-tile kt (columns 32 kt .. 32 kt + 31) of xa and w into one pipeline stage (`parts`:
// TILE_X, TILE_W or both).
template <typename T, typename S>
__device__ __forceinline__ void gemm_load_tile(u16* As, u16* Bs, const float* __restrict__ x, const u16* __restrict__ xa, const u16* __restrict__ w,
                                               int m, int n, int k, int kp, int m0, int n0, int kt, const NormIn& nm, const float* s_inv,
                                               int parts = TILE_XW) {
    const int tid = threadIdx.x, k0 = kt * S::BK;
    if (!(parts & TILE_X)) {
    } else if (x) {
        // x f32 straight from global through registers, rounded as matmul_x rounds it (the same
        // bits in shared memory); columns >= k are zeros, as matmul_x's padding and cp.async's
        // zero fill give. Plain stores, visible after the barrier before this stage is used.
        // With a norm, x is h and the value is rms_norm.cu's (h * inv) * gamma.
        for (int e = tid; e < S::BM * S::BK; e += S::THREADS) {
            const int r = e / S::BK, kk = e % S::BK;
            const bool ok = m0 + r < m && k0 + kk < k;
            float v = ok ? x[(size_t)(m0 + r) * k + k0 + kk] : 0.0f;
            if (nm.dtype && ok) v = (v * s_inv[r]) * load_bias(nm.gamma, nm.dtype, k0 + kk);
            As[r * S::P + kk] = ok ? f32_to_bits(T{}, v) : (u16)0;
        }
    } else if (kp & 7) {
        // x stored in 16 bits with rows not 16-byte aligned (kp = k, k % 8 != 0): plain loads,
        // visible after the barrier before this stage is used; columns >= k as zeros.
        for (int e = tid; e < S::BM * S::BK; e += S::THREADS) {
            const int r = e / S::BK, kk = e % S::BK;
            const bool ok = m0 + r < m && k0 + kk < k;
            As[r * S::P + kk] = ok ? xa[(size_t)(m0 + r) * kp + k0 + kk] : (u16)0;
        }
    } else {
        // xa: BM rows x 4 chunks of 8 elements; kp is a multiple of 8, so a chunk is wholly in or out.
#pragma unroll
        for (int c = tid; c < S::BM * 4; c += S::THREADS) {
            const int r = c >> 2, kc = k0 + (c & 3) * 8;
            const bool ok = m0 + r < m && kc < kp;
            const u16* src = ok ? xa + (size_t)(m0 + r) * kp + kc : xa;
            cp_async_ca16(As + r * S::P + (c & 3) * 8, src, ok ? 16 : 0);
        }
    }
    if (!(parts & TILE_W)) {
    } else if ((k & 7) == 0) {
#pragma unroll
        for (int c = tid; c < S::BN * 4; c += S::THREADS) {
            const int r = c >> 2, kc = k0 + (c & 3) * 8;
            const bool ok = n0 + r < n && kc < k;
            const u16* src = ok ? w + (size_t)(n0 + r) * k + kc : w;
            cp_async_cg16(Bs + r * S::P + (c & 3) * 8, src, ok ? 16 : 0);
        }
    } else {
        // Rows of w are not 16-byte aligned: plain predicated loads, visible after the barrier
        // that precedes this stage's use like the asynchronous ones.
        for (int e = tid; e < S::BN * S::BK; e += S::THREADS) {
            const int r = e / S::BK, kk = e % S::BK;
            const bool ok = n0 + r < n && k0 + kk < k;
            Bs[r * S::P + kk] = ok ? w[(size_t)(n0 + r) * k + k0 + kk] : (u16)0;
        }
    }
}

// Where a tile's final values go (the epilogue), picked per launch:
//   EPI_PLAIN: out0 [m, n] (+ bias);
//   EPI_QKV:   column c of the fused q/k/v weight to q = out0 [m, n0] (c < n0), k = out1 [m, n1]
//              (c - n0 < n1), v = out2 [m, n1] (+ the fused bias, before routing);
//   EPI_SILU:  the fused gate/up weight holds in each 64-row tile j gate rows 32j .. 32j+31 and
//              then the same up rows; out0 [m, n0] = silu(gate) * up (no bias), n0 = inter.
//   EPI_GEGLU: EPI_SILU with gelu_tanh for silu (Gemma's MLP); both common.cuh's gated_act.
//   EPI_RESID: the residual add (Backend::matmul_residual): out0 = h [m, n] += the result, the
//              bits of matmul then add_rms_norm's add; with out1, also out1 = hg [m, n] = the
//              new h * gamma (gamma [n], weight dtype code gamma_dtype).
//   act16:     EPI_SILU's, EPI_GEGLU's out0 and EPI_RESID's out1 (activations a matmul reads
//              next) are stored in T, rounded to nearest even (common.cuh store_act), not in f32.
//   EPI_QKV_ROPE: EPI_QKV's columns, then rope on q and k and the KV-cache write
//              (Backend::qkv_rope_kv_write): q = out0 [m, n0] rotated; k rotated and v stored
//              at slots[r] of the caches (k itself is not written: the contract makes it
//              scratch). Only where every head lies inside one output tile: head_dim
//              divides the tile's width (64, or 128 for the _n128 kernels; nq and the tile
//              starts are multiples of head_dim, so no head straddles two tiles); the pairs
//              are exchanged through shared memory and rotated with common.cuh's rope_pair
//              and stored with store_kv, the bits of qkv_proj then rope_kv_write.
#define EPI_PLAIN 0
#define EPI_QKV 1
#define EPI_SILU 2
#define EPI_RESID 3
#define EPI_QKV_ROPE 4
#define EPI_GEGLU 5
// EPI_QKV_ROPE's destination: positions, slots u32 [m]; inv_freq f32 [head_dim / 2]; the
// caches [num_slots, n1] of bf16 (cache_bf16) or f32.
struct RopeKv {
    const u32* positions;
    const float* inv_freq;
    const u32* slots;
    void* k_cache;
    void* v_cache;
    unsigned long long num_slots;
    int head_dim;
    int cache_bf16;
};
struct Epilogue {
    float* out0;
    float* out1;
    float* out2;
    int kind, n0, n1;
    const void* gamma = nullptr;
    int gamma_dtype = 0;
    int act16 = 0;
};
// store_act's code for the activation outputs: T's with act16, else f32.
__device__ __forceinline__ int act_code(bf16_t, int act16) { return act16 ? 2 : 1; }
__device__ __forceinline__ int act_code(f16_t, int act16) { return act16 ? 3 : 1; }
template <typename T>
__device__ __forceinline__ void epilogue_store(const Epilogue& ep, int r, int c, int n, float v) {
    if (ep.kind == EPI_RESID) {
        float* hp = ep.out0 + (size_t)r * n + c;
        const float h = *hp + v;
        *hp = h;
        if (ep.out1) store_act(ep.out1, act_code(T{}, ep.act16), (size_t)r * n + c, h * load_bias(ep.gamma, ep.gamma_dtype, c));
    } else if (ep.kind == EPI_QKV) {
        if (c < ep.n0) ep.out0[(size_t)r * ep.n0 + c] = v;
        else if (c < ep.n0 + ep.n1) ep.out1[(size_t)r * ep.n1 + (c - ep.n0)] = v;
        else ep.out2[(size_t)r * ep.n1 + (c - ep.n0 - ep.n1)] = v;
    } else {
        ep.out0[(size_t)r * n + c] = v;
    }
}

// One block: output tile [m0, m0 + BM) x [n0, n0 + BN). With gridDim.z > 1 the block owns slice
// blockIdx.z alone and writes its partial sums to part; otherwise it walks every slice,
// folding each into `total` as it ends, and writes out (+ bias).
// One element into a KV cache of RopeKv's element type (store_kv: kv_write.cu's rounding).
__device__ __forceinline__ void rope_kv_store(const RopeKv& rk, void* cache, size_t o, float v) {
    if (rk.cache_bf16) store_kv(static_cast<bf16_t*>(cache) + o, v);
    else store_kv(static_cast<float*>(cache) + o, v);
}

// The epilogues that exchange values between threads, over a final f32 tile staged in shared
// memory: Cs [ROWS][COLS + 1] (+ bias, as epilogue_store adds it), its row 0 output row r0 and
// column 0 output column c0; thread `tid` of NTHREADS takes elements tid, tid + NTHREADS, ...
// (which thread stores an element never changes its bits). Shared by matmul_tc_finish (the
// block's tile) and kernels/matmul_sm90.cu (one warp's 16 rows of a 128-wide tile).
// EPI_QKV_ROPE: every head inside the tile's columns (head_dim divides COLS, c0 a multiple of it).
template <int ROWS, int COLS, int NTHREADS>
__device__ __forceinline__ void epilogue_rope_tile(const float* Cs, int tid, int r0, int c0, int m, int n, const Epilogue& ep, const RopeKv& rk) {
    const int hd = rk.head_dim, half = hd >> 1, nq = ep.n0, nkv = ep.n1;
    for (int e = tid; e < ROWS * COLS; e += NTHREADS) {
        const int rl = e / COLS, j = e % COLS, r = r0 + rl, c = c0 + j;
        if (r >= m || c >= n) continue;
        const float* row = Cs + rl * (COLS + 1);
        if (c >= nq + nkv) {  // v: stored as it is
            const u32 slot = rk.slots[r];
            if ((unsigned long long)slot >= rk.num_slots) continue;
            const size_t o = (size_t)slot * nkv + (c - nq - nkv);
            rope_kv_store(rk, rk.v_cache, o, row[j]);
            continue;
        }
        const bool is_q = c < nq;
        const int lc = is_q ? c : c - nq, i = lc % hd;
        if (i >= half) continue;  // the pair's first element does both
        float y0, y1;
        rope_pair(row[j], row[j + half], (float)rk.positions[r], rk.inv_freq[i], y0, y1);
        if (is_q) {
            ep.out0[(size_t)r * nq + lc] = y0;
            ep.out0[(size_t)r * nq + lc + half] = y1;
        } else {
            const u32 slot = rk.slots[r];
            if ((unsigned long long)slot >= rk.num_slots) continue;
            const size_t o = (size_t)slot * nkv + lc;
            rope_kv_store(rk, rk.k_cache, o, y0);
            rope_kv_store(rk, rk.k_cache, o + half, y1);
        }
    }
}
// EPI_SILU / EPI_GEGLU: COLS / 64 gate/up tiles of 64 columns (32 gate, then the same 32 up; c0
// a multiple of 64), out0 [m, ep.n0] = act(gate) * up with silu_mul.cu's formulas (gated_act).
template <typename T, int ROWS, int COLS, int NTHREADS>
__device__ __forceinline__ void epilogue_silu_tile(const float* Cs, int tid, int r0, int c0, int m, const Epilogue& ep) {
    constexpr int HALF = GEMM_BN / 2;
#if TANDEM_GEMM_BREAK == 5
    const int act = GATED_SILU;  // deliberate break (kernels/emu/break_test.cpp): EPI_GEGLU as silu
#else
    const int act = ep.kind == EPI_GEGLU ? GATED_GELU_TANH : GATED_SILU;
#endif
    for (int e = tid; e < ROWS * (COLS / 2); e += NTHREADS) {
        const int rl = e / (COLS / 2), j = e % (COLS / 2), jt = j / HALF, jj = j % HALF, r = r0 + rl;
        const int c = (c0 / GEMM_BN + jt) * HALF + jj;
        if (r >= m || c >= ep.n0) continue;
        const float gv = Cs[rl * (COLS + 1) + jt * GEMM_BN + jj], uv = Cs[rl * (COLS + 1) + jt * GEMM_BN + HALF + jj];
        store_act(ep.out0, act_code(T{}, ep.act16), (size_t)r * ep.n0 + c, gated_act(act, gv, uv));
    }
}

// The block's final tile (+ bias where bias_dtype != 0, as epilogue_store adds it) into Cs
// [BM][BN + 1] for the epilogues that exchange values between threads (silu, rope), in the
// pipeline's shared memory, idle by then: the main loop's last barrier is behind every
// ldmatrix, no copy is in flight, the trailing commit groups are empty. Barriers on both sides.
template <typename S>
__device__ __forceinline__ void gemm_stage_tile(float* Cs, const float (&total)[S::MI][S::NJ][4], const void* bias, int bias_dtype, int n0, int n,
                                                int wm0, int wn0, int lane) {
    const int g = lane >> 2, t = lane & 3;
    __syncthreads();
#pragma unroll
    for (int mi = 0; mi < S::MI; ++mi)
#pragma unroll
        for (int nj = 0; nj < S::NJ; ++nj)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int cl = wn0 + nj * 8 + 2 * t + (q & 1), c = n0 + cl;
                const float v = bias_dtype && c < n ? total[mi][nj][q] + load_bias(bias, bias_dtype, c) : total[mi][nj][q];
                Cs[(wm0 + mi * 16 + g + 8 * (q >> 1)) * (S::BN + 1) + cl] = v;
            }
    __syncthreads();
}

// The block's end (after matmul_tc_impl), shared with matmul_gemv_impl.
template <typename T, typename S>
__device__ __forceinline__ void matmul_tc_finish(float (&total)[S::MI][S::NJ][4], float* Cs, const void* __restrict__ bias, int bias_dtype,
                                                 const Epilogue& ep, float* __restrict__ part, u32* __restrict__ counters, int m, int n,
                                                 int slices, const RopeKv& rk, int m0, int n0, int wm0, int wn0, int lane);

// With nm.dtype != 0 (only where x is read directly, m <= 128), x is h and the block computes
// its rows' inv (norm_prologue) once its first weight tiles are in flight.
template <typename T, typename S>
__device__ void matmul_tc_impl(const float* __restrict__ x, const u16* __restrict__ xa, const u16* __restrict__ w, const void* __restrict__ bias,
                               int bias_dtype, Epilogue ep, float* __restrict__ part, u32* __restrict__ counters, int m, int n, int k,
                               int kp, int slice_len, int slices, NormIn nm, RopeKv rk) {
    TANDEM_DYNAMIC_SMEM(smem_raw);
    __shared__ float s_inv[S::BM];
    u16* As = reinterpret_cast<u16*>(smem_raw);
    u16* Bs = As + S::STAGES * S::A_ELEMS;
    const int m0 = blockIdx.y * S::BM, n0 = blockIdx.x * S::BN;
    const bool split = gridDim.z > 1;
    const int s_begin = split ? (int)blockIdx.z : 0, s_end = split ? (int)blockIdx.z + 1 : slices;
    const int tiles_per_slice = slice_len / S::BK;
    const int kt_begin = s_begin * tiles_per_slice;
    const int k_end = min(k, s_end * slice_len);
    const int nt = k_end > kt_begin * S::BK ? (k_end + S::BK - 1) / S::BK - kt_begin : 0;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm0 = (warp / S::WARPS_N) * S::WM, wn0 = (warp % S::WARPS_N) * S::WN;
    float acc[S::MI][S::NJ][4], total[S::MI][S::NJ][4];
    // TOTAL_SMEM: word ((mi * NJ + nj) * 4 + q) * THREADS + tid of s_total is this thread's
    // total[mi][nj][q] (consecutive threads, consecutive words: no bank conflicts).
    float* s_total = reinterpret_cast<float*>(smem_raw + S::PIPE_BYTES);
#pragma unroll
    for (int i = 0; i < S::MI; ++i)
#pragma unroll
        for (int j = 0; j < S::NJ; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = total[i][j][q] = 0.0f;

    // Both operands by cp.async from 16-byte aligned rows: the planned copies (CopyPlan), in
    // the tiles of 64 rows and more (the decode tile, m16, keeps its registers: ~18 more with
    // the plan, one block fewer per SM, unmeasured).
    const bool planned = S::BM >= 64 && !x && (kp & 7) == 0 && (k & 7) == 0;
    CopyPlan<S> cplan;
    if (planned) copy_plan<S>(cplan, xa, w, m, n, k, kp, m0, n0);
    // Prologue: tiles 0 .. STAGES-2 in flight, one commit group each (empty groups keep the count).
    if (nm.dtype) {
        // The input norm first needs its rows' 1/rms (norm_prologue, a pass over h): the weight
        // tiles' copies go out before it, then x's tiles, formed with it (issue 25: the weights
        // were not in flight until the norm was done). Groups W0 .. W(S-2), then X0 .. X(S-2):
        // the main loop's wait<STAGES - 2> still covers tile i's W and X at iteration i (at
        // most STAGES - 2 of the newest groups pending: never X(i) or older).
#pragma unroll
        for (int s = 0; s < S::STAGES - 1; ++s) {
            if (s < nt) gemm_load_tile<T, S>(As + s * S::A_ELEMS, Bs + s * S::B_ELEMS, x, xa, w, m, n, k, kp, m0, n0, kt_begin + s, nm, s_inv, TILE_W);
            cp_async_commit();
        }
        PDL_WAIT();  // above: weights only (PDL: they stream while the previous kernel drains)
        PDL_LAUNCH_DEPENDENTS();
        norm_prologue<S>(nm, x, m, k, m0, s_inv);
#pragma unroll
        for (int s = 0; s < S::STAGES - 1; ++s) {
            if (s < nt) gemm_load_tile<T, S>(As + s * S::A_ELEMS, Bs + s * S::B_ELEMS, x, xa, w, m, n, k, kp, m0, n0, kt_begin + s, nm, s_inv, TILE_X);
            cp_async_commit();
        }
    } else {
        PDL_WAIT();  // the tiles below load x with the weights
        PDL_LAUNCH_DEPENDENTS();
#pragma unroll
        for (int s = 0; s < S::STAGES - 1; ++s) {
            if (s < nt) {
                if (planned) gemm_load_tile_planned<S>(As + s * S::A_ELEMS, Bs + s * S::B_ELEMS, cplan, xa, w, k, kp, kt_begin + s);
                else gemm_load_tile<T, S>(As + s * S::A_ELEMS, Bs + s * S::B_ELEMS, x, xa, w, m, n, k, kp, m0, n0, kt_begin + s, nm, s_inv);
            }
            cp_async_commit();
        }
    }
    bool first_slice = true;
    int slice_tiles = 0;
    for (int i = 0; i < nt; ++i) {
#if TANDEM_GEMM_BREAK != 2
        cp_async_wait<S::STAGES - 2>();  // this thread's copies of tile i have landed
#endif
        __syncthreads();  // ... everyone's have; and everyone is done with tile i - 1's stage
        {
            const int next = i + S::STAGES - 1, st = next % S::STAGES;
            if (next < nt) {
                if (planned) gemm_load_tile_planned<S>(As + st * S::A_ELEMS, Bs + st * S::B_ELEMS, cplan, xa, w, k, kp, kt_begin + next);
                else gemm_load_tile<T, S>(As + st * S::A_ELEMS, Bs + st * S::B_ELEMS, x, xa, w, m, n, k, kp, m0, n0, kt_begin + next, nm, s_inv);
            }
            cp_async_commit();
        }
        const u16* a_st = As + (i % S::STAGES) * S::A_ELEMS;
        const u16* b_st = Bs + (i % S::STAGES) * S::B_ELEMS;
#pragma unroll
        for (int kk = 0; kk < S::BK; kk += 16) {
            u32 af[S::MI][4], bfr[S::NJ][2];
#pragma unroll
            for (int mi = 0; mi < S::MI; ++mi)  // matrices: rows 0-7 / 8-15 x cols 0-7, then cols 8-15
                ldmatrix_x4(af[mi], a_st + (wm0 + mi * 16 + (lane & 15)) * S::P + kk + (lane >> 4) * 8);
#pragma unroll
            for (int nj = 0; nj < S::NJ; nj += 2) {  // matrices: n 0-7 x k 0-7, k 8-15, then n 8-15
                u32 r[4];
                ldmatrix_x4(r, b_st + (wn0 + nj * 8 + (lane & 7) + ((lane >> 4) << 3)) * S::P + kk + ((lane >> 3) & 1) * 8);
#if TANDEM_GEMM_BREAK == 1
                bfr[nj][0] = r[0]; bfr[nj][1] = r[2]; bfr[nj + 1][0] = r[1]; bfr[nj + 1][1] = r[3];
#else
                bfr[nj][0] = r[0]; bfr[nj][1] = r[1]; bfr[nj + 1][0] = r[2]; bfr[nj + 1][1] = r[3];
#endif
            }
#pragma unroll
            for (int mi = 0; mi < S::MI; ++mi)
#pragma unroll
                for (int nj = 0; nj < S::NJ; ++nj) mma_16816(T{}, acc[mi][nj], af[mi], bfr[nj]);
        }
        // A slice ends: fold it in. kt_begin is a whole number of slices, so the k tiles since
        // the last fold count up to tiles_per_slice (a counter, not a division per tile).
        if (++slice_tiles == tiles_per_slice || i == nt - 1) {
            slice_tiles = 0;
#pragma unroll
            for (int mi = 0; mi < S::MI; ++mi)
#pragma unroll
                for (int nj = 0; nj < S::NJ; ++nj)
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        if constexpr (S::TOTAL_SMEM) {
                            float& t = s_total[((mi * S::NJ + nj) * 4 + q) * S::THREADS + threadIdx.x];
#if TANDEM_GEMM_BREAK == 4
                            t = t + acc[mi][nj][q];  // the bug: the first slice adds to words nobody wrote
#else
                            t = first_slice ? acc[mi][nj][q] : t + acc[mi][nj][q];
#endif
                        } else {
                            total[mi][nj][q] = first_slice ? acc[mi][nj][q] : total[mi][nj][q] + acc[mi][nj][q];
                        }
                        acc[mi][nj][q] = 0.0f;
                    }
            first_slice = false;
        }
    }
    if constexpr (S::TOTAL_SMEM) {
        // The fold back into registers for the epilogues (acc is free now); no slice at all
        // (nt == 0) leaves zeros, as the register total starts.
#pragma unroll
        for (int mi = 0; mi < S::MI; ++mi)
#pragma unroll
            for (int nj = 0; nj < S::NJ; ++nj)
#pragma unroll
                for (int q = 0; q < 4; ++q)
                    total[mi][nj][q] = first_slice ? 0.0f : s_total[((mi * S::NJ + nj) * 4 + q) * S::THREADS + threadIdx.x];
    }
    matmul_tc_finish<T, S>(total, reinterpret_cast<float*>(smem_raw), bias, bias_dtype, ep, part, counters, m, n, slices, rk, m0, n0, wm0, wn0,
                           lane);
}

// The block's end, shared by matmul_tc_impl and matmul_gemv_impl: the split-K partial and the
// in-kernel fold in index order (TANDEM_GEMM_BREAK 3 stands for folding out of order), then the
// epilogues. Cs: BM x (BN + 1) floats of shared memory for the epilogues that exchange the tile
// between threads (rope, silu; gemm_stage_tile's barriers guard it). The GEMV variants pass
// wm0 = 0 (their warps tile the columns only) and a Cs of their own (their staged x is still
// read by other warps until the first of those barriers).
template <typename T, typename S>
__device__ __forceinline__ void matmul_tc_finish(float (&total)[S::MI][S::NJ][4], float* Cs, const void* __restrict__ bias, int bias_dtype,
                                                 const Epilogue& ep, float* __restrict__ part, u32* __restrict__ counters, int m, int n,
                                                 int slices, const RopeKv& rk, int m0, int n0, int wm0, int wn0, int lane) {
    const bool split = gridDim.z > 1;
    // Accumulator fragment: c0, c1 at row g, columns 2t, 2t+1; c2, c3 at row g + 8.
    const int g = lane >> 2, t = lane & 3;
    if (split) {
        // This slice's partial to the workspace, then the in-kernel fold (see the contract).
#pragma unroll
        for (int mi = 0; mi < S::MI; ++mi)
#pragma unroll
            for (int nj = 0; nj < S::NJ; ++nj)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const int r = m0 + wm0 + mi * 16 + g + 8 * (q >> 1), c = n0 + wn0 + nj * 8 + 2 * t + (q & 1);
                    if (r < m && c < n) part[((size_t)blockIdx.z * m + r) * n + c] = total[mi][nj][q];
                }
        if (!counters) return;  // kernels/emu only: the two-launch oracle folds with matmul_fold
        __shared__ int s_last;
        __threadfence();  // release: this thread's partials are visible device-wide before the count
        __syncthreads();  // ... and every thread's, before thread 0 counts the block in
        u32* counter = counters + (size_t)blockIdx.y * gridDim.x + blockIdx.x;
        if (threadIdx.x == 0) s_last = atomicAdd(counter, 1u) == (u32)(slices - 1);
        __syncthreads();
        if (!s_last) return;
        __threadfence();  // acquire: the other blocks' partials, counted before ours, are read after
#pragma unroll
        for (int mi = 0; mi < S::MI; ++mi)
#pragma unroll
            for (int nj = 0; nj < S::NJ; ++nj)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const int r = m0 + wm0 + mi * 16 + g + 8 * (q >> 1), c = n0 + wn0 + nj * 8 + 2 * t + (q & 1);
                    if (r >= m || c >= n) continue;
                    // volatile: straight from L2, never an L1 line of another block's data.
                    const volatile float* p = part + (size_t)r * n + c;
                    const size_t mn = (size_t)m * n;
#if TANDEM_GEMM_BREAK == 3
                    // The bug this test hook stands for: folding the arriving block's own partial first.
                    float v = total[mi][nj][q];
                    for (int s = 0; s < slices; ++s)
                        if (s != (int)blockIdx.z) v = v + p[(size_t)s * mn];
#else
                    float v = p[0];
                    for (int s = 1; s < slices; ++s) v = v + p[(size_t)s * mn];
#endif
                    total[mi][nj][q] = v;
                }
        if (threadIdx.x == 0) *counter = 0u;  // every slice has counted: ready for the next launch
    }
    if (ep.kind == EPI_QKV_ROPE) {
        // A head's two halves sit head_dim / 2 columns apart in the tile, in other threads:
        // exchange the tile (bias added, as qkv_proj stores it) through shared memory.
        gemm_stage_tile<S>(Cs, total, bias, bias_dtype, n0, n, wm0, wn0, lane);
        epilogue_rope_tile<S::BM, S::BN, S::THREADS>(Cs, threadIdx.x, m0, n0, m, n, ep, rk);
        return;
    }
    // EPI_SILU's and EPI_GEGLU's gate/up layout is in 64-row tiles (GEMM_BN): a tile BN wide
    // holds BN / 64 of them, each 32 gate columns then the same 32 up columns. The 128-wide
    // rope kernels (m16_n128, m64_n128) are launched for EPI_QKV_ROPE alone; m128_n128 serves
    // every epilogue.
    if (S::BN % GEMM_BN == 0 && (ep.kind == EPI_SILU || ep.kind == EPI_GEGLU)) {
        // gate and up of one output sit 32 columns apart in the tile, in other warps: exchange
        // the tile through shared memory (gemm_stage_tile).
        gemm_stage_tile<S>(Cs, total, nullptr, 0, n0, n, wm0, wn0, lane);
        epilogue_silu_tile<T, S::BM, S::BN, S::THREADS>(Cs, threadIdx.x, m0, n0, m, ep);
        return;
    }
#pragma unroll
    for (int mi = 0; mi < S::MI; ++mi)
#pragma unroll
        for (int nj = 0; nj < S::NJ; ++nj)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int r = m0 + wm0 + mi * 16 + g + 8 * (q >> 1), c = n0 + wn0 + nj * 8 + 2 * t + (q & 1);
                if (r >= m || c >= n) continue;
                const float v = bias_dtype ? total[mi][nj][q] + load_bias(bias, bias_dtype, c) : total[mi][nj][q];
                epilogue_store<T>(ep, r, c, n, v);
            }
}

// The fixed-order second pass of a split K: out = ((p0 + p1) + p2) ... (+ bias), like the
// in-register fold above.
#ifdef TANDEM_HOST_EMU
__device__ void matmul_fold_impl(const float* __restrict__ part, const void* __restrict__ bias, int bias_dtype, float* __restrict__ out,
                                 int m, int n, int slices) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x, mn = (size_t)m * n;
    if (e >= mn) return;
    float v = part[e];
    for (int s = 1; s < slices; ++s) v = v + part[(size_t)s * mn + e];
    out[e] = bias_dtype ? v + load_bias(bias, bias_dtype, (int)(e % (size_t)n)) : v;
}
#endif

// SIMT f32 path for f32 weights: 64x64 output tile per block of 256 threads, 4x4 outputs per
// thread, k in steps of 16 staged through shared memory. Every output is one sequential fma
// chain over k = 0..k-1, whatever m is.
#define TM 64
#define TN 64
#define TK 16

__device__ void matmul_tiled_f32_impl(const float* __restrict__ x, const float* __restrict__ w, const void* __restrict__ bias,
                                      int bias_dtype, float* __restrict__ out, int m, int n, int k) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    // Transposed tiles ([k][row]) so the inner loop reads rows and columns as broadcasts and
    // consecutive words; +1 padding keeps the transposing stores free of bank conflicts.
    __shared__ float xs[TK][TM + 1];
    __shared__ float ws[TK][TN + 1];
    const int tid = threadIdx.x;
    const int tx = tid & 15, ty = tid >> 4;
    const int r0 = blockIdx.y * TM, c0 = blockIdx.x * TN;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < k; k0 += TK) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int e = tid + 256 * q;  // 1024 elements per tile
            const int rr = e >> 4, kk = e & 15;
            const int gk = k0 + kk;
            const int gr = r0 + rr, gc = c0 + rr;
            xs[kk][rr] = (gr < m && gk < k) ? x[(size_t)gr * k + gk] : 0.0f;
            ws[kk][rr] = (gc < n && gk < k) ? w[(size_t)gc * k + gk] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TK; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = r0 + ty + 16 * i;
        if (r >= m) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int c = c0 + tx + 16 * j;
            if (c < n) out[(size_t)r * n + c] = acc[i][j] + load_bias(bias, bias_dtype, c);
        }
    }
}

// ===== The large-m loop variant (issue 25): fewer instructions per mma =====
// matmul_tc_<dt>_m128_w64 (TANDEM_CUDA_GEMM_LARGE=m128_w64; not the default until an H200
// measures it). The Nsight Compute run of 2026-12-04 found m128 issuing ~20 instructions per
// mma with neither memory nor the tensor pipes busy; the SASS of m128_occ2's main loop (ptxas
// sm_90, nvdisasm) executes 152 instructions per k tile for its 16 HMMA (9.5 per HMMA):
// shared-memory addresses rebuilt from generic pointers (cvta) for every ldmatrix and
// cp.async, 64-bit source addresses recomputed per copy. This loop: 298 instructions per group
// of two k tiles for 128 HMMA (2.33 per HMMA; no fold on the path); ptxas 238 registers on
// sm_90, 239 on sm_80, no spills (bf16: a 544-byte stack frame, `total` below; f16: none). This loop keeps every element's arithmetic (the same k16 mma steps in ascending k
// from the same fragments, slices folded in index order into the shared-memory total (TS_),
// then matmul_tc_finish's fold and epilogues), so the same bits as every kernel here; only
// the bookkeeping changes:
//   - warp tiles of 64 x 64 (MI 4 x NJ 8: 32 mma per k16 step for 8 ldmatrix.x4, not 8 for 4);
//   - shared-memory addresses as 32-bit offsets from one base worked out once: every ldmatrix
//     and cp.async destination is a register plus a constant;
//   - each thread's copies fixed once (row tid / 4 + i * THREADS / 4, columns 8 (tid % 4) ..):
//     per k tile a pointer add and a size select per 16-byte copy;
//   - GROUP k tiles of 32 per barrier (the pipeline's STAGES tiles in STAGES / GROUP groups,
//     one commit group each): a barrier per 64 k with GROUP 2;
//   - the slice end tested once per k tile against the next fold's tile index; the fold may
//     fall between the two k tiles of a group (slice_len an odd multiple of 32).
// The copies are this fast where both operands are cp.async-able 16-bit rows (every m > 128
// GEMM with k % 8 == 0); elsewhere (x f32, the input norm, k % 8 != 0) the k tiles go through
// gemm_load_tile, in the same loop.
template <typename S_, int GROUP_>
struct GemmFast : S_ {
    static constexpr int GROUP = GROUP_;
    static_assert(S_::TOTAL_SMEM, "the fast loop folds slices into the shared-memory total");
    static_assert(S_::STAGES % GROUP_ == 0 && S_::STAGES / GROUP_ >= 2, "whole groups, at least two");
    static_assert(S_::THREADS % 4 == 0 && S_::BM % (S_::THREADS / 4) == 0 && S_::BN % (S_::THREADS / 4) == 0, "whole rows of copies per thread");
};
// gemm_keep(v): v as an opaque register value, so the compiler keeps it instead of recomputing
// it from threadIdx inside the loop (NVVM rematerialised the whole copy plan every k tile).
#ifdef TANDEM_HOST_EMU
__device__ __forceinline__ void gemm_keep(u32&) {}
__device__ __forceinline__ u32 gemm_smem_base(unsigned char* p) { return (u32)(p - emu::dynamic_smem()); }
__device__ __forceinline__ void gemm_ldsm_x4(u32 (&r)[4], u32 a) { emu::ldmatrix(r, 4, false, emu::dynamic_smem() + a); }
template <bool CG>
__device__ __forceinline__ void gemm_cp16(u32 dst, const u16* src, int bytes) { emu::cp_async16(emu::dynamic_smem() + dst, src, bytes); }
#else
__device__ __forceinline__ void gemm_keep(u32& v) { asm volatile("" : "+r"(v)); }
__device__ __forceinline__ u32 gemm_smem_base(unsigned char* p) { return smem_addr(p); }
__device__ __forceinline__ void gemm_ldsm_x4(u32 (&r)[4], u32 a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
template <bool CG>
__device__ __forceinline__ void gemm_cp16(u32 dst, const u16* src, int bytes) {
    if constexpr (CG) asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
    else asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
#endif

// One block (matmul_tc_impl's arguments and results). `planned`: both operands cp.async-able
// 16-bit rows (x stored in 16 bits or through matmul_x, kp == k, k % 8 == 0) of < 2^32
// elements: every m > 128 GEMM with k % 8 == 0; else every k tile goes through
// gemm_load_tile (x f32, the norm, unaligned rows), the same bytes in the same places.
template <typename T, typename S>
__device__ void matmul_tc_fast_impl(const float* __restrict__ x, const u16* __restrict__ xa, const u16* __restrict__ w, const void* __restrict__ bias,
                                    int bias_dtype, Epilogue ep, float* __restrict__ part, u32* __restrict__ counters, int m, int n, int k, int kp,
                                    int slice_len, int slices, NormIn nm, RopeKv rk) {
    TANDEM_DYNAMIC_SMEM(smem_raw);
    __shared__ float s_inv[S::BM];
    const bool planned = !x && (k & 7) == 0 && kp == k && (unsigned long long)max(m, n) * (unsigned)k < (1ull << 32);
    constexpr int G = S::GROUP, NG = S::STAGES / G, ROW_STEP = S::THREADS / 4, A_N = S::BM / ROW_STEP, B_N = S::BN / ROW_STEP;
    constexpr u32 A_BYTES = S::A_ELEMS * 2, B_BYTES = S::B_ELEMS * 2;  // one stage of each operand
    const int m0 = blockIdx.y * S::BM, n0 = blockIdx.x * S::BN;
    const bool split = gridDim.z > 1;
    const int s_begin = split ? (int)blockIdx.z : 0, s_end = split ? (int)blockIdx.z + 1 : slices;
    const int tiles_per_slice = slice_len / S::BK;
    const int kt_begin = s_begin * tiles_per_slice;
    const int k_end = min(k, s_end * slice_len);
    const int nt = k_end > kt_begin * S::BK ? (k_end + S::BK - 1) / S::BK - kt_begin : 0;
    const int ngroups = (nt + G - 1) / G;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm0 = (warp / S::WARPS_N) * S::WM, wn0 = (warp % S::WARPS_N) * S::WN;

    // This thread's copies: rows crow + i * ROW_STEP of each operand, columns ccol .. + 7 of
    // every k tile, as 32-bit element offsets (the entry checks m k and n k < 2^32); rows
    // outside the operand read nothing (src-size 0: zeros, as cp.async's zero fill gives the
    // other kernels), from row 0's address.
    const int crow = tid >> 2, ccol = (tid & 3) * 8;
    const u32 sbase = gemm_smem_base(smem_raw);
    u32 a_dst = sbase + (u32)(crow * S::P + ccol) * 2, b_dst = sbase + S::STAGES * A_BYTES + (u32)(crow * S::P + ccol) * 2;
    gemm_keep(a_dst);
    gemm_keep(b_dst);
    u32 a_off[A_N], b_off[B_N], a_sz[A_N], b_sz[B_N];
#pragma unroll
    for (int i = 0; i < A_N; ++i) {
        const int r = m0 + crow + i * ROW_STEP;
        a_sz[i] = r < m ? 16u : 0u;
        a_off[i] = (u32)(r < m ? r : 0) * (u32)k + (u32)ccol;
        gemm_keep(a_off[i]);
        gemm_keep(a_sz[i]);
    }
#pragma unroll
    for (int i = 0; i < B_N; ++i) {
        const int r = n0 + crow + i * ROW_STEP;
        b_sz[i] = r < n ? 16u : 0u;
        b_off[i] = (u32)(r < n ? r : 0) * (u32)k + (u32)ccol;
        gemm_keep(b_off[i]);
        gemm_keep(b_sz[i]);
    }
    // k tile t (from the block's first) into stage st; columns >= k zero-filled.
    auto load_tile = [&](int t, int st) {
        if (!planned) {
            u16* As = reinterpret_cast<u16*>(smem_raw);
            gemm_load_tile<T, S>(As + st * S::A_ELEMS, As + S::STAGES * S::A_ELEMS + st * S::B_ELEMS, x, xa, w, m, n, k, kp, m0, n0, kt_begin + t, nm, s_inv);
            return;
        }
        const int k0 = (kt_begin + t) * S::BK;
        const bool kok = k0 + ccol < k;
        const u32 koff = kok ? (u32)k0 : 0u, szk = kok ? 16u : 0u;
#pragma unroll
        for (int i = 0; i < A_N; ++i) gemm_cp16<false>(a_dst + st * A_BYTES + i * ROW_STEP * S::P * 2, xa + (a_off[i] + koff), (int)(a_sz[i] & szk));
#pragma unroll
        for (int i = 0; i < B_N; ++i) gemm_cp16<true>(b_dst + st * B_BYTES + i * ROW_STEP * S::P * 2, w + (b_off[i] + koff), (int)(b_sz[i] & szk));
    };
    // Group gi's tiles into slot `slot` (stages slot * G ..), then one commit (empty past the end).
    auto load_group = [&](int gi, int slot) {
#pragma unroll
        for (int j = 0; j < G; ++j)
            if (gi * G + j < nt) load_tile(gi * G + j, slot * G + j);
        cp_async_commit();
    };

    // ldmatrix rows: A as matmul_tc_impl (rows 0-15 x cols 0-7, then cols 8-15), B likewise.
    u32 a_ld = sbase + (u32)((wm0 + (lane & 15)) * S::P + (lane >> 4) * 8) * 2;
    u32 b_ld = sbase + S::STAGES * A_BYTES + (u32)((wn0 + (lane & 7) + ((lane >> 4) << 3)) * S::P + ((lane >> 3) & 1) * 8) * 2;
    gemm_keep(a_ld);
    gemm_keep(b_ld);
    float acc[S::MI][S::NJ][4];
#pragma unroll
    for (int i = 0; i < S::MI; ++i)
#pragma unroll
        for (int j = 0; j < S::NJ; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
    // The slice total: word ((mi * NJ + nj) * 4 + q) * THREADS + tid, as matmul_tc_impl's.
    float* s_total = reinterpret_cast<float*>(smem_raw + S::PIPE_BYTES) + tid;

    PDL_WAIT();  // the copies below read x
    PDL_LAUNCH_DEPENDENTS();
    if (nm.dtype) norm_prologue<S>(nm, x, m, k, m0, s_inv);  // its rows' 1/rms before x's tiles
#pragma unroll
    for (int s = 0; s < NG - 1; ++s) {
        if (s < ngroups) load_group(s, s);
        else cp_async_commit();
    }
    bool first = true;
    int next_fold = min(tiles_per_slice, nt) - 1;  // the tile after which the next fold falls
    int rd = 0, wr = NG - 1;                         // the slots read and written this group
    for (int gi = 0; gi < ngroups; ++gi) {
#if TANDEM_GEMM_BREAK != 2
        cp_async_wait<NG - 2>();  // this thread's copies of group gi have landed
#endif
        __syncthreads();  // ... everyone's have; and everyone is done with group gi - 1's slot
        if (gi + NG - 1 < ngroups) load_group(gi + NG - 1, wr);
        else cp_async_commit();
#pragma unroll
        for (int j = 0; j < G; ++j) {
            const int t = gi * G + j;
            if (G > 1 && t >= nt) continue;
            const u32 ast = a_ld + (rd * G + j) * A_BYTES, bst = b_ld + (rd * G + j) * B_BYTES;
#pragma unroll
            for (int kk = 0; kk < S::BK; kk += 16) {
                u32 af[S::MI][4], bfr[S::NJ][2];
#pragma unroll
                for (int mi = 0; mi < S::MI; ++mi) gemm_ldsm_x4(af[mi], ast + (mi * 16 * S::P + kk) * 2);
#pragma unroll
                for (int nj = 0; nj < S::NJ; nj += 2) {
                    u32 r[4];
                    gemm_ldsm_x4(r, bst + (nj * 8 * S::P + kk) * 2);
#if TANDEM_GEMM_BREAK == 1
                    bfr[nj][0] = r[0]; bfr[nj][1] = r[2]; bfr[nj + 1][0] = r[1]; bfr[nj + 1][1] = r[3];
#else
                    bfr[nj][0] = r[0]; bfr[nj][1] = r[1]; bfr[nj + 1][0] = r[2]; bfr[nj + 1][1] = r[3];
#endif
                }
#pragma unroll
                for (int mi = 0; mi < S::MI; ++mi)
#pragma unroll
                    for (int nj = 0; nj < S::NJ; ++nj) mma_16816(T{}, acc[mi][nj], af[mi], bfr[nj]);
            }
            if (t == next_fold) {  // a slice ends (kt_begin is a whole number of slices): fold it in
#pragma unroll
                for (int mi = 0; mi < S::MI; ++mi)
#pragma unroll
                    for (int nj = 0; nj < S::NJ; ++nj)
#pragma unroll
                        for (int q = 0; q < 4; ++q) {
                            float& tot = s_total[((mi * S::NJ + nj) * 4 + q) * S::THREADS];
#if TANDEM_GEMM_BREAK == 4
                            tot = tot + acc[mi][nj][q];  // the bug: the first slice adds to words nobody wrote
#else
                            tot = first ? acc[mi][nj][q] : tot + acc[mi][nj][q];
#endif
                            acc[mi][nj][q] = 0.0f;
                        }
                first = false;
                next_fold = min(next_fold + tiles_per_slice, nt - 1);
            }
        }
        rd = rd + 1 == NG ? 0 : rd + 1;
        wr = wr + 1 == NG ? 0 : wr + 1;
    }
    // The total for the epilogues; no slice at all leaves zeros. Its own array, not acc: NVVM
    // does not unroll matmul_tc_finish's 128-element loops, so `total` lives in local memory
    // (ptxas: a 512-byte stack frame), which would drag acc there too (a local store per mma).
    float total[S::MI][S::NJ][4];
#pragma unroll
    for (int mi = 0; mi < S::MI; ++mi)
#pragma unroll
        for (int nj = 0; nj < S::NJ; ++nj)
#pragma unroll
            for (int q = 0; q < 4; ++q) total[mi][nj][q] = first ? 0.0f : s_total[((mi * S::NJ + nj) * 4 + q) * S::THREADS];
    matmul_tc_finish<T, S>(total, reinterpret_cast<float*>(smem_raw), bias, bias_dtype, ep, part, counters, m, n, slices, rk, m0, n0, wm0, wn0, lane);
}

// m128_w64 (m > 128): a 128 x 128 tile, 4 warps of 64 x 64, 6 stages of 32 k in groups of 2
// (a barrier per 64 k), the slice total in shared memory: 6 x 20480 + 65536 = 188416 bytes
// (opt-in), one block per SM.
typedef GemmFast<GemmShape<128, 64, 64, 6, 128, true>, 2> GemmM128W64;
// ===== end of the large-m loop variant =====

typedef GemmShape<16, 16, 16, 4> GemmM16;
typedef GemmShape<64, 32, 32, 4> GemmM64;
typedef GemmShape<128, 32, 32, 3> GemmM128;
// 128-column tiles for EPI_QKV_ROPE at head_dim 128 (see GemmShape). The same 16x16 / 32x32 warp
// tiles as m16 / m128, so per thread the same registers and loads; 8 warps, so a decode
// GEMM keeps the warps in flight of the 64-wide kernel with half its blocks. Both take
// 46080 bytes of dynamic shared memory (the 48 KiB a launch gets without opting in): m16 with
// 4 stages, m64 with 3 (4 would need 61440). The staged f32 tile fits (16 x 129 x 4 = 8256,
// 64 x 129 x 4 = 33024 bytes); a 128 x 128 tile would not (66048 bytes, and 61440 for its 3
// stages), so above 16 rows, prefill included, the m64_n128 kernel serves: a 64 x 128 tile has
// the 128 x 64 tile's area, warps and stages.
typedef GemmShape<16, 16, 16, 4, 128> GemmM16N128;
typedef GemmShape<64, 32, 32, 3, 128> GemmM64N128;
// Variants timed against the defaults above on the GPU (issue 25; crates/cuda/src/matmul.rs
// `gemm_kernel`, TANDEM_CUDA_GEMM_LARGE / TANDEM_CUDA_GEMM_MID pick them). Same warp-level
// arithmetic and k order as every kernel here, so the same bits (kernels/emu `gemm_variants`):
//   m128_n128 (m > 128): a 128 x 128 tile, 8 warps of 64 x 32 (16 mma per k16 step and warp,
//     not 8), 4 stages and the slice total in shared memory: 147456 bytes (opt-in), one block
//     per SM;
//   m128_occ2 (m > 128): m128's tile with 4 stages, the total in shared memory (94208 bytes,
//     opt-in) and registers capped at 128, so two blocks share an SM (m128 takes ~158
//     registers: one block of 8 warps per SM);
//   m64_occ4 (17..128 rows): m64's tile with 3 stages and the total in shared memory (47104
//     bytes), registers capped at 128: four blocks per SM, not three;
//   m16_s8 (decode, m <= 16): m16 with 8 stages, not 4 (51200 bytes, opt-in): twice the weight
//     bytes in flight per block.
typedef GemmShape<128, 64, 32, 4, 128, true> GemmM128N128;
typedef GemmShape<128, 32, 32, 4, 64, true> GemmM128Occ2;
typedef GemmShape<64, 32, 32, 3, 64, true> GemmM64Occ4;
typedef GemmShape<16, 16, 16, 8> GemmM16S8;

// TANDEM_MATMUL_DEVICE_ONLY: the device code above without the kernels below, for a file that
// builds its own kernels on this tile code (moe.cu's grouped GEMM includes this file so).
#ifndef TANDEM_MATMUL_DEVICE_ONLY
// BOUNDS: the kernel's __launch_bounds__. m16_n128 adds a minimum of 1 block per SM: with
// the bare bound ptxas gave it 64 registers and a 12-byte spill on sm_80 (none on sm_90);
// with it, 90 registers and no spill (measured with tandem-kernels-check).
#define MATMUL_TC_BOUNDS(DT, T, NAME, SHAPE, BOUNDS)                                                                    \
    extern "C" __global__ void BOUNDS                                                                                 \
        matmul_tc_##DT##_##NAME(const float* x, const u16* xa, const u16* w, const void* bias, int bias_dtype, float* out0, \
                                float* out1, float* out2, int epi, int en0, int en1, const void* ep_gamma, int ep_gamma_dtype,     \
                                int ep_act16, float* part, u32* counters, int m, int n, int k, int kp, int slice_len, int slices,  \
                                const void* norm_gamma, int norm_dtype, float norm_eps, RopeKv rope_kv) {                         \
        const Epilogue ep{out0, out1, out2, epi, en0, en1, ep_gamma, ep_gamma_dtype, ep_act16};                       \
        matmul_tc_impl<T, SHAPE>(x, xa, w, bias, bias_dtype, ep, part, counters, m, n, k, kp, slice_len, slices,      \
                                 NormIn{norm_gamma, norm_dtype, norm_eps}, rope_kv);                                  \
    }
#define MATMUL_TC(DT, T, NAME, SHAPE) MATMUL_TC_BOUNDS(DT, T, NAME, SHAPE, __launch_bounds__(SHAPE::THREADS))
#define MATMUL_DT(DT, T)                                                                                               \
    extern "C" __global__ void __launch_bounds__(256) matmul_x_##DT(const float* x, u16* xa, int m, int k, int kp) {  \
        matmul_x_impl<T>(x, xa, m, k, kp);                                                                           \
    }                                                                                                                \
    MATMUL_TC(DT, T, m16, GemmM16)                                                                                   \
    MATMUL_TC(DT, T, m64, GemmM64)                                                                                   \
    MATMUL_TC(DT, T, m128, GemmM128)                                                                                 \
    MATMUL_TC_BOUNDS(DT, T, m16_n128, GemmM16N128, __launch_bounds__(GemmM16N128::THREADS, 1))                       \
    MATMUL_TC(DT, T, m64_n128, GemmM64N128)                                                                          \
    MATMUL_TC_BOUNDS(DT, T, m128_n128, GemmM128N128, __launch_bounds__(GemmM128N128::THREADS, 1))                    \
    MATMUL_TC_BOUNDS(DT, T, m128_occ2, GemmM128Occ2, __launch_bounds__(GemmM128Occ2::THREADS, 2))                    \
    MATMUL_TC_BOUNDS(DT, T, m64_occ4, GemmM64Occ4, __launch_bounds__(GemmM64Occ4::THREADS, 4))                      \
    MATMUL_TC(DT, T, m16_s8, GemmM16S8)
MATMUL_DT(bf16, bf16_t)
MATMUL_DT(f16, f16_t)

// ===== Decode GEMV variants (issue 25 item 1): x staged once, weights streamed in registers =====
// matmul_tc_<dt>_m16_gemv<D> and matmul_tc_<dt>_m16_x1 (TANDEM_CUDA_GEMM_SMALL=m16_gemv4 |
// m16_gemv8 | m16_x1; m <= 16 on the 64-wide tiles; not the defaults until an H200 measures
// them). m16_x1 changes only the first point below (x once; the weights still take m16's
// 4-stage cp.async pipeline, ldmatrix and all, for any k). The same grid, K slices, fold
// and epilogues as m16, and the same bits: every output is still the sequence of mma.sync
// m16n8k16 steps in ascending k from the same fragments (the hardware's order inside one mma
// is undocumented, so a scalar FMA GEMV could not promise m16's bits; this feeds the same
// tensor-core instruction instead). What changes is how the operands arrive:
//   - x: the block's whole K range (its slice, or all of k when z = 1) is staged ONCE in shared
//     memory (f32 x rounded, with the norm where fused, or the 16-bit xa), m rows only, after
//     the first weight loads are in flight and before the main loop; A fragments come from it
//     by ldmatrix. Rows m..15 of the mma read row 0 again (their outputs are never stored; an
//     output element depends on its own row of A only).
//   - w: no shared memory, no barriers in the main loop: lane (g, t) of warp j loads, per 32-k
//     chunk, 16 bytes (k 8t .. 8t + 7) of rows n0 + 16 j + g and + 8, D chunks ahead in
//     registers (two sets of D, ping-pong: D to 2D chunks, 16-32 KB per block of 128 threads
//     for D = 4, twice that for D = 8), then a 4 x 4 transpose over the quad's shuffles gives
//     each lane the words the mma's B fragment takes (b0 = k 2t, 2t + 1; b1 = k 8 + 2t, ...).
// The gemv kernels need k % 8 == 0 (16-byte aligned weight rows); the launcher takes m16
// otherwise, and (all three) where the staged x would not fit the shared memory limit
// (matmul.rs `gemv_smem`). Shared memory per launch: 16 x (BN + 1) floats for the silu / rope
// tile exchange, m16_x1's weight stages (20480 bytes), then min(m, 16) rows of (K range rounded
// up to 32) + 8 16-bit elements (the + 8 keeps ldmatrix's rows in distinct bank groups).
// ptxas sm_90 (2026-12-05, NVRTC 13.0 PTX): m16_gemv4 125 registers, m16_gemv8 184, m16_x1 80
// (m16's), no spills; 128 bytes of static shared memory each.
template <int DEPTH_, int WSTAGES_ = 0>
struct GemvShape {
    typedef GemmShape<16, 16, 16, WSTAGES_ ? WSTAGES_ : 2> Tile;  // the warp tiling of m16 (the epilogue helpers' S)
    static constexpr int DEPTH = DEPTH_, WSTAGES = WSTAGES_, THREADS = Tile::THREADS, BN = Tile::BN;
    static constexpr int CS_BYTES = 16 * (BN + 1) * 4;
    // m16_x1: the weights' cp.async stages (m16's B tiles), between the exchange tile and x.
    static constexpr int W_BYTES = WSTAGES * Tile::B_ELEMS * 2;
    static_assert(CS_BYTES % 16 == 0 && W_BYTES % 16 == 0, "the stages and the staged x start 16-byte aligned");
};
// Dynamic shared memory of a launch (matmul.rs `gemv_smem` computes the same; the emulator's
// harness launches with it).
template <typename G>
__device__ constexpr int gemv_smem_bytes(int m, int k, int slice_len, bool split) {
    return G::CS_BYTES + G::W_BYTES + (m < 16 ? m : 16) * ((split ? slice_len : (k + GEMM_BK - 1) / GEMM_BK * GEMM_BK) + 8) * 2;
}
// The words the lane holds (k 8t .. 8t + 7 of one row, as loaded) -> the B fragments of the
// chunk's two k16 steps: q[s] = word t of quad lane s (step 0: q0, q1; step 1: q2, q3).
__device__ __forceinline__ u32 gemv_pick4(u32 a, u32 b, u32 c, u32 d, int i) { return i == 0 ? a : i == 1 ? b : i == 2 ? c : d; }
__device__ __forceinline__ void gemv_quad_transpose(const uint4& v, int t, u32 (&q)[4]) {
    u32 recv[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) recv[r] = __shfl_xor_sync(0xffffffffu, gemv_pick4(v.x, v.y, v.z, v.w, t ^ r), r);
#pragma unroll
    for (int s = 0; s < 4; ++s) q[s] = gemv_pick4(recv[0], recv[1], recv[2], recv[3], s ^ t);
}
// Loads chunks c0 .. c0 + D - 1 of this lane's two weight rows: zeros from `klim` on (this
// lane's first element past the block's K range, relative to its chunk 0), as cp.async's zero
// fill gives m16 (k % 8 == 0: a lane's 8 elements are wholly in or out).
template <int D>
__device__ __forceinline__ void gemv_load(uint4 (&buf)[D][2], const u16* const (&wrow)[2], const bool (&wok)[2], int c0, int klim) {
#pragma unroll
    for (int d = 0; d < D; ++d)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const bool ok = wok[j] && 32 * (c0 + d) < klim;
            buf[d][j] = ok ? __ldg(reinterpret_cast<const uint4*>(wrow[j] + 32 * (c0 + d))) : uint4{0u, 0u, 0u, 0u};
        }
}

template <typename T, typename G>
__device__ void matmul_gemv_impl(const float* __restrict__ x, const u16* __restrict__ xa, const u16* __restrict__ w, const void* __restrict__ bias,
                                 int bias_dtype, Epilogue ep, float* __restrict__ part, u32* __restrict__ counters, int m, int n, int k, int kp,
                                 int slice_len, int slices, NormIn nm, RopeKv rk) {
    typedef typename G::Tile S;
    TANDEM_DYNAMIC_SMEM(smem_raw);
    __shared__ float s_inv[S::BM];
    float* Cs = reinterpret_cast<float*>(smem_raw);
    u16* xs = reinterpret_cast<u16*>(smem_raw + G::CS_BYTES + G::W_BYTES);
    const int m0 = blockIdx.y * S::BM, n0 = blockIdx.x * S::BN;
    const int rows = min(S::BM, m - m0);
    const bool split = gridDim.z > 1;
    const int s_begin = split ? (int)blockIdx.z : 0, s_end = split ? (int)blockIdx.z + 1 : slices;
    const int tiles_per_slice = slice_len / S::BK;
    const int k_begin = s_begin * slice_len;
    const int k_end = min(k, s_end * slice_len);
    const int nch = k_end > k_begin ? (k_end - k_begin + S::BK - 1) / S::BK : 0;  // 32-wide k chunks
    // The staged x's row pitch: the K range as the host sized it (matmul.rs `gemv_smem`).
    const int xp = (split ? slice_len : (k + S::BK - 1) / S::BK * S::BK) + 8;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int wn0 = warp * S::WN;
    const u16* wrow[2];
    bool wok[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int row = n0 + wn0 + 8 * j + g;
        wok[j] = row < n;
        wrow[j] = wok[j] ? w + (size_t)row * k + k_begin + 8 * t : w;
    }
    float acc[S::MI][S::NJ][4], total[S::MI][S::NJ][4];
#pragma unroll
    for (int j = 0; j < S::NJ; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[0][j][q] = total[0][j][q] = 0.0f;
    const u16* a_row = xs + min(lane & 15, rows - 1) * xp + (lane >> 4) * 8;
    bool first_slice = true;
    int slice_tiles = 0;
    // The norm's pass and x's K range, once (the bits gemm_load_tile stores per k tile), after
    // the first weights are in flight; a barrier before x is read.
    auto stage_x = [&]() {
        PDL_WAIT();  // before: the first weights only (PDL: in flight while the previous kernel drains)
        PDL_LAUNCH_DEPENDENTS();
        if (nm.dtype) norm_prologue<S>(nm, x, m, k, m0, s_inv);
        const int cover = nch * S::BK;
        for (int e = threadIdx.x; e < rows * cover; e += S::THREADS) {
            const int r = e / cover, c = e % cover, kk = k_begin + c;
            const bool ok = kk < k_end;
            u16 v = 0;
            if (ok && x) {
                float f = x[(size_t)(m0 + r) * k + kk];
                if (nm.dtype) f = (f * s_inv[r]) * load_bias(nm.gamma, nm.dtype, kk);
                v = f32_to_bits(T{}, f);
            } else if (ok) {
                v = xa[(size_t)(m0 + r) * kp + kk];
            }
            xs[r * xp + c] = v;
        }
        __syncthreads();
    };
    // A slice ends after chunk ch: fold it in (matmul_tc_impl's fold).
    auto end_chunk = [&](int ch) {
        if (++slice_tiles == tiles_per_slice || ch == nch - 1) {
            slice_tiles = 0;
#pragma unroll
            for (int j = 0; j < S::NJ; ++j)
#pragma unroll
                for (int q2 = 0; q2 < 4; ++q2) {
                    total[0][j][q2] = first_slice ? acc[0][j][q2] : total[0][j][q2] + acc[0][j][q2];
                    acc[0][j][q2] = 0.0f;
                }
            first_slice = false;
        }
    };
    if constexpr (G::WSTAGES == 0) {
        // Registers: the first D chunks of weights go out before anything else.
        uint4 b0[G::DEPTH][2], b1[G::DEPTH][2];
        const int klim = k_end - k_begin - 8 * t;
        gemv_load<G::DEPTH>(b0, wrow, wok, 0, klim);
        stage_x();
        // One chunk: two k16 steps of the mma from the staged x and the transposed weight words.
        auto chunk = [&](const uint4 (&v)[2], int ch) {
            u32 q[2][4];
            gemv_quad_transpose(v[0], t, q[0]);
            gemv_quad_transpose(v[1], t, q[1]);
#pragma unroll
            for (int st = 0; st < 2; ++st) {
                u32 af[4];
                ldmatrix_x4(af, a_row + ch * S::BK + st * 16);
#pragma unroll
                for (int j = 0; j < 2; ++j) {
#if TANDEM_GEMM_BREAK == 1
                    const u32 bf[2] = {q[j][2 * st + 1], q[j][2 * st]};
#else
                    const u32 bf[2] = {q[j][2 * st], q[j][2 * st + 1]};
#endif
                    mma_16816(T{}, acc[0][j], af, bf);
                }
            }
            end_chunk(ch);
        };
        for (int c0 = 0; c0 < nch; c0 += 2 * G::DEPTH) {
            gemv_load<G::DEPTH>(b1, wrow, wok, c0 + G::DEPTH, klim);
#pragma unroll
            for (int d = 0; d < G::DEPTH; ++d)
                if (c0 + d < nch) chunk(b0[d], c0 + d);
            gemv_load<G::DEPTH>(b0, wrow, wok, c0 + 2 * G::DEPTH, klim);
#pragma unroll
            for (int d = 0; d < G::DEPTH; ++d)
                if (c0 + G::DEPTH + d < nch) chunk(b1[d], c0 + G::DEPTH + d);
        }
    } else {
        // m16_x1: m16's cp.async pipeline for the weights alone (gemm_load_tile TILE_W, any k),
        // its first WSTAGES - 1 tiles in flight before x is staged; A from the staged x.
        u16* Bs = reinterpret_cast<u16*>(smem_raw + G::CS_BYTES);
        const int kt_begin = k_begin / S::BK;
#pragma unroll
        for (int s = 0; s < S::STAGES - 1; ++s) {
            if (s < nch) gemm_load_tile<T, S>(nullptr, Bs + s * S::B_ELEMS, x, xa, w, m, n, k, kp, m0, n0, kt_begin + s, nm, s_inv, TILE_W);
            cp_async_commit();
        }
        stage_x();
        for (int i = 0; i < nch; ++i) {
#if TANDEM_GEMM_BREAK != 2
            cp_async_wait<S::STAGES - 2>();  // this thread's copies of tile i have landed
#endif
            __syncthreads();  // ... everyone's have; and everyone is done with tile i - 1's stage
            {
                const int next = i + S::STAGES - 1;
                if (next < nch)
                    gemm_load_tile<T, S>(nullptr, Bs + (next % S::STAGES) * S::B_ELEMS, x, xa, w, m, n, k, kp, m0, n0, kt_begin + next, nm, s_inv, TILE_W);
                cp_async_commit();
            }
            const u16* b_st = Bs + (i % S::STAGES) * S::B_ELEMS;
#pragma unroll
            for (int kk = 0; kk < S::BK; kk += 16) {
                u32 af[4], r[4], bfr[2][2];
                ldmatrix_x4(af, a_row + i * S::BK + kk);
                ldmatrix_x4(r, b_st + (wn0 + (lane & 7) + ((lane >> 4) << 3)) * S::P + kk + ((lane >> 3) & 1) * 8);
#if TANDEM_GEMM_BREAK == 1
                bfr[0][0] = r[0]; bfr[0][1] = r[2]; bfr[1][0] = r[1]; bfr[1][1] = r[3];
#else
                bfr[0][0] = r[0]; bfr[0][1] = r[1]; bfr[1][0] = r[2]; bfr[1][1] = r[3];
#endif
                mma_16816(T{}, acc[0][0], af, bfr[0]);
                mma_16816(T{}, acc[0][1], af, bfr[1]);
            }
            end_chunk(i);
        }
    }
    matmul_tc_finish<T, S>(total, Cs, bias, bias_dtype, ep, part, counters, m, n, slices, rk, m0, n0, 0, wn0, lane);
}

// The GEMV variants' entry points: matmul_tc's argument list, so the launcher passes the same
// arguments (only the dynamic shared memory differs, matmul.rs `gemv_smem`).
typedef GemvShape<4> GemvD4;
typedef GemvShape<8> GemvD8;
typedef GemvShape<0, 4> GemvX1;
#define MATMUL_GEMV(DT, T, NAME, SHAPE)                                                                                \
    extern "C" __global__ void __launch_bounds__(SHAPE::THREADS)                                                      \
        matmul_tc_##DT##_##NAME(const float* x, const u16* xa, const u16* w, const void* bias, int bias_dtype, float* out0, \
                                float* out1, float* out2, int epi, int en0, int en1, const void* ep_gamma, int ep_gamma_dtype,     \
                                int ep_act16, float* part, u32* counters, int m, int n, int k, int kp, int slice_len, int slices,  \
                                const void* norm_gamma, int norm_dtype, float norm_eps, RopeKv rope_kv) {                         \
        const Epilogue ep{out0, out1, out2, epi, en0, en1, ep_gamma, ep_gamma_dtype, ep_act16};                       \
        matmul_gemv_impl<T, SHAPE>(x, xa, w, bias, bias_dtype, ep, part, counters, m, n, k, kp, slice_len, slices,    \
                                   NormIn{norm_gamma, norm_dtype, norm_eps}, rope_kv);                                \
    }
MATMUL_GEMV(bf16, bf16_t, m16_gemv4, GemvD4)
MATMUL_GEMV(bf16, bf16_t, m16_gemv8, GemvD8)
MATMUL_GEMV(f16, f16_t, m16_gemv4, GemvD4)
MATMUL_GEMV(f16, f16_t, m16_gemv8, GemvD8)
MATMUL_GEMV(bf16, bf16_t, m16_x1, GemvX1)
MATMUL_GEMV(f16, f16_t, m16_x1, GemvX1)
// ===== end of the decode GEMV variants =====
// The large-m loop variant's entry points (matmul_tc's argument list).
#define MATMUL_TC_FAST(DT, T, NAME, SHAPE)                                                                             \
    extern "C" __global__ void __launch_bounds__(SHAPE::THREADS, 1)                                                   \
        matmul_tc_##DT##_##NAME(const float* x, const u16* xa, const u16* w, const void* bias, int bias_dtype, float* out0, \
                                float* out1, float* out2, int epi, int en0, int en1, const void* ep_gamma, int ep_gamma_dtype,     \
                                int ep_act16, float* part, u32* counters, int m, int n, int k, int kp, int slice_len, int slices,  \
                                const void* norm_gamma, int norm_dtype, float norm_eps, RopeKv rope_kv) {                         \
        const Epilogue ep{out0, out1, out2, epi, en0, en1, ep_gamma, ep_gamma_dtype, ep_act16};                       \
        matmul_tc_fast_impl<T, SHAPE>(x, xa, w, bias, bias_dtype, ep, part, counters, m, n, k, kp, slice_len, slices,  \
                                      NormIn{norm_gamma, norm_dtype, norm_eps}, rope_kv);                             \
    }
MATMUL_TC_FAST(bf16, bf16_t, m128_w64, GemmM128W64)
MATMUL_TC_FAST(f16, f16_t, m128_w64, GemmM128W64)

#ifdef TANDEM_HOST_EMU
// The former second launch, kept as the emulator's oracle for the in-kernel fold.
extern "C" __global__ void __launch_bounds__(256)
    matmul_fold(const float* part, const void* bias, int bias_dtype, float* out, int m, int n, int slices) {
    matmul_fold_impl(part, bias, bias_dtype, out, m, n, slices);
}
#endif
extern "C" __global__ void __launch_bounds__(256)
    matmul_tiled_f32(const float* x, const float* w, const void* bias, int bias_dtype, float* out, int m, int n, int k) {
    matmul_tiled_f32_impl(x, w, bias, bias_dtype, out, m, n, k);
}
#endif  // TANDEM_MATMUL_DEVICE_ONLY
#endif  // TANDEM_MATMUL_CU
