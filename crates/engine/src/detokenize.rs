//! The text of one completion as it streams: incremental decoding through a caller-supplied
//! decode function, and stop strings, held back while a partial match is pending so the stream
//! never shows them.
//!
//! The engine does not depend on a tokenizer API: it takes `Fn(&[u32]) -> String`. Decoding
//! works on a short window (vLLM's prefix/read offsets): the text of `ids[prefix..read]` was
//! already emitted; the text of `ids[prefix..]` beyond it is new, unless it ends in U+FFFD (a
//! multi-byte character split across tokens), in which case we wait for the next token.

use std::sync::Arc;

/// Token ids to text. Must be pure: the same ids always give the same text.
pub type DecodeFn = Arc<dyn Fn(&[u32]) -> String + Send + Sync>;

/// The decoder over a model's tokenizer that the server and the `tandem` library both use.
/// Special tokens are left out of the text, as vLLM does by default.
pub fn tokenizer_decode_fn(tok: Arc<tandem_core::tokenizer::Tokenizer>) -> DecodeFn {
    Arc::new(move |ids: &[u32]| tok.decode(ids, true).unwrap_or_default())
}

/// Prompt tokens decoded before the output so that a leading space or merge renders as it
/// would in context.
const PROMPT_CONTEXT: usize = 5;

#[derive(Debug, Clone)]
pub struct OutputText {
    /// The last few prompt ids, then every output id fed to the text.
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    /// All text so far (cut at a stop string once one is found).
    text: String,
    /// Bytes of `text` already handed to the stream.
    sent: usize,
}

