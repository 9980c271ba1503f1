//! Suffix decoding (vLLM's `"method": "suffix"`, after Arctic Inference's SuffixDecoding): the
//! draft continues the longest earlier match of the sequence's newest tokens, looked up in the
//! sequence's own tokens (prompt and output so far) and in the outputs of earlier requests.
//!
//! A step's draft: let `m` be the longest length (below the tree depth) for which the newest `m`
//! tokens occur earlier with at least one token after them, anywhere in the sequence or in a
//! cached output; every such occurrence is a candidate. The draft is then grown one token at a
//! time as the most frequent next token among the candidates still agreeing with it (ties: the
//! newest occurrence's), and its estimated probability is the product of each token's share of
//! the candidates at its step; the draft stops before that probability would fall under
//! `suffix_decoding_min_token_prob`, and at `suffix_decoding_max_spec_factor * m` tokens, at
//! `max_tree_depth - m`, and at the `k` the engine allows. So a long match with one
//! continuation drafts far, a short or ambiguous one little.
//!
//! Memory is bounded: the outputs of at most `suffix_decoding_max_cached_requests` finished
//! requests, and at most [`MAX_CACHED_TOKENS`] tokens in all, are kept, the oldest evicted
//! first; each cached token costs one index entry (token -> where it occurs), so a lookup
//! visits only the places where the newest token occurs rather than every cached token. The
//! sequence's own tokens are scanned directly, as n-gram lookup does.
//!
//! Unlike vLLM (a suffix tree per prompt and a global one), matches are found by comparing
//! backwards from each occurrence of the newest token; the drafts differ from Arctic
//! Inference's in detail (it scores matches of several lengths and may draft a tree), not in
//! kind. Greedy output is the same with any draft: verification keeps only what the target
//! agrees with.

use std::collections::{HashMap, VecDeque};

use super::DraftProposer;

/// Most tokens of earlier outputs kept for lookup, across all cached requests.
pub const MAX_CACHED_TOKENS: usize = 1 << 20;

/// The suffix decoding proposer and its cache of earlier outputs.
#[derive(Debug)]
pub struct SuffixProposer {
    /// Longest match plus draft (vLLM's `suffix_decoding_max_tree_depth`).
    pub max_depth: usize,
    /// Draft at most this times the match length (`suffix_decoding_max_spec_factor`).
    pub max_spec_factor: f32,
    /// Stop the draft before its estimated probability falls under this
    /// (`suffix_decoding_min_token_prob`).
    pub min_token_prob: f32,
    /// Finished requests' outputs kept (`suffix_decoding_max_cached_requests`; 0: none).
    pub max_cached_requests: usize,
    cache: OutputCache,
}

impl SuffixProposer {
    pub fn new(max_depth: usize, max_spec_factor: f32, min_token_prob: f32, max_cached_requests: usize) -> Self {
        SuffixProposer {
            max_depth,
            max_spec_factor,
            min_token_prob,
            max_cached_requests,
            cache: OutputCache::default(),
        }
    }

    /// Earlier outputs held now, and their tokens.
    pub fn cached(&self) -> (usize, usize) {
        (self.cache.docs.len(), self.cache.tokens)
    }
}

/// Earlier requests' outputs, oldest first, and for each token where it occurs in them.
#[derive(Debug, Default)]
struct OutputCache {
    docs: VecDeque<Vec<u32>>,
    /// The id of `docs[0]`; `docs[i]` has id `first + i`.
    first: u64,
    tokens: usize,
    /// Token -> (document id, position), in insertion order (so oldest documents first).
    index: HashMap<u32, VecDeque<(u64, u32)>>,
}

impl OutputCache {
    fn doc(&self, id: u64) -> Option<&[u32]> {
        id.checked_sub(self.first).and_then(|i| self.docs.get(i as usize)).map(Vec::as_slice)
    }

