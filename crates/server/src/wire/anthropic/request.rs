//! Anthropic's Messages request read into the chat path's pieces: template messages, tools,
//! sampling fields, the output format; and `count_tokens`, which renders the same prompt.

use serde_json::{json, Map, Value};
use tandem_structured::GuideSpec;

use crate::chat::render_chat;
use crate::error::ApiError;
use crate::fields::{unsupported, wrong_type, Fields};
use crate::job::Job;
use crate::params::{parse_params, Api, ParsedParams};
use crate::state::AppState;
use crate::structured::{GuideRequest, ToolChoice, Tools};
use crate::wire::common::parse_json;

/// `cache_control` and `citations` ride on many blocks: caching is automatic here (prefix
/// caching), and there are no documents to cite, so both are accepted and change nothing.
fn text_of_blocks(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut text = String::new();
            for (j, b) in blocks.iter().enumerate() {
                let p = format!("{param}[{j}]");
                match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    (Some("text"), _) => {
                        return Err(ApiError::invalid(&format!("{p}.text"), format!("`{p}.text` must be a string")))
                    }
                    (Some(other), _) => {
                        return Err(unsupported(&format!("{p}.type"), &format!("{other:?} blocks are")))
                    }
                    (None, _) => {
                        return Err(ApiError::invalid(&format!("{p}.type"), format!("`{p}.type` is required")))
                    }
                }
            }
            Ok(text)
        }
        other => Err(wrong_type(param, "a string or a list of text blocks", other)),
    }
}

/// `system` and `messages` as the chat template reads them (string contents; an assistant's
/// calls as `tool_calls` with their input as a mapping; results as `role: "tool"` messages).
fn template_messages(f: &Fields) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    if let Some(s) = f.get("system") {
        out.push(json!({"role": "system", "content": text_of_blocks(s, "system")?}));
    }
    let msgs = match f.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(ApiError::invalid("messages", "`messages` must not be empty")),
        None => return Err(ApiError::invalid("messages", "`messages` is required")),
        Some(v) => return Err(wrong_type("messages", "a list of messages", v)),
    };
    for (i, m) in msgs.iter().enumerate() {
        let p = format!("messages[{i}]");
        let Some(m) = m.as_object() else { return Err(wrong_type(&p, "an object", m)) };
        let role = match m.get("role").and_then(Value::as_str) {
            Some(r @ ("user" | "assistant")) => r,
            // A system message mid-conversation (Claude Code sends them, beta
            // `mid-conversation-system`): text only, a system message where it stands.
            Some("system") => {
                let content = m
                    .get("content")
                    .ok_or_else(|| ApiError::invalid(&format!("{p}.content"), format!("`{p}.content` is required")))?;
                out.push(json!({"role": "system", "content": text_of_blocks(content, &format!("{p}.content"))?}));
                continue;
            }
            _ => {
                return Err(ApiError::invalid(
                    &format!("{p}.role"),
                    format!("`{p}.role` must be \"user\", \"assistant\" or \"system\""),
                ))
            }
        };
        let blocks = match m.get("content") {
            Some(Value::String(s)) => {
                out.push(json!({"role": role, "content": s}));
                continue;
            }
            Some(Value::Array(b)) => b,
            Some(v) => return Err(wrong_type(&format!("{p}.content"), "a string or a list of content blocks", v)),
            None => return Err(ApiError::invalid(&format!("{p}.content"), format!("`{p}.content` is required"))),
        };
        let mut text = String::new();
        let mut calls = Vec::new();
        let mut pushed = false;
        for (j, b) in blocks.iter().enumerate() {
            let bp = format!("{p}.content[{j}]");
            let Some(b) = b.as_object() else { return Err(wrong_type(&bp, "an object", b)) };
            let field = |name: &str| b.get(name).filter(|v| !v.is_null());
            match (role, b.get("type").and_then(Value::as_str)) {
                (_, Some("text")) => match field("text") {
                    Some(Value::String(t)) => text.push_str(t),
                    _ => return Err(ApiError::invalid(&format!("{bp}.text"), format!("`{bp}.text` must be a string"))),
                },
                ("assistant", Some("tool_use")) => {
                    let (Some(Value::String(id)), Some(Value::String(name))) = (field("id"), field("name")) else {
                        return Err(ApiError::invalid(&bp, format!("`{bp}` needs a string `id` and `name`")));
                    };
                    let input = match field("input") {
                        None => json!({}),
                        Some(v @ Value::Object(_)) => v.clone(),
                        Some(v) => return Err(wrong_type(&format!("{bp}.input"), "an object", v)),
                    };
                    calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}));
                }
                // Anthropic drops earlier turns' thinking from the context as well.
                ("assistant", Some("thinking" | "redacted_thinking")) => {}
                ("user", Some("tool_result")) => {
                    let Some(Value::String(id)) = field("tool_use_id") else {
                        return Err(ApiError::invalid(
                            &format!("{bp}.tool_use_id"),
                            format!("`{bp}.tool_use_id` must be a string"),
                        ));
                    };
                    if let Some(v) = field("is_error").filter(|v| !v.is_boolean()) {
                        return Err(wrong_type(&format!("{bp}.is_error"), "a boolean", v));
                    }
                    let content = match field("content") {
                        None => String::new(),
                        Some(c) => text_of_blocks(c, &format!("{bp}.content"))?,
                    };
                    // Text written before a result keeps its place.
                    if !text.is_empty() {
                        out.push(json!({"role": "user", "content": std::mem::take(&mut text)}));
                    }
                    out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
                    pushed = true;
                }
                (_, Some(other)) => {
                    return Err(unsupported(&format!("{bp}.type"), &format!("{other:?} blocks in {role} messages are")))
                }
                (_, None) => return Err(ApiError::invalid(&format!("{bp}.type"), format!("`{bp}.type` is required"))),
            }
        }
        if role == "assistant" {
            let mut msg = json!({"role": "assistant", "content": text});
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            out.push(msg);
        } else if !text.is_empty() || !pushed {
            out.push(json!({"role": "user", "content": text}));
        }
    }
    if msgs.last().and_then(|m| m.get("role")).and_then(Value::as_str) == Some("assistant") {
        let last = msgs.len() - 1;
        return Err(unsupported(&format!("messages[{last}]"), "a final assistant message (prefill) is"));
    }
    Ok(out)
}

