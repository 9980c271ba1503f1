//! Streams: each a queue of work (an [`Op`]) that runs when the host waits for it, in order,
//! a kernel and its programmatic dependent as a pair; a stream that captures records its work
//! instead (graph.rs).

use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::driver::sys::CUresult;

use super::graph::Capture;
use super::launch::Launch;
use super::{fail, Res, State};

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
    /// A cuBLASLt GEMM (crate::cublaslt), run on the CPU.
    Gemm(Arc<crate::cublaslt::Gemm>),
}

#[derive(Clone)]
pub enum Src {
    Pinned(usize),
    Bytes(Arc<Vec<u8>>),
}

#[derive(Default)]
pub(super) struct Stream {
    pub(super) queue: VecDeque<(u64, Op)>,
    pub(super) next: u64,
    /// Every op before this sequence number has run.
    pub(super) done: u64,
    pub(super) capture: Option<Capture>,
}

impl State {
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
                Op::Launch(_) | Op::Memset { .. } | Op::DtoD { .. } | Op::Gemm(_) => None,
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
    pub(super) fn drain_to(&mut self, stream: usize, until: u64) -> Res<()> {
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

    pub(super) fn execute(&mut self, op: &Op) -> Res<()> {
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
            Op::Gemm(g) => g.run(&self.mem),
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
}
