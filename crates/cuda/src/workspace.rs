//! The step workspace: the attention, matmul, sampling and mixture-of-experts scratch, reserved
//! once for the model's limits (`Device::reserve_workspace`) so that no step allocates, or
//! grown at first use where nothing reserved it (ops called directly: tests, `tandem test-ops`).

use cudarc::driver::CudaSlice;
use tandem_core::backend::WorkspaceLimits;
use tandem_core::sampling::{EDIT_WORDS, MAX_TOP_LOGPROBS, SPEC_WORDS};
use tandem_core::Result;

use crate::buf::{CudaBuf, Elem};
use crate::device::CudaBackend;
use crate::error::{drv, err};
use crate::gemm::{GEMM_COUNTERS, GEMM_PART_FLOATS};
use crate::sampling::{ARGMAX_CHUNK, SMC_WORDS};
use crate::switches::{Sampler, Switches};
use crate::{attention, moe};

/// Scratch of the split attention: partial outputs, (max, sum) pairs and one arrival counter
/// per (token, head) for the in-kernel combine (zeroed once; every launch leaves them 0). Sized once by
/// `Device::reserve_workspace` (the model does, before the KV pool); grown on demand only
/// where nothing reserved it (ops called directly: tests, `tandem test-ops`).
#[derive(Default)]
pub(crate) struct AttnScratch {
    pub(crate) part_out: Option<CudaSlice<u8>>,
    pub(crate) part_ml: Option<CudaSlice<u8>>,
    pub(crate) counters: Option<CudaSlice<u8>>,
    /// Reserved for limits: a step that needs more fails instead of allocating.
    pub(crate) fixed: bool,
}

/// Scratch of the tensor-core matmul: x rounded to the weights' 16-bit format (m > 128 only),
/// the split-K workspace (GEMM_PART_FLOATS) and its arrival counters (GEMM_COUNTERS words,
/// zeroed once: every launch leaves them zero). Reserved like [`AttnScratch`], else allocated
/// at first use.
#[derive(Default)]
pub(crate) struct MatmulScratch {
    pub(crate) xa: Option<CudaSlice<u8>>,
    pub(crate) part: Option<CudaSlice<u8>>,
    pub(crate) counters: Option<CudaSlice<u8>>,
    pub(crate) fixed: bool,
}

/// The ids argmax and sample write, and the specs sample reads: reserved for the logit rows
/// like [`AttnScratch`], else grown at first use.
#[derive(Default)]
pub(crate) struct IoScratch {
    pub(crate) ids: Option<CudaBuf>,
    pub(crate) specs: Option<CudaBuf>,
    /// Masked sampling: the constrained rows' mask bits, and each row's mask index (i32 as u32).
    pub(crate) masks: Option<CudaBuf>,
    pub(crate) mask_index: Option<CudaBuf>,
    /// Logit edits (penalties, logit_bias, bans): each row's first record (rows + 1 entries)
    /// and the records, EDIT_WORDS words each. Reserved for EDIT_RECORDS records; a step with
    /// more samples on the host (the same ids) rather than allocate mid-serving.
    pub(crate) edit_start: Option<CudaBuf>,
    pub(crate) edits: Option<CudaBuf>,
    /// Each record's logit before its edit (`logit_restore` puts them back for logprobs).
    pub(crate) edit_saved: Option<CudaBuf>,
    /// Logprobs: each row's top count (u32::MAX: none), the sampled token's logprob, and the
    /// top MAX_TOP_LOGPROBS ids and logprobs a row.
    pub(crate) top_n: Option<CudaBuf>,
    pub(crate) lp: Option<CudaBuf>,
    pub(crate) top_ids: Option<CudaBuf>,
    pub(crate) top_lp: Option<CudaBuf>,
    /// `TANDEM_CUDA_ARGMAX=multi`: each row's per-chunk (value, index) pairs, two words each.
    pub(crate) argmax_part: Option<CudaBuf>,
    /// `TANDEM_CUDA_SAMPLER=multi`: SMC_WORDS words a row.
    pub(crate) sample_ws: Option<CudaBuf>,
    pub(crate) fixed: bool,
}

/// Logit-edit records reserved at load: a row edits the tokens its prompt and output hold
/// (repetition) at most, so this covers 64 rows of 4,096 distinct tokens (5.2 MB).
pub(crate) const EDIT_RECORDS: usize = 1 << 18;

/// Bytes of the step workspace for `l`: (attention partial outputs, attention (max, sum)
/// pairs, matmul x in 16 bits, split-K partials); the attention's is [`attention::workspace`].
pub(crate) fn workspace_bytes(l: &WorkspaceLimits, sw: &Switches) -> (usize, usize, usize, usize) {
    let (out, ml, _) = attention::workspace(l, sw);
    let m = l.max_tokens.max(l.max_logit_rows);
    let xa = (m * l.max_k.div_ceil(8) * 8 * 2).max(16);
    (out, ml, xa, GEMM_PART_FLOATS * 4)
}

