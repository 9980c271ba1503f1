//! Constrained decoding as the engine sees it: a request may carry a [`Guided`] (built by
//! `tandem-structured` from a JSON schema, regex, choice list or grammar), which starts one
//! [`Constraint`] per completion. Before a constrained row is sampled the engine asks its
//! constraint for the allowed tokens and sets every other logit to -inf; the sampled token is
//! then committed. The engine knows no grammar library: anything that implements the trait will
//! do (the tests use a tiny one).
//!
//! Invariants the engine keeps:
//! - the mask of step N is computed on a helper thread while the model runs step N (it depends
//!   only on the tokens committed before), and is applied to the row before sampling;
//! - a constrained row is sampled where the others are: on the device with its mask uploaded
//!   (only the constrained rows' masks travel, `RowMasks`), or on the host when some row of the
//!   step needs the host; both give the same ids, so the other rows get the ids they get alone;
//! - a constraint that is finished (the grammar accepts and admits no more tokens) ends its
//!   completion with finish_reason "stop"; one that admits no token at all ends it with an error.

use std::fmt;
use std::sync::Arc;

/// The per-completion state of a constraint.
pub trait Constraint: Send {
    /// Writes the tokens allowed next into `mask`, a bitset of `ceil(vocab / 32)` words (token
    /// `t` is bit `t % 32` of word `t / 32`), every bit set before the call. Tokens the tokenizer
    /// does not know (a vocabulary padded in the model) must be cleared.
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), String>;
    /// Advances past a sampled token, which the last mask allowed.
    fn commit(&mut self, token: u32) -> Result<(), String>;
    /// The grammar is complete and can take no further token: the completion ends here.
    fn is_finished(&self) -> bool;
    /// A copy in the same state that advances on its own: speculative decoding checks a
    /// sequence's drafts on one (the real constraint only ever takes committed tokens). None:
    /// this constraint cannot be copied, and its sequence gets no drafts.
    fn fork(&self) -> Option<Box<dyn Constraint>> {
        None
    }
}

/// What follows a complete grammar when the model has an end-of-sequence token: that token
/// alone. vLLM (xgrammar) lets the model sample it and counts it as an output token; the
/// engine does the same, so that usage agrees (one step more than stopping at once).
#[derive(Clone)]
pub struct EndOnly {
    eos: Vec<u32>,
    done: bool,
}

impl EndOnly {
    pub fn new(eos: Vec<u32>) -> Self {
        EndOnly { eos, done: false }
    }
}

impl Constraint for EndOnly {
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), String> {
        mask.fill(0);
        for &t in &self.eos {
            if let Some(w) = mask.get_mut(t as usize / 32) {
                *w |= 1 << (t % 32);
            }
        }
        Ok(())
    }
    fn commit(&mut self, token: u32) -> Result<(), String> {
        if !self.eos.contains(&token) {
            return Err(format!("token {token} after a complete grammar, which admits only the end-of-sequence token"));
        }
        self.done = true;
        Ok(())
    }
    fn is_finished(&self) -> bool {
        self.done
    }
    fn fork(&self) -> Option<Box<dyn Constraint>> {
        Some(Box::new(self.clone()))
    }
}

/// What a request asks for, compiled once: starts a [`Constraint`] per completion (each of
/// the `n` completions, and each starts where the prompt ends).
pub trait ConstraintFactory: Send + Sync {
    fn start(&self) -> Result<Box<dyn Constraint>, String>;
    /// A short description for logs ("json_schema", "regex", ...).
    fn kind(&self) -> &str;
}

/// A request's constraint, as [`crate::SamplingParams::guided`] holds it. Two are equal when
/// they are the same compiled object.
#[derive(Clone)]
pub struct Guided(pub Arc<dyn ConstraintFactory>);

impl Guided {
    pub fn new(f: impl ConstraintFactory + 'static) -> Self {
        Guided(Arc::new(f))
    }
}

impl fmt::Debug for Guided {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Guided({})", self.0.kind())
    }
}

impl PartialEq for Guided {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The simplest constraint: only these token ids, at every position, never finished (vLLM's
/// `allowed_token_ids`). Ids past the vocabulary are ignored.
#[derive(Debug, Clone)]
pub struct AllowedTokens(pub Vec<u32>);

impl ConstraintFactory for AllowedTokens {
    fn start(&self) -> Result<Box<dyn Constraint>, String> {
        Ok(Box::new(self.clone()))
    }
    fn kind(&self) -> &str {
        "allowed_token_ids"
    }
}

impl Constraint for AllowedTokens {
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), String> {
        mask.fill(0);
        for &t in &self.0 {
            if let Some(w) = mask.get_mut(t as usize / 32) {
                *w |= 1 << (t % 32);
            }
        }
        Ok(())
    }
    fn commit(&mut self, token: u32) -> Result<(), String> {
        match self.0.contains(&token) {
            true => Ok(()),
            false => Err(format!("token {token} is not among the allowed ids")),
        }
    }
    fn is_finished(&self) -> bool {
        false
    }
    fn fork(&self) -> Option<Box<dyn Constraint>> {
        Some(Box::new(self.clone()))
    }
}

/// Whether `mask` (a bitset as [`Constraint::fill_mask`] writes it) allows `token`.
pub fn allows(mask: &[u32], token: u32) -> bool {
    mask.get(token as usize / 32).is_some_and(|w| w >> (token % 32) & 1 == 1)
}

/// Words in a mask for `vocab` tokens.
pub fn mask_words(vocab: usize) -> usize {
    vocab.div_ceil(32)
}

pub use tandem_core::sampling::apply_mask;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mask_keeps_exactly_its_bits() {
        let mut l = vec![1.0f32; 70];
        let mut mask = vec![0u32; mask_words(70)];
        for t in [0usize, 31, 32, 69] {
            mask[t / 32] |= 1 << (t % 32);
        }
        assert_eq!(apply_mask(&mut l, &mask), 4);
        for (t, x) in l.iter().enumerate() {
            assert_eq!(x.is_finite(), [0, 31, 32, 69].contains(&t), "token {t}");
        }
    }
}
