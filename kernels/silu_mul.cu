// silu_mul.cu — the gated MLP activations: silu (SwiGLU: Llama, Qwen, Mistral) and gelu_tanh
// (GeGLU: Gemma).
//
//   out[i] = silu(gate[i]) * up[i],       silu(g) = g / (1 + exp(-g))              gate, up f32 [len]
//   out[i] = gelu_tanh(gate[i]) * up[i],  gelu_tanh(g) = 0.5 g (1 + tanh(√(2/π) (g + 0.044715 g³)))
//   out [len] f32, or bf16 / f16 (out_code, common.cuh store_act) for the down projection.
//
// Launch: grid (ceil(len / 256)), block 256; one element per thread. The formulas are
// common.cuh's gated_act (shared with matmul.cu's EPI_SILU / EPI_GEGLU epilogue). expf, not
// __expf: the fast version is off by several ulp for large |g|. For g -> -inf, exp(-g) = inf and the
// quotient is -0, as in the reference. gelu_tanh is PyTorch's gelu(approximate="tanh") in the
// order of tandem_core::backend::gelu_tanh; tanhf (max 2 ulp on the GPU, against the host
// libm's) makes it agree to a few ulp, not bitwise: the op suite's f32 limit (NMSE 1e-7) is
// far above that (~1e-14). g³ overflows to ±inf for |g| > 7e12: tanh gives ±1, out g·up or -0.
// Check: tandem-kernels-check --only silu_mul; op suite ops `silu_mul`, `gelu_tanh_mul`.
#include "common.cuh"

// One element per thread; ACT is common.cuh's GATED_* (its gated_act is the formula, shared
// with matmul.cu's gate/up epilogue).
template <int ACT>
__device__ __forceinline__ void gated_mul(const float* __restrict__ gate, const float* __restrict__ up, void* __restrict__ out, int out_code,
                                          unsigned long long len) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) store_act(out, out_code, i, gated_act(ACT, gate[i], up[i]));
}

extern "C" __global__ void __launch_bounds__(256)
silu_mul(const float* __restrict__ gate, const float* __restrict__ up, void* __restrict__ out, int out_code, unsigned long long len) {
    gated_mul<GATED_SILU>(gate, up, out, out_code, len);
}

extern "C" __global__ void __launch_bounds__(256)
gelu_tanh_mul(const float* __restrict__ gate, const float* __restrict__ up, void* __restrict__ out, int out_code, unsigned long long len) {
    gated_mul<GATED_GELU_TANH>(gate, up, out, out_code, len);
}
