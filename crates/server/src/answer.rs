//! How an answer's text is read, as it streams and once it is whole: the reasoning split off,
//! content, tool calls, and the finish to report. The reader ([`AnswerReader`]) emits neutral
//! [`Event`]s (thinking, text, a call's start, a call's arguments) and, at the end, a
//! [`Finish`] that reconciles what streamed with the answer read whole; each wire format only
//! renders them.
//!
//! How the text after any reasoning is read depends on the tool choice ([`ToolOutput`]):
//! - none: all of it is text, as it comes;
//! - a forced call (named, or "required"): it is the calls' JSON, their arguments streamed as
//!   sampled ([`CallStream`]); none of it is text;
//! - "auto" with a tool parser: text as far as the parser is sure it is not a call, and calls
//!   from where it is sure they begin ([`AutoCalls`]); at the end the rest is calls or text.

use crate::job::{Job, ToolOutput};
use crate::metrics::ToolParseTally;
use crate::reasoning::ReasoningStream;
use crate::structured::{self, ToolCall};
use crate::tool_stream::{AutoCalls, CallEvent, CallStream};

/// A chat choice's message: content, tool calls, and the finish reason to report.
pub fn tool_message(out: Option<&ToolOutput>, text: &str, finish: &str) -> (Option<String>, Vec<ToolCall>, String) {
    let plain = (Some(text.to_string()), Vec::new(), finish.to_string());
    match out {
        None => plain,
        // vLLM reports the engine's finish for a named function ("stop"), as OpenAI does for a
        // forced call; the arguments are the text whatever it is (cut short by `length`, say).
        Some(ToolOutput::Named(name)) => {
            (None, vec![ToolCall { name: name.clone(), arguments: text.to_string() }], finish.to_string())
        }
        Some(ToolOutput::Required) if finish == "stop" => match structured::parse_required(text) {
            Some(calls) => (None, calls, "tool_calls".into()),
            None => plain,
        },
        // Cut short (`max_tokens`): the calls as far as they were written, not the array's text.
        Some(ToolOutput::Required) => (None, crate::tool_stream::partial_calls(text), finish.to_string()),
        Some(ToolOutput::Auto(p)) => match p.parse(text) {
            Some((content, calls)) if !calls.is_empty() => {
                (content, calls, if finish == "stop" { "tool_calls".into() } else { finish.to_string() })
            }
            _ => plain,
        },
    }
}

/// What a streamed answer says next. Empty thinking or text is never emitted.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// More of the reasoning (before the answer proper).
    Thinking(String),
    /// More of the answer's content, now certain not to be a call.
    Text(String),
    /// Call `index` begins: its name is known.
    CallStart { index: usize, name: String },
    /// More of call `index`'s arguments.
    CallArgs { index: usize, piece: String },
}

/// How the answer's text (after any reasoning) is read.
#[derive(Debug, Clone)]
enum Mode {
    Text,
    Forced(CallStream),
    Auto(AutoCalls),
}

/// The end of an answer: what streamed, and the answer read whole.
#[derive(Debug, Clone)]
pub struct Finish {
    /// The answer's text after any reasoning, whole.
    pub text: String,
    /// How much of `text` went out as [`Event::Text`].
    pub sent: usize,
    /// Calls announced by [`Event::CallStart`].
    pub streamed: usize,
    /// The whole text read as a message ([`tool_message`]): content, calls, the finish reason.
    pub content: Option<String>,
    pub calls: Vec<ToolCall>,
    pub finish: String,
}

/// One answer read as it streams.
#[derive(Debug, Clone)]
pub struct AnswerReader {
    tool_output: Option<ToolOutput>,
    tool_parses: Option<ToolParseTally>,
    reasoning: Option<ReasoningStream>,
    mode: Mode,
    /// The text after any reasoning, and how much of it went out as text, for [`Mode::Text`]
    /// and [`Mode::Forced`] ([`AutoCalls`] keeps its own).
    text: String,
    sent: usize,
}

impl AnswerReader {
    pub fn new(job: &Job) -> Self {
        let mode = match &job.tool_output {
            None => Mode::Text,
            Some(ToolOutput::Named(n)) => Mode::Forced(CallStream::new(Some(n.clone()))),
            Some(ToolOutput::Required) => Mode::Forced(CallStream::new(None)),
            Some(ToolOutput::Auto(p)) => Mode::Auto(AutoCalls::new(*p)),
        };
        AnswerReader {
            tool_output: job.tool_output.clone(),
            tool_parses: job.tool_parses.clone(),
            reasoning: job.reasoning.map(ReasoningStream::new),
            mode,
            text: String::new(),
            sent: 0,
        }
    }

    /// Reads the next piece of the answer (`done` on its last); the events it makes certain.
    pub fn push(&mut self, piece: &str, done: bool) -> Vec<Event> {
        let mut out = Vec::new();
        let content = match &mut self.reasoning {
            Some(st) => {
                let (thinking, content) = st.push(piece, done);
                if !thinking.is_empty() {
                    out.push(Event::Thinking(thinking));
                }
                content
            }
            None => piece.to_string(),
        };
        let (certain, calls) = match &mut self.mode {
            Mode::Text => {
                self.text.push_str(&content);
                self.sent = self.text.len();
                (content, Vec::new())
            }
            Mode::Forced(cs) => {
                self.text.push_str(&content);
                (String::new(), cs.push(&content))
            }
            Mode::Auto(auto) => {
                let (certain, calls) = auto.push(&content);
                if let Some(t) = &self.tool_parses {
                    t.count(true, !calls.is_empty());
                }
                (certain, calls)
            }
        };
        if !certain.is_empty() {
            out.push(Event::Text(certain));
        }
        out.extend(calls.into_iter().map(|e| match e {
            CallEvent::Start { index, name } => Event::CallStart { index, name },
            CallEvent::Args { index, piece } => Event::CallArgs { index, piece },
        }));
        out
    }

    /// Calls announced so far.
    pub fn streamed(&self) -> usize {
        match &self.mode {
            Mode::Text => 0,
            Mode::Forced(cs) => cs.started(),
            Mode::Auto(auto) => auto.started(),
        }
    }

    /// The end, with the engine's finish reason (OpenAI's word for it); the reader is spent.
    pub fn finish(&mut self, finish: &str) -> Finish {
        let streamed = self.streamed();
        let (text, sent) = match std::mem::replace(&mut self.mode, Mode::Text) {
            Mode::Auto(auto) => (auto.text, auto.sent),
            _ => (std::mem::take(&mut self.text), self.sent),
        };
        let (content, calls, finish) = tool_message(self.tool_output.as_ref(), &text, finish);
        Finish { text, sent, streamed, content, calls, finish }
    }
}
