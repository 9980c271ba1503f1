//! The KV block pool: ref-counted blocks, a free list, and automatic prefix caching.
//!
//! A block holds `block_size` consecutive tokens of one sequence's KV cache. A sequence's block
//! table maps its position `p` to block `table[p / block_size]`. Blocks are shared by reference
//! count (prefix-cache hits and `n > 1` forks); a block returns to the pool when its count drops
//! to zero.
//!
//! Prefix caching: a block whose tokens are all computed is keyed by a hash chained from the
//! previous block's hash and its own token ids, so equal keys mean equal prefixes. A hit is
//! re-checked against the stored token ids and parent hash before it is used. Unreferenced
//! cached blocks stay cached ("evictable"); they are reused least-recently-used first, and only
//! when the clean free list is empty.
//!
//! Counters of prefix-cache queries and hits are in tokens (like vLLM's
//! `prefix_cache_queries` / `prefix_cache_hits`).
//!
//! Invariant: every block is in exactly one of three states: referenced (ref_count > 0),
//! clean and free (in `free`), or cached and unreferenced (in `evictable`).

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hasher;

/// A change to the prefix cache, for consumers of KV-cache events (vLLM's `BlockStored` and
/// `BlockRemoved`; routers' KV-aware policies), recorded when [`BlockManager::record_events`]
/// was called.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    /// A full block entered the prefix cache under `hash`, chained from `parent` (None for
    /// the first block of a sequence), holding `tokens` (`block_size` of them).
    Stored { hash: u64, parent: Option<u64>, tokens: Vec<u32> },
    /// The block cached under `hash` was evicted (reused for other tokens).
    Removed { hash: u64 },
}

/// Hash of one full block, chained from the previous block's hash (0 for the first block).
pub fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    // DefaultHasher::new() has fixed keys, so hashes are stable within and across runs.
    let mut h = DefaultHasher::new();
    h.write_u64(parent);
    for &t in tokens {
        h.write_u32(t);
    }
    h.finish()
}

/// Where the prefix-hash chain of a sequence under LoRA adapter `adapter` starts: 0 for the
/// base model, a hash of the adapter's id otherwise (an id, never a slot: a slot is refilled
/// by another adapter, an id is never reused).
pub fn adapter_root(adapter: Option<u32>) -> u64 {
    match adapter {
        None => 0,
        Some(id) => block_hash(u64::MAX, &[id]),
    }
}

#[derive(Debug, Clone, Default)]
struct Block {
    ref_count: u32,
    /// Set while the block is registered in the prefix cache.
    cached: Option<CachedKey>,
    /// LRU tick of the last release, used while the block is evictable.
    last_used: u64,
}

#[derive(Debug, Clone)]
struct CachedKey {
    hash: u64,
    parent: u64,
    tokens: Box<[u32]>,
}

/// A prefix-cache hit: a block and the hash of the prefix it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedBlock {
    pub block: u32,
    pub hash: u64,
}

#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    blocks: Vec<Block>,
    /// Clean blocks (never cached or evicted), popped from the end.
    free: Vec<u32>,
    /// Cached blocks with no reference, by LRU tick (oldest first).
    evictable: BTreeMap<u64, u32>,
    /// Prefix hash -> block.
    cache: HashMap<u64, u32>,
    enable_prefix_caching: bool,
    tick: u64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries_tokens: u64,
    /// Of those, tokens found cached.
    pub prefix_hits_tokens: u64,
    /// Prefix-cache changes since the last [`Self::take_events`], when recording.
    events: Option<Vec<KvEvent>>,
}

