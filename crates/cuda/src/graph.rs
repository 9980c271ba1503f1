//! CUDA graphs: the backend side of `Device::begin_capture` / `end_capture` / `replay`.
//!
//! The model captures each decode bucket once at load (crates/core/src/model.rs, `Padding`):
//! the step's launches are recorded on our stream (thread-local capture mode: only this
//! thread's unsafe API calls break the capture), instantiated, uploaded, and replayed with one
//! `cuGraphLaunch` after the step's metadata copy. Nothing a captured step launches may
//! allocate, copy from the host or synchronize: the workspace is reserved at load (`fixed`
//! scratch), the model uploads before it replays, and `TANDEM_CUDA_SYNC=1` skips its per-launch
//! synchronize while capturing. Any failure leaves the bucket eager (the model logs it).

use std::sync::atomic::Ordering;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;
use tandem_core::backend::GraphId;
use tandem_core::Result;

use crate::device::CudaBackend;
use crate::error::{drv, err};

/// A captured step and the kernels it launches (what a replay adds to the launch counter).
struct Captured {
    graph: CudaGraph,
    launches: u64,
}

// SAFETY: a CUgraph / CUgraphExec may be used from any thread as long as calls on one graph
// are serialized; every use goes through `Graphs`' mutex in the backend.
unsafe impl Send for Captured {}

/// The backend's graphs: the open capture (the launch count when it began), and every graph
/// captured so far, indexed by `GraphId`.
#[derive(Default)]
pub(super) struct Graphs {
    open: Option<u64>,
    list: Vec<Captured>,
}

impl CudaBackend {
    fn graphs(&self, op: &str) -> Result<std::sync::MutexGuard<'_, Graphs>> {
        self.graphs.lock().map_err(|_| err(format!("{op}: graph lock poisoned by an earlier panic")))
    }

    pub(super) fn begin_capture_impl(&self) -> Result<()> {
        const OP: &str = "begin_capture";
        let mut g = self.graphs(OP)?;
        if g.open.is_some() {
            return Err(err(format!("{OP}: a capture is already open")));
        }
        self.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(drv(OP))?;
        g.open = Some(self.launches());
        self.capturing.store(true, Ordering::Relaxed);
        Ok(())
    }

    pub(super) fn end_capture_impl(&self) -> Result<GraphId> {
        const OP: &str = "end_capture";
        let mut g = self.graphs(OP)?;
        let Some(at_begin) = g.open.take() else { return Err(err(format!("{OP}: no capture is open"))) };
        self.capturing.store(false, Ordering::Relaxed);
        // The recorded launches did not run: the counter counts them when a replay runs them.
        let launches = self.launches().saturating_sub(at_begin);
        self.launches.fetch_sub(launches, Ordering::Relaxed);
        // Ends the capture even when a launch inside it failed (then this reports the capture
        // invalidated), so the stream is usable again either way.
        let graph = self.stream.end_capture(CUgraphInstantiate_flags(0)).map_err(drv(OP))?;
        let graph = graph.ok_or_else(|| err(format!("{OP}: the capture recorded no work")))?;
        graph.upload().map_err(drv(&format!("{OP}: uploading the graph")))?;
        g.list.push(Captured { graph, launches });
        Ok(GraphId(g.list.len() - 1))
    }

    pub(super) fn replay_impl(&self, id: GraphId) -> Result<()> {
        const OP: &str = "replay";
        let g = self.graphs(OP)?;
        let c = g.list.get(id.0).ok_or_else(|| err(format!("{OP}: no graph {id:?} ({} captured)", g.list.len())))?;
        c.graph.launch().map_err(drv(&format!("{OP}: launching graph {} ({} kernels)", id.0, c.launches)))?;
        self.launches.fetch_add(c.launches, Ordering::Relaxed);
        if self.sync_each {
            self.stream.synchronize().map_err(drv(&format!("{OP}: graph {} (TANDEM_CUDA_SYNC=1)", id.0)))?;
        }
        Ok(())
    }
}
