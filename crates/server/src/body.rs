//! The response body: a whole buffer, or a server-sent-event stream fed by a generation run.
//!
//! The stream owns its [`Run`]: when hyper drops the body (the client went away, or the
//! response ended) the run is dropped and its unfinished engine requests are aborted at once.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use crate::engine_client::EngineUpdate;
use crate::run::Run;

/// One API's event format: what a stream sends before any token, per engine update, and at
/// the end: each wire format in [`crate::wire`] writes its own (OpenAI's chunks, Anthropic's
/// events, the Responses API's events).
pub trait EventFormat: Send {
    fn head(&mut self) -> String;
    fn update(&mut self, out: &mut String, run: &Run, prompt: usize, upd: &EngineUpdate);
    fn tail(&mut self, out: &mut String, run: &Run);
}

pub enum ResponseBody {
    Full(Option<Bytes>),
    Sse(Box<SseStream>),
}

impl ResponseBody {
    pub fn full(b: impl Into<Bytes>) -> Self {
        ResponseBody::Full(Some(b.into()))
    }
}

pub struct SseStream {
    /// `None` once the stream has ended (the run is dropped then, which logs the request).
    run: Option<Run>,
    fmt: Box<dyn EventFormat>,
    /// Events ready before the first engine update (chat's role chunks).
    head: Option<Bytes>,
}

impl SseStream {
    pub fn new(run: Run, mut fmt: Box<dyn EventFormat>) -> Self {
        let head = fmt.head();
        SseStream { run: Some(run), fmt, head: (!head.is_empty()).then(|| Bytes::from(head)) }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            ResponseBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ResponseBody::Sse(s) => s.poll_next(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Full(b) => b.is_none(),
            ResponseBody::Sse(s) => s.run.is_none() && s.head.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ResponseBody::Full(None) => SizeHint::with_exact(0),
            ResponseBody::Sse(_) => SizeHint::default(),
        }
    }
}

impl SseStream {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if let Some(h) = self.head.take() {
            return Poll::Ready(Some(h));
        }
        let Some(run) = self.run.as_mut() else { return Poll::Ready(None) };
        let mut out = String::new();
        // Drain whatever is ready into one frame: fewer writes when several sequences of this
        // request (n > 1, prompt lists) stepped together.
        loop {
            match run.poll_update(cx) {
                Poll::Ready(Some((prompt, upd))) => self.fmt.update(&mut out, run, prompt, &upd),
                Poll::Ready(None) => {
                    self.fmt.tail(&mut out, run);
                    // Dropping the run here logs the request as soon as its last bytes are out.
                    self.run = None;
                    break;
                }
                Poll::Pending => break,
            }
        }
        if out.is_empty() {
            if self.run.is_none() {
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        } else {
            Poll::Ready(Some(Bytes::from(out)))
        }
    }
}
