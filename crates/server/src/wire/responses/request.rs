//! A Responses request read into the chat path's pieces: the conversation (a stored response's,
//! then `input`), tools and namespaces, the text format, the sampling fields; and what the
//! response object repeats of the request.

use std::collections::HashMap;

use serde_json::{json, Map, Value};
use tandem_structured::GuideSpec;

use super::items::arguments_value;
use crate::error::ApiError;
use crate::fields::{unsupported, wrong_type, Fields};
use crate::job::Job;
use crate::params::{parse_params, Api};
use crate::state::AppState;
use crate::structured::{self, GuideRequest, Tools};
use crate::wire::common::{check_served, parse_json};

/// Fields whose meaning is not served: refused when set, rather than silently ignored.
fn refuse_unsupported(f: &Fields) -> Result<(), ApiError> {
    let set = |name: &str| f.get(name).is_some_and(|v| !v.is_null() && v != &Value::Bool(false));
    if set("background") {
        return Err(unsupported("background", "background responses are"));
    }
    for name in ["conversation", "prompt", "max_tool_calls"] {
        if set(name) {
            return Err(unsupported(name, "it is"));
        }
    }
    if f.str("truncation")?.is_some_and(|t| t != "disabled") {
        return Err(unsupported("truncation", "\"auto\" truncation is"));
    }
    if f.i64("top_logprobs")?.is_some_and(|n| n > 0) {
        return Err(unsupported("top_logprobs", "logprobs are"));
    }
    if let Some(v) = f.get("include").filter(|v| !v.is_null()) {
        let Value::Array(a) = v else { return Err(wrong_type("include", "a list of strings", v)) };
        if let Some((i, x)) = a.iter().enumerate().find(|(_, x)| !x.is_string()) {
            return Err(wrong_type(&format!("include[{i}]"), "a string", x));
        }
    }
    for name in ["metadata", "reasoning", "text", "stream_options"] {
        if let Some(v) = f.get(name).filter(|v| !v.is_object() && !v.is_null()) {
            return Err(wrong_type(name, "an object", v));
        }
    }
    Ok(())
}

/// The text of a content list (or string); `what` names the item kind for errors.
fn text_of(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                let pp = format!("{param}[{j}]");
                let Some(o) = p.as_object() else { return Err(wrong_type(&pp, "an object", p)) };
                match o.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text" | "summary_text" | "reasoning_text") => {
                        match o.get("text") {
                            Some(Value::String(t)) => text.push_str(t),
                            _ => {
                                return Err(ApiError::invalid(
                                    &format!("{pp}.text"),
                                    format!("`{pp}.text` must be a string"),
                                ))
                            }
                        }
                    }
                    Some("refusal") => match o.get("refusal") {
                        Some(Value::String(t)) => text.push_str(t),
                        _ => {
                            return Err(ApiError::invalid(
                                &format!("{pp}.refusal"),
                                format!("`{pp}.refusal` must be a string"),
                            ))
                        }
                    },
                    Some(other) => return Err(unsupported(&format!("{pp}.type"), &format!("{other:?} content is"))),
                    None => return Err(ApiError::invalid(&format!("{pp}.type"), format!("`{pp}.type` is required"))),
                }
            }
            Ok(text)
        }
        other => Err(wrong_type(param, "a string or a list of content parts", other)),
    }
}

