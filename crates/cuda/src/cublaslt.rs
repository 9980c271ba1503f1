//! cuBLASLt, NVIDIA's GEMM library, loaded at run time through cudarc: an opt-in GEMM for the
//! projections (`TANDEM_CUDA_GEMM=cublaslt`, `--gemm cublaslt`) and the peer that `tandem bench
//! kernels` times our tile kernels against in the same process.
//!
//! One GEMM: `d [m, n] = a [m, k] · w [n, k]ᵀ`, a and w of one 16-bit type (bf16 or f16), f32
//! accumulate and f32 out, no bias, alpha 1 and beta 0, the first algorithm cuBLASLt's heuristic
//! offers for the shape (cached per shape), a workspace reserved once. In cuBLASLt's column-major
//! terms our row-major `w [n, k]` is a `k x n` matrix (ld k) taken transposed, `a` is `k x m`
//! (ld its row pitch), and `d` is `n x m` (ld n), which is `d [m, n]` row-major.
//!
//! Not batch-invariant: the heuristic picks an algorithm (tiles, split K) per m, so a row's bits
//! may depend on how many rows share its step; the kernels' contract (kernels/matmul.cu) does
//! not hold under this switch. Why it exists: speed now, and a measured peer.
//!
//! The library is `libcublasLt.so.13` of the CUDA install or the `nvidia-cublas` wheel
//! (`kernels/install-toolchain.sh --cublas`);
//! it is opened only when the switch asks, and its absence is then a load error naming it.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use tandem_core::Result;

use crate::buf::{need, CudaBuf, Elem};
use crate::device::CudaBackend;
use crate::error::{drv, err};
use crate::launch::i32_of;

/// The library file cudarc opens (among its candidates, this is the one the wheel ships).
pub const LIBRARY: &str = "libcublasLt.so.13";
/// Workspace bytes (NVIDIA's advice for Hopper is 32 MiB).
pub(crate) const WORKSPACE_BYTES: usize = 32 << 20;

/// What a missing library says: its name, and where it comes from.
pub(crate) fn missing_message() -> String {
    format!(
        "TANDEM_CUDA_GEMM=cublaslt (--gemm cublaslt) needs {LIBRARY}, which was not found on the loader path: \
         install the nvidia-cublas wheel (kernels/install-toolchain.sh --cublas pins it) and put its lib folder \
         (site-packages/nvidia/cu13/lib) on LD_LIBRARY_PATH"
    )
}

/// The shape of one GEMM, the key of the heuristic's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Shape {
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    bf16: bool,
}

/// An open cuBLASLt: its handle, its workspace and the algorithm chosen for each shape so far.
pub(crate) struct CublasLt {
    handle: sys::cublasLtHandle_t,
    workspace: Mutex<CudaSlice<u8>>,
    algos: Mutex<HashMap<Shape, sys::cublasLtMatmulAlgo_t>>,
}

// SAFETY: the handle is used under the backend's one stream, and cuBLASLt handles may be used
// from any thread; the workspace and the cache are behind locks.
unsafe impl Send for CublasLt {}
// SAFETY: as above.
unsafe impl Sync for CublasLt {}

impl Drop for CublasLt {
    fn drop(&mut self) {
        // SAFETY: the handle is ours and freed once.
        if let Err(e) = unsafe { lt::destroy_handle(self.handle) } {
            tracing::warn!("cublasLtDestroy: {e}");
        }
    }
}

/// The descriptors of one call, destroyed when dropped.
struct Descs {
    op: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `Descs::new` and is destroyed once; a null one
        // (creation failed part way) is skipped.
        unsafe {
            if !self.op.is_null() {
                let _ = lt::destroy_matmul_desc(self.op);
            }
            for l in [self.a, self.b, self.d] {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
        }
    }
}

fn lt_err(what: &str) -> impl Fn(lt::CublasError) -> tandem_core::Error + '_ {
    move |e| err(format!("cuBLASLt {what}: {e}"))
}

