// gather_rows.cu — pick rows of an activation matrix (the rows whose logits are wanted).
//
//   out[i, :] = src[rows[i], :]       src f32 [src_rows, dim], rows u32 [n], out f32 [n, dim]
//
// Launch: grid (n), block 256; threads stride over `dim`. rows[i] >= src_rows writes NaN.
// Check: tandem-kernels-check --only gather_rows; op suite op `gather_rows`.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256)
gather_rows(const float* __restrict__ src, const u32* __restrict__ rows, float* __restrict__ out,
            int n, int dim, int src_rows) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    const int i = blockIdx.x;
    if (i >= n) return;
    const u32 r = rows[i];
    float* dst = out + (size_t)i * dim;
    if (r >= (u32)src_rows) {
        for (int j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = nan_f32();
        return;
    }
    const float* s = src + (size_t)r * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = s[j];
}
