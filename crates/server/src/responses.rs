//! OpenAI's Responses API: `POST /v1/responses` (whole, or streamed as its semantic events),
//! `GET` and `DELETE /v1/responses/{id}`, so that the OpenAI Agents SDK and Responses-only
//! coding agents talk to the server unmodified. docs/openai-compat.md has the tables.
//!
//! A request is read into the chat path's own pieces and runs as a chat completion does
//! ([`crate::openai::Job::chat_from`]):
//! - `instructions` is a system message first; `input` a user message (a string) or a list of
//!   items: messages (`role` user, assistant, system or developer; content a string or text
//!   parts), `function_call` items (an assistant's `tool_calls`, arguments as a mapping),
//!   `function_call_output` items (`role: "tool"` messages); earlier `reasoning` items are
//!   dropped, as chat templates drop earlier thinking;
//! - `previous_response_id` puts a stored response's conversation (its input and output, not
//!   its `instructions`) before `input`;
//! - `tools` (type `function`, flat) and `tool_choice` become the chat path's [`Tools`];
//!   `text.format` (`json_schema`, `json_object`) structured output; `max_output_tokens`,
//!   `temperature`, `top_p` and vLLM's extra sampling fields go through the shared checks.
//!
//! The answer is output items: a `reasoning` item (with `--reasoning-parser`), a `message` with
//! `output_text`, and `function_call` items. `max_output_tokens` cut: status `incomplete`.
//! Streamed ([`ResponseStream`]) as `response.created`, `response.in_progress`, per item
//! `response.output_item.added`, its parts and deltas, `response.output_item.done`, then
//! `response.completed` (or `response.incomplete`, or `response.failed` on an engine failure),
//! every event with its `sequence_number`.
//!
//! `store` (default true) keeps the response in a bounded in-memory [`ResponseStore`] (a count,
//! a byte and an age limit; evictions counted in /metrics) for `GET`, `DELETE` and
//! `previous_response_id`. Errors are OpenAI's shape; fields whose meaning is not served
//! (`background`, `conversation`, `prompt`, built-in tools, image and file inputs, ...) are
//! 400s naming them.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Map, Value};
use tandem_structured::GuideSpec;

use crate::body::{EventFormat, ResponseBody};
use crate::engine_client::{CompletionDelta, EngineUpdate, FinishReason};
use crate::error::ApiError;
use crate::openai::{check_served, collect, parse_json, tool_message, Job, ToolOutput};
use crate::params::{parse_params, type_name, Api, Fields};
use crate::reasoning::ReasoningStream;
use crate::router::{compiled, json_response, ready, sse_response, tokenizer_call, X_REQUEST_ID};
use crate::run::Run;
use crate::server::AppState;
use crate::structured::{self, GuideRequest, ToolCall, Tools};
use crate::tool_stream::{AutoCalls, CallEvent, CallStream};

// ---------------------------------------------------------------------------------------------
// The store

/// A stored response: the object `GET` answers, and the conversation a follow-up continues.
#[derive(Debug, Clone)]
struct Stored {
    at: Instant,
    /// Bytes it holds, roughly (its JSON's length), for the store's byte bound.
    size: usize,
    response: Value,
    /// Template messages: the input (after any previous response's) and the answer.
    messages: Vec<Value>,
}

/// Stored responses, bounded by count, by bytes and by age: the oldest go first when it is
/// full, and any older than the age limit go when next looked at. Evictions are counted.
pub struct ResponseStore {
    max: usize,
    max_bytes: usize,
    ttl: Duration,
    inner: Mutex<StoreInner>,
    evicted: AtomicU64,
}

#[derive(Default)]
struct StoreInner {
    map: HashMap<String, Stored>,
    bytes: usize,
    /// Insertion order; an id deleted since (or replaced) is skipped when it comes up.
    order: VecDeque<(Instant, String)>,
}

