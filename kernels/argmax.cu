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
