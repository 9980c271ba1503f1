//! The Responses API's event stream: its semantic events, each with its `sequence_number`.

use std::sync::Arc;

use serde_json::{json, Value};

use super::items::{assistant_message, message_item, output_text, reasoning_item, status_of, usage, Envelope};
use crate::answer::{AnswerReader, Event};
use crate::body::EventFormat;
use crate::engine_client::{CompletionDelta, EngineUpdate, FinishReason};
use crate::job::{Job, ToolOutput};
use crate::run::Run;
use crate::state::AppState;
use crate::structured::{self, ToolCall};
use crate::wire::common::new_id;

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
    /// The answer's reader: thinking, text and calls as they come.
    reader: AnswerReader,
    seq: u64,
    /// Finished items, in output order; the open one, its text.
    items: Vec<Value>,
    open: Option<(Open, Value, String)>,
    finish: Option<FinishReason>,
    failed: bool,
}

impl ResponseStream {
    pub(super) fn new(state: Arc<AppState>, job: &Job, env: Envelope, messages: Option<Vec<Value>>) -> Self {
        ResponseStream {
            state,
            env,
            messages,
            tool_output: job.tool_output.clone(),
            reader: AnswerReader::new(job),
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
        for e in self.reader.push(&d.text, done) {
            match e {
                Event::Thinking(t) => self.text(out, Open::Reasoning, &t),
                Event::Text(t) => self.text(out, Open::Message, &t),
                Event::CallStart { name, .. } => self.start_call(out, &name),
                Event::CallArgs { piece, .. } => self.call_args(out, &piece),
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
        let end = self.reader.finish(finish.as_str());
        if matches!(self.tool_output, Some(ToolOutput::Auto(_))) {
            if end.calls.is_empty() && end.streamed == 0 {
                self.text(out, Open::Message, &end.text[end.sent..]);
            } else {
                self.close_item(out, item_status);
                // Calls the stream did not follow (a format sent whole, or more than it saw).
                for c in end.calls.iter().skip(end.streamed) {
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
