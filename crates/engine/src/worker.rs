//! The model worker: the `ModelRunner` on a thread of its own. The engine thread sends it work
//! and gets the answer back through channels, so that while the worker is blocked in step N's
//! forward (on any backend: a GPU's sync, or the reference's arithmetic) the engine thread can
//! postprocess step N-1 and schedule step N+1.
//!
//! Two kinds of work, run strictly in the order sent (the KV cache's writes and reads follow
//! that order, which is what makes an overlapped step safe; see `Engine::step`):
//! - a call: any closure over the runner (the synchronous step: `forward`, `forward_sampled`,
//!   `forward_sampled_masked`);
//! - an overlapped step: a batch whose tokens may be [`PLACEHOLDER`]s, each meaning "the id
//!   this worker sampled for row r of the step before". The worker keeps that step's ids and
//!   fills them in before the forward, so the engine never waits for them.

use std::sync::mpsc;
use std::thread::JoinHandle;

use tandem_core::sampling::SampleSpec;
use tandem_core::{Error, ForwardBatch, ModelRunner, Result};

/// A token the engine does not know yet: the id sampled for a row of the step in flight.
/// Never a vocabulary id (prompts are checked against the vocabulary).
pub const PLACEHOLDER: u32 = u32::MAX;

type Call = Box<dyn FnOnce(&mut dyn ModelRunner) + Send>;

/// An overlapped step: `fill` lists (token index in `batch`, row of the previous step's ids).
struct Overlapped {
    batch: ForwardBatch,
    specs: Vec<SampleSpec>,
    fill: Vec<(u32, u32)>,
    reply: mpsc::Sender<Result<Vec<u32>>>,
}

enum Job {
    Call(Call),
    Step(Box<Overlapped>),
}

pub struct Worker {
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// The error a reply channel gives when the worker thread is gone (a panic in the runner).
pub fn worker_gone() -> Error {
    Error::device_lost("model worker", "the model worker thread stopped (a panic in the model runner?)")
}

impl Worker {
    pub fn spawn(mut runner: Box<dyn ModelRunner>) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new().name("tandem-model".into()).spawn(move || {
            // The ids of the last overlapped step; None after a call or a failed step.
            let mut prev: Option<Vec<u32>> = None;
            for job in rx {
                match job {
                    Job::Call(f) => {
                        prev = None;
                        f(runner.as_mut());
                    }
                    Job::Step(s) => {
                        let Overlapped { mut batch, specs, fill, reply } = *s;
                        for &(i, row) in &fill {
                            // Without the previous ids (its forward failed), the rows waiting on
                            // them belong to sequences the engine fails with that step; any
                            // valid id keeps the rest of the batch running, and the engine
                            // discards those rows.
                            batch.tokens[i as usize] = prev.as_ref().and_then(|p| p.get(row as usize)).copied().unwrap_or(0);
                        }
                        let r = runner.forward_sampled(&batch, &specs);
                        prev = r.as_ref().ok().cloned();
                        let _ = reply.send(r);
                    }
                }
            }
        })?;
        Ok(Worker { tx: Some(tx), thread: Some(thread) })
    }

    fn send(&self, job: Job) {
        // A send fails only when the thread is gone; the reply channel then says so.
        if let Some(tx) = &self.tx {
            let _ = tx.send(job);
        }
    }

    /// Runs `f` on the worker; its answer arrives on the returned channel (closed without an
    /// answer if the runner panicked).
    pub fn call<R: Send + 'static>(&self, f: impl FnOnce(&mut dyn ModelRunner) -> R + Send + 'static) -> mpsc::Receiver<R> {
        let (reply, rx) = mpsc::channel();
        self.send(Job::Call(Box::new(move |r| {
            let _ = reply.send(f(r));
        })));
        rx
    }

    /// Sends an overlapped step: `forward_sampled` of `batch` once the tokens at `fill`'s
    /// indices hold the previous overlapped step's ids.
    pub fn dispatch(&self, batch: ForwardBatch, specs: Vec<SampleSpec>, fill: Vec<(u32, u32)>) -> mpsc::Receiver<Result<Vec<u32>>> {
        let (reply, rx) = mpsc::channel();
        self.send(Job::Step(Box::new(Overlapped { batch, specs, fill, reply })));
        rx
    }
}

impl Drop for Worker {
    /// Lets the thread finish what it was sent and drop the runner (its device memory) before
    /// the engine is gone.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_model::{fake_config, FakeModel};
    use tandem_core::sampling::SampleSpec;

    fn greedy(n: usize) -> Vec<SampleSpec> {
        vec![SampleSpec { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0, completion: 0, token_index: 0 }; n]
    }

    /// One sequence, two decode steps sent back to back: the second's token is the first's
    /// sampled id, filled in by the worker, and both agree with the fake's oracle.
    #[test]
    fn a_placeholder_becomes_the_previous_steps_id() {
        let cfg = fake_config(64, &[63], 256);
        let w = Worker::spawn(Box::new(FakeModel::new(cfg.clone(), 4, 16, 64, 4))).unwrap();
        let prompt = [5u32, 9, 11];
        let mut b = ForwardBatch { max_blocks: 1, ..Default::default() };
        b.push_seq(&prompt, 0, &[0], 16, true);
        let first = w.dispatch(b, greedy(1), vec![]);
        let mut b = ForwardBatch { max_blocks: 1, ..Default::default() };
        b.push_seq(&[PLACEHOLDER], 3, &[0], 16, true);
        let second = w.dispatch(b, greedy(1), vec![(0, 0)]);
        let want = FakeModel::greedy(&cfg, &prompt, 2, true);
        assert_eq!(first.recv().unwrap().unwrap(), vec![want[0]]);
        assert_eq!(second.recv().unwrap().unwrap(), vec![want[1]]);
    }
}
