//! OpenAI's Responses API: `POST /v1/responses` (whole, or streamed as its semantic events),
//! `GET` and `DELETE /v1/responses/{id}`, so that the OpenAI Agents SDK and Responses-only
//! coding agents talk to the server unmodified. docs/openai-compat.md has the tables.
//!
//! A request is read into the chat path's own pieces and runs as a chat completion does
//! (`Job::chat_from` in [`crate::job`]):
//! - `instructions` is a system message first; `input` a user message (a string) or a list of
//!   items: messages (`role` user, assistant, system or developer; content a string or text
//!   parts), `function_call` items (an assistant's `tool_calls`, arguments as a mapping),
//!   `function_call_output` items (`role: "tool"` messages); earlier `reasoning` items are
//!   dropped, as chat templates drop earlier thinking;
//! - `previous_response_id` puts a stored response's conversation (its input and output, not
//!   its `instructions`) before `input`;
//! - `tools` (type `function`, flat) and `tool_choice` become the chat path's [`crate::structured::Tools`];
//!   `text.format` (`json_schema`, `json_object`) structured output; `max_output_tokens`,
//!   `temperature`, `top_p` and vLLM's extra sampling fields go through the shared checks.
//!
//! The answer is output items: a `reasoning` item (with `--reasoning-parser`), a `message` with
//! `output_text`, and `function_call` items. `max_output_tokens` cut: status `incomplete`.
//! Streamed (`ResponseStream`) as `response.created`, `response.in_progress`, per item
//! `response.output_item.added`, its parts and deltas, `response.output_item.done`, then
//! `response.completed` (or `response.incomplete`, or `response.failed` on an engine failure),
//! every event with its `sequence_number`.
//!
//! `store` (default true) keeps the response in a bounded in-memory [`crate::response_store::ResponseStore`] (a count,
//! a byte and an age limit; evictions counted in /metrics) for `GET`, `DELETE` and
//! `previous_response_id`. Errors are OpenAI's shape; fields whose meaning is not served
//! (`background`, `conversation`, `prompt`, built-in tools, image and file inputs, ...) are
//! 400s naming them.

mod items;
mod request;
mod stream;

use std::sync::Arc;

use hyper::{Method, Response, StatusCode};
use serde_json::{json, Value};

use crate::body::{EventFormat, ResponseBody};
use crate::engine_client::FinishReason;
use crate::error::ApiError;
use crate::job::Job;
use crate::pipeline::{ChoiceAcc, WireRequest};
use crate::reply::json_response;
use crate::run::Run;
use crate::state::AppState;
use crate::wire::common::{new_id, now_secs};
use items::{assistant_message, output_items, status_of, usage, Envelope};
use request::Parsed;
use stream::ResponseStream;

/// A `POST /v1/responses` request as the pipeline runs it.
pub(crate) struct Create {
    parsed: Parsed,
    /// Named once the job is ready to start.
    env: Option<Envelope>,
}

impl Create {
    pub(crate) fn parse(state: &AppState, body: &[u8]) -> Result<Create, ApiError> {
        Ok(Create { parsed: request::parse(state, body)?, env: None })
    }

    fn parts(self) -> (Parsed, Envelope) {
        let env = self.env.unwrap_or_else(|| Envelope {
            id: String::new(),
            created: 0,
            model: String::new(),
            echo: Default::default(),
            namespaces: Default::default(),
        });
        (self.parsed, env)
    }
}

impl WireRequest for Create {
    fn job(&self) -> &Job {
        &self.parsed.job
    }

    fn job_mut(&mut self) -> &mut Job {
        &mut self.parsed.job
    }

    fn id(&mut self, state: &AppState) -> String {
        let env = Envelope {
            id: new_id("resp_"),
            created: now_secs(),
            model: state.answer_model(self.parsed.job.p.params.adapter),
            echo: std::mem::take(&mut self.parsed.echo),
            namespaces: std::mem::take(&mut self.parsed.namespaces),
        };
        let id = env.id.clone();
        self.env = Some(env);
        id
    }

    fn prompt_param(&self) -> &'static str {
        "input"
    }

    fn stream(self, state: &Arc<AppState>) -> Box<dyn EventFormat> {
        let (p, env) = self.parts();
        Box::new(ResponseStream::new(state.clone(), &p.job, env, p.store.then_some(p.messages)))
    }

    fn whole(self, state: &AppState, run: &Run, mut choices: Vec<ChoiceAcc>) -> Value {
        let (p, env) = self.parts();
        let c = choices.pop().unwrap_or_default();
        let finish = c.finish.unwrap_or(FinishReason::Stop);
        let items = output_items(&env, &p.job, &c.text, &finish);
        let (status, incomplete) = status_of(&finish);
        let v = env.object(status, items.clone(), incomplete, usage(state, run, &items), Value::Null);
        if p.store {
            let mut messages = p.messages;
            messages.push(assistant_message(&items));
            state.responses.insert(env.id.clone(), v.clone(), messages);
        }
        v
    }
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
