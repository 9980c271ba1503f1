//! Graph buckets: decode steps padded to a batch-size bucket so that each bucket's step has
//! one shape, captured once at load and replayed ([`crate::backend::Device::supports_graphs`]).

use super::Model;
use crate::backend::{Backend, GraphId};
use crate::batch::ForwardBatch;
use crate::error::Result;
use crate::meta::PadRows;

/// Capturing stops (the remaining buckets run eagerly) once it has taken this long at load.
const CAPTURE_BUDGET: std::time::Duration = std::time::Duration::from_secs(60);

/// Decode steps padded to a batch-size bucket, so that every step of one bucket has the same
/// shapes and scalars (what a captured graph fixes). Padding rows are token 0 at position 0
/// of their own one-block table, the reserved `scratch_block` (never handed to the engine):
/// they write their K/V there and nowhere else, and their logits and ids are dropped.
#[derive(Debug, Clone)]
pub(super) struct Padding {
    /// Ascending: powers of two below the largest, then the most rows a step may have.
    pub(super) buckets: Vec<usize>,
    pub(super) scratch_block: u32,
    /// Block-table entries per row of a padded step (`max_context / block_size`).
    pub(super) stride: usize,
    /// The attention's context bound for a padded step; longer decode steps run eagerly.
    pub(super) max_context: usize,
}

impl Padding {
    /// A padded step of `rows` rows: what its launches depend on.
    pub(super) fn shape(&self, rows: usize) -> StepShape {
        StepShape {
            tokens: rows,
            seqs: rows,
            logit_rows: rows,
            max_blocks: self.stride,
            max_context: self.max_context,
            decodes: rows,
        }
    }
    /// What its padding rows are, for the staging layout.
    pub(super) fn rows(&self, block_size: usize) -> PadRows {
        // A block size beyond u32 makes the scratch slot overflow: an error when staged.
        PadRows {
            scratch_block: self.scratch_block,
            stride: self.stride,
            block_size: u32::try_from(block_size).unwrap_or(u32::MAX),
        }
    }
}

/// Batch-size buckets up to `cap`: 1, 2, 4, ... below cap, then cap.
pub(super) fn buckets(cap: usize) -> Vec<usize> {
    let mut v: Vec<usize> =
        std::iter::successors(Some(1usize), |b| b.checked_mul(2)).take_while(|&b| b < cap).collect();
    v.push(cap);
    v
}

/// What a step's launches depend on besides buffer contents: what a graph fixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct StepShape {
    pub(super) tokens: usize,
    pub(super) seqs: usize,
    pub(super) logit_rows: usize,
    pub(super) max_blocks: usize,
    pub(super) max_context: usize,
    /// Leading tokens that are each a one-token sequence (`AttnArgs::decode_tokens`).
    pub(super) decodes: usize,
}

impl<B: Backend> Model<B> {
    /// Captures every bucket's decode step (largest first, within [`CAPTURE_BUDGET`]). Each is
    /// run once eagerly on a step of padding rows only (they touch only the scratch block),
    /// then recorded. If one capture fails, every bucket runs eagerly (logged: a backend that
    /// failed once is not trusted with the others); only a failure of the final sync (a lost
    /// device) fails the load.
    pub(super) fn capture_graphs(&mut self) -> Result<()> {
        let Some(pad) = self.pad.clone() else { return Ok(()) };
        let start = std::time::Instant::now();
        let launches_before = self.backend.launch_count();
        for (i, &rows) in pad.buckets.iter().enumerate().rev() {
            if start.elapsed() > CAPTURE_BUDGET {
                tracing::warn!(
                    budget_s = CAPTURE_BUDGET.as_secs(),
                    left = i + 1,
                    "graph capture over its time budget: the smaller decode buckets run eagerly"
                );
                break;
            }
            match self.capture_bucket(&pad, rows) {
                Ok(g) => self.graphs[i] = Some(g),
                Err(e) => {
                    tracing::warn!(rows, error = %e, "capturing the decode step failed: decode steps run eagerly");
                    self.graphs.iter_mut().for_each(|g| *g = None);
                    break;
                }
            }
        }
        self.backend.sync()?;
        let captured: Vec<usize> =
            pad.buckets.iter().zip(&self.graphs).filter(|(_, g)| g.is_some()).map(|(b, _)| *b).collect();
        tracing::info!(ms = start.elapsed().as_millis() as u64, ?captured, max_context = pad.max_context, launches = ?launches_before.zip(self.backend.launch_count()).map(|(a, b)| b - a), "decode graphs captured");
        Ok(())
    }

    /// Runs a step of `rows` padding rows and no real one (they touch only the scratch block)
    /// eagerly, then records it.
    fn capture_bucket(&mut self, pad: &Padding, rows: usize) -> Result<GraphId> {
        let shape = pad.shape(rows);
        self.upload_padded(
            &ForwardBatch { max_blocks: pad.stride, ..Default::default() },
            pad.rows(self.opts.block_size),
            rows,
        )?;
        // The padding rows name no adapter: the recorded step must still hold the LoRA ops.
        if let Some(lora) = &mut self.lora {
            lora.run_always();
        }
        self.launch(shape)?;
        self.backend.begin_capture()?;
        let recorded = self.launch(shape);
        let graph = self.backend.end_capture();
        recorded?;
        graph
    }

    /// The bucket index a decode step pads to: every sequence one token with its logits, in
    /// order, within the padding's context bound and largest bucket. None: run as it is.
    pub(super) fn decode_bucket(&self, batch: &ForwardBatch) -> Option<usize> {
        let pad = self.pad.as_ref()?;
        let n = batch.num_tokens();
        let in_order = |v: &[u32]| v.iter().enumerate().all(|(i, &x)| x as usize == i);
        if batch.num_seqs() != n
            || batch.logit_rows.len() != n
            || !in_order(&batch.token_seq)
            || !in_order(&batch.logit_rows)
        {
            return None;
        }
        if batch.positions.iter().any(|&p| p as usize >= pad.max_context) {
            return None;
        }
        pad.buckets.iter().position(|&b| b >= n)
    }

    /// The decode buckets and which of them replay a captured graph (tests, logs).
    pub fn decode_buckets(&self) -> Vec<(usize, bool)> {
        match &self.pad {
            Some(p) => p.buckets.iter().zip(&self.graphs).map(|(&b, g)| (b, g.is_some())).collect(),
            None => vec![],
        }
    }
}
