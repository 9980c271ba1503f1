//! The fake device's state, under one lock: memory, streams (each a queue of work that runs
//! when the host waits for it), events, modules, functions, captures and graphs, and the
//! sticky error after a fault.
//!
//! This file holds the state itself, the lock, memory and copies, and the device's answers;
//! the rest is one file a noun: `stream`, `event`, `module`, `launch`, `graph`,
//! `fault` (the handler that names a faulting kernel).

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUdevice_attribute_enum as A, CUresult};

use crate::memory::Memory;

mod event;
mod fault;
mod graph;
mod launch;
mod module;
mod stream;

pub use stream::Op;

use fault::install_fault_handler;
use module::Func;
use stream::{Src, Stream};

pub type Res<T> = Result<T, CUresult>;

/// Says why on stderr and returns `code`: every refusal of the fake driver is reported.
pub fn fail(code: CUresult, msg: &str) -> CUresult {
    eprintln!("fake-cuda: {msg} ({code:?})");
    code
}

/// The primary context's handle (the fake has one device and one context).
pub const CONTEXT: usize = 0xc0;

thread_local! {
    /// This thread's current context (0: none).
    pub static CURRENT: Cell<usize> = const { Cell::new(0) };
}

pub struct State {
    pub mem: Memory,
    pub ctx_refs: usize,
    sticky: Option<CUresult>,
    streams: HashMap<usize, Stream>,
    events: HashMap<usize, Option<(usize, u64)>>,
    modules: HashMap<usize, Vec<usize>>,
    funcs: HashMap<usize, Func>,
    graphs: HashMap<usize, Arc<Vec<Op>>>,
    execs: HashMap<usize, Arc<Vec<Op>>>,
    next_handle: usize,
    seed: u64,
    launches: u64,
    /// Graph replays alternate where the pairing of programmatic dependents starts.
    pdl_parity: u8,
    /// Kernels run as primary and programmatic dependent (`pdl_pairs`, for the tests' asserts).
    pub pdl_pairs: u64,
    /// `TANDEM_FAKE_CUDA_PDL_LATE=1`: the deliberate break of run_pair.
    pdl_late: bool,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// Runs `f` on the state under the lock (created on first use). A sticky error (a fault in
/// earlier work) fails every call after it, as a real context does.
pub fn with<T>(f: impl FnOnce(&mut State) -> Res<T>) -> Res<T> {
    let mut g = STATE.lock().unwrap_or_else(|p| p.into_inner());
    let s = g.get_or_insert_with(State::new);
    if let Some(e) = s.sticky {
        return Err(e);
    }
    f(s)
}

/// Whether this thread has the context current (the driver's calls need one).
pub fn need_context(what: &str) -> Res<()> {
    if CURRENT.with(|c| c.get()) == CONTEXT {
        Ok(())
    } else {
        Err(fail(CUresult::CUDA_ERROR_INVALID_CONTEXT, &format!("{what}: no current context on this thread")))
    }
}

fn env_usize(k: &str, default: usize) -> usize {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

impl State {
    fn new() -> State {
        if std::env::var_os("TANDEM_FAKE_CUDA_NO_HANDLER").is_none() {
            install_fault_handler();
        }
        let mut streams = HashMap::new();
        streams.insert(0, Stream::default()); // the legacy NULL stream
        State {
            mem: Memory::new(env_usize("TANDEM_FAKE_CUDA_MEMORY_MB", 1024) << 20),
            ctx_refs: 0,
            sticky: None,
            streams,
            events: HashMap::new(),
            modules: HashMap::new(),
            funcs: HashMap::new(),
            graphs: HashMap::new(),
            execs: HashMap::new(),
            next_handle: 0x1000,
            seed: env_usize("TANDEM_FAKE_CUDA_SEED", 0x7a6d) as u64,
            launches: 0,
            pdl_parity: 0,
            pdl_pairs: 0,
            pdl_late: std::env::var("TANDEM_FAKE_CUDA_PDL_LATE").is_ok_and(|v| v == "1"),
        }
    }

    fn handle(&mut self) -> usize {
        self.next_handle += 0x10;
        self.next_handle
    }

    // ---- memory ----------------------------------------------------------------------------

    pub fn alloc_device(&mut self, bytes: usize) -> Res<usize> {
        self.mem.alloc_device(bytes)
    }

    pub fn free_device_async(&mut self, base: usize, stream: usize) -> Res<()> {
        if self.mem.device_at(base).is_none_or(|r| r.base != base) {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                &format!("cuMemFreeAsync of {base:#x}: not a live device allocation"),
            ));
        }
        self.enqueue(stream, Op::Free { base })
    }

