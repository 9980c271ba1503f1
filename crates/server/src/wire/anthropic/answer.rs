//! Anthropic's answers and errors: a whole answer's content blocks and stop reason, the error
//! shape, and the model objects.

use hyper::StatusCode;
use serde_json::{json, Value};

use crate::answer::tool_message;
use crate::engine_client::FinishReason;
use crate::error::ApiError;
use crate::job::ToolOutput;
use crate::state::AppState;
use crate::wire::common::new_id;

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

/// The answer's content blocks, `stop_reason` and `stop_sequence`.
pub(super) fn answer(
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

#[cfg(test)]
mod tests {
    use super::*;

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
