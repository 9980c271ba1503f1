//! CUDA graphs: the backend side of `Device::begin_capture` / `end_capture` / `replay`.
//!
//! The model captures each decode bucket once at load (crates/core/src/model.rs, `Padding`):
//! the step's launches are recorded on our stream (thread-local capture mode: only this
//! thread's unsafe API calls break the capture), instantiated, uploaded, and replayed with one
//! `cuGraphLaunch` after the step's metadata copy. Nothing a captured step launches may
//! allocate, copy from the host or synchronize: the workspace is reserved at load (`fixed`
//! scratch), the model uploads before it replays, and `TANDEM_CUDA_SYNC=1` skips its per-launch
//! synchronize while capturing. Any failure leaves the bucket eager (the model logs it).
//!
//! Two drivers must not disagree about what a capture holds. Real CUDA records a stream-ordered
//! allocation made while capturing as a memory node of the graph (legal there, and wrong here:
//! the scratch would then live in the graph's memory); the fake driver (crates/fake-cuda)
//! refuses it. So on real CUDA a captured step that allocates is refused here
//! ([`CudaBackend::end_capture_impl`]), and on the fake driver a failed capture is an error, not
//! an eager fallback: the next `sync` (the model's, right after capturing) reports it, so a
//! test on the fake fails where the GPU would have captured something else.

use std::sync::atomic::Ordering;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUgraphNodeType, CUresult, CUstreamCaptureMode};
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

/// The backend's graphs: the open capture (the launch count when it began), every graph
/// captured so far, indexed by `GraphId`, and on the fake driver the first capture that failed
/// (reported by the next `sync`).
#[derive(Default)]
pub(super) struct Graphs {
    open: Option<u64>,
    list: Vec<Captured>,
    failed_on_fake: Option<String>,
}

/// How the fake driver names its device (crates/fake-cuda `DEVICE_NAME`).
const FAKE_DRIVER: &str = "(tandem fake driver)";

impl CudaBackend {
    fn graphs(&self, op: &str) -> Result<std::sync::MutexGuard<'_, Graphs>> {
        self.graphs.lock().map_err(|_| err(format!("{op}: graph lock poisoned by an earlier panic")))
    }

    /// Whether this is the fake driver (crates/fake-cuda), where a failed capture is an error.
    pub(crate) fn on_fake_driver(&self) -> bool {
        self.device_name.ends_with(FAKE_DRIVER)
    }

    /// On the fake driver, the capture that failed since the last call, as an error (taken: it is
    /// reported once). Real CUDA may have captured what the fake refused, so the eager fallback
    /// would hide a step that runs differently on the GPU.
    pub(super) fn capture_failed_on_fake(&self) -> Result<()> {
        match self.graphs("sync")?.failed_on_fake.take() {
            None => Ok(()),
            Some(why) => Err(err(format!(
                "a CUDA graph capture failed on the fake driver, where it must not: {why}. Real CUDA may \
                 capture what the fake refuses (an allocation becomes a memory node of the graph), so the \
                 eager fallback would hide it: a captured step must not allocate, copy from the host or sync"
            ))),
        }
    }

    /// `r`, noting its error as the fake driver's failed capture (the first one is kept).
    fn noted<T>(&self, g: &mut Graphs, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            if self.on_fake_driver() && g.failed_on_fake.is_none() {
                g.failed_on_fake = Some(e.to_string());
            }
        }
        r
    }

    pub(super) fn begin_capture_impl(&self) -> Result<()> {
        let mut g = self.graphs("begin_capture")?;
        let r = self.begin_capture_locked(&mut g);
        self.noted(&mut g, r)
    }

    fn begin_capture_locked(&self, g: &mut Graphs) -> Result<()> {
        const OP: &str = "begin_capture";
        if g.open.is_some() {
            return Err(err(format!("{OP}: a capture is already open")));
        }
        self.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(drv(OP))?;
        g.open = Some(self.launches());
        self.capturing.store(true, Ordering::Relaxed);
        Ok(())
    }

    pub(super) fn end_capture_impl(&self) -> Result<GraphId> {
        let mut g = self.graphs("end_capture")?;
        let r = self.end_capture_locked(&mut g);
        self.noted(&mut g, r)
    }

    fn end_capture_locked(&self, g: &mut Graphs) -> Result<GraphId> {
        const OP: &str = "end_capture";
        let Some(at_begin) = g.open.take() else { return Err(err(format!("{OP}: no capture is open"))) };
        self.capturing.store(false, Ordering::Relaxed);
        // The recorded launches did not run: the counter counts them when a replay runs them.
        let launches = self.launches().saturating_sub(at_begin);
        self.launches.fetch_sub(launches, Ordering::Relaxed);
        // Ends the capture even when a launch inside it failed (then this reports the capture
        // invalidated), so the stream is usable again either way.
        let graph = self.stream.end_capture(CUgraphInstantiate_flags(0)).map_err(drv(OP))?;
        let graph = graph.ok_or_else(|| err(format!("{OP}: the capture recorded no work")))?;
        // The fake driver refuses an allocation while capturing (and lacks these entry points).
        if !self.on_fake_driver() {
            let allocs = mem_alloc_nodes(&graph).map_err(|e| err(format!("{OP}: listing the graph's nodes: {e:?}")))?;
            if allocs > 0 {
                return Err(err(format!(
                    "{OP}: the captured step allocates device memory ({allocs} allocation node(s)): a captured step must use only the workspace reserved at load"
                )));
            }
        }
        graph.upload().map_err(drv(&format!("{OP}: uploading the graph")))?;
        g.list.push(Captured { graph, launches });
        Ok(GraphId(g.list.len() - 1))
    }

    /// A failure inside the capture (a launch, an allocation the fake refused) reaches the
    /// model, not these functions; on the fake driver the model's `end_capture` then fails,
    /// which is noted above.
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

/// How many of `graph`'s nodes are allocations (CU_GRAPH_NODE_TYPE_MEM_ALLOC): what real CUDA
/// records for a stream-ordered allocation made while capturing.
fn mem_alloc_nodes(graph: &CudaGraph) -> std::result::Result<usize, CUresult> {
    use cudarc::driver::sys;
    let mut n = 0usize;
    // SAFETY: the graph is alive (borrowed); the first call asks only for the count.
    let r = unsafe { sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &mut n) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(r);
    }
    let mut nodes = vec![std::ptr::null_mut(); n];
    // SAFETY: `nodes` holds `n` entries, as many as the graph said it has.
    let r = unsafe { sys::cuGraphGetNodes(graph.cu_graph(), nodes.as_mut_ptr(), &mut n) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(r);
    }
    let mut allocs = 0;
    for &node in &nodes[..n.min(nodes.len())] {
        let mut t = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: `node` is one of the graph's nodes, just listed.
        let r = unsafe { sys::cuGraphNodeGetType(node, &mut t) };
        if r != CUresult::CUDA_SUCCESS {
            return Err(r);
        }
        allocs += usize::from(t == CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC);
    }
    Ok(allocs)
}
