// sampling.cu — a token id per row of logits on the device: greedy, or temperature with top-k,
// min-p and top-p and one Philox4x32-10 draw, so that only ids travel back to the host.
//
//   out[r] = sample_row(logits[r, :], spec[r])   logits f32 [rows, vocab], specs u32 [rows, 8],
//                                                out u32 [rows]
//   sample_masked: the same with row r's forbidden tokens read as -inf (structured output), its
//   mask bits at mask_index[r] (-1: none), so only the constrained rows' masks are uploaded.
//   logit_edits: before either, row r's penalties, logit_bias and bans (`LogitEdit`s of
//   crates/core/src/sampling.rs) applied to the logits in place, the raw values kept;
//   logit_restore puts them back, and logprobs then gives the rows that ask their sampled
//   token's logprob and top-n from the raw logits (`logprobs_row`, bit for bit).
//
// The result is defined by `tandem_core::sampling::sample_row` (crates/core/src/sampling.rs),
// and this kernel computes it bit for bit: the same f32 operations in the same order. Hence:
//   - no library expf (its last bits differ from the host's): `smp_exp`, the host's exp_f32;
//   - every multiply and add through __fmul_rn / __fadd_rn, which NVRTC never contracts into
//     an FMA (the host has none either);
//   - no sort: thresholds by bisection over the logits' order-preserving u32 keys, masses as
//     sums in a fixed order (thread t adds indices t, t+256, ... in order; then a fixed tree).
// spec[r] = [inv_t, top_k, top_p, min_p, seed_lo, seed_hi, completion, token_index] (floats as
// bits; inv_t 0 means greedy). The draw: Philox4x32-10 of counter [token_index, completion, 0,
// 0] and key [seed_lo, seed_hi], top 24 bits of word 0 as a uniform in [0, 1).
// Launch: grid (rows), block SMP_THREADS (256, the host's SAMPLE_LANES); launch bounds ask for 4 blocks
// an SM (without the hint ptxas capped it at 32 registers and spilled). Work per row: one pass
// for the max, one for the draw; top-k and top-p add 32 passes each (bisection), recomputing
// the weights.
// Check: kernels/emu/run.sh (Philox answers, greedy rows) and crates/cuda/tests/sampling_emu.rs
// (the kernel against the host sampler, bitwise, on random rows and specs).
#include "common.cuh"

#define SMP_THREADS 256

// Plain round-to-nearest f32 arithmetic (host emulation: plain C++, which g++ does not
// contract without an FMA target).
#ifdef TANDEM_HOST_EMU
__device__ __forceinline__ float smp_mul(float a, float b) { return a * b; }
__device__ __forceinline__ float smp_add(float a, float b) { return a + b; }
__device__ __forceinline__ u32 smp_bits(float x) { u32 b; std::memcpy(&b, &x, 4); return b; }
__device__ __forceinline__ float smp_div(float a, float b) { return a / b; }
#else
__device__ __forceinline__ float smp_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float smp_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ u32 smp_bits(float x) { return __float_as_uint(x); }
__device__ __forceinline__ float smp_div(float a, float b) { return __fdiv_rn(a, b); }
#endif

// Philox4x32 with 10 rounds (Salmon et al., SC'11), in place on (c0, c1, c2, c3). Scalars, not
// an array: an array here went to local memory (ptxas reported a stack and spills).
__device__ __forceinline__ void philox4x32_10(u32& c0, u32& c1, u32& c2, u32& c3, u32 k0, u32 k1) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const unsigned long long p0 = (unsigned long long)0xD2511F53u * c0;
        const unsigned long long p1 = (unsigned long long)0xCD9E8D57u * c2;
        const u32 n0 = (u32)(p1 >> 32) ^ c1 ^ k0, n2 = (u32)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (u32)p1;
        c2 = n2;
        c3 = (u32)p0;
    }
}

// e^z for z <= 0: Cody-Waite by ln 2, degree-6 Taylor, 2^k from exponent bits; 0 under e^-87.
__device__ __forceinline__ float smp_exp(float z) {
    if (!(z > -87.0f)) return 0.0f;
    const float k = floorf(smp_add(smp_mul(z, __uint_as_float(0x3fb8aa3bu)), 0.5f));
    const float r = smp_add(smp_add(z, -smp_mul(k, __uint_as_float(0x3f317200u))), -smp_mul(k, __uint_as_float(0x35bfbe8eu)));
    float p = __uint_as_float(0x3ab60b61u);
    p = smp_add(smp_mul(p, r), __uint_as_float(0x3c088889u));
    p = smp_add(smp_mul(p, r), __uint_as_float(0x3d2aaaabu));
    p = smp_add(smp_mul(p, r), __uint_as_float(0x3e2aaaabu));
    p = smp_add(smp_mul(p, r), 0.5f);
    p = smp_add(smp_mul(p, r), 1.0f);
    p = smp_add(smp_mul(p, r), 1.0f);
    return smp_mul(p, __uint_as_float((u32)((int)k + 127) << 23));
}

// Order-preserving key of a float (NaN excluded by the callers).
__device__ __forceinline__ u32 smp_key(float x) {
    const u32 b = smp_bits(x);
    return (b >> 31) ? ~b : (b | 0x80000000u);
}

// The weight of logit x: e^((x - m) * inv_t), NaN weighs 0.
__device__ __forceinline__ float smp_weight(float x, float m, float inv_t) {
    return x != x ? 0.0f : smp_exp(smp_mul(smp_add(x, -m), inv_t));
}

// Block-wide sums in a fixed order (the host's `lanes`): every thread gets the total.
__device__ __forceinline__ float smp_tree_sum(float* sh, float v) {
    const int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int s = SMP_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] = smp_add(sh[t], sh[t + s]);
        __syncthreads();
    }
    const float r = sh[0];
    __syncthreads();
    return r;
}
__device__ __forceinline__ u32 smp_tree_count(u32* sh, u32 v) {
    const int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int s = SMP_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] += sh[t + s];
        __syncthreads();
    }
    const u32 r = sh[0];
    __syncthreads();
    return r;
}

// Logit j of a row as the sampler sees it: -inf where the row's mask (one bit a token; null:
// no mask) forbids it, which is what the host's `RowMasks::apply` writes before `sample_row`.
__device__ __forceinline__ float smp_ld(const float* row, const u32* mask, int j) {
    return (mask && !((mask[j >> 5] >> (j & 31)) & 1u)) ? neg_inf_f32() : row[j];
}