impl CudaBackend {
    /// `Device::reserve_workspace`: every scratch below, sized for `l` and fixed.
    pub(crate) fn reserve(&self, l: &WorkspaceLimits) -> Result<u64> {
        const OP: &str = "reserve_workspace";
        let (out, ml, xa, part) = workspace_bytes(l, &self.switches);
        let alloc = |bytes: usize, what: &str| -> Result<Option<CudaSlice<u8>>> {
            if bytes == 0 {
                return Ok(None);
            }
            // SAFETY: scratch contents are unspecified; every kernel writes what it later reads.
            let mem = unsafe { self.stream.alloc::<u8>(bytes) }
                .map_err(drv(&format!("{OP}: {what} of {bytes} bytes for {l:?}")))?;
            Ok(Some(mem))
        };
        let mut a = self.scratch.lock().map_err(|_| err(format!("{OP}: scratch lock poisoned by an earlier panic")))?;
        // Dropped first, so that a second reservation never holds both sizes at once.
        *a = AttnScratch::default();
        let counter_bytes = attention::workspace(l, &self.switches).2;
        let counters = if counter_bytes > 0 {
            Some(self.stream.alloc_zeros::<u8>(counter_bytes).map_err(drv(&format!("{OP}: attention counters")))?)
        } else {
            None
        };
        *a = AttnScratch {
            part_out: alloc(out, "attention partials")?,
            part_ml: alloc(ml, "attention (max, sum) pairs")?,
            counters,
            fixed: true,
        };
        let mut m =
            self.mm_scratch.lock().map_err(|_| err(format!("{OP}: scratch lock poisoned by an earlier panic")))?;
        *m = MatmulScratch::default();
        let counters =
            self.stream.alloc_zeros::<u8>(GEMM_COUNTERS * 4).map_err(drv(&format!("{OP}: split-K counters")))?;
        *m = MatmulScratch {
            xa: alloc(xa, "matmul x in 16 bits")?,
            part: alloc(part, "split-K workspace")?,
            counters: Some(counters),
            fixed: true,
        };
        let rows = l.max_logit_rows.max(1);
        let mut io =
            self.io_scratch.lock().map_err(|_| err(format!("{OP}: scratch lock poisoned by an earlier panic")))?;
        // Every row may be constrained: a mask of the largest output width (the vocabulary) each.
        let mask_words = rows * l.max_n.div_ceil(32);
        let argmax_part_words = 2 * rows * l.max_n.div_ceil(ARGMAX_CHUNK).max(1);
        // Only under the switch: 40.6 KiB a logit row.
        let sample_ws_words = if self.switches.sampler == Sampler::Multi { rows * SMC_WORDS } else { 0 };
        *io = IoScratch {
            ids: Some(self.alloc(Elem::U32, rows)?),
            specs: Some(self.alloc(Elem::U32, rows * SPEC_WORDS)?),
            masks: Some(self.alloc(Elem::U32, mask_words.max(1))?),
            mask_index: Some(self.alloc(Elem::U32, rows)?),
            edit_start: Some(self.alloc(Elem::U32, rows + 1)?),
            edits: Some(self.alloc(Elem::U32, EDIT_RECORDS * EDIT_WORDS)?),
            edit_saved: Some(self.alloc(Elem::F32, EDIT_RECORDS)?),
            top_n: Some(self.alloc(Elem::U32, rows)?),
            lp: Some(self.alloc(Elem::F32, rows)?),
            top_ids: Some(self.alloc(Elem::U32, rows * MAX_TOP_LOGPROBS)?),
            top_lp: Some(self.alloc(Elem::F32, rows * MAX_TOP_LOGPROBS)?),
            argmax_part: Some(self.alloc(Elem::U32, argmax_part_words)?),
            sample_ws: if sample_ws_words > 0 { Some(self.alloc(Elem::U32, sample_ws_words)?) } else { None },
            fixed: true,
        };
        let moe_bytes = moe::workspace(l.max_tokens, l.moe.as_ref());
        let mut ms =
            self.moe_scratch.lock().map_err(|_| err(format!("{OP}: scratch lock poisoned by an earlier panic")))?;
        *ms = moe::MoeScratch::default();
        *ms = moe::MoeScratch { mem: alloc(moe_bytes, "routed mixture-of-experts scratch")?, fixed: true };
        let io_bytes = (rows * (5 + SPEC_WORDS + 2 * MAX_TOP_LOGPROBS)
            + 1
            + mask_words
            + EDIT_RECORDS * (EDIT_WORDS + 1)
            + argmax_part_words
            + sample_ws_words)
            * 4;
        // The allocations are stream-ordered: wait, so that free_memory sees them.
        self.synchronize()?;
        Ok((out + ml + counter_bytes + xa + part + GEMM_COUNTERS * 4 + io_bytes + moe_bytes) as u64)
    }

