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

// The row's argmax (as read through its mask) into sf[0] / si[0] (-1: every logit NaN), by
// the block's fixed tree; the caller syncs before it reuses sf and si.
__device__ __forceinline__ void smp_row_argmax(const float* row, const u32* mask, int vocab, float* sf, int* si) {
    const int t = threadIdx.x;
    float v = 0.0f;
    int idx = -1;
    for (int j = t; j < vocab; j += SMP_THREADS) argmax_combine(v, idx, smp_ld(row, mask, j), j);
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
    if (t == 0) {
        float acc = 0.0f;
        for (int l = 0; l < SMP_THREADS; ++l) {
            acc = smp_add(acc, sf[l]);
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
            s_lane = chosen;
            s_walk = 1;
            s_local = smp_add(target, chosen > 0 ? -s_incl[chosen - 1] : -0.0f);
        } else {  // rounding put the target at the very end: the last lane with weight
            int last = 0;
            for (int l = SMP_THREADS - 1; l >= 0; --l)
                if (sf[l] > 0.0f) { last = l; break; }
            s_lane = last;
            s_walk = 0;
            s_local = 0.0f;
        }
    }
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
        float acc = 0.0f;
        for (int l = 0; l < SMP_THREADS; ++l) {
            acc = smp_add(acc, sf[l]);
            s_piv[0][l] = acc;
        }
        u32 c0 = sp[7], c1 = sp[6], c2 = 0u, c3 = 0u;
        philox4x32_10(c0, c1, c2, c3, sp[4], sp[5]);
        const float u = smp_mul((float)(c0 >> 8), 1.0f / 16777216.0f);
        const float target = smp_mul(u, acc);
        int chosen = -1;
        for (int l = 0; l < SMP_THREADS && chosen < 0; ++l)
            if (s_piv[0][l] > target) chosen = l;
        if (chosen >= 0) {
            s_lane = chosen;
            s_walk = 1;
            s_local = smp_add(target, chosen > 0 ? -s_piv[0][chosen - 1] : -0.0f);
        } else {
            int last = 0;
            for (int l = SMP_THREADS - 1; l >= 0; --l)
                if (sf[l] > 0.0f) { last = l; break; }
            s_lane = last;
            s_walk = 0;
            s_local = 0.0f;
        }
        s_pick = -1;
    }
    __syncthreads();
    // The walk along lane s_lane (indices s_lane + 256 i): the block computes a chunk of its
    // kept weights (0 where not kept: adding +0 leaves the running sum as it is), thread 0
    // adds them in order; the last positive kept weight is the fallback.
    const int ln = s_lane, n_lane = ln < vocab ? (vocab - 1 - ln) / SMP_THREADS + 1 : 0;
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
        if (t == 0 && s_pick < 0) {
            const int n = n_lane - c0 < SMP_WALK ? n_lane - c0 : SMP_WALK;
            for (int i = 0; i < n; ++i) {
                const float w = s_w[i];
                if (w > 0.0f) last = ln + (c0 + i) * SMP_THREADS;
                if (s_walk) {
                    local = smp_add(local, w);
                    if (local > s_local) { s_pick = ln + (c0 + i) * SMP_THREADS; break; }
                }
            }
        }
        __syncthreads();
        if (s_pick >= 0) break;
    }
    if (t == 0) out[r] = s_pick >= 0 ? (u32)s_pick : last >= 0 ? (u32)last : greedy;
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