/// How [`render_chat`]'s error for a template that refuses the messages begins.
const TEMPLATE_ERROR: &str = "cannot apply the chat template";

/// Whether a system message follows a user or assistant one.
fn has_late_system(msgs: &[Value]) -> bool {
    msgs.iter().skip_while(|m| m["role"] == "system").any(|m| m["role"] == "system")
}

/// The messages for a template that takes one system message, first (Mistral's and Gemma's
/// refuse others): leading system messages joined, a later one's text appended to the user
/// message before it, or a user message of its own after anything else.
fn fold_system(msgs: &[Value]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::with_capacity(msgs.len());
    for m in msgs {
        let text = m["content"].as_str().unwrap_or_default();
        let system = m["role"] == "system";
        let only = out.len() == 1;
        match out.last_mut() {
            Some(last) if system && (last["role"] == "user" || (last["role"] == "system" && only)) => {
                let joined = format!("{}\n\n{text}", last["content"].as_str().unwrap_or_default());
                last["content"] = json!(joined);
            }
            Some(_) if system => out.push(json!({"role": "user", "content": text})),
            _ => out.push(m.clone()),
        }
    }
    out
}

/// `tools` and `tool_choice` as the chat path's [`Tools`]; the list in OpenAI's shape, which is
/// what chat templates read.
fn tools(f: &Fields) -> Result<Option<Tools>, ApiError> {
    let list: &[Value] = match f.get("tools") {
        None => &[],
        Some(Value::Array(a)) => a,
        Some(v) => return Err(wrong_type("tools", "a list of tools", v)),
    };
    let mut functions: Vec<(String, Value)> = Vec::with_capacity(list.len());
    let mut openai = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let p = format!("tools[{i}]");
        let Some(o) = t.as_object() else { return Err(wrong_type(&p, "an object", t)) };
        let t = Fields(o);
        match t.str("type").map_err(|_| wrong_type(&format!("{p}.type"), "a string", &o["type"]))? {
            None | Some("custom") => {}
            Some(other) => return Err(unsupported(&format!("{p}.type"), &format!("server tools ({other:?}) are"))),
        }
        let name = match t.get("name") {
            Some(Value::String(n)) if !n.is_empty() => n.clone(),
            Some(Value::String(_)) | None => {
                return Err(ApiError::invalid(
                    &format!("{p}.name"),
                    format!("`{p}.name` is required and must not be empty"),
                ))
            }
            Some(v) => return Err(wrong_type(&format!("{p}.name"), "a string", v)),
        };
        if functions.iter().any(|(n, _)| *n == name) {
            return Err(ApiError::invalid(&format!("{p}.name"), format!("two tools are named {name:?}")));
        }
        let description = match t.get("description") {
            None => Value::Null,
            Some(d @ Value::String(_)) => d.clone(),
            Some(v) => return Err(wrong_type(&format!("{p}.description"), "a string", v)),
        };
        let schema = match t.get("input_schema") {
            Some(s @ Value::Object(_)) => s.clone(),
            Some(v) => return Err(wrong_type(&format!("{p}.input_schema"), "a JSON schema object", v)),
            None => {
                return Err(ApiError::invalid(&format!("{p}.input_schema"), format!("`{p}.input_schema` is required")))
            }
        };
        let mut func = json!({"name": name, "parameters": schema});
        if !description.is_null() {
            func["description"] = description;
        }
        openai.push(json!({"type": "function", "function": func}));
        functions.push((name, schema));
    }
    let forced = f
        .get("tool_choice")
        .and_then(|c| c.get("type"))
        .and_then(Value::as_str)
        .is_some_and(|t| t == "any" || t == "tool");
    if functions.is_empty() && forced {
        return Err(ApiError::invalid("tool_choice", "`tool_choice` \"any\" or \"tool\" needs `tools`"));
    }
    let choice = match f.get("tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::Object(c)) => {
            let c = Fields(c);
            if let Some(v) = c.get("disable_parallel_tool_use").filter(|v| !v.is_boolean()) {
                return Err(wrong_type("tool_choice.disable_parallel_tool_use", "a boolean", v));
            }
            match c.get("type").and_then(Value::as_str) {
                Some("auto") => ToolChoice::Auto,
                Some("none") => ToolChoice::None,
                Some("any") => ToolChoice::Required,
                Some("tool") => {
                    let Some(Value::String(name)) = c.get("name") else {
                        return Err(ApiError::invalid(
                            "tool_choice.name",
                            "`tool_choice.name` must be a string with `\"type\": \"tool\"`",
                        ));
                    };
                    if !functions.iter().any(|(n, _)| n == name) {
                        let known: Vec<&str> = functions.iter().map(|(n, _)| n.as_str()).collect();
                        return Err(ApiError::invalid(
                            "tool_choice.name",
                            format!(
                                "`tool_choice.name` is {name:?}, which is not among the tools: [{}]",
                                known.join(", ")
                            ),
                        ));
                    }
                    ToolChoice::Named(name.clone())
                }
                _ => {
                    return Err(ApiError::invalid(
                        "tool_choice.type",
                        "`tool_choice.type` must be \"auto\", \"any\", \"tool\" or \"none\"",
                    ))
                }
            }
        }
        Some(v) => return Err(wrong_type("tool_choice", "an object", v)),
    };
    if functions.is_empty() {
        return Ok(None);
    }
    Ok(Some(Tools { list: openai, functions, choice }))
}

