// common.cuh — helpers shared by every kernel in kernels/*.cu.
//
// Kept free of CUDA headers on purpose: NVRTC then needs no include path at run time (the GPU
// machine may lack cuda_bf16.h where we look), and bf16/f16 are plain 16-bit patterns that we
// widen ourselves. The Rust side pastes this file in place of `#include "common.cuh"`, so
// embedded sources compile without a kernels directory on disk.
//
// Conventions every kernel follows:
//   - activations and scores: f32, except those a tensor-core matmul reads, which the backend
//     may store in the weights' 16-bit format (store_act); the KV cache f32, bf16 or fp8 (store_kv /
//     to_f32, kv_store / kv_load); ids, positions, slots, block tables: u32;
//   - weights: f32, bf16 or f16, widened to f32 on load; all sums accumulate in f32;
//   - element offsets are size_t (a KV cache layer can exceed 2^31 elements);
//   - an index that would fall outside a buffer writes NaN instead of reading out of bounds,
//     so a bad batch shows up in the output rather than as a memory fault.
#pragma once

typedef unsigned int u32;
typedef unsigned short u16;

// Programmatic dependent launch (PDL, sm_90+; TANDEM_CUDA_PDL=1, kernels/README.md "Programmatic
// dependent launch"). A kernel the host may launch with the programmatic-stream-serialization
// attribute calls PDL_WAIT() in every thread before it reads or writes any global memory that an
// earlier kernel writes or reads (before that, only weights, parameters and its own shared
// memory), and PDL_LAUNCH_DEPENDENTS() once the next kernel may start its own prologue.
// griddepcontrol.wait blocks until every prerequisite grid has completed and its memory
// operations are performed and visible to this grid (PTX ISA 8.x, "griddepcontrol"; CUDA C++
// Programming Guide, "Programmatic Dependent Launch and Synchronization": the dependent's
// cudaGridDependencySynchronize waits for the primary's completion and flush, whatever the
// primary's trigger point), so the trigger's position affects only when the dependent's blocks
// get scheduled, never what they read after their wait. Without the attribute (or below sm_90)
// both are no-ops: the launch is fully serialized as before.
#if defined(TANDEM_HOST_EMU)
#define PDL_WAIT() emu::pdl_wait()
#define PDL_LAUNCH_DEPENDENTS() emu::pdl_launch_dependents()
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_LAUNCH_DEPENDENTS() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_WAIT() ((void)0)
#define PDL_LAUNCH_DEPENDENTS() ((void)0)
#endif

// Storage types: distinct structs so templates can tell bf16 from f16.
struct bf16_t { u16 bits; };
struct f16_t { u16 bits; };

__device__ __forceinline__ float nan_f32() { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ float neg_inf_f32() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float bf16_bits_to_f32(u32 b) { return __uint_as_float(b << 16); }
#ifdef TANDEM_HOST_EMU
// The host emulation (kernels/emu) has no PTX: widen f16 in software (exact, incl. subnormals).
__device__ __forceinline__ float f16_bits_to_f32(u16 h) {
    const u32 sign = (u32)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) return __uint_as_float(sign) + (sign ? -1.0f : 1.0f) * (float)man * 5.9604644775390625e-8f;
    if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (man << 13));
    return __uint_as_float(sign | ((exp + 112) << 23) | (man << 13));
}
#else
__device__ __forceinline__ float f16_bits_to_f32(u16 h) {
    float f;
    asm("{ .reg .f16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}
#endif

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16_t v) { return bf16_bits_to_f32(v.bits); }
__device__ __forceinline__ float to_f32(f16_t v) { return f16_bits_to_f32(v.bits); }

// Two 16-bit values packed in a u32 (low half first in memory) to two floats.
__device__ __forceinline__ void unpack2(bf16_t, u32 w, float& lo, float& hi) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void unpack2(f16_t, u32 w, float& lo, float& hi) {
#ifdef TANDEM_HOST_EMU
    lo = f16_bits_to_f32((u16)(w & 0xffffu));
    hi = f16_bits_to_f32((u16)(w >> 16));
#else
    asm("{ .reg .f16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }"
        : "=f"(lo), "=f"(hi) : "r"(w));
#endif
}

// Eight consecutive weights starting at p (16-byte aligned for bf16/f16, 32-byte for f32).
__device__ __forceinline__ void load8(const float* p, float* o) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
    o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
}
template <typename T>
__device__ __forceinline__ void load8(const T* p, float* o) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    unpack2(T{}, v.x, o[0], o[1]);
    unpack2(T{}, v.y, o[2], o[3]);
    unpack2(T{}, v.z, o[4], o[5]);
    unpack2(T{}, v.w, o[6], o[7]);
}

