//! The fake device's state, under one lock: memory, streams (each a queue of work that runs
//! when the host waits for it), events, modules, functions, captures and graphs, and the
//! sticky error after a fault.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use cudarc::driver::sys::{CUdevice_attribute_enum as A, CUresult};

use crate::kernels::{self, HostKernel, LaunchArgs};
use crate::memory::Memory;
use crate::ptx;

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

/// Work on a stream, or recorded in a graph.
#[derive(Clone)]
pub enum Op {
    Launch(Arc<Launch>),
    Memset {
        dst: usize,
        value: u8,
        n: usize,
    },
    /// From page-locked memory (read when the copy runs) or pageable memory (read at the call).
    HtoD {
        dst: usize,
        src: Src,
        n: usize,
    },
    /// To page-locked memory, or to pageable memory (the call waits for it).
    DtoH {
        dst: usize,
        src: usize,
        n: usize,
        pinned: bool,
    },
    DtoD {
        dst: usize,
        src: usize,
        n: usize,
    },
    Free {
        base: usize,
    },
    Record,
    /// Waits for the work of `stream` before `seq`.
    Wait {
        stream: usize,
        seq: u64,
    },
    Graph(Arc<Vec<Op>>),
}

#[derive(Clone)]
pub enum Src {
    Pinned(usize),
    Bytes(Arc<Vec<u8>>),
}

pub struct Launch {
    name: String,
    kernel: HostKernel,
    grid: [u32; 3],
    block: [u32; 3],
    smem: u32,
    seed: u64,
    /// Each argument's bytes, by value (in 8-byte words, zero-filled past its size).
    params: Vec<Vec<u64>>,
    /// Launched with the programmatic-stream-serialization attribute (cuLaunchKernelEx).
    pdl: bool,
}

impl Launch {
    fn pdl_after(op: &Op) -> Option<&Arc<Launch>> {
        match op {
            Op::Launch(l) if l.pdl => Some(l),
            _ => None,
        }
    }
}

/// A primary grid run from inside its dependent (cuda_emu.h `Pdl`).
struct Primary<'a> {
    kernel: HostKernel,
    args: LaunchArgs,
    _params: &'a [*const c_void],
}

unsafe extern "C" fn run_primary(p: *mut c_void) {
    // SAFETY: `p` is the `Primary` that run_pair keeps alive across the dependent's run.
    let p = &*(p as *const Primary);
    p.kernel.run(&p.args);
}

struct Capture {
    ops: Vec<Op>,
    invalid: Option<String>,
    thread: ThreadId,
    mode: i32,
}

#[derive(Default)]
struct Stream {
    queue: VecDeque<(u64, Op)>,
    next: u64,
    /// Every op before this sequence number has run.
    done: u64,
    capture: Option<Capture>,
}

