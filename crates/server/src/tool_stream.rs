//! Forced tool calls read as they are sampled, so that streams send each call's `arguments`
//! piece by piece (OpenAI's and vLLM's streams do) rather than whole at the end.
//!
//! A forced answer is constrained JSON from its first token:
//! - a named function (`tool_choice` naming one): the text is the call's arguments, all of it;
//! - "required": vLLM's array `[{"name": "<tool>", "parameters": {..}}, ...]`. A small scanner
//!   follows the array's structure (strings and escapes, depth): each object at depth 1 is a
//!   call, its `name` string is the call's name, and its `parameters` value, as written, is the
//!   arguments. A call is announced once its name is whole; its arguments are sent as far as
//!   they are sampled.
//!
//! The same scanner reads a finished answer cut short (`max_tokens`) into its partial calls
//! ([`partial_calls`]): a cut call is a call with incomplete arguments, not text.

use crate::structured::ToolCall;

/// What a streamed forced answer says next.
#[derive(Debug, Clone, PartialEq)]
pub enum CallEvent {
    /// Call `index` begins: its name is known (its arguments follow).
    Start { index: usize, name: String },
    /// More of call `index`'s arguments.
    Args { index: usize, piece: String },
}

/// One call object, as far as it has been scanned.
#[derive(Debug, Clone, Default)]
struct Call {
    name: Option<String>,
    /// Byte range of the `parameters` value: its start, and its end once it closed.
    args_start: Option<usize>,
    args_end: Option<usize>,
    /// Arguments not written as an object: a JSON string holding them (taken unescaped, as the
    /// parsers take it), or `{}` for a call object that closed without any. Sent whole.
    args_text: Option<String>,
    /// Announced ([`CallEvent::Start`]) yet; bytes of the arguments sent.
    started: bool,
    sent: usize,
}

/// Where the scanner is among a call object's keys.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    Key,
    Colon,
    Value,
    After,
}

/// The streaming reader of a forced answer, or of the calls of an "auto" one.
#[derive(Debug, Clone)]
pub struct CallStream {
    /// `Some(name)`: a named function; `None`: JSON call objects.
    named: Option<String>,
    text: String,
    /// Scanner state over `text`: the containers open (`{` or `[`), the depth at which the
    /// current call object's keys lie (while one is open).
    pos: usize,
    stack: Vec<u8>,
    call_level: Option<usize>,
    in_str: bool,
    esc: bool,
    str_start: usize,
    expect: Expect,
    key: String,
    calls: Vec<Call>,
}

/// The keys a call object may hold its arguments under (vLLM's "required" array writes
/// `parameters`; Hermes and Mistral `arguments`; Llama 3 either).
const ARGS_KEYS: [&str; 2] = ["parameters", "arguments"];

impl CallStream {
    /// A named function's arguments (`Some(name)`), or JSON call objects (`None`): each object
    /// that opens at the top level, or inside a top-level array, is a call with a `name` and
    /// its arguments under `parameters` or `arguments` ("required"; the JSON tool parsers).
    pub fn new(named: Option<String>) -> Self {
        CallStream {
            named,
            text: String::new(),
            pos: 0,
            stack: Vec::new(),
            call_level: None,
            in_str: false,
            esc: false,
            str_start: 0,
            expect: Expect::After,
            key: String::new(),
            calls: Vec::new(),
        }
    }

    /// Takes the next piece of the answer; answers what can be said now.
    pub fn push(&mut self, piece: &str) -> Vec<CallEvent> {
        let mut out = Vec::new();
        if let Some(name) = &self.named {
            if self.calls.is_empty() {
                self.calls.push(Call { name: Some(name.clone()), started: true, ..Default::default() });
                out.push(CallEvent::Start { index: 0, name: name.clone() });
            }
            if !piece.is_empty() {
                self.text.push_str(piece);
                out.push(CallEvent::Args { index: 0, piece: piece.to_string() });
            }
            return out;
        }
        self.text.push_str(piece);
        self.scan();
        for (index, c) in self.calls.iter_mut().enumerate() {
            let Some(name) = &c.name else { break };
            if !c.started {
                c.started = true;
                out.push(CallEvent::Start { index, name: name.clone() });
            }
            if let Some(start) = c.args_start {
                let end = c.args_end.unwrap_or(self.text.len());
                let from = start + c.sent;
                if end > from {
                    out.push(CallEvent::Args { index, piece: self.text[from..end].to_string() });
                    c.sent = end - start;
                }
            } else if let Some(t) = c.args_text.as_ref().filter(|t| c.sent == 0 && !t.is_empty()) {
                out.push(CallEvent::Args { index, piece: t.clone() });
                c.sent = t.len();
            }
        }
        out
    }

