// silu_mul.cu — the gated MLP activation.
//
//   out[i] = silu(gate[i]) * up[i],  silu(g) = g / (1 + exp(-g))      gate, up f32 [len]
//   out [len] f32, or bf16 / f16 (out_code, common.cuh store_act) for the down projection.
//
// Launch: grid (ceil(len / 256)), block 256; one element per thread. expf, not __expf: the
// fast version is off by several ulp for large |g|. For g -> -inf, exp(-g) = inf and the
// quotient is -0, as in the reference.
// Check: tandem-kernels-check --only silu_mul; op suite op `silu_mul`.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256)
silu_mul(const float* __restrict__ gate, const float* __restrict__ up, void* __restrict__ out, int out_code,
         unsigned long long len) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) {
        const float g = gate[i];
        store_act(out, out_code, i, g / (1.0f + expf(-g)) * up[i]);
    }
}