    fn push(&mut self, output: &[u32], max_docs: usize) {
        if max_docs == 0 || output.len() < 2 {
            return;
        }
        let output = &output[output.len().saturating_sub(MAX_CACHED_TOKENS)..];
        while !self.docs.is_empty() && (self.docs.len() >= max_docs || self.tokens + output.len() > MAX_CACHED_TOKENS) {
            self.evict();
        }
        let id = self.first + self.docs.len() as u64;
        for (pos, &t) in output.iter().enumerate() {
            self.index.entry(t).or_default().push_back((id, pos as u32));
        }
        self.tokens += output.len();
        self.docs.push_back(output.to_vec());
    }

    fn evict(&mut self) {
        let Some(doc) = self.docs.pop_front() else { return };
        let gone = self.first;
        self.first += 1;
        self.tokens -= doc.len();
        for t in doc {
            if let Some(at) = self.index.get_mut(&t) {
                while at.front().is_some_and(|&(d, _)| d <= gone) {
                    at.pop_front();
                }
                if at.is_empty() {
                    self.index.remove(&t);
                }
            }
        }
    }
}

/// How many tokens before `end` (inclusive) in `text` equal the newest tokens of `tokens`, at
/// most `cap`.
fn match_len(text: &[u32], end: usize, tokens: &[u32], cap: usize) -> usize {
    text[..=end].iter().rev().zip(tokens.iter().rev()).take(cap).take_while(|(a, b)| a == b).count()
}

impl DraftProposer for SuffixProposer {
    fn propose(&self, tokens: &[u32], k: usize) -> Vec<u32> {
        let Some(&last) = tokens.last() else { return Vec::new() };
        let cap = self.max_depth.saturating_sub(1).min(tokens.len());
        if k == 0 || cap == 0 {
            return Vec::new();
        }
        // Every earlier occurrence of the newest token with a token after it, newest first:
        // (its continuation, how far it matches).
        let mut found: Vec<(&[u32], usize)> = Vec::new();
        for e in (0..tokens.len() - 1).rev().filter(|&e| tokens[e] == last) {
            // The own tokens' match may not reach past the sequence's start.
            found.push((&tokens[e + 1..], match_len(tokens, e, tokens, cap.min(tokens.len() - 1))));
        }
        if let Some(at) = self.cache.index.get(&last) {
            for &(d, pos) in at.iter().rev() {
                let Some(doc) = self.cache.doc(d) else { continue };
                let pos = pos as usize;
                if pos + 1 < doc.len() {
                    found.push((&doc[pos + 1..], match_len(doc, pos, tokens, cap)));
                }
            }
        }
        let Some(m) = found.iter().map(|f| f.1).max() else { return Vec::new() };
        let mut cands: Vec<&[u32]> = found.into_iter().filter(|f| f.1 == m).map(|f| f.0).collect();
        let by_factor = (self.max_spec_factor as f64 * m as f64).floor() as usize;
        let n = k.min(by_factor).min(self.max_depth.saturating_sub(m));
        let mut draft = Vec::with_capacity(n);
        let mut prob = 1.0f64;
        for j in 0..n {
            // Counts of the next token, in first-seen (newest-first) order for the tie-break.
            let mut counts: Vec<(u32, usize)> = Vec::new();
            let mut total = 0;
            for c in cands.iter().filter(|c| c.len() > j) {
                total += 1;
                match counts.iter_mut().find(|(t, _)| *t == c[j]) {
                    Some(e) => e.1 += 1,
                    None => counts.push((c[j], 1)),
                }
            }
            let Some(&(best, count)) = counts.iter().reduce(|a, b| if b.1 > a.1 { b } else { a }) else { break };
            prob *= count as f64 / total as f64;
            if prob < self.min_token_prob as f64 {
                break;
            }
            draft.push(best);
            cands.retain(|c| c.len() > j && c[j] == best);
        }
        draft
    }