// The block's (v, idx) pairs folded by its fixed tree into sf[0] / si[0]; the caller syncs
// before it reuses sf and si.
__device__ __forceinline__ void smp_argmax_fold(float* sf, int* si, float v, int idx) {
    const int t = threadIdx.x;
    sf[t] = v;
    si[t] = idx;
    __syncthreads();
    for (int s = SMP_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) {
            float a = sf[t];
            int ai = si[t];
            argmax_combine(a, ai, sf[t + s], si[t + s]);
            sf[t] = a;
            si[t] = ai;
        }
        __syncthreads();
    }
}

// The row's argmax (as read through its mask) into sf[0] / si[0] (-1: every logit NaN), by
// the block's fixed tree; the caller syncs before it reuses sf and si.
__device__ __forceinline__ void smp_row_argmax(const float* row, const u32* mask, int vocab, float* sf, int* si) {
    const int t = threadIdx.x;
    float v = 0.0f;
    int idx = -1;
    for (int j = t; j < vocab; j += SMP_THREADS) argmax_combine(v, idx, smp_ld(row, mask, j), j);
    smp_argmax_fold(sf, si, v, idx);
}

// Lane l's kept mass, from shared floats or from the workspace's float bits.
__device__ __forceinline__ float smp_lane_mass(const float* lanes, int l) { return lanes[l]; }
__device__ __forceinline__ float smp_lane_mass(const u32* lanes, int l) { return __uint_as_float(lanes[l]); }

// The draw (thread 0 alone): lanes laid end to end (s_incl: their inclusive running sums), the
// first lane whose running mass passes u * total, u from Philox of the row's spec sp. Leaves
// *s_lane that lane, *s_walk 1 and *s_local the target left inside it; or, where rounding put
// the target at the very end, the last lane with weight and *s_walk 0.
template <typename L>
__device__ __forceinline__ void smp_draw_lane(const L* lanes, float* s_incl, const u32* sp, int* s_lane, int* s_walk, float* s_local) {
    float acc = 0.0f;
    for (int l = 0; l < SMP_THREADS; ++l) {
        acc = smp_add(acc, smp_lane_mass(lanes, l));
        s_incl[l] = acc;
    }
    u32 c0 = sp[7], c1 = sp[6], c2 = 0u, c3 = 0u;
    philox4x32_10(c0, c1, c2, c3, sp[4], sp[5]);
    const float u = smp_mul((float)(c0 >> 8), 1.0f / 16777216.0f);
    const float target = smp_mul(u, acc);
    int chosen = -1;
    for (int l = 0; l < SMP_THREADS && chosen < 0; ++l)
        if (s_incl[l] > target) chosen = l;
    if (chosen >= 0) {
        *s_lane = chosen;
        *s_walk = 1;
        *s_local = smp_add(target, chosen > 0 ? -s_incl[chosen - 1] : -0.0f);
    } else {  // rounding put the target at the very end: the last lane with weight
        int last = 0;
        for (int l = SMP_THREADS - 1; l >= 0; --l)
            if (smp_lane_mass(lanes, l) > 0.0f) { last = l; break; }
        *s_lane = last;
        *s_walk = 0;
        *s_local = 0.0f;
    }
}

__device__ __forceinline__ void sample_row_dev(const float* __restrict__ logits, const u32* __restrict__ specs, u32* __restrict__ out, int rows, int vocab, const u32* __restrict__ mask_bits, const int* __restrict__ mask_index, int mask_words) {
    __shared__ float sf[SMP_THREADS];
    __shared__ float s_incl[SMP_THREADS];
    __shared__ int si[SMP_THREADS];
    __shared__ u32 su[SMP_THREADS];
    __shared__ int s_lane, s_walk;
    __shared__ float s_local;
    const int r = blockIdx.x;
    if (r >= rows) return;
    const int t = threadIdx.x;
    const float* row = logits + (size_t)r * vocab;
    const u32* mask = (mask_index && mask_index[r] >= 0) ? mask_bits + (size_t)mask_index[r] * mask_words : nullptr;
    const u32* sp = specs + (size_t)r * 8;
    const float inv_t = __uint_as_float(sp[0]), top_p = __uint_as_float(sp[2]), min_p = __uint_as_float(sp[3]);
    const u32 top_k = sp[1];

    // The argmax, whose value is the largest logit that is not NaN.
    smp_row_argmax(row, mask, vocab, sf, si);
    const float m = sf[0];
    const u32 greedy = si[0] < 0 ? 0u : (u32)si[0];
    __syncthreads();
    // Greedy, or nothing finite to scale against (all NaN / -inf, or +inf): the argmax.
    if (inv_t == 0.0f || !(fabsf(m) <= 3.402823466e38f)) {
        if (t == 0) out[r] = greedy;
        return;
    }

    // top-k: the largest key with at least k valid logits at or above it (ties kept).
    u32 tau_k = 0;
    if (top_k > 0) {
        u32 valid = 0;
        for (int j = t; j < vocab; j += SMP_THREADS) valid += smp_ld(row, mask, j) == smp_ld(row, mask, j);
        valid = smp_tree_count(su, valid);
        if (top_k < valid) {
            for (int b = 31; b >= 0; --b) {
                const u32 c = tau_k | (1u << b);
                u32 n = 0;
                for (int j = t; j < vocab; j += SMP_THREADS) {
                    const float x = smp_ld(row, mask, j);
                    n += x == x && smp_key(x) >= c;
                }
                if (smp_tree_count(su, n) >= top_k) tau_k = c;
            }
        }
    }
    // The survivors of top-k and min-p (the best token weighs 1, so min-p is w >= min_p).
#define SMP_BASE(x, w) ((x) == (x) && smp_key(x) >= tau_k && (w) >= min_p)
    // top-p: the largest key whose tokens keep at least top_p of the survivors' mass.
    u32 tau_p = 0;
    if (top_p < 1.0f) {
        float acc = 0.0f;
        for (int j = t; j < vocab; j += SMP_THREADS) {
            const float x = smp_ld(row, mask, j), w = smp_weight(x, m, inv_t);
            if (SMP_BASE(x, w)) acc = smp_add(acc, w);
        }
        const float want = smp_mul(top_p, smp_tree_sum(sf, acc));
        for (int b = 31; b >= 0; --b) {
            const u32 c = tau_p | (1u << b);
            float a = 0.0f;
            for (int j = t; j < vocab; j += SMP_THREADS) {
                const float x = smp_ld(row, mask, j), w = smp_weight(x, m, inv_t);
                if (SMP_BASE(x, w) && smp_key(x) >= c) a = smp_add(a, w);
            }
            if (smp_tree_sum(sf, a) >= want) tau_p = c;
        }
    }
#define SMP_KEPT(x, w) (SMP_BASE(x, w) && smp_key(x) >= tau_p)

    // The draw: lanes laid end to end, the first token whose running weight passes u * total.
    float lane = 0.0f;
    for (int j = t; j < vocab; j += SMP_THREADS) {
        const float x = smp_ld(row, mask, j), w = smp_weight(x, m, inv_t);
        if (SMP_KEPT(x, w)) lane = smp_add(lane, w);
    }
    sf[t] = lane;
    __syncthreads();
    if (t == 0) smp_draw_lane(sf, s_incl, sp, &s_lane, &s_walk, &s_local);
    __syncthreads();
    if (t == s_lane) {
        int pick = -1, last = -1;
        float local = 0.0f;
        for (int j = t; j < vocab; j += SMP_THREADS) {
            const float x = smp_ld(row, mask, j), w = smp_weight(x, m, inv_t);
            if (!SMP_KEPT(x, w)) continue;
            if (w > 0.0f) last = j;
            if (s_walk) {
                local = smp_add(local, w);
                if (local > s_local) { pick = j; break; }
            }
        }
        out[r] = pick >= 0 ? (u32)pick : last >= 0 ? (u32)last : greedy;
    }
#undef SMP_KEPT
#undef SMP_BASE
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS, 4)
sample(const float* __restrict__ logits, const u32* __restrict__ specs, u32* __restrict__ out, int rows, int vocab) {
    sample_row_dev(logits, specs, out, rows, vocab, nullptr, nullptr, 0);
}

