//! The engine's two speculative-decoding steps (the design is in [`crate::speculative`]):
//! proposing each eligible decode's drafts before the schedule, and, after the forward,
//! committing the target's ids that the drafts earned and rolling back the rest.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Instant;

use super::postprocess::Pick;
use super::Engine;
use crate::constraint::{allows, mask_words};
use crate::sampler::TokenLogprobs;
use crate::sequence::{DraftMasks, SeqId, SeqStatus, Sequence};
use crate::speculative::SpeculativeMethod;
use crate::speculative::{
    accepted_len, drafts_allowed, load_cap, Acceptance, DraftHead, DraftProposer, SpeculativeConfig,
};
use crate::worker::PLACEHOLDER;
use tandem_core::eagle3::Eagle3Head;
use tandem_core::head_layer::HeadModel;
use tandem_core::mtp::MtpHead;
use tandem_core::ModelRunner;

/// The engine's speculative decoding: its settings, where drafts come from, and each decoding
/// sequence's recent acceptance.
pub(super) struct Speculator {
    pub(super) cfg: SpeculativeConfig,
    pub(super) source: DraftSource,
    pub(super) acceptance: HashMap<SeqId, Acceptance>,
}

/// Where a speculator's drafts come from.
pub(super) enum DraftSource {
    /// The committed tokens alone (n-gram, suffix).
    Tokens(Box<dyn DraftProposer>),
    /// A draft head on the target's hidden states, which every forward then keeps.
    Head(Box<DraftHead>),
}

impl Speculator {
    /// The speculator `cfg` describes; a draft head is loaded for `runner`'s model (refused,
    /// naming what differs, when it does not fit), and the runner told to keep the hidden
    /// states the head reads; `blocks`: the KV pool's block size and count, where prefix caching
    /// is on (the head then keeps its rows of cached blocks).
    pub(super) fn new(
        cfg: SpeculativeConfig,
        runner: &mut dyn ModelRunner,
        blocks: Option<(usize, usize)>,
    ) -> Result<Self, String> {
        let source = match cfg.proposer() {
            Some(p) => DraftSource::Tokens(p),
            None => {
                let dir = cfg.model.as_deref().ok_or(match cfg.method {
                    SpeculativeMethod::Mtp => {
                        "speculative config: mtp reads the target's MTP layers: model (the target's directory) is required"
                    }
                    _ => "speculative config: model is required",
                })?;
                let mut on_device = false;
                let head: Box<dyn HeadModel> = match cfg.method {
                    SpeculativeMethod::Mtp => Box::new(MtpHead::load(dir, runner.config())?),
                    _ => {
                        let head = Eagle3Head::load(dir, runner.config())?;
                        if cfg.head_on_device {
                            on_device = runner
                                .load_draft_head(&head)
                                .map_err(|e| format!("speculative config: the draft head's weights: {e}"))?;
                        }
                        Box::new(head)
                    }
                };
                runner
                    .set_aux_layers(head.aux_layers())
                    .map_err(|e| format!("speculative config: the draft head needs hidden states: {e}"))?;
                let mut head = DraftHead::new(head);
                if on_device {
                    head.run_on_device();
                }
                if let Some((size, count)) = blocks {
                    head.keep_cached_blocks(size, count);
                }
                DraftSource::Head(Box::new(head))
            }
        };
        Ok(Speculator { cfg, source, acceptance: HashMap::new() })
    }

    /// The draft head, when drafts come from one.
    pub(super) fn head(&mut self) -> Option<&mut DraftHead> {
        match &mut self.source {
            DraftSource::Head(h) => Some(h),
            DraftSource::Tokens(_) => None,
        }
    }

    /// Hands an ended sequence's committed output to the proposer (with async scheduling its
    /// tokens may end in placeholders of a step still in flight: those are left out).
    pub(super) fn record_output(&mut self, seq: &Sequence) {
        let out = seq.output();
        let committed = out.iter().position(|&t| t == PLACEHOLDER).unwrap_or(out.len());
        match &mut self.source {
            DraftSource::Tokens(p) => p.record_output(&out[..committed]),
            DraftSource::Head(h) => h.forget(seq.id),
        }
        self.acceptance.remove(&seq.id);
    }
}

impl Engine {
    /// Whether some sequence may get drafts (the engine then runs steps synchronously: drafts
    /// come from the tokens the step before committed).
    pub(super) fn may_draft(&self) -> bool {
        self.speculator.is_some() && self.scheduler.seqs().any(drafts_allowed)
    }