    fn record_output(&mut self, output: &[u32]) {
        self.cache.push(output, self.max_cached_requests);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suffix(depth: usize, factor: f32, min_prob: f32) -> SuffixProposer {
        SuffixProposer::new(depth, factor, min_prob, 16)
    }

    #[test]
    fn drafts_what_followed_the_longest_match_in_the_sequence() {
        // [8, 2, 3] matches at 0..3 (followed by 4, 5, 6); [3] alone also at 6 (followed by 7).
        let t = [8, 2, 3, 4, 5, 6, 3, 7, 8, 2, 3];
        assert_eq!(suffix(24, 1.0, 0.1).propose(&t, 8), vec![4, 5, 6]);
        assert_eq!(suffix(24, 1.0, 0.1).propose(&t, 2), vec![4, 5]);
        // The match is 3 long: the factor 0.5 allows 1 token, 1.0 three, 4.0 all that follow.
        assert_eq!(suffix(24, 0.5, 0.1).propose(&t, 8), vec![4]);
        assert_eq!(suffix(24, 4.0, 0.1).propose(&t, 20), vec![4, 5, 6, 3, 7, 8, 2, 3]);
        // A depth of 4 leaves room for 4 - 3 = 1 draft token.
        assert_eq!(suffix(4, 4.0, 0.1).propose(&t, 20), vec![4]);
        assert!(suffix(24, 1.0, 0.1).propose(&[1, 2, 3], 4).is_empty(), "no earlier occurrence");
        assert!(suffix(24, 1.0, 0.1).propose(&[], 4).is_empty());
        assert!(suffix(1, 1.0, 0.1).propose(&t, 4).is_empty(), "depth 1 leaves no room");
    }

    /// Several continuations of the same match: the most frequent wins, and the draft stops
    /// when its estimated probability would fall under the minimum.
    #[test]
    fn frequency_picks_the_draft_and_min_token_prob_cuts_it() {
        // After [1, 2]: 3 twice (then 4 and 5), 9 once.
        let t = [1, 2, 3, 4, 1, 2, 9, 0, 1, 2, 3, 5, 1, 2];
        // 3 has 2/3; after [1, 2, 3] the two continue 4 and 5 (1/2 each): 2/3 * 1/2 = 1/3.
        // (The tie between 5 and 4 goes to the newest occurrence's; after it one candidate.)
        assert_eq!(suffix(24, 4.0, 0.3).propose(&t, 4), vec![3, 5, 1, 2]);
        assert_eq!(suffix(24, 4.0, 0.5).propose(&t, 4), vec![3]);
        assert_eq!(suffix(24, 4.0, 0.9).propose(&t, 4), Vec::<u32>::new());
    }

    /// Finished outputs are looked up too, within the cache's bounds.
    #[test]
    fn earlier_outputs_give_drafts_and_are_evicted_oldest_first() {
        let mut s = SuffixProposer::new(24, 4.0, 0.1, 2);
        let tokens = [50, 51, 10, 11, 12];
        assert!(s.propose(&tokens, 4).is_empty());
        s.record_output(&[7, 10, 11, 12, 13, 14, 15]);
        assert_eq!(s.propose(&tokens, 4), vec![13, 14, 15]);
        s.record_output(&[20, 21]);
        s.record_output(&[22, 23]);
        assert_eq!(s.cached(), (2, 4), "the oldest went");
        assert!(s.propose(&tokens, 4).is_empty(), "its tokens are no longer found");
        let mut none = SuffixProposer::new(24, 4.0, 0.1, 0);
        none.record_output(&[7, 10, 11, 12, 13]);
        assert_eq!(none.cached(), (0, 0), "max_cached_requests 0: no cache");
        // The sequence's own match, when longer, wins over a cached one.
        s.record_output(&[11, 12, 99, 98]);
        assert_eq!(s.propose(&[10, 11, 12, 40, 0, 10, 11, 12], 1), vec![40]);
        assert_eq!(s.propose(&[5, 11, 12], 2), vec![99, 98]);
    }

    #[test]
    fn eviction_keeps_the_index_to_the_cached_outputs() {
        let mut s = SuffixProposer::new(24, 4.0, 0.1, 3);
        for i in 0..50u32 {
            s.record_output(&[i % 5, i % 7, i % 3, 1000 + i]);
        }
        let (docs, tokens) = s.cached();
        assert_eq!((docs, tokens), (3, 12));
        let entries: usize = s.cache.index.values().map(VecDeque::len).sum();
        assert_eq!(entries, tokens, "one index entry per cached token");
        assert!(s.cache.index.values().flatten().all(|&(d, _)| d >= s.cache.first));
    }
}
