//! Routes, authentication and request bodies: from a hyper request to a response.
//!
//! Every response carries the client's `X-Request-Id` back when it sent one (a generation
//! response carries its own id otherwise), and CORS headers when `allowed_origins` lets the
//! request's origin in (see [`crate::cors`]).

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{
    HeaderName, HeaderValue, ALLOW, AUTHORIZATION, CACHE_CONTROL, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, ORIGIN,
    RETRY_AFTER,
};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;

use crate::body::{EventFormat, ResponseBody, SseStream};
use crate::error::ApiError;
use crate::openai::{collect, response, Job, ResponseMeta, StreamFormatter};
use crate::params::Api;
use crate::run::Run;
use crate::server::AppState;

const JSON: &str = "application/json";
pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
const ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");
/// Bodies larger than this are parsed and tokenized on the blocking pool.
const BLOCKING_PARSE_BYTES: usize = 16 << 10;

pub(crate) fn json_response(status: StatusCode, v: &serde_json::Value) -> Response<ResponseBody> {
    let mut r = Response::new(ResponseBody::full(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(JSON));
    r
}

fn error_response(e: &ApiError) -> Response<ResponseBody> {
    error_response_with(e, &e.body())
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

/// Compares without an early exit, so response time says nothing about how much matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn authorized(state: &AppState, req: &Request<Incoming>) -> bool {
    let Some(key) = &state.config.api_key else { return true };
    let bearer = req.headers().get(AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    // Anthropic's clients send the key as `x-api-key`.
    let x_api_key = req.headers().get(X_API_KEY).and_then(|v| v.to_str().ok());
    [bearer, x_api_key].into_iter().flatten().any(|g| constant_time_eq(g.trim().as_bytes(), key.as_bytes()))
}

pub(crate) async fn read_body(state: &AppState, req: Request<Incoming>) -> Result<Bytes, ApiError> {
    let limit = state.config.max_body_bytes;
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let timeout = state.config.body_read_timeout;
    let Ok(read) = tokio::time::timeout(timeout, Limited::new(req.into_body(), limit).collect()).await else {
        return Err(ApiError::timeout(format!("the request body did not arrive within {} s", timeout.as_secs_f32())));
    };
    match read {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::too_large(limit)),
        Err(e) => Err(ApiError::bad_request(format!("cannot read the request body: {e}"))),
    }
}

/// The one entry point hyper calls. Never fails: every error is a response.
pub async fn handle(state: Arc<AppState>, req: Request<Incoming>) -> Result<Response<ResponseBody>, Infallible> {
    let client_id = req.headers().get(X_REQUEST_ID).cloned();
    let origin = req.headers().get(ORIGIN).cloned();
    let mut r = match crate::cors::preflight(&state.config.allowed_origins, req.method(), req.headers()) {
        Some(r) => r,
        None => route(state.clone(), req).await,
    };
    if let Some(id) = client_id {
        r.headers_mut().insert(X_REQUEST_ID, id);
    }
    crate::cors::apply(&state.config.allowed_origins, origin.as_ref(), &mut r);
    Ok(r)
}

/// Where a path leads.
enum Route {
    /// A generation endpoint: POST, logged by its run.
    Generate(Api),
    /// Anthropic's Messages API: POST.
    Messages,
    CountTokens,
    /// Tokenizer endpoints: POST.
    Tokenize,
    Detokenize,
    /// GET endpoints behind the API key.
    Models,
    /// `/v1/models/{id}`.
    Model(String),
    Metrics,
    /// OpenAI's Responses API: POST; `/v1/responses/{id}`: GET, DELETE.
    Responses,
    Response(String),
}

async fn route(state: Arc<AppState>, req: Request<Incoming>) -> Response<ResponseBody> {
    let start = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    // Anthropic's paths answer errors in Anthropic's shape, and so does `/v1/models` asked by
    // an Anthropic client (its SDKs send `anthropic-version`).
    let anthropic_client = req.headers().contains_key(ANTHROPIC_VERSION);
    let anthropic = path == "/v1/messages"
        || path.starts_with("/v1/messages/")
        || (anthropic_client && path.starts_with("/v1/models"));
    let error_response = |e: &ApiError| {
        if anthropic {
            error_response_with(e, &crate::anthropic::error_body(e))
        } else {
            error_response(e)
        }
    };
    let route =
        match path.as_str() {
            // Open to all, as in vLLM: load balancers and version probes carry no key.
            "/health" => {
                return match method {
                    Method::GET | Method::HEAD => health(&state),
                    _ => error_response(&ApiError::method_not_allowed(method.as_str(), &path, "GET"))
                        .with_allow("GET, HEAD"),
                };
            }
            // vLLM's (SageMaker's) liveness probe: /health's answer, to GET and POST.
            "/ping" => {
                return match method {
                    Method::GET | Method::HEAD | Method::POST => health(&state),
                    _ => error_response(&ApiError::method_not_allowed(method.as_str(), &path, "GET or POST"))
                        .with_allow("GET, HEAD, POST"),
                };
            }
            "/version" => {
                let r = match method {
                    Method::GET | Method::HEAD => {
                        json_response(StatusCode::OK, &json!({"version": env!("CARGO_PKG_VERSION")}))
                    }
                    _ => error_response(&ApiError::method_not_allowed(method.as_str(), &path, "GET"))
                        .with_allow("GET, HEAD"),
                };
                log_plain(&method, &path, r.status(), start);
                return r;
            }
            "/v1/completions" => Route::Generate(Api::Completions),
            "/v1/chat/completions" => Route::Generate(Api::Chat),
            "/generate" => Route::Generate(Api::Generate),
            "/v1/responses" => Route::Responses,
            p if p.starts_with("/v1/responses/") => Route::Response(p["/v1/responses/".len()..].to_string()),
            "/v1/messages" => Route::Messages,
            "/v1/messages/count_tokens" => Route::CountTokens,
            "/tokenize" => Route::Tokenize,
            "/detokenize" => Route::Detokenize,
            "/v1/models" => Route::Models,
            p if p.starts_with("/v1/models/") => Route::Model(p["/v1/models/".len()..].to_string()),
            "/metrics" => Route::Metrics,
            p if crate::worker_api::serves(p) => {
                let r = if crate::worker_api::open(p) || authorized(&state, &req) {
                    crate::worker_api::route(&state, req).await.unwrap_or_else(|e| error_response(&e))
                } else {
                    error_response(&ApiError::unauthorized())
                };
                log_plain(&method, &path, r.status(), start);
                return r;
            }
            _ => {
                let r = error_response(&ApiError::not_found(&path));
                log_plain(&method, &path, r.status(), start);
                return r;
            }
        };
    if !authorized(&state, &req) {
        let r = error_response(&ApiError::unauthorized());
        log_plain(&method, &path, r.status(), start);
        return r;
    }
    let r = match route {
        Route::Models | Route::Model(_) | Route::Metrics if method != Method::GET => {
            error_response(&ApiError::method_not_allowed(method.as_str(), &path, "GET")).with_allow("GET")
        }
        Route::Metrics => metrics(&state),
        Route::Models if anthropic => json_response(StatusCode::OK, &crate::anthropic::models(&state)),
        Route::Models => models(&state),
        Route::Model(id) if !state.serves(&id) => error_response(&ApiError::unknown_model(&id, &state.model_name)),
        Route::Model(_) if anthropic => json_response(StatusCode::OK, &crate::anthropic::model_info(&state)),
        Route::Model(id) => json_response(StatusCode::OK, &model_entry(&state, &id)),
        Route::Response(id) => crate::responses::by_id(&state, &method, &id).unwrap_or_else(|e| {
            let r = error_response(&e);
            if e.status == StatusCode::METHOD_NOT_ALLOWED {
                r.with_allow("GET, DELETE")
            } else {
                r
            }
        }),
        _ if method != Method::POST => {
            error_response(&ApiError::method_not_allowed(method.as_str(), &path, "POST")).with_allow("POST")
        }
        Route::Tokenize | Route::Detokenize => {
            let f = if matches!(route, Route::Tokenize) {
                crate::tokenization::tokenize
            } else {
                crate::tokenization::detokenize
            };
            match tokenizer_call(&state, req, f).await {
                Ok(v) => json_response(StatusCode::OK, &v),
                Err(e) => error_response(&e),
            }
        }
        Route::Generate(api) => match generate(&state, api, req, start).await {
            // The run logs itself when it ends.
            Ok(r) => return r,
            Err(e) => error_response(&e),
        },
        Route::Messages => match crate::anthropic::messages(&state, req, start).await {
            Ok(r) => return r,
            Err(e) => error_response(&e),
        },
        Route::Responses => match crate::responses::create(&state, req, start).await {
            Ok(r) => return r,
            Err(e) => error_response(&e),
        },
        Route::CountTokens => match tokenizer_call(&state, req, crate::anthropic::count_tokens).await {
            Ok(v) => json_response(StatusCode::OK, &v),
            Err(e) => error_response(&e),
        },
    };
    log_plain(&method, &path, r.status(), start);
    r
}

/// Reads the body and runs `f` on it: on the blocking pool when the body is large, since
/// tokenizing a long text takes milliseconds that other requests' streams would wait behind.
pub(crate) async fn tokenizer_call<T: Send + 'static>(
    state: &Arc<AppState>,
    req: Request<Incoming>,
    f: fn(&AppState, &[u8]) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    let body = read_body(state, req).await?;
    if body.len() > BLOCKING_PARSE_BYTES {
        let st = state.clone();
        tokio::task::spawn_blocking(move || f(&st, &body))
            .await
            .map_err(|e| ApiError::internal(format!("the tokenizer task failed: {e}")))?
    } else {
        f(state, &body)
    }
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
    if let Some(f) = state.engine.failure() {
        return error_response(&ApiError::unavailable(format!("the engine stopped: {f}")));
    }
    if state.engine.is_ready() {
        let mut r = Response::new(ResponseBody::Full(None));
        r.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
        r
    } else {
        error_response(&ApiError::unavailable("the model is still loading"))
    }
}