    /// Gives each running decode that may have drafts up to `k` of them: fewer as the running
    /// decodes grow in number ([`load_cap`]), as far as its recent acceptance makes them worth
    /// it ([`Acceptance::allow`]), fewer when the running decodes with `k + 1` tokens each
    /// would not fit the token budget, none when they would not fit with one draft each; and
    /// no more than its `max_tokens` and the context leave room for after the target's own
    /// token. A guided decode keeps its drafts up to the first its constraint rejects
    /// ([`guide_drafts`]).
    pub(super) fn propose_drafts(&mut self) {
        let vocab = self.vocab;
        let Some(sp) = &mut self.speculator else { return };
        // A head on the device runs on the runner (idle: steps run synchronously while drafting).
        let on_device = matches!(&sp.source, DraftSource::Head(h) if h.on_device());
        let mut guard = if on_device { self.runner.lock().ok() } else { None };
        let max_model_len = self.admission.max_model_len;
        let budget = self.scheduler.config().max_num_batched_tokens;
        let decodes: Vec<SeqId> = self
            .scheduler
            .running()
            .iter()
            .copied()
            .filter(|&id| {
                self.scheduler.seq(id).is_some_and(|s| s.status == SeqStatus::Running && s.num_uncomputed() == 1)
            })
            .collect();
        let share = (budget / decodes.len().max(1)).saturating_sub(1);
        let k = sp.cfg.num_speculative_tokens;
        let k = k.min(share).min(load_cap(k, decodes.len()));
        sp.acceptance.retain(|id, _| self.scheduler.seq(*id).is_some());
        if let DraftSource::Head(h) = &mut sp.source {
            h.retain(|id| self.scheduler.seq(id).is_some());
            h.prune_blocks(|hash| self.scheduler.bm.holds(hash));
        }
        for id in decodes {
            let Some(seq) = self.scheduler.seq_mut(id) else { continue };
            seq.draft.clear();
            if let Some(g) = seq.guide.as_mut() {
                g.drafted = None;
            }
            if !drafts_allowed(seq) {
                continue;
            }
            let d = sp.acceptance.entry(id).or_default().allow(k);
            let room = (seq.max_tokens.saturating_sub(seq.num_output_tokens() + 1))
                .min(max_model_len.saturating_sub(seq.num_tokens() + 1));
            if d > 0 && room > 0 {
                seq.draft = match &mut sp.source {
                    DraftSource::Tokens(p) => p.propose(&seq.tokens, d.min(room)),
                    DraftSource::Head(h) => {
                        let runner = guard.as_deref_mut().map(|r| &mut **r as &mut dyn ModelRunner);
                        h.propose(id, &seq.tokens, seq.num_computed_tokens, d.min(room), &seq.block_hashes, runner)
                    }
                };
                guide_drafts(seq, vocab);
            }
        }
    }

    /// Commits a verified decode: `picks[i]` is the target's token after the committed tokens
    /// and drafts `0..i` (with its logprobs when the request asked). The target's tokens up to
    /// and including the first that differs from its draft are emitted in order, each through
    /// the ordinary path (so a stop or a length limit ends the sequence at the same token as
    /// without drafts); the accepted drafts' KV counts as computed; the rest is rolled back
    /// ([`crate::scheduler::Scheduler::settle_drafts`]).
    pub(super) fn emit_verified(&mut self, id: SeqId, picks: Vec<(u32, Option<TokenLogprobs>)>, now: Instant) {
        let Some(seq) = self.scheduler.seq(id) else { return };
        if picks.is_empty() {
            return;
        }
        let drafts = seq.draft.len();
        let ids: Vec<u32> = picks.iter().map(|p| p.0).collect();
        let accepted = accepted_len(&seq.draft, &ids[..ids.len() - 1]);
        if let Ok(mut st) = self.stats.lock() {
            st.record_verification(drafts, accepted);
        }
        if let Some(sp) = &mut self.speculator {
            sp.acceptance.entry(id).or_default().record(drafts, accepted);
        }
        let masks = seq.guide.as_ref().and_then(|g| g.drafted.as_ref()).map(|d| d.masks.clone());
        for (i, (token, lp)) in picks.into_iter().take(accepted + 1).enumerate() {
            // A guided row is checked against its own mask: the constraint's after the drafts
            // before it (the real constraint takes each token as it is emitted).
            if let (Some(masks), Some(g)) = (&masks, self.scheduler.seq_mut(id).and_then(|s| s.guide.as_mut())) {
                g.mask = masks.get(i).cloned().map(Ok);
            }
            self.sample_and_emit(id, Pick::Token(token, lp), None, now);
            // Ended (a stop, its length, or its caller left): its blocks are freed already.
            let Some(seq) = self.scheduler.seq_mut(id) else { return };
            if i < accepted {
                seq.num_computed_tokens += 1;
            }
        }
        self.scheduler.settle_drafts(id);
    }
}

