//! Drafts from a draft head that a checkpoint brings (EAGLE-3's
//! [`tandem_core::eagle3::Eagle3Head`], MTP's [`tandem_core::mtp::MtpHead`]): the head reads the target's hidden states at the aux layers, so each sequence keeps those of its
//! computed positions, taken from each forward ([`DraftHead::landed`]), beside the head's own
//! KV of those positions ([`HeadCache`]).
//!
//! What a sequence keeps always matches its committed, computed tokens: rows land at the
//! positions their chunk computed (a chunk that restarts lower, after a preemption or over
//! rejected drafts, first cuts what was kept back to its start), and proposing cuts them to
//! `num_computed_tokens` (the rows of rejected drafts go). Once the head has its KV row for a
//! position the aux row is no longer read, so after proposing only the last row is kept (an
//! aux row is `3 * hidden` floats: 48 KB a token for an 8B target). The head's rows of
//! committed positions never change (their token and aux states are committed, and a
//! recomputed aux row is bitwise the one it replaces), so a preemption keeps them. A sequence
//! whose first computed positions came from the prefix cache has no rows for them: it gets no
//! head drafts (its answer is the same; only the speed-up is lost).

use std::collections::HashMap;

use tandem_core::head_layer::{HeadCache, HeadModel};

use crate::sequence::SeqId;

/// A loaded head and what each sequence keeps for it.
pub struct DraftHead {
    head: Box<dyn HeadModel>,
    seqs: HashMap<SeqId, SeqState>,
}

/// One sequence's aux rows (`head.aux_width()` floats per position from `from`) and head
/// KV; `gap`: some computed position has no row (a prefix-cache hit).
#[derive(Default)]
struct SeqState {
    aux: Vec<f32>,
    from: usize,
    cache: HeadCache,
    gap: bool,
}

impl DraftHead {
    pub fn new(head: Box<dyn HeadModel>) -> Self {
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
            if s.from + s.aux.len() / w < start || aux.len() < (row + n) * w {
                s.gap = true;
            }
            if !s.gap {
                // Rows before `from` are in the head's KV already: only later ones are kept.
                let keep = start.max(s.from);
                s.aux.truncate((keep - s.from) * w);
                if start + n > keep {
                    s.aux.extend_from_slice(&aux[(row + keep - start) * w..(row + n) * w]);
                }
            }
            row += n;
        }
    }

    /// Up to `k` drafts after `tokens` (committed; the first `computed` have their KV), or
    /// none when the sequence's rows are incomplete.
    pub fn propose(&mut self, id: SeqId, tokens: &[u32], computed: usize, k: usize) -> Vec<u32> {
        let w = self.head.aux_width();
        let Some(s) = self.seqs.get_mut(&id) else { return Vec::new() };
        if s.gap || computed < s.from || s.from + s.aux.len() / w < computed || computed + 1 != tokens.len() {
            return Vec::new();
        }
        s.aux.truncate((computed - s.from) * w);
        let drafts = self.head.propose(&mut s.cache, tokens, &s.aux, s.from, k).unwrap_or_default();
        // The head holds its rows of every computed position now: keep the last aux row only
        // (the next proposal recomputes that position's head row to start its drafts).
        let last = computed.saturating_sub(1);
        if s.cache.len() == computed && last > s.from {
            s.aux.drain(..(last - s.from) * w);
            s.from = last;
        }
        drafts
    }

    /// A completion forked off `parent`'s computed prompt starts with its rows.
    pub fn fork(&mut self, parent: SeqId, child: SeqId) {
        if let Some(p) = self.seqs.get(&parent) {
            let s = SeqState { aux: p.aux.clone(), from: p.from, cache: p.cache.clone(), gap: p.gap };
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use tandem_core::eagle3::Eagle3Head;
    use tandem_core::ModelConfig;

    /// The golden head (tests/golden/eagle3-tiny), its aux width, and one sequence's tokens and
    /// aux rows.
    fn setup() -> (DraftHead, Eagle3Head, usize, Vec<u32>, Vec<f32>) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/eagle3-tiny");
        let target = ModelConfig::from_json(
            &serde_json::json!({
                "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 160,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "vocab_size": 384, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048,
            })
            .to_string(),
        )
        .unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
        let tokens = v["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let aux = v["aux"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        let head = DraftHead::new(Box::new(Eagle3Head::load(&dir, &target).unwrap()));
        let fresh = Eagle3Head::load(&dir, &target).unwrap();
        let w = fresh.aux_width();
        (head, fresh, w, tokens, aux)
    }

    /// Through chunked prefill, verification chunks with rejected drafts, a preemption and a
    /// fork, the kept rows give the drafts the head gives from scratch on every row.
    #[test]
    fn kept_rows_give_the_drafts_of_a_head_run_from_scratch() {
        let (mut h, fresh, w, tokens, aux) = setup();
        let want =
            |n: usize| fresh.propose(&mut HeadCache::default(), &tokens[..n], &aux[..(n - 1) * w], 0, 3).unwrap();
        let rows = |a: usize, b: usize| &aux[a * w..b * w];
        // A prompt of 8 in chunks of 5 and 3; then one token sampled.
        h.landed([(1, 0, 5)].into_iter(), rows(0, 5));
        h.landed([(1, 5, 3)].into_iter(), rows(5, 8));
        assert_eq!(h.propose(1, &tokens[..9], 8, 3), want(9));
        // A verification chunk of 1 + 3 drafts (positions 8..12) of which 1 was accepted:
        // computed 10, tokens 11 (rows 10 and 11 were rejected drafts': other values).
        let mut chunk = rows(8, 10).to_vec();
        chunk.extend(vec![9.0; 2 * w]);
        h.landed([(1, 8, 4)].into_iter(), &chunk);
        assert_eq!(h.propose(1, &tokens[..11], 10, 3), want(11));
        h.fork(1, 2);
        // Preempted and recomputed from 0 in one chunk of 12 (computed 12, tokens 13).
        h.landed([(1, 0, 12)].into_iter(), rows(0, 12));
        assert_eq!(h.propose(1, &tokens[..13], 12, 3), want(13));
        // The fork goes on from what its parent had.
        h.landed([(2, 10, 1)].into_iter(), rows(10, 11));
        assert_eq!(h.propose(2, &tokens[..12], 11, 3), want(12));
        // A sequence whose first rows came from the prefix cache: no drafts.
        h.landed([(3, 16, 2)].into_iter(), rows(16, 18));
        assert!(h.propose(3, &tokens[..19], 18, 3).is_empty());
        // A forward that kept no rows leaves a gap too.
        h.landed([(2, 11, 1)].into_iter(), &[]);
        assert!(h.propose(2, &tokens[..13], 12, 3).is_empty());
    }
}
