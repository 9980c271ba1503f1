//! The model worker: a thread that runs the `ModelRunner` it shares with the engine. The
//! engine thread sends it work and gets the answer back through channels, so that while the
//! worker is blocked in step N's forward (on any backend: a GPU's sync, or the reference's
//! arithmetic) the engine thread can postprocess step N-1 and schedule step N+1.
//!
//! It runs overlapped steps strictly in the order sent (the KV cache's writes and reads follow
//! that order, which is what makes an overlapped step safe; see `Engine::step`): a batch whose
//! tokens may be [`PLACEHOLDER`]s, each meaning "the id this worker sampled for row r of the
//! step before". The worker keeps that step's ids and fills them in before the forward, so
//! the engine never waits for them. A synchronous step (nothing in flight) locks the runner
//! on the engine thread instead, saving the two thread hand-offs.

use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use tandem_core::sampling::SampleSpec;
use tandem_core::{Error, ForwardBatch, ModelRunner, Result};

/// A token the engine does not know yet: the id sampled for a row of the step in flight.
/// Never a vocabulary id (prompts are checked against the vocabulary).
pub const PLACEHOLDER: u32 = u32::MAX;

/// An overlapped step: `fill` lists (token index in `batch`, row of the previous step's ids).
struct Overlapped {
    batch: ForwardBatch,
    specs: Vec<SampleSpec>,
    fill: Vec<(u32, u32)>,
    reply: mpsc::Sender<Result<Vec<u32>>>,
}

pub struct Worker {
    tx: Option<mpsc::Sender<Overlapped>>,
    thread: Option<JoinHandle<()>>,
}

/// The error a reply channel gives when the worker thread is gone (a panic in the runner).
pub fn worker_gone() -> Error {
    Error::device_lost("model worker", "the model runner panicked")
}

impl Worker {
    pub fn spawn(runner: Arc<Mutex<Box<dyn ModelRunner>>>) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Overlapped>();
        let thread = std::thread::Builder::new().name("tandem-model".into()).spawn(move || {
            // The ids of the last step; None after a failed one.
            let mut prev: Option<Vec<u32>> = None;
            for s in rx {
                let Overlapped { mut batch, specs, fill, reply } = s;
                for &(i, row) in &fill {
                    // Without the previous ids (its forward failed), the rows waiting on them
                    // belong to sequences the engine fails with that step; any valid id keeps
                    // the rest of the batch running, and the engine discards those rows.
                    batch.tokens[i as usize] = prev.as_ref().and_then(|p| p.get(row as usize)).copied().unwrap_or(0);
                }
                // A synchronous step holds the lock only when nothing is in flight.
                let r = match runner.lock() {
                    Ok(mut m) => m.forward_sampled(&batch, &specs),
                    Err(_) => Err(worker_gone()),
                };
                prev = r.as_ref().ok().cloned();
                let _ = reply.send(r);
            }
        })?;
        Ok(Worker { tx: Some(tx), thread: Some(thread) })
    }

    /// Sends an overlapped step: `forward_sampled` of `batch` once the tokens at `fill`'s
    /// indices hold the previous overlapped step's ids.
    pub fn dispatch(
        &self,
        batch: ForwardBatch,
        specs: Vec<SampleSpec>,
        fill: Vec<(u32, u32)>,
    ) -> mpsc::Receiver<Result<Vec<u32>>> {
        let (reply, rx) = mpsc::channel();
        // A send fails only when the thread is gone; the reply channel then says so.
        if let Some(tx) = &self.tx {
            let _ = tx.send(Overlapped { batch, specs, fill, reply });
        }
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
        vec![
            SampleSpec { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0, completion: 0, token_index: 0 };
            n
        ]
    }

    /// One sequence, two decode steps sent back to back: the second's token is the first's
    /// sampled id, filled in by the worker, and both agree with the fake's oracle.
    #[test]
    fn a_placeholder_becomes_the_previous_steps_id() {
        let cfg = fake_config(64, &[63], 256);
        let w = Worker::spawn(Arc::new(Mutex::new(Box::new(FakeModel::new(cfg.clone(), 4, 16, 64, 4))))).unwrap();
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