    pub fn free_device_now(&mut self, base: usize) -> Res<()> {
        self.mem.free_device(base)
    }

    pub fn alloc_host(&mut self, bytes: usize) -> Res<usize> {
        self.mem.alloc_host(bytes)
    }

    pub fn free_host(&mut self, base: usize) -> Res<()> {
        self.mem.free_host(base)
    }

    pub fn copy_htod(&mut self, dst: usize, src: usize, n: usize, stream: usize) -> Res<()> {
        let src = if self.mem.host_range(src, n) {
            Src::Pinned(src)
        } else {
            if self.streams.get(&stream).is_some_and(|s| s.capture.is_some()) {
                return self.enqueue(stream, Op::HtoD { dst, src: Src::Bytes(Arc::new(vec![])), n });
            }
            // Pageable memory: CUDA stages it before the call returns.
            // SAFETY: the caller's buffer of `n` bytes.
            Src::Bytes(Arc::new(unsafe { std::slice::from_raw_parts(src as *const u8, n) }.to_vec()))
        };
        self.enqueue(stream, Op::HtoD { dst, src, n })
    }

    pub fn copy_dtoh(&mut self, dst: usize, src: usize, n: usize, stream: usize) -> Res<()> {
        let pinned = self.mem.host_range(dst, n);
        self.enqueue(stream, Op::DtoH { dst, src, n, pinned })?;
        if !pinned {
            // To pageable memory the call returns once the copy is done.
            self.drain(stream)?;
        }
        Ok(())
    }
}

/// An H200's answers to the attributes the backend and cudarc ask; any other is refused.
pub fn device_attribute(a: i32) -> Res<i32> {
    let table: &[(A, i32)] = &[
        (A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64),
        (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, i32::MAX),
        (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535),
        (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535),
        (A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 48 * 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 227 * 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 228 * 1024),
        (A::CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32),
        (A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132),
        (A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048),
        (A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536),
        (A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9),
        (A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0),
        (A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1),
        (A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1),
        (A::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1),
        (A::CU_DEVICE_ATTRIBUTE_INTEGRATED, 0),
    ];
    table.iter().find(|(k, _)| *k as i32 == a).map(|(_, v)| *v).ok_or_else(|| {
        fail(
            CUresult::CUDA_ERROR_NOT_SUPPORTED,
            &format!("cuDeviceGetAttribute: attribute {a} is not modelled by the fake driver"),
        )
    })
}

/// (name, description) of a result code, as static C strings.
pub fn error_text(e: CUresult) -> (&'static std::ffi::CStr, &'static std::ffi::CStr) {
    static TEXTS: Mutex<Vec<(u32, &'static std::ffi::CStr, &'static std::ffi::CStr)>> = Mutex::new(Vec::new());
    let mut t = TEXTS.lock().unwrap_or_else(|p| p.into_inner());
    let code = e as u32;
    if let Some((_, n, d)) = t.iter().find(|(c, _, _)| *c == code) {
        return (n, d);
    }
    use CUresult::*;
    let desc = match e {
        CUDA_SUCCESS => "no error",
        CUDA_ERROR_INVALID_VALUE => "invalid argument",
        CUDA_ERROR_OUT_OF_MEMORY => "out of memory",
        CUDA_ERROR_INVALID_CONTEXT => "invalid device context",
        CUDA_ERROR_INVALID_HANDLE => "invalid resource handle",
        CUDA_ERROR_NOT_FOUND => "named symbol not found",
        CUDA_ERROR_ILLEGAL_ADDRESS => "an illegal memory access was encountered",
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES => "too many resources requested for launch",
        CUDA_ERROR_INVALID_PTX => "a PTX JIT compilation failed",
        CUDA_ERROR_NOT_SUPPORTED => "operation not supported",
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => "operation not permitted when stream is capturing",
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => "operation failed due to a previous error during capture",
        CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => {
            "attempt to terminate a thread-local capture sequence from another thread"
        }
        CUDA_ERROR_ILLEGAL_STATE => "the operation is not permitted in the current state",
        _ => "an error of the tandem fake CUDA driver",
    };
    let leak =
        |s: String| -> &'static std::ffi::CStr { Box::leak(CString::new(s).unwrap_or_default().into_boxed_c_str()) };
    let n = leak(format!("{e:?}"));
    let d = leak(desc.to_string());
    t.push((code, n, d));
    (n, d)
}