// Butterfly sums: every lane ends with the same value, in an order fixed by the warp shape, so
// results never depend on timing.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum/max for blockDim.x a multiple of 32 (at most 1024). `scratch` holds 32 floats.
// Every thread gets the result. Ends with a barrier so scratch can be reused at once.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0f;
    v = warp_sum(v);
    __syncthreads();
    return v;
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : neg_inf_f32();
    v = warp_max(v);
    __syncthreads();
    return v;
}

// A bias of any weight dtype, chosen at run time (uniform branch, only in epilogues).
// bias_dtype: 0 = none, 1 = f32, 2 = bf16, 3 = f16.
__device__ __forceinline__ float load_bias(const void* bias, int bias_dtype, int i) {
    switch (bias_dtype) {
        case 1: return static_cast<const float*>(bias)[i];
        case 2: return to_f32(static_cast<const bf16_t*>(bias)[i]);
        case 3: return to_f32(static_cast<const f16_t*>(bias)[i]);
        default: return 0.0f;
    }
}

// The gated MLP activations, act(g) * u: silu_mul.cu's two kernels and matmul.cu's gate/up
// epilogue (EPI_SILU, EPI_GEGLU) all call this, so the fused GEMM stores the bits of the two
// GEMMs then the elementwise kernel. GATED_SILU: silu(g) = g / (1 + exp(-g)) (expf, not
// __expf: the fast one is off by several ulp for large |g|); GATED_GELU_TANH: PyTorch's
// gelu(approximate="tanh") in the order of tandem_core::backend::gelu_tanh. `act` is a
// constant in silu_mul.cu and uniform across the block in the epilogue.
#define GATED_SILU 0
#define GATED_GELU_TANH 1
__device__ __forceinline__ float gated_act(int act, float g, float u) {
    if (act == GATED_GELU_TANH) {
        const float inner = 0.7978846f * (g + 0.044715f * g * g * g);
        return 0.5f * g * (1.0f + tanhf(inner)) * u;
    }
    return g / (1.0f + expf(-g)) * u;
}

// ---- Tensor cores and asynchronous copies (sm_80+) -------------------------------------------
// Inline PTX behind small wrappers; the TANDEM_HOST_EMU branch runs kernels/emu's emulation of
// the same instruction (fragment layouts of the PTX ISA; see kernels/emu/cuda_emu.h).

// f32 -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN, overflow rounds to inf.
// Plain integer code, so the host emulation and the GPU round identically.
__device__ __forceinline__ u16 f32_to_bf16_bits(float v) {
    u32 u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}
