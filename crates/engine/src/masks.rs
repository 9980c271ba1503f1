//! The masks of a step's constrained rows, computed on helper threads while the forward runs:
//! a mask depends only on its own constraint, so it is ready by the time the model wants it
//! (the device path asks for it between the forward and the sampling) and costs no step time.

use std::time::Instant;

use crate::constraint::{mask_words, Constraint};
use crate::sequence::SeqId;

/// A constrained row of a step whose mask is to be computed on a helper thread while the
/// forward runs: (its index among the sampled rows, its sequence, its constraint).
pub(crate) type MaskJob = (usize, SeqId, Box<dyn Constraint>);

/// A computed mask, with the constraint that gave it (handed back to its sequence).
pub(crate) struct MaskDone {
    /// The row's index among the step's sampled rows.
    pub(crate) row: usize,
    pub(crate) seq: SeqId,
    pub(crate) constraint: Box<dyn Constraint>,
    pub(crate) mask: Result<Vec<u32>, String>,
    /// How long `fill_mask` took (the stats' mask timings).
    pub(crate) seconds: f64,
}

/// The masks of `jobs`, over `threads` threads (see [`mask_threads`]).
pub(crate) fn compute_masks(jobs: Vec<MaskJob>, vocab: usize, threads: usize) -> Vec<MaskDone> {
    let one = |(row, seq, mut constraint): MaskJob| {
        let t0 = Instant::now();
        let mut mask = vec![u32::MAX; mask_words(vocab)];
        let mask = constraint.fill_mask(&mut mask).map(|()| mask);
        MaskDone { row, seq, constraint, mask, seconds: t0.elapsed().as_secs_f64() }
    };
    if threads <= 1 {
        return jobs.into_iter().map(one).collect();
    }
    // Many constrained rows: spread them over threads, leaving a core to the forward's host
    // side. Each mask depends only on its own constraint, so the split changes no result.
    let per = jobs.len().div_ceil(threads);
    let mut chunks: Vec<Vec<MaskJob>> = vec![];
    let mut it = jobs.into_iter().peekable();
    while it.peek().is_some() {
        chunks.push(it.by_ref().take(per).collect());
    }
    std::thread::scope(|sc| {
        let hs: Vec<_> =
            chunks.into_iter().map(|c| sc.spawn(move || c.into_iter().map(one).collect::<Vec<_>>())).collect();
        hs.into_iter().flat_map(|h| h.join().expect("computing a mask panicked")).collect()
    })
}

/// Threads for `jobs` masks on a machine of `cores`: at least 8 masks a thread (a mask takes
/// tens of microseconds, a thread start about as much), at most one fewer than the cores.
pub(crate) fn mask_threads(jobs: usize, cores: usize) -> usize {
    jobs.div_ceil(8).min(cores.saturating_sub(1)).max(1)
}

/// Whether a mask allows at least one token.
pub(crate) fn admits_some(mask: &[u32]) -> bool {
    mask.iter().any(|&w| w != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constraint::{AllowedTokens, ConstraintFactory};

    #[test]
    fn mask_threads_leave_a_core_and_take_eight_masks_each() {
        assert_eq!(mask_threads(1, 16), 1);
        assert_eq!(mask_threads(8, 16), 1);
        assert_eq!(mask_threads(9, 16), 2);
        assert_eq!(mask_threads(64, 16), 8);
        assert_eq!(mask_threads(256, 16), 15);
        assert_eq!(mask_threads(64, 2), 1);
        assert_eq!(mask_threads(64, 1), 1);
    }

    /// Split over 4 threads (10 jobs each), every job comes back with its own mask.
    #[test]
    fn masks_computed_in_parallel_belong_to_their_rows() {
        let jobs: Vec<MaskJob> =
            (0..40).map(|i| (i, 100 + i as u64, AllowedTokens(vec![i as u32]).start().unwrap())).collect();
        let mut done = compute_masks(jobs, 64, 4);
        assert_eq!(done.len(), 40);
        done.sort_by_key(|d| d.row);
        for (i, d) in done.iter().enumerate() {
            assert_eq!((d.row, d.seq), (i, 100 + i as u64));
            let m = d.mask.as_ref().unwrap();
            assert_eq!(m.iter().map(|w| w.count_ones()).sum::<u32>(), 1);
            assert_eq!(m[i / 32] >> (i % 32) & 1, 1);
        }
    }
}