/// The served model under the name `id` as OpenAI's (and vLLM's) model object.
fn model_entry(state: &AppState, id: &str) -> serde_json::Value {
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let root = state.config.model_root.as_deref().unwrap_or(&state.model_name);
    json!({"id": id, "object": "model", "created": created, "owned_by": "tandem", "root": root, "parent": null, "max_model_len": state.max_model_len()})
}

/// One entry per served name (vLLM lists each of `--served-model-name a b`).
fn models(state: &AppState) -> Response<ResponseBody> {
    let data: Vec<_> = std::iter::once(&state.model_name)
        .chain(&state.config.served_model_names)
        .map(|n| model_entry(state, n))
        .collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

fn metrics(state: &AppState) -> Response<ResponseBody> {
    let mut text = state.metrics.render(&state.engine.stats(), state.queued.load(Ordering::Relaxed));
    text.push_str(&state.responses.render(&state.model_name));
    let mut r = Response::new(ResponseBody::full(text));
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
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

/// 503 while the model loads or after the engine stopped.
pub(crate) fn ready(state: &AppState) -> Result<(), ApiError> {
    if !state.engine.is_ready() {
        return Err(ApiError::unavailable("the model is still loading"));
    }
    if let Some(f) = state.engine.failure() {
        return Err(ApiError::unavailable(format!("the engine stopped: {f}")));
    }
    Ok(())
}

/// The job with its structured-output form compiled, if it has one.
pub(crate) async fn compiled(state: &Arc<AppState>, mut job: Job) -> Result<Job, ApiError> {
    if job.guide.is_some() {
        // Compiling a grammar can take milliseconds: off the threads that stream tokens.
        let st = state.clone();
        job = tokio::task::spawn_blocking(move || job.compile_guide(&st).map(|()| job))
            .await
            .map_err(|e| ApiError::internal(format!("the structured-output compile task failed: {e}")))??;
    }
    Ok(job)
}

async fn generate(
    state: &Arc<AppState>,
    api: Api,
    req: Request<Incoming>,
    start: Instant,
) -> Result<Response<ResponseBody>, ApiError> {
    ready(state)?;
    let parse = match api {
        Api::Completions => Job::completions,
        Api::Chat => Job::chat,
        Api::Generate => Job::generate,
    };
    let job = compiled(state, tokenizer_call(state, req, parse).await?).await?;
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
    let request_id =
        HeaderValue::from_str(&meta.id).map_err(|e| ApiError::internal(format!("bad response id: {e}")))?;
    let mut r = if job.p.stream {
        sse_response(run, Box::new(StreamFormatter::new(&job, meta, state.tokenizer.clone())))
    } else {
        // If the client leaves, hyper drops this future, and with it `run`, which aborts.
        let choices = collect(&mut run).await?;
        json_response(StatusCode::OK, &response(&job, &meta, &run, choices, &state.tokenizer))
    };
    r.headers_mut().insert(X_REQUEST_ID, request_id);
    Ok(r)
}