// f32 -> f16 bits, round to nearest even (subnormals kept, overflow to inf).
#ifdef TANDEM_HOST_EMU
__device__ __forceinline__ u16 f32_to_f16_bits(float v) {
    const u32 u = __float_as_uint(v), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (u16)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (u16)(sign | 0x7c00u);  // >= 65520 rounds to inf
    if (a < 0x38800000u) {                               // below 2^-14: subnormal or zero
        const float s = __uint_as_float(a) * 16777216.0f; // in units of 2^-24, exact
        return (u16)(sign | (u32)std::nearbyint(s));      // default rounding: nearest even
    }
    u32 h = ((a >> 13) - (112u << 10));
    const u32 rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return (u16)(sign | h);
}
#else
__device__ __forceinline__ u16 f32_to_f16_bits(float v) {
    u16 h;
    asm("{ .reg .f16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(v));
    return h;
}
#endif
__device__ __forceinline__ u16 f32_to_bits(bf16_t, float v) { return f32_to_bf16_bits(v); }
__device__ __forceinline__ u16 f32_to_bits(f16_t, float v) { return f32_to_f16_bits(v); }

// An activation a matmul reads (Backend::activation_dtype): act_code 1 = f32, 2 = bf16, 3 = f16
// (load_bias's codes; a uniform run-time branch). 16-bit stores round to nearest even with
// f32_to_bits, exactly as kernels/matmul.cu rounds an f32 x for the tensor cores, so a GEMM that
// reads the stored value sees the bits it would have formed from the f32 one.
__device__ __forceinline__ void store_act(void* out, int act_code, size_t i, float v) {
    if (act_code == 2) static_cast<u16*>(out)[i] = f32_to_bf16_bits(v);
    else if (act_code == 3) static_cast<u16*>(out)[i] = f32_to_f16_bits(v);
    else static_cast<float*>(out)[i] = v;
}

// A KV cache element (kv_write.cu, paged_attention.cu): f32 as is, or bf16 rounded to nearest
// even with the weights' helper above; loads widen to f32 (exact), so attention over a bf16
// cache is f32 arithmetic over the rounded values.
__device__ __forceinline__ void store_kv(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_kv(bf16_t* p, float v) { p->bits = f32_to_bf16_bits(v); }

// An FP8 KV cache element (Storage::alloc_kv_scaled on an fp8 KvDtype): one byte, e4m3fn or
// e5m2, holding x / scale rounded to nearest even and saturated to the largest finite value
// (NaN stays NaN), read back as the byte's value times the scale: crates/core fp8_round.rs's
// encode and Fp8Format::decode, bit for bit, in plain integer and f32 code (the host emulation
// and the GPU agree; kernels/emu checks every byte and a sweep of values against a host copy).
// kv_store / kv_load take the layer's scale; the f32 and bf16 overloads ignore it, so a kernel
// written with them does over those caches exactly what store_kv / to_f32 do.
struct fp8e4m3_t { unsigned char bits; };
struct fp8e5m2_t { unsigned char bits; };

// man: mantissa bits (3, 2); bias (7, 15); max: the largest finite magnitude (448, 57344).
__device__ __forceinline__ u32 fp8_encode(float x, int man, int bias, float max) {
    const u32 u = __float_as_uint(x), sign = (u >> 24) & 0x80u;
    if ((u & 0x7fffffffu) > 0x7f800000u) return sign | 0x7fu;
    const float a = fminf(__uint_as_float(u & 0x7fffffffu), max);  // max is representable
    if (a < __uint_as_float((u32)(128 - bias) << 23)) {
        // Below the smallest normal: a multiple of 2^(1 - bias - man); the product is exact.
        const float q = a * __uint_as_float((u32)(126 + bias + man) << 23);
#ifdef TANDEM_HOST_EMU
        return sign | (u32)std::nearbyint(q);  // default rounding: nearest even
#else
        return sign | (u32)rintf(q);
#endif
    }
    const int shift = 23 - man;
    const u32 bits = __float_as_uint(a), lsb = (bits >> shift) & 1u;
    const u32 r = (bits + (1u << (shift - 1)) - 1u + lsb) & ~((1u << shift) - 1u);
    return sign | ((((r >> 23) - 127u + (u32)bias) << man) | ((r >> shift) & ((1u << man) - 1u)));
}
// e4m3fn has no infinity (0x7f is NaN); e5m2 keeps IEEE's (exponent 31).
__device__ __forceinline__ float fp8_decode(u32 b, int man, int bias, bool e4m3) {
    const u32 sign = (b & 0x80u) << 24, e = (b & 0x7fu) >> man, m = b & ((1u << man) - 1u);
    if (e4m3 && (b & 0x7fu) == 0x7fu) return nan_f32();
    if (!e4m3 && e == 31u) return m ? nan_f32() : __uint_as_float(sign | 0x7f800000u);
    if (e == 0u) return (sign ? -1.0f : 1.0f) * ((float)m * __uint_as_float((u32)(128 - bias - man) << 23));
    return __uint_as_float(sign | ((e + 127u - (u32)bias) << 23) | (m << (23 - man)));
}
__device__ __forceinline__ void kv_store(float* p, float v, float) { *p = v; }
__device__ __forceinline__ void kv_store(bf16_t* p, float v, float) { store_kv(p, v); }
__device__ __forceinline__ void kv_store(fp8e4m3_t* p, float v, float scale) { p->bits = (unsigned char)fp8_encode(v / scale, 3, 7, 448.0f); }
__device__ __forceinline__ void kv_store(fp8e5m2_t* p, float v, float scale) { p->bits = (unsigned char)fp8_encode(v / scale, 2, 15, 57344.0f); }
__device__ __forceinline__ float kv_load(float v, float) { return v; }
__device__ __forceinline__ float kv_load(bf16_t v, float) { return to_f32(v); }
__device__ __forceinline__ float kv_load(fp8e4m3_t v, float scale) { return fp8_decode(v.bits, 3, 7, true) * scale; }
__device__ __forceinline__ float kv_load(fp8e5m2_t v, float scale) { return fp8_decode(v.bits, 2, 15, false) * scale; }

// One rotate-half pair of rope at angle pos * inv_freq (rope.cu, and kv_write.cu's
// rope_kv_write, which must give rope's bits). sincosf: full range reduction, no fast math.
__device__ __forceinline__ void rope_pair(float x0, float x1, float pos, float inv_freq, float& y0, float& y1) {
    float s, c;
    sincosf(pos * inv_freq, &s, &c);
    y0 = x0 * c - x1 * s;
    y1 = x1 * c + x0 * s;
}

#ifdef TANDEM_HOST_EMU
#define TANDEM_DYNAMIC_SMEM(name) unsigned char* name = emu::dynamic_smem()
#else
// Dynamic shared memory: one extern array per translation unit, sized by the launch.
#define TANDEM_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
#endif

// ldmatrix .m8n8 .b16: lanes 8j..8j+7 point at the 8 rows (16 bytes each) of matrix j.
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const void* row) {
#ifdef TANDEM_HOST_EMU
    emu::ldmatrix(r, 4, false, row);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x2(u32 (&r)[2], const void* row) {
#ifdef TANDEM_HOST_EMU
    emu::ldmatrix(r, 2, false, row);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x1(u32& r, const void* row) {
#ifdef TANDEM_HOST_EMU
    emu::ldmatrix(&r, 1, false, row);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r) : "r"(smem_addr(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], const void* row) {
#ifdef TANDEM_HOST_EMU
    emu::ldmatrix(r, 4, true, row);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x2_trans(u32 (&r)[2], const void* row) {
#ifdef TANDEM_HOST_EMU
    emu::ldmatrix(r, 2, true, row);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x1_trans(u32& r, const void* row) {
#ifdef TANDEM_HOST_EMU
    emu::ldmatrix(&r, 1, true, row);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];" : "=r"(r) : "r"(smem_addr(row)));
#endif
}

// d += a * b on one m16n8k16 tile (A row-major 16x16, B column-major 16x8, f32 accumulators).
__device__ __forceinline__ void mma_16816(bf16_t, float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
#ifdef TANDEM_HOST_EMU
    emu::mma_m16n8k16(d, a, b, d, false);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
__device__ __forceinline__ void mma_16816(f16_t, float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
#ifdef TANDEM_HOST_EMU
    emu::mma_m16n8k16(d, a, b, d, true);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// 16 bytes global -> shared without passing through registers; the first src_bytes (0 or 16
// here) are read, the rest of the 16 written as zeros. `.cg` caches in L2 only (streamed
// weights), `.ca` in L1 too (activations read by several blocks). Complete only after the
// cp_async_wait that covers its commit group.
__device__ __forceinline__ void cp_async_cg16(void* dst, const void* src, int src_bytes) {
#ifdef TANDEM_HOST_EMU
    emu::cp_async16(dst, src, src_bytes);
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_ca16(void* dst, const void* src, int src_bytes) {
#ifdef TANDEM_HOST_EMU
    emu::cp_async16(dst, src, src_bytes);
#else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef TANDEM_HOST_EMU
    emu::cp_async_commit();
#else
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups are still in flight. The copies, the
// commit and the wait carry a "memory" clobber: the compiler may then move no ordinary load or
// store of shared memory across them (a read of a stage hoisted above its wait would read what
// the copy had not written yet). ldmatrix needs none: every one reads a stage after a
// __syncthreads (itself a compiler barrier) that follows the wait.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef TANDEM_HOST_EMU
    emu::cp_async_wait(N);
#else
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// argmax's combine rule (argmax.cu, sampling.cu): (value, index) with index -1 meaning "no
// element seen"; lowest index on ties, NaN never wins against a number. Associative, so a
// tree of it gives the sequential scan's answer.
__device__ __forceinline__ void argmax_combine(float& v, int& i, float v2, int i2) {
    if (i2 < 0) return;
    if (i < 0) { v = v2; i = i2; return; }
    const bool nan1 = v != v, nan2 = v2 != v2;
    if (nan1 && nan2) { if (i2 > i) i = i2; return; }
    if (nan1) { v = v2; i = i2; return; }
    if (nan2) return;
    if (v2 > v || (v2 == v && i2 < i)) { v = v2; i = i2; }
}

// ---- Hopper (sm_90a): wgmma, TMA, mbarrier ----------------------------------------------------
// Only kernels/matmul_sm90.cu uses these; they exist where the target has them (NVRTC with
// --gpu-architecture=sm_90a) and in the host emulation (kernels/emu/wgmma.h, which documents
// the layouts and the asynchrony it models).
#if defined(TANDEM_HOST_EMU) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
typedef unsigned long long u64;

// A CUtensorMap: 128 opaque bytes the host encodes (cuTensorMapEncodeTiled), passed by value.
struct alignas(64) TmaMap { u64 opaque[16]; };

// The address of p in the shared window (the host emulation: its offset in the block's dynamic
// shared memory).
__device__ __forceinline__ u32 smem_u32(const void* p) {
#ifdef TANDEM_HOST_EMU
    return emu::smem_offset(p);
#else
    return smem_addr(p);
#endif
}

// A wgmma matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address, leading and
// stride dimension byte offsets (each >> 4, 14 bits), swizzle mode in bits 62-63 (0 none,
// 1 128-byte). Plain integer code: the emulator decodes what the GPU would.
__device__ __forceinline__ u64 wgmma_desc(u32 smem_byte_addr, u32 lbo_bytes, u32 sbo_bytes, u32 swizzle_mode) {
    return (u64)((smem_byte_addr & 0x3ffffu) >> 4) | ((u64)((lbo_bytes & 0x3ffffu) >> 4) << 16) | ((u64)((sbo_bytes & 0x3ffffu) >> 4) << 32) |
           ((u64)swizzle_mode << 62);
}

__device__ __forceinline__ void wgmma_fence() {
#ifdef TANDEM_HOST_EMU
    emu::wgmma_fence();
#else
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef TANDEM_HOST_EMU
    emu::wgmma_commit();
#else
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef TANDEM_HOST_EMU
    emu::wgmma_wait(N);
#else
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}
// Pins the accumulator registers at this point of the program (before a wgmma reads them, after
// the wait that makes them valid): the compiler may not move their reads or writes across.
template <int R>
__device__ __forceinline__ void wgmma_fence_regs(float (&d)[R]) {
#ifndef TANDEM_HOST_EMU
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
#endif
}

// d += A · B, m64n128k16, f32 accumulators (64 per thread), A and B K-major in shared memory.
#define TANDEM_WGMMA_D64                                                                                                            \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, " \
    "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, "  \
    "%52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define TANDEM_WGMMA_D64_OPS(d)                                                                                                     \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),          \
        "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),         \
        "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),         \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),         \
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]),         \
        "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),         \
        "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
__device__ __forceinline__ void wgmma_m64n128k16(bf16_t, float (&d)[64], u64 desc_a, u64 desc_b) {
#ifdef TANDEM_HOST_EMU
    emu::wgmma_issue(d, 128, desc_a, desc_b, false);
#else
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %66, 0; wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " TANDEM_WGMMA_D64 ", %64, %65, p, 1, 1, 0, 0; }"
                 : TANDEM_WGMMA_D64_OPS(d)
                 : "l"(desc_a), "l"(desc_b), "n"(1));
#endif
}
__device__ __forceinline__ void wgmma_m64n128k16(f16_t, float (&d)[64], u64 desc_a, u64 desc_b) {
#ifdef TANDEM_HOST_EMU
    emu::wgmma_issue(d, 128, desc_a, desc_b, true);
#else
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %66, 0; wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " TANDEM_WGMMA_D64 ", %64, %65, p, 1, 1, 0, 0; }"
                 : TANDEM_WGMMA_D64_OPS(d)
                 : "l"(desc_a), "l"(desc_b), "n"(1));
#endif
}

// d += A · B, m64n256k16 (the 128 x 256 tiles of the persistent kernel): 128 f32 accumulators
// a thread, register q at row 16 v + g + 8 ((q / 2) % 2), column 8 (q / 4) + 2 t + q % 2.
#define TANDEM_WGMMA_D128 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
    "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, " \
    "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
    "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
    "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, " \
    "%101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, " \
    "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define TANDEM_WGMMA_D128_OPS(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), \
    "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
    "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), \
    "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), \
    "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), \
    "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), \
    "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), \
    "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), \
    "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), \
    "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
