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
//! recomputed aux row is bitwise the one it replaces), so a preemption keeps them.
//!
//! Prefix-cache hits: a sequence whose first positions came from the prefix cache has no aux
//! rows for them, and recomputing them would mean running the target over the cached prefix
//! (the hit's whole saving). Instead the head's KV rows are kept with the cached blocks, keyed
//! by the block's prefix hash (the block manager's, which starts from the LoRA adapter's root,
//! so what the hash names fixes the target's hidden states too), with the aux row of the
//! block's last position. The head's row at position `i` reads the token at `i + 1`, so a
//! block's last row depends on the first token of the next block: on a hit of `m` blocks the
//! rows of the first `m` blocks but the very last are taken, and that last one is recomputed
//! from the kept aux row and the sequence's own next token (what vLLM gets by recomputing the
//! last hit block). The store is host memory: it is bounded by the blocks the pool can cache
//! and by [`BLOCK_STORE_BYTES`], and forgets blocks the block manager has evicted.

use std::collections::HashMap;

use tandem_core::head_layer::{HeadCache, HeadModel};
use tandem_core::ModelRunner;

use crate::sequence::SeqId;

/// The most host memory the head rows of cached blocks take.
pub const BLOCK_STORE_BYTES: usize = 1 << 30;

/// A loaded head and what each sequence keeps for it.
pub struct DraftHead {
    head: Box<dyn HeadModel>,
    seqs: HashMap<SeqId, SeqState>,
    /// Head rows of full committed blocks, by the block's prefix hash.
    blocks: HashMap<u64, BlockRows>,
    /// Tokens a KV block holds (0: blocks are not kept).
    block_size: usize,
    /// Blocks kept at most.
    max_blocks: usize,
    /// The runner has the head's weights on its backend and proposes there
    /// ([`ModelRunner::propose_draft`]); `head` stays the host oracle.
    on_device: bool,
}

/// One sequence's aux rows (`head.aux_width()` floats per position from `from`) and head
/// KV; `gap`: some computed position has no row (a prefix-cache hit whose blocks' rows were
/// not kept); `ends`: aux rows of its blocks' last positions (by block index) whose head rows
/// are not yet in the block store.
#[derive(Default)]
struct SeqState {
    aux: Vec<f32>,
    from: usize,
    cache: HeadCache,
    gap: bool,
    ends: Vec<(usize, Vec<f32>)>,
}

/// A cached block's head KV rows and the aux row of its last position.
struct BlockRows {
    k: Vec<f32>,
    v: Vec<f32>,
    end_aux: Vec<f32>,
}

/// A chunk of a forward, in batch order: the sequence, the first position computed, the
/// tokens computed, and the sequence's block prefix hashes.
pub type LandedChunk<'a> = (SeqId, usize, usize, &'a [u64]);

impl DraftHead {
    /// `head`, keeping no rows of cached blocks.
    pub fn new(head: Box<dyn HeadModel>) -> Self {
        DraftHead { head, seqs: HashMap::new(), blocks: HashMap::new(), block_size: 0, max_blocks: 0, on_device: false }
    }

    /// From now on the runner passed to [`Self::propose`] runs the head (its weights are on
    /// the runner's backend).
    pub fn run_on_device(&mut self) {
        self.on_device = true;
    }

    /// Whether the runner runs the head.
    pub fn on_device(&self) -> bool {
        self.on_device
    }

    /// Keeps the head rows of up to `num_blocks` cached blocks of `block_size` tokens (fewer
    /// where they would pass [`BLOCK_STORE_BYTES`]), so that prefix-cache hits draft too.
    pub fn keep_cached_blocks(&mut self, block_size: usize, num_blocks: usize) {
        self.block_size = block_size;
        // A block: its K and V rows (at most the aux width each, as every head's KV is
        // narrower than the target's states it reads) and one aux row.
        let per_block = (2 * block_size + 1) * self.head.aux_width() * 4;
        self.max_blocks = num_blocks.min(BLOCK_STORE_BYTES / per_block.max(1));
    }

    /// The target layers whose hidden states the head reads.
    pub fn aux_layers(&self) -> &[usize] {
        self.head.aux_layers()
    }