impl ResponseStore {
    pub fn new(max: usize, max_bytes: usize, ttl: Duration) -> Self {
        ResponseStore { max, max_bytes, ttl, inner: Mutex::new(StoreInner::default()), evicted: AtomicU64::new(0) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StoreInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops what is past its age, then the oldest while more than `keep` remain or more than
    /// `keep_bytes` are held.
    fn evict(&self, s: &mut StoreInner, now: Instant, keep: usize, keep_bytes: usize) {
        while let Some((at, id)) = s.order.front().cloned() {
            let live = s.map.get(&id).is_some_and(|e| e.at == at);
            if !live {
                s.order.pop_front();
                continue;
            }
            if now.duration_since(at) <= self.ttl && s.map.len() <= keep && s.bytes <= keep_bytes {
                break;
            }
            s.order.pop_front();
            if let Some(e) = s.map.remove(&id) {
                s.bytes -= e.size;
            }
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn insert(&self, id: String, response: Value, messages: Vec<Value>) {
        let size = response.to_string().len() + messages.iter().map(|m| m.to_string().len()).sum::<usize>();
        if self.max == 0 || size > self.max_bytes {
            if self.max > 0 {
                self.evicted.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        let now = Instant::now();
        let mut s = self.lock();
        self.evict(&mut s, now, self.max - 1, self.max_bytes - size);
        s.order.push_back((now, id.clone()));
        s.bytes += size;
        if let Some(old) = s.map.insert(id, Stored { at: now, size, response, messages }) {
            s.bytes -= old.size;
        }
    }

    fn get(&self, id: &str) -> Option<Stored> {
        let mut s = self.lock();
        self.evict(&mut s, Instant::now(), self.max, self.max_bytes);
        s.map.get(id).cloned()
    }

    fn remove(&self, id: &str) -> bool {
        let mut s = self.lock();
        self.evict(&mut s, Instant::now(), self.max, self.max_bytes);
        match s.map.remove(id) {
            Some(e) => {
                s.bytes -= e.size;
                true
            }
            None => false,
        }
    }

    /// The store's series in the Prometheus text format.
    pub fn render(&self, model: &str) -> String {
        let (len, bytes) = {
            let s = self.lock();
            (s.map.len(), s.bytes)
        };
        // The labels every other series carries (vLLM's: the model name and engine 0).
        let label = format!("{{model_name=\"{}\",engine=\"0\"}}", model.replace('\\', "\\\\").replace('"', "\\\""));
        format!(
            "# HELP tandem:responses_stored Responses held for previous_response_id and GET /v1/responses/{{id}}.\n# TYPE tandem:responses_stored gauge\ntandem:responses_stored{label} {len}\n\
             # HELP tandem:responses_stored_bytes The stored responses' size (their JSON's length).\n# TYPE tandem:responses_stored_bytes gauge\ntandem:responses_stored_bytes{label} {bytes}\n\
             # HELP tandem:responses_evicted_total Stored responses dropped for the store's size or age limit.\n# TYPE tandem:responses_evicted_total counter\ntandem:responses_evicted_total{label} {}\n",
            self.evicted.load(Ordering::Relaxed)
        )
    }
}

// ---------------------------------------------------------------------------------------------
// The request

fn wrong_type(param: &str, want: &str, got: &Value) -> ApiError {
    ApiError::invalid(param, format!("`{param}` must be {want}, got {}", type_name(got)))
}

fn unsupported(param: &str, what: &str) -> ApiError {
    ApiError::invalid(param, format!("`{param}`: {what} not supported by this server"))
}

/// A 404 in OpenAI's words for a response id it does not know.
fn no_such_response(id: &str) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("Response with id '{id}' not found."),
        kind: "invalid_request_error",
        param: None,
        code: None,
        status_code: false,
        retry_after: None,
    }
}

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

/// A call's arguments as the template reads them: the JSON string as a mapping when it is
/// an object, else as given.
fn arguments_value(args: &str) -> Value {
    match serde_json::from_str::<Value>(args) {
        Ok(v @ Value::Object(_)) => v,
        _ => Value::String(args.to_string()),
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
struct Parsed {
    job: Job,
    /// The conversation without `instructions` (a follow-up does not inherit them).
    messages: Vec<Value>,
    store: bool,
    /// The request's own fields the response repeats.
    echo: Map<String, Value>,
    /// Per function declared inside a `namespace` tool, that namespace.
    namespaces: HashMap<String, String>,
}

fn parse(state: &AppState, body: &[u8]) -> Result<Parsed, ApiError> {
    let o = parse_json(body)?;
    let f = Fields(&o);
    check_served(&f, state)?;
    refuse_unsupported(&f)?;
    let p = params(state, &f)?;
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
    echo.insert("temperature".into(), json!(params.temperature));
    echo.insert(
        "text".into(),
        f.get("text").cloned().filter(|v| !v.is_null()).unwrap_or(json!({"format": {"type": "text"}})),
    );
    echo.insert("tool_choice".into(), f.get("tool_choice").cloned().filter(|v| !v.is_null()).unwrap_or(json!("auto")));
    echo.insert("tools".into(), f.get("tools").cloned().filter(|v| !v.is_null()).unwrap_or(json!([])));
    echo.insert("top_p".into(), json!(params.top_p));
    echo.insert("truncation".into(), json!("disabled"));
    echo.insert("user".into(), f.get("user").cloned().unwrap_or(Value::Null));
    Ok(Parsed { job, messages, store, echo, namespaces })
}

// ---------------------------------------------------------------------------------------------
// The answer

/// `prefix` and 24 random hex digits.
fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", structured::tool_call_id().trim_start_matches("call_"))
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": [output_text(text)]})
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments, "status": status})
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [], "content": [{"type": "reasoning_text", "text": text}], "status": status})
}

/// Status and `incomplete_details` for how generation ended.
fn status_of(finish: &FinishReason) -> (&'static str, Value) {
    match finish {
        FinishReason::Length => ("incomplete", json!({"reason": "max_output_tokens"})),
        // Past the server's request timeout.
        FinishReason::Abort => ("incomplete", json!({"reason": null})),
        FinishReason::Error(_) => ("failed", Value::Null),
        FinishReason::Stop => ("completed", Value::Null),
    }
}

/// The items of a whole answer.
fn output_items(env: &Envelope, job: &Job, text: &str, finish: &FinishReason) -> Vec<Value> {
    let (reasoning, text) = match job.reasoning {
        Some(r) => r.split(text),
        None => (None, text.to_string()),
    };
    let item_status = if matches!(finish, FinishReason::Stop) { "completed" } else { "incomplete" };
    let mut items = Vec::new();
    if let Some(r) = reasoning {
        items.push(reasoning_item(&new_id("rs_"), &r, item_status));
    }
    let (content, calls, _) = tool_message(job.tool_output.as_ref(), &text, finish.as_str());
    // An empty answer is still a message; empty text beside reasoning or calls is none.
    let nothing_else = calls.is_empty() && items.is_empty();
    if let Some(c) = content.filter(|c| !c.is_empty() || nothing_else) {
        items.push(message_item(&new_id("msg_"), &c, item_status));
    }
    for c in &calls {
        let complete = matches!(finish, FinishReason::Stop) && serde_json::from_str::<Value>(&c.arguments).is_ok();
        items.push(env.call_item(
            &new_id("fc_"),
            &structured::tool_call_id(),
            &c.name,
            &c.arguments,
            if complete { "completed" } else { "incomplete" },
        ));
    }
    items
}

/// The assistant's turn of the output items, as the template reads it (for the store).
fn assistant_message(items: &[Value]) -> Value {
    let mut text = String::new();
    let mut calls = Vec::new();
    for it in items {
        match it["type"].as_str() {
            Some("message") => text.push_str(it["content"][0]["text"].as_str().unwrap_or_default()),
            Some("function_call") => calls.push(json!({"id": it["call_id"], "type": "function", "function": {"name": it["name"], "arguments": arguments_value(it["arguments"].as_str().unwrap_or_default())}})),
            _ => {}
        }
    }
    let mut m = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(calls);
    }
    m
}