    /// Calls announced so far.
    pub fn started(&self) -> usize {
        self.calls.iter().take_while(|c| c.started).count()
    }

    /// The calls so far, each with its arguments as far as they were sampled.
    pub fn calls(&self) -> Vec<ToolCall> {
        if let Some(name) = &self.named {
            return vec![ToolCall { name: name.clone(), arguments: self.text.clone() }];
        }
        self.calls
            .iter()
            .map_while(|c| {
                let name = c.name.clone()?;
                let arguments = match (c.args_start, &c.args_text) {
                    (Some(s), _) => self.text[s..c.args_end.unwrap_or(self.text.len())].to_string(),
                    (None, Some(t)) => t.clone(),
                    (None, None) => String::new(),
                };
                Some(ToolCall { name, arguments })
            })
            .collect()
    }

    /// Follows the JSON structure over the bytes not yet scanned. Every byte the scanner stops
    /// at is ASCII, so the ranges it records are on character boundaries.
    fn scan(&mut self) {
        let bytes = self.text.as_bytes();
        for (i, &b) in bytes.iter().enumerate().skip(self.pos) {
            let at_keys = self.call_level == Some(self.stack.len());
            if self.in_str {
                if self.esc {
                    self.esc = false;
                } else if b == b'\\' {
                    self.esc = true;
                } else if b == b'"' {
                    self.in_str = false;
                    if at_keys {
                        let raw = &self.text[self.str_start - 1..=i];
                        let s: String = serde_json::from_str(raw).unwrap_or_default();
                        match self.expect {
                            Expect::Key => {
                                self.key = s;
                                self.expect = Expect::Colon;
                            }
                            Expect::Value => {
                                if let Some(c) = self.calls.last_mut() {
                                    if self.key == "name" && c.name.is_none() {
                                        c.name = Some(s);
                                    } else if ARGS_KEYS.contains(&self.key.as_str())
                                        && c.args_start.is_none()
                                        && c.args_text.is_none()
                                    {
                                        c.args_text = Some(s);
                                    }
                                }
                                self.expect = Expect::After;
                            }
                            _ => {}
                        }
                    }
                }
                continue;
            }
            match b {
                b'"' => {
                    self.in_str = true;
                    self.str_start = i + 1;
                }
                b'{' | b'[' => {
                    let top = self.stack.is_empty() || self.stack == [b'['];
                    if b == b'{' && self.call_level.is_none() && top {
                        self.calls.push(Call::default());
                        self.call_level = Some(self.stack.len() + 1);
                        self.expect = Expect::Key;
                    } else if at_keys && self.expect == Expect::Value && ARGS_KEYS.contains(&self.key.as_str()) {
                        if let Some(c) = self.calls.last_mut().filter(|c| c.args_start.is_none()) {
                            c.args_start = Some(i);
                        }
                    }
                    self.stack.push(b);
                }
                b'}' | b']' => {
                    self.stack.pop();
                    let depth = self.stack.len();
                    if self.call_level == Some(depth + 1) {
                        // The call object closed; without arguments it takes none.
                        self.call_level = None;
                        if let Some(c) =
                            self.calls.last_mut().filter(|c| c.args_start.is_none() && c.args_text.is_none())
                        {
                            c.args_text = Some("{}".into());
                        }
                    } else if self.call_level == Some(depth) && ARGS_KEYS.contains(&self.key.as_str()) {
                        if let Some(c) =
                            self.calls.last_mut().filter(|c| c.args_start.is_some() && c.args_end.is_none())
                        {
                            c.args_end = Some(i + 1);
                            self.expect = Expect::After;
                        }
                    }
                }
                b':' if at_keys && self.expect == Expect::Colon => self.expect = Expect::Value,
                b',' if at_keys => self.expect = Expect::Key,
                _ => {}
            }
        }
        self.pos = bytes.len();
    }
}