// As `sample`, row r masked by mask_bits[mask_index[r] * mask_words ..] when mask_index[r] >= 0
// (structured output: only the constrained rows carry a mask, ceil(vocab / 32) words each).
extern "C" __global__ void __launch_bounds__(SMP_THREADS, 4)
sample_masked(const float* __restrict__ logits, const u32* __restrict__ specs, u32* __restrict__ out, int rows, int vocab, const u32* __restrict__ mask_bits, const int* __restrict__ mask_index, int mask_words) {
    sample_row_dev(logits, specs, out, rows, vocab, mask_bits, mask_index, mask_words);
}

// Row r's edits, records start[r] .. start[r + 1] of EDIT_WORDS (5) words: token, flags (bit 0
// repetition, 1 subtract, 2 bias, 3 ban), then repetition, subtract and bias as f32 bits;
// applied in place, each step one rounded f32 operation, in `LogitEdit::apply`'s order. A row
// edits each token at most once (the host checks), so its threads never share a logit; a token
// past the vocabulary is skipped. Grid (rows), block SMP_THREADS.
// saved (null: not kept) gets each record's logit before its edit, for logit_restore.
extern "C" __global__ void __launch_bounds__(SMP_THREADS)
logit_edits(float* __restrict__ logits, const u32* __restrict__ start, const u32* __restrict__ words, float* __restrict__ saved, int rows, int vocab) {
    const int r = blockIdx.x;
    if (r >= rows) return;
    for (u32 i = start[r] + threadIdx.x; i < start[r + 1]; i += SMP_THREADS) {
        const u32* w = words + (size_t)i * 5;
        const u32 tok = w[0], flags = w[1];
        if (tok >= (u32)vocab) continue;
        float* p = logits + (size_t)r * vocab + tok;
        float x = *p;
        if (saved) saved[i] = x;
        if (flags & 1u) {
            const float rp = __uint_as_float(w[2]);
            x = x > 0.0f ? smp_div(x, rp) : smp_mul(x, rp);
        }
        if (flags & 2u) x = smp_add(x, -__uint_as_float(w[3]));
        if (flags & 4u) x = smp_add(x, __uint_as_float(w[4]));
        if (flags & 8u) x = neg_inf_f32();
        *p = x;
    }
}

// The raw logits back where logit_edits changed them (its records and saved values).
extern "C" __global__ void __launch_bounds__(SMP_THREADS)
logit_restore(float* __restrict__ logits, const u32* __restrict__ start, const u32* __restrict__ words, const float* __restrict__ saved, int rows, int vocab) {
    const int r = blockIdx.x;
    if (r >= rows) return;
    for (u32 i = start[r] + threadIdx.x; i < start[r + 1]; i += SMP_THREADS) {
        const u32 tok = words[(size_t)i * 5];
        if (tok < (u32)vocab) logits[(size_t)r * vocab + tok] = saved[i];
    }
}

// ln x for x >= 1: the host's ln_f32 (crates/core/src/sampling.rs), operation for operation.
__device__ __forceinline__ float smp_ln(float x) {
    const u32 bits = smp_bits(x);
    int e = (int)((bits >> 23) & 0xffu) - 127;
    float f = __uint_as_float((bits & 0x007fffffu) | 0x3f800000u);
    if (f > __uint_as_float(0x3fb504f3u)) {
        f = smp_mul(f, 0.5f);
        e += 1;
    }
    const float z = smp_div(smp_add(f, -1.0f), smp_add(f, 1.0f)), z2 = smp_mul(z, z);
    float p = __uint_as_float(0x3dba2e8cu);
    p = smp_add(smp_mul(p, z2), __uint_as_float(0x3de38e39u));
    p = smp_add(smp_mul(p, z2), __uint_as_float(0x3e124925u));
    p = smp_add(smp_mul(p, z2), __uint_as_float(0x3e4ccccdu));
    p = smp_add(smp_mul(p, z2), __uint_as_float(0x3eaaaaabu));
    p = smp_add(smp_mul(p, z2), 1.0f);
    const float ln_f = smp_mul(smp_add(z, z), p), ef = (float)e;
    return smp_add(smp_add(ln_f, smp_mul(ef, __uint_as_float(0x35bfbe8eu))), smp_mul(ef, __uint_as_float(0x3f317200u)));
}

// (v, i) before (w, j) in the top-n order: the larger logit, the lower index on ties; i < 0 is
// no candidate.
__device__ __forceinline__ bool smp_before(float v, int i, float w, int j) {
    return i >= 0 && (j < 0 || v > w || (v == w && i < j));
}

