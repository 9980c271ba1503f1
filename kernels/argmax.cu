// argmax.cu — greedy sampling on the device: only the ids travel back to the host.
//
//   out[r] = index of the largest value in logits[r, :]     logits f32 [rows, vocab], out u32 [rows]
//
// Ties go to the lowest index. NaN never wins against a number; a row that is all NaN gives
// its last index, which is what the reference's sequential scan (`tandem_core::backend::
// argmax_row`) returns. The combine rule (`argmax_combine`, common.cuh) is associative, so the
// tree gives exactly the sequential answer.
// Launch: grid (rows), block 512; threads stride over the row, then a shared-memory tree.
// Check: tandem-kernels-check --only argmax; op suite op `argmax` (with planted ties and NaNs).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(512)
argmax(const float* __restrict__ logits, u32* __restrict__ out, int rows, int vocab) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    __shared__ float sv[512];
    __shared__ int si[512];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* row = logits + (size_t)r * vocab;
    float v = 0.0f;
    int idx = -1;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) argmax_combine(v, idx, row[j], j);
    sv[threadIdx.x] = v;
    si[threadIdx.x] = idx;
    __syncthreads();
    for (int s = blockDim.x >> 1; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            float a = sv[threadIdx.x];
            int ai = si[threadIdx.x];
            argmax_combine(a, ai, sv[threadIdx.x + s], si[threadIdx.x + s]);
            sv[threadIdx.x] = a;
            si[threadIdx.x] = ai;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[r] = si[0] < 0 ? 0u : (u32)si[0];
}

// argmax_partial + argmax_fold (TANDEM_CUDA_ARGMAX=multi): the same ids over many CTAs a row.
// argmax_partial: grid (chunks, rows), block 256; CTA (c, r) folds logits[r, c * AMX_CHUNK ..
// (c + 1) * AMX_CHUNK) into part: the values [rows, chunks] (f32 bits), then the indices [rows,
// chunks] (i32; -1: no candidate), 2 * rows * chunks words in all. argmax_fold:
// grid (rows), block 256, folds row r's chunks. `argmax_combine` is the maximum of a total order
// (a larger value first, then the lower index; NaNs after every number, the higher index
// first), so any fold order gives the sequential scan's answer; the order is fixed anyway.
#define AMX_CHUNK 4096

#ifdef TANDEM_HOST_EMU
__device__ __forceinline__ u32 amx_bits(float x) { u32 b; std::memcpy(&b, &x, 4); return b; }
__device__ __forceinline__ float amx_float(u32 b) { float x; std::memcpy(&x, &b, 4); return x; }
#else
__device__ __forceinline__ u32 amx_bits(float x) { return __float_as_uint(x); }
__device__ __forceinline__ float amx_float(u32 b) { return __uint_as_float(b); }
#endif

__device__ __forceinline__ void amx_tree(float* sv, int* si, float v, int idx) {
    sv[threadIdx.x] = v;
    si[threadIdx.x] = idx;
    __syncthreads();
    for (int s = 128; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            float a = sv[threadIdx.x];
            int ai = si[threadIdx.x];
            argmax_combine(a, ai, sv[threadIdx.x + s], si[threadIdx.x + s]);
            sv[threadIdx.x] = a;
            si[threadIdx.x] = ai;
        }
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(256)
argmax_partial(const float* __restrict__ logits, u32* __restrict__ part, int rows, int vocab, int chunks) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    __shared__ float sv[256];
    __shared__ int si[256];
    const int c = blockIdx.x, r = blockIdx.y;
    if (r >= rows || c >= chunks) return;
    const float* row = logits + (size_t)r * vocab;
    const int end = min(vocab, (c + 1) * AMX_CHUNK);
    float v = 0.0f;
    int idx = -1;
    for (int j = c * AMX_CHUNK + threadIdx.x; j < end; j += 256) argmax_combine(v, idx, row[j], j);
    amx_tree(sv, si, v, idx);
    if (threadIdx.x == 0) {
        part[(size_t)r * chunks + c] = amx_bits(sv[0]);
        part[(size_t)rows * chunks + (size_t)r * chunks + c] = (u32)si[0];
    }
}

extern "C" __global__ void __launch_bounds__(256)
argmax_fold(const u32* __restrict__ part, u32* __restrict__ out, int rows, int chunks) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    __shared__ float sv[256];
    __shared__ int si[256];
    const int r = blockIdx.x;
    if (r >= rows) return;
    float v = 0.0f;
    int idx = -1;
    for (int c = threadIdx.x; c < chunks; c += 256)
        argmax_combine(v, idx, amx_float(part[(size_t)r * chunks + c]), (int)part[(size_t)rows * chunks + (size_t)r * chunks + c]);
    amx_tree(sv, si, v, idx);
    if (threadIdx.x == 0) out[r] = si[0] < 0 ? 0u : (u32)si[0];
}
