//! The sampling launchers of [`CudaBackend`] beyond `sample` and `argmax` (kernels/sampling.cu):
//! the logit edits (penalties, `logit_bias`, bans) applied in place before sampling, the
//! masked sample, and the logprobs of the raw logits after it (`logit_restore`, `logprobs`),
//! so that only ids and the asked logprobs leave the device.

use cudarc::driver::PushKernelArg;
use tandem_core::backend::{Sampling, Storage};
use tandem_core::sampling::{
    logprobs_rows, sample_rows_masked, RowMasks, SampleSpec, TokenLogprobs, MAX_TOP_LOGPROBS, SAMPLE_LANES,
};
use tandem_core::Result;

use crate::buf::{need, CudaBuf, Elem};
use crate::device::CudaBackend;
use crate::error::err;
use crate::launch::{cfg, i32_of};
use crate::switches::Sampler;
use crate::workspace::IoScratch;

/// CTAs a row of the multi-CTA sampler, and its top-p passes (kernels/sampling.cu SMC_CTAS,
/// SMC_PASSES).
const SMC_CTAS: u32 = 64;
const SMC_PASSES: i32 = 6;

impl CudaBackend {
    /// `logit_edits` on the logits in place (the rows' penalties, logit_bias and bans: what
    /// `sample_masked` samples from), each record's raw logit kept for `logit_restore`. False,
    /// with nothing launched, when the records exceed the workspace reserved at load.
    pub(super) fn edit_logits(&self, logits: &CudaBuf, rows: usize, vocab: usize, masks: &RowMasks) -> Result<bool> {
        const OP: &str = "logit_edits";
        let (start, words) = masks.edit_words();
        let records = *start.last().unwrap_or(&0) as usize;
        let mut s =
            self.io_scratch.lock().map_err(|_| err(format!("{OP}: scratch lock poisoned by an earlier panic")))?;
        let short = |b: &Option<CudaBuf>, n: usize| b.as_ref().is_none_or(|b| b.len < n);
        if short(&s.edit_start, start.len())
            || short(&s.edits, words.len().max(1))
            || short(&s.edit_saved, records.max(1))
        {
            if s.fixed {
                return Ok(false);
            }
            s.edit_start = Some(self.alloc(Elem::U32, start.len())?);
            s.edits = Some(self.alloc(Elem::U32, words.len().max(1))?);
            s.edit_saved = Some(self.alloc(Elem::F32, records.max(1))?);
        }
        let IoScratch { edit_start: Some(sb), edits: Some(eb), edit_saved: Some(saved), .. } = &mut *s else {
            return Err(err(format!("{OP}: edit buffers missing after allocation")));
        };
        self.write_u32(sb, &start)?;
        if !words.is_empty() {
            self.write_u32(eb, &words)?;
        }
        let (ri, vi) = (i32_of(rows, OP, "rows")?, i32_of(vocab, OP, "vocab")?);
        let mut l = self.stream.launch_builder(&self.kernels.logit_edits.f);
        l.arg(&*logits.mem).arg(&*sb.mem).arg(&*eb.mem).arg(&mut *saved.mem).arg(&ri).arg(&vi);
        // SAFETY: start holds rows + 1 record offsets into `eb`'s records (and `saved`'s floats);
        // each record's token is below vocab (`RowMasks::check`) and the kernel skips any that is
        // not; a row edits each token once, so no two threads write the same logit. The logits
        // are edited in place: `Sampling::sample_masked` leaves them unspecified.
        let r = unsafe { l.launch(cfg((ri as u32, 1, 1), SAMPLE_LANES as u32)) };
        self.launched(OP, r)?;
        Ok(true)
    }

    /// The raw logits back where the last `edit_logits` changed them.
    fn restore_logits(&self, logits: &CudaBuf, rows: usize, vocab: usize) -> Result<()> {
        const OP: &str = "logit_restore";
        let s = self.io_scratch.lock().map_err(|_| err(format!("{OP}: scratch lock poisoned by an earlier panic")))?;
        let IoScratch { edit_start: Some(sb), edits: Some(eb), edit_saved: Some(saved), .. } = &*s else {
            return Err(err(format!("{OP}: edit buffers missing")));
        };
        let (ri, vi) = (i32_of(rows, OP, "rows")?, i32_of(vocab, OP, "vocab")?);
        let mut l = self.stream.launch_builder(&self.kernels.logit_restore.f);
        l.arg(&*logits.mem).arg(&*sb.mem).arg(&*eb.mem).arg(&*saved.mem).arg(&ri).arg(&vi);
        // SAFETY: the records and saved values the preceding logit_edits launch used.
        let r = unsafe { l.launch(cfg((ri as u32, 1, 1), SAMPLE_LANES as u32)) };
        self.launched(OP, r)
    }

