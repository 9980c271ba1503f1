// paged_attention.cu — attention of a flattened batch of query tokens over the paged KV cache.
// Two kernels: paged_attention_partial_* (f32 arithmetic, any cache, head_dim <= 256: below)
// and paged_attention_tc_* (the tensor cores, bf16 cache, head_dim 64 or 128, and 256 under
// TANDEM_CUDA_ATTENTION_D256=tc: at the end of the file, with its own contract), followed by
// its variants for TANDEM_CUDA_ATTENTION, each with tc's per-row arithmetic and sliding window:
// paged_attention_tc_deep_* (a deeper K+V pipeline, one warp a block) and
// paged_attention_tc_shared_* (prefill chunks by blocks whose warps share each K/V tile).
//
//   For query token t (sequence s = token_seq[t], position p = positions[t]) and head h
//   (kv head kh = h / (num_heads / num_kv_heads), the GQA grouping of HF's repeat_kv):
//     score[j] = scale * dot(q[t, h, :], K[slot(s, j), kh, :])      for j in lo..=p
//   lo = 0, or with a sliding window of w > 0 keys lo = max(0, p + 1 - w) (HF: key j is seen
//   when j > p - w; `window` is a per-layer scalar argument of both kernels, 0: none).
//     out[t, h, :] = sum_j softmax(score)[j] * V[slot(s, j), kh, :]
//   slot(s, j) = block_tables[s, j / block_size] * block_size + j % block_size
//   q, out f32 [T, H, D]; caches [num_blocks, block_size, KVH, D] of f32, bf16 or fp8 (kv_write.cu);
//   positions, token_seq u32 [T]; block_tables u32 [num_seqs, max_blocks]. D <= 256.
//
// The cache's element type is a template parameter (paged_attention_partial_f32 / _bf16 /
// _fp8e4m3 / _fp8e5m2): each K/V element is widened to f32 in registers as it is loaded
// (common.cuh kv_load: exact for bf16; an fp8 byte decoded exactly, then times the layer's
// k_scale / v_scale, the fp8 kernels' two extra arguments, one f32 multiply as the reference
// dequantizes), so over any cache the kernel does the same f32 arithmetic, in the same order,
// on the values the reference reads; the combine reads only f32 partials and serves all four.
// The decode is a function of the byte and the scale alone, so the contracts below (decode ==
// prefill chunk, alone == in a batch) hold over an fp8 cache as over the others.
//
// Decode tokens and prefill chunks (with or without a cached prefix) are the same thing: each
// token sees its own causal context, whose K/V kv_write has already stored.
//
// Split along the context (flash-decoding): the keys [lo, p] (the span: the context, or the
// window) are cut, from lo, into partitions whose length is a function of the token's own span
// alone (pa_part_len: at most 16 partitions of at
// least 64 keys, at most PA_PART keys; never derived from the batch), so a token's arithmetic
// depends only on its own context length and its result is the same alone or in any batch.
// Short partitions are what fill the GPU at decode: one 512-key partition per head left 64
// blocks for 132 SMs and took two thirds of a decode step on the H200 (docs/gpu-check.md).
//   paged_attention_partial_{f32,bf16}: grid (T, H / pack, max_parts), block 128 * pack. Each
//     block serves `pack` query heads of one GQA group (pack divides H / KVH, at most
//     PA_MAX_PACK; crates/cuda/src/backend.rs `pa_pack`): one 128-thread group per head, run
//     side by side on one SM so the group's K/V rows are fetched from memory once and then hit
//     in L1 for the other heads. Each group does exactly what a one-head block did (the same
//     loops over its own 128 threads, the same reduction trees over its own 4 warps), so the
//     bits do not depend on pack (kernels/emu checks pack 2 and 4 against 1, bitwise).
//     Group g of block (t, hb, part) is head h = hb * pack + g; it scores keys
//     [part*PART, min((part+1)*PART, p+1)), keeps the scores in shared memory, softmaxes them
//     against the partition's max m, and accumulates o = sum exp(s - m) V. With max_parts == 1
//     it writes o / l to out directly; otherwise o, m and l = sum exp(s - m) go to scratch.
//   (Partitions are laid over the span, so keys outside the window have no partition at all.)
//   The combine, in the last partition block of (t, h) to arrive (no second launch): each
//     block of a split token writes its o, m, l, __threadfence(), then counts itself in with
//     atomicAdd on counters[t, h]; the block that gets parts - 1 back fences again and combines
//     every partition in partition order (never arrival order): out = sum_i w_i o_i /
//     sum_i w_i l_i with w_i = exp(m_i - max m), the former paged_attention_combine kernel's
//     arithmetic (kept in the emulator as the oracle), then resets the counter to 0 (zeroed
//     once at load: every launch leaves them 0; the next launch starts after this one ends).
//     With one partition this is exactly o / l (w = 1), so a short context gives bit-identical
//     output on either path. A bad token: partition block 0 writes the NaN row.
// Scratch: part_out f32 [T, H, max_parts, D], part_ml f32 [T, H, max_parts, 2], counters u32 [T, H].
// A bad index (sequence, block id, a context longer than max_parts * PART) yields NaN output.
// Check: tandem-kernels-check --only paged_attention; op suite ops `paged_attention_decode`
// and `paged_attention_prefill` (GQA 1/3/4, head_dim 64/128/256, block 16/32, contexts mid-block,
// longer than PART).
#ifndef TANDEM_PAGED_ATTENTION_CU
#define TANDEM_PAGED_ATTENTION_CU
#include "common.cuh"

// TANDEM_PAGED_ATTENTION_DEVICE_ONLY: the device code without the kernels, for a file that
// builds on it (kernels/paged_attention_sm90.cu).
#ifdef TANDEM_PAGED_ATTENTION_DEVICE_ONLY
#define TANDEM_PA_KERNELS 0
#else
#define TANDEM_PA_KERNELS 1
#endif

#define PA_THREADS 128    // threads per query head (one group)
#define PA_MAX_PACK 4     // query heads of one GQA group per block
#define PA_PART 512       // the longest partition (the shared score arrays)
#define PA_MIN_PART 64    // the shortest
#define PA_MAX_SPLITS 16  // partitions of a context up to PA_MAX_SPLITS * PA_PART keys
#define PA_MAX_D 256

// Keys per partition for a token whose context is ctx keys (the host bounds the partition
// count with the same constants: crates/cuda/src/backend.rs, pa_max_parts).
// The first key a token with ctx keys of context sees under a sliding window of `window` keys
// (0: none); both kernels cut their partitions from here (the tensor-core one from it rounded
// down to a 64-key tile).
__device__ __forceinline__ int pa_first_key(int ctx, int window) { return window > 0 && ctx > window ? ctx - window : 0; }

__device__ inline int pa_part_len(int ctx) {
    int len = (ctx + PA_MAX_SPLITS - 1) / PA_MAX_SPLITS;
    len = (len + PA_MIN_PART - 1) / PA_MIN_PART * PA_MIN_PART;
    return min(len < PA_MIN_PART ? PA_MIN_PART : len, PA_PART);
}

// block_max / block_sum of common.cuh over one 128-thread group (thread `tid` of it, the
// group's own 32-float scratch): the same trees as over a 128-thread block, so the same bits.
// Every group of the block reaches each barrier (their control flow is the same).
__device__ __forceinline__ float pa_group_max(float v, float* scratch, int tid) {
    const int lane = tid & 31, warp = tid >> 5;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < PA_THREADS / 32 ? scratch[lane] : neg_inf_f32();
    v = warp_max(v);
    __syncthreads();
    return v;
}
__device__ __forceinline__ float pa_group_sum(float v, float* scratch, int tid) {
    const int lane = tid & 31, warp = tid >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < PA_THREADS / 32 ? scratch[lane] : 0.0f;
    v = warp_sum(v);
    __syncthreads();
    return v;
}

// out[row] from the partials of `parts` partitions, in partition order, by the 128 threads of
// one group (`tid`). volatile: the last block reads other blocks' partials straight from L2.
__device__ __forceinline__ void pa_combine_row(const volatile float* part_out, const volatile float* part_ml, float* out, size_t row,
                                               int parts, int max_parts, int D, int tid) {
    const volatile float* ml = part_ml + row * max_parts * 2;
    float mx = neg_inf_f32();
    for (int i = 0; i < parts; ++i) mx = fmaxf(mx, ml[2 * i]);
    float den = 0.0f;
    for (int i = 0; i < parts; ++i) den = fmaf(expf(ml[2 * i] - mx), ml[2 * i + 1], den);
    const volatile float* po = part_out + row * max_parts * D;
    for (int d = tid; d < D; d += PA_THREADS) {
        float num = 0.0f;
        for (int i = 0; i < parts; ++i) num = fmaf(expf(ml[2 * i] - mx), po[(size_t)i * D + d], num);
        out[row * D + d] = num / den;
    }
}

