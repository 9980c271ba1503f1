//! vLLM's `POST /tokenize` and `POST /detokenize`, in its request and response shapes.
//!
//! - `/tokenize` takes `{"prompt": "..."}` (`add_special_tokens`, default true) or
//!   `{"messages": [...]}` (rendered with the chat template as `/v1/chat/completions` renders
//!   them; `add_generation_prompt`, default true unless `continue_final_message`;
//!   `chat_template_kwargs`; `add_special_tokens`, default false, since
//!   the template writes the BOS itself), plus `return_token_strs`; answers
//!   `{"count", "max_model_len", "tokens", "token_strs"}` (`token_strs` null unless asked).
//! - `/detokenize` takes `{"tokens": [...]}` and answers `{"prompt": text}` (special tokens
//!   kept, as vLLM's decode keeps them).
//!
//! A body with both `prompt` and `messages` is read as the `prompt` form (the other fields
//! ignored), as vLLM reads it: its request type is a union whose first member, the completion
//! form, accepts such a body.
//!
//! A `model` other than the served one is 404, as on the generation endpoints.

use serde_json::{json, Value};

use crate::chat::{chat_text, normalize_messages};
use crate::error::ApiError;
use crate::fields::Fields;
use crate::state::AppState;
use crate::wire::common::{check_served, parse_json};

pub fn tokenize(state: &AppState, body: &[u8]) -> Result<Value, ApiError> {
    let o = parse_json(body)?;
    let f = Fields(&o);
    check_served(&f, state)?;
    let tok = &state.tokenizer;
    let tokens = match (f.get("prompt"), f.get("messages")) {
        (None, None) => return Err(ApiError::invalid("prompt", "`prompt` (or `messages`) is required")),
        // With both, the prompt is tokenized and `messages` ignored, as vLLM's request union
        // (the completion form first) reads such a body.
        (Some(p), _) => {
            let Some(text) = p.as_str() else {
                return Err(ApiError::invalid("prompt", "`prompt` must be a string"));
            };
            let special = f.bool("add_special_tokens")?.unwrap_or(true);
            tok.encode(text, special)
                .map_err(|e| ApiError::invalid("prompt", format!("cannot tokenize `prompt`: {e}")))?
        }
        (None, Some(m)) => {
            // Rendered as chat renders them, so that the count is the prompt's.
            let tools = crate::structured::parse_tools(&f)?;
            let msgs = normalize_messages(Some(m))?;
            let continue_final = f.bool("continue_final_message")?.unwrap_or(false);
            let add_gen = f.bool("add_generation_prompt")?.unwrap_or(!continue_final);
            let kwargs = match f.get("chat_template_kwargs") {
                None => None,
                Some(Value::Object(o)) => Some(o),
                Some(v) => {
                    return Err(ApiError::invalid(
                        "chat_template_kwargs",
                        format!("`chat_template_kwargs` must be an object, got {}", crate::fields::type_name(v)),
                    ))
                }
            };
            let text = chat_text(state, &msgs, tools.as_ref(), add_gen, continue_final, kwargs)?;
            let special = f.bool("add_special_tokens")?.unwrap_or(false);
            tok.encode(&text, special)
                .map_err(|e| ApiError::invalid("messages", format!("cannot tokenize the rendered chat: {e}")))?
        }
    };
    let token_strs = if f.bool("return_token_strs")? == Some(true) {
        Value::from(tokens.iter().map(|&t| tok.id_to_token(t).unwrap_or_default()).collect::<Vec<_>>())
    } else {
        Value::Null
    };
    Ok(
        json!({"count": tokens.len(), "max_model_len": state.config.max_model_len, "tokens": tokens, "token_strs": token_strs}),
    )
}

pub fn detokenize(state: &AppState, body: &[u8]) -> Result<Value, ApiError> {
    let o = parse_json(body)?;
    let f = Fields(&o);
    check_served(&f, state)?;
    let vocab = state.config.vocab_size;
    let shape = || ApiError::invalid("tokens", "`tokens` must be a list of token ids");
    let ids: Vec<u32> = match f.get("tokens") {
        None => return Err(ApiError::invalid("tokens", "`tokens` is required")),
        Some(Value::Array(a)) => a
            .iter()
            .map(|t| t.as_u64().filter(|&t| t <= u32::MAX as u64).map(|t| t as u32).ok_or_else(shape))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(shape()),
    };
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            "tokens",
            format!("`tokens` holds token id {bad}, outside the vocabulary [0, {vocab})"),
        ));
    }
    let text = state
        .tokenizer
        .decode(&ids, false)
        .map_err(|e| ApiError::invalid("tokens", format!("cannot decode `tokens`: {e}")))?;
    Ok(json!({"prompt": text}))
}