impl BlockManager {
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_caching: bool) -> Self {
        BlockManager {
            block_size,
            blocks: vec![Block::default(); num_blocks],
            // Reversed so that block 0 is handed out first (tests read literal ids).
            free: (0..num_blocks as u32).rev().collect(),
            evictable: BTreeMap::new(),
            cache: HashMap::new(),
            enable_prefix_caching,
            tick: 0,
            prefix_queries_tokens: 0,
            prefix_hits_tokens: 0,
            events: None,
        }
    }

    /// From now on, records every block entering and leaving the prefix cache.
    pub fn record_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// The prefix-cache changes recorded since the previous call, oldest first.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }
    /// Blocks that can be handed out now (clean plus evictable).
    pub fn num_free(&self) -> usize {
        self.free.len() + self.evictable.len()
    }
    /// Fraction of blocks held by sequences.
    pub fn usage(&self) -> f32 {
        1.0 - self.num_free() as f32 / self.blocks.len().max(1) as f32
    }
    pub fn ref_count(&self, block: u32) -> u32 {
        self.blocks[block as usize].ref_count
    }
    pub fn is_cached(&self, block: u32) -> bool {
        self.blocks[block as usize].cached.is_some()
    }
    /// Whether a block is cached under prefix hash `hash`.
    pub fn holds(&self, hash: u64) -> bool {
        self.cache.contains_key(&hash)
    }
    /// Blocks needed to hold `num_tokens` tokens.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    /// The longest cached prefix of `tokens`, in full blocks, leaving at least one token to
    /// compute (its logits are needed). Read-only: nothing is referenced until [`Self::allocate`].
    pub fn find_cached_prefix(&self, tokens: &[u32]) -> Vec<CachedBlock> {
        self.find_cached_prefix_under(0, tokens)
    }

    /// [`Self::find_cached_prefix`] for a chain that starts from `root` instead of 0 (a
    /// sequence under a LoRA adapter: [`adapter_root`]), so prefixes under different adapters,
    /// whose K/V differ, never share blocks.
    pub fn find_cached_prefix_under(&self, root: u64, tokens: &[u32]) -> Vec<CachedBlock> {
        let mut hits = Vec::new();
        if !self.enable_prefix_caching || tokens.is_empty() {
            return hits;
        }
        let mut parent = root;
        for chunk in tokens[..tokens.len() - 1].chunks_exact(self.block_size) {
            let hash = block_hash(parent, chunk);
            let Some(&block) = self.cache.get(&hash) else { break };
            // A 64-bit collision must never hand out someone else's KV: check the contents.
            match &self.blocks[block as usize].cached {
                Some(k) if k.hash == hash && k.parent == parent && *k.tokens == *chunk => {}
                _ => break,
            }
            hits.push(CachedBlock { block, hash });
            parent = hash;
        }
        hits
    }

    /// Whether `hits` plus enough new blocks for `num_tokens` tokens in total can be had now.
    pub fn can_allocate(&self, hits: &[CachedBlock], num_tokens: usize) -> bool {
        let need = self.blocks_for(num_tokens).saturating_sub(hits.len());
        // Taking an unreferenced hit removes it from the evictable pool.
        let hits_from_pool = hits.iter().filter(|h| self.blocks[h.block as usize].ref_count == 0).count();
        self.num_free() >= need + hits_from_pool
    }

    /// Starts a block table: references the `hits` (counting the prefix-cache query of
    /// `num_prompt_tokens`), then appends fresh blocks up to `num_tokens` tokens.
    /// Call [`Self::can_allocate`] first; returns false (changing nothing) if blocks run out.
    pub fn allocate(
        &mut self,
        table: &mut Vec<u32>,
        hashes: &mut Vec<u64>,
        hits: &[CachedBlock],
        num_tokens: usize,
        num_prompt_tokens: usize,
    ) -> bool {
        debug_assert!(table.is_empty() && hashes.is_empty(), "allocate on a live block table");
        if !self.can_allocate(hits, num_tokens) {
            return false;
        }
        if self.enable_prefix_caching {
            self.prefix_queries_tokens += num_prompt_tokens as u64;
            self.prefix_hits_tokens += (hits.len() * self.block_size) as u64;
        }
        for h in hits {
            self.take_ref(h.block);
            table.push(h.block);
            hashes.push(h.hash);
        }
        self.append_slots(table, num_tokens)
    }

    /// Whether `table` can grow to hold `num_tokens` tokens.
    pub fn can_append(&self, table: &[u32], num_tokens: usize) -> bool {
        self.blocks_for(num_tokens).saturating_sub(table.len()) <= self.num_free()
    }

    /// Grows `table` with fresh blocks until it holds `num_tokens` tokens. Returns false,
    /// changing nothing, if there are not enough.
    pub fn append_slots(&mut self, table: &mut Vec<u32>, num_tokens: usize) -> bool {
        if !self.can_append(table, num_tokens) {
            return false;
        }
        while table.len() < self.blocks_for(num_tokens) {
            let b = self.pop_free().expect("can_append checked the count");
            table.push(b);
        }
        true
    }

    /// Registers the blocks of `table` that are now full of computed tokens in the prefix
    /// cache. `hashes` holds the chain for the blocks already registered and grows here.
    pub fn cache_full_blocks(&mut self, table: &[u32], hashes: &mut Vec<u64>, tokens: &[u32], num_computed: usize) {
        self.cache_full_blocks_under(0, table, hashes, tokens, num_computed)
    }

    /// [`Self::cache_full_blocks`] for a chain that starts from `root` (see
    /// [`Self::find_cached_prefix_under`]).
    pub fn cache_full_blocks_under(
        &mut self,
        root: u64,
        table: &[u32],
        hashes: &mut Vec<u64>,
        tokens: &[u32],
        num_computed: usize,
    ) {
        if !self.enable_prefix_caching {
            return;
        }
        let full = (num_computed / self.block_size).min(table.len());
        while hashes.len() < full {
            let i = hashes.len();
            let parent = hashes.last().copied().unwrap_or(root);
            let chunk = &tokens[i * self.block_size..(i + 1) * self.block_size];
            let hash = block_hash(parent, chunk);
            let block = table[i];
            // The first block to hold a prefix keeps the key; a later duplicate stays uncached
            // and goes back to the clean list when released.
            if !self.cache.contains_key(&hash) && self.blocks[block as usize].cached.is_none() {
                self.cache.insert(hash, block);
                self.blocks[block as usize].cached = Some(CachedKey { hash, parent, tokens: chunk.into() });
                if let Some(ev) = &mut self.events {
                    ev.push(KvEvent::Stored { hash, parent: (i > 0).then_some(parent), tokens: chunk.to_vec() });
                }
            }
            hashes.push(hash);
        }
    }

    /// A child's block table sharing the parent's first `num_shared` blocks (ref-counted).
    pub fn fork(&mut self, parent_table: &[u32], parent_hashes: &[u64], num_shared: usize) -> (Vec<u32>, Vec<u64>) {
        let table = parent_table[..num_shared].to_vec();
        for &b in &table {
            self.take_ref(b);
        }
        let hashes = parent_hashes[..num_shared.min(parent_hashes.len())].to_vec();
        (table, hashes)
    }

    /// Releases every block of `table` and empties it.
    pub fn free(&mut self, table: &mut Vec<u32>, hashes: &mut Vec<u64>) {
        // Last blocks first, so that on eviction a prefix's tail goes before its head.
        for &b in table.iter().rev() {
            let blk = &mut self.blocks[b as usize];
            debug_assert!(blk.ref_count > 0, "block {b} freed twice");
            blk.ref_count -= 1;
            if blk.ref_count == 0 {
                if blk.cached.is_some() {
                    self.tick += 1;
                    blk.last_used = self.tick;
                    self.evictable.insert(self.tick, b);
                } else {
                    self.free.push(b);
                }
            }
        }
        table.clear();
        hashes.clear();
    }

    fn take_ref(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        if blk.ref_count == 0 && blk.cached.is_some() {
            self.evictable.remove(&blk.last_used);
        }
        blk.ref_count += 1;
    }

    fn pop_free(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.evictable.pop_first()?;
                let key = self.blocks[b as usize].cached.take().expect("evictable blocks are cached");
                self.cache.remove(&key.hash);
                if let Some(ev) = &mut self.events {
                    ev.push(KvEvent::Removed { hash: key.hash });
                }
                b
            }
        };
        self.blocks[b as usize].ref_count = 1;
        Some(b)
    }

    /// Checks the pool against the block tables that hold blocks: each block's ref count equals
    /// the number of tables holding it, and every unreferenced block is free exactly once.
    pub fn check_invariants<'a>(&self, tables: impl IntoIterator<Item = &'a [u32]>) -> Result<(), String> {
        let mut holders = vec![0u32; self.blocks.len()];
        for t in tables {
            let mut seen = std::collections::HashSet::new();
            for &b in t {
                if b as usize >= self.blocks.len() {
                    return Err(format!("block {b} out of range"));
                }
                if !seen.insert(b) {
                    return Err(format!("block {b} appears twice in one table"));
                }
                holders[b as usize] += 1;
            }
        }
        let mut in_pool = vec![0u32; self.blocks.len()];
        for &b in self.free.iter().chain(self.evictable.values()) {
            in_pool[b as usize] += 1;
        }
        for (i, blk) in self.blocks.iter().enumerate() {
            if blk.ref_count != holders[i] {
                return Err(format!("block {i}: ref_count {} but held by {} tables", blk.ref_count, holders[i]));
            }
            let want_in_pool = u32::from(blk.ref_count == 0);
            if in_pool[i] != want_in_pool {
                return Err(format!(
                    "block {i}: ref_count {} but in the free pool {} times",
                    blk.ref_count, in_pool[i]
                ));
            }
            if self.free.contains(&(i as u32)) && blk.cached.is_some() {
                return Err(format!("block {i} is cached but on the clean free list"));
            }
        }
        for (&h, &b) in &self.cache {
            match &self.blocks[b as usize].cached {
                Some(k) if k.hash == h => {}
                _ => return Err(format!("cache entry {h:x} points at block {b}, which does not hold it")),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(n: usize, base: u32) -> Vec<u32> {
        (0..n as u32).map(|i| base + i).collect()
    }

    #[test]
    fn allocate_and_free_return_blocks_in_order() {
        let mut bm = BlockManager::new(11, 16, true);
        let (mut t, mut h) = (vec![], vec![]);
        assert!(bm.allocate(&mut t, &mut h, &[], 33, 33));
        assert_eq!(t, vec![0, 1, 2]);
        assert_eq!(bm.num_free(), 8);
        assert!(bm.append_slots(&mut t, 48));
        assert_eq!(t, vec![0, 1, 2]);
        assert!(bm.append_slots(&mut t, 49));
        assert_eq!(t, vec![0, 1, 2, 3]);
        assert!(!bm.can_append(&t, 16 * 12));
        assert!(!bm.append_slots(&mut t, 16 * 12));
        assert_eq!(t.len(), 4, "a failed append changes nothing");
        bm.check_invariants([t.as_slice()]).unwrap();
        bm.free(&mut t, &mut h);
        assert_eq!(bm.num_free(), 11);
        bm.check_invariants([]).unwrap();
    }

    #[test]
    fn records_stored_and_removed_events_when_asked() {
        let mut bm = BlockManager::new(2, 4, true);
        let (mut t, mut h) = (vec![], vec![]);
        // Not recording: nothing kept.
        assert!(bm.allocate(&mut t, &mut h, &[], 8, 8));
        bm.cache_full_blocks(&t, &mut h, &toks(8, 0), 8);
        assert!(bm.take_events().is_empty());
        bm.free(&mut t, &mut h);
        let mut bm = BlockManager::new(2, 4, true);
        bm.record_events();
        let prompt = toks(8, 0);
        assert!(bm.allocate(&mut t, &mut h, &[], 8, 8));
        bm.cache_full_blocks(&t, &mut h, &prompt, 8);
        let first = h.clone();
        assert_eq!(
            bm.take_events(),
            vec![
                KvEvent::Stored { hash: first[0], parent: None, tokens: prompt[..4].to_vec() },
                KvEvent::Stored { hash: first[1], parent: Some(first[0]), tokens: prompt[4..].to_vec() },
            ]
        );
        assert!(bm.take_events().is_empty(), "taken once");
        // Released, the blocks stay cached; another prompt needing both evicts them, the
        // prefix's tail first.
        bm.free(&mut t, &mut h);
        assert!(bm.take_events().is_empty());
        assert!(bm.allocate(&mut t, &mut h, &[], 8, 8));
        assert_eq!(bm.take_events(), vec![KvEvent::Removed { hash: first[1] }, KvEvent::Removed { hash: first[0] }]);
    }

    #[test]
    fn prefix_hit_shares_full_blocks_and_verifies_tokens() {
        let mut bm = BlockManager::new(11, 16, true);
        let prompt = toks(40, 100); // 2 full blocks + 8 tokens
        let (mut a, mut ah) = (vec![], vec![]);
        assert!(bm.find_cached_prefix(&prompt).is_empty());
        assert!(bm.allocate(&mut a, &mut ah, &[], 40, 40));
        bm.cache_full_blocks(&a, &mut ah, &prompt, 40);
        assert_eq!(ah.len(), 2);
        assert!(bm.is_cached(0) && bm.is_cached(1) && !bm.is_cached(2));

        // Same first 32 tokens, different tail: both full blocks hit.
        let mut other = prompt[..32].to_vec();
        other.extend(toks(5, 900));
        let hits = bm.find_cached_prefix(&other);
        assert_eq!(hits.iter().map(|h| h.block).collect::<Vec<_>>(), vec![0, 1]);
        let (mut b, mut bh) = (vec![], vec![]);
        assert!(bm.allocate(&mut b, &mut bh, &hits, 37, 37));
        assert_eq!(b, vec![0, 1, 3]);
        assert_eq!((bm.ref_count(0), bm.ref_count(1), bm.ref_count(2)), (2, 2, 1));
        assert_eq!((bm.prefix_queries_tokens, bm.prefix_hits_tokens), (77, 32));

        // A different first block misses everything, even with an equal second block.
        let mut diff = prompt.clone();
        diff[0] = 7;
        assert!(bm.find_cached_prefix(&diff).is_empty());
        // An exactly-cached prompt of 32 tokens only hits one block: the last token is computed.
        assert_eq!(bm.find_cached_prefix(&prompt[..32]).len(), 1);
        bm.check_invariants([a.as_slice(), b.as_slice()]).unwrap();
    }

    #[test]
    fn released_cached_blocks_are_evicted_lru_only_when_clean_list_is_empty() {
        let mut bm = BlockManager::new(4, 16, true);
        let p = toks(33, 0);
        let (mut a, mut ah) = (vec![], vec![]);
        assert!(bm.allocate(&mut a, &mut ah, &[], 33, 33));
        bm.cache_full_blocks(&a, &mut ah, &p, 33);
        assert_eq!(a, vec![0, 1, 2]);
        bm.free(&mut a, &mut ah);
        assert_eq!(bm.num_free(), 4);
        assert!(bm.is_cached(0) && bm.is_cached(1));
        // The uncached block 2 and the clean block 3 go first; the cache survives.
        let (mut b, mut bh) = (vec![], vec![]);
        assert!(bm.allocate(&mut b, &mut bh, &[], 32, 32));
        assert_eq!(b, vec![2, 3]);
        assert_eq!(bm.find_cached_prefix(&p).len(), 2);
        // Now the pool is dry: block 1 (the tail, released first) is evicted before block 0.
        assert!(bm.append_slots(&mut b, 48));
        assert_eq!(b, vec![2, 3, 1]);
        assert!(!bm.is_cached(1) && bm.is_cached(0));
        assert_eq!(bm.find_cached_prefix(&p).len(), 1);
        // Hitting block 0 takes it off the evictable list.
        let hits = bm.find_cached_prefix(&p);
        let (mut c, mut ch) = (vec![], vec![]);
        assert!(!bm.can_allocate(&hits, 33), "needs block 0 plus two fresh, only block 0 is left");
        assert!(bm.allocate(&mut c, &mut ch, &hits, 16, 33));
        assert_eq!(c, vec![0]);
        assert_eq!(bm.num_free(), 0);
        bm.check_invariants([b.as_slice(), c.as_slice()]).unwrap();
    }

    #[test]
    fn fork_ref_counts_shared_blocks() {
        let mut bm = BlockManager::new(8, 16, false);
        let (mut p, mut ph) = (vec![], vec![]);
        assert!(bm.allocate(&mut p, &mut ph, &[], 40, 40));
        let (mut c, mut ch) = bm.fork(&p, &ph, 2);
        assert_eq!(c, vec![0, 1]);
        assert!(bm.append_slots(&mut c, 40));
        assert_eq!(c, vec![0, 1, 3]);
        assert_eq!((bm.ref_count(0), bm.ref_count(1), bm.ref_count(2), bm.ref_count(3)), (2, 2, 1, 1));
        bm.check_invariants([p.as_slice(), c.as_slice()]).unwrap();
        bm.free(&mut p, &mut ph);
        assert_eq!(bm.num_free(), 5, "only the parent's own tail block 2 comes back");
        bm.free(&mut c, &mut ch);
        assert_eq!(bm.num_free(), 8);
        bm.check_invariants([]).unwrap();
        assert_eq!(bm.prefix_queries_tokens, 0, "no counting with caching off");
    }
}
