//! Drafts from a draft head that a checkpoint brings (EAGLE-3: [`Eagle3Head`]): the head
//! reads the target's hidden states at the aux layers, so each sequence keeps those of its
//! computed positions, taken from each forward ([`DraftHead::landed`]), beside the head's own
//! KV of those positions ([`HeadCache`]).
//!
//! What a sequence keeps always matches its committed, computed tokens: rows land at the
//! positions their chunk computed (a chunk that restarts lower, after a preemption or over
//! rejected drafts, first cuts what was kept back to its start), and proposing cuts them to
//! `num_computed_tokens` (the rows of rejected drafts go). A sequence whose first computed
//! positions came from the prefix cache has no rows for them: it gets no head drafts (its
//! answer is the same; only the speed-up is lost).

use std::collections::HashMap;

use tandem_core::eagle3::{Eagle3Head, HeadCache};

use crate::sequence::SeqId;

/// A loaded head and what each sequence keeps for it.
pub struct DraftHead {
    head: Eagle3Head,
    seqs: HashMap<SeqId, SeqState>,
}

/// One sequence's aux rows (`head.aux_width()` floats per computed position) and head KV;
/// `gap`: some computed position has no row (a prefix-cache hit).
#[derive(Default)]
struct SeqState {
    aux: Vec<f32>,
    cache: HeadCache,
    gap: bool,
}

impl DraftHead {
    pub fn new(head: Eagle3Head) -> Self {
        DraftHead { head, seqs: HashMap::new() }
    }

    /// The target layers whose hidden states the head reads.
    pub fn aux_layers(&self) -> &[usize] {
        self.head.aux_layers()
    }

    /// A forward landed: `chunks` are its sequences in batch order as (id, first position
    /// computed, tokens computed), `aux` its rows in the same order. Empty `aux` (the forward
    /// kept none): every chunk's sequence has a gap.
    pub fn landed(&mut self, chunks: impl Iterator<Item = (SeqId, usize, usize)>, aux: &[f32]) {
        let w = self.head.aux_width();
        let mut row = 0;
        for (id, start, n) in chunks {
            let s = self.seqs.entry(id).or_default();
            let have = s.aux.len() / w;
            if have < start || aux.len() < (row + n) * w {
                s.gap = true;
            }
            if !s.gap {
                s.aux.truncate(start * w);
                s.cache.truncate(start.saturating_sub(1));
                s.aux.extend_from_slice(&aux[row * w..(row + n) * w]);
            }
            row += n;
        }
    }

    /// Up to `k` drafts after `tokens` (committed; the first `computed` have their KV), or
    /// none when the sequence's rows are incomplete.
    pub fn propose(&mut self, id: SeqId, tokens: &[u32], computed: usize, k: usize) -> Vec<u32> {
        let w = self.head.aux_width();
        let Some(s) = self.seqs.get_mut(&id) else { return Vec::new() };
        if s.gap || s.aux.len() < computed * w || computed + 1 != tokens.len() {
            return Vec::new();
        }
        s.aux.truncate(computed * w);
        self.head.propose(&mut s.cache, tokens, &s.aux, k).unwrap_or_default()
    }

    /// A completion forked off `parent`'s computed prompt starts with its rows.
    pub fn fork(&mut self, parent: SeqId, child: SeqId) {
        if let Some(p) = self.seqs.get(&parent) {
            let s = SeqState { aux: p.aux.clone(), cache: p.cache.clone(), gap: p.gap };
            self.seqs.insert(child, s);
        }
    }

    /// Drops an ended sequence's rows.
    pub fn forget(&mut self, id: SeqId) {
        self.seqs.remove(&id);
    }

    /// Keeps only the sequences `live` says exist.
    pub fn retain(&mut self, live: impl Fn(SeqId) -> bool) {
        self.seqs.retain(|id, _| live(*id));
    }
}
