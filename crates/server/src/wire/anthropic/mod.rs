//! Anthropic's Messages API: `POST /v1/messages` (whole, or streamed as Anthropic's named
//! events) and `POST /v1/messages/count_tokens`, so that the `anthropic` SDKs and Claude Code
//! talk to the server unmodified. docs/anthropic-compat.md has the tables.
//!
//! A request is read into the chat path's own pieces and runs as a chat completion does:
//! - `system` and `messages` become template messages (`tool_use` blocks an assistant's
//!   `tool_calls` with their input as a mapping, `tool_result` blocks `role: "tool"` messages,
//!   a mid-conversation `system` message a system message, folded into the user turn for a
//!   template that refuses it), rendered by the model's chat template
//!   (`Job::chat_from` in [`crate::job`]);
//! - `tools` become the chat path's [`crate::structured::Tools`] (`input_schema` is the parameters schema) and
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
//! Streaming (`MessageStream`): text and tools' input stream as sampled (a named tool, "any",
//! and "auto" with a tool parser once its markup is certain; text up to where it may begin). `GET
//! /v1/models` asked with `anthropic-version` answers in Anthropic's shape (`models`).

mod answer;
mod request;
mod stream;

use std::sync::Arc;

use serde_json::{json, Value};

use crate::body::EventFormat;
use crate::engine_client::FinishReason;
use crate::error::ApiError;
use crate::job::Job;
use crate::pipeline::{ChoiceAcc, WireRequest};
use crate::run::Run;
use crate::state::AppState;
use crate::wire::common::new_id;
pub(crate) use answer::{error_body, model_info, models};
pub(crate) use request::count_tokens;
use stream::MessageStream;

/// A `POST /v1/messages` request as the pipeline runs it.
pub(crate) struct Messages {
    job: Job,
    id: String,
}

impl Messages {
    pub(crate) fn parse(state: &AppState, body: &[u8]) -> Result<Messages, ApiError> {
        Ok(Messages { job: request::job(state, body)?, id: String::new() })
    }
}

impl WireRequest for Messages {
    fn job(&self) -> &Job {
        &self.job
    }

    fn job_mut(&mut self) -> &mut Job {
        &mut self.job
    }

    fn id(&mut self, _state: &AppState) -> String {
        self.id = new_id("msg_");
        self.id.clone()
    }

    fn prompt_param(&self) -> &'static str {
        "messages"
    }

    fn stream(self, state: &Arc<AppState>) -> Box<dyn EventFormat> {
        let model = state.answer_model(self.job.p.params.adapter);
        Box::new(MessageStream::new(&self.job, self.id, model))
    }

    fn whole(self, state: &AppState, run: &Run, mut choices: Vec<ChoiceAcc>) -> Value {
        let Messages { job, id } = self;
        let c = choices.pop().unwrap_or_default();
        let (thinking, text) = match job.reasoning {
            Some(r) => r.split(&c.text),
            None => (None, c.text),
        };
        let (mut content, reason, seq) = answer::answer(
            job.tool_output.as_ref(),
            &text,
            c.finish.as_ref().unwrap_or(&FinishReason::Stop),
            c.stop_string.as_deref(),
        );
        job.count_tool_parse(false, content.iter().any(|b| b["type"] == "tool_use"));
        if let Some(t) = thinking {
            content.insert(0, json!({"type": "thinking", "thinking": t, "signature": ""}));
        }
        json!({"id": id, "type": "message", "role": "assistant", "content": content, "model": state.answer_model(job.p.params.adapter), "stop_reason": reason, "stop_sequence": seq,
               "usage": {"input_tokens": run.prompt_tokens, "output_tokens": run.completion_tokens}})
    }
}
