//! Model-native tool calls in an unconstrained ("auto") answer, in the formats vLLM's
//! `--tool-call-parser` names:
//! - `hermes`: `<tool_call>{"name": .., "arguments": {..}}</tool_call>` blocks (Qwen2.5, Hermes,
//!   SmolLM3), parsed by [`crate::structured::parse_hermes`];
//! - `llama3_json`: Llama 3.x's JSON call `{"name": .., "parameters": {..}}` (or `arguments`),
//!   after `<|python_tag|>` or at the start of a line, several joined by `;`;
//! - `mistral`: `[TOOL_CALLS]` then a JSON array of `{"name", "arguments"}` (v0.3 tokenizers),
//!   or `[TOOL_CALLS]name[ARGS]{..}` per call (v11+). `[TOOL_CALLS]` is a special token that the
//!   detokenizer drops, so an answer that is a bare array of such objects counts too;
//! - `qwen3_xml`: Qwen3-Coder's `<tool_call><function=NAME><parameter=P>value</parameter>..
//!   </function></tool_call>`; a value that reads as JSON is taken as that JSON, else as a string.
//!
//! Each parser answers two questions: [`ToolParser::parse`] turns a finished answer into its
//! content (the text before the calls, None when blank) and calls, or None when the text is not
//! a clean list of calls (no markup, JSON that does not parse, a call without a name, text after
//! the calls): it is then plain content, as vLLM answers. [`ToolParser::content_len`] says how
//! much of an answer still being sampled is certainly content: streams send that much as text
//! and hold the rest, which may be (or grow into) markup.

use serde_json::{Map, Value};

use crate::structured::{self, ToolCall};

/// The formats `--tool-call-parser` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolParser {
    Hermes,
    Llama3Json,
    Mistral,
    Qwen3Xml,
}

/// The names, as vLLM spells them.
pub const NAMES: &[&str] = &["hermes", "llama3_json", "mistral", "qwen3_xml"];

const PYTHON_TAG: &str = "<|python_tag|>";
const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const QWEN_OPEN: &str = "<tool_call>";
const QWEN_CLOSE: &str = "</tool_call>";

