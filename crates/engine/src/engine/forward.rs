//! The forward of a step: one call to the model runner for the whole flattened batch. It
//! returns token ids when every row can be sampled where the logits are (masks and penalty
//! edits go up with it), the logits otherwise; the constrained rows' masks are computed on
//! helper threads meanwhile (`crate::masks`).

use tandem_core::sampling::{LogitEdit, RowMasks};

use super::speculate::{drafted_output, Speculator};
use super::{banned, banned_at, Engine};
use crate::masks::{admits_some, compute_masks, mask_threads, MaskDone, MaskJob};
use crate::sampler::{has_edits, needs_host, penalty_edits, spec, SampleSpec, TokenLogprobs};
use crate::scheduler::SchedulerOutput;
use crate::sequence::GuideState;
use crate::worker::worker_gone;

/// What a step's forward brought back: token ids (sampled by the model) or logits.
pub(super) enum Sampled {
    Ids(Vec<u32>),
    /// Ids, and the logprobs of the rows that asked (computed where the logits are).
    IdsLogprobs(Vec<u32>, Vec<Option<TokenLogprobs>>),
    Logits(Vec<f32>),
}

/// A step sampled where the logits are: one spec per sampled row, the edited rows' edits, and
/// each row's logprob count (None: not asked).
pub(super) struct DeviceSampling {
    pub(super) specs: Vec<SampleSpec>,
    pub(super) edits: Vec<(usize, Vec<LogitEdit>)>,
    pub(super) top_n: Vec<Option<usize>>,
}

impl DeviceSampling {
    /// Only ids: what an overlapped step (the worker) can do.
    pub(super) fn ids_only(&self) -> bool {
        self.edits.is_empty() && self.top_n.iter().all(Option::is_none)
    }
}

