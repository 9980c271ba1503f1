//! Kernel launches, with programmatic dependent launch (PDL) when asked for.
//!
//! `TANDEM_CUDA_PDL=1` on an sm_90+ GPU: the kernels of the files in [`PDL_FILES`] (each calls
//! `PDL_WAIT()` in every thread before it touches memory an earlier kernel writes or reads, and
//! `PDL_LAUNCH_DEPENDENTS()` after it: kernels/common.cuh, kernels/README.md "Programmatic
//! dependent launch") are launched with cuLaunchKernelEx and the
//! programmatic-stream-serialization attribute, so a kernel's blocks may start (and, in the
//! decode GEMMs, stream their first weights) while the previous kernel drains. Stream capture
//! records the attribute as a programmatic edge of the graph. Every other launch, and every
//! launch with the switch off (the default), is the plain cuLaunchKernel it always was.
//!
//! [`Launch`] is cudarc's `LaunchArgs` with that one choice added (cudarc 0.19 launches only
//! through cuLaunchKernel): the same `.arg(..)` chain and `launch(cfg)`. The backend disables
//! cudarc's event tracking, so there are no per-buffer events to wait for or record here.

use std::ffi::c_void;
use std::marker::PhantomData;

use cudarc::driver::sys;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DriverError, LaunchConfig,
};

/// The kernel files whose every kernel waits before it reads (kernels/*.cu stems). Not
/// sampling.cu, moe.cu, matmul_sm90.cu and paged_attention_sm90.cu: their kernels are launched
/// plain, which is always correct (a plain launch waits for everything before it).
pub(crate) const PDL_FILES: &[&str] = &[
    "add",
    "argmax",
    "embedding",
    "gather_rows",
    "kv_write",
    "matmul",
    "paged_attention",
    "rms_norm",
    "rope",
    "silu_mul",
];

/// `TANDEM_CUDA_PDL`: unset, empty or `0` off (the default); `1` on. Anything else is an error,
/// not a silent default.
pub(crate) fn parse_pdl(v: Option<&str>) -> std::result::Result<bool, String> {
    match v.map(str::trim) {
        None | Some("") | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(format!("TANDEM_CUDA_PDL={v:?}: expected 0 or 1")),
    }
}

/// One kernel argument as the driver takes it: a pointer to its bytes, or a device pointer
/// kept here until the launch.
pub(crate) enum Param {
    Ref(*const c_void),
    Dev(u64),
}

/// Plain values passed by reference ([`Launch::arg`]): scalars and the `#[repr(C)]` argument
/// structs of the kernels.
pub(crate) trait Plain {}
macro_rules! plain {
    ($($t:ty),*) => { $(impl Plain for $t {})* };
}
plain!(u8, u16, u32, i32, u64, i64, usize, f32, f64);

/// What [`Launch::arg`] takes: a reference to a [`Plain`] value, or a device buffer.
pub(crate) trait KernelArg<'a> {
    fn param(self, stream: &CudaStream) -> Param;
}
impl<'a, T: Plain> KernelArg<'a> for &'a T {
    fn param(self, _: &CudaStream) -> Param {
        Param::Ref(self as *const T as *const c_void)
    }
}
impl<'a, T> KernelArg<'a> for &'a CudaSlice<T> {
    fn param(self, stream: &CudaStream) -> Param {
        Param::Dev(self.device_ptr(stream).0)
    }
}
impl<'a, T> KernelArg<'a> for &'a mut CudaSlice<T> {
    fn param(self, stream: &CudaStream) -> Param {
        Param::Dev(self.device_ptr_mut(stream).0)
    }
}
impl<'a, 'b: 'a, T> KernelArg<'a> for &'a CudaView<'b, T> {
    fn param(self, stream: &CudaStream) -> Param {
        Param::Dev(self.device_ptr(stream).0)
    }
}
impl<'a, 'b: 'a, T> KernelArg<'a> for &'a mut CudaViewMut<'b, T> {
    fn param(self, stream: &CudaStream) -> Param {
        Param::Dev(self.device_ptr_mut(stream).0)
    }
}

