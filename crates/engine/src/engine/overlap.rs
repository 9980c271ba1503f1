//! Overlapped steps (`EngineConfig::async_scheduling`): step N+1 is scheduled and sent to the
//! model worker before step N's ids are known, each row sampled in N holding a placeholder
//! token the worker fills in; step N lands (its ids emitted) while the worker runs N+1. Any
//! sequence that needs the host between steps drains the pipeline and the step runs
//! synchronously, so outputs are the same in both modes (see [`Engine::step`]).

use std::sync::mpsc;
use std::time::Instant;

use super::postprocess::Pick;
use super::{banned, Engine};
use crate::sampler::{has_edits, needs_host, SampleSpec};
use crate::scheduler::SchedulerOutput;
use crate::sequence::{IdMap, SeqId};
use crate::worker::{worker_gone, PLACEHOLDER};

/// A step sent to the model worker whose ids the engine has not taken yet (overlapped mode).
pub(super) struct InFlight {
    /// The scheduler's step id.
    step: u64,
    out: SchedulerOutput,
    /// Per sampled row, in the order of the ids: its sequence and where its placeholder token
    /// sits in the sequence's tokens.
    rows: Vec<(SeqId, usize)>,
    /// The row of each sampled sequence: what the next step's placeholders refer to.
    row_of: IdMap<u32>,
    /// Each scheduled sequence's computed tokens after this step: blocks registered in the
    /// prefix cache once it has come back.
    computed: Vec<(SeqId, usize)>,
    reply: mpsc::Receiver<tandem_core::Result<Vec<u32>>>,
}

impl Engine {
    /// One overlapped step: schedule and send the next step, then land the one sent before.
    /// Returns the sequences sent or landed, whichever is more.
    pub(super) fn step_overlapped(&mut self) -> usize {
        if !self.can_overlap() {
            let landed = self.land_all();
            return landed.max(self.step_sync());
        }
        let mut out = self.scheduler.schedule(Instant::now());
        self.record_attention(&out);
        let scheduled_usage = self.scheduler.bm.usage();
        let sent = out.seqs.len();
        let sent_tokens = out.num_tokens;
        if !out.is_empty() {
            match self.device_specs(&out) {
                Some(d) if d.ids_only() => self.dispatch(out, d.specs),
                _ => {
                    // `can_overlap` checks what `device_specs` does, so this is not reached;
                    // were it, the step runs synchronously once its placeholders are known.
                    self.land_all();
                    self.drop_ended(&mut out);
                    let sampled = self.forward(&out);
                    self.postprocess(&out, sampled);
                    self.record_step(sent, sent_tokens, scheduled_usage, false);
                    return sent;
                }
            }
        }
        // The step the last call sent: its ids come back while the worker runs this one.
        let mut landed = 0;
        while self.in_flight.len() > usize::from(sent > 0) {
            landed = landed.max(self.land_one());
        }
        self.record_step(sent, sent_tokens, scheduled_usage, true);
        sent.max(landed)
    }

    /// Whether the next step may be scheduled before the one in flight lands: no sequence
    /// needs what only the host has after a step (logits for host sampling or logprobs,
    /// prompt logprobs, a constraint's next mask), or edits its logits (penalties count the
    /// output so far, which includes the token still in flight). Checked over every sequence,
    /// waiting ones too, so that whatever the scheduler picks can be sampled on the device.
    fn can_overlap(&self) -> bool {
        self.failure.get().is_none()
            && !self.may_draft()
            && self.scheduler.seqs().all(|s| {
                let b = banned(&self.eos, s);
                s.guide.is_none()
                    && s.params.guided.is_none()
                    && s.params.prompt_logprobs.is_none()
                    && s.params.logprobs.is_none()
                    && !needs_host(&s.params, &b, false)
                    && !has_edits(&s.params, &b)
            })
    }

