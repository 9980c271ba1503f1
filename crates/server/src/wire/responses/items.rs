//! The Responses API's output items (reasoning, message, function calls), the response object
//! around them, its status and usage; and the assistant's turn they make for the store.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use crate::answer::tool_message;
use crate::engine_client::FinishReason;
use crate::job::Job;
use crate::run::Run;
use crate::state::AppState;
use crate::structured;
use crate::wire::common::new_id;

/// A call's arguments as the template reads them: the JSON string as a mapping when it is
/// an object, else as given.
pub(super) fn arguments_value(args: &str) -> Value {
    match serde_json::from_str::<Value>(args) {
        Ok(v @ Value::Object(_)) => v,
        _ => Value::String(args.to_string()),
    }
}

pub(super) fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": [output_text(text)]})
}

pub(super) fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

pub(super) fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments, "status": status})
}

pub(super) fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [], "content": [{"type": "reasoning_text", "text": text}], "status": status})
}

/// Status and `incomplete_details` for how generation ended.
pub(super) fn status_of(finish: &FinishReason) -> (&'static str, Value) {
    match finish {
        FinishReason::Length => ("incomplete", json!({"reason": "max_output_tokens"})),
        // Past the server's request timeout.
        FinishReason::Abort => ("incomplete", json!({"reason": null})),
        FinishReason::Error(_) => ("failed", Value::Null),
        FinishReason::Stop => ("completed", Value::Null),
    }
}

/// The items of a whole answer.
pub(super) fn output_items(env: &Envelope, job: &Job, text: &str, finish: &FinishReason) -> Vec<Value> {
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
    job.count_tool_parse(false, !calls.is_empty());
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
pub(super) fn assistant_message(items: &[Value]) -> Value {
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
pub(super) struct Envelope {
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) model: String,
    pub(super) echo: Map<String, Value>,
    pub(super) namespaces: HashMap<String, String>,
}

impl Envelope {
    /// A function_call item, with its function's namespace when it has one.
    pub(super) fn call_item(&self, id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
        let mut v = call_item(id, call_id, name, arguments, status);
        if let Some(ns) = self.namespaces.get(name) {
            v["namespace"] = json!(ns);
        }
        v
    }

    pub(super) fn object(
        &self,
        status: &str,
        output: Vec<Value>,
        incomplete: Value,
        usage: Value,
        error: Value,
    ) -> Value {
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

pub(super) fn usage(state: &AppState, run: &Run, items: &[Value]) -> Value {
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