/// Fields read for what they are and refused when set: silently dropping them would change
/// the answer.
fn refuse_unsupported(f: &Fields) -> Result<(), ApiError> {
    for name in ["mcp_servers", "container"] {
        match f.get(name) {
            Some(Value::Array(a)) if a.is_empty() => {}
            Some(_) => return Err(unsupported(name, "it is")),
            None => {}
        }
    }
    for name in ["metadata", "thinking"] {
        if let Some(v) = f.get(name).filter(|v| !v.is_object()) {
            return Err(wrong_type(name, "an object", v));
        }
    }
    Ok(())
}

/// The LoRA adapter's slot where `model` names one.
fn check_model(f: &Fields, state: &AppState) -> Result<Option<u32>, ApiError> {
    match f.str("model")? {
        None => Err(ApiError::invalid("model", "`model` is required")),
        Some(m) => state.resolve(m).ok_or_else(|| ApiError::unknown_model(m, &state.model_name)),
    }
}

/// The sampling fields under Anthropic's names, through the shared checks.
fn params(state: &AppState, f: &Fields) -> Result<ParsedParams, ApiError> {
    let mut m = Map::new();
    for name in ["temperature", "top_p", "top_k", "stream"] {
        if let Some(v) = f.get(name) {
            m.insert(name.into(), v.clone());
        }
    }
    match f.get("max_tokens") {
        None => return Err(ApiError::invalid("max_tokens", "`max_tokens` is required")),
        Some(v) if v.as_i64().is_some_and(|m| m < 1) => {
            return Err(ApiError::invalid("max_tokens", format!("`max_tokens` must be at least 1, got {v}")))
        }
        Some(v) => m.insert("max_tokens".into(), v.clone()),
    };
    match f.get("stop_sequences") {
        None => {}
        Some(Value::Array(a)) => {
            for (i, s) in a.iter().enumerate() {
                match s {
                    Value::String(s) if !s.is_empty() => {}
                    Value::String(_) => {
                        return Err(ApiError::invalid(
                            &format!("stop_sequences[{i}]"),
                            format!("`stop_sequences[{i}]` must not be empty"),
                        ))
                    }
                    v => return Err(wrong_type(&format!("stop_sequences[{i}]"), "a string", v)),
                }
            }
            m.insert("stop".into(), Value::Array(a.clone()));
        }
        Some(v) => return Err(wrong_type("stop_sequences", "a list of strings", v)),
    }
    let p = parse_params(&Fields(&m), Api::Chat, state.config.vocab_size, &state.config.sampling_defaults).map_err(
        |e| match e.param.as_deref() {
            Some("stop") => ApiError {
                param: Some("stop_sequences".into()),
                message: e.message.replace("`stop`", "`stop_sequences`"),
                ..e
            },
            _ => e,
        },
    )?;
    Ok(p)
}