/// `input` as template messages: consecutive `function_call` items (and the assistant message
/// before them) make one assistant turn.
fn input_messages(v: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let items = match v {
        None => return Err(ApiError::invalid("input", "`input` is required")),
        Some(Value::String(s)) => return Ok(vec![json!({"role": "user", "content": s})]),
        Some(Value::Array(a)) => a,
        Some(v) => return Err(wrong_type("input", "a string or a list of input items", v)),
    };
    let mut out: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let p = format!("input[{i}]");
        let Some(o) = item.as_object() else { return Err(wrong_type(&p, "an object", item)) };
        let kind = match o.get("type") {
            None | Some(Value::Null) => "message",
            Some(Value::String(t)) => t.as_str(),
            Some(v) => return Err(wrong_type(&format!("{p}.type"), "a string", v)),
        };
        let field = |name: &str| o.get(name).filter(|v| !v.is_null());
        match kind {
            "message" => {
                let role = match field("role").and_then(Value::as_str) {
                    Some(r @ ("user" | "assistant" | "system")) => r,
                    Some("developer") => "system",
                    _ => {
                        return Err(ApiError::invalid(
                            &format!("{p}.role"),
                            format!("`{p}.role` must be \"user\", \"assistant\", \"system\" or \"developer\""),
                        ))
                    }
                };
                let content = match field("content") {
                    Some(c) => text_of(c, &format!("{p}.content"))?,
                    None => {
                        return Err(ApiError::invalid(&format!("{p}.content"), format!("`{p}.content` is required")))
                    }
                };
                out.push(json!({"role": role, "content": content}));
            }
            "function_call" => {
                let (Some(Value::String(call_id)), Some(Value::String(name))) = (field("call_id"), field("name"))
                else {
                    return Err(ApiError::invalid(&p, format!("`{p}` needs a string `call_id` and `name`")));
                };
                let args = match field("arguments") {
                    None => "{}".to_string(),
                    Some(Value::String(a)) => a.clone(),
                    Some(v) => return Err(wrong_type(&format!("{p}.arguments"), "a JSON string", v)),
                };
                let call = json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments_value(&args)}});
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                            Some(calls) => calls.push(call),
                            None => last["tool_calls"] = json!([call]),
                        }
                    }
                    _ => out.push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
                }
            }
            "function_call_output" => {
                let Some(Value::String(call_id)) = field("call_id") else {
                    return Err(ApiError::invalid(&format!("{p}.call_id"), format!("`{p}.call_id` must be a string")));
                };
                let output = match field("output") {
                    None => String::new(),
                    Some(v) => text_of(v, &format!("{p}.output"))?,
                };
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            // Earlier turns' thinking leaves the context, as chat templates drop it.
            "reasoning" => {}
            other => return Err(unsupported(&format!("{p}.type"), &format!("{other:?} items are"))),
        }
    }
    if out.is_empty() {
        return Err(ApiError::invalid("input", "`input` holds no message"));
    }
    Ok(out)
}

/// `tools` (Responses' flat function tools, and `namespace` tools grouping them) and
/// `tool_choice` as the chat path's [`Tools`]; with, per function in a namespace, that namespace
/// (its calls carry it back).
fn tools(f: &Fields) -> Result<(Option<Tools>, HashMap<String, String>), ApiError> {
    let list: &[Value] = match f.get("tools") {
        None | Some(Value::Null) => &[],
        Some(Value::Array(a)) => a,
        Some(v) => return Err(wrong_type("tools", "a list of tools", v)),
    };
    // Namespaces' functions flattened, each with its namespace and its field path for errors.
    let mut flat: Vec<(&Value, String, Option<String>)> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let p = format!("tools[{i}]");
        let Some(o) = t.as_object() else { return Err(wrong_type(&p, "an object", t)) };
        match o.get("type").and_then(Value::as_str) {
            Some("function") => flat.push((t, p, None)),
            Some("namespace") => {
                let Some(Value::String(ns)) = o.get("name") else {
                    return Err(ApiError::invalid(&format!("{p}.name"), format!("`{p}.name` must be a string")));
                };
                let Some(Value::Array(inner)) = o.get("tools") else {
                    return Err(ApiError::invalid(
                        &format!("{p}.tools"),
                        format!("`{p}.tools` must be a list of function tools"),
                    ));
                };
                for (j, t) in inner.iter().enumerate() {
                    flat.push((t, format!("{p}.tools[{j}]"), Some(ns.clone())));
                }
            }
            Some(other) => {
                return Err(unsupported(
                    &format!("{p}.type"),
                    &format!("{other:?} tools are (only \"function\" tools, and namespaces of them, are served)"),
                ))
            }
            None => {
                return Err(ApiError::invalid(&format!("{p}.type"), format!("`{p}.type` is required (\"function\")")))
            }
        }
    }
    let mut chat_tools = Vec::with_capacity(flat.len());
    let mut namespaces = HashMap::new();
    for (t, p, ns) in &flat {
        let Some(o) = t.as_object() else { return Err(wrong_type(p, "an object", t)) };
        if ns.is_some() && o.get("type").and_then(Value::as_str) != Some("function") {
            return Err(unsupported(&format!("{p}.type"), "tools other than functions in a namespace are"));
        }
        if let (Some(ns), Some(Value::String(name))) = (ns, o.get("name")) {
            namespaces.insert(name.clone(), ns.clone());
        }
        let mut func = Map::new();
        for k in ["name", "description", "parameters"] {
            if let Some(v) = o.get(k) {
                func.insert(k.into(), v.clone());
            }
        }
        if let Some(v) = o.get("strict").filter(|v| !v.is_boolean() && !v.is_null()) {
            return Err(wrong_type(&format!("{p}.strict"), "a boolean", v));
        }
        chat_tools.push(json!({"type": "function", "function": func}));
    }
    let choice = match f.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(s @ Value::String(_)) => Some(s.clone()),
        Some(Value::Object(c)) => match c.get("type").and_then(Value::as_str) {
            Some("function") => match c.get("name") {
                Some(Value::String(n)) => Some(json!({"type": "function", "function": {"name": n}})),
                _ => {
                    return Err(ApiError::invalid(
                        "tool_choice.name",
                        "`tool_choice.name` must be a string with `\"type\": \"function\"`",
                    ))
                }
            },
            Some(other) => return Err(unsupported("tool_choice.type", &format!("{other:?} is"))),
            None => return Err(ApiError::invalid("tool_choice.type", "`tool_choice.type` is required")),
        },
        Some(v) => return Err(wrong_type("tool_choice", "a string or an object", v)),
    };
    let mut m = Map::new();
    if !chat_tools.is_empty() {
        m.insert("tools".into(), Value::Array(chat_tools));
    }
    if let Some(c) = choice {
        m.insert("tool_choice".into(), c);
    }
    // The chat path's checks, their field names put back in this API's shape.
    let tools = structured::parse_tools(&Fields(&m)).map_err(|e| {
        // `tools[k]` of the flattened list is the field it came from.
        let k = e
            .param
            .as_deref()
            .and_then(|p| p.strip_prefix("tools["))
            .and_then(|p| p.split(']').next())
            .and_then(|k| k.parse::<usize>().ok());
        let fix = |s: &str| {
            let s = s
                .replace(".function.name", ".name")
                .replace(".function.parameters", ".parameters")
                .replace(".function.description", ".description")
                .replace("tool_choice.function.name", "tool_choice.name");
            match k.and_then(|k| flat.get(k).map(|f| (k, &f.1))) {
                Some((k, p)) => s.replace(&format!("tools[{k}]"), p),
                None => s,
            }
        };
        ApiError { param: e.param.as_deref().map(fix), message: fix(&e.message), ..e }
    })?;
    Ok((tools, namespaces))
}

