// paged_attention_fp8.cu — the tensor-core attention (paged_attention_tc, kernels/
// paged_attention.cu) over an fp8 KV cache: paged_attention_tc_fp8e4m3_d{64,128,256} and
// paged_attention_tc_fp8e5m2_d{64,128,256}. crates/cuda/src/attention.rs takes them for an fp8
// cache wherever it takes paged_attention_tc for a bf16 one when TANDEM_CUDA_ATTENTION_FP8=tc
// (off by default: the performance model predicts this decode slower than the f32 kernel's,
// paged_attention_partial_fp8*, which serves an fp8 cache otherwise, until a GPU times both).
//
// Each K/V stage is loaded as bytes (16 a load, into registers, issued one stage ahead as tc's
// cp.async stages are), then, after the current stage's arithmetic, decoded element by element
// exactly as common.cuh's kv_load decodes an fp8 byte for the f32 kernel (the byte's value, then
// times the layer's k_scale / v_scale in one f32 multiply), rounded to bf16 (round to nearest
// even), and stored into the warp's shared-memory stage, where the same ldmatrix and
// mma.m16n8k16 steps as the bf16 kernel read it. vLLM's and FlashInfer's fp8-KV decode kernels
// widen their tiles to 16 bits the same way, on the way into shared memory.
//
// Contract: over caches of bytes kb, vb with scales ks, vs, the output is bitwise the output of
// paged_attention_tc_d{D} over the bf16 caches K = bf16(decode(kb) * ks), V = bf16(decode(vb) *
// vs) (the "decoded cache"), for every token, batch and launch split: the stage contents are
// those bf16 values, and everything after the stage is tc's code (pat_job with the cache type as
// a template parameter). So tc's contract holds as written: the per-row arithmetic of steps 1-3,
// decode == prefill chunk, each token alone == in any batch, the sliding window, NaN for a bad
// block id or sequence. With scale 1 the decoded cache is the byte's exact value (e4m3's and
// e5m2's values are all bf16 values); with another scale the product is rounded to bf16 once,
// a relative 2^-9 at most, where the f32 kernel keeps it in f32.
// kernels/emu/attention_tc_fp8_test.h checks the contract bitwise against paged_attention_tc on
// the decoded cache, over tc's cases and both formats, and each token alone against the batch.
// Arguments: paged_attention_tc_d{D}'s, then k_scale, v_scale (as paged_attention_partial_fp8*).
#include "common.cuh"

#define TANDEM_PAGED_ATTENTION_DEVICE_ONLY
#include "paged_attention.cu"

// Launch bounds with a minimum of one block an SM: without it ptxas held d256 at 168 registers on
// sm_80 and spilled 16 bytes; with it 193 registers, no spill (the bits are the same either way).
#define PAT_FP8_KERNEL(NAME, KV, D)                                                                                     \
    extern "C" __global__ void __launch_bounds__(PAT_WARPS * 32, 1) paged_attention_tc_##NAME##_d##D(                    \
        const float* __restrict__ q, const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,                     \
        const u32* __restrict__ positions, const u32* __restrict__ token_seq, const u32* __restrict__ block_tables,     \
        float* __restrict__ out, float* __restrict__ part_out, float* __restrict__ part_ml, u32* __restrict__ counters, \
        int num_tokens, int n_split, int num_heads, int num_kv_heads, int block_size, int num_blocks, int num_seqs,       \
        int max_blocks, int max_parts, int tw, float scale, int window, float k_scale, float v_scale) {                  \
        PatArgs a{q,          nullptr,    nullptr,   positions,  token_seq,  block_tables, out,                          \
                  part_out,   part_ml,    counters,  num_tokens, n_split,    num_heads,    num_kv_heads,                 \
                  block_size, num_blocks, num_seqs,  max_blocks, max_parts,  tw,           scale * PAT_LOG2E,            \
                  window};                                                                                               \
        a.k8 = (const unsigned char*)k_cache;                                                                            \
        a.v8 = (const unsigned char*)v_cache;                                                                            \
        a.k_scale = k_scale;                                                                                             \
        a.v_scale = v_scale;                                                                                             \
        paged_attention_tc_impl<D, KV>(a);                                                                               \
    }
PAT_FP8_KERNEL(fp8e4m3, fp8e4m3_t, 64)
PAT_FP8_KERNEL(fp8e4m3, fp8e4m3_t, 128)
PAT_FP8_KERNEL(fp8e4m3, fp8e4m3_t, 256)
PAT_FP8_KERNEL(fp8e5m2, fp8e5m2_t, 64)
PAT_FP8_KERNEL(fp8e5m2, fp8e5m2_t, 128)
PAT_FP8_KERNEL(fp8e5m2, fp8e5m2_t, 256)