impl Engine {
    /// Runs the step's batch. Token ids come back from the model when every row can be sampled
    /// where the logits are; one row that needs the host (see [`needs_host`]) brings the whole
    /// step's logits back instead. Both give the same ids for a row without penalties.
    pub(super) fn forward(&mut self, out: &SchedulerOutput) -> Result<Sampled, String> {
        let batch = self.scheduler.forward_batch(out);
        let rows = batch.logit_rows.len();
        // The constraints of the rows sampled this step give their masks while the model runs
        // (row: the index among the sampled rows, which is the spec's on the device path; a
        // decode with drafts has a row for each). A decode whose drafts were checked against
        // its constraint has its rows' masks already (`ready`).
        let mut jobs: Vec<MaskJob> = Vec::new();
        let mut ready: Vec<(usize, Vec<u32>)> = Vec::new();
        // Every sampled row's mask counts, a draft row's too (vLLM fills a bitmask row for
        // each scheduled draft and the row after them).
        let mut mask_seconds: Vec<f64> = Vec::new();
        let mut row = 0;
        for s in out.seqs.iter().filter(|s| s.sample) {
            let Some(seq) = self.scheduler.seq_mut(s.seq) else {
                row += 1 + s.num_draft;
                continue;
            };
            let n = seq.num_tokens();
            match seq.guide.as_mut() {
                Some(g) if g.drafted.as_ref().is_some_and(|d| d.at == n && d.masks.len() > s.num_draft) => {
                    let masks = &g.drafted.as_ref().expect("checked").masks;
                    g.mask = Some(Ok(masks[0].clone()));
                    ready.extend(masks[..=s.num_draft].iter().enumerate().map(|(i, m)| (row + i, m.clone())));
                    let seconds = &g.drafted.as_ref().expect("checked").seconds;
                    mask_seconds.extend(seconds.iter().take(s.num_draft + 1));
                }
                // No masks for this step's rows yet (any kept are stale): a job computes them.
                Some(_) => jobs.push((row, s.seq, seq.guide.take().expect("matched").constraint)),
                None => {}
            }
            row += 1 + s.num_draft;
        }
        let device = self.device_specs(out);
        // Synchronous: the forward runs on this thread, the runner borrowed from the worker
        // (idle: nothing is in flight), which saves two thread hand-offs a step (measured
        // with benches/scheduler.rs, 256 decodes, null model, on a loaded 2-core machine:
        // ~580 us/step through the worker, ~410-460 us direct; noisy).
        let mut guard = match self.runner.lock() {
            Ok(g) => g,
            Err(_) => return Err(self.forward_error(worker_gone())),
        };
        let (vocab, runner) = (self.vocab, &mut **guard);
        let (result, masks) = std::thread::scope(|sc| {
            let mut handle = (!jobs.is_empty()).then(|| {
                sc.spawn(move || {
                    let threads = mask_threads(jobs.len(), std::thread::available_parallelism().map_or(1, |n| n.get()));
                    compute_masks(jobs, vocab, threads)
                })
            });
            let mut joined: Option<Vec<MaskDone>> = None;
            let join = |h: &mut Option<std::thread::ScopedJoinHandle<'_, Vec<MaskDone>>>| {
                h.take().map(|h| h.join().expect("computing a mask panicked")).unwrap_or_default()
            };
            let result = match device {
                Some(DeviceSampling { specs, edits, top_n })
                    if handle.is_some()
                        || !ready.is_empty()
                        || !edits.is_empty()
                        || top_n.iter().any(Option::is_some) =>
                {
                    // Masked and edited rows sample on the device too: only their masks and
                    // edits go up.
                    let mut edits = Some(edits);
                    let mut provide = || {
                        let done = join(&mut handle);
                        let mut m = RowMasks::none(specs.len(), vocab);
                        for d in done.iter().filter(|d| d.mask.as_ref().is_ok_and(|m| admits_some(m))) {
                            m.set(d.row, d.mask.as_ref().expect("filtered on Ok"));
                        }
                        for (row, mask) in ready.iter().filter(|(_, m)| admits_some(m)) {
                            m.set(*row, mask);
                        }
                        for (row, e) in edits.take().unwrap_or_default() {
                            m.set_edits(row, e);
                        }
                        joined = Some(done);
                        Ok(m)
                    };
                    if top_n.iter().any(Option::is_some) {
                        runner
                            .forward_sampled_logprobs(&batch, &specs, &mut provide, &top_n)
                            .map(|(ids, lps)| Sampled::IdsLogprobs(ids, lps))
                    } else {
                        runner.forward_sampled_masked(&batch, &specs, &mut provide).map(Sampled::Ids)
                    }
                }
                Some(DeviceSampling { specs, .. }) => runner.forward_sampled(&batch, &specs).map(Sampled::Ids),
                None => runner.forward(&batch).map(Sampled::Logits),
            };
            let masks = joined.take().unwrap_or_else(|| join(&mut handle));
            (result, masks)
        });
        // A draft head reads the hidden states the forward kept, row by row in batch order.
        let aux = self.speculator.as_mut().and_then(Speculator::head).map(|_| runner.take_aux_hidden());
        drop(guard);
        if let (Some(aux), Some(sp)) = (aux, self.speculator.as_mut()) {
            let sched = &self.scheduler;
            let chunks = out.seqs.iter().map(|s| match sched.seq(s.seq) {
                Some(q) => (s.seq, q.num_computed_tokens, s.num_tokens, q.block_hashes.as_slice()),
                None => (s.seq, 0, s.num_tokens, &[][..]),
            });
            if let Some(h) = sp.head() {
                h.landed(chunks, if result.is_ok() { &aux } else { &[] });
            }
        }
        for d in masks {
            mask_seconds.push(d.seconds);
            if let Some(seq) = self.scheduler.seq_mut(d.seq) {
                seq.guide = Some(GuideState { constraint: d.constraint, mask: Some(d.mask), drafted: None });
            }
        }
        if !mask_seconds.is_empty() {
            if let Ok(mut st) = self.stats.lock() {
                st.record_masks(&mask_seconds);
            }
        }
        match result.map_err(|e| self.forward_error(e))? {
            Sampled::Ids(ids) if ids.len() != rows => {
                Err(format!("model returned {} token ids for {rows} rows", ids.len()))
            }
            Sampled::IdsLogprobs(ids, lps) if ids.len() != rows || lps.len() != rows => {
                Err(format!("model returned {} token ids and {} logprobs for {rows} rows", ids.len(), lps.len()))
            }
            Sampled::Logits(l) if l.len() != rows * self.vocab => {
                Err(format!("model returned {} logits for {rows} rows of vocabulary {}", l.len(), self.vocab))
            }
            ok => Ok(ok),
        }
    }

    /// One spec per sampled row, or None when some row must be sampled on the host.
    /// The step's sampling specs and each edited row's edits (row: its index among the
    /// sampled rows) when every row can be sampled on the device; None: the host samples.
    pub(super) fn device_specs(&self, out: &SchedulerOutput) -> Option<DeviceSampling> {
        let mut specs = Vec::with_capacity(out.seqs.len());
        let mut edits = vec![];
        let mut top_n = Vec::with_capacity(out.seqs.len());
        for s in out.seqs.iter().filter(|s| s.sample || s.all_logits) {
            // Prompt logprobs need every position's logits on the host.
            if s.all_logits {
                return None;
            }
            let seq = self.scheduler.seq(s.seq)?;
            if needs_host(&seq.params, &banned(&self.eos, seq), seq.guide.is_some() || seq.params.guided.is_some()) {
                return None;
            }
            // The sequence's row, then each draft's: row `i` samples output token `j + i` with
            // the penalties and bans it would have had drafts `0..i` been emitted.
            let j = seq.num_output_tokens();
            for i in 0..=s.num_draft {
                let b = banned_at(&self.eos, seq, j + i);
                if has_edits(&seq.params, &b) {
                    let output = drafted_output(seq, i);
                    edits.push((specs.len(), penalty_edits(&seq.params, seq.prompt(), &output, &b, self.vocab)));
                }
                top_n.push(seq.params.logprobs);
                specs.push(spec(&seq.params, seq.seed, seq.index, j + i));
            }
        }
        Some(DeviceSampling { specs, edits, top_n })
    }
}
