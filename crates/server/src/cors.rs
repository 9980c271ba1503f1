//! CORS, for browser clients on other origins: off unless `ServerConfig::allowed_origins` names
//! some (vLLM's `--allowed-origins`). Then every response to an allowed `Origin` carries
//! `Access-Control-Allow-Origin`, and preflight `OPTIONS` requests are answered here, before
//! routing and authentication (a browser sends no credentials on a preflight).
//!
//! No credentials mode (`Access-Control-Allow-Credentials`): API keys travel in the
//! `Authorization` header, which a preflight allows by name.

use hyper::header::{
    HeaderValue, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_HEADERS,
    ACCESS_CONTROL_REQUEST_METHOD, CONTENT_LENGTH, ORIGIN, VARY,
};
use hyper::{HeaderMap, Method, Response, StatusCode};

use crate::body::ResponseBody;
use crate::error::ApiError;

/// What a browser may send: every method this server answers.
const METHODS: &str = "GET, HEAD, POST, OPTIONS";

/// The `Access-Control-Allow-Origin` value for a request's `Origin`, when it is allowed.
fn allow_origin(allowed: &[String], origin: &HeaderValue) -> Option<HeaderValue> {
    if allowed.iter().any(|a| a == "*") {
        return Some(HeaderValue::from_static("*"));
    }
    let o = origin.to_str().ok()?;
    allowed.iter().any(|a| a == o).then(|| origin.clone())
}

/// A preflight request (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) answered,
/// or `None` when the request is not one or CORS is off.
pub fn preflight(allowed: &[String], method: &Method, headers: &HeaderMap) -> Option<Response<ResponseBody>> {
    if allowed.is_empty() || method != Method::OPTIONS {
        return None;
    }
    let origin = headers.get(ORIGIN)?;
    let requested = headers.get(ACCESS_CONTROL_REQUEST_METHOD)?;
    let Some(allow) = allow_origin(allowed, origin) else {
        return Some(refusal(&format!("the origin {origin:?} is not among the server's allowed origins")));
    };
    if !requested.to_str().is_ok_and(|m| METHODS.split(", ").any(|x| x == m)) {
        return Some(refusal(&format!("the method {requested:?} is not served here; use one of {METHODS}")));
    }
    let mut r = Response::new(ResponseBody::Full(None));
    let h = r.headers_mut();
    h.insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
    h.insert(ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static(METHODS));
    // Whatever headers the page asks for (Authorization, Content-Type, X-Request-Id, ...): the
    // browser lists them, and naming them back is how "any header" reaches Authorization.
    if let Some(req_headers) = headers.get(ACCESS_CONTROL_REQUEST_HEADERS) {
        h.insert(ACCESS_CONTROL_ALLOW_HEADERS, req_headers.clone());
    }
    h.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    decorate(h, allow);
    Some(r)
}

fn refusal(message: &str) -> Response<ResponseBody> {
    let e = ApiError::bad_request(message);
    let mut r = Response::new(ResponseBody::full(e.body().to_string()));
    *r.status_mut() = StatusCode::BAD_REQUEST;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn decorate(h: &mut HeaderMap, allow: HeaderValue) {
    // An echoed origin makes the answer depend on the request's Origin: caches must know.
    if allow != "*" {
        h.append(VARY, HeaderValue::from_static("Origin"));
    }
    h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, allow);
    h.insert(ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static("x-request-id"));
}

/// Adds the CORS headers to a response to an allowed `origin`.
pub fn apply(allowed: &[String], origin: Option<&HeaderValue>, r: &mut Response<ResponseBody>) {
    if allowed.is_empty() {
        return;
    }
    if let Some(allow) = origin.and_then(|o| allow_origin(allowed, o)) {
        decorate(r.headers_mut(), allow);
    }
}