template <typename KV>
__device__ __forceinline__ void paged_attention_partial_impl(
    const float* __restrict__ q, const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,
    const u32* __restrict__ positions, const u32* __restrict__ token_seq, const u32* __restrict__ block_tables,
    float* __restrict__ out, float* __restrict__ part_out, float* __restrict__ part_ml, u32* __restrict__ counters, int num_tokens,
    int num_heads, int num_kv_heads, int head_dim, int block_size, int num_blocks, int num_seqs, int max_blocks, int max_parts,
    float scale, int window, float k_scale, float v_scale) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    // One of each per group (head); the key slots are the same for every head of the block.
    __shared__ float q_all[PA_MAX_PACK][PA_MAX_D];
    __shared__ int last_all[PA_MAX_PACK];
    __shared__ float p_all[PA_MAX_PACK][PA_PART];  // scores, then exp(score - m)
    __shared__ int slot_s[PA_PART];                // cache slot of each key, -1 if its block id is bad
    __shared__ float red_all[PA_MAX_PACK][32];
    __shared__ float o_all[PA_MAX_PACK][PA_THREADS];

    const int pack = (int)blockDim.x / PA_THREADS, grp = (int)threadIdx.x / PA_THREADS;
    const int t = blockIdx.x, h = (int)blockIdx.y * pack + grp, part = blockIdx.z;
    const int tid = (int)threadIdx.x - grp * PA_THREADS, lane = tid & 31, warp = tid >> 5;
    float* q_s = q_all[grp];
    float* p_s = p_all[grp];
    float* red = red_all[grp];
    float* o_s = o_all[grp];
    // Uniform over the block: the host makes pack divide the heads of a GQA group.
    if (t >= num_tokens || (int)blockIdx.y * pack >= num_heads || pack > PA_MAX_PACK) return;
    const int D = head_dim;
    const u32 seq = token_seq[t];
    const int ctx = (int)min(positions[t], 0x7ffffffeu) + 1;
    const int lo = pa_first_key(ctx, window), span = ctx - lo;
    const int plen = pa_part_len(span);
    const bool bad = seq >= (u32)num_seqs || D > PA_MAX_D || D < 1 || num_kv_heads < 1 ||
                     num_heads % num_kv_heads != 0 || ctx > max_blocks * block_size ||
                     (span + plen - 1) / plen > max_parts;
    const size_t row = (size_t)t * num_heads + h;  // (t, h) in [T, H]
    if (bad) {
        // One block per bad token writes its NaN row (the emulator's two-launch oracle leaves
        // it to the combine kernel).
        if (part == 0 && (max_parts == 1 || counters))
            for (int d = tid; d < D && d < PA_MAX_D; d += PA_THREADS) out[row * D + d] = nan_f32();
        return;
    }
    const int start = lo + part * plen;
    if (start >= ctx) return;  // this token's span ends before this partition
    const int n = min(plen, ctx - start);
    const int kh = h / (num_heads / num_kv_heads);
    const size_t head_off = (size_t)kh * D;
    const size_t slot_stride = (size_t)num_kv_heads * D;

    for (int d = tid; d < D; d += PA_THREADS) q_s[d] = q[row * D + d];
    __syncthreads();

    // Scores: one warp per key, lanes split the head dimension.
    const u32* table = block_tables + (size_t)seq * max_blocks;
    for (int j = warp; j < n; j += PA_THREADS / 32) {
        const int pos = start + j;
        const u32 blk = table[pos / block_size];
        float s;
        int slot;
        if (blk < (u32)num_blocks) {
            slot = (int)blk * block_size + pos % block_size;
            const KV* kp = k_cache + (size_t)slot * slot_stride + head_off;
            float dot = 0.0f;
            for (int d = lane; d < D; d += 32) dot = fmaf(q_s[d], kv_load(kp[d], k_scale), dot);
            s = warp_sum(dot) * scale;
        } else {
            slot = -1;
            s = nan_f32();
        }
        if (lane == 0) {
            p_s[j] = s;
            if (grp == 0) slot_s[j] = slot;  // every group finds the same slot
        }
    }
    __syncthreads();

    float m = neg_inf_f32();
    for (int j = tid; j < n; j += PA_THREADS) m = fmaxf(m, p_s[j]);
    m = pa_group_max(m, red, tid);
    float l = 0.0f;
    for (int j = tid; j < n; j += PA_THREADS) {
        const float e = expf(p_s[j] - m);
        p_s[j] = e;
        l += e;
    }
    l = pa_group_sum(l, red, tid);  // its barriers also publish p_s and slot_s

    // o = sum_j p_j V_j. For D <= 128, ng groups of D threads take every ng-th key and the
    // groups are summed in a fixed order; for D > 128 each thread owns D / 128 dimensions.
    const bool direct = max_parts == 1;
    float* dst = direct ? out + row * D : part_out + (row * max_parts + part) * D;
    if (D <= PA_THREADS) {
        const int ng = PA_THREADS / D, g = tid / D, d = tid - g * D;
        float acc = 0.0f;
        if (g < ng) {
            for (int j = g; j < n; j += ng) {
                const int slot = slot_s[j];
                const float vv = slot >= 0 ? kv_load(v_cache[(size_t)slot * slot_stride + head_off + d], v_scale) : nan_f32();
                acc = fmaf(p_s[j], vv, acc);
            }
        }
        if (ng > 1) {
            o_s[tid] = acc;
            __syncthreads();
            if (tid < D) {
                acc = 0.0f;
                for (int gg = 0; gg < ng; ++gg) acc += o_s[gg * D + tid];
            }
        }
        if (tid < D) dst[tid] = direct ? acc / l : acc;
    } else {
        for (int d = tid; d < D; d += PA_THREADS) {
            float acc = 0.0f;
            for (int j = 0; j < n; ++j) {
                const int slot = slot_s[j];
                const float vv = slot >= 0 ? kv_load(v_cache[(size_t)slot * slot_stride + head_off + d], v_scale) : nan_f32();
                acc = fmaf(p_s[j], vv, acc);
            }
            dst[d] = direct ? acc / l : acc;
        }
    }
    if (direct) return;
    if (tid == 0) {
        part_ml[(row * max_parts + part) * 2 + 0] = m;
        part_ml[(row * max_parts + part) * 2 + 1] = l;
    }
    if (!counters) return;  // kernels/emu only: the two-launch oracle combines in a second kernel
    const int parts = (span + plen - 1) / plen;
    __threadfence();  // release: this thread's partial writes, before the block counts in
    __syncthreads();
    if (tid == 0) last_all[grp] = atomicAdd(counters + row, 1u) == (u32)(parts - 1);
    __syncthreads();
    // Per group from here (no barrier follows): each head's row is combined by its own group
    // in whichever block of that row came last.
    if (!last_all[grp]) return;
    __threadfence();  // acquire: every partition counted before ours is visible
    pa_combine_row(part_out, part_ml, out, row, parts, max_parts, D, tid);
    if (tid == 0) counters[row] = 0u;
}

// EXTRA: the fp8 kernels' two more parameters (PA_FP8_SCALES); KS, VS: the scales passed on.
#define PA_FP8_SCALES , float k_scale, float v_scale
#define PA_PARTIAL(NAME, KV, EXTRA, KS, VS)                                                                          \
    extern "C" __global__ void __launch_bounds__(PA_THREADS * PA_MAX_PACK) paged_attention_partial_##NAME(           \
        const float* __restrict__ q, const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,                 \
        const u32* __restrict__ positions, const u32* __restrict__ token_seq, const u32* __restrict__ block_tables, \
        float* __restrict__ out, float* __restrict__ part_out, float* __restrict__ part_ml, u32* __restrict__ counters, \
        int num_tokens, int num_heads, int num_kv_heads, int head_dim, int block_size, int num_blocks, int num_seqs,   \
        int max_blocks, int max_parts, float scale, int window EXTRA) {                                                \
        paged_attention_partial_impl<KV>(q, k_cache, v_cache, positions, token_seq, block_tables, out, part_out,     \
                                         part_ml, counters, num_tokens, num_heads, num_kv_heads, head_dim, block_size,         \
                                         num_blocks, num_seqs, max_blocks, max_parts, scale, window, KS, VS);        \
    }
#if TANDEM_PA_KERNELS
PA_PARTIAL(f32, float, , 1.0f, 1.0f)
PA_PARTIAL(bf16, bf16_t, , 1.0f, 1.0f)
PA_PARTIAL(fp8e4m3, fp8e4m3_t, PA_FP8_SCALES, k_scale, v_scale)
PA_PARTIAL(fp8e5m2, fp8e5m2_t, PA_FP8_SCALES, k_scale, v_scale)
#endif

#if defined(TANDEM_HOST_EMU) && TANDEM_PA_KERNELS
// The former second launch, kept as the emulator's oracle for the in-kernel combine.
extern "C" __global__ void __launch_bounds__(PA_THREADS)
paged_attention_combine(const float* __restrict__ part_out, const float* __restrict__ part_ml,
                        const u32* __restrict__ positions, const u32* __restrict__ token_seq,
                        float* __restrict__ out, int num_tokens, int num_heads, int num_kv_heads,
                        int head_dim, int block_size, int num_seqs, int max_blocks, int max_parts, int window) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    if (t >= num_tokens || h >= num_heads) return;
    const int D = head_dim;
    const u32 seq = token_seq[t];
    const int ctx = (int)min(positions[t], 0x7ffffffeu) + 1;
    const int span = ctx - pa_first_key(ctx, window);
    const int plen = pa_part_len(span);
    const int parts = (span + plen - 1) / plen;
    const bool bad = seq >= (u32)num_seqs || D > PA_MAX_D || D < 1 || num_kv_heads < 1 ||
                     num_heads % num_kv_heads != 0 || ctx > max_blocks * block_size || parts > max_parts;
    const size_t row = (size_t)t * num_heads + h;
    if (bad) {
        for (int d = tid; d < D && d < PA_MAX_D; d += PA_THREADS) out[row * D + d] = nan_f32();
        return;
    }
    pa_combine_row(part_out, part_ml, out, row, parts, max_parts, D, tid);
}
#endif

// ---------------------------------------------------------------------------------------------
// paged_attention_tc_d{64,128,256}: the same attention on the tensor cores, over a bf16 cache
// (crates/cuda/src/attention.rs takes it for a bf16 cache and head_dim 64 or 128, and 256
// under TANDEM_CUDA_ATTENTION_D256=tc; the f32 cache, kept for checks, and other head sizes
// take the kernel above). Its fp8 form, kernels/paged_attention_fp8.cu, is pat_job with the
// cache type KV = fp8e4m3_t / fp8e5m2_t: each stage's bytes decoded to bf16 into shared memory
// (issue / land below), then this code, so bitwise this kernel over the decoded cache.
//
// Work is cut into warp jobs, and a warp never shares arithmetic with another warp: its 16
// mma rows are (token, query head) pairs of one sequence and one KV head, tokens outer, the
// heads of the GQA group inner (a group of more than 16 heads is cut into groups of 16).
//   - a split job (the first `n_split` tokens, one job per token and partition: decodes)
//     computes one partition of one token and writes its (m, l, o) partial; the last job of
//     the token to arrive folds the partials in partition order (counters as above);
//   - a chunk job (the other tokens, `tw` consecutive tokens per job, one sequence at a time
//     when the chunk holds the end of one and the start of the next) walks all of its rows'
//     keys once, loading each K/V tile once for every row, and folds each row's partitions
//     into `out` as it passes their ends.
// Both compute, for each row, exactly this sequence, which depends on the row's own context
// alone, so a token's bits are the same whichever job kind serves it, whatever shares its
// mma rows, and in any batch (kernels/emu checks each token alone against the batch):
//   1. The span [base, ctx) is cut into partitions of pat_part_len(ctx - base) keys (a multiple
//      of 64: at most PAT_SPLITS of them, at least 64 keys each; no upper bound, since nothing
//      is held per key), and each partition into 64-key tiles at absolute positions. base = 0,
//      or under a sliding window the row's first key lo = pa_first_key(ctx, window) rounded
//      down to a tile; keys before lo are -inf like keys past ctx. In a chunk job, the tiles
//      before a row's base leave its state (m = -inf, l = 0, o = 0) as it is (p = 0).
//   2. Per tile: s = (q . k) * scale * log2(e) with q rounded to bf16 and the dims in ascending
//      k16 steps of mma.m16n8k16 (f32 accumulation); keys at or past ctx are -inf, a key whose
//      block id is bad is NaN. The online softmax: m' = max(m, max s), a = 2^(m - m'),
//      p = 2^(s - m'), l = fma(l, a, sum p) (the row's 64 p in a fixed order: the thread's 16
//      in fragment order, then quad shuffles xor 1, xor 2), o = o * a, then o += bf16(p) . V in
//      four k16 steps of ascending keys. A partition starts at m = -inf, l = 0, o = 0.
//   3. Partials fold in partition order: the first is taken as it is, then each next one
//      (m_i, l_i, o_i) by M = max(m, m_i), a = 2^(m - M), b = 2^(m_i - M), l = fma(l, a, l_i b),
//      o = fma(o, a, o_i b), m = M; out = o / l.
// Keys past the job's last context are zero-filled (never loaded), so a row's masked keys
// contribute exact zeros; past a row's own context (other rows' keys in a chunk job) they
// contribute 0 * v, which can change only the sign of an output element that is exactly zero.
// Per warp: 2 stages x 16 keys x (D + 8) bf16 of dynamic shared memory (the 8 pad the rows so
// ldmatrix's 8 row addresses fall in different banks), cp.async double-buffered: the K stages
// of a tile, then its V stages. Bad token or sequence: NaN row, as above.
// At D 256 (PatCfg, by pat_job): q in a third 16-row buffer, and each job of 16 rows is two
// warp jobs, one per half of the output dims, that compute the same scores and softmax and
// each accumulate, fold and write its 128 dims (steps 1-3 per element, unchanged); the halves
// count in and keep partials as rows of their own. The d256 kernel is the same code, so the
// contract holds there as written (kernels/emu runs the checks at D 256 too).
#ifndef TANDEM_PAT_BREAK
#define TANDEM_PAT_BREAK 0  // kernels/emu/attn_break_test.cpp: 1-4 break it on purpose
#endif
#define PAT_WARPS 4
#define PAT_TILE 64
#define PAT_SUB 16
#define PAT_MIN_PART 64
#define PAT_SPLITS 16
#define PAT_LOG2E 1.4426950408889634f