    /// Samples the (already edited) logits: `sample` without masks, `sample_masked` with them.
    pub(super) fn sample_edited(
        &self,
        logits: &CudaBuf,
        rows: usize,
        vocab: usize,
        specs: &[SampleSpec],
        masks: &RowMasks,
    ) -> Result<Vec<u32>> {
        const OP: &str = "sample_masked";
        if masks.bits.is_empty() {
            return self.sample(logits, rows, vocab, specs);
        }
        let (ri, vi, wi) =
            (i32_of(rows, OP, "rows")?, i32_of(vocab, OP, "vocab")?, i32_of(masks.words, OP, "mask words")?);
        i32_of(rows * vocab, OP, "rows*vocab")?;
        let words: Vec<u32> = specs.iter().flat_map(SampleSpec::to_words).collect();
        let index: Vec<u32> = masks.index.iter().map(|&i| i as u32).collect();
        let mut io = self.io_scratch_masked(rows, words.len(), masks.bits.len(), OP)?;
        let IoScratch {
            ids: Some(_), specs: Some(spec_buf), masks: Some(mask_buf), mask_index: Some(index_buf), ..
        } = &mut *io
        else {
            return Err(err(format!("{OP}: id, spec or mask buffer missing after allocation")));
        };
        // Only the constrained rows' masks go up (`RowMasks` packs them).
        self.write_u32(spec_buf, &words)?;
        self.write_u32(mask_buf, &masks.bits)?;
        self.write_u32(index_buf, &index)?;
        if self.switches.sampler == Sampler::Multi && self.sample_multi(&mut io, logits, rows, vocab, true)? {
            let IoScratch { ids: Some(ids), .. } = &*io else { return Err(err(format!("{OP}: id buffer missing"))) };
            return self.read_u32(ids, rows);
        }
        let IoScratch {
            ids: Some(ids), specs: Some(spec_buf), masks: Some(mask_buf), mask_index: Some(index_buf), ..
        } = &mut *io
        else {
            return Err(err(format!("{OP}: id, spec or mask buffer missing after allocation")));
        };
        let f = if self.switches.sampler == Sampler::Radix {
            &self.kernels.sample_masked_radix.f
        } else {
            &self.kernels.sample_masked.f
        };
        let mut l = self.stream.launch_builder(f);
        l.arg(&*logits.mem)
            .arg(&*spec_buf.mem)
            .arg(&mut *ids.mem)
            .arg(&ri)
            .arg(&vi)
            .arg(&*mask_buf.mem)
            .arg(&*index_buf.mem)
            .arg(&wi);
        // SAFETY: as in `sample`; masks hold `words` words per packed row, the index one i32 a
        // row, each below the packed count (`RowMasks::check`).
        let r = unsafe { l.launch(cfg((ri as u32, 1, 1), SAMPLE_LANES as u32)) };
        self.launched(OP, r)?;
        self.read_u32(ids, rows)
    }