impl ToolParser {
    pub fn from_name(name: &str) -> Option<ToolParser> {
        Some(match name {
            "hermes" => ToolParser::Hermes,
            // vLLM registers the Llama 4 JSON format under the same parser.
            "llama3_json" | "llama4_json" => ToolParser::Llama3Json,
            "mistral" => ToolParser::Mistral,
            "qwen3_xml" | "qwen3_coder" => ToolParser::Qwen3Xml,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolParser::Hermes => "hermes",
            ToolParser::Llama3Json => "llama3_json",
            ToolParser::Mistral => "mistral",
            ToolParser::Qwen3Xml => "qwen3_xml",
        }
    }

    /// A finished answer's content and calls; None when it holds no clean list of calls.
    pub fn parse(self, text: &str) -> Option<(Option<String>, Vec<ToolCall>)> {
        let (start, calls) = match self {
            ToolParser::Hermes => return structured::parse_hermes(text).filter(|(_, c)| !c.is_empty()),
            ToolParser::Llama3Json => {
                let start = llama_start(text)?;
                let body = text[start..].strip_prefix(PYTHON_TAG).unwrap_or(&text[start..]);
                (start, llama_calls(body)?)
            }
            ToolParser::Mistral => {
                let start = mistral_start(text)?;
                (start, mistral_calls(&text[start..])?)
            }
            ToolParser::Qwen3Xml => {
                let start = text.find(QWEN_OPEN)?;
                (start, qwen_xml_calls(&text[start..])?)
            }
        };
        if calls.is_empty() {
            return None;
        }
        let content = text[..start].trim();
        Some(((!content.is_empty()).then(|| content.to_string()), calls))
    }

    /// How many leading bytes of an answer still being sampled are certainly content: up to
    /// where the markup begins, less a tail that may still grow into it. Blanks alone are held
    /// (the content before calls is trimmed: a blank one is none).
    pub fn content_len(self, text: &str) -> usize {
        let end = self.markup_start(text);
        if text[..end].trim().is_empty() {
            0
        } else {
            end
        }
    }

    /// Where the JSON of the calls begins once the markup is certain (after `<tool_call>`,
    /// `<|python_tag|>` or `[TOOL_CALLS]`; a Llama 3 `{` at a line's start; a bare Mistral array),
    /// for streams that send calls' arguments as sampled ([`crate::tool_stream::CallStream`]).
    /// None while it is not, and for the formats that are not JSON objects (`qwen3_xml`, Mistral's
    /// `name[ARGS]{..}`): those calls are sent whole at the end.
    pub fn calls_start(self, text: &str) -> Option<usize> {
        match self {
            ToolParser::Hermes => text.find(QWEN_OPEN).map(|i| i + QWEN_OPEN.len()),
            ToolParser::Llama3Json => {
                let i = llama_start(text)?;
                Some(if text[i..].starts_with(PYTHON_TAG) { i + PYTHON_TAG.len() } else { i })
            }
            ToolParser::Mistral => {
                let i = mistral_start(text)?;
                let body = if text[i..].starts_with(TOOL_CALLS) { i + TOOL_CALLS.len() } else { i };
                let lead = text[body..].len() - text[body..].trim_start().len();
                text[body + lead..].starts_with('[').then_some(body + lead)
            }
            ToolParser::Qwen3Xml => None,
        }
    }

    fn markup_start(self, text: &str) -> usize {
        match self {
            ToolParser::Hermes | ToolParser::Qwen3Xml => marker_content_len(text, QWEN_OPEN),
            ToolParser::Llama3Json => match llama_start(text) {
                Some(i) => i,
                None => line_start_hold(text, marker_content_len(text, PYTHON_TAG)),
            },
            ToolParser::Mistral => match mistral_start(text) {
                Some(i) => i,
                // A bare array can only open the answer.
                None if text.trim_start().is_empty() => 0,
                None => marker_content_len(text, TOOL_CALLS),
            },
        }
    }
}

/// The bytes before `marker`, or before a tail that is a proper prefix of it. The markers are
/// ASCII, so a matching tail starts on a character boundary.
fn marker_content_len(text: &str, marker: &str) -> usize {
    if let Some(i) = text.find(marker) {
        return i;
    }
    let partial = (1..marker.len()).rev().find(|&k| text.ends_with(&marker[..k])).unwrap_or(0);
    text.len() - partial
}

/// `end`, or less when the text's last line is blank so far: the next byte may be a `{` at
/// the start of a line, which begins a call.
fn line_start_hold(text: &str, end: usize) -> usize {
    let line = text.rfind('\n').map_or(0, |i| i + 1);
    if text[line..].trim().is_empty() && line <= end {
        // From the newline itself: content before the calls is trimmed anyway.
        text[..line].trim_end().len().min(end)
    } else {
        end
    }
}

/// Where a Llama 3 call list begins: `<|python_tag|>`, or a `{` opening the answer or a line.
fn llama_start(text: &str) -> Option<usize> {
    if let Some(i) = text.find(PYTHON_TAG) {
        return Some(i);
    }
    let mut line = 0;
    for l in text.split_inclusive('\n') {
        let lead = l.len() - l.trim_start_matches([' ', '\t', '\r']).len();
        if l[lead..].starts_with('{') {
            return Some(line + lead);
        }
        line += l.len();
    }
    None
}

/// `{..}; {..}` with each object a call (`name`, and `parameters` or `arguments`).
fn llama_calls(body: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = body.trim_start();
    while !rest.is_empty() {
        let mut it = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = it.next()?.ok()?;
        rest = rest[it.byte_offset()..].trim_start();
        calls.push(call_from(&v, &["parameters", "arguments"])?);
        match rest.strip_prefix(';') {
            Some(r) => rest = r.trim_start(),
            None if rest.is_empty() => {}
            None => return None,
        }
    }
    Some(calls)
}

/// A JSON call object: its `name` and the first of `keys` that holds the arguments (none: `{}`;
/// a string: taken as the JSON text it holds).
fn call_from(v: &Value, keys: &[&str]) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = keys.iter().find_map(|k| v.get(*k).filter(|a| !a.is_null()));
    let arguments = match args {
        None => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(a) => a.to_string(),
    };
    Some(ToolCall { name, arguments })
}