/// `text.format`: `text` (none), `json_object`, `json_schema` (`name`, `schema`, `strict`).
fn text_format(f: &Fields) -> Result<Option<GuideRequest>, ApiError> {
    let Some(text) = f.object("text")? else { return Ok(None) };
    if let Some(v) = text.get("verbosity").filter(|v| !v.is_string() && !v.is_null()) {
        return Err(wrong_type("text.verbosity", "a string", v));
    }
    let format = match text.get("format") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => Fields(o),
        Some(v) => return Err(wrong_type("text.format", "an object", v)),
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GuideRequest { spec: GuideSpec::JsonObject, param: "text.format".into() })),
        Some("json_schema") => {
            match format.get("name") {
                Some(Value::String(n)) if !n.is_empty() => {}
                Some(v) if !v.is_string() => return Err(wrong_type("text.format.name", "a string", v)),
                _ => {
                    return Err(ApiError::invalid(
                        "text.format.name",
                        "`text.format.name` is required with `\"type\": \"json_schema\"`",
                    ))
                }
            }
            if let Some(v) = format.get("strict").filter(|v| !v.is_boolean() && !v.is_null()) {
                return Err(wrong_type("text.format.strict", "a boolean", v));
            }
            let param = "text.format.schema";
            match format.get("schema") {
                Some(s @ (Value::Object(_) | Value::Bool(_))) => {
                    Ok(Some(GuideRequest { spec: GuideSpec::JsonSchema(s.clone()), param: param.into() }))
                }
                Some(v) => Err(wrong_type(param, "a JSON schema object", v)),
                None => Err(ApiError::invalid(param, format!("`{param}` is required"))),
            }
        }
        Some(other) => Err(ApiError::invalid(
            "text.format.type",
            format!("`text.format.type` must be \"text\", \"json_object\" or \"json_schema\", got {other:?}"),
        )),
        None => Err(ApiError::invalid("text.format.type", "`text.format.type` is required")),
    }
}

/// The sampling fields the Responses API names, and vLLM's extras, through the shared checks.
fn params(state: &AppState, f: &Fields) -> Result<crate::params::ParsedParams, ApiError> {
    let mut m = Map::new();
    for name in [
        "temperature",
        "top_p",
        "stream",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stop_token_ids",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "min_tokens",
        "ignore_eos",
        "priority",
    ] {
        if let Some(v) = f.get(name).filter(|v| !v.is_null()) {
            m.insert(name.into(), v.clone());
        }
    }
    if let Some(v) = f.get("max_output_tokens").filter(|v| !v.is_null()) {
        m.insert("max_tokens".into(), v.clone());
    }
    parse_params(&Fields(&m), Api::Chat, state.config.vocab_size, &state.config.sampling_defaults).map_err(|e| match e
        .param
        .as_deref()
    {
        Some("max_tokens") => ApiError {
            param: Some("max_output_tokens".into()),
            message: e.message.replace("`max_tokens`", "`max_output_tokens`"),
            ..e
        },
        _ => e,
    })
}