struct Func {
    entry: ptx::Entry,
    kernel: Option<HostKernel>,
    max_dynamic_smem: usize,
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

const STATIC_SMEM_LIMIT: usize = 48 * 1024;
const OPTIN_SMEM_LIMIT: usize = 227 * 1024;

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// The kernel running now, for the fault handler (a NUL-terminated name, or null).
static RUNNING: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());

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

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49eb_1331_11eb);
    z ^ (z >> 31)
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

    // ---- streams ---------------------------------------------------------------------------

    pub fn new_stream(&mut self) -> usize {
        let id = self.handle();
        self.streams.insert(id, Stream::default());
        id
    }

    pub fn stream(&mut self, id: usize) -> Res<()> {
        if self.streams.contains_key(&id) {
            Ok(())
        } else {
            Err(fail(CUresult::CUDA_ERROR_INVALID_HANDLE, &format!("stream {id:#x} does not exist")))
        }
    }

    pub fn destroy_stream(&mut self, id: usize) -> Res<()> {
        if id == 0 {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy of the NULL stream"));
        }
        self.stream(id)?;
        if self.streams[&id].capture.is_some() {
            return Err(fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuStreamDestroy of a capturing stream"));
        }
        // Work queued on it still runs, as on a GPU.
        self.drain(id)?;
        self.streams.remove(&id);
        Ok(())
    }

    /// Queues `op` on `stream`, or records it where the stream is capturing.
    pub fn enqueue(&mut self, stream: usize, op: Op) -> Res<()> {
        self.stream(stream)?;
        let st = self.streams.get_mut(&stream).expect("checked");
        if let Some(c) = st.capture.as_mut() {
            let refused = match &op {
                Op::Launch(_) | Op::Memset { .. } | Op::DtoD { .. } => None,
                Op::HtoD { src: Src::Pinned(_), .. } => None,
                Op::HtoD { .. } => Some("a copy from pageable host memory"),
                Op::DtoH { .. } => Some("a copy to host memory"),
                Op::Free { .. } => Some("a free"),
                Op::Record | Op::Wait { .. } => Some("an event (not modelled in a capture)"),
                Op::Graph(_) => Some("a graph launch"),
            };
            if let Some(what) = refused {
                let msg = format!("{what} on stream {stream:#x} while it captures");
                c.invalid.get_or_insert(msg.clone());
                return Err(fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, &msg));
            }
            c.ops.push(op);
            return Ok(());
        }
        let seq = st.next;
        st.next += 1;
        st.queue.push_back((seq, op));
        Ok(())
    }

    /// Runs everything queued on `stream`.
    pub fn drain(&mut self, stream: usize) -> Res<()> {
        self.stream(stream)?;
        if self.streams[&stream].capture.is_some() {
            let msg = format!("synchronizing stream {stream:#x} while it captures");
            self.streams
                .get_mut(&stream)
                .and_then(|s| s.capture.as_mut())
                .map(|c| c.invalid.get_or_insert(msg.clone()));
            return Err(fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, &msg));
        }
        self.drain_to(stream, u64::MAX)
    }

    /// Runs the work of `stream` up to (not including) sequence number `until`.
    fn drain_to(&mut self, stream: usize, until: u64) -> Res<()> {
        loop {
            if let Some(e) = self.sticky {
                return Err(e);
            }
            let Some(st) = self.streams.get_mut(&stream) else { return Ok(()) }; // destroyed: its work ran
            match st.queue.front() {
                Some((seq, _)) if *seq < until => {}
                _ => return Ok(()),
            }
            let (mut seq, op) = st.queue.pop_front().expect("front checked");
            // A kernel followed by a programmatic dependent: the two run as a pair.
            let dependent = match (&op, st.queue.front()) {
                (Op::Launch(_), Some((next, d))) if *next < until => Launch::pdl_after(d).cloned(),
                _ => None,
            };
            if dependent.is_some() {
                seq = st.queue.pop_front().expect("front checked").0;
            }
            let r = match (&op, dependent) {
                (Op::Launch(p), Some(d)) => self.run_pair(p, &d),
                _ => self.execute(&op),
            };
            if let Some(st) = self.streams.get_mut(&stream) {
                st.done = seq + 1;
            }
            if let Err(e) = r {
                self.sticky = Some(e);
                for s in self.streams.values_mut() {
                    s.queue.clear();
                }
                return Err(e);
            }
        }
    }

    pub fn drain_all(&mut self) -> Res<()> {
        let ids: Vec<usize> = self.streams.keys().copied().collect();
        for id in ids {
            if self.streams.get(&id).is_some_and(|s| s.capture.is_none()) {
                self.drain_to(id, u64::MAX)?;
            }
        }
        Ok(())
    }

    fn execute(&mut self, op: &Op) -> Res<()> {
        let illegal = |msg: String| fail(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, &msg);
        match op {
            Op::Launch(l) => self.run(l),
            Op::Memset { dst, value, n } => {
                if !self.mem.device_range(*dst, *n) {
                    return Err(illegal(format!(
                        "memset of {n} bytes at {dst:#x}: not inside one live device allocation"
                    )));
                }
                // SAFETY: checked to lie inside a live mapping of ours.
                unsafe { std::ptr::write_bytes(*dst as *mut u8, *value, *n) };
                Ok(())
            }
            Op::HtoD { dst, src, n } => {
                if !self.mem.device_range(*dst, *n) {
                    return Err(illegal(format!(
                        "copy of {n} bytes to the device at {dst:#x}: not inside one live device allocation"
                    )));
                }
                match src {
                    Src::Pinned(p) => {
                        if !self.mem.host_range(*p, *n) {
                            return Err(illegal(format!(
                                "copy of {n} bytes from page-locked memory at {p:#x}, freed before the copy ran"
                            )));
                        }
                        // SAFETY: both ranges checked live.
                        unsafe { std::ptr::copy(*p as *const u8, *dst as *mut u8, *n) };
                    }
                    // SAFETY: the destination range is checked live; the bytes are ours.
                    Src::Bytes(b) => unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), *dst as *mut u8, *n) },
                }
                Ok(())
            }
            Op::DtoH { dst, src, n, pinned } => {
                if !self.mem.device_range(*src, *n) {
                    return Err(illegal(format!(
                        "copy of {n} bytes to the host from {src:#x}: not inside one live device allocation"
                    )));
                }
                if *pinned && !self.mem.host_range(*dst, *n) {
                    return Err(illegal(format!(
                        "copy of {n} bytes to page-locked memory at {dst:#x}, freed before the copy ran"
                    )));
                }
                // SAFETY: the source is checked live; the destination is page-locked memory
                // checked live, or pageable memory the caller is blocked on.
                unsafe { std::ptr::copy(*src as *const u8, *dst as *mut u8, *n) };
                Ok(())
            }
            Op::DtoD { dst, src, n } => {
                if !self.mem.device_range(*dst, *n) || !self.mem.device_range(*src, *n) {
                    return Err(illegal(format!(
                        "device copy of {n} bytes {src:#x} -> {dst:#x}: not inside live device allocations"
                    )));
                }
                // SAFETY: both ranges checked live.
                unsafe { std::ptr::copy(*src as *const u8, *dst as *mut u8, *n) };
                Ok(())
            }
            Op::Free { base } => self.mem.free_device(*base),
            Op::Record => Ok(()),
            Op::Wait { stream, seq } => self.drain_to(*stream, *seq + 1),
            Op::Graph(ops) => {
                // Kernels followed by programmatic dependents run as pairs (run_pair): from
                // the first kernel or the second, alternately, so that over replays every
                // edge of a chain of dependents is exercised.
                self.pdl_parity ^= 1;
                let mut i = 0;
                if self.pdl_parity == 1 && !ops.is_empty() {
                    self.execute(&ops[0])?;
                    i = 1;
                }
                while i < ops.len() {
                    match (&ops[i], ops.get(i + 1).and_then(Launch::pdl_after)) {
                        (Op::Launch(p), Some(d)) => {
                            self.run_pair(p, d)?;
                            i += 2;
                        }
                        (o, _) => {
                            self.execute(o)?;
                            i += 1;
                        }
                    }
                }
                Ok(())
            }
        }
    }

    fn run(&mut self, l: &Launch) -> Res<()> {
        self.check_pointers(l)?;
        let ptrs: Vec<*const c_void> = l.params.iter().map(|p| p.as_ptr() as *const c_void).collect();
        let mut waits = 0u64;
        let mut args = Self::args(l, &ptrs);
        args.pdl_waits = &mut waits;
        let name = CString::new(l.name.clone()).unwrap_or_default();
        RUNNING.store(name.as_ptr() as *mut u8, Ordering::SeqCst);
        // SAFETY: `params` holds one 8-byte slot per parameter of the kernel's signature, and
        // every pointer argument lies in a live allocation (its extent is the kernel's to keep).
        unsafe { l.kernel.run(&args) };
        RUNNING.store(std::ptr::null_mut(), Ordering::SeqCst);
        Self::check_waited(l, waits)
    }

    /// A kernel launched as a programmatic dependent that no thread waited in: on a GPU it may
    /// run beside its primary, reading what that has not written yet.
    fn check_waited(l: &Launch, waits: u64) -> Res<()> {
        if l.pdl && waits == 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_LAUNCH_FAILED,
                &format!("kernel {} was launched with programmatic stream serialization but no thread executed PDL_WAIT (griddepcontrol.wait)", l.name),
            ));
        }
        Ok(())
    }

    fn args(l: &Launch, ptrs: &[*const c_void]) -> LaunchArgs {
        LaunchArgs {
            grid: l.grid,
            block: l.block,
            smem: l.smem,
            block_order_seed: l.seed,
            params: ptrs.as_ptr(),
            pdl_primary: None,
            pdl_arg: std::ptr::null_mut(),
            pdl_late: 0,
            pdl_ran_late: std::ptr::null_mut(),
            pdl_waits: std::ptr::null_mut(),
        }
    }

    /// Kernel `p`, then `d` launched as its programmatic dependent, as the emulator models it
    /// (kernels/emu/cuda_emu.h `Pdl`): `d` runs first and `p` runs from inside it, once the
    /// first block of `d` is parked at PDL_WAIT; so a read of p's output above d's wait reads
    /// memory p has not written yet. `TANDEM_FAKE_CUDA_PDL_LATE=1` (a deliberate break): p runs
    /// after d's first block instead, as if d did not wait.
    fn run_pair(&mut self, p: &Launch, d: &Launch) -> Res<()> {
        self.check_pointers(p)?;
        self.check_pointers(d)?;
        let pp: Vec<*const c_void> = p.params.iter().map(|x| x.as_ptr() as *const c_void).collect();
        let dp: Vec<*const c_void> = d.params.iter().map(|x| x.as_ptr() as *const c_void).collect();
        let primary = Primary { kernel: p.kernel, args: Self::args(p, &pp), _params: &pp };
        let (mut ran_late, mut waits) = (0u32, 0u64);
        let mut args = Self::args(d, &dp);
        args.pdl_primary = Some(run_primary);
        args.pdl_arg = &primary as *const Primary as *mut c_void;
        args.pdl_late = self.pdl_late as u32;
        args.pdl_ran_late = &mut ran_late;
        args.pdl_waits = &mut waits;
        let name = CString::new(format!("{} (programmatic dependent of {})", d.name, p.name)).unwrap_or_default();
        RUNNING.store(name.as_ptr() as *mut u8, Ordering::SeqCst);
        // SAFETY: as in run, for both kernels; `primary` outlives the dependent's run.
        unsafe { d.kernel.run(&args) };
        RUNNING.store(std::ptr::null_mut(), Ordering::SeqCst);
        self.pdl_pairs += 1;
        if self.pdl_pairs == 1 {
            eprintln!(
                "fake-cuda: {} ran as a programmatic dependent of {} (first of such pairs; kernels/README.md)",
                d.name, p.name
            );
        }
        if ran_late != 0 && !self.pdl_late {
            return Err(fail(
                CUresult::CUDA_ERROR_LAUNCH_FAILED,
                &format!(
                    "kernel {} (a programmatic dependent of {}) finished a block without any thread at PDL_WAIT",
                    d.name, p.name
                ),
            ));
        }
        Self::check_waited(d, waits)
    }

    fn check_pointers(&self, l: &Launch) -> Res<()> {
        for &[i, off] in l.kernel.pointers {
            let words = &l.params[i as usize];
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            let p = u64::from_le_bytes(bytes[off as usize..off as usize + 8].try_into().expect("8 bytes")) as usize;
            if p != 0 && self.mem.device_at(p).is_none() {
                let host = if self.mem.host_range(p, 1) { " (page-locked host memory)" } else { "" };
                return Err(fail(
                    CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
                    &format!("kernel {} argument {i} (byte {off}): pointer {p:#x}{host} is not inside any live device allocation", l.name),
                ));
            }
        }
        Ok(())
    }

    /// The capture that makes a "potentially unsafe" call from this thread illegal: one in
    /// global mode, or in thread-local mode begun on this thread.
    pub fn refuse_while_capturing(&mut self, what: &str) -> Res<()> {
        let me = std::thread::current().id();
        for (id, s) in self.streams.iter_mut() {
            if let Some(c) = s.capture.as_mut() {
                if c.mode == 0 || (c.mode == 1 && c.thread == me) {
                    let msg = format!("{what} while stream {id:#x} captures (mode {})", c.mode);
                    c.invalid.get_or_insert(msg.clone());
                    return Err(fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, &msg));
                }
            }
        }
        Ok(())
    }

    // ---- events ----------------------------------------------------------------------------

    pub fn new_event(&mut self) -> usize {
        let id = self.handle();
        self.events.insert(id, None);
        id
    }

    fn event(&self, id: usize) -> Res<Option<(usize, u64)>> {
        self.events
            .get(&id)
            .copied()
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, &format!("event {id:#x} does not exist")))
    }

    pub fn destroy_event(&mut self, id: usize) -> Res<()> {
        self.event(id)?;
        self.events.remove(&id);
        Ok(())
    }

    pub fn record_event(&mut self, id: usize, stream: usize) -> Res<()> {
        self.event(id)?;
        self.enqueue(stream, Op::Record)?;
        let seq = self.streams[&stream].next - 1;
        self.events.insert(id, Some((stream, seq)));
        Ok(())
    }

    pub fn sync_event(&mut self, id: usize) -> Res<()> {
        let at = self.event(id)?;
        self.refuse_while_capturing("cuEventSynchronize")?;
        match at {
            Some((stream, seq)) => self.drain_to(stream, seq + 1),
            None => Ok(()), // never recorded: complete
        }
    }

    pub fn wait_event(&mut self, stream: usize, id: usize) -> Res<()> {
        match self.event(id)? {
            Some((s, seq)) => self.enqueue(stream, Op::Wait { stream: s, seq }),
            None => self.stream(stream),
        }
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

    // ---- modules and launches --------------------------------------------------------------

    pub fn load_module(&mut self, text: &str) -> Res<usize> {
        let entries =
            ptx::parse(text).map_err(|e| fail(CUresult::CUDA_ERROR_INVALID_PTX, &format!("cuModuleLoadData: {e}")))?;
        if entries.is_empty() {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_PTX,
                "cuModuleLoadData: no .entry in the image (PTX text expected)",
            ));
        }
        let host = kernels::all();
        let mut funcs = vec![];
        for e in entries {
            let kernel = host.get(e.name.as_str()).copied();
            if let Some(k) = &kernel {
                let same = k.sig.len() == e.params.len()
                    && e.params.iter().zip(k.sig.iter().zip(k.sizes)).all(|(p, (&c, &n))| p.matches(c, n));
                if !same {
                    return Err(fail(
                        CUresult::CUDA_ERROR_INVALID_PTX,
                        &format!(
                            "kernel {}: the PTX takes {:?} but the host build of kernels/{}.cu takes `{}` (p pointer, i 32-bit, l 64-bit, f float): rebuild tandem-fake-cuda from the same sources",
                            e.name,
                            e.params,
                            k.file,
                            String::from_utf8_lossy(k.sig)
                        ),
                    ));
                }
            }
            let id = self.handle();
            self.funcs.insert(id, Func { entry: e, kernel, max_dynamic_smem: STATIC_SMEM_LIMIT });
            funcs.push(id);
        }
        let id = self.handle();
        self.modules.insert(id, funcs);
        Ok(id)
    }

    pub fn unload_module(&mut self, id: usize) -> Res<()> {
        let funcs = self
            .modules
            .remove(&id)
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, &format!("module {id:#x} does not exist")))?;
        for f in funcs {
            self.funcs.remove(&f);
        }
        Ok(())
    }

    pub fn get_function(&mut self, module: usize, name: &str) -> Res<usize> {
        let funcs = self
            .modules
            .get(&module)
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, &format!("module {module:#x} does not exist")))?;
        funcs.iter().copied().find(|f| self.funcs[f].entry.name == name).ok_or_else(|| {
            fail(CUresult::CUDA_ERROR_NOT_FOUND, &format!("cuModuleGetFunction: no kernel `{name}` in the module"))
        })
    }

    fn func(&self, id: usize) -> Res<&Func> {
        self.funcs
            .get(&id)
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, &format!("function {id:#x} does not exist")))
    }

    pub fn function_attribute(&self, id: usize, attrib: i32) -> Res<i32> {
        let f = self.func(id)?;
        Ok(match attrib {
            0 => f.entry.max_threads.unwrap_or(1024) as i32,
            1 => f.entry.static_smem as i32,
            8 => f.max_dynamic_smem as i32,
            _ => {
                return Err(fail(
                    CUresult::CUDA_ERROR_NOT_SUPPORTED,
                    &format!("cuFuncGetAttribute: attribute {attrib} is not modelled"),
                ))
            }
        })
    }

    pub fn set_function_attribute(&mut self, id: usize, attrib: i32, value: i32) -> Res<()> {
        let f = self
            .funcs
            .get_mut(&id)
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, &format!("function {id:#x} does not exist")))?;
        match attrib {
            8 if value >= 0 && value as usize + f.entry.static_smem <= OPTIN_SMEM_LIMIT => {
                f.max_dynamic_smem = value as usize;
                Ok(())
            }
            8 => Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                &format!("{}: {value} bytes of dynamic shared memory exceed the opt-in limit", f.entry.name),
            )),
            _ => Err(fail(
                CUresult::CUDA_ERROR_NOT_SUPPORTED,
                &format!("cuFuncSetAttribute: attribute {attrib} is not modelled"),
            )),
        }
    }

    /// Checks a launch as the driver would at the call and copies its arguments.
    ///
    /// # Safety
    /// `params` is cuLaunchKernel's `kernelParams`.
    pub unsafe fn make_launch(
        &mut self,
        id: usize,
        grid: [u32; 3],
        block: [u32; 3],
        smem: u32,
        params: *const *const c_void,
        pdl: bool,
    ) -> Res<Op> {
        need_context("cuLaunchKernel")?;
        let f = self.func(id)?;
        let name = f.entry.name.clone();
        let bad = |code: CUresult, msg: String| fail(code, &format!("launching {name}: {msg}"));
        let Some(kernel) = f.kernel else {
            return Err(bad(
                CUresult::CUDA_ERROR_NOT_FOUND,
                "no host build of this kernel in the fake driver (rebuild tandem-fake-cuda)".into(),
            ));
        };
        if grid.contains(&0) || block.contains(&0) {
            return Err(bad(CUresult::CUDA_ERROR_INVALID_VALUE, format!("an empty grid {grid:?} or block {block:?}")));
        }
        if grid[0] > i32::MAX as u32
            || grid[1] > 65535
            || grid[2] > 65535
            || block[0] > 1024
            || block[1] > 1024
            || block[2] > 64
        {
            return Err(bad(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("grid {grid:?} or block {block:?} beyond the device's limits"),
            ));
        }
        let threads = block[0] * block[1] * block[2];
        let bound = f.entry.max_threads.unwrap_or(1024);
        if threads > bound {
            return Err(bad(
                CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
                format!("{threads} threads a block, but its launch bounds allow {bound}"),
            ));
        }
        if let Some(req) = f.entry.req_threads {
            if threads != req {
                return Err(bad(
                    CUresult::CUDA_ERROR_INVALID_VALUE,
                    format!("{threads} threads a block, but it requires {req}"),
                ));
            }
        }
        let smem = smem as usize;
        let limit = if f.max_dynamic_smem > STATIC_SMEM_LIMIT { OPTIN_SMEM_LIMIT } else { STATIC_SMEM_LIMIT };
        if smem > f.max_dynamic_smem || f.entry.static_smem + smem > limit {
            return Err(bad(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!(
                    "{} bytes of static and {smem} of dynamic shared memory exceed what it may use ({} dynamic)",
                    f.entry.static_smem, f.max_dynamic_smem
                ),
            ));
        }
        if f.entry.dynamic_smem && smem == 0 {
            return Err(bad(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                "it uses dynamic shared memory, the launch gives none".into(),
            ));
        }
        if !kernel.sig.is_empty() && params.is_null() {
            return Err(bad(CUresult::CUDA_ERROR_INVALID_VALUE, "kernelParams is null".into()));
        }
        let mut vals = Vec::with_capacity(kernel.sig.len());
        for (i, &n) in kernel.sizes.iter().enumerate() {
            let p = *params.add(i);
            if p.is_null() {
                return Err(bad(CUresult::CUDA_ERROR_INVALID_VALUE, format!("kernelParams[{i}] is null")));
            }
            let mut v = vec![0u64; (n as usize).div_ceil(8)];
            std::ptr::copy_nonoverlapping(p as *const u8, v.as_mut_ptr() as *mut u8, n as usize);
            vals.push(v);
        }
        self.launches += 1;
        let seed = splitmix(self.seed ^ splitmix(self.launches)) | 1;
        Ok(Op::Launch(Arc::new(Launch { name, kernel, grid, block, smem: smem as u32, seed, params: vals, pdl })))
    }

    // ---- capture and graphs ----------------------------------------------------------------

    pub fn begin_capture(&mut self, stream: usize, mode: i32) -> Res<()> {
        self.stream(stream)?;
        if stream == 0 {
            return Err(fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "capture on the legacy NULL stream"));
        }
        if !(0..=2).contains(&mode) {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, &format!("capture mode {mode}")));
        }
        let st = self.streams.get_mut(&stream).expect("checked");
        if st.capture.is_some() {
            return Err(fail(CUresult::CUDA_ERROR_ILLEGAL_STATE, "cuStreamBeginCapture on a stream already capturing"));
        }
        st.capture = Some(Capture { ops: vec![], invalid: None, thread: std::thread::current().id(), mode });
        Ok(())
    }

    pub fn end_capture(&mut self, stream: usize) -> Res<usize> {
        self.stream(stream)?;
        let st = self.streams.get_mut(&stream).expect("checked");
        let Some(c) = st.capture.take() else {
            return Err(fail(
                CUresult::CUDA_ERROR_ILLEGAL_STATE,
                "cuStreamEndCapture on a stream that is not capturing",
            ));
        };
        if c.mode == 1 && c.thread != std::thread::current().id() {
            return Err(fail(
                CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
                "cuStreamEndCapture from another thread than the one that began it",
            ));
        }
        if let Some(why) = c.invalid {
            return Err(fail(
                CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                &format!("the capture was invalidated: {why}"),
            ));
        }
        let id = self.handle();
        self.graphs.insert(id, Arc::new(c.ops));
        Ok(id)
    }

    pub fn capture_status(&self, stream: usize) -> Res<i32> {
        let st = self
            .streams
            .get(&stream)
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, &format!("stream {stream:#x} does not exist")))?;
        Ok(match &st.capture {
            None => 0,
            Some(c) if c.invalid.is_none() => 1,
            Some(_) => 2,
        })
    }

    pub fn instantiate(&mut self, graph: usize) -> Res<usize> {
        let ops =
            self.graphs.get(&graph).cloned().ok_or_else(|| {
                fail(CUresult::CUDA_ERROR_INVALID_HANDLE, &format!("graph {graph:#x} does not exist"))
            })?;
        let id = self.handle();
        self.execs.insert(id, ops);
        Ok(id)
    }

    pub fn exec(&self, id: usize) -> Res<Arc<Vec<Op>>> {
        self.execs
            .get(&id)
            .cloned()
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, &format!("graph exec {id:#x} does not exist")))
    }

    pub fn destroy_graph(&mut self, id: usize) -> Res<()> {
        self.graphs
            .remove(&id)
            .map(|_| ())
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, &format!("graph {id:#x} does not exist")))
    }

    pub fn destroy_exec(&mut self, id: usize) -> Res<()> {
        self.execs
            .remove(&id)
            .map(|_| ())
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, &format!("graph exec {id:#x} does not exist")))
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

