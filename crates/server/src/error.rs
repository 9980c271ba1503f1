//! Errors answered to HTTP clients, in OpenAI's shape:
//! `{"error": {"message", "type", "param", "code"}}`, each with the status it travels with.

use hyper::StatusCode;
use serde_json::json;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// vLLM's errors carry the HTTP status as an integer `code` (where OpenAI's carry a string):
    /// set for the errors answered as vLLM does, so that clients written for it read them.
    pub status_code: bool,
    /// Seconds for a `Retry-After` header (429).
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            status_code: false,
            retry_after: None,
        }
    }

    /// 400 naming the field at fault.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_string()),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }
    /// An error as vLLM answers it: its `type` (`"NotFoundError"`, `"InvalidUserInput"`) and
    /// the status as an integer `code`.
    pub fn vllm(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError { status_code: true, ..Self::new(status, kind, message) }
    }
    /// 400 about the request as a whole (e.g. malformed JSON).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }
    /// 404 in vLLM's shape (`"type": "NotFoundError"`, `"code": 404`), as vLLM answers it.
    pub fn unknown_model(requested: &str, served: &str) -> Self {
        ApiError {
            param: Some("model".into()),
            status_code: true,
            ..Self::new(
                StatusCode::NOT_FOUND,
                "NotFoundError",
                format!("The model `{requested}` does not exist; this server serves `{served}`."),
            )
        }
    }
    /// 400 for a request the context cannot hold, in vLLM's words and with OpenAI's
    /// `context_length_exceeded` code, which client libraries (langchain-openai, litellm,
    /// pydantic-ai) read as a context overflow.
    pub fn context_overflow(param: &str, max_model_len: usize, prompt: usize, completion: usize) -> Self {
        ApiError {
            code: Some("context_length_exceeded"),
            ..Self::invalid(
                param,
                format!(
                    "This model's maximum context length is {max_model_len} tokens. However, you requested {} tokens ({prompt} in the messages, {completion} in the completion). Please reduce the length of the messages or completion.",
                    prompt + completion
                ),
            )
        }
    }
    pub fn unauthorized() -> Self {
        ApiError {
            code: Some("invalid_api_key"),
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing or wrong API key: send `Authorization: Bearer <key>` or `x-api-key: <key>`",
            )
        }
    }
    pub fn not_found(path: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", format!("no route for path `{path}`"))
    }
    pub fn method_not_allowed(method: &str, path: &str, allowed: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("method {method} is not allowed on `{path}`; use {allowed}"),
        )
    }
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("request body exceeds the limit of {limit} bytes"),
        )
    }
    /// 408: the client did not send its request in time, or the request ran past its bound.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, "timeout_error", message)
    }
    pub fn overloaded(queued: usize, retry_after: u32) -> Self {
        ApiError {
            code: Some("rate_limit_exceeded"),
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!("the server queue is full ({queued} requests waiting); retry later"),
            )
        }
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn body(&self) -> serde_json::Value {
        let code = if self.status_code { json!(self.status.as_u16()) } else { json!(self.code) };
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": code}})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}
