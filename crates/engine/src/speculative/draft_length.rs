//! How many drafts a sequence gets this step: the configured `k`, cut by the load (how many
//! decodes run) and by what its recent drafts earned.
//!
//! **Load** ([`load_cap`]): each of `b` running decodes gets at most `DRAFT_ROWS / b - 1`
//! drafts, so a step that carries drafts has at most [`DRAFT_ROWS`] rows (decodes and drafts
//! together), and past `DRAFT_ROWS / 2` decodes there are none. Why: a draft token costs a
//! row of the forward whether or not it is accepted. While a forward has few rows it is bound
//! by reading the weights and a few more rows are nearly free; with many rows it is bound by
//! arithmetic and every verified row costs about what a committed token does, so drafts that
//! are then rejected slow everyone down (vLLM measured n-gram drafts 1.4-1.8x slower than
//! none at high load with a fixed `k`; vLLM's `num_speculative_tokens_per_batch_size` and
//! SGLang's adaptive speculation shrink `k` with the batch for the same reason). Where the
//! turn comes is the GEMMs' ridge point: about 295 rows on an H100 in bf16 (989 TFLOP/s over
//! 3.35 TB/s, one multiply-add per weight byte pair per row); [`DRAFT_ROWS`] is under half of
//! it, so drafts stay in the weight-bound regime with room for the attention's own reads.
//!
//! **Acceptance** ([`Acceptance`]): drafts are accepted as a prefix, so with a per-token
//! acceptance rate `a` the draft at position `i` (1-based) is kept with probability about
//! `a^i`. A position is worth its row while `a^i >= MIN_POSITION_ACCEPTANCE`, so a sequence
//! gets `floor(ln MIN_POSITION_ACCEPTANCE / ln a)` drafts at most (`a` = 0.5: 2, 0.8: 6, 0.9:
//! 13). `a` is estimated per sequence from its recent verifications: each verification of `d`
//! drafts with `m` accepted is `m` acceptances and, when `m < d`, one rejection (the maximum
//! likelihood estimate of a geometric run), both sums decayed by [`DECAY`] each verification so
//! that a change of text (a copied passage ends) shows within a few steps. A sequence whose
//! rate allows no draft ("it does not pay") gets none, except one probe draft every
//! [`PROBE_EVERY`] steps, so a text that turns repetitive again is noticed. A new sequence
//! starts from a prior of 2 acceptances and 1 rejection (`a` = 2/3: 3 drafts).
//!
//! Neither cut changes an answer: verification keeps exactly the tokens plain decoding gives,
//! whatever was drafted.

/// Most rows (decodes and their drafts) of a step that carries drafts.
pub const DRAFT_ROWS: usize = 128;

/// A draft position is proposed while its estimated acceptance probability is at least this.
pub const MIN_POSITION_ACCEPTANCE: f64 = 0.25;

/// A sequence whose acceptance allows no draft gets one probe draft this often (in its steps).
pub const PROBE_EVERY: u32 = 8;

/// The weight a verification's counts keep at the next verification.
pub const DECAY: f64 = 0.8;

/// The most drafts each of `decodes` running decodes may get, `k` at most.
pub fn load_cap(k: usize, decodes: usize) -> usize {
    k.min((DRAFT_ROWS / decodes.max(1)).saturating_sub(1))
}

/// A sequence's recent acceptance (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acceptance {
    /// Decayed count of accepted drafts.
    accepted: f64,
    /// Decayed count of verifications that rejected a draft.
    rejected: f64,
    /// Steps since the sequence last got a draft.
    idle: u32,
}

impl Default for Acceptance {
    fn default() -> Self {
        Acceptance { accepted: 2.0, rejected: 1.0, idle: 0 }
    }
}

impl Acceptance {
    /// The estimated per-token acceptance rate.
    pub fn rate(&self) -> f64 {
        self.accepted / (self.accepted + self.rejected)
    }

    /// Records a verification of `drafts` drafts of which the first `accepted` were kept.
    pub fn record(&mut self, drafts: usize, accepted: usize) {
        if drafts == 0 {
            return;
        }
        self.accepted = DECAY * self.accepted + accepted as f64;
        self.rejected = DECAY * self.rejected + f64::from(u8::from(accepted < drafts));
    }

    /// How many drafts the rate makes worth verifying, `cap` at most.
    pub fn worth(&self, cap: usize) -> usize {
        let a = self.rate();
        if a >= 1.0 {
            return cap;
        }
        if a <= 0.0 {
            return 0;
        }
        let d = (MIN_POSITION_ACCEPTANCE.ln() / a.ln()).floor();
        (d as usize).min(cap)
    }

