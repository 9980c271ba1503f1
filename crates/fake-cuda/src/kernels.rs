//! The kernels compiled for the host (build.rs: every kernels/*.cu with the emulator, and a
//! table per file from crates/fake-cuda/cpp/thunk.h): name, signature, thunk.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

/// cpp/thunk.h `fake::Launch`.
#[repr(C)]
pub struct LaunchArgs {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub smem: u32,
    pub block_order_seed: u64,
    pub params: *const *const c_void,
    /// Programmatic dependent launch: runs the primary grid from inside this one (thunk.h).
    pub pdl_primary: Option<unsafe extern "C" fn(*mut c_void)>,
    pub pdl_arg: *mut c_void,
    pub pdl_late: u32,
    pub pdl_ran_late: *mut u32,
    pub pdl_waits: *mut u64,
}

/// cpp/thunk.h `fake::Kernel`.
#[repr(C)]
pub struct KernelEntry {
    name: *const c_char,
    sig: *const c_char,
    sizes: *const u32,
    ptrs: *const u32,
    nptrs: u32,
    run: unsafe extern "C" fn(*const LaunchArgs),
}

include!(concat!(env!("OUT_DIR"), "/tables.rs"));

/// A kernel of the host build.
#[derive(Clone, Copy)]
pub struct HostKernel {
    pub file: &'static str,
    /// One letter a parameter: p pointer, i 32-bit integer, l 64-bit integer, f float,
    /// s a struct by value.
    pub sig: &'static [u8],
    /// Bytes of each parameter.
    pub sizes: &'static [u32],
    /// (parameter, byte offset) of each device pointer among the arguments.
    pub pointers: &'static [[u32; 2]],
    run: unsafe extern "C" fn(*const LaunchArgs),
}

impl HostKernel {
    /// Runs the kernel on the emulator: every block, one after another, before returning.
    ///
    /// # Safety
    /// `a.params` holds one pointer per parameter to bytes of its size; the pointers the
    /// kernel dereferences are valid for what it does with them.
    pub unsafe fn run(&self, a: &LaunchArgs) {
        (self.run)(a)
    }
}

// SAFETY: the table is static data and functions.
unsafe impl Send for HostKernel {}
unsafe impl Sync for HostKernel {}

/// Every kernel of the host build by name.
pub fn all() -> &'static HashMap<&'static str, HostKernel> {
    static ALL: OnceLock<HashMap<&'static str, HostKernel>> = OnceLock::new();
    ALL.get_or_init(|| {
        let mut m = HashMap::new();
        for (file, table) in TABLES {
            let mut n: std::ffi::c_ulong = 0;
            // SAFETY: the generated table functions return a static array of `n` entries.
            let entries = unsafe { std::slice::from_raw_parts(table(&mut n), n as usize) };
            for e in entries {
                // SAFETY: string literals of the generated tables.
                let (name, sig) = unsafe { (CStr::from_ptr(e.name), CStr::from_ptr(e.sig)) };
                let name = name.to_str().expect("ASCII kernel name");
                let sig = sig.to_bytes();
                // SAFETY: the generated arrays: a size per parameter, two words per pointer.
                let (sizes, pointers) = unsafe {
                    (
                        std::slice::from_raw_parts(e.sizes, sig.len()),
                        std::slice::from_raw_parts(e.ptrs as *const [u32; 2], e.nptrs as usize),
                    )
                };
                m.insert(name, HostKernel { file, sig, sizes, pointers, run: e.run });
            }
        }
        m
    })
}
