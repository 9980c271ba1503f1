//! [`EngineHandle`]: a cheap, cloneable handle to an engine thread. `submit` runs admission on
//! the caller's thread (a refused request never reaches the engine) and returns the request's
//! [`RequestStream`]; the stats and the failure are read without a round trip to the thread.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use tandem_core::lora::LoraAdapter;
use tokio::sync::mpsc::unbounded_channel;
use tokio::sync::oneshot;

use crate::admission::{Admission, SubmitError};
use crate::engine::Command;
use crate::metrics::Stats;
use crate::request::Request;
use crate::request_stream::RequestStream;
use crate::sequence::RequestId;

/// What the handles share with the engine thread.
pub(crate) struct HandleInner {
    pub(crate) cmd: mpsc::Sender<Command>,
    /// The served model's configuration (its shape, for the server's per-step estimates).
    pub(crate) model: Arc<tandem_core::ModelConfig>,
    /// Bytes the backend holds for the model's weights, where it counts them.
    pub(crate) weights_bytes: Option<u64>,
    pub(crate) admission: Admission,
    pub(crate) stats: Arc<Mutex<Stats>>,
    pub(crate) failure: Arc<OnceLock<String>>,
    /// Requests accepted and not finished (the engine counts them down).
    pub(crate) pending: Arc<AtomicUsize>,
    pub(crate) next_request: Arc<AtomicU64>,
    /// Taken by the first `shutdown`, which joins it.
    pub(crate) thread: Mutex<Option<JoinHandle<()>>>,
}

/// A cheap, cloneable handle to an engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    inner: Arc<HandleInner>,
}

impl EngineHandle {
    pub(crate) fn new(inner: HandleInner) -> Self {
        EngineHandle { inner: Arc::new(inner) }
    }

    /// Checks the request now and queues it; its outputs arrive on the returned stream.
    pub fn submit(&self, req: Request) -> Result<RequestStream, SubmitError> {
        self.submit_with_adapter(req, None)
    }

    /// As [`Self::submit`], the request run under LoRA adapter `adapter` (None: the base
    /// model): the slot of an adapter loaded with the model, or the id [`Self::load_adapter`]
    /// returned; an adapter not loaded is refused here.
    pub fn submit_with_adapter(&self, req: Request, adapter: Option<u32>) -> Result<RequestStream, SubmitError> {
        let h = &self.inner;
        if let Some(f) = h.failure.get() {
            return Err(SubmitError::Stopped(f.clone()));
        }
        let max_tokens = h.admission.check(&req, adapter)?;
        h.admission.reserve(&h.pending)?;
        let id = h.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = unbounded_channel();
        if h.cmd
            .send(Command::Submit { id, req: Box::new(req), adapter, max_tokens, tx, arrival: Instant::now() })
            .is_err()
        {
            h.pending.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::Stopped("the engine thread has exited".into()));
        }
        Ok(RequestStream::new(id, rx, Some(h.cmd.clone())))
    }

    /// Puts a LoRA adapter into a free slot of the model, or keeps it off the device until a
    /// request needs it, on the engine thread between steps; returns the id to submit under
    /// ([`Self::submit_with_adapter`]). An error where the model has no slots, no slot could
    /// ever take it, or the adapter does not fit them.
    pub async fn load_adapter(&self, adapter: LoraAdapter) -> Result<u32, String> {
        let (reply, rx) = oneshot::channel();
        self.inner.cmd.send(Command::LoadAdapter { adapter: Box::new(adapter), reply }).map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Stops serving LoRA adapter `id`: requests naming it are refused from now on, the ones
    /// already accepted run to their end, then its slot is emptied. An error where no adapter
    /// `id` is loaded.
    pub async fn unload_adapter(&self, id: u32) -> Result<(), String> {
        let (reply, rx) = oneshot::channel();
        self.inner.cmd.send(Command::UnloadAdapter { id, reply }).map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Aborts a request wherever it is; its blocks are freed at the engine's next look at its
    /// commands (before its next step). Unknown or finished ids are ignored.
    pub fn abort(&self, id: RequestId) {
        let _ = self.inner.cmd.send(Command::Abort(id));
    }

    pub fn stats(&self) -> Stats {
        self.inner.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Why the engine stopped serving for good (a fatal device error), if it did; the server's
    /// /health answers 503 with it.
    pub fn failure(&self) -> Option<String> {
        self.inner.failure.get().cloned()
    }

    /// Longest prompt + output the engine accepts.
    pub fn max_model_len(&self) -> usize {
        self.inner.admission.max_model_len
    }

    /// Bytes the backend holds for the served model's weights (`ModelRunner::weights_bytes`).
    pub fn weights_bytes(&self) -> Option<u64> {
        self.inner.weights_bytes
    }

    /// The served model's configuration.
    pub fn model_config(&self) -> &tandem_core::ModelConfig {
        &self.inner.model
    }

    /// The KV pool: tokens a block holds, and blocks.
    pub fn kv_blocks(&self) -> (usize, usize) {
        (self.inner.admission.block_size, self.inner.admission.num_blocks)
    }

    /// Aborts every open request, stops the thread and waits for it.
    pub fn shutdown(&self) {
        let _ = self.inner.cmd.send(Command::Shutdown);
        let thread = self.inner.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

fn stopped() -> String {
    "the engine thread has exited".into()
}
