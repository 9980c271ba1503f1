//! A fake cuBLASLt: the entry points crates/cuda's cublaslt.rs calls (handle, matmul and
//! layout descriptors, preference, the heuristic, `cublasLtMatmul`), exported by this same
//! library so that `libcublasLt.so.13` can be a link to it (`cargo xtask fake-cuda` makes one)
//! and share the fake device's memory and streams.
//!
//! `cublasLtMatmul` queues a GEMM on the stream like a launch; when it runs, it computes
//! `D = alpha op(A) op(B) + beta C` on the CPU from the fake device memory: column-major
//! operands as cuBLASLt's, A and B bf16 or f16 (one type), C and D f32, f32 compute and scale,
//! each dot product summed in f32 in ascending k (a different order from our kernels' and from
//! NVIDIA's, so only close to them). Every operand must lie inside one live device allocation
//! when it runs, else the sticky CUDA_ERROR_ILLEGAL_ADDRESS, as a kernel's. Anything it does
//! not model (an epilogue, a pointer mode, a scale type, another data type) is
//! CUBLAS_STATUS_NOT_SUPPORTED with a message on stderr.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use cudarc::cublaslt::sys::{
    cublasComputeType_t, cublasLtHandle_t, cublasLtMatmulAlgo_t, cublasLtMatmulDescAttributes_t as DescAttr,
    cublasLtMatmulDesc_t, cublasLtMatmulHeuristicResult_t, cublasLtMatmulPreferenceAttributes_t as PrefAttr,
    cublasLtMatmulPreference_t, cublasLtMatrixLayout_t, cublasStatus_t as S, cudaDataType, cudaStream_t,
};
use cudarc::driver::sys::CUresult;

use crate::memory::Memory;
use crate::state::{fail, with, Op, Res};

/// A matrix layout: element type and column-major rows, columns and leading dimension.
#[derive(Clone, Copy, Debug)]
struct Layout {
    dtype: cudaDataType,
    rows: u64,
    cols: u64,
    ld: i64,
}

/// A matmul descriptor: what the fake models of it.
#[derive(Clone, Copy, Debug)]
struct Desc {
    compute: cublasComputeType_t,
    scale: cudaDataType,
    trans_a: bool,
    trans_b: bool,
}

/// The tag of the one algorithm the fake heuristic offers (its first word).
const ALGO_TAG: u64 = 0x7a6e_6466_616b_6531;

fn refuse(status: S, msg: &str) -> S {
    eprintln!("fake-cublaslt: {msg} ({status:?})");
    status
}

unsafe fn boxed<T>(out: *mut *mut c_void, v: T) -> S {
    if out.is_null() {
        return refuse(S::CUBLAS_STATUS_INVALID_VALUE, "a null output pointer");
    }
    *out = Box::into_raw(Box::new(v)) as *mut c_void;
    S::CUBLAS_STATUS_SUCCESS
}

