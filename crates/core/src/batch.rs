//! The flattened batch the engine hands to a model: the scheduler's decisions, with none of
//! its insides. Prefill chunks and decode tokens of many sequences travel together.

use crate::error::{Error, Result};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForwardBatch {
    /// Token ids `[T]`, sequence after sequence.
    pub tokens: Vec<u32>,
    /// Position of each token in its sequence `[T]` (also its index in the KV cache).
    pub positions: Vec<u32>,
    /// KV slot each token's K and V are written to `[T]`: `block * block_size + offset`.
    pub slots: Vec<u32>,
    /// Row of `block_tables` for each token `[T]`.
    pub token_seq: Vec<u32>,
    /// `[num_seqs, max_blocks]`, row-major; unused entries are 0.
    pub block_tables: Vec<u32>,
    pub max_blocks: usize,
    /// Tokens whose logits are wanted, in the order the logits come back.
    pub logit_rows: Vec<u32>,
    /// The LoRA slot of each sequence `[num_seqs]` (None: the base model); empty: none uses one.
    pub adapters: Vec<Option<u32>>,
}

/// How many of the first tokens are each a whole sequence of one token (token i is sequence
/// i, and token i + 1 is not): a step's leading decodes, `AttnArgs::decode_tokens`.
pub fn leading_decodes(token_seq: &[u32]) -> usize {
    (0..token_seq.len())
        .take_while(|&i| token_seq[i] as usize == i && token_seq.get(i + 1) != Some(&token_seq[i]))
        .count()
}

impl ForwardBatch {
    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }
    pub fn num_seqs(&self) -> usize {
        self.block_tables.len().checked_div(self.max_blocks).unwrap_or(0)
    }

    /// Appends one sequence's chunk: `tokens` at positions `start..start+len`, its block table,
    /// and whether the last token's logits are wanted.
    pub fn push_seq(
        &mut self,
        tokens: &[u32],
        start: usize,
        block_table: &[u32],
        block_size: usize,
        want_logits: bool,
    ) {
        let seq = self.num_seqs() as u32;
        debug_assert!(block_table.len() <= self.max_blocks, "block table longer than max_blocks");
        for (i, &tok) in tokens.iter().enumerate() {
            let pos = start + i;
            self.tokens.push(tok);
            self.positions.push(pos as u32);
            self.slots.push(block_table[pos / block_size] * block_size as u32 + (pos % block_size) as u32);
            self.token_seq.push(seq);
        }
        let mut row = block_table.to_vec();
        row.resize(self.max_blocks, 0);
        self.block_tables.extend_from_slice(&row);
        if want_logits && !tokens.is_empty() {
            self.logit_rows.push(self.tokens.len() as u32 - 1);
        }
    }

    /// Checks the invariants a backend relies on, so that a bad batch is an error and not an
    /// out-of-bounds access on a device.
    pub fn validate(&self, vocab: usize, num_slots: usize, block_size: usize) -> Result<()> {
        let t = self.tokens.len();
        if self.positions.len() != t || self.slots.len() != t || self.token_seq.len() != t {
            return Err(Error::Batch("tokens, positions, slots and token_seq differ in length".into()));
        }
        if self.max_blocks == 0 || !self.block_tables.len().is_multiple_of(self.max_blocks) {
            return Err(Error::Batch("block_tables is not [num_seqs, max_blocks]".into()));
        }
        let seqs = self.num_seqs();
        let num_blocks = num_slots / block_size;
        if let Some(b) = self.block_tables.iter().find(|&&b| b as usize >= num_blocks) {
            return Err(Error::Batch(format!("block id {b} out of range ({num_blocks} blocks)")));
        }
        for i in 0..t {
            if self.tokens[i] as usize >= vocab {
                return Err(Error::Batch(format!("token id {} out of vocabulary ({vocab})", self.tokens[i])));
            }
            let s = self.token_seq[i] as usize;
            if s >= seqs {
                return Err(Error::Batch(format!("token {i} names sequence {s} of {seqs}")));
            }
            let p = self.positions[i] as usize;
            if p / block_size >= self.max_blocks {
                return Err(Error::Batch(format!("position {p} beyond the block table")));
            }
            let expect = self.block_tables[s * self.max_blocks + p / block_size] as usize * block_size + p % block_size;
            if self.slots[i] as usize != expect {
                return Err(Error::Batch(format!(
                    "token {i}: slot {} does not match its block table ({expect})",
                    self.slots[i]
                )));
            }
        }
        if let Some(r) = self.logit_rows.iter().find(|&&r| r as usize >= t) {
            return Err(Error::Batch(format!("logit row {r} out of range ({t} tokens)")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_decodes_counts_one_token_sequences_from_the_start() {
        assert_eq!(leading_decodes(&[]), 0);
        assert_eq!(leading_decodes(&[0, 1, 2]), 3);
        assert_eq!(leading_decodes(&[0, 1, 2, 2, 3]), 2); // sequence 2 is a chunk
        assert_eq!(leading_decodes(&[0, 0, 1]), 0);
        assert_eq!(leading_decodes(&[0, 1, 1]), 1);
        assert_eq!(leading_decodes(&[1, 2]), 0); // token 0 is not sequence 0
    }

    #[test]
    fn push_seq_maps_slots_through_block_table() {
        let mut b = ForwardBatch { max_blocks: 3, ..Default::default() };
        b.push_seq(&[5, 6, 7], 14, &[4, 9], 16, true); // positions 14,15 in block 4; 16 in block 9
        b.push_seq(&[8], 0, &[2], 16, false);
        assert_eq!(b.slots, vec![4 * 16 + 14, 4 * 16 + 15, 9 * 16, 2 * 16]);
        assert_eq!(b.token_seq, vec![0, 0, 0, 1]);
        assert_eq!(b.block_tables, vec![4, 9, 0, 2, 0, 0]);
        assert_eq!(b.logit_rows, vec![2]);
        b.validate(10, 16 * 10, 16).unwrap();
        b.slots[3] = 0;
        assert!(b.validate(10, 160, 16).is_err());
    }
}
