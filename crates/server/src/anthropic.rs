//! Anthropic's Messages API: `POST /v1/messages` (whole, or streamed as Anthropic's named
//! events) and `POST /v1/messages/count_tokens`, so that the `anthropic` SDKs and Claude Code
//! talk to the server unmodified. docs/anthropic-compat.md has the tables.
//!
//! A request is read into the chat path's own pieces and runs as a chat completion does:
//! - `system` and `messages` become template messages (`tool_use` blocks an assistant's
//!   `tool_calls` with their input as a mapping, `tool_result` blocks `role: "tool"` messages,
//!   a mid-conversation `system` message a system message, folded into the user turn for a
//!   template that refuses it), rendered by the model's chat template
//!   ([`crate::openai::Job::chat_from`]);
//! - `tools` become the chat path's [`Tools`] (`input_schema` is the parameters schema) and
//!   `tool_choice` its choice: `auto` -> auto (read by `--tool-call-parser`, or Hermes
//!   `<tool_call>` blocks where the template writes them), `any` -> required, `tool` -> the named function, `none` -> none;
//!   forced choices are constrained through llguidance like OpenAI's;
//! - `max_tokens` (required), `stop_sequences`, `temperature`, `top_p`, `top_k` and `stream`
//!   go through the shared sampling checks ([`crate::params::parse_params`]);
//! - `output_config.format` (a JSON schema) is structured output, as `response_format` on chat.
//!
//! Unknown fields are ignored, as on the OpenAI routes; fields whose meaning is not served
//! (`mcp_servers`, `container`, image and document blocks, server tools, assistant prefill)
//! are 400s naming them. Errors are `{"type": "error", "error": {"type", "message"}}`.
//!
//! `max_tokens` is trimmed to the room the context leaves (Claude Code asks for 32000 whatever
//! the model), so only a prompt that fills the context is refused, in Anthropic's words.
//!
//! With `--reasoning-parser`, the answer's `<think>` block is a `thinking` block before the
//! text (an empty `signature`: there is nothing to sign), streamed as `thinking_delta`s.
//!
//! Streaming ([`MessageStream`]): text and tools' input stream as sampled (a named tool, "any",
//! and "auto" with a tool parser once its markup is certain; text up to where it may begin). `GET
//! /v1/models` asked with `anthropic-version` answers in Anthropic's shape ([`models`]).

use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Map, Value};

use crate::body::{EventFormat, ResponseBody};
use crate::engine_client::{CompletionDelta, EngineUpdate, FinishReason};
use crate::error::ApiError;
use crate::openai::{collect, parse_json, render_chat, tool_message, Job, ToolOutput};
use crate::params::{parse_params, type_name, Api, Fields, ParsedParams};
use crate::reasoning::ReasoningStream;
use crate::router::{compiled, json_response, ready, sse_response, tokenizer_call, X_REQUEST_ID};
use crate::run::Run;
use crate::server::AppState;
use crate::structured::{self, GuideRequest, ToolChoice, Tools};
use crate::tool_stream::{AutoCalls, CallEvent, CallStream};
use tandem_structured::GuideSpec;

/// Anthropic's error type for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 => "invalid_request_error",
        408 => "timeout_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        _ => "api_error",
    }
}

/// An error in Anthropic's shape. The message names the field at fault where one is.
pub fn error_body(e: &ApiError) -> Value {
    let message = match &e.param {
        Some(p) if !e.message.contains(p.as_str()) => format!("{p}: {}", e.message),
        _ => e.message.clone(),
    };
    json!({"type": "error", "error": {"type": error_type(e.status), "message": message}})
}

fn wrong_type(param: &str, want: &str, got: &Value) -> ApiError {
    ApiError::invalid(param, format!("`{param}` must be {want}, got {}", type_name(got)))
}

fn unsupported(param: &str, what: &str) -> ApiError {
    ApiError::invalid(param, format!("`{param}`: {what} not supported by this server"))
}

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