/// What the response object says besides its output.
#[derive(Clone)]
struct Envelope {
    id: String,
    created: u64,
    model: String,
    echo: Map<String, Value>,
    namespaces: HashMap<String, String>,
}

impl Envelope {
    /// A function_call item, with its function's namespace when it has one.
    fn call_item(&self, id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
        let mut v = call_item(id, call_id, name, arguments, status);
        if let Some(ns) = self.namespaces.get(name) {
            v["namespace"] = json!(ns);
        }
        v
    }

    fn object(&self, status: &str, output: Vec<Value>, incomplete: Value, usage: Value, error: Value) -> Value {
        let mut v = json!({"id": self.id, "object": "response", "created_at": self.created, "status": status, "background": false, "error": error,
                           "incomplete_details": incomplete, "model": self.model, "output": output, "usage": usage});
        if let Value::Object(o) = &mut v {
            for (k, x) in &self.echo {
                o.insert(k.clone(), x.clone());
            }
        }
        v
    }
}

fn usage(state: &AppState, run: &Run, items: &[Value]) -> Value {
    let reasoning: usize = items
        .iter()
        .filter(|i| i["type"] == "reasoning")
        .map(|i| {
            state.tokenizer.encode(i["content"][0]["text"].as_str().unwrap_or_default(), false).map_or(0, |t| t.len())
        })
        .sum();
    json!({"input_tokens": run.prompt_tokens, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": run.completion_tokens,
           "output_tokens_details": {"reasoning_tokens": reasoning.min(run.completion_tokens)}, "total_tokens": run.prompt_tokens + run.completion_tokens})
}