    /// A forward landed: `chunks` are its sequences in batch order, `aux` its rows in the same
    /// order. Empty `aux` (the forward kept none): every chunk's sequence has a gap. A
    /// sequence whose chunk starts past its rows (a prefix-cache hit) takes the rows of its
    /// cached blocks from the block store where all of them are there.
    pub fn landed<'a>(&mut self, chunks: impl Iterator<Item = LandedChunk<'a>>, aux: &[f32]) {
        let w = self.head.aux_width();
        let mut row = 0;
        for (id, start, n, hashes) in chunks {
            let s = self.seqs.entry(id).or_default();
            if s.from + s.aux.len() / w < start {
                match restore(&self.blocks, self.block_size, start, hashes) {
                    Some(r) => *s = r,
                    None => s.gap = true,
                }
            }
            if aux.len() < (row + n) * w {
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
    /// none when the sequence's rows are incomplete. `hashes`: the sequence's block prefix
    /// hashes, under which the head rows of its full committed blocks are kept. `runner` runs
    /// the head where it was put on the device (a failure there proposes nothing).
    pub fn propose(
        &mut self,
        id: SeqId,
        tokens: &[u32],
        computed: usize,
        k: usize,
        hashes: &[u64],
        runner: Option<&mut dyn ModelRunner>,
    ) -> Vec<u32> {
        let w = self.head.aux_width();
        let Some(s) = self.seqs.get_mut(&id) else { return Vec::new() };
        if s.gap || computed < s.from || s.from + s.aux.len() / w < computed || computed + 1 != tokens.len() {
            return Vec::new();
        }
        s.aux.truncate((computed - s.from) * w);
        let proposed = match runner {
            Some(r) if self.on_device => r.propose_draft(&mut s.cache, tokens, &s.aux, s.from, k).ok().flatten(),
            _ => self.head.propose(&mut s.cache, tokens, &s.aux, s.from, k),
        };
        let Some(drafts) = proposed else { return Vec::new() };
        if self.block_size > 0 {
            // The aux rows of the blocks' last positions, before they go.
            let b = self.block_size;
            for p in (s.from..computed).filter(|p| (p + 1) % b == 0) {
                if !s.ends.iter().any(|e| e.0 == p / b) {
                    s.ends.push((p / b, s.aux[(p - s.from) * w..(p - s.from + 1) * w].to_vec()));
                }
            }
            let (blocks, max) = (&mut self.blocks, self.max_blocks);
            s.ends.retain(|(i, end)| {
                let (Some(&hash), true) = (hashes.get(*i), (i + 1) * b <= s.cache.len()) else { return true };
                if !blocks.contains_key(&hash) && blocks.len() < max {
                    let (k, v) = s.cache.rows(i * b, (i + 1) * b);
                    blocks.insert(hash, BlockRows { k: k.to_vec(), v: v.to_vec(), end_aux: end.clone() });
                }
                false
            });
        }
        // The head holds its rows of every computed position now: keep the last aux row only
        // (the next proposal recomputes that position's head row to start its drafts).
        let last = computed.saturating_sub(1);
        if s.cache.len() == computed && last > s.from {
            s.aux.drain(..(last - s.from) * w);
            s.from = last;
        }
        drafts
    }

    /// Forgets the rows of cached blocks `cached` says the block manager no longer holds,
    /// once the store is full.
    pub fn prune_blocks(&mut self, cached: impl Fn(u64) -> bool) {
        if self.blocks.len() >= self.max_blocks {
            self.blocks.retain(|h, _| cached(*h));
        }
    }

    /// Cached blocks whose head rows are kept.
    pub fn kept_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// A completion forked off `parent`'s computed prompt starts with its rows.
    pub fn fork(&mut self, parent: SeqId, child: SeqId) {
        if let Some(p) = self.seqs.get(&parent) {
            let s =
                SeqState { aux: p.aux.clone(), from: p.from, cache: p.cache.clone(), gap: p.gap, ends: p.ends.clone() };
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

/// A sequence's rows after a prefix-cache hit of the positions before `start`: the head rows
/// of its `start / block_size` blocks from `blocks` but the last, which the next proposal
/// recomputes from the last block's end aux row. None unless the hit is whole blocks, all
/// kept.
fn restore(blocks: &HashMap<u64, BlockRows>, block_size: usize, start: usize, hashes: &[u64]) -> Option<SeqState> {
    if block_size == 0 || start == 0 || !start.is_multiple_of(block_size) || hashes.len() < start / block_size {
        return None;
    }
    let mut cache = HeadCache::default();
    let mut end = None;
    for h in &hashes[..start / block_size] {
        let r = blocks.get(h)?;
        cache.extend(&r.k, &r.v, block_size);
        end = Some(&r.end_aux);
    }
    cache.truncate(start - 1);
    Some(SeqState { aux: end?.clone(), from: start - 1, cache, gap: false, ends: Vec::new() })
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
        h.landed([(1, 0, 5, &[][..])].into_iter(), rows(0, 5));
        h.landed([(1, 5, 3, &[][..])].into_iter(), rows(5, 8));
        assert_eq!(h.propose(1, &tokens[..9], 8, 3, &[], None), want(9));
        // A verification chunk of 1 + 3 drafts (positions 8..12) of which 1 was accepted:
        // computed 10, tokens 11 (rows 10 and 11 were rejected drafts': other values).
        let mut chunk = rows(8, 10).to_vec();
        chunk.extend(vec![9.0; 2 * w]);
        h.landed([(1, 8, 4, &[][..])].into_iter(), &chunk);
        assert_eq!(h.propose(1, &tokens[..11], 10, 3, &[], None), want(11));
        h.fork(1, 2);
        // Preempted and recomputed from 0 in one chunk of 12 (computed 12, tokens 13).
        h.landed([(1, 0, 12, &[][..])].into_iter(), rows(0, 12));
        assert_eq!(h.propose(1, &tokens[..13], 12, 3, &[], None), want(13));
        // The fork goes on from what its parent had.
        h.landed([(2, 10, 1, &[][..])].into_iter(), rows(10, 11));
        assert_eq!(h.propose(2, &tokens[..12], 11, 3, &[], None), want(12));
        // A sequence whose first rows came from the prefix cache: no drafts.
        h.landed([(3, 16, 2, &[][..])].into_iter(), rows(16, 18));
        assert!(h.propose(3, &tokens[..19], 18, 3, &[], None).is_empty());
        // A forward that kept no rows leaves a gap too.
        h.landed([(2, 11, 1, &[][..])].into_iter(), &[]);
        assert!(h.propose(2, &tokens[..13], 12, 3, &[], None).is_empty());
    }

    /// A sequence whose first blocks came from the prefix cache drafts from the head rows an
    /// earlier sequence kept with those blocks, as a head run from scratch does; blocks whose
    /// rows were not kept leave it without drafts.
    #[test]
    fn a_prefix_cache_hit_drafts_from_the_rows_kept_with_its_blocks() {
        let (mut h, fresh, w, tokens, aux) = setup();
        h.keep_cached_blocks(4, 64);
        let want =
            |n: usize| fresh.propose(&mut HeadCache::default(), &tokens[..n], &aux[..(n - 1) * w], 0, 3).unwrap();
        let rows = |a: usize, b: usize| &aux[a * w..b * w];
        let hashes = [11u64, 22, 33];
        // A prompt of 14 (three full blocks of 4), one token sampled: its blocks are kept.
        h.landed([(1, 0, 14, &hashes[..])].into_iter(), rows(0, 14));
        assert_eq!(h.propose(1, &tokens[..15], 14, 3, &hashes, None), want(15));
        assert_eq!(h.kept_blocks(), 3);
        // Hits of two blocks and of one (its last row recomputed from the kept end row).
        for (id, hit) in [(2, 8), (3, 4)] {
            h.landed([(id, hit, 14 - hit, &hashes[..])].into_iter(), rows(hit, 14));
            assert_eq!(h.propose(id, &tokens[..15], 14, 3, &hashes, None), want(15), "a hit of {hit}");
        }
        // Blocks whose rows are not kept, or a store the block manager has emptied: a gap.
        h.landed([(4, 8, 6, &[11u64, 99][..])].into_iter(), rows(8, 14));
        assert!(h.propose(4, &tokens[..15], 14, 3, &[11, 99], None).is_empty());
        h.keep_cached_blocks(4, 3);
        h.prune_blocks(|hash| hash == 11);
        assert_eq!(h.kept_blocks(), 1);
        h.landed([(5, 8, 6, &hashes[..])].into_iter(), rows(8, 14));
        assert!(h.propose(5, &tokens[..15], 14, 3, &hashes, None).is_empty());
    }
}
