//! A thinking model's reasoning, split out of its answer as vLLM's `--reasoning-parser` does:
//! the text between `<think>` and `</think>` is the reasoning (chat: `reasoning_content` and
//! `reasoning`), the text after `</think>` the content.
//! - `qwen3`: the answer opens with `<think>` (after blanks) or has no reasoning at all; but
//!   where the prompt ends with an open `<think>` (Qwen3.5's and the 2507 thinking models'
//!   templates write it; vLLM's parser reads it so too) the answer starts inside the block, as
//!   with `deepseek_r1` ([`ReasoningParser::for_prompt`]);
//! - `deepseek_r1`: the template may open the block itself, so the answer may start inside it
//!   with no `<think>`: all text up to `</think>` is reasoning, all of it while none came.
//!
//! A block cut short (`max_tokens`) is reasoning to its end. The text is kept as written: no
//! trimming of either part, so that a stream's pieces add up to the whole answer's parts.
//! [`ReasoningStream`] splits a streamed answer likewise, holding a tail that may be the start
//! of a tag.

use std::ops::Range;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    Qwen3,
    DeepSeekR1,
}

/// The names, as vLLM spells them.
pub const NAMES: &[&str] = &["qwen3", "deepseek_r1"];

/// Where the parts of an answer (so far) lie: the reasoning's bytes certain so far, and where
/// the content begins once it has begun.
struct Parts {
    reasoning: Range<usize>,
    content: Option<usize>,
}

/// The length of the longest tail of `text` that is a proper prefix of `tag`.
fn partial_tail(text: &str, tag: &str) -> usize {
    (1..tag.len()).rev().find(|&k| text.ends_with(&tag[..k])).unwrap_or(0)
}

impl ReasoningParser {
    pub fn from_name(name: &str) -> Option<ReasoningParser> {
        match name {
            "qwen3" => Some(ReasoningParser::Qwen3),
            "deepseek_r1" => Some(ReasoningParser::DeepSeekR1),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ReasoningParser::Qwen3 => "qwen3",
            ReasoningParser::DeepSeekR1 => "deepseek_r1",
        }
    }

    /// The parser for an answer to a prompt ending in `prompt_tail`: `qwen3` reads as
    /// `deepseek_r1` when the template left a `<think>` open at the end.
    pub fn for_prompt(self, prompt_tail: &str) -> ReasoningParser {
        let t = prompt_tail.trim_end();
        match self {
            ReasoningParser::Qwen3 if t.ends_with(OPEN) => ReasoningParser::DeepSeekR1,
            p => p,
        }
    }

    /// `done`: the text is the whole answer, no tag can still be completed.
    fn parts(self, text: &str, done: bool) -> Parts {
        let lead = text.len() - text.trim_start().len();
        let rest = &text[lead..];
        if !done && OPEN.starts_with(rest) {
            // Blank so far, or a `<think>` not yet whole.
            return Parts { reasoning: 0..0, content: None };
        }
        let body = match rest.strip_prefix(OPEN) {
            Some(_) => lead + OPEN.len(),
            None if self == ReasoningParser::DeepSeekR1 => 0,
            None => return Parts { reasoning: 0..0, content: Some(0) },
        };
        match text[body..].find(CLOSE) {
            Some(e) => Parts { reasoning: body..body + e, content: Some(body + e + CLOSE.len()) },
            None if done => Parts { reasoning: body..text.len(), content: None },
            None => {
                Parts { reasoning: body..(text.len() - partial_tail(&text[body..], CLOSE)).max(body), content: None }
            }
        }
    }

    /// A whole answer's reasoning (None when it has none) and content.
    pub fn split(self, text: &str) -> (Option<String>, String) {
        let p = self.parts(text, true);
        let reasoning = (!p.reasoning.is_empty() || p.reasoning.start > 0).then(|| text[p.reasoning].to_string());
        let content = p.content.map_or(String::new(), |c| text[c..].to_string());
        (reasoning, content)
    }
}

/// One streamed answer's split: text in, new reasoning and new content out.
#[derive(Debug, Clone)]
pub struct ReasoningStream {
    parser: ReasoningParser,
    text: String,
    /// Bytes of `text` sent: the reasoning up to here, the content from its start up to here.
    reasoning_sent: usize,
    content_sent: usize,
}

impl ReasoningStream {
    pub fn new(parser: ReasoningParser) -> Self {
        ReasoningStream { parser, text: String::new(), reasoning_sent: 0, content_sent: 0 }
    }