__device__ __forceinline__ void wgmma_m64n256k16(bf16_t, float (&d)[128], u64 desc_a, u64 desc_b) {
#ifdef TANDEM_HOST_EMU
    emu::wgmma_issue(d, 256, desc_a, desc_b, false);
#else
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %130, 0; wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " TANDEM_WGMMA_D128 ", %128, %129, p, 1, 1, 0, 0; }"
                 : TANDEM_WGMMA_D128_OPS(d)
                 : "l"(desc_a), "l"(desc_b), "n"(1));
#endif
}
__device__ __forceinline__ void wgmma_m64n256k16(f16_t, float (&d)[128], u64 desc_a, u64 desc_b) {
#ifdef TANDEM_HOST_EMU
    emu::wgmma_issue(d, 256, desc_a, desc_b, true);
#else
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %130, 0; wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " TANDEM_WGMMA_D128 ", %128, %129, p, 1, 1, 0, 0; }"
                 : TANDEM_WGMMA_D128_OPS(d)
                 : "l"(desc_a), "l"(desc_b), "n"(1));
#endif
}
// d += A · B, m64n64k16 (kernels/paged_attention_sm90.cu: S = Q·Kᵀ over a 64-key tile, and
// O += P·V at head_dim 64): 32 f32 accumulators a thread, the same fragment layout.
#define TANDEM_WGMMA_D32                                                                                                            \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, " \
    "%27, %28, %29, %30, %31}"