/// A parsed request: the chat job, and what the response object repeats and the store keeps.
pub(super) struct Parsed {
    pub(super) job: Job,
    /// The conversation without `instructions` (a follow-up does not inherit them).
    pub(super) messages: Vec<Value>,
    pub(super) store: bool,
    /// The request's own fields the response repeats.
    pub(super) echo: Map<String, Value>,
    /// Per function declared inside a `namespace` tool, that namespace.
    pub(super) namespaces: HashMap<String, String>,
}

pub(super) fn parse(state: &AppState, body: &[u8]) -> Result<Parsed, ApiError> {
    let o = parse_json(body)?;
    let f = Fields(&o);
    let adapter = check_served(&f, state)?;
    refuse_unsupported(&f)?;
    let mut p = params(state, &f)?;
    p.params.adapter = adapter;
    let guide = text_format(&f)?;
    let (tools, namespaces) = tools(&f)?;
    let store = f.bool("store")?.unwrap_or(true);
    let mut messages = match f.str("previous_response_id")? {
        None => Vec::new(),
        Some(id) => match state.responses.get(id) {
            Some(s) => s.messages,
            None => {
                return Err(ApiError {
                    code: Some("previous_response_not_found"),
                    ..ApiError::invalid("previous_response_id", format!("Previous response with id '{id}' not found (never stored, deleted, or evicted by the store's limits)."))
                })
            }
        },
    };
    messages.extend(input_messages(f.get("input"))?);
    let mut msgs = Vec::with_capacity(messages.len() + 1);
    match f.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => msgs.push(json!({"role": "system", "content": s})),
        Some(v) => return Err(wrong_type("instructions", "a string", v)),
    }
    msgs.extend(messages.iter().cloned());
    // `reasoning.effort` "none" (or "minimal") turns a thinking model's thinking off, as the
    // template's `enable_thinking` does.
    let kwargs = match f.object("reasoning")?.and_then(|r| r.get("effort")).and_then(Value::as_str) {
        Some("none" | "minimal") => Some(Map::from_iter([("enable_thinking".to_string(), json!(false))])),
        _ => None,
    };
    let mut job = Job::chat_from(state, p, guide, tools.as_ref(), &msgs, true, kwargs.as_ref()).map_err(|e| match e
        .param
        .as_deref()
    {
        Some("messages") => ApiError { param: Some("input".into()), ..e },
        _ => e,
    })?;
    if let Some(t) = &mut job.tool_parses {
        t.request_type = crate::metrics::ToolRequestType::Responses;
    }
    // The room the context leaves caps `max_output_tokens`; only a prompt that fills it is refused.
    let (ctx, len) = (state.max_model_len(), job.prompts[0].len());
    if len >= ctx {
        return Err(ApiError::invalid("input", format!("the input has {len} tokens, but this model's context length is {ctx} tokens (room is needed for at least one output token)")));
    }
    job.p.max_tokens = Some(job.p.max_tokens.map_or(ctx - len, |m| m.min(ctx - len)));
    let mut echo = Map::new();
    let params = &job.p.params;
    echo.insert("instructions".into(), f.get("instructions").cloned().unwrap_or(Value::Null));
    echo.insert("max_output_tokens".into(), f.get("max_output_tokens").cloned().unwrap_or(Value::Null));
    echo.insert("metadata".into(), f.get("metadata").cloned().filter(|v| !v.is_null()).unwrap_or(json!({})));
    echo.insert("parallel_tool_calls".into(), json!(f.bool("parallel_tool_calls")?.unwrap_or(true)));
    echo.insert("previous_response_id".into(), f.get("previous_response_id").cloned().unwrap_or(Value::Null));
    echo.insert(
        "reasoning".into(),
        f.get("reasoning").cloned().filter(|v| !v.is_null()).unwrap_or(json!({"effort": null, "summary": null})),
    );
    echo.insert("store".into(), json!(store));
    echo.insert("temperature".into(), json!(params.sampling.temperature));
    echo.insert(
        "text".into(),
        f.get("text").cloned().filter(|v| !v.is_null()).unwrap_or(json!({"format": {"type": "text"}})),
    );
    echo.insert("tool_choice".into(), f.get("tool_choice").cloned().filter(|v| !v.is_null()).unwrap_or(json!("auto")));
    echo.insert("tools".into(), f.get("tools").cloned().filter(|v| !v.is_null()).unwrap_or(json!([])));
    echo.insert("top_p".into(), json!(params.sampling.top_p));
    echo.insert("truncation".into(), json!("disabled"));
    echo.insert("user".into(), f.get("user").cloned().unwrap_or(Value::Null));
    Ok(Parsed { job, messages, store, echo, namespaces })
}