    /// `TANDEM_CUDA_SAMPLER=multi`: the rows' ids into the id buffer by kernels/sampling.cu
    /// `sample_mc_*` (the specs, and with `masked` the masks, already in `io`): twelve launches
    /// of fixed shape, nothing read back. False, with nothing launched, when the workspace
    /// reserved at load is short of `rows` (the caller then takes the one-CTA kernel: same ids).
    pub(super) fn sample_multi(
        &self,
        io: &mut IoScratch,
        logits: &CudaBuf,
        rows: usize,
        vocab: usize,
        masked: bool,
    ) -> Result<bool> {
        const OP: &str = "sample_mc";
        let words = rows * SMC_WORDS;
        if !io.fixed && io.sample_ws.as_ref().is_none_or(|b| b.len < words) {
            io.sample_ws = Some(self.alloc(Elem::U32, words)?);
        }
        let IoScratch { ids: Some(ids), specs: Some(spec_buf), sample_ws: Some(ws), masks, mask_index, .. } = io else {
            return Ok(false);
        };
        if ws.len < words {
            return Ok(false);
        }
        // Unmasked: mask_words 0, and the spec buffer stands in for the mask pointers (not read).
        let (mask_buf, index_buf, wi) = match (masked, masks.as_ref(), mask_index.as_ref()) {
            (true, Some(m), Some(i)) => (m, i, i32_of(vocab.div_ceil(32), OP, "mask words")?),
            (true, ..) => return Err(err(format!("{OP}: mask buffers missing"))),
            _ => (&*spec_buf, &*spec_buf, 0i32),
        };
        let (ri, vi) = (i32_of(rows, OP, "rows")?, i32_of(vocab, OP, "vocab")?);
        let grid = (SMC_CTAS, ri as u32, 1);
        let k = &self.kernels;
        let mut l = self.stream.launch_builder(&k.sample_mc_max.f);
        l.arg(&*logits.mem).arg(&mut *ws.mem).arg(&ri).arg(&vi).arg(&*mask_buf.mem).arg(&*index_buf.mem).arg(&wi);
        // SAFETY (all twelve): logits rows x vocab f32 (checked by the callers), specs
        // SPEC_WORDS a row, ws SMC_WORDS a row (checked above), ids one a row; with wi > 0 the
        // masks hold wi words per packed row and the index one i32 a row (`RowMasks::check`),
        // with wi 0 the mask pointers are not read.
        let r = unsafe { l.launch(cfg(grid, SAMPLE_LANES as u32)) };
        self.launched(k.sample_mc_max.name, r)?;
        for p in 0..4i32 {
            let mut l = self.stream.launch_builder(&k.sample_mc_topk.f);
            l.arg(&*logits.mem)
                .arg(&*spec_buf.mem)
                .arg(&mut *ws.mem)
                .arg(&ri)
                .arg(&vi)
                .arg(&*mask_buf.mem)
                .arg(&*index_buf.mem)
                .arg(&wi)
                .arg(&p);
            // SAFETY: as above.
            let r = unsafe { l.launch(cfg(grid, SAMPLE_LANES as u32)) };
            self.launched(k.sample_mc_topk.name, r)?;
        }
        for q in 0..SMC_PASSES {
            let mut l = self.stream.launch_builder(&k.sample_mc_topp.f);
            l.arg(&*logits.mem)
                .arg(&*spec_buf.mem)
                .arg(&mut *ws.mem)
                .arg(&ri)
                .arg(&vi)
                .arg(&*mask_buf.mem)
                .arg(&*index_buf.mem)
                .arg(&wi)
                .arg(&q);
            // SAFETY: as above.
            let r = unsafe { l.launch(cfg(grid, SAMPLE_LANES as u32)) };
            self.launched(k.sample_mc_topp.name, r)?;
        }
        let mut l = self.stream.launch_builder(&k.sample_mc_draw.f);
        l.arg(&*logits.mem)
            .arg(&*spec_buf.mem)
            .arg(&mut *ws.mem)
            .arg(&mut *ids.mem)
            .arg(&ri)
            .arg(&vi)
            .arg(&*mask_buf.mem)
            .arg(&*index_buf.mem)
            .arg(&wi);
        // SAFETY: as above; writes ids[0..rows].
        let r = unsafe { l.launch(cfg((ri as u32, 1, 1), SAMPLE_LANES as u32)) };
        self.launched(k.sample_mc_draw.name, r)?;
        Ok(true)
    }