#define TANDEM_WGMMA_D32_OPS(d)                                                                                                     \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),          \
        "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),         \
        "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),         \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
__device__ __forceinline__ void wgmma_m64n64k16(bf16_t, float (&d)[32], u64 desc_a, u64 desc_b) {
#ifdef TANDEM_HOST_EMU
    emu::wgmma_issue(d, 64, desc_a, desc_b, false);
#else
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %34, 0; wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " TANDEM_WGMMA_D32 ", %32, %33, p, 1, 1, 0, 0; }"
                 : TANDEM_WGMMA_D32_OPS(d)
                 : "l"(desc_a), "l"(desc_b), "n"(1));
#endif
}
// A named barrier (bar.sync id, count): `count` threads, whole warps, of the block meet at
// barrier `id` (1..15; 0 is __syncthreads'). One warpgroup's barrier in the wgmma attention.
__device__ __forceinline__ void named_barrier_sync(u32 id, u32 count) {
#ifdef TANDEM_HOST_EMU
    emu::named_barrier_sync(id, count);
#else
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
#endif
}
// Orders this thread's generic-proxy writes to shared memory before the async proxy's reads
// (a wgmma operand written with plain stores). The emulator's memory has one proxy: a no-op.
__device__ __forceinline__ void fence_proxy_async() {
#ifndef TANDEM_HOST_EMU
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// setmaxnreg: a warpgroup gives registers back (the TMA producer) or takes them (the wgmma
// consumers), so that 384 threads fit 128 accumulators a consumer thread. A no-op on the host.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#ifndef TANDEM_HOST_EMU
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#ifndef TANDEM_HOST_EMU
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
#endif
}