/// `POST /v1/responses`.
pub async fn create(
    state: &Arc<AppState>,
    req: Request<Incoming>,
    start: Instant,
) -> Result<Response<ResponseBody>, ApiError> {
    ready(state)?;
    let parsed = tokenizer_call(state, req, parse).await?;
    let Parsed { job, messages, store, echo, namespaces } = parsed;
    let job = compiled(state, job).await?;
    let reqs = job.requests(state)?;
    let env = Envelope { id: new_id("resp_"), created: now_secs(), model: state.model_name.clone(), echo, namespaces };
    let mut run = Run::start(state.clone(), reqs, "input", env.id.clone(), start)?;
    let request_id = hyper::header::HeaderValue::from_str(&env.id)
        .map_err(|e| ApiError::internal(format!("bad response id: {e}")))?;
    let mut r = if job.p.stream {
        sse_response(run, Box::new(ResponseStream::new(state.clone(), &job, env, store.then_some(messages))))
    } else {
        // If the client leaves, hyper drops this future, and with it `run`, which aborts.
        let c = collect(&mut run).await?.pop().unwrap_or_default();
        let finish = c.finish.unwrap_or(FinishReason::Stop);
        let items = output_items(&env, &job, &c.text, &finish);
        let (status, incomplete) = status_of(&finish);
        let v = env.object(status, items.clone(), incomplete, usage(state, &run, &items), Value::Null);
        if store {
            let mut messages = messages;
            messages.push(assistant_message(&items));
            state.responses.insert(env.id.clone(), v.clone(), messages);
        }
        json_response(StatusCode::OK, &v)
    };
    r.headers_mut().insert(X_REQUEST_ID, request_id);
    Ok(r)
}

/// `GET` or `DELETE /v1/responses/{id}`.
pub fn by_id(state: &AppState, method: &Method, id: &str) -> Result<Response<ResponseBody>, ApiError> {
    match *method {
        Method::GET => match state.responses.get(id) {
            Some(s) => Ok(json_response(StatusCode::OK, &s.response)),
            None => Err(no_such_response(id)),
        },
        Method::DELETE if state.responses.remove(id) => {
            Ok(json_response(StatusCode::OK, &json!({"id": id, "object": "response", "deleted": true})))
        }
        Method::DELETE => Err(no_such_response(id)),
        _ => Err(ApiError::method_not_allowed(method.as_str(), &format!("/v1/responses/{id}"), "GET or DELETE")),
    }
}

// ---------------------------------------------------------------------------------------------
// The stream

/// How the answer's text (after any reasoning) is read as it streams.
enum Mode {
    /// Plain text: one message item.
    Text,
    /// A forced call: function_call items whose arguments stream as sampled.
    Forced(CallStream),
    /// "auto" with a tool parser: text streams until the markup may begin; from where the
    /// calls' JSON surely begins they stream as forced ones do; at the end the rest is calls
    /// (items, for a format not streamed) or more text.
    Auto(AutoCalls),
}

/// The kind of the open item and its accumulated text.
#[derive(PartialEq)]
enum Open {
    Reasoning,
    Message,
    Call,
}

/// The Responses API's event stream.
pub struct ResponseStream {
    state: Arc<AppState>,
    env: Envelope,
    /// The conversation to store with the answer (`store`), else None.
    messages: Option<Vec<Value>>,
    tool_output: Option<ToolOutput>,
    mode: Mode,
    reasoning: Option<ReasoningStream>,
    seq: u64,
    /// Finished items, in output order; the open one, its text.
    items: Vec<Value>,
    open: Option<(Open, Value, String)>,
    finish: Option<FinishReason>,
    failed: bool,
}