/// `output_config`: `format` (`{"type": "json_schema", "schema"}`) constrains the answer's
/// text to the schema, as `response_format` does on chat; `effort` is accepted (no reasoning
/// to spend it on).
fn output_format(f: &Fields) -> Result<Option<GuideRequest>, ApiError> {
    let Some(oc) = f.object("output_config")? else { return Ok(None) };
    if let Some(v) = oc.get("effort").filter(|v| !v.is_string()) {
        return Err(wrong_type("output_config.effort", "a string", v));
    }
    let format = match oc.get("format") {
        None => return Ok(None),
        Some(Value::Object(o)) => Fields(o),
        Some(v) => return Err(wrong_type("output_config.format", "an object", v)),
    };
    match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => {}
        _ => {
            return Err(ApiError::invalid(
                "output_config.format.type",
                "`output_config.format.type` must be \"json_schema\"",
            ))
        }
    }
    let param = "output_config.format.schema";
    match format.get("schema") {
        Some(s @ Value::Object(_)) => {
            Ok(Some(GuideRequest { spec: GuideSpec::JsonSchema(s.clone()), param: param.into() }))
        }
        Some(v) => Err(wrong_type(param, "a JSON schema object", v)),
        None => Err(ApiError::invalid(param, format!("`{param}` is required"))),
    }
}

/// `thinking: {"type": "disabled"}` as the template variable that turns a thinking model's
/// thinking off (Qwen3's `enable_thinking: false`); other settings leave the template's default.
fn thinking_kwargs(f: &Fields) -> Option<Map<String, Value>> {
    let disabled = f.get("thinking").and_then(|t| t.get("type")).and_then(Value::as_str) == Some("disabled");
    disabled.then(|| Map::from_iter([("enable_thinking".to_string(), json!(false))]))
}