impl Descs {
    fn new(s: Shape) -> Result<Descs> {
        let mut d = Descs {
            op: std::ptr::null_mut(),
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
        };
        d.op = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F)
            .map_err(lt_err("matmul descriptor"))?;
        let trans: i32 = 1;
        // SAFETY: a live descriptor; the attribute is a 4-byte cublasOperation_t (1: transposed).
        unsafe {
            lt::set_matmul_desc_attribute(
                d.op,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&trans) as *const i32 as *const c_void,
                std::mem::size_of::<i32>(),
            )
        }
        .map_err(lt_err("TRANSA"))?;
        let t16 = if s.bf16 { sys::cudaDataType::CUDA_R_16BF } else { sys::cudaDataType::CUDA_R_16F };
        d.a = lt::create_matrix_layout(t16, s.k as u64, s.n as u64, s.k as i64).map_err(lt_err("layout of w"))?;
        d.b = lt::create_matrix_layout(t16, s.k as u64, s.m as u64, s.lda as i64).map_err(lt_err("layout of x"))?;
        d.d = lt::create_matrix_layout(sys::cudaDataType::CUDA_R_32F, s.n as u64, s.m as u64, s.n as i64)
            .map_err(lt_err("layout of out"))?;
        Ok(d)
    }
}

impl CublasLt {
    /// Opens the library on `stream`'s context and reserves the workspace; an error names the
    /// library when it is absent.
    pub(crate) fn open(stream: &Arc<CudaStream>) -> Result<CublasLt> {
        // SAFETY: only tries to dlopen the library and drops it again.
        if !unsafe { sys::is_culib_present() } {
            return Err(err(missing_message()));
        }
        // cudarc panics on a symbol the library lacks (one older than CUDA 13).
        let handle = std::panic::catch_unwind(lt::create_handle)
            .map_err(|_| err(format!("opening {LIBRARY} panicked: is it older than CUDA 13.0? (see stderr)")))?
            .map_err(lt_err("cublasLtCreate"))?;
        // SAFETY: cuBLASLt writes the workspace before it reads it.
        let workspace = match unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) } {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: the handle just created, not used again.
                let _ = unsafe { lt::destroy_handle(handle) };
                return Err(drv(&format!("cuBLASLt workspace of {WORKSPACE_BYTES} bytes"))(e));
            }
        };
        Ok(CublasLt { handle, workspace: Mutex::new(workspace), algos: Mutex::new(HashMap::new()) })
    }

    /// Queues `d [m, n] f32 = a [m, k] · w [n, k]ᵀ` on `stream`: `a` (row pitch `lda` elements)
    /// and `w` of one 16-bit type (`bf16`, else f16), device addresses.
    ///
    /// # Safety
    /// `a` holds m rows of `lda >= k` elements, `w` n x k, `d` m x n floats, all live on
    /// `stream`'s context until the work is done.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn gemm(
        &self,
        stream: &CudaStream,
        bf16: bool,
        a: u64,
        lda: usize,
        w: u64,
        d: u64,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        let s = Shape { m, n, k, lda, bf16 };
        let descs = Descs::new(s)?;
        let mut ws = self.workspace.lock().map_err(|_| err("cuBLASLt workspace lock poisoned"))?;
        let algo = {
            let mut algos = self.algos.lock().map_err(|_| err("cuBLASLt algorithm cache lock poisoned"))?;
            match algos.get(&s) {
                Some(a) => *a,
                None => {
                    let pref = lt::create_matmul_pref().map_err(lt_err("preference"))?;
                    let bytes = WORKSPACE_BYTES as u64;
                    let set = lt::set_matmul_pref_attribute(
                        pref,
                        sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                        (&bytes) as *const u64 as *const c_void,
                        std::mem::size_of::<u64>(),
                    );
                    let h = set.and_then(|()| {
                        lt::get_matmul_algo_heuristic(self.handle, descs.op, descs.a, descs.b, descs.d, descs.d, pref)
                    });
                    let _ = lt::destroy_matmul_pref(pref);
                    let h = h.map_err(|e| err(format!("cuBLASLt has no algorithm for m {m}, n {n}, k {k}: {e}")))?;
                    algos.insert(s, h.algo);
                    h.algo
                }
            }
        };
        let (one, zero) = (1.0f32, 0.0f32);
        let (wsp, _g) = ws.device_ptr_mut(stream);
        lt::matmul(
            self.handle,
            descs.op,
            (&one) as *const f32 as *const c_void,
            (&zero) as *const f32 as *const c_void,
            w as *const c_void,
            descs.a,
            a as *const c_void,
            descs.b,
            d as *const c_void,
            descs.d,
            d as *mut c_void,
            descs.d,
            &algo,
            wsp as *mut c_void,
            WORKSPACE_BYTES,
            stream.cu_stream() as sys::cudaStream_t,
        )
        .map_err(lt_err("matmul"))
    }
}