/// The calls of a "required" answer cut short: each named call with its arguments as far as
/// they were written (possibly empty); no calls when not even one name was whole.
pub fn partial_calls(text: &str) -> Vec<ToolCall> {
    let mut s = CallStream::new(None);
    s.push(text);
    s.calls()
}

/// An "auto" tool choice read as it streams (chat's messages and responses' items): the text
/// goes out as far as the parser is sure it is content, and calls stream from where the parser
/// is sure they begin.
#[derive(Debug, Clone)]
pub struct AutoCalls {
    parser: crate::tool_parser::ToolParser,
    /// Everything sampled so far.
    pub text: String,
    /// How much of `text` went out as content.
    pub sent: usize,
    /// The calls' reader, once they began.
    pub calls: Option<CallStream>,
}

impl AutoCalls {
    pub fn new(parser: crate::tool_parser::ToolParser) -> Self {
        AutoCalls { parser, text: String::new(), sent: 0, calls: None }
    }

    /// Reads the next piece: the content now certain, and the calls' events.
    pub fn push(&mut self, piece: &str) -> (String, Vec<CallEvent>) {
        self.text.push_str(piece);
        let end = self.parser.content_len(&self.text).max(self.sent);
        let certain = self.text[self.sent..end].to_string();
        self.sent = end;
        let events = match &mut self.calls {
            Some(cs) => cs.push(piece),
            None => match self.parser.calls_start(&self.text) {
                Some(start) => {
                    let mut cs = CallStream::new(None);
                    let events = cs.push(&self.text[start..]);
                    self.calls = Some(cs);
                    events
                }
                None => Vec::new(),
            },
        };
        (certain, events)
    }

