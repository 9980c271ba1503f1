// add.cu — elementwise arithmetic on the residual stream: the residual add, and scale
// (Gemma's embedding times √hidden).
//
//   add:   acc[i] += x[i]                    acc, x f32 [len]
//   scale: x[i] *= factor                    x f32 [len]
//
// Launch: grid (ceil(len / 256)), block 256; one element per thread.
// Check: tandem-kernels-check --only add; op suite ops `add`, `scale`.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256)
add(float* __restrict__ acc, const float* __restrict__ x, unsigned long long len) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) acc[i] += x[i];
}

extern "C" __global__ void __launch_bounds__(256)
scale(float* __restrict__ x, float factor, unsigned long long len) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) x[i] *= factor;
}
