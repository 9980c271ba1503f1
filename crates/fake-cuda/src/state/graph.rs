//! Stream capture and graphs: a capturing stream records its launches, memsets and device
//! copies by value and refuses what a capture cannot hold; the graph it ends in is
//! instantiated and replayed as one op.

use std::sync::Arc;
use std::thread::ThreadId;

use cudarc::driver::sys::CUresult;

use super::stream::Op;
use super::{fail, Res, State};

pub(super) struct Capture {
    pub(super) ops: Vec<Op>,
    pub(super) invalid: Option<String>,
    pub(super) thread: ThreadId,
    pub(super) mode: i32,
}

impl State {
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