    /// `Sampling::sample_logprobs`: edits, the sample, the edits undone, then `logprobs` for the
    /// rows that ask (on the ids the sample left in the id buffer).
    pub(super) fn sample_with_logprobs(
        &self,
        logits: &CudaBuf,
        rows: usize,
        vocab: usize,
        specs: &[SampleSpec],
        masks: &RowMasks,
        top_n: &[Option<usize>],
    ) -> Result<(Vec<u32>, Vec<Option<TokenLogprobs>>)> {
        const OP: &str = "sample_logprobs";
        if top_n.len() != rows || specs.len() != rows || vocab == 0 {
            return Err(err(format!(
                "{OP}: {} specs and {} logprob counts for {rows} rows of vocabulary {vocab}",
                specs.len(),
                top_n.len()
            )));
        }
        if !masks.index.is_empty() || !masks.edits.is_empty() {
            masks.check(rows, vocab).map_err(|m| err(format!("{OP}: {m}")))?;
        }
        need(logits, Elem::F32, rows * vocab, OP, "logits")?;
        if top_n.iter().all(Option::is_none) {
            return Ok((self.sample_masked(logits, rows, vocab, specs, masks)?, vec![None; rows]));
        }
        let host = |v: &[f32]| {
            let ids = sample_rows_masked(v, vocab, specs, masks);
            let lps = logprobs_rows(v, vocab, &ids, top_n);
            (ids, lps)
        };
        let edited = masks.has_edits();
        if edited && !self.edit_logits(logits, rows, vocab, masks)? {
            // More edits than the reserved records: the host, with the same results.
            return Ok(host(&self.read_f32(logits, rows * vocab)?));
        }
        let ids = self.sample_edited(logits, rows, vocab, specs, masks)?;
        if edited {
            self.restore_logits(logits, rows, vocab)?;
        }
        let k = MAX_TOP_LOGPROBS;
        let want: Vec<u32> = top_n.iter().map(|n| n.map_or(u32::MAX, |n| n.min(k) as u32)).collect();
        let mut s =
            self.io_scratch.lock().map_err(|_| err(format!("{OP}: scratch lock poisoned by an earlier panic")))?;
        let short = |b: &Option<CudaBuf>, n: usize| b.as_ref().is_none_or(|b| b.len < n);
        if short(&s.top_n, rows)
            || short(&s.lp, rows)
            || short(&s.top_ids, rows * k)
            || short(&s.top_lp, rows * k)
            || short(&s.ids, rows)
        {
            if s.fixed {
                return Err(err(format!("{OP}: {rows} logit rows exceed the workspace reserved at load")));
            }
            s.top_n = Some(self.alloc(Elem::U32, rows)?);
            s.lp = Some(self.alloc(Elem::F32, rows)?);
            s.top_ids = Some(self.alloc(Elem::U32, rows * k)?);
            s.top_lp = Some(self.alloc(Elem::F32, rows * k)?);
        }
        let IoScratch { ids: Some(id_buf), top_n: Some(tn), lp: Some(lp), top_ids: Some(ti), top_lp: Some(tl), .. } =
            &mut *s
        else {
            return Err(err(format!("{OP}: logprob buffers missing after allocation")));
        };
        // The sample left `ids` in the id buffer; write them again anyway (a host fallback
        // inside `sample` would not have).
        self.write_u32(id_buf, &ids)?;
        self.write_u32(tn, &want)?;
        let (ri, vi) = (i32_of(rows, OP, "rows")?, i32_of(vocab, OP, "vocab")?);
        let mut l = self.stream.launch_builder(&self.kernels.logprobs.f);
        l.arg(&*logits.mem)
            .arg(&*id_buf.mem)
            .arg(&*tn.mem)
            .arg(&mut *lp.mem)
            .arg(&mut *ti.mem)
            .arg(&mut *tl.mem)
            .arg(&ri)
            .arg(&vi);
        // SAFETY: one id and one count a row, the outputs rows and rows x MAX_TOP_LOGPROBS long.
        let r = unsafe { l.launch(cfg((ri as u32, 1, 1), SAMPLE_LANES as u32)) };
        self.launched("logprobs", r)?;
        let (lps, tis, tls) = (self.read_f32(lp, rows)?, self.read_u32(ti, rows * k)?, self.read_f32(tl, rows * k)?);
        let out = (0..rows)
            .map(|r| {
                top_n[r].map(|_| TokenLogprobs {
                    token: ids[r],
                    logprob: lps[r],
                    top: (0..k).map(|i| (tis[r * k + i], tls[r * k + i])).take_while(|(t, _)| *t != u32::MAX).collect(),
                })
            })
            .collect();
        Ok((ids, out))
    }
}

/// Workspace words a row of the multi-CTA sampler (kernels/sampling.cu SMC_WORDS).
pub(crate) const SMC_WORDS: usize = 10400;

/// Logits one `argmax_partial` CTA folds (kernels/argmax.cu AMX_CHUNK).
pub(crate) const ARGMAX_CHUNK: usize = 4096;

#[cfg(test)]
mod tests {
    /// The launcher's copy of the multi-CTA sampler's constants is the kernel's.
    #[test]
    fn multi_sampler_constants_match_the_kernel() {
        let src = crate::sources::EMBEDDED.iter().find(|(n, _)| *n == "sampling").map(|(_, s)| *s).unwrap();
        for (name, v) in [
            ("SMC_WORDS", super::SMC_WORDS as u64),
            ("SMC_CTAS", super::SMC_CTAS as u64),
            ("SMC_PASSES", super::SMC_PASSES as u64),
        ] {
            assert!(
                src.lines().any(|l| l.trim_start().starts_with(&format!("#define {name} {v}"))),
                "kernels/sampling.cu does not define {name} {v}"
            );
        }
    }
}
