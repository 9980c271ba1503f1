//! Routes, authentication and request bodies: from a hyper request to a response.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, AUTHORIZATION, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;

use crate::body::{ResponseBody, SseStream};
use crate::error::ApiError;
use crate::openai::{collect, response, Job, ResponseMeta, StreamFormatter};
use crate::params::Api;
use crate::run::Run;
use crate::server::AppState;

const JSON: &str = "application/json";
/// Bodies larger than this are parsed and tokenized on the blocking pool.
const BLOCKING_PARSE_BYTES: usize = 16 << 10;

fn json_response(status: StatusCode, v: &serde_json::Value) -> Response<ResponseBody> {
    let mut r = Response::new(ResponseBody::full(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(JSON));
    r
}

fn error_response(e: &ApiError) -> Response<ResponseBody> {
    let mut r = json_response(e.status, &e.body());
    if let Some(s) = e.retry_after {
        r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

/// Compares without an early exit, so response time says nothing about how much matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn authorized(state: &AppState, req: &Request<Incoming>) -> bool {
    let Some(key) = &state.config.api_key else { return true };
    let given = req.headers().get(AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    given.is_some_and(|g| constant_time_eq(g.trim().as_bytes(), key.as_bytes()))
}

async fn read_body(state: &AppState, req: Request<Incoming>) -> Result<Bytes, ApiError> {
    let limit = state.config.max_body_bytes;
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::too_large(limit)),
        Err(e) => Err(ApiError::bad_request(format!("cannot read the request body: {e}"))),
    }
}

/// The one entry point hyper calls. Never fails: every error is a response.
pub async fn handle(state: Arc<AppState>, req: Request<Incoming>) -> Result<Response<ResponseBody>, Infallible> {
    let start = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let api = match path.as_str() {
        "/health" => {
            return Ok(match method {
                Method::GET | Method::HEAD => health(&state),
                _ => error_response(&ApiError::method_not_allowed(method.as_str(), &path, "GET")).with_allow("GET, HEAD"),
            });
        }
        "/v1/completions" => Some(Api::Completions),
        "/v1/chat/completions" => Some(Api::Chat),
        "/generate" => Some(Api::Generate),
        "/v1/models" | "/metrics" => None,
        _ => {
            let r = error_response(&ApiError::not_found(&path));
            log_plain(&method, &path, r.status(), start);
            return Ok(r);
        }
    };
    if !authorized(&state, &req) {
        let r = error_response(&ApiError::unauthorized());
        log_plain(&method, &path, r.status(), start);
        return Ok(r);
    }
    let r = match api {
        None if method != Method::GET => error_response(&ApiError::method_not_allowed(method.as_str(), &path, "GET")).with_allow("GET"),
        None if path == "/metrics" => metrics(&state),
        None => models(&state),
        Some(_) if method != Method::POST => error_response(&ApiError::method_not_allowed(method.as_str(), &path, "POST")).with_allow("POST"),
        Some(api) => match generate(&state, api, req, start).await {
            // The run logs itself when it ends.
            Ok(r) => return Ok(r),
            Err(e) => error_response(&e),
        },
    };
    log_plain(&method, &path, r.status(), start);
    Ok(r)
}

trait WithAllow {
    fn with_allow(self, allow: &'static str) -> Self;
}

impl WithAllow for Response<ResponseBody> {
    fn with_allow(mut self, allow: &'static str) -> Self {
        self.headers_mut().insert(ALLOW, HeaderValue::from_static(allow));
        self
    }
}

fn log_plain(method: &Method, path: &str, status: StatusCode, start: Instant) {
    tracing::info!(%method, path, status = status.as_u16(), total_ms = %format!("{:.3}", start.elapsed().as_secs_f64() * 1e3), "request");
}

fn health(state: &AppState) -> Response<ResponseBody> {
    // Kept allocation-light: load balancers poll this often.
    if state.engine.is_ready() {
        let mut r = Response::new(ResponseBody::Full(None));
        r.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
        r
    } else {
        error_response(&ApiError::unavailable("the model is still loading"))
    }
}

fn models(state: &AppState) -> Response<ResponseBody> {
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": [{"id": state.model_name, "object": "model", "created": created, "owned_by": "tandem", "root": state.model_name, "max_model_len": state.max_model_len()}]}),
    )
}

fn metrics(state: &AppState) -> Response<ResponseBody> {
    let text = state.metrics.render(&state.engine.stats(), state.queued.load(Ordering::Relaxed));
    let mut r = Response::new(ResponseBody::full(text));
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    r
}

async fn generate(state: &Arc<AppState>, api: Api, req: Request<Incoming>, start: Instant) -> Result<Response<ResponseBody>, ApiError> {
    if !state.engine.is_ready() {
        return Err(ApiError::unavailable("the model is still loading"));
    }
    let body = read_body(state, req).await?;
    let parse = move |state: &AppState, body: &[u8]| match api {
        Api::Completions => Job::completions(state, body),
        Api::Chat => Job::chat(state, body),
        Api::Generate => Job::generate(state, body),
    };
    // Tokenizing a long prompt takes milliseconds: off the runtime, so that the tokens other
    // requests are streaming on this worker do not wait behind it.
    let job = if body.len() > BLOCKING_PARSE_BYTES {
        let st = state.clone();
        tokio::task::spawn_blocking(move || parse(&st, &body)).await.map_err(|e| ApiError::internal(format!("the tokenizer task failed: {e}")))??
    } else {
        parse(state, &body)?
    };
    let reqs = job.requests(state)?;
    let n = state.next_id.fetch_add(1, Ordering::Relaxed);
    let prefix = match api {
        Api::Completions => "cmpl",
        Api::Chat => "chatcmpl",
        Api::Generate => "gen",
    };
    let meta = ResponseMeta {
        id: format!("{prefix}-{n:016x}"),
        created: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        model: state.model_name.clone(),
    };
    let mut run = Run::start(state.clone(), reqs, job.prompt_param(), meta.id.clone(), start)?;
    // The id of the log line, for clients to quote.
    let request_id = HeaderValue::from_str(&meta.id).map_err(|e| ApiError::internal(format!("bad response id: {e}")))?;
    let mut r = if job.p.stream {
        let fmt = StreamFormatter::new(&job, meta, state.tokenizer.clone());
        let mut r = Response::new(ResponseBody::Sse(Box::new(SseStream::new(run, fmt))));
        let h = r.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        r
    } else {
        // If the client leaves, hyper drops this future, and with it `run`, which aborts.
        let choices = collect(&mut run).await?;
        json_response(StatusCode::OK, &response(&job, &meta, &run, choices, &state.tokenizer))
    };
    r.headers_mut().insert("x-request-id", request_id);
    Ok(r)
}