// Row r's logprobs where top_n[r] != 0xffffffff (top_n[r] <= SMP_MAX_TOP most likely tokens):
// the sampled token ids[r]'s logprob into lp[r], the top tokens into top_ids / top_lp [rows,
// SMP_MAX_TOP] (0xffffffff past the row's candidates), all from the raw logits. One pass for
// the max, one for the sum, and one per top token (each the best after the one before).
#define SMP_MAX_TOP 20
extern "C" __global__ void __launch_bounds__(SMP_THREADS)
logprobs(const float* __restrict__ logits, const u32* __restrict__ ids, const u32* __restrict__ top_n, float* __restrict__ lp,
         u32* __restrict__ top_ids, float* __restrict__ top_lp, int rows, int vocab) {
    __shared__ float sf[SMP_THREADS];
    __shared__ int si[SMP_THREADS];
    const int r = blockIdx.x, t = threadIdx.x;
    if (r >= rows || top_n[r] == 0xffffffffu) return;
    const float* row = logits + (size_t)r * vocab;
    smp_row_argmax(row, nullptr, vocab, sf, si);
    const float m = si[0] < 0 ? neg_inf_f32() : sf[0];
    __syncthreads();
    const bool finite = fabsf(m) <= 3.402823466e38f;
    float lane = 0.0f;
    for (int j = t; j < vocab; j += SMP_THREADS) lane = smp_add(lane, smp_weight(row[j], m, 1.0f));
    const float total = smp_tree_sum(sf, lane);
    const float ln_s = finite ? smp_ln(total) : nan_f32();
#define SMP_LP(x) (finite ? smp_add(smp_add((x), -m), -ln_s) : nan_f32())
    if (t == 0) lp[r] = ids[r] < (u32)vocab ? SMP_LP(row[ids[r]]) : nan_f32();
    const int n = min((int)top_n[r], SMP_MAX_TOP);
    float pv = 0.0f;
    int pi = -1;  // the previous pick: every candidate comes after it
    int k = 0;
    for (; k < n; ++k) {
        float bv = 0.0f;
        int bi = -1;
        for (int j = t; j < vocab; j += SMP_THREADS) {
            const float x = row[j];
            const bool after = pi < 0 || x < pv || (x == pv && j > pi);
            if (x == x && after && smp_before(x, j, bv, bi)) {
                bv = x;
                bi = j;
            }
        }
        sf[t] = bv;
        si[t] = bi;
        __syncthreads();
        for (int s = SMP_THREADS / 2; s > 0; s >>= 1) {
            if (t < s && smp_before(sf[t + s], si[t + s], sf[t], si[t])) {
                sf[t] = sf[t + s];
                si[t] = si[t + s];
            }
            __syncthreads();
        }
        const float cv = sf[0];
        const int ci = si[0];
        __syncthreads();
        if (ci < 0) break;  // no candidate left (uniform: every thread read the same)
        pv = cv;
        pi = ci;
        if (t == 0) {
            top_ids[(size_t)r * SMP_MAX_TOP + k] = (u32)pi;
            top_lp[(size_t)r * SMP_MAX_TOP + k] = SMP_LP(pv);
        }
    }
    if (t == 0)
        for (; k < SMP_MAX_TOP; ++k) {
            top_ids[(size_t)r * SMP_MAX_TOP + k] = 0xffffffffu;
            top_lp[(size_t)r * SMP_MAX_TOP + k] = nan_f32();
        }
#undef SMP_LP
}

// ---------------------------------------------------------------------------------------------
// sample_radix / sample_masked_radix (TANDEM_CUDA_SAMPLER=radix): the same ids as `sample` /
// `sample_masked` and `tandem_core::sampling::sample_row`, bit for bit, in far fewer passes
// over the row. The kept set is a function of the row alone (top-k's tau_k is the k-th largest
// key; top-p's tau_p the largest key c whose lane-ordered mass S(c) reaches want), so any
// search that lands on the same keys gives the same ids:
//   - tau_k by a radix select over the keys, 8 bits a pass (4 passes of a 256-bin count
//     histogram; integer counts, so shared atomics keep it exact);
//   - tau_p 4 bits a pass: S at the 15 candidates tau | d << shift (d = 1..15) in one pass, 15
//     lane sums a thread, each summed in exactly the host's `lanes` order; the largest d with
//     S >= want is what 4 bisection steps find (S is monotone: a subset summed in a fixed
//     order never rounds above the whole). 8 passes instead of 32, and tokens below the
//     bracket skip the exp;
//   - the draw as in `sample`, except that the chosen lane's walk computes its weights with
//     the whole block (into shared memory, 1024 a chunk) and one thread adds them in order.
// Per row: the argmax pass, 4 passes for top-k, 9 for top-p, 1 for the draw and the walk.
// Launch: as `sample` (grid rows, block SMP_THREADS).
#define SMP_PIVOTS 15
#ifndef SMP_WALK
#define SMP_WALK 1024
#endif

// The walk along the drawn lane *s_lane (indices s_lane + 256 i; *s_walk, *s_local as
// smp_draw_lane leaves them, *s_pick -1): the block computes a chunk of its kept weights
// (key >= tau, not NaN, weight >= min_p; 0 where not kept: adding +0 leaves the running sum
// as it is) into s_w, thread 0 adds them in order; the last positive kept weight is the
// fallback, greedy the one after. Thread 0 writes the row's id to *out.
__device__ __forceinline__ void smp_walk_lane(const float* row, const u32* mask, int vocab, u32 tau, float m, float inv_t, float min_p, u32 greedy, float* s_w, const int* s_lane, const int* s_walk, const float* s_local, int* s_pick, u32* out) {
    const int t = threadIdx.x;
    const int ln = *s_lane, n_lane = ln < vocab ? (vocab - 1 - ln) / SMP_THREADS + 1 : 0;
    float local = 0.0f;
    int last = -1;
    for (int c0 = 0; c0 < n_lane; c0 += SMP_WALK) {
        for (int i = t; i < SMP_WALK && c0 + i < n_lane; i += SMP_THREADS) {
            const int j = ln + (c0 + i) * SMP_THREADS;
            const float x = smp_ld(row, mask, j);
            float w = 0.0f;
            if (x == x && smp_key(x) >= tau) {
                w = smp_weight(x, m, inv_t);
                if (!(w >= min_p)) w = 0.0f;
            }
            s_w[i] = w;
        }
        __syncthreads();
        if (t == 0 && *s_pick < 0) {
            const int n = n_lane - c0 < SMP_WALK ? n_lane - c0 : SMP_WALK;
            for (int i = 0; i < n; ++i) {
                const float w = s_w[i];
                if (w > 0.0f) last = ln + (c0 + i) * SMP_THREADS;
                if (*s_walk) {
                    local = smp_add(local, w);
                    if (local > *s_local) { *s_pick = ln + (c0 + i) * SMP_THREADS; break; }
                }
            }
        }
        __syncthreads();
        if (*s_pick >= 0) break;
    }
    if (t == 0) *out = *s_pick >= 0 ? (u32)*s_pick : last >= 0 ? (u32)last : greedy;
}