// mbarrier in shared memory (8 bytes, 8-byte aligned).
__device__ __forceinline__ void mbar_init(u64* bar, u32 count) {
#ifdef TANDEM_HOST_EMU
    emu::mbar_init(bar, count);
#else
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#endif
}
// Makes the initialised barriers visible to the asynchronous proxy (TMA) and the other threads
// (with the __syncthreads that follows it).
__device__ __forceinline__ void mbar_init_fence() {
#ifndef TANDEM_HOST_EMU
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(u64* bar) {
#ifdef TANDEM_HOST_EMU
    emu::mbar_arrive(bar, 0);
#else
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
#endif
}
// Arrives and adds `bytes` to the transactions the current phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(u64* bar, u32 bytes) {
#ifdef TANDEM_HOST_EMU
    emu::mbar_arrive(bar, (long)bytes);
#else
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#endif
}
// True once the phase of parity `parity` has completed.
__device__ __forceinline__ bool mbar_try_wait(u64* bar, u32 parity) {
#ifdef TANDEM_HOST_EMU
    return emu::mbar_try_wait_parity(bar, parity);
#else
    u32 ok;
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(ok) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    return ok != 0;
#endif
}
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
    while (!mbar_try_wait(bar, parity)) {
    }
}
// TMA: the box of `map` at (c0 inner, c1 outer) element coordinates into shared memory at dst
// (out-of-bounds elements as zeros); its bytes complete on `bar`.
__device__ __forceinline__ void tma_load_2d(void* dst, const TmaMap* map, int c0, int c1, u64* bar) {
#ifdef TANDEM_HOST_EMU
    emu::tma_load_2d(dst, map, c0, c1, bar);
#else
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(smem_u32(dst)), "l"(map), "r"(c0), "r"(c1), "r"(smem_u32(bar)) : "memory");
#endif
}
#endif
