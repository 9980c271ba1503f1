//! [`RequestStream`]: the outputs of one request, in order, the last with `finished`. It is a
//! tokio unbounded channel, so the server awaits it and plain threads read it with
//! `blocking_recv`. Dropping a stream before its final output aborts the request, which frees
//! its blocks.

use std::sync::mpsc;
use std::task::{Context, Poll};

use tokio::sync::mpsc::UnboundedReceiver;

use crate::engine::Command;
use crate::request::RequestOutput;
use crate::sequence::RequestId;

/// The outputs of one request. Dropping it before the final output aborts the request.
pub struct RequestStream {
    id: RequestId,
    rx: UnboundedReceiver<RequestOutput>,
    /// Where a drop sends its abort; None for a stream of a synchronous [`crate::Engine`].
    abort: Option<mpsc::Sender<Command>>,
    /// The final output was read: a drop aborts nothing.
    finished: bool,
}

impl RequestStream {
    pub(crate) fn new(
        id: RequestId,
        rx: UnboundedReceiver<RequestOutput>,
        abort: Option<mpsc::Sender<Command>>,
    ) -> Self {
        RequestStream { id, rx, abort, finished: false }
    }

    pub fn id(&self) -> RequestId {
        self.id
    }

    fn note(&mut self, o: Option<RequestOutput>) -> Option<RequestOutput> {
        if o.as_ref().is_none_or(|o| o.finished) {
            self.finished = true;
        }
        o
    }

    /// The next output; None after the final one.
    pub async fn recv(&mut self) -> Option<RequestOutput> {
        let o = self.rx.recv().await;
        self.note(o)
    }

    /// The next output, blocking this thread (not for use inside an async runtime).
    pub fn blocking_recv(&mut self) -> Option<RequestOutput> {
        let o = self.rx.blocking_recv();
        self.note(o)
    }

    /// Polls for the next output (what a `Stream` implementation needs); `Ready(None)` after
    /// the final one.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<RequestOutput>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(o) => Poll::Ready(self.note(o)),
            Poll::Pending => Poll::Pending,
        }
    }

    /// The next output if one is ready.
    pub fn try_recv(&mut self) -> Option<RequestOutput> {
        let o = self.rx.try_recv().ok();
        if o.as_ref().is_some_and(|o| o.finished) {
            self.finished = true;
        }
        o
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if let (false, Some(tx)) = (self.finished, &self.abort) {
            let _ = tx.send(Command::Abort(self.id));
        }
    }
}
