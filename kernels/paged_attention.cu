// paged_attention.cu — attention of a flattened batch of query tokens over the paged KV cache.
//
//   For query token t (sequence s = token_seq[t], position p = positions[t]) and head h
//   (kv head kh = h / (num_heads / num_kv_heads), the GQA grouping of HF's repeat_kv):
//     score[j] = scale * dot(q[t, h, :], K[slot(s, j), kh, :])      for j in 0..=p
//     out[t, h, :] = sum_j softmax(score)[j] * V[slot(s, j), kh, :]
//   slot(s, j) = block_tables[s, j / block_size] * block_size + j % block_size
//   q, out f32 [T, H, D]; caches [num_blocks, block_size, KVH, D] of f32 or bf16 (kv_write.cu);
//   positions, token_seq u32 [T]; block_tables u32 [num_seqs, max_blocks]. D <= 256.
//
// The cache's element type is a template parameter (paged_attention_partial_f32 / _bf16):
// each K/V element is widened to f32 in registers as it is loaded (exact), so over a bf16 cache
// the kernel does the same f32 arithmetic, in the same order, on the rounded values; the
// combine reads only f32 partials and serves both.
//
// Decode tokens and prefill chunks (with or without a cached prefix) are the same thing: each
// token sees its own causal context, whose K/V kv_write has already stored.
//
// Split along the context (flash-decoding): the context is cut into partitions whose length
// is a function of the token's own context alone (pa_part_len: at most 16 partitions of at
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
// and `paged_attention_prefill` (GQA 1/3/4, head_dim 64/128, block 16/32, contexts mid-block,
// longer than PART).
#include "common.cuh"

#define PA_THREADS 128    // threads per query head (one group)
#define PA_MAX_PACK 4     // query heads of one GQA group per block
#define PA_PART 512       // the longest partition (the shared score arrays)
#define PA_MIN_PART 64    // the shortest
#define PA_MAX_SPLITS 16  // partitions of a context up to PA_MAX_SPLITS * PA_PART keys
#define PA_MAX_D 256

// Keys per partition for a token whose context is ctx keys (the host bounds the partition
// count with the same constants: crates/cuda/src/backend.rs, pa_max_parts).
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
    float scale) {
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
    const int plen = pa_part_len(ctx);
    const bool bad = seq >= (u32)num_seqs || D > PA_MAX_D || D < 1 || num_kv_heads < 1 ||
                     num_heads % num_kv_heads != 0 || ctx > max_blocks * block_size ||
                     (ctx + plen - 1) / plen > max_parts;
    const size_t row = (size_t)t * num_heads + h;  // (t, h) in [T, H]
    if (bad) {
        // One block per bad token writes its NaN row (the emulator's two-launch oracle leaves
        // it to the combine kernel).
        if (part == 0 && (max_parts == 1 || counters))
            for (int d = tid; d < D && d < PA_MAX_D; d += PA_THREADS) out[row * D + d] = nan_f32();
        return;
    }
    const int start = part * plen;
    if (start >= ctx) return;  // this token's context ends before this partition
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
            for (int d = lane; d < D; d += 32) dot = fmaf(q_s[d], to_f32(kp[d]), dot);
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
                const float vv = slot >= 0 ? to_f32(v_cache[(size_t)slot * slot_stride + head_off + d]) : nan_f32();
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
                const float vv = slot >= 0 ? to_f32(v_cache[(size_t)slot * slot_stride + head_off + d]) : nan_f32();
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
    const int parts = (ctx + plen - 1) / plen;
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

#define PA_PARTIAL(NAME, KV)                                                                                         \
    extern "C" __global__ void __launch_bounds__(PA_THREADS * PA_MAX_PACK) paged_attention_partial_##NAME(           \
        const float* __restrict__ q, const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,                 \
        const u32* __restrict__ positions, const u32* __restrict__ token_seq, const u32* __restrict__ block_tables, \
        float* __restrict__ out, float* __restrict__ part_out, float* __restrict__ part_ml, u32* __restrict__ counters, \
        int num_tokens, int num_heads, int num_kv_heads, int head_dim, int block_size, int num_blocks, int num_seqs,   \
        int max_blocks, int max_parts, float scale) {                                                                  \
        paged_attention_partial_impl<KV>(q, k_cache, v_cache, positions, token_seq, block_tables, out, part_out,     \
                                         part_ml, counters, num_tokens, num_heads, num_kv_heads, head_dim, block_size,         \
                                         num_blocks, num_seqs, max_blocks, max_parts, scale);                        \
    }
PA_PARTIAL(f32, float)
PA_PARTIAL(bf16, bf16_t)

#ifdef TANDEM_HOST_EMU
// The former second launch, kept as the emulator's oracle for the in-kernel combine.
extern "C" __global__ void __launch_bounds__(PA_THREADS)
paged_attention_combine(const float* __restrict__ part_out, const float* __restrict__ part_ml,
                        const u32* __restrict__ positions, const u32* __restrict__ token_seq,
                        float* __restrict__ out, int num_tokens, int num_heads, int num_kv_heads,
                        int head_dim, int block_size, int num_seqs, int max_blocks, int max_parts) {
    const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    if (t >= num_tokens || h >= num_heads) return;
    const int D = head_dim;
    const u32 seq = token_seq[t];
    const int ctx = (int)min(positions[t], 0x7ffffffeu) + 1;
    const int plen = pa_part_len(ctx);
    const int parts = (ctx + plen - 1) / plen;
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