/// Cuts a guided sequence's drafts at the first its constraint rejects, checked on a copy of
/// the constraint (the sequence's own takes only committed tokens), and keeps the masks of its
/// rows: `masks[i]` allows what may follow the committed tokens and drafts `0..i`. A draft
/// that completes the grammar is cut too (what follows a complete grammar is decided when it
/// is committed). A constraint that cannot be copied, or fails on the first mask, leaves no
/// drafts and no masks (the step's mask job then gives the one row its mask, as without
/// drafts).
fn guide_drafts(seq: &mut Sequence, vocab: usize) {
    let at = seq.num_tokens();
    let Some(g) = seq.guide.as_mut() else {
        if seq.params.guided.is_some() {
            seq.draft.clear();
        }
        return;
    };
    let Some(mut copy) = g.constraint.fork() else {
        seq.draft.clear();
        return;
    };
    let mut masks: Vec<Vec<u32>> = Vec::with_capacity(seq.draft.len() + 1);
    let mut seconds = Vec::with_capacity(seq.draft.len() + 1);
    loop {
        let mut mask = vec![u32::MAX; mask_words(vocab)];
        let t0 = Instant::now();
        if copy.fill_mask(&mut mask).is_err() {
            // This row has no mask: the draft before it goes.
            break;
        }
        seconds.push(t0.elapsed().as_secs_f64());
        masks.push(mask);
        let i = masks.len() - 1;
        let Some(&t) = seq.draft.get(i) else { break };
        if !allows(&masks[i], t) || copy.commit(t).is_err() || copy.is_finished() {
            break;
        }
    }
    seq.draft.truncate(masks.len().saturating_sub(1));
    g.drafted = (!masks.is_empty()).then_some(DraftMasks { at, masks, seconds });
}

/// The output a draft row's penalties see: `seq`'s committed output followed by its first `i`
/// drafts (what the output would be had those drafts been emitted).
pub(super) fn drafted_output(seq: &Sequence, i: usize) -> Cow<'_, [u32]> {
    match i {
        0 => Cow::Borrowed(seq.output()),
        _ => Cow::Owned([seq.output(), &seq.draft[..i]].concat()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::constraint::{allows, AllowedTokens, Constraint};
    use crate::sampling_params::SamplingParams;
    use crate::sequence::GuideState;

    /// Allows `0` then `1` then `2` ..., finished after `len` tokens; `copyable`: it forks.
    #[derive(Clone)]
    struct Counting {
        next: u32,
        len: u32,
        copyable: bool,
    }

    impl Constraint for Counting {
        fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), String> {
            mask.fill(0);
            mask[self.next as usize / 32] |= 1 << (self.next % 32);
            Ok(())
        }
        fn commit(&mut self, token: u32) -> Result<(), String> {
            if token != self.next {
                return Err(format!("token {token}, expected {}", self.next));
            }
            self.next += 1;
            Ok(())
        }
        fn is_finished(&self) -> bool {
            self.next >= self.len
        }
        fn fork(&self) -> Option<Box<dyn Constraint>> {
            self.copyable.then(|| Box::new(self.clone()) as Box<dyn Constraint>)
        }
    }

    fn seq(constraint: Box<dyn Constraint>, draft: Vec<u32>) -> Sequence {
        let mut s =
            Sequence::new(1, 1, 0, vec![9, 9], Arc::new(SamplingParams::default()), 16, 0, 0, 0, Instant::now());
        s.guide = Some(GuideState { constraint, mask: None, drafted: None });
        s.draft = draft;
        s
    }

    #[test]
    fn drafts_are_cut_at_the_first_the_constraint_rejects_and_each_row_has_its_mask() {
        let c = || Box::new(Counting { next: 0, len: 10, copyable: true });
        let mut s = seq(c(), vec![0, 1, 5, 3]);
        guide_drafts(&mut s, 64);
        assert_eq!(s.draft, vec![0, 1]);
        let d = s.guide.as_ref().unwrap().drafted.clone().unwrap();
        assert_eq!(d.at, 2);
        assert_eq!(d.masks.len(), 3, "a mask for each kept draft's row and the bonus row");
        for (i, m) in d.masks.iter().enumerate() {
            assert!(allows(m, i as u32) && m.iter().map(|w| w.count_ones()).sum::<u32>() == 1, "row {i}");
        }
        // The sequence's own constraint took nothing.
        let mut real = s.guide.take().unwrap().constraint;
        assert!(real.commit(0).is_ok() && real.commit(2).is_err());
        // All drafts allowed: all kept.
        let mut s = seq(c(), vec![0, 1, 2]);
        guide_drafts(&mut s, 64);
        assert_eq!((s.draft.len(), s.guide.unwrap().drafted.unwrap().masks.len()), (3, 4));
    }

    #[test]
    fn a_draft_that_completes_the_grammar_is_cut_and_an_uncopyable_constraint_drafts_nothing() {
        let mut s = seq(Box::new(Counting { next: 0, len: 2, copyable: true }), vec![0, 1, 2]);
        guide_drafts(&mut s, 64);
        assert_eq!(s.draft, vec![0], "the draft that completes the grammar goes");
        let mut s = seq(Box::new(Counting { next: 0, len: 9, copyable: false }), vec![0, 1]);
        guide_drafts(&mut s, 64);
        assert!(s.draft.is_empty() && s.guide.unwrap().drafted.is_none());
        // Guided but no constraint started: no drafts.
        let params = SamplingParams {
            guided: Some(crate::constraint::Guided::new(AllowedTokens(vec![1]))),
            ..Default::default()
        };
        let mut s = Sequence::new(1, 1, 0, vec![9], Arc::new(params), 16, 0, 0, 0, Instant::now());
        s.draft = vec![1];
        guide_drafts(&mut s, 64);
        assert!(s.draft.is_empty());
    }
}
