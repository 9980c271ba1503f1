//! HTTP responses the handlers share: a JSON body, an error in some API's shape, and a stream
//! of server-sent events fed by a run.

use hyper::header::{HeaderName, HeaderValue, CACHE_CONTROL, CONNECTION, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Response, StatusCode};

use crate::body::{EventFormat, ResponseBody, SseStream};
use crate::error::ApiError;
use crate::run::Run;

const JSON: &str = "application/json";
/// The request id a client sends, and each response carries back.
pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

pub(crate) fn json_response(status: StatusCode, v: &serde_json::Value) -> Response<ResponseBody> {
    let mut r = Response::new(ResponseBody::full(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(JSON));
    r
}

/// An error's response with `body` in some API's error shape (OpenAI's, Anthropic's).
pub(crate) fn error_response_with(e: &ApiError, body: &serde_json::Value) -> Response<ResponseBody> {
    let mut r = json_response(e.status, body);
    if let Some(s) = e.retry_after {
        r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(s));
    }
    // RFC 9110: a 408 means the server closes the connection rather than keep waiting (for a
    // stalled body, the rest of it is never read).
    if e.status == StatusCode::REQUEST_TIMEOUT {
        r.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// A streamed response: `fmt`'s events as the run's updates come. The body owns the run, so
/// a client that leaves aborts it.
pub(crate) fn sse_response(run: Run, fmt: Box<dyn EventFormat>) -> Response<ResponseBody> {
    let mut r = Response::new(ResponseBody::Sse(Box::new(SseStream::new(run, fmt))));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}