    /// The id buffer (at least `rows`) and spec buffer (at least `spec_words`), grown only
    /// where nothing was reserved.
    pub(crate) fn io_scratch(
        &self,
        rows: usize,
        spec_words: usize,
        op: &str,
    ) -> Result<std::sync::MutexGuard<'_, IoScratch>> {
        self.io_scratch_masked(rows, spec_words, 0, op)
    }

    /// As [`Self::io_scratch`], with room for `mask_words` words of masks and `rows` indices
    /// when `mask_words` > 0.
    pub(crate) fn io_scratch_masked(
        &self,
        rows: usize,
        spec_words: usize,
        mask_words: usize,
        op: &str,
    ) -> Result<std::sync::MutexGuard<'_, IoScratch>> {
        let mut s =
            self.io_scratch.lock().map_err(|_| err(format!("{op}: scratch lock poisoned by an earlier panic")))?;
        let short = |b: &Option<CudaBuf>, n: usize| n > 0 && b.as_ref().is_none_or(|b| b.len < n);
        let index_rows = if mask_words > 0 { rows } else { 0 };
        if s.fixed
            && (short(&s.ids, rows)
                || short(&s.specs, spec_words)
                || short(&s.masks, mask_words)
                || short(&s.mask_index, index_rows))
        {
            return Err(err(format!("{op}: {rows} logit rows exceed the workspace reserved at load")));
        }
        if short(&s.ids, rows) {
            s.ids = Some(self.alloc(Elem::U32, rows)?);
        }
        if short(&s.specs, spec_words) {
            s.specs = Some(self.alloc(Elem::U32, spec_words)?);
        }
        if short(&s.masks, mask_words) {
            s.masks = Some(self.alloc(Elem::U32, mask_words)?);
        }
        if short(&s.mask_index, index_rows) {
            s.mask_index = Some(self.alloc(Elem::U32, index_rows)?);
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_core::backend::KvDtype;

    fn limits(max_tokens: usize, max_context: usize) -> WorkspaceLimits {
        WorkspaceLimits {
            max_tokens,
            max_seqs: 64,
            max_logit_rows: 192,
            max_context,
            num_heads: 32,
            head_dim: 64,
            max_k: 8192,
            max_n: 128256,
            kv_dtype: KvDtype::F32,
            moe: None,
        }
    }

    /// The reservation covers what paged_attention and matmul ask for at the limits (the
    /// formulas those ops use), and follows the limits: the fix for a workspace that grew with
    /// the longest context is to bound the context, and the sizes say so.
    #[test]
    fn workspace_covers_the_largest_step_and_follows_the_limits() {
        let l = limits(512, 8192);
        let (out, ml, xa, part) = workspace_bytes(&l, &Switches::default());
        let parts = attention::pa_max_parts(8192);
        assert_eq!(parts, 16);
        assert_eq!(out, 512 * 32 * parts * 64 * 4);
        assert_eq!(ml, 512 * 32 * parts * 2 * 4);
        assert_eq!(xa, 512 * 8192 * 2);
        assert_eq!(part, GEMM_PART_FLOATS * 4);
        // Any shorter context or fewer tokens fits what was reserved.
        for (t, ctx) in [(1, 1), (1, 8192), (512, 600), (100, 8000)] {
            let p = attention::pa_max_parts(ctx);
            assert!(t * 32 * p * 64 * 4 <= out && t * 32 * p * 2 * 4 <= ml, "t {t} ctx {ctx}");
        }
        // A short context limit takes the direct path: no attention scratch at all.
        let (out, ml, ..) = workspace_bytes(&limits(512, 64), &Switches::default());
        assert_eq!((out, ml), (0, 0));
        // The logit rows can exceed the tokens (prompt logprobs): x scratch covers them.
        let (.., xa, _) =
            workspace_bytes(&WorkspaceLimits { max_logit_rows: 1000, ..limits(16, 64) }, &Switches::default());
        assert_eq!(xa, 1000 * 8192 * 2);
        // 2,048 tokens over a 131k context: about 4.3 GB of attention partials, now counted
        // before the KV pool rather than allocated mid-serving.
        let (out, ..) = workspace_bytes(&limits(2048, 131072), &Switches::default());
        assert_eq!(out, 2048 * 32 * 256 * 64 * 4);
    }
}