/// A launch being built: `.arg(..)` per kernel parameter in order, then [`Launch::launch`].
pub(crate) struct Launch<'a> {
    stream: &'a CudaStream,
    func: &'a CudaFunction,
    pdl: bool,
    params: Vec<Param>,
    _args: PhantomData<&'a ()>,
}

impl<'a> Launch<'a> {
    /// `pdl`: launch with the programmatic-stream-serialization attribute (the caller checked
    /// the switch, the GPU and that `func`'s file waits: [`PDL_FILES`]).
    pub(crate) fn new(stream: &'a CudaStream, func: &'a CudaFunction, pdl: bool) -> Self {
        Launch { stream, func, pdl, params: Vec::with_capacity(24), _args: PhantomData }
    }

    pub(crate) fn arg<A: KernelArg<'a>>(&mut self, a: A) -> &mut Self {
        let p = a.param(self.stream);
        self.params.push(p);
        self
    }

    /// Submits the kernel to the stream.
    ///
    /// # Safety
    /// As cudarc's `LaunchArgs::launch`: the arguments match the kernel's parameters in number,
    /// order and type, and the kernel stays inside the buffers it is given.
    pub(crate) unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), DriverError> {
        self.stream.context().bind_to_thread()?;
        // Device pointers get their own slots, fixed before any address of them is taken.
        let devs: Vec<u64> = self.params.iter().map(|p| if let Param::Dev(d) = p { *d } else { 0 }).collect();
        let mut ptrs: Vec<*mut c_void> = self
            .params
            .iter()
            .zip(&devs)
            .map(|(p, d)| match p {
                Param::Ref(r) => *r as *mut c_void,
                Param::Dev(_) => d as *const u64 as *mut c_void,
            })
            .collect();
        let f = self.func.cu_function();
        if !self.pdl {
            return cudarc::driver::result::launch_kernel(
                f,
                cfg.grid_dim,
                cfg.block_dim,
                cfg.shared_mem_bytes,
                self.stream.cu_stream(),
                &mut ptrs,
            );
        }
        // SAFETY: a plain C struct and union; every field read below is set.
        let mut attr: sys::CUlaunchAttribute = std::mem::zeroed();
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let lc = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        sys::cuLaunchKernelEx(&lc, f, ptrs.as_mut_ptr(), std::ptr::null_mut()).result()
    }
}

pub(crate) fn i32_of(v: usize, op: &str, what: &str) -> tandem_core::Result<i32> {
    i32::try_from(v)
        .map_err(|_| crate::error::err(format!("{op}: {what} = {v} exceeds the kernels' 32-bit index range")))
}

pub(crate) fn u32_of(v: usize, op: &str, what: &str) -> tandem_core::Result<u32> {
    u32::try_from(v).map_err(|_| crate::error::err(format!("{op}: {what} = {v} exceeds a launch dimension")))
}

pub(crate) fn cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: grid, block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pdl_files_wait_in_every_kernel() {
        // Each listed file calls PDL_WAIT at least once per extern "C" kernel it defines (a
        // kernel defined by a macro counts once per use of the macro); the fake driver checks
        // at run time that a kernel launched with the attribute waited.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
        for f in PDL_FILES {
            let src = std::fs::read_to_string(dir.join(format!("{f}.cu"))).unwrap();
            assert!(src.contains("PDL_WAIT();"), "kernels/{f}.cu is in PDL_FILES but never calls PDL_WAIT()");
            assert!(src.contains("PDL_LAUNCH_DEPENDENTS();"), "kernels/{f}.cu never calls PDL_LAUNCH_DEPENDENTS()");
        }
        for f in ["sampling", "moe", "matmul_sm90", "paged_attention_sm90"] {
            assert!(!PDL_FILES.contains(&f), "{f}.cu's kernels do not wait: they must launch plain");
        }
    }

    #[test]
    fn switch_parses() {
        assert_eq!(parse_pdl(None), Ok(false));
        assert_eq!(parse_pdl(Some("0")), Ok(false));
        assert_eq!(parse_pdl(Some(" 1 ")), Ok(true));
        assert!(parse_pdl(Some("on")).unwrap_err().contains("expected 0 or 1"));
    }
}
