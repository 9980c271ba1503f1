//! What the library takes and gives: prompts, chat messages, and finished outputs.

use tandem_engine::sampler::TokenLogprobs;
use tandem_engine::{FinishReason, RequestOutput, RequestStream, Usage};

/// A prompt, in any of the forms the server takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Tokenized with the model's tokenizer, special tokens added (as `/v1/completions` does).
    Text(String),
    /// Sent as they are.
    Tokens(Vec<u32>),
    /// A conversation, rendered by the model's chat template with the assistant's turn opened
    /// (as `/v1/chat/completions` does).
    Chat(Vec<Message>),
}

impl From<&str> for Prompt {
    fn from(s: &str) -> Self {
        Prompt::Text(s.to_string())
    }
}
impl From<String> for Prompt {
    fn from(s: String) -> Self {
        Prompt::Text(s)
    }
}
impl From<&String> for Prompt {
    fn from(s: &String) -> Self {
        Prompt::Text(s.clone())
    }
}
impl From<Vec<u32>> for Prompt {
    fn from(ids: Vec<u32>) -> Self {
        Prompt::Tokens(ids)
    }
}
impl From<Vec<Message>> for Prompt {
    fn from(m: Vec<Message>) -> Self {
        Prompt::Chat(m)
    }
}
impl From<&[Message]> for Prompt {
    fn from(m: &[Message]) -> Self {
        Prompt::Chat(m.to_vec())
    }
}
impl From<&[u32]> for Prompt {
    fn from(ids: &[u32]) -> Self {
        Prompt::Tokens(ids.to_vec())
    }
}

/// One chat message; a conversation is a slice of them, rendered by the model's chat template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message { role: role.into(), content: content.into() }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"role": self.role, "content": self.content})
    }
}

/// One completion of a prompt, finished.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Which of the prompt's `n` completions this is.
    pub index: usize,
    /// The generated text, without any stop string that ended it.
    pub text: String,
    pub token_ids: Vec<u32>,
    /// Why it ended: a stop token or string, the length limit, or an engine error (a failed
    /// forward ends the requests in that batch with `Error`; the others go on).
    pub finish_reason: FinishReason,
    /// One entry per token of `token_ids` when `SamplingParams::logprobs` asked for them.
    pub logprobs: Option<Vec<TokenLogprobs>>,
}

/// Everything one prompt produced: its `n` completions, in index order.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    pub prompt_token_ids: Vec<u32>,
    pub completions: Vec<Completion>,
    pub usage: Usage,
}

impl Output {
    /// The text of the first completion (the only one unless `n > 1`).
    pub fn text(&self) -> &str {
        self.completions.first().map_or("", |c| c.text.as_str())
    }

    /// Gathers a request's incremental outputs into the finished whole.
    pub(crate) fn collect(
        prompt_token_ids: Vec<u32>,
        n: usize,
        want_logprobs: bool,
        mut stream: RequestStream,
    ) -> Output {
        let mut acc = Accumulator::new(prompt_token_ids, n, want_logprobs);
        while let Some(o) = pollster::block_on(stream.recv()) {
            if acc.push(o) {
                break;
            }
        }
        acc.finish()
    }
}

/// Builds an [`Output`] from a stream of [`RequestOutput`]s (also what
/// [`crate::OutputStream::collect_output`] uses).
pub(crate) struct Accumulator {
    out: Output,
    finished: Vec<bool>,
}

impl Accumulator {
    pub(crate) fn new(prompt_token_ids: Vec<u32>, n: usize, want_logprobs: bool) -> Self {
        let completions = (0..n.max(1))
            .map(|index| Completion {
                index,
                text: String::new(),
                token_ids: vec![],
                finish_reason: FinishReason::Abort,
                logprobs: want_logprobs.then(Vec::new),
            })
            .collect();
        let usage = Usage { prompt_tokens: prompt_token_ids.len(), completion_tokens: 0 };
        Accumulator { out: Output { prompt_token_ids, completions, usage }, finished: vec![false; n.max(1)] }
    }

    /// Adds one output; true when it was the request's last.
    pub(crate) fn push(&mut self, o: RequestOutput) -> bool {
        if let Some(c) = self.out.completions.get_mut(o.index) {
            c.text.push_str(&o.text);
            c.token_ids.extend_from_slice(&o.token_ids);
            if let Some(l) = c.logprobs.as_mut() {
                l.extend(o.logprobs);
            }
            if let Some(f) = o.finish_reason {
                c.finish_reason = f;
                self.finished[o.index] = true;
            }
        }
        if let Some(u) = o.usage {
            self.out.usage = u;
        }
        o.finished
    }

    pub(crate) fn finish(mut self) -> Output {
        // The engine promises every request a final output; should a stream end without one,
        // say so rather than pass the completion off as whole.
        for (c, done) in self.out.completions.iter_mut().zip(&self.finished) {
            if !done {
                c.finish_reason = FinishReason::Error("the engine stopped before this completion finished".into());
            }
        }
        if self.out.usage.completion_tokens == 0 {
            self.out.usage.completion_tokens = self.out.completions.iter().map(|c| c.token_ids.len()).sum();
        }
        self.out
    }
}