__device__ __forceinline__ void sample_radix_row_dev(const float* __restrict__ logits, const u32* __restrict__ specs, u32* __restrict__ out, int rows, int vocab, const u32* __restrict__ mask_bits, const int* __restrict__ mask_index, int mask_words) {
    __shared__ float sf[SMP_THREADS];
    __shared__ int si[SMP_THREADS];
    __shared__ float s_piv[SMP_PIVOTS][SMP_THREADS];
    __shared__ u32 s_hist[256];
    __shared__ float s_w[SMP_WALK];
    __shared__ u32 s_sel, s_kk, s_valid;
    __shared__ int s_lane, s_walk, s_pick;
    __shared__ float s_local;
    const int r = blockIdx.x;
    if (r >= rows) return;
    const int t = threadIdx.x;
    const float* row = logits + (size_t)r * vocab;
    const u32* mask = (mask_index && mask_index[r] >= 0) ? mask_bits + (size_t)mask_index[r] * mask_words : nullptr;
    const u32* sp = specs + (size_t)r * 8;
    const float inv_t = __uint_as_float(sp[0]), top_p = __uint_as_float(sp[2]), min_p = __uint_as_float(sp[3]);
    const u32 top_k = sp[1];

    smp_row_argmax(row, mask, vocab, sf, si);
    const float m = sf[0];
    const u32 greedy = si[0] < 0 ? 0u : (u32)si[0];
    __syncthreads();
    if (inv_t == 0.0f || !(fabsf(m) <= 3.402823466e38f)) {
        if (t == 0) out[r] = greedy;
        return;
    }

    // top-k: the k-th largest key among the valid logits, 8 bits a pass, when k < valid.
    u32 tau_k = 0;
    if (top_k > 0) {
        u32 prefix = 0, pmask = 0;
        if (t == 0) s_kk = top_k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            s_hist[t] = 0u;
            __syncthreads();
            for (int j = t; j < vocab; j += SMP_THREADS) {
                const float x = smp_ld(row, mask, j);
                if (x != x) continue;
                const u32 kx = smp_key(x);
                if ((kx & pmask) == prefix) atomicAdd(&s_hist[(kx >> shift) & 255u], 1u);
            }
            __syncthreads();
            if (t == 0) {
                u32 kk = s_kk, cum = 0, sel = 0;
                if (shift == 24) {
                    u32 valid = 0;
                    for (int b = 0; b < 256; ++b) valid += s_hist[b];
                    s_valid = valid;
                }
                for (int b = 255; b >= 0; --b) {
                    if (cum + s_hist[b] >= kk) { sel = (u32)b; break; }
                    cum += s_hist[b];
                }
                s_sel = sel;
                s_kk = kk - cum;
            }
            __syncthreads();
            if (top_k >= s_valid) { prefix = 0; break; }  // no limit: every valid logit kept
            prefix |= s_sel << shift;
            pmask |= 255u << shift;
            __syncthreads();  // s_sel / s_kk / s_hist are rewritten by the next pass
        }
        tau_k = prefix;
    }
#define SMP_BASE(x, w) ((x) == (x) && smp_key(x) >= tau_k && (w) >= min_p)
    // top-p: the largest key c with S(c) >= want, 4 bits a pass (see above).
    u32 tau_p = 0;
    if (top_p < 1.0f) {
        float acc = 0.0f;
        for (int j = t; j < vocab; j += SMP_THREADS) {
            const float x = smp_ld(row, mask, j);
            if (x != x || smp_key(x) < tau_k) continue;
            const float w = smp_weight(x, m, inv_t);
            if (w >= min_p) acc = smp_add(acc, w);
        }
        const float want = smp_mul(top_p, smp_tree_sum(sf, acc));
        for (int shift = 28; shift >= 0; shift -= 4) {
            float a[SMP_PIVOTS];
#pragma unroll
            for (int d = 0; d < SMP_PIVOTS; ++d) a[d] = 0.0f;
            const u32 lo = tau_p | (1u << shift);  // the smallest candidate
            for (int j = t; j < vocab; j += SMP_THREADS) {
                const float x = smp_ld(row, mask, j);
                if (x != x) continue;
                const u32 kx = smp_key(x);
                if (kx < lo || kx < tau_k) continue;
                const float w = smp_weight(x, m, inv_t);
                if (!(w >= min_p)) continue;
                // Candidates passed: d + 1 <= the digit of kx above tau_p (all 15 when kx is
                // beyond this digit's range).
                const u32 above = kx - tau_p;
                const u32 dig = (above >> shift) > 15u ? 15u : (above >> shift);
#pragma unroll
                for (int d = 0; d < SMP_PIVOTS; ++d)
                    if ((u32)d < dig) a[d] = smp_add(a[d], w);
            }
#pragma unroll
            for (int d = 0; d < SMP_PIVOTS; ++d) s_piv[d][t] = a[d];
            __syncthreads();
            for (int s = SMP_THREADS / 2; s > 0; s >>= 1) {
                for (int q = t; q < SMP_PIVOTS * s; q += SMP_THREADS) {
                    const int d = q / s, i = q - d * s;
                    s_piv[d][i] = smp_add(s_piv[d][i], s_piv[d][i + s]);
                }
                __syncthreads();
            }
            u32 best = 0;
            for (int d = 0; d < SMP_PIVOTS; ++d)
                if (s_piv[d][0] >= want) best = (u32)d + 1;
            tau_p |= best << shift;
            __syncthreads();
        }
    }
#define SMP_KEPT(x, w) (SMP_BASE(x, w) && smp_key(x) >= tau_p)
    const u32 tau = tau_k > tau_p ? tau_k : tau_p;

    float lane = 0.0f;
    for (int j = t; j < vocab; j += SMP_THREADS) {
        const float x = smp_ld(row, mask, j);
        if (x != x || smp_key(x) < tau) continue;
        const float w = smp_weight(x, m, inv_t);
        if (w >= min_p) lane = smp_add(lane, w);
    }
    sf[t] = lane;
    __syncthreads();
    if (t == 0) {
        smp_draw_lane(sf, s_piv[0], sp, &s_lane, &s_walk, &s_local);
        s_pick = -1;
    }
    __syncthreads();
    // The walk along lane s_lane, by the whole block.
    smp_walk_lane(row, mask, vocab, tau, m, inv_t, min_p, greedy, s_w, &s_lane, &s_walk, &s_local, &s_pick, out + r);
#undef SMP_KEPT
#undef SMP_BASE
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS, 4)
sample_radix(const float* __restrict__ logits, const u32* __restrict__ specs, u32* __restrict__ out, int rows, int vocab) {
    sample_radix_row_dev(logits, specs, out, rows, vocab, nullptr, nullptr, 0);
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS, 4)
sample_masked_radix(const float* __restrict__ logits, const u32* __restrict__ specs, u32* __restrict__ out, int rows, int vocab, const u32* __restrict__ mask_bits, const int* __restrict__ mask_index, int mask_words) {
    sample_radix_row_dev(logits, specs, out, rows, vocab, mask_bits, mask_index, mask_words);
}

