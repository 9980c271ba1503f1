//! Incremental detokenisation for streaming: text is emitted only once it is complete UTF-8.
//!
//! Byte-level BPE can split one character over several tokens; decoding a prefix then ends in
//! U+FFFD. Like vLLM and TGI, we decode a short window `ids[prefix..]` and compare it with
//! `ids[prefix..read]`; new text is released only when it does not end in a replacement char.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone, Default)]
pub struct IncrementalDetokenizer {
    ids: Vec<u32>,
    /// Start of the decoding window (a few tokens back, so merges across the boundary decode right).
    prefix: usize,
    /// Everything before this has been emitted.
    read: usize,
    skip_special_tokens: bool,
}

impl IncrementalDetokenizer {
    pub fn new(skip_special_tokens: bool) -> Self {
        IncrementalDetokenizer { skip_special_tokens, ..Default::default() }
    }

    /// Feeds new ids; returns the text that became complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, new_ids: &[u32]) -> Result<String> {
        self.ids.extend_from_slice(new_ids);
        let before = tok.decode(&self.ids[self.prefix..self.read], self.skip_special_tokens)?;
        let now = tok.decode(&self.ids[self.prefix..], self.skip_special_tokens)?;
        if now.len() > before.len()
            && !now.ends_with('\u{FFFD}')
            && now.is_char_boundary(before.len())
            && now.starts_with(&before)
        {
            let delta = now[before.len()..].to_string();
            self.prefix = self.read;
            self.read = self.ids.len();
            return Ok(delta);
        }
        Ok(String::new())
    }

    /// At the end of a stream: whatever is still held back (a truly broken sequence stays U+FFFD).
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String> {
        let before = tok.decode(&self.ids[self.prefix..self.read], self.skip_special_tokens)?;
        let now = tok.decode(&self.ids[self.prefix..], self.skip_special_tokens)?;
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(now.get(before.len()..).unwrap_or_default().to_string())
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}