    /// Removes the rows of sequences that ended since `out` was scheduled.
    fn drop_ended(&self, out: &mut SchedulerOutput) {
        out.seqs.retain(|s| self.scheduler.seq(s.seq).is_some());
        out.num_tokens = out.seqs.iter().map(|s| s.num_tokens).sum();
        out.num_logit_rows = out.seqs.iter().map(|s| s.logit_rows()).sum();
        out.extra_logit_rows = out.seqs.iter().map(|s| s.logit_rows().saturating_sub(1)).sum();
    }

    /// Sends `out` to the worker without waiting, and moves the scheduler's view past it: its
    /// tokens count as computed and each sampled row's sequence gains a placeholder token.
    fn dispatch(&mut self, out: SchedulerOutput, specs: Vec<SampleSpec>) {
        let step = self.scheduler.current_step();
        let batch = self.scheduler.forward_batch(&out);
        // Placeholders come only from the step in flight (the one before lands before the
        // next schedule), so each refers to a row of the newest step sent.
        let prev = self.in_flight.back();
        let fill: Option<Vec<(u32, u32)>> = batch
            .tokens
            .iter()
            .enumerate()
            .filter(|(_, &t)| t == PLACEHOLDER)
            .map(|(i, _)| {
                prev.and_then(|p| p.row_of.get(&out.seqs[batch.token_seq[i] as usize].seq)).map(|&row| (i as u32, row))
            })
            .collect();
        let Some(fill) = fill else {
            self.land_all();
            return self.fail_batch(&out, "internal: a placeholder token that no step in flight gives");
        };
        let reply = self.worker.dispatch(batch, specs, fill);
        self.scheduler.dispatched(step);
        let (mut rows, mut row_of, mut computed) = (Vec::new(), IdMap::default(), Vec::with_capacity(out.seqs.len()));
        for s in &out.seqs {
            let Some(seq) = self.scheduler.seq_mut(s.seq) else { continue };
            seq.num_computed_tokens += s.num_tokens;
            computed.push((s.seq, seq.num_computed_tokens));
            if s.sample {
                row_of.insert(s.seq, rows.len() as u32);
                rows.push((s.seq, seq.tokens.len()));
                seq.tokens.push(PLACEHOLDER);
            }
        }
        self.in_flight.push_back(InFlight { step, out, rows, row_of, computed, reply });
    }

    /// Takes every step in flight.
    pub(super) fn land_all(&mut self) -> usize {
        let mut landed = 0;
        while !self.in_flight.is_empty() {
            landed = landed.max(self.land_one());
        }
        landed
    }

    /// Waits for the oldest step in flight and postprocesses it: its blocks join the prefix
    /// cache, each row's id replaces its placeholder and is emitted (rows of sequences that
    /// ended meanwhile are dropped). Returns its number of sequences.
    fn land_one(&mut self) -> usize {
        let Some(f) = self.in_flight.pop_front() else { return 0 };
        let result = f.reply.recv().unwrap_or_else(|_| Err(worker_gone()));
        self.scheduler.landed(f.step, self.in_flight.front().map(|n| n.step));
        let rows = f.rows.len();
        let ids = match result {
            Ok(ids) if ids.len() == rows => Ok(ids),
            Ok(ids) => Err(format!("model returned {} token ids for {rows} rows", ids.len())),
            Err(e) => Err(self.forward_error(e)),
        };
        match ids {
            Ok(ids) => {
                for &(id, n) in &f.computed {
                    self.scheduler.cache_computed(id, n);
                }
                let now = Instant::now();
                for (&(id, at), token) in f.rows.iter().zip(ids) {
                    self.sample_and_emit(id, Pick::Token(token, None), Some(at), now);
                }
            }
            Err(e) => {
                self.fail_batch(&f.out, &e);
                if self.failure.get().is_some() {
                    self.fail_all(&e);
                }
            }
        }
        f.out.seqs.len()
    }
}