impl ResponseStream {
    fn new(state: Arc<AppState>, job: &Job, env: Envelope, messages: Option<Vec<Value>>) -> Self {
        let mode = match &job.tool_output {
            Some(ToolOutput::Named(n)) => Mode::Forced(CallStream::new(Some(n.clone()))),
            Some(ToolOutput::Required) => Mode::Forced(CallStream::new(None)),
            Some(ToolOutput::Auto(p)) => Mode::Auto(AutoCalls::new(*p)),
            None => Mode::Text,
        };
        ResponseStream {
            state,
            env,
            messages,
            tool_output: job.tool_output.clone(),
            mode,
            reasoning: job.reasoning.map(ReasoningStream::new),
            seq: 0,
            items: Vec::new(),
            open: None,
            finish: None,
            failed: false,
        }
    }

    fn event(&mut self, out: &mut String, kind: &str, mut v: Value) {
        v["type"] = json!(kind);
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        use std::fmt::Write;
        let _ = write!(out, "event: {kind}\ndata: {v}\n\n");
    }

    fn output_index(&self) -> usize {
        self.items.len()
    }

    /// Opens an item of `kind` (closing the open one), announcing it and its first part.
    fn open_item(&mut self, out: &mut String, kind: Open, item: Value) {
        self.close_item(out, "completed");
        let index = self.output_index();
        let id = item["id"].clone();
        self.event(out, "response.output_item.added", json!({"output_index": index, "item": item}));
        let part = match kind {
            Open::Message => Some(json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []})),
            Open::Reasoning => Some(json!({"type": "reasoning_text", "text": ""})),
            Open::Call => None,
        };
        if let Some(part) = part {
            self.event(
                out,
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
            );
        }
        self.open = Some((kind, item, String::new()));
    }

    /// Text into the open item of `kind`, opened first when another (or none) is open.
    fn text(&mut self, out: &mut String, kind: Open, piece: &str) {
        if piece.is_empty() {
            return;
        }
        if self.open.as_ref().map(|(k, _, _)| k) != Some(&kind) {
            let item = match kind {
                Open::Message => {
                    json!({"type": "message", "id": new_id("msg_"), "status": "in_progress", "role": "assistant", "content": []})
                }
                _ => {
                    json!({"type": "reasoning", "id": new_id("rs_"), "summary": [], "content": [], "status": "in_progress"})
                }
            };
            self.open_item(out, kind, item);
        }
        let index = self.output_index();
        let Some((kind, item, text)) = self.open.as_mut() else { return };
        text.push_str(piece);
        let id = item["id"].clone();
        let name = if *kind == Open::Message { "response.output_text.delta" } else { "response.reasoning_text.delta" };
        let mut v = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": piece});
        if name == "response.output_text.delta" {
            v["logprobs"] = json!([]);
        }
        self.event(out, name, v);
    }

    fn start_call(&mut self, out: &mut String, name: &str) {
        let item = self.env.call_item(&new_id("fc_"), &structured::tool_call_id(), name, "", "in_progress");
        self.open_item(out, Open::Call, item);
    }

    fn call_args(&mut self, out: &mut String, piece: &str) {
        let index = self.output_index();
        let Some((Open::Call, item, text)) = self.open.as_mut() else { return };
        text.push_str(piece);
        let id = item["id"].clone();
        self.event(
            out,
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": piece}),
        );
    }

    /// Closes the open item: its done events, and its final form kept for the response.
    fn close_item(&mut self, out: &mut String, status: &str) {
        let Some((kind, item, text)) = self.open.take() else { return };
        let index = self.output_index();
        let id = item["id"].as_str().unwrap_or_default().to_string();
        let done = match kind {
            Open::Message => {
                self.event(
                    out,
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
                );
                self.event(
                    out,
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": output_text(&text)}),
                );
                message_item(&id, &text, status)
            }
            Open::Reasoning => {
                self.event(
                    out,
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                );
                self.event(out, "response.content_part.done", json!({"item_id": id, "output_index": index, "content_index": 0, "part": {"type": "reasoning_text", "text": text}}));
                reasoning_item(&id, &text, status)
            }
            Open::Call => {
                let name = item["name"].as_str().unwrap_or_default();
                let complete = status == "completed" && serde_json::from_str::<Value>(&text).is_ok();
                self.event(
                    out,
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "name": name, "arguments": text}),
                );
                self.env.call_item(
                    &id,
                    item["call_id"].as_str().unwrap_or_default(),
                    name,
                    &text,
                    if complete { "completed" } else { "incomplete" },
                )
            }
        };
        self.event(out, "response.output_item.done", json!({"output_index": index, "item": done}));
        self.items.push(done);
    }

    /// A whole item: announced, its content in one delta, closed.
    fn whole_call(&mut self, out: &mut String, call: &ToolCall) {
        self.start_call(out, &call.name);
        self.call_args(out, &call.arguments);
        self.close_item(out, "completed");
    }

    fn delta_events(&mut self, out: &mut String, d: &CompletionDelta) {
        if self.failed {
            return;
        }
        if let Some(FinishReason::Error(e)) = &d.finish {
            self.failed = true;
            self.open = None;
            let error = json!({"code": "server_error", "message": format!("the engine failed this request: {e}")});
            let v = self.env.object("failed", std::mem::take(&mut self.items), Value::Null, Value::Null, error);
            self.event(out, "response.failed", json!({"response": v}));
            return;
        }
        let done = d.finish.is_some();
        let piece = match &mut self.reasoning {
            Some(st) => {
                let (thinking, content) = st.push(&d.text, done);
                self.text(out, Open::Reasoning, &thinking);
                content
            }
            None => d.text.clone(),
        };
        let mut certain = String::new();
        let mut calls = Vec::new();
        match &mut self.mode {
            Mode::Text => certain = piece,
            Mode::Forced(cs) => calls = cs.push(&piece),
            Mode::Auto(auto) => (certain, calls) = auto.push(&piece),
        }
        self.text(out, Open::Message, &certain);
        for e in calls {
            match e {
                CallEvent::Start { name, .. } => self.start_call(out, &name),
                CallEvent::Args { piece, .. } => self.call_args(out, &piece),
            }
        }
        if done {
            self.finish = d.finish.clone();
        }
    }

    fn end_events(&mut self, out: &mut String, run: &Run) {
        if self.failed {
            return;
        }
        let finish = self.finish.clone().unwrap_or(FinishReason::Abort);
        let item_status = if matches!(finish, FinishReason::Stop) { "completed" } else { "incomplete" };
        if let Mode::Auto(auto) = std::mem::replace(&mut self.mode, Mode::Text) {
            let (text, sent, streamed) = (&auto.text, auto.sent, auto.started());
            let (_, calls, _) = tool_message(self.tool_output.as_ref(), text, finish.as_str());
            if calls.is_empty() && streamed == 0 {
                self.text(out, Open::Message, &text[sent..]);
            } else {
                self.close_item(out, item_status);
                // Calls the stream did not follow (a format sent whole, or more than it saw).
                for c in calls.iter().skip(streamed) {
                    self.whole_call(out, c);
                }
            }
        }
        self.close_item(out, item_status);
        let (status, incomplete) = status_of(&finish);
        let items = self.items.clone();
        let v = self.env.object(status, items.clone(), incomplete, usage(&self.state, run, &items), Value::Null);
        if let Some(mut messages) = self.messages.take() {
            messages.push(assistant_message(&items));
            self.state.responses.insert(self.env.id.clone(), v.clone(), messages);
        }
        let kind = if status == "completed" { "response.completed" } else { "response.incomplete" };
        self.event(out, kind, json!({"response": v}));
    }
}

impl EventFormat for ResponseStream {
    fn head(&mut self) -> String {
        let mut out = String::new();
        let v = self.env.object("in_progress", Vec::new(), Value::Null, Value::Null, Value::Null);
        self.event(&mut out, "response.created", json!({"response": v}));
        self.event(&mut out, "response.in_progress", json!({"response": v}));
        out
    }

    fn update(&mut self, out: &mut String, _run: &Run, _prompt: usize, upd: &EngineUpdate) {
        for d in upd.deltas.iter().filter(|d| d.index == 0) {
            self.delta_events(out, d);
        }
    }

    fn tail(&mut self, out: &mut String, run: &Run) {
        self.end_events(out, run);
    }
}
