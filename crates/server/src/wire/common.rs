//! What every wire format's request reading shares: the body as a JSON object, the served
//! model check, and the ids of answers and their parts.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::fields::Fields;
use crate::state::AppState;
use crate::structured;

pub(crate) fn parse_json(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::bad_request("the request body must be a JSON object")),
        Err(e) => Err(ApiError::bad_request(format!("the request body is not valid JSON: {e}"))),
    }
}

/// A request's `model`, when given, must be a name the server answers to (`--served-model-name
/// a b`, the model directory's base name, or a LoRA adapter's): the adapter's slot, if it
/// names one.
pub(crate) fn check_served(f: &Fields, state: &AppState) -> Result<Option<u32>, ApiError> {
    match f.str("model")? {
        Some(m) => state.resolve(m).ok_or_else(|| ApiError::unknown_model(m, &state.model_name)),
        None => Ok(None),
    }
}

/// `prefix` and 24 random hex digits (`msg_`, `toolu_`, `resp_`, `fc_`, ...).
pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", structured::tool_call_id().trim_start_matches("call_"))
}

/// Seconds since the Unix epoch (a response's `created`).
pub(crate) fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