    /// The drafts this sequence gets this step, `cap` at most (the load's): what its rate is
    /// worth, or a single probe when that is none and it has gone [`PROBE_EVERY`] steps
    /// without a draft.
    pub fn allow(&mut self, cap: usize) -> usize {
        let d = self.worth(cap);
        if d > 0 || cap == 0 {
            self.idle = 0;
            return d;
        }
        self.idle += 1;
        if self.idle >= PROBE_EVERY {
            self.idle = 0;
            1
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_cap_keeps_a_steps_rows_bounded() {
        for k in 1..=8 {
            for decodes in 1..=200 {
                let cap = load_cap(k, decodes);
                assert!(cap <= k);
                if cap > 0 {
                    assert!(decodes * (1 + cap) <= DRAFT_ROWS, "{decodes} decodes with {cap} drafts each");
                }
                assert!(load_cap(k, decodes + 1) <= cap, "more decodes never get more drafts");
            }
            assert_eq!(load_cap(k, 1), k);
            assert_eq!(load_cap(k, DRAFT_ROWS / 2), 1);
            assert_eq!(load_cap(k, DRAFT_ROWS / 2 + 1), 0, "none past DRAFT_ROWS / 2 decodes");
        }
        assert_eq!(load_cap(5, 16), 5);
        assert_eq!(load_cap(5, 32), 3);
        assert_eq!(load_cap(5, 48), 1);
        assert_eq!(load_cap(5, 0), 5);
    }

    #[test]
    fn the_rate_sets_how_far_drafts_are_worth_it() {
        let at = |rate: f64| Acceptance { accepted: rate, rejected: 1.0 - rate, idle: 0 };
        assert_eq!(at(0.5).worth(10), 2); // 0.5^2 = 0.25
        assert_eq!(at(0.8).worth(10), 6); // 0.8^6 = 0.26, 0.8^7 = 0.21
        assert_eq!(at(0.8).worth(4), 4);
        assert_eq!(at(0.45).worth(10), 1);
        assert_eq!(at(0.2).worth(10), 0);
        assert_eq!(at(0.0).worth(10), 0);
        assert_eq!(Acceptance { accepted: 3.0, rejected: 0.0, idle: 0 }.worth(7), 7);
        assert_eq!(Acceptance::default().worth(10), 3, "a new sequence: 2/3");
    }

    /// A sequence whose drafts are all rejected stops drafting within a few steps and then only
    /// probes; once its drafts are accepted again it is back to full drafts.
    #[test]
    fn drafting_stops_when_it_does_not_pay_and_resumes_when_it_does() {
        let mut a = Acceptance::default();
        let mut steps_to_zero = None;
        for step in 0..20 {
            let d = a.allow(5);
            if d == 0 {
                steps_to_zero = Some(step);
                break;
            }
            a.record(d, 0);
        }
        let steps = steps_to_zero.expect("never stopped drafting");
        assert!(steps <= 6, "took {steps} rejected verifications");
        let given: Vec<usize> = (0..3 * PROBE_EVERY).map(|_| a.allow(5)).collect();
        assert_eq!(given.iter().filter(|&&d| d == 1).count(), 3, "one probe every PROBE_EVERY steps: {given:?}");
        assert!(given.iter().all(|&d| d <= 1));
        // Probes accepted: the rate climbs back and drafts grow to the cap.
        for _ in 0..30 {
            let d = a.allow(5).max(1);
            a.record(d, d);
        }
        assert_eq!(a.allow(5), 5);
    }

    #[test]
    fn the_estimate_counts_acceptances_and_rejections_of_prefixes() {
        let mut a = Acceptance { accepted: 0.0, rejected: 0.0, idle: 0 };
        a.record(4, 4); // all kept: 4 acceptances, no rejection
        assert_eq!(a.rate(), 1.0);
        a.record(4, 1); // 1 kept, then a rejection
        assert!((a.rate() - (0.8 * 4.0 + 1.0) / (0.8 * 4.0 + 1.0 + 1.0)).abs() < 1e-12);
        let before = a;
        a.record(0, 0);
        assert_eq!(a, before, "no drafts: nothing learnt");
        // Under the load cap of 0 nothing is drafted and no probe is owed.
        let mut z = Acceptance { accepted: 0.0, rejected: 5.0, idle: 0 };
        for _ in 0..3 * PROBE_EVERY {
            assert_eq!(z.allow(0), 0);
        }
    }
}
