// rms_norm.cu — RMSNorm over the last dimension.
//
//   out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w      x f32 [rows, dim], w [dim] (f32|bf16|f16)
//   out [rows, dim] f32, or bf16 / f16 (out_code, common.cuh store_act) where a tensor-core
//   matmul reads it: the f32 value rounded to nearest even, the rounding that matmul would apply.
//
// Launch: grid (rows), block 256. Each block owns one row: a strided sum of squares (fma, f32),
// a fixed-shape block reduction (so a row's result does not depend on the other rows), then
// the scaled write. 1/sqrtf rather than rsqrtf: rsqrtf is 2 ulp off and the reference is exact.
// add_rms_norm_<w> (Backend::add_rms_norm): acc[r, :] += x[r, :], then out[r, :] = rms_norm of
// the new acc row, in one launch of the same shape: each thread adds the elements it then
// squares, in the same strided order and the same block reduction, so the bits equal add then
// rms_norm (kernels/emu test_fused). A thread reads back only what it wrote itself.
// Check: tandem-kernels-check --only rms_norm; op suite ops `rms_norm`, `add_rms_norm`.
#include "common.cuh"

template <typename T>
__device__ void rms_norm_impl(const float* __restrict__ x, const T* __restrict__ w, void* __restrict__ out, int out_code,
                              int rows, int dim, float eps) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (size_t)r * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    const size_t o = (size_t)r * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) store_act(out, out_code, o + i, (xr[i] * inv) * to_f32(w[i]));
}

#define RMS_NORM(NAME, T)                                                                                        \
    extern "C" __global__ void __launch_bounds__(256) NAME(const float* x, const T* w, void* out, int out_code,  \
                                                           int rows, int dim, float eps) {                       \
        rms_norm_impl<T>(x, w, out, out_code, rows, dim, eps);                                                   \
    }
RMS_NORM(rms_norm_f32, float)
RMS_NORM(rms_norm_bf16, bf16_t)
RMS_NORM(rms_norm_f16, f16_t)

template <typename T>
__device__ void add_rms_norm_impl(float* __restrict__ acc, const float* __restrict__ x, const T* __restrict__ w, void* __restrict__ out,
                                  int out_code, int rows, int dim, float eps) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    float* hr = acc + (size_t)r * dim;
    const float* xr = x + (size_t)r * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float h = hr[i] + xr[i];
        hr[i] = h;
        ss = fmaf(h, h, ss);
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    const size_t o = (size_t)r * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) store_act(out, out_code, o + i, (hr[i] * inv) * to_f32(w[i]));
}

#define ADD_RMS_NORM(NAME, T)                                                                                                 \
    extern "C" __global__ void __launch_bounds__(256) NAME(float* acc, const float* x, const T* w, void* out, int out_code,  \
                                                           int rows, int dim, float eps) {                                   \
        add_rms_norm_impl<T>(acc, x, w, out, out_code, rows, dim, eps);                                                       \
    }
ADD_RMS_NORM(add_rms_norm_f32, float)
ADD_RMS_NORM(add_rms_norm_bf16, bf16_t)
ADD_RMS_NORM(add_rms_norm_f16, f16_t)