    /// Calls whose start went out.
    pub fn started(&self) -> usize {
        self.calls.as_ref().map_or(0, CallStream::started)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `step` bytes (on char boundaries); the events, merged.
    fn run(named: Option<&str>, text: &str, step: usize) -> (Vec<(usize, String)>, Vec<String>) {
        let mut s = CallStream::new(named.map(String::from));
        let mut starts = Vec::new();
        let mut args: Vec<String> = Vec::new();
        let mut i = 0;
        while i < text.len() {
            let mut j = (i + step).min(text.len());
            while !text.is_char_boundary(j) {
                j += 1;
            }
            for e in s.push(&text[i..j]) {
                match e {
                    CallEvent::Start { index, name } => {
                        assert_eq!(index, args.len(), "calls start in order");
                        starts.push((index, name));
                        args.push(String::new());
                    }
                    CallEvent::Args { index, piece } => args[index].push_str(&piece),
                }
            }
            i = j;
        }
        (starts, args)
    }

    #[test]
    fn required_arrays_stream_each_calls_arguments() {
        let text = r#"[{"name": "get_weather", "parameters": {"city": "Os]lo\"}{", "days": [1, {"x": 2}]}}, {"name":"now","parameters":{}}]"#;
        for step in [1, 2, 3, 7, 500] {
            let (starts, args) = run(None, text, step);
            assert_eq!(starts, vec![(0, "get_weather".to_string()), (1, "now".to_string())], "step {step}");
            assert_eq!(
                args,
                vec![r#"{"city": "Os]lo\"}{", "days": [1, {"x": 2}]}"#.to_string(), "{}".to_string()],
                "step {step}"
            );
        }
        let parsed = crate::structured::parse_required(text).unwrap();
        let streamed = partial_calls(text);
        for (p, s) in parsed.iter().zip(&streamed) {
            let (a, b): (serde_json::Value, serde_json::Value) =
                (serde_json::from_str(&p.arguments).unwrap(), serde_json::from_str(&s.arguments).unwrap());
            assert_eq!((&p.name, a), (&s.name, b));
        }
    }

    #[test]
    fn a_cut_answer_is_partial_calls() {
        assert_eq!(
            partial_calls(r#"[{"name": "get", "parameters": {"city": "Os"#),
            vec![ToolCall { name: "get".into(), arguments: r#"{"city": "Os"#.into() }]
        );
        assert_eq!(
            partial_calls(r#"[{"name": "get", "param"#),
            vec![ToolCall { name: "get".into(), arguments: String::new() }]
        );
        assert_eq!(partial_calls(r#"[{"name": "ge"#), vec![]);
        // The name is announced only once whole; arguments held until then.
        let mut s = CallStream::new(None);
        assert_eq!(s.push(r#"[{"name": "g"#), vec![]);
        assert_eq!(
            s.push(r#"et", "parameters": {"a""#),
            vec![
                CallEvent::Start { index: 0, name: "get".into() },
                CallEvent::Args { index: 0, piece: r#"{"a""#.into() }
            ]
        );
    }

    /// "auto" answers in the JSON formats, from where the parser says the calls begin.
    #[test]
    fn parsed_calls_stream_from_their_markup() {
        use crate::tool_parser::ToolParser;
        let cases = [
            (ToolParser::Hermes, "Sure.\n<tool_call>{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>"),
            (ToolParser::Llama3Json, "<|python_tag|>{\"name\": \"get\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": \"now\", \"parameters\": {}}"),
            (ToolParser::Llama3Json, "{\"type\": \"function\", \"name\": \"get\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": \"now\", \"parameters\": {}}"),
            (ToolParser::Mistral, "[TOOL_CALLS] [{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}, {\"name\": \"now\", \"arguments\": {}}]"),
            (ToolParser::Mistral, "[{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}, {\"arguments\": {}, \"name\": \"now\"}]"),
        ];
        for (parser, text) in cases {
            let start = parser.calls_start(text).unwrap_or_else(|| panic!("{parser:?}: {text}"));
            let (starts, args) = run(None, &text[start..], 3);
            assert_eq!(starts, vec![(0, "get".to_string()), (1, "now".to_string())], "{text}");
            assert_eq!(args, vec!["{\"city\": \"Oslo\"}".to_string(), "{}".to_string()], "{text}");
            let (_, parsed) = parser.parse(text).unwrap();
            assert_eq!(parsed.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["get", "now"]);
        }
        // A `name` inside the arguments is no call's name; markup not yet certain is no start.
        let (starts, args) =
            run(None, "{\"name\": \"f\", \"arguments\": {\"name\": \"x\", \"l\": [{\"name\": \"y\"}]}}", 2);
        assert_eq!(
            (starts, args),
            (vec![(0, "f".to_string())], vec!["{\"name\": \"x\", \"l\": [{\"name\": \"y\"}]}".to_string()])
        );
        // Arguments written as a JSON string, or left out: as the parsers read them, whole.
        let text = "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>\n<tool_call>{\"name\": \"g\"}</tool_call>";
        let (_, parsed) = ToolParser::Hermes.parse(text).unwrap();
        let (starts, args) = run(None, &text[ToolParser::Hermes.calls_start(text).unwrap()..], 4);
        assert_eq!(starts.len(), 2);
        assert_eq!(args, parsed.iter().map(|c| c.arguments.clone()).collect::<Vec<_>>());
        assert_eq!(args, ["{\"a\": 1}", "{}"]);
        assert_eq!(ToolParser::Hermes.calls_start("Sure. <tool_c"), None);
        assert_eq!(ToolParser::Qwen3Xml.calls_start("<tool_call><function=f>"), None);
        assert_eq!(ToolParser::Mistral.calls_start("[TOOL_CALLS]get[ARGS]{}"), None, "v11's form is sent whole");
    }

    #[test]
    fn a_named_call_is_its_text() {
        let (starts, args) = run(Some("f"), r#"{"a": "é", "b": 1}"#, 2);
        assert_eq!((starts, args), (vec![(0, "f".to_string())], vec![r#"{"a": "é", "b": 1}"#.to_string()]));
        let mut s = CallStream::new(Some("f".into()));
        assert_eq!(s.push(""), vec![CallEvent::Start { index: 0, name: "f".into() }], "announced before any argument");
    }
}
