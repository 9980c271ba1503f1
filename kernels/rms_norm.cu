// rms_norm.cu — RMSNorm over the last dimension.
//
//   out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w      x, out f32 [rows, dim], w [dim] (f32|bf16|f16)
//
// Launch: grid (rows), block 256. Each block owns one row: a strided sum of squares (fma, f32),
// a fixed-shape block reduction (so a row's result does not depend on the other rows), then
// the scaled write. 1/sqrtf rather than rsqrtf: rsqrtf is 2 ulp off and the reference is exact.
// Check: tandem-kernels-check --only rms_norm; op suite op `rms_norm`.
#include "common.cuh"

template <typename T>
__device__ void rms_norm_impl(const float* __restrict__ x, const T* __restrict__ w, float* __restrict__ out,
                              int rows, int dim, float eps) {
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (size_t)r * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    float* o = out + (size_t)r * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = (xr[i] * inv) * to_f32(w[i]);
}

#define RMS_NORM(NAME, T)                                                                            \
    extern "C" __global__ void __launch_bounds__(256) NAME(const float* x, const T* w, float* out,   \
                                                           int rows, int dim, float eps) {           \
        rms_norm_impl<T>(x, w, out, rows, dim, eps);                                                 \
    }
RMS_NORM(rms_norm_f32, float)
RMS_NORM(rms_norm_bf16, bf16_t)
RMS_NORM(rms_norm_f16, f16_t)
