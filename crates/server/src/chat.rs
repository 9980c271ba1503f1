//! The chat template: messages (and tools, and `chat_template_kwargs`) to the prompt's text
//! and token ids, as every chat-shaped wire format and `/tokenize` render them.

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::state::AppState;
use crate::structured;

/// Message contents as plain strings (a list of text parts is joined) for the template.
pub(crate) fn normalize_messages(v: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let msgs = match v {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(ApiError::invalid("messages", "`messages` must not be empty")),
        None => return Err(ApiError::invalid("messages", "`messages` is required")),
        Some(_) => return Err(ApiError::invalid("messages", "`messages` must be a list of message objects")),
    };
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let Some(obj) = m.as_object() else {
            return Err(ApiError::invalid(&format!("messages[{i}]"), format!("`messages[{i}]` must be an object")));
        };
        if !obj.get("role").is_some_and(Value::is_string) {
            return Err(ApiError::invalid(
                &format!("messages[{i}].role"),
                format!("`messages[{i}].role` must be a string"),
            ));
        }
        let mut obj = obj.clone();
        let content = match obj.get("content") {
            None | Some(Value::Null) => Value::String(String::new()),
            Some(Value::String(s)) => Value::String(s.clone()),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        _ => {
                            return Err(ApiError::invalid(
                                &format!("messages[{i}].content"),
                                "only text content parts (`{\"type\": \"text\", \"text\": ...}`) are supported",
                            ))
                        }
                    }
                }
                Value::String(text)
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].content"),
                    format!("`messages[{i}].content` must be a string or a list of text parts"),
                ))
            }
        };
        obj.insert("content".into(), content);
        // transformers' templates read a call's arguments as a mapping; OpenAI sends a JSON
        // string (vLLM turns it into a dict for the template the same way).
        if let Some(Value::Array(calls)) = obj.get_mut("tool_calls") {
            for c in calls.iter_mut() {
                if let Some(a) = c.get_mut("function").and_then(|f| f.get_mut("arguments")) {
                    if let Some(v) =
                        a.as_str().and_then(|s| serde_json::from_str::<Value>(s).ok()).filter(Value::is_object)
                    {
                        *a = v;
                    }
                }
            }
        }
        out.push(Value::Object(obj));
    }
    Ok(out)
}

/// The prompt's ids of a chat: messages (and tools, and `chat_template_kwargs`) through the
/// model's chat template.
pub(crate) fn render_chat(
    state: &AppState,
    msgs: &[Value],
    tools: Option<&structured::Tools>,
    add_gen: bool,
    kwargs: Option<&Map<String, Value>>,
) -> Result<Vec<u32>, ApiError> {
    render_chat_continued(state, msgs, tools, add_gen, false, kwargs)
}

/// [`render_chat`], with the last message left open when `continue_final` (vLLM's
/// `continue_final_message`).
pub(crate) fn render_chat_continued(
    state: &AppState,
    msgs: &[Value],
    tools: Option<&structured::Tools>,
    add_gen: bool,
    continue_final: bool,
    kwargs: Option<&Map<String, Value>>,
) -> Result<Vec<u32>, ApiError> {
    let text = chat_text(state, msgs, tools, add_gen, continue_final, kwargs)?;
    // The template writes the BOS itself.
    state
        .tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::invalid("messages", format!("cannot tokenize the rendered chat: {e}")))
}

/// The rendered chat text. With `continue_final`, what follows the last message's content is
/// cut off (its end-of-turn markup), as transformers' `continue_final_message` cuts it: after
/// the last place the content, stripped, appears.
pub(crate) fn chat_text(
    state: &AppState,
    msgs: &[Value],
    tools: Option<&structured::Tools>,
    add_gen: bool,
    continue_final: bool,
    kwargs: Option<&Map<String, Value>>,
) -> Result<String, ApiError> {
    if continue_final && add_gen {
        return Err(ApiError::invalid(
            "continue_final_message",
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        ));
    }
    let text = state
        .tokenizer
        .apply_chat_template_with_kwargs(msgs, tools.map(|t| t.list.as_slice()), add_gen, kwargs)
        .map_err(|e| ApiError::invalid("messages", format!("cannot apply the chat template: {e}")))?;
    if !continue_final {
        return Ok(text);
    }
    let last = msgs.last().and_then(|m| m.get("content")).and_then(Value::as_str).unwrap_or_default();
    let Some(at) = text.rfind(last.trim()) else {
        return Err(ApiError::invalid("continue_final_message", "`continue_final_message` is set but the final message does not appear in the chat after applying the chat template"));
    };
    // The content kept whole (trailing whitespace too) when it has no leading whitespace.
    let end = if last.trim_start().len() == last.len() && text[at..].starts_with(last) {
        at + last.len()
    } else {
        at + last.trim().len()
    };
    Ok(text[..end].to_string())
}