unsafe fn unbox<T>(p: *mut c_void) -> S {
    if p.is_null() {
        return refuse(S::CUBLAS_STATUS_INVALID_VALUE, "destroy of a null descriptor");
    }
    drop(Box::from_raw(p as *mut T));
    S::CUBLAS_STATUS_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtCreate(handle: *mut cublasLtHandle_t) -> S {
    boxed(handle as *mut *mut c_void, ALGO_TAG)
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtDestroy(handle: cublasLtHandle_t) -> S {
    unbox::<u64>(handle as *mut c_void)
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixLayoutCreate(
    layout: *mut cublasLtMatrixLayout_t,
    dtype: cudaDataType,
    rows: u64,
    cols: u64,
    ld: i64,
) -> S {
    if ld < rows.max(1) as i64 {
        return refuse(S::CUBLAS_STATUS_INVALID_VALUE, &format!("layout {rows} x {cols} with ld {ld} < rows"));
    }
    boxed(layout as *mut *mut c_void, Layout { dtype, rows, cols, ld })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixLayoutDestroy(layout: cublasLtMatrixLayout_t) -> S {
    unbox::<Layout>(layout as *mut c_void)
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulDescCreate(
    desc: *mut cublasLtMatmulDesc_t,
    compute: cublasComputeType_t,
    scale: cudaDataType,
) -> S {
    boxed(desc as *mut *mut c_void, Desc { compute, scale, trans_a: false, trans_b: false })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulDescDestroy(desc: cublasLtMatmulDesc_t) -> S {
    unbox::<Desc>(desc as *mut c_void)
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulDescSetAttribute(
    desc: cublasLtMatmulDesc_t,
    attr: DescAttr,
    buf: *const c_void,
    size: usize,
) -> S {
    if desc.is_null() || buf.is_null() || size != 4 {
        return refuse(
            S::CUBLAS_STATUS_INVALID_VALUE,
            &format!("matmul descriptor attribute {attr:?} of {size} bytes"),
        );
    }
    let d = &mut *(desc as *mut Desc);
    let v = *(buf as *const i32);
    match (attr, v) {
        (DescAttr::CUBLASLT_MATMUL_DESC_TRANSA, 0 | 1) => d.trans_a = v == 1,
        (DescAttr::CUBLASLT_MATMUL_DESC_TRANSB, 0 | 1) => d.trans_b = v == 1,
        _ => return refuse(S::CUBLAS_STATUS_NOT_SUPPORTED, &format!("matmul descriptor attribute {attr:?} = {v}")),
    }
    S::CUBLAS_STATUS_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulPreferenceCreate(pref: *mut cublasLtMatmulPreference_t) -> S {
    boxed(pref as *mut *mut c_void, 0u64)
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulPreferenceDestroy(pref: cublasLtMatmulPreference_t) -> S {
    unbox::<u64>(pref as *mut c_void)
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulPreferenceSetAttribute(
    pref: cublasLtMatmulPreference_t,
    attr: PrefAttr,
    buf: *const c_void,
    size: usize,
) -> S {
    if pref.is_null() || buf.is_null() || attr != PrefAttr::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES || size != 8 {
        return refuse(S::CUBLAS_STATUS_NOT_SUPPORTED, &format!("preference attribute {attr:?} of {size} bytes"));
    }
    *(pref as *mut u64) = *(buf as *const u64);
    S::CUBLAS_STATUS_SUCCESS
}

/// The operands' shapes as the descriptors give them, checked: (M, N, K) of op(A) M x K,
/// op(B) K x N, C and D M x N.
unsafe fn shapes(
    desc: cublasLtMatmulDesc_t,
    a: cublasLtMatrixLayout_t,
    b: cublasLtMatrixLayout_t,
    c: cublasLtMatrixLayout_t,
    d: cublasLtMatrixLayout_t,
) -> Result<(Desc, [Layout; 4], u64, u64, u64), S> {
    if [desc as usize, a as usize, b as usize, c as usize, d as usize].contains(&0) {
        return Err(refuse(S::CUBLAS_STATUS_INVALID_VALUE, "a null descriptor"));
    }
    let ds = *(desc as *const Desc);
    let l = [*(a as *const Layout), *(b as *const Layout), *(c as *const Layout), *(d as *const Layout)];
    if ds.compute != cublasComputeType_t::CUBLAS_COMPUTE_32F || ds.scale != cudaDataType::CUDA_R_32F {
        return Err(refuse(S::CUBLAS_STATUS_NOT_SUPPORTED, &format!("compute {:?}, scale {:?}", ds.compute, ds.scale)));
    }
    let ab = l[0].dtype;
    if !matches!(ab, cudaDataType::CUDA_R_16BF | cudaDataType::CUDA_R_16F)
        || l[1].dtype != ab
        || l[2].dtype != cudaDataType::CUDA_R_32F
        || l[3].dtype != cudaDataType::CUDA_R_32F
    {
        return Err(refuse(
            S::CUBLAS_STATUS_NOT_SUPPORTED,
            &format!("types A {:?}, B {:?}, C {:?}, D {:?}", l[0].dtype, l[1].dtype, l[2].dtype, l[3].dtype),
        ));
    }
    let (m, ka) = if ds.trans_a { (l[0].cols, l[0].rows) } else { (l[0].rows, l[0].cols) };
    let (kb, n) = if ds.trans_b { (l[1].cols, l[1].rows) } else { (l[1].rows, l[1].cols) };
    if ka != kb || (l[2].rows, l[2].cols) != (m, n) || (l[3].rows, l[3].cols) != (m, n) {
        return Err(refuse(
            S::CUBLAS_STATUS_INVALID_VALUE,
            &format!("shapes do not chain: op(A) {m} x {ka}, op(B) {kb} x {n}, C {:?}, D {:?}", l[2], l[3]),
        ));
    }
    Ok((ds, l, m, n, ka))
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulAlgoGetHeuristic(
    _handle: cublasLtHandle_t,
    desc: cublasLtMatmulDesc_t,
    a: cublasLtMatrixLayout_t,
    b: cublasLtMatrixLayout_t,
    c: cublasLtMatrixLayout_t,
    d: cublasLtMatrixLayout_t,
    _pref: cublasLtMatmulPreference_t,
    requested: c_int,
    results: *mut cublasLtMatmulHeuristicResult_t,
    count: *mut c_int,
) -> S {
    if let Err(s) = shapes(desc, a, b, c, d) {
        return s;
    }
    if requested < 1 || results.is_null() || count.is_null() {
        return refuse(S::CUBLAS_STATUS_INVALID_VALUE, "heuristic with no room for a result");
    }
    let mut algo = cublasLtMatmulAlgo_t { data: [0; 8] };
    algo.data[0] = ALGO_TAG;
    results.write(cublasLtMatmulHeuristicResult_t {
        algo,
        workspaceSize: 0,
        state: S::CUBLAS_STATUS_SUCCESS,
        wavesCount: 1.0,
        reserved: [0; 4],
    });
    *count = 1;
    S::CUBLAS_STATUS_SUCCESS
}

/// One queued GEMM: its operands' addresses and layouts, the scalars read at the call.
pub struct Gemm {
    desc: Desc,
    layouts: [Layout; 4],
    ptrs: [usize; 4],
    alpha: f32,
    beta: f32,
    mnk: (u64, u64, u64),
}

fn bf16_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

fn f16_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let e = ((h >> 10) & 0x1f) as i32;
    let f = (h & 0x3ff) as f32;
    match e {
        0 => sign * f * 2f32.powi(-24),
        31 if f == 0.0 => sign * f32::INFINITY,
        31 => f32::NAN,
        _ => sign * (1.0 + f / 1024.0) * 2f32.powi(e - 15),
    }
}

impl Gemm {
    /// The bytes a column-major operand spans.
    fn span(l: &Layout) -> usize {
        let es = if l.dtype == cudaDataType::CUDA_R_32F { 4 } else { 2 };
        if l.rows == 0 || l.cols == 0 {
            return 0;
        }
        (((l.cols - 1) * l.ld as u64 + l.rows) as usize) * es
    }

    /// Runs the GEMM on the fake device memory.
    pub fn run(&self, mem: &Memory) -> Res<()> {
        for (i, name) in ["A", "B", "C", "D"].into_iter().enumerate() {
            if i == 2 && self.beta == 0.0 {
                continue;
            }
            let (n, p) = (Self::span(&self.layouts[i]), self.ptrs[i]);
            if n > 0 && !mem.device_range(p, n) {
                return Err(fail(
                    CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
                    &format!("cublasLtMatmul: {name} ({n} bytes at {p:#x}) is not inside one live device allocation"),
                ));
            }
        }
        let (m, n, k) = (self.mnk.0 as usize, self.mnk.1 as usize, self.mnk.2 as usize);
        let [la, lb, lc, ld] = self.layouts;
        let conv: fn(u16) -> f32 = if la.dtype == cudaDataType::CUDA_R_16BF { bf16_f32 } else { f16_f32 };
        let (a, b) = (self.ptrs[0] as *const u16, self.ptrs[1] as *const u16);
        // op(A)(i, p) and op(B)(p, j) in column-major storage.
        let at = |i: usize, p: usize| -> usize {
            if self.desc.trans_a {
                p + i * la.ld as usize
            } else {
                i + p * la.ld as usize
            }
        };
        let bt = |p: usize, j: usize| -> usize {
            if self.desc.trans_b {
                j + p * lb.ld as usize
            } else {
                p + j * lb.ld as usize
            }
        };
        let c = self.ptrs[2] as *const f32;
        let d = self.ptrs[3] as *mut f32;
        for j in 0..n {
            for i in 0..m {
                let mut acc = 0.0f32;
                for p in 0..k {
                    // SAFETY: every index lies inside the operand spans checked above.
                    acc += unsafe { conv(*a.add(at(i, p))) * conv(*b.add(bt(p, j))) };
                }
                let mut v = self.alpha * acc;
                if self.beta != 0.0 {
                    // SAFETY: C's span was checked above.
                    v += self.beta * unsafe { *c.add(i + j * lc.ld as usize) };
                }
                // SAFETY: D's span was checked above.
                unsafe { *d.add(i + j * ld.ld as usize) = v };
            }
        }
        Ok(())
    }
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmul(
    _handle: cublasLtHandle_t,
    desc: cublasLtMatmulDesc_t,
    alpha: *const c_void,
    a: *const c_void,
    a_desc: cublasLtMatrixLayout_t,
    b: *const c_void,
    b_desc: cublasLtMatrixLayout_t,
    beta: *const c_void,
    c: *const c_void,
    c_desc: cublasLtMatrixLayout_t,
    d: *mut c_void,
    d_desc: cublasLtMatrixLayout_t,
    algo: *const cublasLtMatmulAlgo_t,
    _workspace: *mut c_void,
    _workspace_bytes: usize,
    stream: cudaStream_t,
) -> S {
    let (ds, layouts, m, n, k) = match shapes(desc, a_desc, b_desc, c_desc, d_desc) {
        Ok(v) => v,
        Err(s) => return s,
    };
    if alpha.is_null() || beta.is_null() {
        return refuse(S::CUBLAS_STATUS_INVALID_VALUE, "null alpha or beta");
    }
    if !algo.is_null() && (*algo).data[0] != ALGO_TAG {
        return refuse(S::CUBLAS_STATUS_INVALID_VALUE, "an algorithm the heuristic did not give");
    }
    let g = Gemm {
        desc: ds,
        layouts,
        ptrs: [a as usize, b as usize, c as usize, d as usize],
        alpha: *(alpha as *const f32),
        beta: *(beta as *const f32),
        mnk: (m, n, k),
    };
    match with(|s| s.enqueue(stream as usize, Op::Gemm(Arc::new(g)))) {
        Ok(()) => S::CUBLAS_STATUS_SUCCESS,
        Err(e) => refuse(S::CUBLAS_STATUS_EXECUTION_FAILED, &format!("queueing the GEMM: {e:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f16 decoding of normal, subnormal and special values.
    #[test]
    fn f16_decodes() {
        assert_eq!(f16_f32(0x3c00), 1.0);
        assert_eq!(f16_f32(0xc000), -2.0);
        assert_eq!(f16_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_f32(0x7bff), 65504.0);
        assert_eq!(f16_f32(0x7c00), f32::INFINITY);
        assert!(f16_f32(0x7e00).is_nan());
        assert_eq!(bf16_f32(0x3f80), 1.0);
    }
}