/// A Messages request as a chat job (its tools and stop sequences kept for the answer).
pub(super) fn job(state: &AppState, body: &[u8]) -> Result<Job, ApiError> {
    let o = parse_json(body)?;
    let f = Fields(&o);
    let adapter = check_model(&f, state)?;
    refuse_unsupported(&f)?;
    let mut p = params(state, &f)?;
    p.params.adapter = adapter;
    let guide = output_format(&f)?;
    let tools = tools(&f)?;
    let msgs = template_messages(&f)?;
    let kwargs = thinking_kwargs(&f);
    let mut job = match Job::chat_from(state, p.clone(), guide.clone(), tools.as_ref(), &msgs, true, kwargs.as_ref()) {
        Err(e) if e.message.starts_with(TEMPLATE_ERROR) && has_late_system(&msgs) => {
            Job::chat_from(state, p, guide, tools.as_ref(), &fold_system(&msgs), true, kwargs.as_ref())?
        }
        other => other?,
    };
    if let Some(t) = &mut job.tool_parses {
        t.request_type = crate::metrics::ToolRequestType::Other;
    }
    // The room the context leaves caps `max_tokens`. A prompt that fills it is refused in
    // Anthropic's words: Claude Code reads "prompt is too long" as its cue to compact.
    let (ctx, len) = (state.max_model_len(), job.prompts[0].len());
    if len >= ctx {
        return Err(ApiError::invalid("messages", format!("prompt is too long: {len} tokens > {} maximum (this model's context is {ctx} tokens, one is needed for the answer)", ctx - 1)));
    }
    job.p.max_tokens = job.p.max_tokens.map(|m| m.min(ctx - len));
    Ok(job)
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as `/v1/messages` would render it.
pub(crate) fn count_tokens(state: &AppState, body: &[u8]) -> Result<Value, ApiError> {
    let o = parse_json(body)?;
    let f = Fields(&o);
    check_model(&f, state)?;
    refuse_unsupported(&f)?;
    let tools = tools(&f)?;
    let msgs = template_messages(&f)?;
    let kwargs = thinking_kwargs(&f);
    let ids = match render_chat(state, &msgs, tools.as_ref(), true, kwargs.as_ref()) {
        Err(e) if e.message.starts_with(TEMPLATE_ERROR) && has_late_system(&msgs) => {
            render_chat(state, &fold_system(&msgs), tools.as_ref(), true, kwargs.as_ref())?
        }
        other => other?,
    };
    Ok(json!({"input_tokens": ids.len()}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(v: Value) -> Result<Vec<Value>, ApiError> {
        template_messages(&Fields(v.as_object().unwrap()))
    }

    #[test]
    fn blocks_become_template_messages() {
        let got = msgs(json!({
            "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "system", "content": [{"type": "text", "text": "tools follow"}]},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "x"}, {"type": "text", "text": "Looking."}, {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]}, {"type": "text", "text": "and?"}]}
            ]
        }))
        .unwrap();
        assert_eq!(
            got,
            vec![
                json!({"role": "system", "content": "be brief"}),
                json!({"role": "user", "content": "weather?"}),
                json!({"role": "system", "content": "tools follow"}),
                json!({"role": "assistant", "content": "Looking.", "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "get", "arguments": {"city": "Oslo"}}}]}),
                json!({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}),
                json!({"role": "user", "content": "and?"}),
            ]
        );
    }

    #[test]
    fn late_system_messages_fold_for_strict_templates() {
        let m = |role: &str, text: &str| json!({"role": role, "content": text});
        let msgs = vec![
            m("system", "a"),
            m("system", "b"),
            m("user", "hi"),
            m("system", "c"),
            m("assistant", "yo"),
            m("system", "d"),
        ];
        assert!(has_late_system(&msgs) && !has_late_system(&msgs[..3]));
        assert_eq!(
            fold_system(&msgs),
            vec![m("system", "a\n\nb"), m("user", "hi\n\nc"), m("assistant", "yo"), m("user", "d")]
        );
    }

    #[test]
    fn bad_messages_name_their_field() {
        let cases = [
            (json!({}), "messages", "required"),
            (json!({"messages": []}), "messages", "empty"),
            (
                json!({"messages": [{"role": "tool", "content": "x"}]}),
                "messages[0].role",
                "\"user\", \"assistant\" or \"system\"",
            ),
            (
                json!({"messages": [{"role": "system", "content": [{"type": "image"}]}]}),
                "messages[0].content[0].type",
                "not supported",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                "messages[0].content[0].type",
                "not supported",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b"}]}]}),
                "messages[0].content[0].type",
                "not supported",
            ),
            (json!({"messages": [{"role": "user", "content": 5}]}), "messages[0].content", "a string or a list"),
            (
                json!({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}),
                "messages[1]",
                "prefill",
            ),
            (json!({"system": 3, "messages": [{"role": "user", "content": "a"}]}), "system", "a string or a list"),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}),
                "messages[0].content[0].tool_use_id",
                "a string",
            ),
        ];
        for (body, param, msg) in cases {
            let e = msgs(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
            assert!(e.message.contains(msg), "{body}: {}", e.message);
        }
    }

    #[test]
    fn tools_map_onto_the_chat_path() {
        let f = |v: Value| tools(&Fields(v.as_object().unwrap()));
        let t = json!([{"name": "get", "description": "weather", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}]);
        let got = f(json!({"tools": t})).unwrap().unwrap();
        assert_eq!(got.choice, ToolChoice::Auto);
        assert_eq!(
            got.list,
            vec![
                json!({"type": "function", "function": {"name": "get", "description": "weather", "parameters": {"type": "object"}}})
            ]
        );
        assert_eq!(
            f(json!({"tools": t, "tool_choice": {"type": "any"}})).unwrap().unwrap().choice,
            ToolChoice::Required
        );
        assert_eq!(f(json!({"tools": t, "tool_choice": {"type": "none"}})).unwrap().unwrap().choice, ToolChoice::None);
        assert_eq!(
            f(json!({"tools": t, "tool_choice": {"type": "tool", "name": "get"}})).unwrap().unwrap().choice,
            ToolChoice::Named("get".into())
        );
        assert_eq!(f(json!({"tool_choice": {"type": "auto"}})).unwrap(), None);
        let cases = [
            (json!({"tools": t, "tool_choice": {"type": "tool", "name": "put"}}), "tool_choice.name"),
            (json!({"tools": t, "tool_choice": "auto"}), "tool_choice"),
            (json!({"tools": t, "tool_choice": {"type": "required"}}), "tool_choice.type"),
            (json!({"tool_choice": {"type": "any"}}), "tool_choice"),
            (json!({"tools": [{"name": "a"}]}), "tools[0].input_schema"),
            (json!({"tools": [{"input_schema": {}}]}), "tools[0].name"),
            (json!({"tools": [{"name": 1, "input_schema": {}}]}), "tools[0].name"),
            (json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}), "tools[0].type"),
            (json!({"tools": [{"name": "a", "input_schema": {}}, {"name": "a", "input_schema": {}}]}), "tools[1].name"),
        ];
        for (body, param) in cases {
            let e = f(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }

    #[test]
    fn output_config_format_is_a_schema_constraint() {
        let f = |v: Value| output_format(&Fields(v.as_object().unwrap()));
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let g = f(json!({"output_config": {"effort": "low", "format": {"type": "json_schema", "schema": schema}}}))
            .unwrap()
            .unwrap();
        assert_eq!((g.spec, g.param.as_str()), (GuideSpec::JsonSchema(schema), "output_config.format.schema"));
        assert_eq!(f(json!({"output_config": {"effort": "high"}})).unwrap(), None);
        for (body, param) in [
            (json!({"output_config": 1}), "output_config"),
            (json!({"output_config": {"format": {"type": "text"}}}), "output_config.format.type"),
            (json!({"output_config": {"format": {"type": "json_schema"}}}), "output_config.format.schema"),
            (json!({"output_config": {"effort": 3}}), "output_config.effort"),
        ] {
            assert_eq!(f(body.clone()).unwrap_err().param.as_deref(), Some(param), "{body}");
        }
    }

    #[test]
    fn disabled_thinking_reaches_the_template() {
        let kw = |v: Value| thinking_kwargs(&Fields(v.as_object().unwrap()));
        assert_eq!(
            kw(json!({"thinking": {"type": "disabled"}})),
            Some(Map::from_iter([("enable_thinking".to_string(), json!(false))]))
        );
        assert_eq!(kw(json!({"thinking": {"type": "adaptive"}})), None);
        assert_eq!(kw(json!({})), None);
    }
}