// Keys per partition of a token whose context is ctx keys (crates/cuda/src/attention.rs,
// pat_max_parts, bounds the count with the same constants).
__device__ __forceinline__ int pat_part_len(int ctx) {
    int len = (ctx + PAT_SPLITS - 1) / PAT_SPLITS;
    len = (len + PAT_MIN_PART - 1) / PAT_MIN_PART * PAT_MIN_PART;
    return len < PAT_MIN_PART ? PAT_MIN_PART : len;
}

__device__ __forceinline__ u32 pat_pack(float lo, float hi) {
    return (u32)f32_to_bf16_bits(lo) | ((u32)f32_to_bf16_bits(hi) << 16);
}

// One fold of step 3 for one element: (m, l, o) absorbs (mi, li, oi). Both job kinds call
// this, so they fold with the same operations.
__device__ __forceinline__ void pat_fold_ml(float& m, float& l, float mi, float li, float& a, float& b) {
    const float M = fmaxf(m, mi);
    a = exp2f(m - M);
    b = exp2f(mi - M);
    l = fmaf(l, a, li * b);
    m = M;
}

struct PatArgs {
    const float* q;
    const bf16_t* k_cache;
    const bf16_t* v_cache;
    const u32* positions;
    const u32* token_seq;
    const u32* block_tables;
    float* out;
    float* part_out;
    float* part_ml;
    u32* counters;
    int num_tokens, n_split, num_heads, num_kv_heads, block_size, num_blocks, num_seqs, max_blocks, max_parts, tw;
    float scale_log2;
    int window;  // sliding window in keys, 0: none
    // The fp8 form (kernels/paged_attention_fp8.cu): the caches as bytes, and the layer's
    // scales; the bf16 kernels leave them as they are.
    const unsigned char* k8 = nullptr;
    const unsigned char* v8 = nullptr;
    float k_scale = 1.0f, v_scale = 1.0f;
};

// A chunk job's fold of row rr (of the lane's two, g and g + 8) at the end of a partition: its
// (m, l, o) into the running (macc, lacc) and the output row, which holds the partitions so far
// (first: this is the first; last: the row's context ends here, so the row is divided by its
// sum). o, m and l start again for the next partition. Shared by tc and tc_deep.
template <int D>
__device__ __forceinline__ void pat_chunk_fold(const PatArgs& a, float (&o)[D / 8][4], float (&m)[2], float (&l)[2], float (&macc)[2],
                                               float (&lacc)[2], const size_t (&orow)[2], int c, int rr, bool first, bool last) {
    float fa = 0.0f, fb = 0.0f;
    if (!first) pat_fold_ml(macc[rr], lacc[rr], m[rr], l[rr], fa, fb);
    else {
        macc[rr] = m[rr];
        lacc[rr] = l[rr];
    }
    for (int n = 0; n < D / 8; ++n)
        for (int e = 0; e < 2; ++e) {
            float* dst = a.out + orow[rr] + n * 8 + 2 * c + e;
            const float v = first ? o[n][2 * rr + e] : fmaf(*dst, fa, o[n][2 * rr + e] * fb);
            *dst = last ? v / lacc[rr] : v;
            o[n][2 * rr + e] = 0.0f;
        }
    m[rr] = neg_inf_f32();
    l[rr] = 0.0f;
}

// A split job's end (token t, `parts` partitions; this job is partition `part`): with one
// partition the rows straight to out; else this partition's partial (o, m, l) to part_out /
// part_ml, and the token's last job to arrive folds the partials in index order into out.
// NEWEST_FIRST (the TANDEM_PAT_BREAK / TANDEM_PATD_BREAK 3 builds only) folds them in the
// wrong order on purpose. Shared by tc and tc_deep.
// HALVES > 1 (d256): this job holds output dims [half * D, (half + 1) * D) of rows HALVES * D
// long, each half a row of its own in out, part_out and part_ml (row * HALVES + half).
template <int D, bool NEWEST_FIRST, int HALVES = 1>
__device__ __forceinline__ void pat_split_end(const PatArgs& a, const float (&o)[D / 8][4], const float (&m)[2], const float (&l)[2],
                                              const int (&ctx)[2], const size_t (&orow)[2], int c, int lane, int t, int part, int parts,
                                              int h0, int G, int group, int groups, int half = 0) {
    constexpr int NT = D / 8;
    const int H = a.num_heads;
    if (parts == 1) {
        for (int rr = 0; rr < 2; ++rr)
            if (ctx[rr] > 0)
                for (int n = 0; n < NT; ++n)
                    for (int e = 0; e < 2; ++e) a.out[orow[rr] + n * 8 + 2 * c + e] = o[n][2 * rr + e] / l[rr];
        return;
    }
    const int P = a.max_parts;
    for (int rr = 0; rr < 2; ++rr) {
        if (ctx[rr] == 0) continue;
        const size_t prow = orow[rr] / D * P + part;  // (t, h, part)
        for (int n = 0; n < NT; ++n)
            for (int e = 0; e < 2; ++e) a.part_out[prow * D + n * 8 + 2 * c + e] = o[n][2 * rr + e];
        if (c == 0) {
            a.part_ml[prow * 2] = m[rr];
            a.part_ml[prow * 2 + 1] = l[rr];
        }
    }
    __threadfence();  // release: this lane's partial, before lane 0 counts the job in
    __syncwarp();
    u32 arrived = 0;
    if (lane == 0) arrived = atomicAdd(a.counters + (size_t)t * groups + group, 1u);
    if (__shfl_sync(0xffffffffu, arrived, 0) != (u32)(parts - 1)) return;
    __threadfence();  // acquire: every partial counted before ours is visible
    const volatile float* po = a.part_out;
    const volatile float* pm = a.part_ml;
    for (int r = 0; r < G; ++r) {
        const size_t row = ((size_t)t * H + h0 + r) * HALVES + half;
        for (int d = lane; d < D; d += 32) {
            float mm = pm[row * P * 2], ll = pm[row * P * 2 + 1], oo = po[row * P * D + d];
            for (int k = 1; k < parts; ++k) {
                const int i = NEWEST_FIRST ? parts - k : k;  // newest first: within every bound, bitwise different
                float fa, fb;
                const float oi = po[(row * P + i) * D + d];
                pat_fold_ml(mm, ll, pm[(row * P + i) * 2], pm[(row * P + i) * 2 + 1], fa, fb);
                oo = fmaf(oo, fa, oi * fb);
            }
            a.out[row * D + d] = oo / ll;
        }
    }
    if (lane == 0) a.counters[(size_t)t * groups + group] = 0u;
}

// paged_attention_tc_d256 (head_dim 256: Gemma 2 and 3) is pat_job at D = 256, the same code
// as d64 / d128, so the same per-row arithmetic, partitions and folds, with one difference in
// where q lives: o alone is 128 f32 a lane there, and q's 64 fragment registers on top of it
// spill, so the warp stages q once (bf16, rounded as the registers are) in a third 16-row
// buffer after its two K/V stages, and reads each k16 step's A fragment back by ldmatrix (as
// tc_deep does). Dynamic shared memory per warp: PatCfg<D>::WARP_ELEMS bf16.
template <int D>
struct PatCfg {
    static constexpr bool Q_SMEM = D > 128;
    static constexpr int HALVES = D > 128 ? 2 : 1;  // warp jobs a row's output dims are cut into
    static constexpr int DV = D / HALVES;            // output dims a warp job holds
    static constexpr int WARP_ELEMS = (Q_SMEM ? 3 : 2) * PAT_SUB * (D + 8);
};

// q of this lane's rows g and g + 8 rounded to bf16 (zero for a row with no keys) into q_s
// [16][D + 8] (orow: the rows' output offsets, dv0 past the q rows); the warp's ldmatrix reads
// follow the __syncwarp.
template <int D>
__device__ __forceinline__ void pat_stage_q(const PatArgs& a, bf16_t* q_s, const int (&ctx)[2], const size_t (&orow)[2], int dv0, int g, int c) {
    for (int rr = 0; rr < 2; ++rr)
        for (int n = 0; n < D / 8; ++n) {
            const int col = n * 8 + 2 * c;
            const size_t qrow = orow[rr] - dv0;
            const u32 v = ctx[rr] > 0 ? pat_pack(a.q[qrow + col], a.q[qrow + col + 1]) : 0u;
            *(u32*)(q_s + (g + 8 * rr) * (D + 8) + col) = v;
        }
    __syncwarp();
}

// The A fragment of k16 step ks from q_s: the same four registers pat_job builds from q.
template <int D>
__device__ __forceinline__ void pat_load_q(u32 (&qa)[4], const bf16_t* q_s, int ks, int lane) {
    ldmatrix_x4(qa, q_s + (lane & 15) * (D + 8) + ks * 16 + (lane >> 4) * 8);
#if TANDEM_PAT_BREAK == 1
    const u32 t = qa[1];  // a1 and a2 swapped, as break 1 does to the register fragments
    qa[1] = qa[2];
    qa[2] = t;
#endif
}