fn check_model(f: &Fields, state: &AppState) -> Result<(), ApiError> {
    match f.str("model")? {
        None => Err(ApiError::invalid("model", "`model` is required")),
        Some(m) if !state.serves(m) => Err(ApiError::unknown_model(m, &state.model_name)),
        Some(_) => Ok(()),
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
fn job(state: &AppState, body: &[u8]) -> Result<Job, ApiError> {
    let o = parse_json(body)?;
    let f = Fields(&o);
    check_model(&f, state)?;
    refuse_unsupported(&f)?;
    let p = params(state, &f)?;
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
pub fn count_tokens(state: &AppState, body: &[u8]) -> Result<Value, ApiError> {
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

/// The served model as Anthropic's model object: `max_input_tokens` and `max_tokens` are the
/// context (a client sizes its prompts by them); the release date is unknown, so the epoch, as
/// Anthropic's API says it may be.
pub fn model_info(state: &AppState) -> Value {
    let ctx = state.max_model_len();
    json!({"type": "model", "id": state.model_name, "display_name": state.model_name, "created_at": "1970-01-01T00:00:00Z", "lifecycle": "active",
           "max_input_tokens": ctx, "max_tokens": ctx})
}

/// `GET /v1/models` for an Anthropic client: one page holding the served model.
pub fn models(state: &AppState) -> Value {
    json!({"data": [model_info(state)], "has_more": false, "first_id": state.model_name, "last_id": state.model_name})
}

/// `msg_` or `toolu_` and 24 random hex digits.
fn new_id(prefix: &str) -> String {
    let call = structured::tool_call_id();
    format!("{prefix}{}", call.trim_start_matches("call_"))
}

/// The answer's content blocks, `stop_reason` and `stop_sequence`.
fn answer(
    tool_output: Option<&ToolOutput>,
    text: &str,
    finish: &FinishReason,
    stop_string: Option<&str>,
) -> (Vec<Value>, &'static str, Option<String>) {
    let (content, calls, openai_finish) = tool_message(tool_output, text, finish.as_str());
    let mut blocks = Vec::new();
    if let Some(c) = content.filter(|c| !c.is_empty()) {
        blocks.push(json!({"type": "text", "text": c}));
    }
    let mut used_tool = false;
    for c in &calls {
        match serde_json::from_str::<Value>(&c.arguments) {
            Ok(input @ Value::Object(_)) => {
                blocks.push(json!({"type": "tool_use", "id": new_id("toolu_"), "name": c.name, "input": input}));
                used_tool = true;
            }
            // A forced call cut short is not an object yet: its text, as written.
            _ => blocks.push(json!({"type": "text", "text": c.arguments})),
        }
    }
    let reason = match finish {
        FinishReason::Length => "max_tokens",
        _ if used_tool && matches!(openai_finish.as_str(), "tool_calls" | "stop") => "tool_use",
        FinishReason::Stop if stop_string.is_some() => "stop_sequence",
        FinishReason::Stop => "end_turn",
        // Cut by the server's request timeout (or an error, answered before this).
        FinishReason::Abort | FinishReason::Error(_) => "pause_turn",
    };
    let seq = if reason == "stop_sequence" { stop_string.map(String::from) } else { None };
    (blocks, reason, seq)
}

/// `POST /v1/messages`.
pub async fn messages(
    state: &Arc<AppState>,
    req: Request<Incoming>,
    start: Instant,
) -> Result<Response<ResponseBody>, ApiError> {
    ready(state)?;
    let job = compiled(state, tokenizer_call(state, req, job).await?).await?;
    let reqs = job.requests(state)?;
    let id = new_id("msg_");
    let mut run = Run::start(state.clone(), reqs, "messages", id.clone(), start)?;
    let request_id =
        hyper::header::HeaderValue::from_str(&id).map_err(|e| ApiError::internal(format!("bad response id: {e}")))?;
    let mut r = if job.p.stream {
        sse_response(run, Box::new(MessageStream::new(&job, id, state.model_name.clone())))
    } else {
        // If the client leaves, hyper drops this future, and with it `run`, which aborts.
        let c = collect(&mut run).await?.pop().unwrap_or_default();
        let (thinking, text) = match job.reasoning {
            Some(r) => r.split(&c.text),
            None => (None, c.text),
        };
        let (mut content, reason, seq) = answer(
            job.tool_output.as_ref(),
            &text,
            c.finish.as_ref().unwrap_or(&FinishReason::Stop),
            c.stop_string.as_deref(),
        );
        if let Some(t) = thinking {
            content.insert(0, json!({"type": "thinking", "thinking": t, "signature": ""}));
        }
        json_response(
            StatusCode::OK,
            &json!({"id": id, "type": "message", "role": "assistant", "content": content, "model": state.model_name, "stop_reason": reason, "stop_sequence": seq,
                    "usage": {"input_tokens": run.prompt_tokens, "output_tokens": run.completion_tokens}}),
        )
    };
    r.headers_mut().insert(X_REQUEST_ID, request_id);
    Ok(r)
}

/// How a streamed answer's text is sent.
enum Mode {
    /// As `text_delta`s of one text block.
    Text,
    /// A forced tool: the text is its input, sent as `input_json_delta`s of one `tool_use` block
    /// opened in the head.
    ToolInput,
    /// "any": a JSON array of calls, each a `tool_use` block whose input streams as sampled.
    Any(CallStream),
    /// "auto" with a tool parser: text streams until the markup may begin; from where the
    /// calls' JSON surely begins they stream as "any" does; at the end the rest is calls (whole
    /// blocks, for a format not streamed) or, if it does not parse, more text.
    Auto(AutoCalls),
}

/// Anthropic's event stream: `message_start`, `ping`, per block `content_block_start`,
/// `content_block_delta`s and `content_block_stop`, then `message_delta` (stop reason, output
/// tokens) and `message_stop`; an engine failure is an `error` event that ends it.
pub struct MessageStream {
    id: String,
    model: String,
    input_tokens: usize,
    tool_output: Option<ToolOutput>,
    mode: Mode,
    /// With a reasoning parser: the answer's thinking, split from its text as it comes.
    reasoning: Option<ReasoningStream>,
    /// The index and type of the open block, if one is open; blocks opened so far.
    open: Option<(usize, &'static str)>,
    blocks: usize,
    finish: Option<FinishReason>,
    stop_string: Option<String>,
    failed: bool,
}

fn push_event(out: &mut String, name: &str, v: &Value) {
    use std::fmt::Write;
    let _ = write!(out, "event: {name}\ndata: {v}\n\n");
}

impl MessageStream {
    pub fn new(job: &Job, id: String, model: String) -> Self {
        let mode = match &job.tool_output {
            None => Mode::Text,
            Some(ToolOutput::Named(_)) => Mode::ToolInput,
            Some(ToolOutput::Auto(parser)) => Mode::Auto(AutoCalls::new(*parser)),
            Some(ToolOutput::Required) => Mode::Any(CallStream::new(None)),
        };
        let input_tokens = job.prompts.first().map_or(0, Vec::len);
        let reasoning = job.reasoning.map(ReasoningStream::new);
        MessageStream {
            id,
            model,
            input_tokens,
            tool_output: job.tool_output.clone(),
            mode,
            reasoning,
            open: None,
            blocks: 0,
            finish: None,
            stop_string: None,
            failed: false,
        }
    }

    fn start_block(&mut self, out: &mut String, block: Value) {
        let index = self.blocks;
        self.blocks += 1;
        let kind = match block["type"].as_str() {
            Some("thinking") => "thinking",
            Some("tool_use") => "tool_use",
            _ => "text",
        };
        self.open = Some((index, kind));
        push_event(
            out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        );
    }

    fn delta(out: &mut String, index: usize, delta: Value) {
        push_event(out, "content_block_delta", &json!({"type": "content_block_delta", "index": index, "delta": delta}));
    }

    fn stop_block(&mut self, out: &mut String) {
        if let Some((index, _)) = self.open.take() {
            push_event(out, "content_block_stop", &json!({"type": "content_block_stop", "index": index}));
        }
    }

    /// Text into the open text block, one opened (and a thinking block closed) on the first.
    fn text(&mut self, out: &mut String, text: &str) {
        self.delta_into(out, "text", json!({"type": "text_delta", "text": text}), text.is_empty());
    }

    /// Thinking into the open thinking block, opened on the first.
    fn thinking(&mut self, out: &mut String, text: &str) {
        self.delta_into(out, "thinking", json!({"type": "thinking_delta", "thinking": text}), text.is_empty());
    }

    fn delta_into(&mut self, out: &mut String, kind: &'static str, delta: Value, empty: bool) {
        if empty {
            return;
        }
        let index = match self.open {
            Some((i, k)) if k == kind => i,
            _ => {
                self.stop_block(out);
                let block = if kind == "thinking" {
                    json!({"type": "thinking", "thinking": "", "signature": ""})
                } else {
                    json!({"type": "text", "text": ""})
                };
                self.start_block(out, block);
                self.blocks - 1
            }
        };
        Self::delta(out, index, delta);
    }

    /// A whole block: opened, its content in one delta, closed.
    fn whole_block(&mut self, out: &mut String, block: &Value) {
        if block["type"] == "tool_use" {
            self.start_block(out, json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}));
            Self::delta(
                out,
                self.blocks - 1,
                json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
            );
        } else {
            self.start_block(out, json!({"type": "text", "text": ""}));
            Self::delta(out, self.blocks - 1, json!({"type": "text_delta", "text": block["text"]}));
        }
        self.stop_block(out);
    }
}

impl EventFormat for MessageStream {
    fn head(&mut self) -> String {
        let mut out = String::new();
        let message = json!({"id": self.id, "type": "message", "role": "assistant", "content": [], "model": self.model, "stop_reason": null, "stop_sequence": null,
                             "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}});
        push_event(&mut out, "message_start", &json!({"type": "message_start", "message": message}));
        if let (Mode::ToolInput, Some(ToolOutput::Named(name))) = (&self.mode, &self.tool_output) {
            let block = json!({"type": "tool_use", "id": new_id("toolu_"), "name": name, "input": {}});
            self.start_block(&mut out, block);
        }
        push_event(&mut out, "ping", &json!({"type": "ping"}));
        out
    }

    fn update(&mut self, out: &mut String, _run: &Run, _prompt: usize, upd: &EngineUpdate) {
        for d in upd.deltas.iter().filter(|d| d.index == 0) {
            self.delta_events(out, d);
        }
    }

    fn tail(&mut self, out: &mut String, run: &Run) {
        self.end_events(out, run.completion_tokens);
    }
}

impl MessageStream {
    fn delta_events(&mut self, out: &mut String, d: &CompletionDelta) {
        {
            if self.failed {
                return;
            }
            if let Some(FinishReason::Error(e)) = &d.finish {
                self.failed = true;
                let err = ApiError::internal(format!("the engine failed this request: {e}"));
                push_event(out, "error", &error_body(&err));
                return;
            }
            let piece = match &mut self.reasoning {
                Some(st) => {
                    let (thinking, content) = st.push(&d.text, d.finish.is_some());
                    self.thinking(out, &thinking);
                    content
                }
                None => d.text.clone(),
            };
            if !piece.is_empty() {
                let mut calls = Vec::new();
                match &mut self.mode {
                    Mode::Text => self.text(out, &piece),
                    Mode::ToolInput => Self::delta(out, 0, json!({"type": "input_json_delta", "partial_json": piece})),
                    Mode::Any(cs) => calls = cs.push(&piece),
                    Mode::Auto(auto) => {
                        let certain;
                        (certain, calls) = auto.push(&piece);
                        self.text(out, &certain);
                    }
                }
                for e in calls {
                    match e {
                        CallEvent::Start { name, .. } => {
                            self.stop_block(out);
                            self.start_block(
                                out,
                                json!({"type": "tool_use", "id": new_id("toolu_"), "name": name, "input": {}}),
                            );
                        }
                        CallEvent::Args { piece, .. } => Self::delta(
                            out,
                            self.blocks - 1,
                            json!({"type": "input_json_delta", "partial_json": piece}),
                        ),
                    }
                }
            }
            if d.finish.is_some() {
                self.finish = d.finish.clone();
                self.stop_string = d.stop_string.clone();
            }
        }
    }

    fn end_events(&mut self, out: &mut String, output_tokens: usize) {
        if self.failed {
            return;
        }
        let finish = self.finish.clone().unwrap_or(FinishReason::Abort);
        let (reason, seq) = match std::mem::replace(&mut self.mode, Mode::Text) {
            Mode::Any(cs) => {
                self.stop_block(out);
                let reason = match finish {
                    FinishReason::Length => "max_tokens",
                    FinishReason::Stop if cs.started() > 0 => "tool_use",
                    FinishReason::Stop => "end_turn",
                    _ => "pause_turn",
                };
                (reason, None)
            }
            Mode::Text => {
                self.stop_block(out);
                let (_, reason, seq) = answer(None, "", &finish, self.stop_string.as_deref());
                (reason, seq)
            }
            Mode::Auto(AutoCalls { text, calls: Some(cs), .. }) if cs.started() > 0 => {
                // Calls went out as they came: the answer is calls; any the stream did not
                // follow come whole.
                self.stop_block(out);
                let (blocks, _, _) = answer(self.tool_output.as_ref(), &text, &finish, self.stop_string.as_deref());
                for b in blocks.iter().filter(|b| b["type"] == "tool_use").skip(cs.started()) {
                    self.whole_block(out, b);
                }
                let reason = match finish {
                    FinishReason::Length => "max_tokens",
                    FinishReason::Stop => "tool_use",
                    _ => "pause_turn",
                };
                (reason, None)
            }
            Mode::Auto(AutoCalls { text, sent, .. }) => {
                let (blocks, reason, seq) =
                    answer(self.tool_output.as_ref(), &text, &finish, self.stop_string.as_deref());
                if blocks.iter().any(|b| b["type"] == "tool_use") {
                    // The content before the calls went out already.
                    self.stop_block(out);
                    for b in blocks.iter().filter(|b| b["type"] == "tool_use") {
                        self.whole_block(out, b);
                    }
                } else {
                    self.text(out, &text[sent..]);
                    self.stop_block(out);
                }
                (reason, seq)
            }
            Mode::ToolInput => {
                self.stop_block(out);
                let reason = match finish {
                    FinishReason::Length => "max_tokens",
                    FinishReason::Stop => "tool_use",
                    _ => "pause_turn",
                };
                (reason, None)
            }
        };
        push_event(
            out,
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": {"output_tokens": output_tokens}}),
        );
        push_event(out, "message_stop", &json!({"type": "message_stop"}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reasoning::ReasoningParser;
    use crate::tool_parser::ToolParser;

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
    fn answers_and_stop_reasons() {
        let (b, r, s) = answer(None, "hi", &FinishReason::Stop, Some("\n\n"));
        assert_eq!((b, r, s.as_deref()), (vec![json!({"type": "text", "text": "hi"})], "stop_sequence", Some("\n\n")));
        assert_eq!(answer(None, "hi", &FinishReason::Stop, None).1, "end_turn");
        assert_eq!(answer(None, "hi", &FinishReason::Length, None).1, "max_tokens");
        assert_eq!(answer(None, "", &FinishReason::Stop, None).0, Vec::<Value>::new(), "no empty text block");
        let named = ToolOutput::Named("get".into());
        let (b, r, _) = answer(Some(&named), "{\"city\": \"Oslo\"}", &FinishReason::Stop, None);
        assert_eq!(
            (b[0]["type"].as_str(), &b[0]["name"], &b[0]["input"], r),
            (Some("tool_use"), &json!("get"), &json!({"city": "Oslo"}), "tool_use")
        );
        assert!(b[0]["id"].as_str().unwrap().starts_with("toolu_") && b[0]["id"].as_str().unwrap().len() == 30);
        let (b, r, _) = answer(Some(&named), "{\"city\": \"Os", &FinishReason::Length, None);
        assert_eq!(
            (b, r),
            (vec![json!({"type": "text", "text": "{\"city\": \"Os"})], "max_tokens"),
            "a cut call is its text"
        );
        let (b, r, _) = answer(
            Some(&ToolOutput::Required),
            "[{\"name\": \"get\", \"parameters\": {}}, {\"name\": \"now\", \"parameters\": {}}]",
            &FinishReason::Stop,
            None,
        );
        assert_eq!((b.len(), r), (2, "tool_use"));
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

    /// The events of a stream fed these text pieces, the last finishing with `finish`.
    fn stream(tool_output: Option<ToolOutput>, pieces: &[&str], finish: FinishReason) -> Vec<(String, Value)> {
        stream_with(tool_output, None, pieces, finish)
    }

    fn stream_with(
        tool_output: Option<ToolOutput>,
        reasoning: Option<ReasoningParser>,
        pieces: &[&str],
        finish: FinishReason,
    ) -> Vec<(String, Value)> {
        let p = parse_params(&Fields(&Map::new()), Api::Chat, 100, &Default::default()).unwrap();
        let job = Job {
            api: Api::Chat,
            prompts: vec![vec![1, 2, 3]],
            p,
            multi: false,
            echo_texts: vec![],
            guide: None,
            tool_output,
            reasoning,
        };
        let mut s = MessageStream::new(&job, "msg_x".into(), "m".into());
        let mut out = s.head();
        for (i, t) in pieces.iter().enumerate() {
            let last = i + 1 == pieces.len();
            let d = CompletionDelta {
                index: 0,
                text: t.to_string(),
                token_ids: vec![],
                logprobs: vec![],
                prompt_logprobs: None,
                finish: last.then(|| finish.clone()),
                stop_string: None,
            };
            s.delta_events(&mut out, &d);
        }
        s.end_events(&mut out, pieces.len());
        out.trim_end()
            .split("\n\n")
            .map(|e| {
                let (name, data) = e.split_once('\n').unwrap();
                (
                    name.trim_start_matches("event: ").to_string(),
                    serde_json::from_str(data.trim_start_matches("data: ")).unwrap(),
                )
            })
            .filter(|(n, _)| n != "ping")
            .collect()
    }

    fn texts(ev: &[(String, Value)]) -> Vec<String> {
        ev.iter()
            .filter(|(_, d)| d["delta"]["type"] == "text_delta")
            .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn hermes_calls_stream_their_content_then_their_input() {
        let pieces =
            ["Sure.", "\n<tool", "_call>{\"name\": \"get\", ", "\"arguments\": {\"city\": \"Oslo\"}}</tool_call>"];
        let ev = stream(Some(ToolOutput::Auto(ToolParser::Hermes)), &pieces, FinishReason::Stop);
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(texts(&ev), ["Sure.", "\n"], "the content streams; the tag's start is held until it is known");
        let tool = &ev[5].1["content_block"];
        assert_eq!(
            (tool["type"].as_str(), tool["name"].as_str(), ev[5].1["index"].as_u64()),
            (Some("tool_use"), Some("get"), Some(1))
        );
        assert_eq!(
            ev[6].1["delta"],
            json!({"type": "input_json_delta", "partial_json": "{\"city\": \"Oslo\"}"}),
            "the input as sampled"
        );
        assert_eq!(ev[8].1["delta"]["stop_reason"], "tool_use");

        // A `<tool` that grows into something else, and markup that does not parse: all text.
        let ev = stream(
            Some(ToolOutput::Auto(ToolParser::Hermes)),
            &["a <tool", "s> b", " <tool_call>{broken"],
            FinishReason::Length,
        );
        assert_eq!(texts(&ev).concat(), "a <tools> b <tool_call>{broken");
        assert_eq!(texts(&ev)[..2], ["a ", "<tools> b"], "held only while it may be the tag");
        assert_eq!(ev.last().map(|(n, _)| n.as_str()), Some("message_stop"));
        assert_eq!(ev[ev.len() - 2].1["delta"]["stop_reason"], "max_tokens");
    }

    /// "any": each call a `tool_use` block whose input streams as sampled, in pieces.
    #[test]
    fn any_calls_stream_their_input() {
        let pieces = [
            "[{\"name\": \"get\", \"para",
            "meters\": {\"city\"",
            ": \"Oslo\"}}, {\"name\": \"now\", \"parameters\": {}}]",
        ];
        let ev = stream(Some(ToolOutput::Required), &pieces, FinishReason::Stop);
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        let input = |i: u64| -> String {
            ev.iter()
                .filter(|(_, d)| d["index"] == i && d["delta"]["type"] == "input_json_delta")
                .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap())
                .collect()
        };
        assert_eq!((input(0), input(1)), ("{\"city\": \"Oslo\"}".to_string(), "{}".to_string()));
        assert_eq!(
            (ev[1].1["content_block"]["name"].as_str(), ev[5].1["content_block"]["name"].as_str()),
            (Some("get"), Some("now"))
        );
        assert_eq!(ev[8].1["delta"]["stop_reason"], "tool_use");
        // Cut: the call begun is a block with partial input, stop_reason max_tokens.
        let ev = stream(Some(ToolOutput::Required), &pieces[..2], FinishReason::Length);
        assert_eq!(ev[ev.len() - 2].1["delta"]["stop_reason"], "max_tokens");
        assert_eq!(ev.iter().filter(|(n, _)| n == "content_block_start").count(), 1);
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

    #[test]
    fn thinking_streams_as_its_own_block() {
        let pieces = [
            "<thi",
            "nk>\nOslo is in",
            " Norway.\n</thi",
            "nk>\n\n<tool_call>{\"name\": \"get\", \"arguments\": {}}</tool_call>",
        ];
        let ev = stream_with(
            Some(ToolOutput::Auto(ToolParser::Hermes)),
            Some(ReasoningParser::Qwen3),
            &pieces,
            FinishReason::Stop,
        );
        let starts: Vec<(u64, &str)> = ev
            .iter()
            .filter(|(n, _)| n == "content_block_start")
            .map(|(_, d)| (d["index"].as_u64().unwrap(), d["content_block"]["type"].as_str().unwrap()))
            .collect();
        assert_eq!(starts, [(0, "thinking"), (1, "tool_use")], "the blank after </think> is no text block");
        let thinking: String = ev
            .iter()
            .filter(|(_, d)| d["delta"]["type"] == "thinking_delta")
            .map(|(_, d)| d["delta"]["thinking"].as_str().unwrap())
            .collect();
        assert_eq!(thinking, "\nOslo is in Norway.\n");
        assert!(ev
            .iter()
            .all(|(n, d)| n != "content_block_delta" || d["index"] == 0 || d["delta"]["type"] != "thinking_delta"));
        assert_eq!(ev[ev.len() - 2].1["delta"]["stop_reason"], "tool_use");
        // An answer that is all thinking (cut short): one thinking block, closed.
        let ev = stream_with(None, Some(ReasoningParser::DeepSeekR1), &["Hmm, ", "let me"], FinishReason::Length);
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
    }

    #[test]
    fn plain_and_forced_streams() {
        let ev = stream(None, &["Hel", "lo"], FinishReason::Stop);
        assert_eq!(texts(&ev), ["Hel", "lo"]);
        assert_eq!(
            ev[ev.len() - 2].1,
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 2}})
        );
        let ev = stream(Some(ToolOutput::Named("get".into())), &["{\"a\"", ": 1}"], FinishReason::Stop);
        let json: String = ev.iter().filter_map(|(_, d)| d["delta"]["partial_json"].as_str()).collect();
        assert_eq!((json.as_str(), ev[1].1["content_block"]["name"].as_str()), ("{\"a\": 1}", Some("get")));
        assert_eq!(ev[ev.len() - 2].1["delta"]["stop_reason"], "tool_use");
        let ev = stream(None, &["x"], FinishReason::Error("boom".into()));
        assert_eq!(ev.last().unwrap().0, "error", "an engine failure ends the stream with an error event");
        assert_eq!(ev.last().unwrap().1["error"]["type"], "api_error");
    }

    #[test]
    fn errors_take_anthropics_shape() {
        let e = error_body(&ApiError::invalid("max_tokens", "`max_tokens` is required"));
        assert_eq!(
            e,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "`max_tokens` is required"}})
        );
        assert_eq!(error_body(&ApiError::unauthorized())["error"]["type"], "authentication_error");
        assert_eq!(error_body(&ApiError::unknown_model("x", "y"))["error"]["type"], "not_found_error");
        assert_eq!(error_body(&ApiError::overloaded(1, 1))["error"]["type"], "rate_limit_error");
        assert_eq!(error_body(&ApiError::internal("boom"))["error"]["type"], "api_error");
    }
}