    /// Takes the next piece of text (`done` with the last); answers the reasoning and content
    /// that are certain now and were not sent before.
    pub fn push(&mut self, piece: &str, done: bool) -> (String, String) {
        self.text.push_str(piece);
        let p = self.parser.parts(&self.text, done);
        let from = self.reasoning_sent.max(p.reasoning.start);
        let reasoning =
            if p.reasoning.end > from { self.text[from..p.reasoning.end].to_string() } else { String::new() };
        self.reasoning_sent = self.reasoning_sent.max(p.reasoning.end);
        let content = match p.content {
            Some(c) => {
                let from = self.content_sent.max(c);
                self.content_sent = self.text.len();
                self.text[from..].to_string()
            }
            None => String::new(),
        };
        (reasoning, content)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3: &str = "<think>\nThe user asks for 2+2. That is 4.\n</think>\n\nThe answer is 4.";

    fn s(x: &str) -> Option<String> {
        Some(x.to_string())
    }

    #[test]
    fn whole_answers_split() {
        let q = ReasoningParser::Qwen3;
        assert_eq!(q.split(QWEN3), (s("\nThe user asks for 2+2. That is 4.\n"), "\n\nThe answer is 4.".to_string()));
        assert_eq!(q.split("The answer is 4."), (None, "The answer is 4.".to_string()), "no thinking: all content");
        // enable_thinking false: Qwen3's template writes an empty block into the prompt; a model
        // that repeats one answers an empty reasoning.
        assert_eq!(q.split("<think>\n\n</think>\n\nHi."), (s("\n\n"), "\n\nHi.".to_string()));
        assert_eq!(q.split("<think>\nStill thinking when cut"), (s("\nStill thinking when cut"), String::new()));
        assert_eq!(
            q.split("Plain, then </think> stray"),
            (None, "Plain, then </think> stray".to_string()),
            "qwen3 needs the opening tag"
        );
        let r1 = ReasoningParser::DeepSeekR1;
        // DeepSeek-R1's template opens the block in the prompt: the answer starts inside it.
        assert_eq!(r1.split("Okay, 2+2 is 4.\n</think>\n\n**4**"), (s("Okay, 2+2 is 4.\n"), "\n\n**4**".to_string()));
        assert_eq!(r1.split(QWEN3), (s("\nThe user asks for 2+2. That is 4.\n"), "\n\nThe answer is 4.".to_string()));
        assert_eq!(
            r1.split("Thinking with no end"),
            (s("Thinking with no end"), String::new()),
            "no </think>: all reasoning, as vLLM"
        );
    }

    #[test]
    fn a_prompt_that_opens_the_block() {
        let q = ReasoningParser::Qwen3;
        assert_eq!(q.for_prompt("<|im_start|>assistant\n<think>\n"), ReasoningParser::DeepSeekR1);
        assert_eq!(
            q.for_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
            q,
            "thinking off: the block is closed"
        );
        assert_eq!(q.for_prompt("<|im_start|>assistant\n"), q);
        assert_eq!(ReasoningParser::DeepSeekR1.for_prompt("x"), ReasoningParser::DeepSeekR1);
    }

    fn stream(p: ReasoningParser, pieces: &[&str]) -> (String, String) {
        let mut st = ReasoningStream::new(p);
        let (mut r, mut c) = (String::new(), String::new());
        for (i, piece) in pieces.iter().enumerate() {
            let (dr, dc) = st.push(piece, i + 1 == pieces.len());
            r += &dr;
            c += &dc;
        }
        (r, c)
    }

    #[test]
    fn streams_split_at_awkward_places() {
        let q = ReasoningParser::Qwen3;
        assert_eq!(
            stream(q, &["<thi", "nk>\nThe user asks", " for 2+2. That is 4.\n</th", "ink>", "\n\nThe answer is 4."]),
            ("\nThe user asks for 2+2. That is 4.\n".into(), "\n\nThe answer is 4.".into())
        );
        assert_eq!(
            stream(q, &["<", "b>bold</b>"]),
            (String::new(), "<b>bold</b>".into()),
            "a `<` that is not `<think>` is content"
        );
        // Every cut of every answer gives the whole answer's split.
        for p in [ReasoningParser::Qwen3, ReasoningParser::DeepSeekR1] {
            for text in [QWEN3, "Okay, 2+2 is 4.\n</think>\n\n**4**", "Just an answer <think>", "<think>cut</thi"] {
                let (r, c) = p.split(text);
                let want = (r.unwrap_or_default(), c);
                for a in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
                    for b in (a..=text.len()).filter(|&i| text.is_char_boundary(i)) {
                        assert_eq!(
                            stream(p, &[&text[..a], &text[a..b], &text[b..]]),
                            want,
                            "{p:?} {text:?} cut at {a}, {b}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn nothing_is_sent_before_it_is_certain() {
        let mut st = ReasoningStream::new(ReasoningParser::Qwen3);
        assert_eq!(st.push("  <thi", false), (String::new(), String::new()));
        assert_eq!(st.push("nk>abc</thi", false), ("abc".into(), String::new()));
        assert_eq!(st.push("nk>x", false), (String::new(), "x".into()));
    }
}