impl OutputText {
    pub fn new(prompt: &[u32]) -> Self {
        let ctx = &prompt[prompt.len().saturating_sub(PROMPT_CONTEXT)..];
        OutputText { ids: ctx.to_vec(), prefix_offset: 0, read_offset: ctx.len(), text: String::new(), sent: 0 }
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// Feeds one output token. Returns the stop string now contained in the text, if any; the
    /// text is then cut where the stop string begins.
    pub fn push(&mut self, decode: &DecodeFn, id: u32, stops: &[String]) -> Option<String> {
        self.push_keeping(decode, id, stops, false)
    }

    /// As [`OutputText::push`]; with `keep_stop` the text is cut after the stop string instead.
    pub fn push_keeping(&mut self, decode: &DecodeFn, id: u32, stops: &[String], keep_stop: bool) -> Option<String> {
        self.ids.push(id);
        let old_len = self.text.len();
        self.decode_pending(decode, false);
        self.find_stop(stops, old_len, keep_stop)
    }

    /// At the end, whatever is pending (even a lone partial character) is flushed.
    pub fn finish(&mut self, decode: &DecodeFn) {
        self.decode_pending(decode, true);
    }

    fn decode_pending(&mut self, decode: &DecodeFn, flush: bool) {
        if self.read_offset >= self.ids.len() {
            return;
        }
        let prefix = decode(&self.ids[self.prefix_offset..self.read_offset]);
        let full = decode(&self.ids[self.prefix_offset..]);
        if full.len() > prefix.len() && full.is_char_boundary(prefix.len()) && (flush || !full.ends_with('\u{FFFD}')) {
            self.text.push_str(&full[prefix.len()..]);
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
        }
    }

    fn find_stop(&mut self, stops: &[String], old_len: usize, keep_stop: bool) -> Option<String> {
        let mut best: Option<(usize, &String)> = None;
        for s in stops {
            // A new match must end in the new text, so it starts at most len(s)-1 bytes before.
            let mut from = old_len.saturating_sub(s.len().saturating_sub(1));
            while !self.text.is_char_boundary(from) {
                from -= 1;
            }
            if let Some(i) = self.text[from..].find(s.as_str()) {
                let at = from + i;
                if best.is_none_or(|(b, _)| at < b) {
                    best = Some((at, s));
                }
            }
        }
        let (at, s) = best?;
        let at = if keep_stop { at + s.len() } else { at };
        self.text.truncate(at);
        self.sent = self.sent.min(at);
        Some(s.clone())
    }

    /// Text not yet streamed, minus any tail that could still grow into a stop string (unless
    /// `finished`).
    pub fn take_new(&mut self, stops: &[String], finished: bool) -> String {
        let hold = if finished { 0 } else { self.pending_stop_prefix(stops) };
        let end = self.text.len().saturating_sub(hold).max(self.sent);
        let out = self.text[self.sent..end].to_string();
        self.sent = end;
        out
    }

    /// Length of the longest suffix of the text that is a proper prefix of a stop string.
    fn pending_stop_prefix(&self, stops: &[String]) -> usize {
        let mut hold = 0;
        for s in stops {
            for (k, _) in s.char_indices().skip(1) {
                if k > hold && self.text.ends_with(&s[..k]) {
                    hold = k;
                }
            }
        }
        hold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each id is one letter: 0 -> 'a', 1 -> 'b', ...; 100 and 101 are the two halves of 'é'.
    fn letters() -> DecodeFn {
        Arc::new(|ids: &[u32]| {
            let mut bytes = Vec::new();
            for &i in ids {
                match i {
                    100 => bytes.push(0xC3),
                    101 => bytes.push(0xA9),
                    _ => bytes.push(b'a' + (i % 26) as u8),
                }
            }
            String::from_utf8_lossy(&bytes).into_owned()
        })
    }

    #[test]
    fn streams_text_and_never_splits_a_character() {
        let d = letters();
        let mut t = OutputText::new(&[0, 1]);
        let mut out = String::new();
        for id in [2, 100, 101, 3] {
            assert_eq!(t.push(&d, id, &[]), None);
            let piece = t.take_new(&[], false);
            assert!(!piece.contains('\u{FFFD}'), "{piece:?}");
            out += &piece;
        }
        assert_eq!(out, "céd");
    }

    #[test]
    fn stop_string_is_held_back_then_cut() {
        let d = letters();
        let stops = vec!["cde".to_string()];
        let mut t = OutputText::new(&[]);
        let mut shown = Vec::new();
        for id in [0, 1, 2, 3] {
            assert_eq!(t.push(&d, id, &stops), None);
            shown.push(t.take_new(&stops, false));
        }
        assert_eq!(shown, vec!["a", "b", "", ""], "'c' and 'cd' may begin the stop string");
        assert_eq!(t.push(&d, 4, &stops), Some("cde".into()));
        assert_eq!(t.take_new(&stops, true), "");
        assert_eq!(t.text(), "ab");
    }

    #[test]
    fn a_kept_stop_string_stays_and_what_follows_it_goes() {
        let d = letters();
        let stops = vec!["cd".to_string()];
        let mut t = OutputText::new(&[]);
        for id in [0, 1, 2] {
            assert_eq!(t.push_keeping(&d, id, &stops, true), None);
        }
        assert_eq!(t.push_keeping(&d, 3, &stops, true), Some("cd".into()));
        assert_eq!(t.take_new(&stops, true), "abcd");
        // A token that completes the stop string and runs past it: cut right after the stop.
        let both: DecodeFn = Arc::new(|ids: &[u32]| {
            ids.iter()
                .map(|&i| if i == 9 { "dxy".to_string() } else { ((b'a' + i as u8) as char).to_string() })
                .collect()
        });
        let mut t = OutputText::new(&[]);
        t.push_keeping(&both, 2, &stops, true);
        assert_eq!(t.push_keeping(&both, 9, &stops, true), Some("cd".into()));
        assert_eq!(t.text(), "cd");
    }

    #[test]
    fn held_text_is_released_when_the_match_fails_or_the_output_ends() {
        let d = letters();
        let stops = vec!["cx".to_string()];
        let mut t = OutputText::new(&[]);
        t.push(&d, 2, &stops);
        assert_eq!(t.take_new(&stops, false), "");
        t.push(&d, 3, &stops); // "cd": no longer a prefix of "cx"
        assert_eq!(t.take_new(&stops, false), "cd");
        t.push(&d, 2, &stops);
        assert_eq!(t.take_new(&stops, false), "");
        t.finish(&d);
        assert_eq!(t.take_new(&stops, true), "c");
    }
}