/// Where Mistral's calls begin: `[TOOL_CALLS]`, or a bare array of call objects opening the
/// answer (the marker dropped as a special token).
fn mistral_start(text: &str) -> Option<usize> {
    if let Some(i) = text.find(TOOL_CALLS) {
        return Some(i);
    }
    let lead = text.len() - text.trim_start().len();
    let t = &text[lead..];
    // `[{` or `[ {`, but not a markdown link or a list of numbers.
    let open = t.strip_prefix('[')?.trim_start();
    (open.starts_with('{') || (open.is_empty() && !t.is_empty())).then_some(lead)
}

fn mistral_calls(text: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = text.trim();
    if !rest.starts_with(TOOL_CALLS) {
        return mistral_array(rest);
    }
    while let Some(seg) = rest.strip_prefix(TOOL_CALLS) {
        let seg = seg.trim_start();
        let end = seg.find(TOOL_CALLS).unwrap_or(seg.len());
        let (one, after) = (seg[..end].trim(), &seg[end..]);
        match one.split_once(ARGS) {
            // v11+: `name[ARGS]{...}`.
            Some((name, args)) if !name.trim().is_empty() && !name.contains(['{', '[']) => {
                let v: Value = serde_json::from_str(args.trim()).ok()?;
                calls.push(ToolCall { name: name.trim().to_string(), arguments: v.to_string() });
            }
            Some(_) => return None,
            None => calls.extend(mistral_array(one)?),
        }
        rest = after;
    }
    Some(calls)
}

/// `[{"name": .., "arguments": {..}}, ..]` (a single object is taken as a one-call list).
fn mistral_array(text: &str) -> Option<Vec<ToolCall>> {
    match serde_json::from_str::<Value>(text.trim()).ok()? {
        Value::Array(a) => a.iter().map(|c| call_from(c, &["arguments", "parameters"])).collect(),
        v @ Value::Object(_) => Some(vec![call_from(&v, &["arguments", "parameters"])?]),
        _ => None,
    }
}

/// `<tool_call><function=NAME><parameter=P>value</parameter>..</function></tool_call>`, one or
/// more; the last `</tool_call>` may be missing (the answer ended on EOS).
fn qwen_xml_calls(text: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(body) = rest.strip_prefix(QWEN_OPEN) {
        let (inner, after) = match body.find(QWEN_CLOSE) {
            Some(end) => (&body[..end], &body[end + QWEN_CLOSE.len()..]),
            None => (body, ""),
        };
        calls.push(qwen_xml_function(inner.trim())?);
        rest = after.trim_start();
    }
    rest.is_empty().then_some(calls)
}

fn qwen_xml_function(inner: &str) -> Option<ToolCall> {
    let f = inner.strip_prefix("<function=")?;
    let gt = f.find('>')?;
    let name = f[..gt].trim().to_string();
    if name.is_empty() {
        return None;
    }
    let mut body = f[gt + 1..].trim_end();
    body = body.strip_suffix("</function>").unwrap_or(body);
    let mut args = Map::new();
    let mut rest = body.trim_start();
    while let Some(p) = rest.strip_prefix("<parameter=") {
        let gt = p.find('>')?;
        let key = p[..gt].trim().to_string();
        let after = &p[gt + 1..];
        // A value ends at its closing tag, or (a tag the model left out) where the next begins.
        let end = after.find("</parameter>").or_else(|| after.find("<parameter=")).unwrap_or(after.len());
        let raw = after[..end].strip_prefix('\n').unwrap_or(&after[..end]);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        args.insert(key, parameter_value(raw));
        rest = after[end..].strip_prefix("</parameter>").unwrap_or(&after[end..]).trim_start();
    }
    if !rest.is_empty() {
        return None;
    }
    Some(ToolCall { name, arguments: Value::Object(args).to_string() })
}

