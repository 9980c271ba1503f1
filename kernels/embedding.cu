// embedding.cu — token embedding lookup.
//
//   out[t, :] = table[ids[t], :]      table [vocab, hidden] (f32|bf16|f16), ids u32 [T], out f32 [T, hidden]
//
// Launch: grid (T), block 256; each block copies one row, threads stride over `hidden`.
// An id >= vocab writes a row of NaN (the batch should have been validated; this keeps the
// read in bounds and makes the fault visible).
// Check: `cargo run -p tandem-cuda --bin tandem-kernels-check -- --only embedding` compiles it;
// on a GPU the op suite compares it with the reference backend (op `embedding`).
#include "common.cuh"

template <typename T>
__device__ void embedding_impl(const T* __restrict__ table, const u32* __restrict__ ids, float* __restrict__ out,
                               int num_tokens, int hidden, int vocab) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    const int t = blockIdx.x;
    if (t >= num_tokens) return;
    const u32 id = ids[t];
    float* dst = out + (size_t)t * hidden;
    if (id >= (u32)vocab) {
        for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = nan_f32();
        return;
    }
    const T* src = table + (size_t)id * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = to_f32(src[i]);
}

#define EMBEDDING(NAME, T)                                                                         \
    extern "C" __global__ void __launch_bounds__(256) NAME(const T* table, const u32* ids, float* out, \
                                                           int num_tokens, int hidden, int vocab) { \
        embedding_impl<T>(table, ids, out, num_tokens, hidden, vocab);                            \
    }
EMBEDDING(embedding_f32, float)
EMBEDDING(embedding_bf16, bf16_t)
EMBEDDING(embedding_f16, f16_t)