static mut OLD_SEGV: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::uninit();
static mut OLD_BUS: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::uninit();

/// On a fault inside a kernel, says which kernel and where before the process dies; any other
/// fault goes to the handler that was there before (Rust's stack-overflow report).
fn install_fault_handler() {
    extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        let name = RUNNING.load(Ordering::SeqCst);
        // SAFETY: async-signal-safe calls only (write, sigaction); the name is a C string that
        // outlives the kernel run.
        unsafe {
            if !name.is_null() {
                let addr = (*info).si_addr() as usize;
                let mut buf = [0u8; 256];
                let mut n = 0;
                let mut put = |s: &[u8]| {
                    for &b in s {
                        if n < buf.len() {
                            buf[n] = b;
                            n += 1;
                        }
                    }
                };
                put(b"fake-cuda: kernel ");
                put(std::ffi::CStr::from_ptr(name as *const libc::c_char).to_bytes());
                put(b" touched inaccessible memory at 0x");
                for k in (0..16).rev() {
                    put(&[b"0123456789abcdef"[(addr >> (4 * k)) & 15]]);
                }
                put(b" (past the end of an allocation, freed memory, or a bad pointer): CUDA_ERROR_ILLEGAL_ADDRESS on a GPU\n");
                libc::write(2, buf.as_ptr() as *const libc::c_void, n);
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
                return;
            }
            let old = if sig == libc::SIGSEGV {
                (*std::ptr::addr_of!(OLD_SEGV)).assume_init()
            } else {
                (*std::ptr::addr_of!(OLD_BUS)).assume_init()
            };
            if old.sa_sigaction == libc::SIG_DFL || old.sa_sigaction == libc::SIG_IGN {
                libc::sigaction(sig, &old, std::ptr::null_mut());
            } else if old.sa_flags & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(old.sa_sigaction);
                f(sig, info, ctx);
            } else {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(old.sa_sigaction);
                f(sig);
            }
        }
    }
    // SAFETY: installs a handler; the old ones are saved first, once (the state is created once).
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = handler as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(libc::SIGSEGV, &act, (*std::ptr::addr_of_mut!(OLD_SEGV)).as_mut_ptr());
        libc::sigaction(libc::SIGBUS, &act, (*std::ptr::addr_of_mut!(OLD_BUS)).as_mut_ptr());
    }
}