impl CudaBackend {
    /// One plain projection through cuBLASLt (`TANDEM_CUDA_GEMM=cublaslt`): x [m, k] f32 or
    /// of w's 16-bit type, w [n, k] 16-bit, out [m, n] f32. An f32 x is first rounded to w's
    /// type by matmul_x (the same rounding our tile kernels apply to it), into the matmul
    /// scratch.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn cublaslt_gemm(
        &self,
        lt: &CublasLt,
        op: &str,
        x: &CudaBuf,
        w: &CudaBuf,
        out: &mut CudaBuf,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        let bf16 = match w.elem {
            Elem::BF16 => true,
            Elem::F16 => false,
            e => return Err(err(format!("{op}: cuBLASLt takes bf16 or f16 weights, not {e:?}"))),
        };
        need(w, w.elem, n * k, op, "w")?;
        need(out, Elem::F32, m * n, op, "out")?;
        let (mi, ki) = (i32_of(m, op, "m")?, i32_of(k, op, "k")?);
        let d = out.mem.device_ptr(&self.stream).0;
        let wp = w.mem.device_ptr(&self.stream).0;
        if x.elem != Elem::F32 {
            if x.elem != w.elem {
                return Err(err(format!("{op}: x holds {:?}, w {:?}", x.elem, w.elem)));
            }
            need(x, w.elem, m * k, op, "x")?;
            let xp = x.mem.device_ptr(&self.stream).0;
            // SAFETY: sizes checked above; every buffer lives on this backend's stream.
            return unsafe { lt.gemm(&self.stream, bf16, xp, k, wp, d, m, n, k) };
        }
        need(x, Elem::F32, m * k, op, "x")?;
        let kp = k.div_ceil(8) * 8;
        let kpi = i32_of(m * kp, op, "m*kp").and(i32_of(kp, op, "kp"))?;
        let mut s =
            self.mm_scratch.lock().map_err(|_| err(format!("{op}: scratch lock poisoned by an earlier panic")))?;
        let bytes = m * kp * 2;
        if s.xa.as_ref().is_none_or(|b| b.len() < bytes) {
            if s.fixed {
                return Err(err(format!("{op}: m = {m}, k = {k} need {bytes} bytes of x scratch, beyond the workspace reserved at load (max_num_batched_tokens?)")));
            }
            // SAFETY: matmul_x writes every element cuBLASLt reads (k of each kp-wide row).
            s.xa = Some(
                unsafe { self.stream.alloc::<u8>(bytes) }.map_err(drv(&format!("{op}: x scratch of {bytes} bytes")))?,
            );
        }
        let Some(xa) = s.xa.as_mut() else {
            return Err(err(format!("{op}: x scratch missing after allocation")));
        };
        let kern = &self.kernels.matmul_x[usize::from(!bf16)];
        let mut l = self.launch_args(&kern.f);
        l.arg(&*x.mem).arg(&mut *xa).arg(&mi).arg(&ki).arg(&kpi);
        // SAFETY: x holds m * k floats, xa m * kp 16-bit values (both checked above).
        let r = unsafe { l.launch(crate::launch::cfg((mi as u32, 1, 1), 256)) };
        self.launched(kern.name, r)?;
        let xp = xa.device_ptr(&self.stream).0;
        // SAFETY: xa holds m rows of kp >= k elements of w's type; sizes checked above.
        unsafe { lt.gemm(&self.stream, bf16, xp, kp, wp, d, m, n, k) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error a missing library gives names the library and the wheel it comes from.
    #[test]
    fn missing_library_is_named() {
        let m = missing_message();
        assert!(
            m.contains("libcublasLt.so.13") && m.contains("nvidia-cublas") && m.contains("TANDEM_CUDA_GEMM"),
            "{m}"
        );
    }
}