// The warp's rows: `nt` tokens from t0 (one sequence) x `G` heads from h0, of kv head kh.
// part >= 0: a split job (one token, that partition); part < 0: a chunk job (every partition).
// The job's output dims: [dv0, dv0 + DV) (all of them, but at d256: PatCfg).
template <int D, int DV = D, typename KV = bf16_t>
__device__ __forceinline__ void pat_job(const PatArgs& a, int t0, int nt, int kh, int h0, int G, int part, int group, int groups, bf16_t* stage,
                                        int dv0 = 0) {
    constexpr int PITCH = D + 8, KS = D / 16, NT = DV / 8, CH = D / 8, CHV = DV / 8, STAGE = PAT_SUB * PITCH;
    constexpr bool QS = PatCfg<D>::Q_SMEM;  // d256: q read from shared memory per k16 step
    const int lane = (int)threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int H = a.num_heads;
    const u32 seq = a.token_seq[t0];
    const bool seq_bad = seq >= (u32)a.num_seqs;
    int ctx[2], plen[2];
    bool live[2], bad[2];
    size_t orow[2];
    for (int rr = 0; rr < 2; ++rr) {
        const int r = g + 8 * rr;
        live[rr] = r < nt * G;
        const int t = t0 + (live[rr] ? r / G : 0), h = h0 + (live[rr] ? r % G : 0);
        orow[rr] = ((size_t)t * H + h) * D + dv0;
        const int cx = (int)min(a.positions[t], 0x7ffffffeu) + 1;
        const int lo_r = pa_first_key(cx, a.window), base_r = lo_r / PAT_TILE * PAT_TILE;
#if TANDEM_PAT_BREAK == 4
        plen[rr] = pat_part_len((int)min(a.positions[t0], 0x7ffffffeu) + 1);  // the job's first token's, not the row's own
#else
        plen[rr] = pat_part_len(cx - base_r);
#endif
        bad[rr] = live[rr] && (seq_bad || cx > a.max_blocks * a.block_size ||
                               (part >= 0 && (cx - base_r + plen[rr] - 1) / plen[rr] > a.max_parts));
        ctx[rr] = live[rr] && !bad[rr] ? cx : 0;
    }
    // A row's first key and its tile (0 for a row of no context), recomputed where used: two
    // more arrays held across the loop below spill the d64 kernel at sm_90.
    auto lo = [&](int rr) { return pa_first_key(ctx[rr], a.window); };
    auto base = [&](int rr) { return lo(rr) / PAT_TILE * PAT_TILE; };
    // The job's keys: [k_begin, k_end), the end of the longest context among its rows.
    int kend = max(ctx[0], ctx[1]);
    kend = max(kend, __shfl_xor_sync(0xffffffffu, kend, 1));
    kend = max(kend, __shfl_xor_sync(0xffffffffu, kend, 2));
    kend = max(kend, __shfl_xor_sync(0xffffffffu, kend, 4));
    kend = max(kend, __shfl_xor_sync(0xffffffffu, kend, 8));
    kend = max(kend, __shfl_xor_sync(0xffffffffu, kend, 16));
    int k_begin = 0;
    if (part >= 0) {  // every live row is the same token: the same ctx and partition length
        const int pl = __shfl_sync(0xffffffffu, plen[0], 0);
        k_begin = __shfl_sync(0xffffffffu, base(0), 0) + part * pl;
        kend = min(kend, k_begin + pl);
    } else if (a.window > 0) {  // from the first tile any row sees
        k_begin = min(ctx[0] > 0 ? base(0) : 0x7fffffff, ctx[1] > 0 ? base(1) : 0x7fffffff);
        for (int x = 1; x < 32; x <<= 1) k_begin = min(k_begin, __shfl_xor_sync(0xffffffffu, k_begin, x));
    }
    // A bad row's NaN: by the chunk job, or by partition 0's job.
    if (part <= 0)
        for (int rr = 0; rr < 2; ++rr)
            if (bad[rr])
                for (int nt8 = 0; nt8 < NT; ++nt8) {
                    a.out[orow[rr] + nt8 * 8 + 2 * c] = nan_f32();
                    a.out[orow[rr] + nt8 * 8 + 2 * c + 1] = nan_f32();
                }
    if (k_begin >= kend) return;  // warp-uniform: nothing of this job's keys exists

    // q rounded to bf16, as mma A fragments: a0 row g, a1 row g + 8, a2/a3 the same 8 dims on.
    // At d256 (QS) staged once in shared memory instead, and read back per k16 step (below).
    u32 qa[QS ? 1 : KS][4];
    if constexpr (QS) pat_stage_q<D>(a, stage + 2 * STAGE, ctx, orow, dv0, g, c);
    else
    for (int ks = 0; ks < KS; ++ks)
        for (int i = 0; i < 4; ++i) {
#if TANDEM_PAT_BREAK == 1
            const int rr = (i >> 1) & 1, col = ks * 16 + 2 * c + 8 * (i & 1);  // a1 and a2 swapped
#else
            const int rr = i & 1, col = ks * 16 + 2 * c + 8 * (i >> 1);
#endif
            qa[ks][i] = ctx[rr] > 0 ? pat_pack(a.q[orow[rr] + col], a.q[orow[rr] + col + 1]) : 0u;
        }

    const u32* table = a.block_tables + (size_t)(seq_bad ? 0 : seq) * a.max_blocks;
    const size_t slot_stride = (size_t)a.num_kv_heads * D, head_off = (size_t)kh * D;
    unsigned bad_keys[2] = {0u, 0u};
    // The fp8 form's bytes in flight: 16 keys x the stage's row bytes, 16 a lane a load.
    constexpr bool FP8 = sizeof(KV) == 1;
    constexpr int RAW = FP8 ? (PAT_SUB * (CH > CHV ? CH : CHV) / 2 + 31) / 32 : 1;
    uint4 raw[RAW];
    // Stage st_i (0..7) of tile tile_i: K (st_i < 4) or V, keys 16 (st_i % 4) on in the tile.
    auto issue = [&](int tile_i, int st_i) {
        const int buf = st_i & 1, key0 = k_begin + tile_i * PAT_TILE + (st_i & 3) * PAT_SUB;
        int slot = -1;  // -1: past the job's keys (zero-filled); -2: a bad block id
        if (lane < PAT_SUB) {
            const int pos = key0 + lane;
            if (pos < kend) {
                const u32 blk = table[pos / a.block_size];
                slot = blk < (u32)a.num_blocks ? (int)blk * a.block_size + pos % a.block_size : -2;
            }
        }
        bad_keys[buf] = __ballot_sync(0xffffffffu, slot == -2);
        const size_t off = head_off + ((st_i & 4) ? dv0 : 0);
        if constexpr (FP8) {
            // 16 bytes (16 keys' elements of one row) a load, held in raw until land() decodes
            // them into the stage after this stage's arithmetic; zeros where cp.async zero-fills.
            const unsigned char* cache = (st_i & 4) ? a.v8 : a.k8;
            const int nch = (st_i & 4) ? CHV / 2 : CH / 2;
            for (int i = 0; i < RAW; ++i) {
                const int e = lane + 32 * i, key = e / nch, ch = e % nch;
                const int sl = __shfl_sync(0xffffffffu, slot, key < PAT_SUB ? key : 0);
                raw[i] = uint4{0u, 0u, 0u, 0u};
                if (key < PAT_SUB && sl >= 0) raw[i] = *(const uint4*)(cache + (size_t)sl * slot_stride + off + ch * 16);
            }
        } else {
            const bf16_t* cache = (st_i & 4) ? a.v_cache : a.k_cache;
            bf16_t* dst = stage + buf * STAGE;
            const int nch = (st_i & 4) ? CHV : CH;  // V: the job's output dims only
            for (int e = lane; e < PAT_SUB * nch; e += 32) {
                const int key = e / nch, ch = e % nch;
                const int sl = __shfl_sync(0xffffffffu, slot, key);
                const bf16_t* src = sl >= 0 ? cache + (size_t)sl * slot_stride + off + ch * 8 : cache;
                cp_async_cg16(dst + key * PITCH + ch * 8, src, sl >= 0 ? 16 : 0);
            }
        }
        cp_async_commit();
    };
    // The fp8 form's second half of issue(tile_i, st_i): raw's bytes decoded as kv_load does
    // (the byte's value times the layer's scale, in f32), rounded to bf16, into the stage.
    auto land = [&](int st_i) {
        if constexpr (FP8) {
            const float sc = (st_i & 4) ? a.v_scale : a.k_scale;
            const int nch = (st_i & 4) ? CHV / 2 : CH / 2;
            bf16_t* dst = stage + (st_i & 1) * STAGE;
            for (int i = 0; i < RAW; ++i) {
                const int e = lane + 32 * i, key = e / nch, ch = e % nch;
                if (key >= PAT_SUB) continue;
                const u32 w[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
                u32 h[8];
                for (int k = 0; k < 8; ++k) {
                    const u32 word = w[k >> 1], b0 = (word >> (16 * (k & 1))) & 0xffu, b1 = (word >> (16 * (k & 1) + 8)) & 0xffu;
                    h[k] = pat_pack(kv_load(KV{(unsigned char)b0}, sc), kv_load(KV{(unsigned char)b1}, sc));
                }
                uint4* d4 = (uint4*)(dst + key * PITCH + ch * 16);
                d4[0] = uint4{h[0], h[1], h[2], h[3]};
                d4[1] = uint4{h[4], h[5], h[6], h[7]};
            }
        }
    };

    float o[NT][4], S[8][4], m[2], l[2], macc[2], lacc[2];
    u32 P[4][4];  // the tile's p rounded to bf16, as the PV mma's A fragments (sub-tile k)
    for (int i = 0; i < NT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    m[0] = m[1] = macc[0] = macc[1] = neg_inf_f32();
    l[0] = l[1] = lacc[0] = lacc[1] = 0.0f;
    const int ntiles = (kend - k_begin + PAT_TILE - 1) / PAT_TILE, nstages = ntiles * 8;
    issue(0, 0);
    land(0);
    // Eight stages a tile, unrolled, so every fragment index below is a constant (registers,
    // not local memory).
    for (int tile = 0; tile < ntiles; ++tile)
#pragma unroll
    for (int st = 0; st < 8; ++st) {
        const int s = tile * 8 + st;
        if (s + 1 < nstages) {
            issue(tile + (st + 1) / 8, (st + 1) % 8);
#if TANDEM_PAT_BREAK != 2
            cp_async_wait<1>();
#endif
        } else {
            cp_async_wait<0>();
        }
        __syncwarp();
        const bf16_t* src = stage + (st & 1) * STAGE;
        const int k0 = k_begin + tile * PAT_TILE, sub = st & 3;
        const int j = lane >> 3, r8 = lane & 7;
        if (!(st & 4)) {
            // K stage: 16 keys of s = q . k (two n8 tiles), dims in ascending k16 steps.
            float* s0 = S[2 * sub];
            float* s1 = S[2 * sub + 1];
            for (int i = 0; i < 4; ++i) s0[i] = s1[i] = 0.0f;
            for (int ks = 0; ks < KS; ++ks) {
                u32 b[4];
                ldmatrix_x4(b, src + ((j >> 1) * 8 + r8) * PITCH + ks * 16 + (j & 1) * 8);
                const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
                if constexpr (QS) pat_load_q<D>(qa[0], stage + 2 * STAGE, ks, lane);
                mma_16816(bf16_t{}, S[2 * sub], qa[QS ? 0 : ks], b0);
                mma_16816(bf16_t{}, S[2 * sub + 1], qa[QS ? 0 : ks], b1);
            }
            for (int n2 = 0; n2 < 2; ++n2)
                for (int i = 0; i < 4; ++i) {
                    const int kk = n2 * 8 + 2 * c + (i & 1), key = k0 + sub * PAT_SUB + kk;
                    float& v = S[2 * sub + n2][i];
                    v = key >= ctx[i >> 1] || key < lo(i >> 1) ? neg_inf_f32() : ((bad_keys[st & 1] >> kk) & 1u) ? nan_f32() : v * a.scale_log2;
                }
            if (sub == 3) {
                // The tile's online-softmax step, per row (this thread's rows g and g + 8).
                // A tile before the row's base (a chunk job under a window) leaves it as it is.
                for (int rr = 0; rr < 2; ++rr) {
                    const bool before = k0 < base(rr);
                    float mx = neg_inf_f32();
                    for (int n = 0; n < 8; ++n) mx = fmaxf(mx, fmaxf(S[n][2 * rr], S[n][2 * rr + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float mn = before ? m[rr] : fmaxf(m[rr], mx), alpha = before ? 1.0f : exp2f(m[rr] - mn);
                    float rs = 0.0f;
                    for (int n = 0; n < 8; ++n)
                        for (int e = 2 * rr; e < 2 * rr + 2; ++e) {
                            S[n][e] = before ? 0.0f : exp2f(S[n][e] - mn);
                            rs += S[n][e];
                        }
                    rs += __shfl_xor_sync(0xffffffffu, rs, 1);
                    rs += __shfl_xor_sync(0xffffffffu, rs, 2);
                    l[rr] = before ? l[rr] : fmaf(l[rr], alpha, rs);
                    m[rr] = mn;
                    for (int n = 0; n < NT; ++n) {
                        o[n][2 * rr] *= alpha;
                        o[n][2 * rr + 1] *= alpha;
                    }
                }
                for (int k = 0; k < 4; ++k)
                    for (int i = 0; i < 4; ++i) P[k][i] = pat_pack(S[2 * k + (i >> 1)][2 * (i & 1)], S[2 * k + (i >> 1)][2 * (i & 1) + 1]);
            }
        } else {
            // V stage: o += bf16(p) . V over these 16 keys (one k16 step), two dim tiles per ldmatrix.
            const u32(&pa)[4] = P[sub];
            for (int np = 0; np < NT / 2; ++np) {
                u32 b[4];
                ldmatrix_x4_trans(b, src + ((j & 1) * 8 + r8) * PITCH + np * 16 + (j >> 1) * 8);
                const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
                mma_16816(bf16_t{}, o[2 * np], pa, b0);
                mma_16816(bf16_t{}, o[2 * np + 1], pa, b1);
            }
            if (sub == 3 && part < 0) {
                // A chunk job folds each row whose partition (or context) ends with this tile.
                for (int rr = 0; rr < 2; ++rr) {
                    if (ctx[rr] <= k0 || k0 < base(rr)) continue;  // this row ended, or has not begun
                    const bool last = ctx[rr] <= k0 + PAT_TILE;
                    if (!last && (k0 + PAT_TILE - base(rr)) % plen[rr] != 0) continue;
                    const bool first = k0 < base(rr) + plen[rr];
                    pat_chunk_fold<DV>(a, o, m, l, macc, lacc, orow, c, rr, first, last);
                }
            }
        }
        if (s + 1 < nstages) land((st + 1) % 8);  // the other buffer: stage s - 1's, done with
        __syncwarp();  // every lane is done with this buffer before stage s + 2 refills it
    }
    if (part < 0) return;

    // A split job: its partition's partial, then the fold by the token's last job to arrive.
    const int t = t0, cx = max(ctx[0], ctx[1]);
    const int ctx_t = __shfl_sync(0xffffffffu, cx, 0);
    const int span_t = ctx_t - pa_first_key(ctx_t, a.window) / PAT_TILE * PAT_TILE;
    const int parts = (span_t + pat_part_len(span_t) - 1) / pat_part_len(span_t);
    pat_split_end<DV, TANDEM_PAT_BREAK == 3, D / DV>(a, o, m, l, ctx, orow, c, lane, t, part, parts, h0, G, group, groups, dv0 / DV);
}

template <int D, typename KV = bf16_t>
__device__ __forceinline__ void paged_attention_tc_impl(const PatArgs& a) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    TANDEM_DYNAMIC_SMEM(smem_raw);
    const int warp = (int)threadIdx.x >> 5;
    bf16_t* stage = (bf16_t*)smem_raw + (size_t)warp * PatCfg<D>::WARP_ELEMS;
    const int H = a.num_heads, KVH = a.num_kv_heads;
    if (KVH < 1 || H % KVH != 0 || a.tw < 1) return;
    const int gqa = H / KVH, HG = (gqa + 15) / 16, groups = KVH * HG;
    if (a.tw * min(gqa, 16) > 16) return;  // the host keeps a chunk's rows within one mma tile
    // At d256 every job is two, one a half of the output dims (PatCfg): job groups vg = (head
    // group, half), counted as groups of their own (counters, partial rows).
    constexpr int HALVES = PatCfg<D>::HALVES, DV = PatCfg<D>::DV;
    const int vgroups = groups * HALVES;
    const long wid = (long)blockIdx.x * PAT_WARPS + warp;
    const int rest = a.num_tokens - a.n_split;
    const long chunk_jobs = (long)((rest + a.tw - 1) / a.tw) * vgroups;
    const long split_jobs = (long)a.n_split * vgroups * a.max_parts;
    if (wid < chunk_jobs) {
        const int chunk = (int)(wid / vgroups), vg = (int)(wid % vgroups), grp = vg / HALVES, kh = grp / HG, hg = grp % HG;
        const int G = min(16, gqa - hg * 16), h0 = kh * gqa + hg * 16;
        const int t_begin = a.n_split + chunk * a.tw, t_end = min(a.num_tokens, t_begin + a.tw);
        // One sequence at a time: the chunk may hold the end of one and the start of the next.
        for (int t0 = t_begin; t0 < t_end;) {
            int t1 = t0 + 1;
            while (t1 < t_end && a.token_seq[t1] == a.token_seq[t0]) ++t1;
            pat_job<D, DV, KV>(a, t0, t1 - t0, kh, h0, G, -1, vg, vgroups, stage, vg % HALVES * DV);
            t0 = t1;
        }
        return;
    }
    const long sj = wid - chunk_jobs;
    if (sj >= split_jobs) return;
    const int part = (int)(sj % a.max_parts), vg = (int)(sj / a.max_parts % vgroups), t = (int)(sj / a.max_parts / vgroups);
    const int grp = vg / HALVES, kh = grp / HG, hg = grp % HG;
    pat_job<D, DV, KV>(a, t, 1, kh, kh * gqa + hg * 16, min(16, gqa - hg * 16), part, vg, vgroups, stage, vg % HALVES * DV);
}

#define PAT_KERNEL(D)                                                                                                  \
    extern "C" __global__ void __launch_bounds__(PAT_WARPS * 32) paged_attention_tc_d##D(                             \
        const float* __restrict__ q, const bf16_t* __restrict__ k_cache, const bf16_t* __restrict__ v_cache,          \
        const u32* __restrict__ positions, const u32* __restrict__ token_seq, const u32* __restrict__ block_tables, \
        float* __restrict__ out, float* __restrict__ part_out, float* __restrict__ part_ml, u32* __restrict__ counters, \
        int num_tokens, int n_split, int num_heads, int num_kv_heads, int block_size, int num_blocks, int num_seqs,   \
        int max_blocks, int max_parts, int tw, float scale, int window) {                                              \
        const PatArgs a{q,         k_cache,    v_cache,    positions,  token_seq,  block_tables, out,                  \
                        part_out,  part_ml,    counters,   num_tokens, n_split,    num_heads,    num_kv_heads,         \
                        block_size, num_blocks, num_seqs,  max_blocks, max_parts,  tw,           scale * PAT_LOG2E,    \
                        window};                                                                                       \
        paged_attention_tc_impl<D>(a);                                                                                 \
    }
#if TANDEM_PA_KERNELS
PAT_KERNEL(64)
PAT_KERNEL(128)
PAT_KERNEL(256)
#endif

// ---------------------------------------------------------------------------------------------
// paged_attention_tc_deep_d{64,128} (TANDEM_CUDA_ATTENTION=tc_deep; `tc` above stays the
// default until a GPU measures both): the same per-row arithmetic as paged_attention_tc (steps
// 1-3 above, the same mma order, softmax step and fold, the same sliding `window`: partitions
// laid over the span from the first key rounded down to a tile, keys before it -inf), with
//   - partitions of patd_part_len(span) keys: at most PATD_SPLITS (32) of at least 64, so twice
//     tc's split count past 1024 keys (a function of the token's own span, never the batch;
//     up to a 1024-key span both give 64-key partitions, and then the same bits as tc);
//   - one warp a block (the grid is the job count: at batch 1 the jobs spread over every SM,
//     where tc's 4-warp blocks left three quarters of them idle);
//   - K and V of 16 keys in one cp.async stage, a ring of NS stages (8 at D 64, 6 at D 128:
//     one to two 64-key tiles ahead); stage s is buffer s % NS; a stage is refilled right after
//     its V step. Every stage issued commits a group (an empty one past the job's last tile),
//     so at the K step of a tile's stage `sub` exactly NS - 1 - sub newer groups may be pending;
//   - q staged once in shared memory (bf16, as tc rounds it) and read back as mma A fragments
//     by ldmatrix per k16 step: fewer registers than tc's q held in registers;
//   - block ids read 32 at a time into one register a lane (a window of the table, reloaded
//     when a stage's keys leave it: once per partition up to 32 blocks) instead of per stage.
// Chunk jobs cut their rows' contexts with patd_part_len too, so decode == prefill chunk holds
// within the variant (kernels/emu/attention_tc_test.h runs the variant through every check).
// Shared memory per block (patd_smem): NS x (K | V) x 16 x (D + 8) bf16, q 16 x (D + 8) bf16,
// NS u32 bad-key masks: 39,200 bytes at D 64, 56,600 at D 128 (over 48 KiB: the host opts in).
#ifndef TANDEM_PATD_BREAK
#define TANDEM_PATD_BREAK 0  // kernels/emu/attn_break_test.cpp: 1-5 break the variant on purpose
#endif
#define PATD_SPLITS 32

__device__ __forceinline__ int patd_part_len(int ctx) {
    int len = (ctx + PATD_SPLITS - 1) / PATD_SPLITS;
    len = (len + PAT_MIN_PART - 1) / PAT_MIN_PART * PAT_MIN_PART;
    return len < PAT_MIN_PART ? PAT_MIN_PART : len;
}

// cp.async.wait_group takes an immediate: n is a constant once the sub-stage loop unrolls, and
// the switch folds away.
__device__ __forceinline__ void patd_wait(int n) {
    switch (n) {
        case 8: cp_async_wait<8>(); break;
        case 7: cp_async_wait<7>(); break;
        case 6: cp_async_wait<6>(); break;
        case 5: cp_async_wait<5>(); break;
        case 4: cp_async_wait<4>(); break;
        case 3: cp_async_wait<3>(); break;
        case 2: cp_async_wait<2>(); break;
        case 1: cp_async_wait<1>(); break;
        default: cp_async_wait<0>(); break;
    }
}

template <int D>
struct PatdCfg {
    static constexpr int NS = D == 64 ? 8 : 6;  // ring stages of 16 keys (K and V)
    static constexpr int PITCH = D + 8, SUBS = PAT_SUB * PITCH;
    static constexpr int SMEM = (NS * 2 + 1) * SUBS * 2 + NS * 4;
};

template <int D>
__device__ __forceinline__ void patd_job(const PatArgs& a, int t0, int nt, int kh, int h0, int G, int part, int group, int groups,
                                         unsigned char* smem) {
    constexpr int NS = PatdCfg<D>::NS, PITCH = PatdCfg<D>::PITCH, SUBS = PatdCfg<D>::SUBS;
    constexpr int KS = D / 16, NT = D / 8, CH = D / 8;
    bf16_t* stage = (bf16_t*)smem;
    bf16_t* q_s = stage + NS * 2 * SUBS;
    u32* bad_s = (u32*)(q_s + SUBS);
    const int lane = (int)threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int H = a.num_heads;
    const u32 seq = a.token_seq[t0];
    const bool seq_bad = seq >= (u32)a.num_seqs;
    int ctx[2], plen[2];
    bool bad[2];
    size_t orow[2];
    for (int rr = 0; rr < 2; ++rr) {
        const int r = g + 8 * rr;
        const bool live = r < nt * G;
        const int t = t0 + (live ? r / G : 0), h = h0 + (live ? r % G : 0);
        orow[rr] = ((size_t)t * H + h) * D;
        const int cx = (int)min(a.positions[t], 0x7ffffffeu) + 1;
        const int base_r = pa_first_key(cx, a.window) / PAT_TILE * PAT_TILE;
#if TANDEM_PATD_BREAK == 4
        plen[rr] = patd_part_len((int)min(a.positions[t0], 0x7ffffffeu) + 1);  // the job's first token's, not the row's own
#else
        plen[rr] = patd_part_len(cx - base_r);
#endif
        bad[rr] = live && (seq_bad || cx > a.max_blocks * a.block_size || (part >= 0 && (cx - base_r + plen[rr] - 1) / plen[rr] > a.max_parts));
        ctx[rr] = live && !bad[rr] ? cx : 0;
    }
    // A row's first key: held at D 64, recomputed where used at D 128 (ptxas at sm_80 spills
    // the d64 kernel the other way round, and the d128 kernel this way).
    const int lo_a[2] = {pa_first_key(ctx[0], a.window), pa_first_key(ctx[1], a.window)};
    auto lo = [&](int rr) { return D == 64 ? lo_a[rr] : pa_first_key(ctx[rr], a.window); };
    auto base = [&](int rr) { return lo(rr) / PAT_TILE * PAT_TILE; };
    int kend = max(ctx[0], ctx[1]);
    for (int x = 1; x < 32; x <<= 1) kend = max(kend, __shfl_xor_sync(0xffffffffu, kend, x));
    int k_begin = 0;
    if (part >= 0) {
        const int pl = __shfl_sync(0xffffffffu, plen[0], 0);
        k_begin = __shfl_sync(0xffffffffu, base(0), 0) + part * pl;
        kend = min(kend, k_begin + pl);
    } else if (a.window > 0) {  // from the first tile any row sees
        k_begin = min(ctx[0] > 0 ? base(0) : 0x7fffffff, ctx[1] > 0 ? base(1) : 0x7fffffff);
        for (int x = 1; x < 32; x <<= 1) k_begin = min(k_begin, __shfl_xor_sync(0xffffffffu, k_begin, x));
    }
    if (part <= 0)
        for (int rr = 0; rr < 2; ++rr)
            if (bad[rr])
                for (int nt8 = 0; nt8 < NT; ++nt8) {
                    a.out[orow[rr] + nt8 * 8 + 2 * c] = nan_f32();
                    a.out[orow[rr] + nt8 * 8 + 2 * c + 1] = nan_f32();
                }
    if (k_begin >= kend) return;  // warp-uniform

    const u32* table = a.block_tables + (size_t)(seq_bad ? 0 : seq) * a.max_blocks;
    const size_t slot_stride = (size_t)a.num_kv_heads * D, head_off = (size_t)kh * D;
    const int bs = a.block_size, last_blk = (kend - 1) / bs;
    const int ntiles = (kend - k_begin + PAT_TILE - 1) / PAT_TILE;
    int wb = -PAT_SUB - 32;  // the table window: lane i holds block wb + i (none loaded yet)
    u32 win = 0u;
    // Stage s (16 keys from k_begin + 16 s, K and V) into buffer s % NS; past the job's last
    // tile only the (empty) group is committed.
    auto issue = [&](int s) {
        if (s < ntiles * 4) {
            bf16_t* dst = stage + (s % NS) * 2 * SUBS;
            const int key0 = k_begin + s * PAT_SUB;
            int slot = -1;  // -1: past the job's keys (zero-filled); -2: a bad block id
            if (key0 < kend) {
                const int b_lo = key0 / bs, b_hi = min(key0 + PAT_SUB - 1, kend - 1) / bs;
                if (b_lo < wb || b_hi >= wb + 32) {
                    wb = b_lo;
                    win = wb + lane <= last_blk ? table[wb + lane] : 0u;
                }
                const int pos = key0 + (lane & (PAT_SUB - 1));
                const u32 blk = __shfl_sync(0xffffffffu, win, min(pos / bs - wb, 31));
                if (lane < PAT_SUB && pos < kend) slot = blk < (u32)a.num_blocks ? (int)blk * bs + pos % bs : -2;
            }
            const u32 badm = __ballot_sync(0xffffffffu, slot == -2);
            if (lane == 0) bad_s[s % NS] = badm;
            for (int e = lane; e < PAT_SUB * CH; e += 32) {
                const int key = e / CH, ch = e % CH;
                const int sl = __shfl_sync(0xffffffffu, slot, key);
                const size_t off = sl >= 0 ? (size_t)sl * slot_stride + head_off + ch * 8 : 0;
                cp_async_cg16(dst + key * PITCH + ch * 8, a.k_cache + off, sl >= 0 ? 16 : 0);
                cp_async_cg16(dst + SUBS + key * PITCH + ch * 8, a.v_cache + off, sl >= 0 ? 16 : 0);
            }
        }
        cp_async_commit();
    };
    for (int s = 0; s < NS; ++s) issue(s);

    // q rounded to bf16 (zero for a row with no keys), staged once: this lane's rows g, g + 8.
    for (int rr = 0; rr < 2; ++rr)
        for (int n = 0; n < NT; ++n) {
            const int col = n * 8 + 2 * c;
            const u32 v = ctx[rr] > 0 ? pat_pack(a.q[orow[rr] + col], a.q[orow[rr] + col + 1]) : 0u;
            *(u32*)(q_s + (g + 8 * rr) * PITCH + col) = v;
        }
    __syncwarp();

    float o[NT][4], S[8][4], m[2], l[2], macc[2], lacc[2];
    for (int i = 0; i < NT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    m[0] = m[1] = macc[0] = macc[1] = neg_inf_f32();
    l[0] = l[1] = lacc[0] = lacc[1] = 0.0f;
    const int j = lane >> 3, r8 = lane & 7;
    for (int tile = 0; tile < ntiles; ++tile) {
        const int k0 = k_begin + tile * PAT_TILE;
#pragma unroll
        for (int sub = 0; sub < 4; ++sub) {
            // Stage 4 tile + sub is group 4 tile + sub; NS + 4 tile groups are committed.
#if TANDEM_PATD_BREAK == 1
            patd_wait(NS - sub);  // one stage short of the depth
#else
            patd_wait(NS - 1 - sub);
#endif
            __syncwarp();
#if TANDEM_PATD_BREAK == 2
            const int buf = (tile * 4 + sub + 1) % NS;  // the wrong stage
#else
            const int buf = (tile * 4 + sub) % NS;
#endif
            const bf16_t* src = stage + buf * 2 * SUBS;
            const u32 badm = bad_s[buf];
            float* s0 = S[2 * sub];
            float* s1 = S[2 * sub + 1];
            for (int i = 0; i < 4; ++i) s0[i] = s1[i] = 0.0f;
            for (int ks = 0; ks < KS; ++ks) {
                u32 qa[4], b[4];
                ldmatrix_x4(qa, q_s + (lane & 15) * PITCH + ks * 16 + (lane >> 4) * 8);
                ldmatrix_x4(b, src + ((j >> 1) * 8 + r8) * PITCH + ks * 16 + (j & 1) * 8);
                const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
                mma_16816(bf16_t{}, S[2 * sub], qa, b0);
                mma_16816(bf16_t{}, S[2 * sub + 1], qa, b1);
            }
            for (int n2 = 0; n2 < 2; ++n2)
                for (int i = 0; i < 4; ++i) {
                    const int kk = n2 * 8 + 2 * c + (i & 1), key = k0 + sub * PAT_SUB + kk;
                    float& v = S[2 * sub + n2][i];
#if TANDEM_PATD_BREAK == 5
                    v = key >= ctx[i >> 1] ? neg_inf_f32() : ((badm >> kk) & 1u) ? nan_f32() : v * a.scale_log2;  // keys before lo kept
#else
                    v = key >= ctx[i >> 1] || key < lo(i >> 1) ? neg_inf_f32() : ((badm >> kk) & 1u) ? nan_f32() : v * a.scale_log2;
#endif
                }
        }
        // The tile's online-softmax step, per row (tc's, operation for operation). A tile
        // before the row's base (a chunk job under a window) leaves it as it is.
        for (int rr = 0; rr < 2; ++rr) {
            const bool before = k0 < base(rr);
            float mx = neg_inf_f32();
            for (int n = 0; n < 8; ++n) mx = fmaxf(mx, fmaxf(S[n][2 * rr], S[n][2 * rr + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = before ? m[rr] : fmaxf(m[rr], mx), alpha = before ? 1.0f : exp2f(m[rr] - mn);
            float rs = 0.0f;
            for (int n = 0; n < 8; ++n)
                for (int e = 2 * rr; e < 2 * rr + 2; ++e) {
                    S[n][e] = before ? 0.0f : exp2f(S[n][e] - mn);
                    rs += S[n][e];
                }
            rs += __shfl_xor_sync(0xffffffffu, rs, 1);
            rs += __shfl_xor_sync(0xffffffffu, rs, 2);
            l[rr] = before ? l[rr] : fmaf(l[rr], alpha, rs);
            m[rr] = mn;
            for (int n = 0; n < NT; ++n) {
                o[n][2 * rr] *= alpha;
                o[n][2 * rr + 1] *= alpha;
            }
        }
#pragma unroll
        for (int sub = 0; sub < 4; ++sub) {
#if TANDEM_PATD_BREAK == 2
            const int buf = (tile * 4 + sub + 1) % NS;
#else
            const int buf = (tile * 4 + sub) % NS;
#endif
            const bf16_t* src = stage + buf * 2 * SUBS + SUBS;
            const u32 pa[4] = {pat_pack(S[2 * sub][0], S[2 * sub][1]), pat_pack(S[2 * sub][2], S[2 * sub][3]),
                               pat_pack(S[2 * sub + 1][0], S[2 * sub + 1][1]), pat_pack(S[2 * sub + 1][2], S[2 * sub + 1][3])};
            for (int np = 0; np < NT / 2; ++np) {
                u32 b[4];
                ldmatrix_x4_trans(b, src + ((j & 1) * 8 + r8) * PITCH + np * 16 + (j >> 1) * 8);
                const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
                mma_16816(bf16_t{}, o[2 * np], pa, b0);
                mma_16816(bf16_t{}, o[2 * np + 1], pa, b1);
            }
            __syncwarp();  // every lane is done with this buffer before it is refilled
            issue(tile * 4 + sub + NS);
        }
        if (part < 0) {
            // A chunk job folds each row whose partition (or context) ends with this tile.
            for (int rr = 0; rr < 2; ++rr) {
                if (ctx[rr] <= k0 || k0 < base(rr)) continue;  // this row ended, or has not begun
                const bool last = ctx[rr] <= k0 + PAT_TILE;
                if (!last && (k0 + PAT_TILE - base(rr)) % plen[rr] != 0) continue;
                const bool first = k0 < base(rr) + plen[rr];
                pat_chunk_fold<D>(a, o, m, l, macc, lacc, orow, c, rr, first, last);
            }
        }
    }
    cp_async_wait<0>();  // only empty groups are left; nothing in flight when the warp moves on
    __syncwarp();
    if (part < 0) return;

    // A split job: its partition's partial, then the fold by the token's last job to arrive.
    const int t = t0, cx = max(ctx[0], ctx[1]);
    const int ctx_t = __shfl_sync(0xffffffffu, cx, 0);
    const int span_t = ctx_t - pa_first_key(ctx_t, a.window) / PAT_TILE * PAT_TILE;
    const int parts = (span_t + patd_part_len(span_t) - 1) / patd_part_len(span_t);
    pat_split_end<D, TANDEM_PATD_BREAK == 3>(a, o, m, l, ctx, orow, c, lane, t, part, parts, h0, G, group, groups);
}

// One warp a block: block b is job b (chunk jobs first, then split jobs, as in tc).
template <int D>
__device__ __forceinline__ void paged_attention_tc_deep_impl(const PatArgs& a) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    TANDEM_DYNAMIC_SMEM(smem_raw);
    const int H = a.num_heads, KVH = a.num_kv_heads;
    if (KVH < 1 || H % KVH != 0 || a.tw < 1) return;
    const int gqa = H / KVH, HG = (gqa + 15) / 16, groups = KVH * HG;
    if (a.tw * min(gqa, 16) > 16) return;
    const long wid = (long)blockIdx.x;
    const int rest = a.num_tokens - a.n_split;
    const long chunk_jobs = (long)((rest + a.tw - 1) / a.tw) * groups;
    const long split_jobs = (long)a.n_split * groups * a.max_parts;
    if (wid < chunk_jobs) {
        const int chunk = (int)(wid / groups), grp = (int)(wid % groups), kh = grp / HG, hg = grp % HG;
        const int G = min(16, gqa - hg * 16), h0 = kh * gqa + hg * 16;
        const int t_begin = a.n_split + chunk * a.tw, t_end = min(a.num_tokens, t_begin + a.tw);
        for (int t0 = t_begin; t0 < t_end;) {
            int t1 = t0 + 1;
            while (t1 < t_end && a.token_seq[t1] == a.token_seq[t0]) ++t1;
            patd_job<D>(a, t0, t1 - t0, kh, h0, G, -1, grp, groups, smem_raw);
            t0 = t1;
        }
        return;
    }
    const long sj = wid - chunk_jobs;
    if (sj >= split_jobs) return;
    const int part = (int)(sj % a.max_parts), grp = (int)(sj / a.max_parts % groups), t = (int)(sj / a.max_parts / groups);
    const int kh = grp / HG, hg = grp % HG;
    patd_job<D>(a, t, 1, kh, kh * gqa + hg * 16, min(16, gqa - hg * 16), part, grp, groups, smem_raw);
}

#define PATD_KERNEL(D)                                                                                                 \
    extern "C" __global__ void __launch_bounds__(32) paged_attention_tc_deep_d##D(                                    \
        const float* __restrict__ q, const bf16_t* __restrict__ k_cache, const bf16_t* __restrict__ v_cache,          \
        const u32* __restrict__ positions, const u32* __restrict__ token_seq, const u32* __restrict__ block_tables, \
        float* __restrict__ out, float* __restrict__ part_out, float* __restrict__ part_ml, u32* __restrict__ counters, \
        int num_tokens, int n_split, int num_heads, int num_kv_heads, int block_size, int num_blocks, int num_seqs,   \
        int max_blocks, int max_parts, int tw, float scale, int window) {                                              \
        const PatArgs a{q,         k_cache,    v_cache,    positions,  token_seq,  block_tables, out,                  \
                        part_out,  part_ml,    counters,   num_tokens, n_split,    num_heads,    num_kv_heads,         \
                        block_size, num_blocks, num_seqs,  max_blocks, max_parts,  tw,           scale * PAT_LOG2E,    \
                        window};                                                                                       \
        paged_attention_tc_deep_impl<D>(a);                                                                            \
    }
#if TANDEM_PA_KERNELS
PATD_KERNEL(64)
PATD_KERNEL(128)
#endif

// ---------------------------------------------------------------------------------------------
// paged_attention_tc_shared_d{64,128} (TANDEM_CUDA_ATTENTION=tc_shared; `tc` stays the default
// until a GPU measures both): tc's chunk jobs with their K/V tiles shared by a block. tc's
// chunk warps each fetch their own K/V through two 16-key stages, so the 4 warps of a block
// fetch the same tiles 4 times, latency-bound; here the PATS_WARPS warps of a chunk block
// serve consecutive tokens of ONE sequence and one KV-head group (warp w: the block's tokens
// w tw .. w tw + tw - 1, the same 16 mma rows a tc chunk job has), and each 64-key K and V tile
// is loaded once into shared memory for all of them through a ring of PatsCfg<D>::NS tile
// stages (cp.async; warp w issues the tile's keys 16 w .. 16 w + 15, K and V), FlashAttention-2
// style: per tile, wait for the tile's own group, one block barrier (every warp's part of the
// tile is in, and every warp is done with the stage the next issue refills), issue the tile
// NS - 1 ahead, compute.
// Per row the arithmetic is tc's, operation for operation (steps 1-3 above: the same 64-key
// tiles at absolute positions, q and p rounded to bf16, the same mma order, online-softmax
// step and partition folds; pat_part_len of the row's own span), so a token's bits equal tc's.
// The block walks the keys from the first tile any of its rows sees to the end of its longest
// context; the tiles outside a row's span are the no-ops tc's chunk jobs already run for the
// rows of a warp (before the row's base: state unchanged; past its context: its keys -inf,
// p = 0, and the row already folded into `out`). Keys past the block's last context are
// zero-filled. Split jobs (decodes) are tc's warp jobs (pat_job), 4 a block, after the chunk
// blocks. A block holds PATS_WARPS tw tokens (one sequence at a time when they span two); the
// chunk blocks run the step's last tokens first.
// Shared memory (PatsCfg<D>::SMEM): NS x (K | V) x 64 x (D + 8) bf16 + NS x 4 u32 bad-key masks +
// 8 ints: 3 stages at D 64 (55,376 bytes), 2 at D 128 (69,696): over 48 KiB, the host opts in.
#ifndef TANDEM_PATS_BREAK
#define TANDEM_PATS_BREAK 0  // kernels/emu/attn_break_test.cpp: 1-2 break the variant on purpose
#endif
#define PATS_WARPS 4

template <int D>
struct PatsCfg {
    static constexpr int NS = D == 64 ? 3 : 2;  // ring stages of one 64-key tile (K and V)
    static constexpr int PITCH = D + 8, TILE = PAT_TILE * PITCH;
    static constexpr int SMEM = NS * 2 * TILE * 2 + NS * 4 * 4 + 2 * PATS_WARPS * 4;
};

// The block's rows: tokens [t0, t1) of one sequence (at most PATS_WARPS * tw), heads h0.. h0 + G
// of kv head kh; warp w takes tokens t0 + w tw on. Every thread of the block calls it.
template <int D>
__device__ __forceinline__ void pats_job(const PatArgs& a, int t0, int t1, int kh, int h0, int G, unsigned char* smem) {
    constexpr int NS = PatsCfg<D>::NS, PITCH = PatsCfg<D>::PITCH, TILE = PatsCfg<D>::TILE;
    constexpr int KS = D / 16, NT = D / 8, CH = D / 8;
    bf16_t* ring = (bf16_t*)smem;  // stage s: K tile at ring + 2 s TILE, V tile after it
    u32* bad_s = (u32*)(ring + NS * 2 * TILE);  // [NS][4]: the bad-key mask of each 16-key sub-tile
    int* red = (int*)(bad_s + NS * 4);          // [2][PATS_WARPS]: each warp's first key and end
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int H = a.num_heads;
    const int w0 = t0 + warp * a.tw, nt = max(0, min(a.tw, t1 - w0));
    const u32 seq = a.token_seq[t0];
    const bool seq_bad = seq >= (u32)a.num_seqs;
    int ctx[2], plen[2];
    bool bad[2];
    size_t orow[2];
    for (int rr = 0; rr < 2; ++rr) {
        const int r = g + 8 * rr;
        const bool live = r < nt * G;
        const int t = live ? w0 + r / G : t0, h = h0 + (live ? r % G : 0);
        orow[rr] = ((size_t)t * H + h) * D;
        const int cx = (int)min(a.positions[t], 0x7ffffffeu) + 1;
        plen[rr] = pat_part_len(cx - pa_first_key(cx, a.window) / PAT_TILE * PAT_TILE);
        bad[rr] = live && (seq_bad || cx > a.max_blocks * a.block_size);
        ctx[rr] = live && !bad[rr] ? cx : 0;
    }
    auto lo = [&](int rr) { return pa_first_key(ctx[rr], a.window); };
    auto base = [&](int rr) { return lo(rr) / PAT_TILE * PAT_TILE; };
    for (int rr = 0; rr < 2; ++rr)
        if (bad[rr])
            for (int n = 0; n < NT; ++n) {
                a.out[orow[rr] + n * 8 + 2 * c] = nan_f32();
                a.out[orow[rr] + n * 8 + 2 * c + 1] = nan_f32();
            }
    // The block's keys: from the first tile any row sees to the end of the longest context.
    int kend = max(ctx[0], ctx[1]);
    int k_begin = a.window > 0 ? min(ctx[0] > 0 ? base(0) : 0x7fffffff, ctx[1] > 0 ? base(1) : 0x7fffffff) : 0;
    for (int x = 1; x < 32; x <<= 1) {
        kend = max(kend, __shfl_xor_sync(0xffffffffu, kend, x));
        k_begin = min(k_begin, __shfl_xor_sync(0xffffffffu, k_begin, x));
    }
    if (lane == 0) {
        red[warp] = k_begin;
        red[PATS_WARPS + warp] = kend;
    }
    __syncthreads();
    for (int w = 0; w < PATS_WARPS; ++w) {
        k_begin = min(k_begin, red[w]);
        kend = max(kend, red[PATS_WARPS + w]);
    }
    __syncthreads();  // every warp has read red before a next job writes it
    if (k_begin >= kend) return;  // block-uniform: none of the block's rows has a key

    // q rounded to bf16, as mma A fragments (tc's).
    u32 qa[KS][4];
    for (int ks = 0; ks < KS; ++ks)
        for (int i = 0; i < 4; ++i) {
            const int rr = i & 1, col = ks * 16 + 2 * c + 8 * (i >> 1);
            qa[ks][i] = ctx[rr] > 0 ? pat_pack(a.q[orow[rr] + col], a.q[orow[rr] + col + 1]) : 0u;
        }

    const u32* table = a.block_tables + (size_t)(seq_bad ? 0 : seq) * a.max_blocks;
    const size_t slot_stride = (size_t)a.num_kv_heads * D, head_off = (size_t)kh * D;
    const int ntiles = (kend - k_begin + PAT_TILE - 1) / PAT_TILE;
    // Tile `tile`'s keys 16 warp .. 16 warp + 15, K and V, into stage tile % NS; past the last
    // tile only the (empty) group is committed, so the wait below always counts NS - 2 newer.
    auto issue = [&](int tile) {
        if (tile < ntiles) {
            const int buf = tile % NS, key0 = k_begin + tile * PAT_TILE + warp * PAT_SUB;
            int slot = -1;  // -1: past the block's keys (zero-filled); -2: a bad block id
            if (lane < PAT_SUB) {
                const int pos = key0 + lane;
                if (pos < kend) {
                    const u32 blk = table[pos / a.block_size];
                    slot = blk < (u32)a.num_blocks ? (int)blk * a.block_size + pos % a.block_size : -2;
                }
            }
            const u32 badm = __ballot_sync(0xffffffffu, slot == -2);
            if (lane == 0) bad_s[buf * 4 + warp] = badm;
            bf16_t* kd = ring + buf * 2 * TILE + warp * PAT_SUB * PITCH;
            for (int e = lane; e < PAT_SUB * CH; e += 32) {
                const int key = e / CH, ch = e % CH;
                const int sl = __shfl_sync(0xffffffffu, slot, key);
                const size_t off = sl >= 0 ? (size_t)sl * slot_stride + head_off + ch * 8 : 0;
                cp_async_cg16(kd + key * PITCH + ch * 8, a.k_cache + off, sl >= 0 ? 16 : 0);
                cp_async_cg16(kd + TILE + key * PITCH + ch * 8, a.v_cache + off, sl >= 0 ? 16 : 0);
            }
        }
        cp_async_commit();
    };
    for (int s = 0; s < NS - 1; ++s) issue(s);

    float o[NT][4], S[8][4], m[2], l[2], macc[2], lacc[2];
    for (int i = 0; i < NT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    m[0] = m[1] = macc[0] = macc[1] = neg_inf_f32();
    l[0] = l[1] = lacc[0] = lacc[1] = 0.0f;
    const int j = lane >> 3, r8 = lane & 7;
    for (int tile = 0; tile < ntiles; ++tile) {
        cp_async_wait<NS - 2>();  // this thread's part of tile `tile`
#if TANDEM_PATS_BREAK != 1
        __syncthreads();  // every warp's part is in; every warp is done with tile - 1's stage
#endif
        issue(tile + NS - 1);
#if TANDEM_PATS_BREAK == 2
        const int buf = (tile + 1) % NS;  // the wrong stage
#else
        const int buf = tile % NS;
#endif
        const bf16_t* kt = ring + buf * 2 * TILE;
        const int k0 = k_begin + tile * PAT_TILE;
#pragma unroll
        for (int sub = 0; sub < 4; ++sub) {
            // 16 keys of s = q . k (two n8 tiles), dims in ascending k16 steps (tc's K stage).
            const bf16_t* src = kt + sub * PAT_SUB * PITCH;
            const u32 badm = bad_s[buf * 4 + sub];
            float* s0 = S[2 * sub];
            float* s1 = S[2 * sub + 1];
            for (int i = 0; i < 4; ++i) s0[i] = s1[i] = 0.0f;
            for (int ks = 0; ks < KS; ++ks) {
                u32 b[4];
                ldmatrix_x4(b, src + ((j >> 1) * 8 + r8) * PITCH + ks * 16 + (j & 1) * 8);
                const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
                mma_16816(bf16_t{}, S[2 * sub], qa[ks], b0);
                mma_16816(bf16_t{}, S[2 * sub + 1], qa[ks], b1);
            }
            for (int n2 = 0; n2 < 2; ++n2)
                for (int i = 0; i < 4; ++i) {
                    const int kk = n2 * 8 + 2 * c + (i & 1), key = k0 + sub * PAT_SUB + kk;
                    float& v = S[2 * sub + n2][i];
                    v = key >= ctx[i >> 1] || key < lo(i >> 1) ? neg_inf_f32() : ((badm >> kk) & 1u) ? nan_f32() : v * a.scale_log2;
                }
        }
        // The tile's online-softmax step, per row (tc's): a tile before the row's base leaves it.
        for (int rr = 0; rr < 2; ++rr) {
            const bool before = k0 < base(rr);
            float mx = neg_inf_f32();
            for (int n = 0; n < 8; ++n) mx = fmaxf(mx, fmaxf(S[n][2 * rr], S[n][2 * rr + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = before ? m[rr] : fmaxf(m[rr], mx), alpha = before ? 1.0f : exp2f(m[rr] - mn);
            float rs = 0.0f;
            for (int n = 0; n < 8; ++n)
                for (int e = 2 * rr; e < 2 * rr + 2; ++e) {
                    S[n][e] = before ? 0.0f : exp2f(S[n][e] - mn);
                    rs += S[n][e];
                }
            rs += __shfl_xor_sync(0xffffffffu, rs, 1);
            rs += __shfl_xor_sync(0xffffffffu, rs, 2);
            l[rr] = before ? l[rr] : fmaf(l[rr], alpha, rs);
            m[rr] = mn;
            for (int n = 0; n < NT; ++n) {
                o[n][2 * rr] *= alpha;
                o[n][2 * rr + 1] *= alpha;
            }
        }
#pragma unroll
        for (int sub = 0; sub < 4; ++sub) {
            // o += bf16(p) . V over these 16 keys (tc's V stage).
            const bf16_t* src = kt + TILE + sub * PAT_SUB * PITCH;
            const u32 pa[4] = {pat_pack(S[2 * sub][0], S[2 * sub][1]), pat_pack(S[2 * sub][2], S[2 * sub][3]),
                               pat_pack(S[2 * sub + 1][0], S[2 * sub + 1][1]), pat_pack(S[2 * sub + 1][2], S[2 * sub + 1][3])};
            for (int np = 0; np < NT / 2; ++np) {
                u32 b[4];
                ldmatrix_x4_trans(b, src + ((j & 1) * 8 + r8) * PITCH + np * 16 + (j >> 1) * 8);
                const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
                mma_16816(bf16_t{}, o[2 * np], pa, b0);
                mma_16816(bf16_t{}, o[2 * np + 1], pa, b1);
            }
        }
        // Each row whose partition (or context) ends with this tile folds (tc's conditions).
        for (int rr = 0; rr < 2; ++rr) {
            if (ctx[rr] <= k0 || k0 < base(rr)) continue;
            const bool last = ctx[rr] <= k0 + PAT_TILE;
            if (!last && (k0 + PAT_TILE - base(rr)) % plen[rr] != 0) continue;
            const bool first = k0 < base(rr) + plen[rr];
            pat_chunk_fold<D>(a, o, m, l, macc, lacc, orow, c, rr, first, last);
        }
    }
    cp_async_wait<0>();  // only empty groups are left
    __syncthreads();     // every warp is done with the ring before a next job's issues refill it
}

// Chunk blocks first (PATS_WARPS tw tokens and one KV-head group each), then split blocks of
// PAT_WARPS of tc's split jobs each (stage areas as tc's, inside the same dynamic memory).
template <int D>
__device__ __forceinline__ void paged_attention_tc_shared_impl(const PatArgs& a) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    TANDEM_DYNAMIC_SMEM(smem_raw);
    const int warp = (int)threadIdx.x >> 5;
    const int H = a.num_heads, KVH = a.num_kv_heads;
    if (KVH < 1 || H % KVH != 0 || a.tw < 1) return;
    const int gqa = H / KVH, HG = (gqa + 15) / 16, groups = KVH * HG;
    if (a.tw * min(gqa, 16) > 16) return;
    const int rest = a.num_tokens - a.n_split, bt = PATS_WARPS * a.tw;
    const long chunk_blocks = (long)((rest + bt - 1) / bt) * groups;
    const long b = (long)blockIdx.x;
    if (b < chunk_blocks) {
        // The last chunk first: a prompt's last tokens have the longest contexts, so the
        // longest blocks start first (which block serves which tokens changes no bit).
        const int chunk = (int)((chunk_blocks - 1 - b) / groups), grp = (int)(b % groups), kh = grp / HG, hg = grp % HG;
        const int G = min(16, gqa - hg * 16), h0 = kh * gqa + hg * 16;
        const int t_begin = a.n_split + chunk * bt, t_end = min(a.num_tokens, t_begin + bt);
        for (int t0 = t_begin; t0 < t_end;) {
            int t1 = t0 + 1;
            while (t1 < t_end && a.token_seq[t1] == a.token_seq[t0]) ++t1;
            pats_job<D>(a, t0, t1, kh, h0, G, smem_raw);
            t0 = t1;
        }
        return;
    }
    const long sj = (b - chunk_blocks) * PAT_WARPS + warp;
    if (sj >= (long)a.n_split * groups * a.max_parts) return;
    const int part = (int)(sj % a.max_parts), grp = (int)(sj / a.max_parts % groups), t = (int)(sj / a.max_parts / groups);
    const int kh = grp / HG, hg = grp % HG;
    bf16_t* stage = (bf16_t*)smem_raw + (size_t)warp * 2 * PAT_SUB * (D + 8);
    pat_job<D>(a, t, 1, kh, kh * gqa + hg * 16, min(16, gqa - hg * 16), part, grp, groups, stage);
}

#define PATS_KERNEL(D)                                                                                                 \
    extern "C" __global__ void __launch_bounds__(PATS_WARPS * 32) paged_attention_tc_shared_d##D(                     \
        const float* __restrict__ q, const bf16_t* __restrict__ k_cache, const bf16_t* __restrict__ v_cache,          \
        const u32* __restrict__ positions, const u32* __restrict__ token_seq, const u32* __restrict__ block_tables, \
        float* __restrict__ out, float* __restrict__ part_out, float* __restrict__ part_ml, u32* __restrict__ counters, \
        int num_tokens, int n_split, int num_heads, int num_kv_heads, int block_size, int num_blocks, int num_seqs,   \
        int max_blocks, int max_parts, int tw, float scale, int window) {                                              \
        const PatArgs a{q,         k_cache,    v_cache,    positions,  token_seq,  block_tables, out,                  \
                        part_out,  part_ml,    counters,   num_tokens, n_split,    num_heads,    num_kv_heads,         \
                        block_size, num_blocks, num_seqs,  max_blocks, max_parts,  tw,           scale * PAT_LOG2E,    \
                        window};                                                                                       \
        paged_attention_tc_shared_impl<D>(a);                                                                          \
    }
#if TANDEM_PA_KERNELS
PATS_KERNEL(64)
PATS_KERNEL(128)
#endif
#endif  // TANDEM_PAGED_ATTENTION_CU