// ---------------------------------------------------------------------------------------------
// sample_mc_* (TANDEM_CUDA_SAMPLER=multi): the same ids as `sample` and
// `tandem_core::sampling::sample_row`, bit for bit, with SMC_CTAS (64) CTAs a row, so that a
// batch-1 step over a 128k-262k vocabulary is not one SM's latency. What fixes the order: the
// host's masses are lane sums (lane l adds indices l, l + 256, ... in order) folded by a tree
// (128 apart, 64 apart, ..., 1). CTA g of a row owns lanes g, g + 64, g + 128 and g + 192: it
// adds each of its lanes in order (one thread a lane and candidate), and the tree's first two
// levels (128 and 64 apart) join exactly those four lanes, so a CTA leaves one partial a
// candidate; the next kernel folds the 64 partials with the tree's last six levels. Integer
// counts (top-k) and the argmax are order-free. Five kernels, twelve launches a step, fixed
// shapes, no host sync (graph capture safe), each kernel reading what the launch before left:
//   sample_mc_max      grid (64, rows): per-CTA argmax partials; zeroes the top-k histograms.
//                      (It and sample_mc_topk, whose results are order-free, read contiguous
//                      slices; the mass passes read the CTA's four lanes.)
//   sample_mc_topk p   p = 0..3, grid (64, rows): p = 0 folds the argmax (m, greedy or not)
//                      into the row's state; then top-k's radix select, digit 8 bits a pass
//                      (shift 24 - 8p), each CTA's shared histogram added to the row's with
//                      integer atomics.
//   sample_mc_topp q   q = 0..5, grid (64, rows): q = 0 folds the four histograms into tau_k;
//                      top-p's threshold 6 key bits a pass (shifts 26, 20, 14, 8, 2; then 2
//                      bits at shift 0): the masses at 64 candidates tau | d << shift in one
//                      pass (each in the host's order), the largest d whose mass reaches want
//                      is what 6 bisection steps find (the mass is monotone in the key: a subset
//                      of non-negative weights added in a fixed order never rounds above the
//                      whole). Pass 0's candidate 0 is the whole mass, so want = top_p * it. The
//                      last pass (shift 0) leaves its 4 candidates' 256 lane sums whole, so the
//                      draw needs no extra pass; without top-p it computes tau 0's (the base).
//   sample_mc_draw     grid (rows): the last digit, then the draw and the chosen lane's walk
//                      as `sample_radix` does them.
// Each pass's decision is computed by every CTA alike from the partials (a fixed order, so
// the same bits); CTA 0 records it in the row's state for the passes after. Workspace: row r
// owns SMC_WORDS u32 words at ws + r * SMC_WORDS (crates/cuda reserves them with the rest).
// Without a mask the launcher passes mask_words 0 (the mask pointers are then not read).
#define SMC_CTAS 64
#ifndef SMC_COLS
#define SMC_COLS 256  // columns a top-p pass stages at a time (the emulator test builds 3 too)
#endif
#define SMC_AM 0          // [64][2]: each CTA's argmax (value bits, index)
#define SMC_HIST 128      // [4][256]: top-k's digit histograms
#define SMC_ST 1152       // [32]: 0 mode (1: sampled), 1 m bits, 2 greedy id, 4 tau_k, 5 want bits, 8 + q tau_p
                          // before top-p pass q, 16 + 2p and 17 + 2p top-k's prefix and rank left
                          // before digit p (rank 0: no limit)
#define SMC_PART 1184     // [2][64 candidates][64 CTAs]: top-p partials, by pass parity
#define SMC_KEPT 9376     // [4 candidates][256 lanes]: the last top-p pass's lane sums
#define SMC_WORDS 10400
#define SMC_PASSES 6
#ifndef SMC_BREAK
#define SMC_BREAK 0
#endif

__device__ __forceinline__ int smc_shift(int q) { return q < 5 ? 26 - 6 * q : 0; }

// Element i (of 4 a column) of CTA g's lanes: lane g + 64 (i & 3), column i >> 2.
__device__ __forceinline__ int smc_index(int g, int i) { return g + 64 * (i & 3) + SMP_THREADS * (i >> 2); }

__device__ __forceinline__ const u32* smc_mask(const u32* mask_bits, const int* mask_index, int mask_words, int r) {
    return (mask_words > 0 && mask_index[r] >= 0) ? mask_bits + (size_t)mask_index[r] * mask_words : nullptr;
}

