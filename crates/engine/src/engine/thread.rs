//! The engine thread: [`Engine::spawn`] moves an engine onto its own thread and returns an
//! [`EngineHandle`]; the thread takes the handles' commands between steps and steps while
//! there is work, sleeping until a command (or the scheduler's next deadline) when there is
//! none.

use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use tandem_core::lora::LoraAdapter;
use tandem_core::ModelRunner;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

use super::Engine;
use crate::config::{EngineConfig, EngineError};
use crate::detokenize::DecodeFn;
use crate::handle::{EngineHandle, HandleInner};
use crate::request::{Request, RequestOutput};
use crate::sequence::{FinishReason, RequestId};

/// What a handle or a stream tells the engine thread.
pub(crate) enum Command {
    /// A request the handle has admitted (`max_tokens` resolved).
    /// `adapter`: the LoRA slot it runs under (`EngineHandle::submit_with_adapter`).
    Submit {
        id: RequestId,
        req: Box<Request>,
        adapter: Option<u32>,
        max_tokens: usize,
        tx: UnboundedSender<RequestOutput>,
        arrival: Instant,
    },
    /// Ends a request (`EngineHandle::abort`, or its stream dropped before the end).
    Abort(RequestId),
    /// Puts a LoRA adapter into a free slot (`EngineHandle::load_adapter`); replies its id.
    LoadAdapter { adapter: Box<LoraAdapter>, reply: oneshot::Sender<Result<u32, String>> },
    /// Stops serving a LoRA adapter (`EngineHandle::unload_adapter`).
    UnloadAdapter { id: u32, reply: oneshot::Sender<Result<(), String>> },
    /// Aborts every open request and ends the thread.
    Shutdown,
}

impl Engine {
    /// Runs the engine on its own thread.
    pub fn spawn(
        runner: Box<dyn ModelRunner>,
        decode: DecodeFn,
        cfg: EngineConfig,
    ) -> Result<EngineHandle, EngineError> {
        let model = std::sync::Arc::new(runner.config().clone());
        let weights_bytes = runner.weights_bytes();
        let engine = Engine::new(runner, decode, cfg)?;
        let (tx, rx) = mpsc::channel();
        let inner = HandleInner {
            cmd: tx,
            model,
            weights_bytes,
            admission: engine.admission.clone(),
            stats: engine.stats.clone(),
            failure: engine.failure.clone(),
            pending: engine.pending.clone(),
            next_request: engine.next_request.clone(),
            thread: Mutex::new(None),
        };
        let thread = std::thread::Builder::new()
            .name("tandem-engine".into())
            .spawn(move || engine.run(rx))
            .map_err(|e| EngineError::Config(format!("cannot start the engine thread: {e}")))?;
        *inner.thread.lock().expect("fresh mutex") = Some(thread);
        Ok(EngineHandle::new(inner))
    }

    /// The thread's loop: every waiting command, then a step; idle, it blocks on the next
    /// command. Returns on shutdown or once every sender is gone.
    fn run(mut self, rx: mpsc::Receiver<Command>) {
        loop {
            // Take every command waiting; block only when there is nothing to do.
            loop {
                let cmd = if self.has_work() {
                    match rx.try_recv() {
                        Ok(c) => c,
                        Err(_) => break,
                    }
                } else {
                    match rx.recv() {
                        Ok(c) => c,
                        Err(_) => return,
                    }
                };
                if !self.handle(cmd) {
                    return;
                }
            }
            if self.step() == 0 && self.has_work() {
                // Nothing could run: a static batch is gathering, or every candidate is
                // protected from preemption for a few more steps.
                let wait = self
                    .scheduler
                    .next_deadline()
                    .map_or(Duration::from_millis(1), |d| d.saturating_duration_since(Instant::now()));
                if let Ok(cmd) = rx.recv_timeout(wait.max(Duration::from_micros(50))) {
                    if !self.handle(cmd) {
                        return;
                    }
                }
            }
        }
    }

    /// False on shutdown.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Submit { id, req, adapter, max_tokens, tx, arrival } => {
                self.enqueue(id, *req, adapter, max_tokens, tx, arrival);
                if self.refuse_unloaded_adapter(id, adapter) {
                    self.update_stats();
                    return true;
                }
                // Submitted before the handle saw the failure: it still gets its one final output.
                if let Some(f) = self.failure.get().cloned() {
                    self.end_request(
                        id,
                        FinishReason::Error(format!("the engine stopped after a fatal device error: {f}")),
                    );
                    self.update_stats();
                }
            }
            Command::Abort(id) => {
                self.abort(id);
                // The engine may go idle now; the gauges must not keep showing the aborted request.
                self.update_stats();
            }
            Command::LoadAdapter { adapter, reply } => {
                let _ = reply.send(self.load_adapter(*adapter));
            }
            Command::UnloadAdapter { id, reply } => {
                let _ = reply.send(self.unload_adapter(id));
                self.update_stats();
            }
            Command::Shutdown => {
                let open: Vec<RequestId> = self.requests.keys().copied().collect();
                for rid in open {
                    self.abort(rid);
                }
                self.update_stats();
                return false;
            }
        }
        true
    }
}