/// A parameter's text: JSON when it reads as a number, boolean, null, object or array; else
/// the string as written. (vLLM converts by the tool's declared types; without them this is
/// the reading that keeps `42` a number and `Paris` a string.)
fn parameter_value(raw: &str) -> Value {
    match serde_json::from_str::<Value>(raw.trim()) {
        Ok(v @ (Value::Number(_) | Value::Bool(_) | Value::Null | Value::Object(_) | Value::Array(_))) => v,
        _ => Value::String(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall { name: name.into(), arguments: arguments.into() }
    }

    /// Streams `pieces` through `content_len` as a stream does; returns the content sent
    /// before the end, and checks it is a prefix of the whole text that never stops short of
    /// certain content.
    fn streamed(p: ToolParser, pieces: &[&str]) -> String {
        let mut text = String::new();
        let mut sent = 0;
        for piece in pieces {
            text.push_str(piece);
            let end = p.content_len(&text).max(sent);
            assert!(text.is_char_boundary(end), "{p:?} {text:?} {end}");
            sent = end;
        }
        text[..sent].to_string()
    }

    #[test]
    fn names_are_vllms() {
        for n in NAMES {
            assert_eq!(ToolParser::from_name(n).unwrap().name(), *n);
        }
        assert_eq!(ToolParser::from_name("deepseek_v3"), None);
    }

    #[test]
    fn llama3_json_calls() {
        let p = ToolParser::Llama3Json;
        // As Llama 3.1/3.2 answer with the tool template of their model card.
        let one = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}";
        assert_eq!(p.parse(one), Some((None, vec![call("get_weather", "{\"city\":\"Paris\",\"unit\":\"celsius\"}")])));
        let tagged = "<|python_tag|>{\"name\": \"now\", \"arguments\": {}}";
        assert_eq!(p.parse(tagged), Some((None, vec![call("now", "{}")])));
        let two = "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {\"nested\": {\"y\": [1, 2]}}}";
        assert_eq!(p.parse(two), Some((None, vec![call("a", "{\"x\":1}"), call("b", "{\"nested\":{\"y\":[1,2]}}")])));
        let before = "Let me check the weather.\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}";
        assert_eq!(
            p.parse(before),
            Some((Some("Let me check the weather.".into()), vec![call("get_weather", "{\"city\":\"Oslo\"}")]))
        );
        assert_eq!(p.parse("The capital of France is Paris."), None);
        assert_eq!(p.parse("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Par"), None, "cut short: content");
        assert_eq!(p.parse("{\"city\": \"Paris\"}"), None, "JSON that is not a call");
        assert_eq!(p.parse("{\"name\": \"a\", \"parameters\": {}} and then some words"), None, "text after the call");
        assert_eq!(p.parse("Use {braces} in the middle of a line"), None);
    }

    #[test]
    fn llama3_json_streams() {
        let p = ToolParser::Llama3Json;
        assert_eq!(streamed(p, &["The capital", " of France", " is Paris."]), "The capital of France is Paris.");
        assert_eq!(streamed(p, &["{\"na", "me\": \"a\", \"parameters\": {}}"]), "");
        assert_eq!(streamed(p, &["Checking.", "\n", "{\"name\"", ": \"a\"}"]), "Checking.\n");
        assert_eq!(streamed(p, &["Sure", "<|pyth", "on_tag|>{\"name\": \"a\"}"]), "Sure");
        assert_eq!(p.content_len("Sure<|pyth"), 4, "a partial tag is held");
        assert_eq!(p.content_len("a {b}"), 5, "a brace mid-line is content");
        assert_eq!(p.content_len("line one\n  "), 8, "a blank last line may open a call");
    }

    #[test]
    fn mistral_calls() {
        let p = ToolParser::Mistral;
        // v0.3 (Mistral-7B-Instruct-v0.3, with the marker kept).
        let one = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]";
        assert_eq!(p.parse(one), Some((None, vec![call("get_weather", "{\"city\":\"Paris\"}")])));
        let two = "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]";
        assert_eq!(p.parse(two), Some((None, vec![call("a", "{\"x\":1}"), call("b", "{}")])));
        // The marker dropped by the detokenizer (a special token).
        let bare = "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]";
        assert_eq!(p.parse(bare), Some((None, vec![call("get_weather", "{\"city\":\"Oslo\"}")])));
        // v11+ (Mistral Small 3.2, Magistral): name[ARGS]{...} per call.
        let v11 = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}[TOOL_CALLS]now[ARGS]{}";
        assert_eq!(p.parse(v11), Some((None, vec![call("get_weather", "{\"city\":\"Rome\"}"), call("now", "{}")])));
        let before = "I will look it up.[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}]";
        assert_eq!(p.parse(before), Some((Some("I will look it up.".into()), vec![call("a", "{}")])));
        assert_eq!(p.parse("Paris is the capital."), None);
        assert_eq!(p.parse("[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {"), None, "cut short: content");
        assert_eq!(p.parse("[1, 2, 3]"), None);
        assert_eq!(p.parse("[TOOL_CALLS][{\"arguments\": {}}]"), None, "no name");
    }

    #[test]
    fn mistral_streams() {
        let p = ToolParser::Mistral;
        assert_eq!(streamed(p, &["Paris", " is the", " capital."]), "Paris is the capital.");
        assert_eq!(streamed(p, &["Looking.", "[TOOL", "_CA", "LLS][{\"name\""]), "Looking.");
        assert_eq!(streamed(p, &["[", "{\"name\": \"a\""]), "");
        assert_eq!(p.content_len("[see the docs](x)"), 17, "a markdown link is content");
        assert_eq!(p.content_len("ok [TOOL_"), 3);
    }

    #[test]
    fn qwen3_xml_calls() {
        let p = ToolParser::Qwen3Xml;
        // As Qwen3-Coder answers with its own template.
        let one = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(p.parse(one), Some((None, vec![call("get_weather", "{\"city\":\"Paris\",\"days\":3}")])));
        let two = "I'll run both.\n<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/main.rs\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=list>\n</function>\n</tool_call>";
        assert_eq!(
            p.parse(two),
            Some((
                Some("I'll run both.".into()),
                vec![call("read_file", "{\"path\":\"src/main.rs\"}"), call("list", "{}")]
            ))
        );
        let multi = "<tool_call>\n<function=write>\n<parameter=text>\nline 1\nline 2\n</parameter>\n<parameter=opts>\n{\"force\": true}\n</parameter>\n</function>";
        assert_eq!(
            p.parse(multi),
            Some((None, vec![call("write", "{\"text\":\"line 1\\nline 2\",\"opts\":{\"force\":true}}")])),
            "an unclosed last block counts"
        );
        assert_eq!(p.parse("No tools needed."), None);
        assert_eq!(p.parse("<tool_call>\n{\"name\": \"a\"}\n</tool_call>"), None, "hermes JSON is not this format");
        assert_eq!(p.parse("<tool_call>\n<function=>\n</function>\n</tool_call>"), None, "no name");
        assert_eq!(p.parse("<tool_call>\n<function=a>\n</function>\n</tool_call> trailing"), None);
    }

    #[test]
    fn qwen3_xml_and_hermes_stream() {
        for p in [ToolParser::Qwen3Xml, ToolParser::Hermes] {
            assert_eq!(streamed(p, &["Let me", " look.\n<to", "ol_c", "all>\n<function=a>"]), "Let me look.\n");
            assert_eq!(streamed(p, &["a <b", ">c"]), "a <b>c");
            assert_eq!(streamed(p, &["é", "<"]), "é");
        }
        let h = ToolParser::Hermes;
        assert_eq!(
            h.parse("<tool_call>{\"name\": \"get\", \"arguments\": {}}</tool_call>"),
            Some((None, vec![call("get", "{}")]))
        );
        assert_eq!(h.parse("plain"), None);
    }

    #[test]
    fn a_streamed_answer_parses_like_the_whole() {
        // Split at every byte: the content sent before the end is a prefix of the whole text
        // and, for a call, never reaches into the markup.
        let cases = [
            (ToolParser::Llama3Json, "Checking.\n<|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": \"x\"}}"),
            (ToolParser::Mistral, "Checking.[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}]"),
            (
                ToolParser::Qwen3Xml,
                "Checking.\n<tool_call>\n<function=a>\n<parameter=q>\nx\n</parameter>\n</function>\n</tool_call>",
            ),
            (ToolParser::Hermes, "Checking.\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>"),
        ];
        for (p, text) in cases {
            let (content, calls) = p.parse(text).unwrap_or_else(|| panic!("{p:?}"));
            assert_eq!((content.as_deref(), calls.len()), (Some("Checking."), 1), "{p:?}");
            for cut in (1..text.len()).filter(|&i| text.is_char_boundary(i)) {
                let sent = streamed(p, &[&text[..cut], &text[cut..]]);
                assert_eq!(sent.trim(), "Checking.", "{p:?} cut at {cut}");
                for k in 0..=cut {
                    let partial = p.content_len(&text[..k]);
                    assert!(partial <= "Checking.\n".len(), "{p:?} {:?} -> {partial}", &text[..k]);
                }
            }
        }
    }
}