// Top-k's digit from histogram h (256 bins) for the kk-th largest key: the bin b whose suffix
// count reaches kk while b + 1's does not (a suffix scan over the block); *kk_out the rank left
// inside it, *total the histogram's sum. Every thread gets the same answers.
__device__ __forceinline__ u32 smc_select(const u32* h, u32 kk, u32* s_scan, u32* s_out, u32* kk_out, u32* total) {
    const int t = threadIdx.x;
    s_scan[t] = h[t];
    __syncthreads();
    for (int off = 1; off < 256; off <<= 1) {
        const u32 v = s_scan[t] + (t + off < 256 ? s_scan[t + off] : 0u);
        __syncthreads();
        s_scan[t] = v;
        __syncthreads();
    }
    const u32 above = t < 255 ? s_scan[t + 1] : 0u;
    if (s_scan[t] >= kk && above < kk) {
        s_out[0] = (u32)t;
        s_out[1] = kk - above;
    }
    if (t == 0) s_out[2] = s_scan[0];
    __syncthreads();
    const u32 sel = s_out[0];
    *kk_out = s_out[1];
    *total = s_out[2];
    __syncthreads();
    return sel;
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS)
sample_mc_max(const float* __restrict__ logits, u32* __restrict__ ws, int rows, int vocab, const u32* __restrict__ mask_bits, const int* __restrict__ mask_index, int mask_words) {
    __shared__ float sf[SMP_THREADS];
    __shared__ int si[SMP_THREADS];
    const int r = blockIdx.y, g = blockIdx.x, t = threadIdx.x;
    if (r >= rows) return;
    const float* row = logits + (size_t)r * vocab;
    const u32* mask = smc_mask(mask_bits, mask_index, mask_words, r);
    u32* w = ws + (size_t)r * SMC_WORDS;
    // Order-free (argmax_combine picks the same pair in any order): a contiguous slice a CTA.
    const int per = (vocab + SMC_CTAS - 1) / SMC_CTAS, hi = min(vocab, (g + 1) * per);
    float v = 0.0f;
    int idx = -1;
    for (int j = g * per + t; j < hi; j += SMP_THREADS) argmax_combine(v, idx, smp_ld(row, mask, j), j);
    smp_argmax_fold(sf, si, v, idx);
    if (t == 0) {
        w[SMC_AM + 2 * g] = smp_bits(sf[0]);
        w[SMC_AM + 2 * g + 1] = (u32)si[0];
    }
#if SMC_BREAK != 1  // deliberately broken: the histograms keep what the workspace held
    if (t < 1024 / SMC_CTAS) w[SMC_HIST + g * (1024 / SMC_CTAS) + t] = 0u;
#endif
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS)
sample_mc_topk(const float* __restrict__ logits, const u32* __restrict__ specs, u32* __restrict__ ws, int rows, int vocab, const u32* __restrict__ mask_bits, const int* __restrict__ mask_index, int mask_words, int p) {
    __shared__ float sf[SMP_THREADS];
    __shared__ int si[SMP_THREADS];
    __shared__ u32 s_hist[256], s_scan[256], s_out[3];
    const int r = blockIdx.y, g = blockIdx.x, t = threadIdx.x;
    if (r >= rows || (g > 0 && g >= vocab)) return;  // CTA 0 (the state's writer) always runs
    u32* w = ws + (size_t)r * SMC_WORDS;
    const u32* sp = specs + (size_t)r * 8;
    const u32 top_k = sp[1];
    u32 mode;
    if (p == 0) {
        // The argmax partials folded by the block's tree: m and the greedy id.
        smp_argmax_fold(sf, si, t < SMC_CTAS ? __uint_as_float(w[SMC_AM + 2 * t]) : 0.0f, t < SMC_CTAS ? (int)w[SMC_AM + 2 * t + 1] : -1);
        const float m = sf[0], inv_t = __uint_as_float(sp[0]);
        mode = (inv_t == 0.0f || !(fabsf(m) <= 3.402823466e38f)) ? 0u : 1u;
        if (g == 0 && t == 0) {
            w[SMC_ST + 0] = mode;
            w[SMC_ST + 1] = smp_bits(m);
            w[SMC_ST + 2] = si[0] < 0 ? 0u : (u32)si[0];
        }
    } else {
        mode = w[SMC_ST + 0];
    }
    if (!mode || top_k == 0) return;
    // The digits before p: the state digit p - 1 left, and digit p - 1 from its histogram.
    u32 prefix = 0, kk = top_k;
    if (p > 0) {
        prefix = p == 1 ? 0u : w[SMC_ST + 16 + 2 * (p - 1)];
        kk = p == 1 ? top_k : w[SMC_ST + 17 + 2 * (p - 1)];
        if (kk != 0) {
            u32 kk2, total;
            const u32 sel = smc_select(w + SMC_HIST + 256 * (p - 1), kk, s_scan, s_out, &kk2, &total);
            prefix |= sel << (32 - 8 * p);
            kk = (p == 1 && top_k >= total) ? 0u : kk2;  // k >= the valid count: no limit
        }
        if (g == 0 && t == 0) {
            w[SMC_ST + 16 + 2 * p] = prefix;
            w[SMC_ST + 17 + 2 * p] = kk;
        }
        if (kk == 0) return;
    }
    const u32 pmask = p == 0 ? 0u : 0xffffffffu << (32 - 8 * p);
    const int shift = 24 - 8 * p;
    const float* row = logits + (size_t)r * vocab;
    const u32* mask = smc_mask(mask_bits, mask_index, mask_words, r);
    s_hist[t] = 0u;
    __syncthreads();
    // Integer counts, order-free: a contiguous slice a CTA.
    const int per = (vocab + SMC_CTAS - 1) / SMC_CTAS, hi = min(vocab, (g + 1) * per);
    for (int j = g * per + t; j < hi; j += SMP_THREADS) {
        const float x = smp_ld(row, mask, j);
        if (x != x) continue;
        const u32 kx = smp_key(x);
        if ((kx & pmask) == prefix) atomicAdd(&s_hist[(kx >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (s_hist[t]) atomicAdd(&w[SMC_HIST + 256 * p + t], s_hist[t]);
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS)
sample_mc_topp(const float* __restrict__ logits, const u32* __restrict__ specs, u32* __restrict__ ws, int rows, int vocab, const u32* __restrict__ mask_bits, const int* __restrict__ mask_index, int mask_words, int q) {
    __shared__ float s_f[SMC_CTAS][SMC_CTAS];
    __shared__ float s_w[4][SMC_COLS];
    __shared__ u32 s_k[4][SMC_COLS];
    __shared__ float s_acc[4][64];
    __shared__ u32 s_scan[256], s_out[3];
    const int r = blockIdx.y, g = blockIdx.x, t = threadIdx.x;
    if (r >= rows) return;
    u32* w = ws + (size_t)r * SMC_WORDS;
    if (g > 0 && g >= vocab) {  // no lanes: zero masses (CTA 0, the state's writer, always runs)
        if (q < SMC_PASSES - 1 && t < 64) w[SMC_PART + (q & 1) * SMC_CTAS * SMC_CTAS + t * SMC_CTAS + g] = 0u;
        if (q == SMC_PASSES - 1 && t < 16) w[SMC_KEPT + (t & 3) * SMP_THREADS + g + 64 * (t >> 2)] = 0u;
        return;
    }
    if (!w[SMC_ST + 0]) return;
    const u32* sp = specs + (size_t)r * 8;
    const float inv_t = __uint_as_float(sp[0]), top_p = __uint_as_float(sp[2]), min_p = __uint_as_float(sp[3]);
    const u32 top_k = sp[1];
    const float m = __uint_as_float(w[SMC_ST + 1]);
    u32 tau_k = 0;
    if (q == 0) {
        // The last digit from its histogram (rank 0 left by the passes: no limit).
        const u32 kk = top_k > 0 ? w[SMC_ST + 17 + 2 * 3] : 0u;
        if (kk != 0) {
            u32 kk2, total;
            tau_k = w[SMC_ST + 16 + 2 * 3] | smc_select(w + SMC_HIST + 256 * 3, kk, s_scan, s_out, &kk2, &total);
        }
        if (g == 0 && t == 0) w[SMC_ST + 4] = tau_k;
    } else {
        tau_k = w[SMC_ST + 4];
    }
    const bool topp = top_p < 1.0f;
    if (!topp && q < SMC_PASSES - 1) return;
    u32 tau = 0;
    if (topp && q > 0) {
        // The previous pass's 64 partials a candidate, folded by the tree's levels 32 .. 1.
#if SMC_BREAK == 2  // deliberately broken: the partials of the pass before the last
        const u32* part = w + SMC_PART + (q & 1) * SMC_CTAS * SMC_CTAS;
#else
        const u32* part = w + SMC_PART + ((q - 1) & 1) * SMC_CTAS * SMC_CTAS;
#endif
        for (int i = t; i < SMC_CTAS * SMC_CTAS; i += SMP_THREADS) s_f[i / SMC_CTAS][i % SMC_CTAS] = __uint_as_float(part[i]);
        __syncthreads();
        for (int half = SMC_CTAS / 2; half > 0; half >>= 1) {
            for (int i = t; i < SMC_CTAS * half; i += SMP_THREADS) {
                const int d = i / half, l = i - d * half;
                s_f[d][l] = smp_add(s_f[d][l], s_f[d][l + half]);
            }
            __syncthreads();
        }
        const float want = q == 1 ? smp_mul(top_p, s_f[0][0]) : __uint_as_float(w[SMC_ST + 5]);
        u32 best = 0;
        for (int d = 1; d < 64; ++d)
            if (s_f[d][0] >= want) best = (u32)d;
        tau = (q == 1 ? 0u : w[SMC_ST + 8 + q - 1]) | best << smc_shift(q - 1);
        if (g == 0 && t == 0) {
            if (q == 1) w[SMC_ST + 5] = smp_bits(want);
            w[SMC_ST + 8 + q] = tau;
        }
    }
    // Thread (lane j, candidate d): lane g + 64 j's mass at key tau | d << shift, in order.
    const int shift = smc_shift(q), ncand = q < SMC_PASSES - 1 ? 64 : 4;
    const int j = t >> 6, d = t & 63;
    const u32 c = tau | ((u32)d << shift);
    const int ncol = (vocab + SMP_THREADS - 1) / SMP_THREADS;
    const float* row = logits + (size_t)r * vocab;
    const u32* mask = smc_mask(mask_bits, mask_index, mask_words, r);
    float acc = 0.0f;
    for (int c0 = 0; c0 < ncol; c0 += SMC_COLS) {
        for (int i = t; i < 4 * SMC_COLS; i += SMP_THREADS) {
            const int col = c0 + (i >> 2), idx = smc_index(g, i) + SMP_THREADS * c0;
            float wv = 0.0f;
            u32 kx = 0;
            if (col < ncol && idx < vocab) {
                const float x = smp_ld(row, mask, idx);
                if (x == x) {
                    kx = smp_key(x);
                    // Below tau (every candidate) or top-k's threshold, or under min-p: weight 0,
                    // which leaves a running sum as it is (the host skips it).
                    if (kx >= tau && kx >= tau_k) {
                        wv = smp_weight(x, m, inv_t);
                        if (!(wv >= min_p)) wv = 0.0f;
                    }
                }
            }
            s_w[i & 3][i >> 2] = wv;
            s_k[i & 3][i >> 2] = kx;
        }
        __syncthreads();
        if (d < ncand) {
            const int n = ncol - c0 < SMC_COLS ? ncol - c0 : SMC_COLS;
            for (int i = 0; i < n; ++i)
                if (s_k[j][i] >= c) acc = smp_add(acc, s_w[j][i]);
        }
        __syncthreads();
    }
    s_acc[j][d] = acc;
    __syncthreads();
    if (q < SMC_PASSES - 1) {
        // The tree's levels 128 and 64 apart: (l_g + l_g+128) + (l_g+64 + l_g+192).
        if (t < ncand)
            w[SMC_PART + (q & 1) * SMC_CTAS * SMC_CTAS + t * SMC_CTAS + g] = smp_bits(smp_add(smp_add(s_acc[0][t], s_acc[2][t]), smp_add(s_acc[1][t], s_acc[3][t])));
    } else if (t < 16) {
        w[SMC_KEPT + (t & 3) * SMP_THREADS + g + 64 * (t >> 2)] = smp_bits(s_acc[t >> 2][t & 3]);
    }
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS)
sample_mc_draw(const float* __restrict__ logits, const u32* __restrict__ specs, u32* __restrict__ ws, u32* __restrict__ out, int rows, int vocab, const u32* __restrict__ mask_bits, const int* __restrict__ mask_index, int mask_words) {
    __shared__ float s_f[4][SMP_THREADS];
    __shared__ float s_incl[SMP_THREADS];
    __shared__ float s_w[SMP_WALK];
    __shared__ int s_lane, s_walk, s_pick;
    __shared__ float s_local;
    const int r = blockIdx.x, t = threadIdx.x;
    if (r >= rows) return;
    const u32* w = ws + (size_t)r * SMC_WORDS;
    const u32 greedy = w[SMC_ST + 2];
    if (!w[SMC_ST + 0]) {
        if (t == 0) out[r] = greedy;
        return;
    }
    const u32* sp = specs + (size_t)r * 8;
    const float inv_t = __uint_as_float(sp[0]), top_p = __uint_as_float(sp[2]), min_p = __uint_as_float(sp[3]);
    const float m = __uint_as_float(w[SMC_ST + 1]);
    const u32 tau_k = w[SMC_ST + 4];
    const u32* kept = w + SMC_KEPT;
    u32 best = 0, tau_p = 0;
    if (top_p < 1.0f) {
        // The last digit: each candidate's 256 lane sums folded by the whole tree.
        for (int i = t; i < 4 * SMP_THREADS; i += SMP_THREADS) s_f[i / SMP_THREADS][i % SMP_THREADS] = __uint_as_float(kept[i]);
        __syncthreads();
        for (int half = SMP_THREADS / 2; half > 0; half >>= 1) {
            for (int i = t; i < 4 * half; i += SMP_THREADS) {
                const int d = i / half, l = i - d * half;
                s_f[d][l] = smp_add(s_f[d][l], s_f[d][l + half]);
            }
            __syncthreads();
        }
        const float want = __uint_as_float(w[SMC_ST + 5]);
        for (int d = 1; d < 4; ++d)
            if (s_f[d][0] >= want) best = (u32)d;
        tau_p = w[SMC_ST + 8 + SMC_PASSES - 1] | best;
        __syncthreads();
    }
    const u32 tau = tau_k > tau_p ? tau_k : tau_p;
    const u32* lane = kept + best * SMP_THREADS;
    if (t == 0) {
        smp_draw_lane(lane, s_incl, sp, &s_lane, &s_walk, &s_local);
        s_pick = -1;
    }
    __syncthreads();
    // The walk along the chosen lane, as in sample_radix.
    const float* row = logits + (size_t)r * vocab;
    const u32* mask = smc_mask(mask_bits, mask_index, mask_words, r);
    smp_walk_lane(row, mask, vocab, tau, m, inv_t, min_p, greedy, s_w, &s_lane, &s_walk, &s_local, &s_pick, out + r);
}
