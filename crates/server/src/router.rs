//! Routes, authentication and request bodies: from a hyper request to a response.
//!
//! Every response carries the client's `X-Request-Id` back when it sent one (a generation
//! response carries its own id otherwise), and CORS headers when `allowed_origins` lets the
//! request's origin in (see [`crate::cors`]).

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, ALLOW, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, ORIGIN};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;

use crate::body::ResponseBody;
use crate::error::ApiError;
use crate::params::Api;
use crate::pipeline::{serve, tokenizer_call};
use crate::reply::{error_response_with, json_response, X_REQUEST_ID};
use crate::state::AppState;
use crate::wire::common::now_secs;
use crate::wire::openai::OpenAi;
use crate::wire::{anthropic, responses};

const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
const ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");

fn error_response(e: &ApiError) -> Response<ResponseBody> {
    error_response_with(e, &e.body())
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
    /// vLLM's run-time LoRA updates: POST, routed only where allowed.
    LoadLora,
    UnloadLora,
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
            error_response_with(e, &anthropic::error_body(e))
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
            "/v1/load_lora_adapter" if state.config.runtime_lora_updating => Route::LoadLora,
            "/v1/unload_lora_adapter" if state.config.runtime_lora_updating => Route::UnloadLora,
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
        Route::Models if anthropic => json_response(StatusCode::OK, &anthropic::models(&state)),
        Route::Models => models(&state),
        Route::Model(id) if state.resolve(&id).is_none() => {
            error_response(&ApiError::unknown_model(&id, &state.model_name))
        }
        Route::Model(id) if !state.serves(&id) => json_response(StatusCode::OK, &adapter_entry(&state, &id)),
        Route::Model(_) if anthropic => json_response(StatusCode::OK, &anthropic::model_info(&state)),
        Route::Model(id) => json_response(StatusCode::OK, &model_entry(&state, &id)),
        Route::Response(id) => responses::by_id(&state, &method, &id).unwrap_or_else(|e| {
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
        Route::Generate(api) => {
            let parse: fn(&AppState, &[u8]) -> Result<OpenAi, ApiError> = match api {
                Api::Completions => OpenAi::completions,
                Api::Chat => OpenAi::chat,
                Api::Generate => OpenAi::generate,
            };
            match serve(&state, req, start, parse).await {
                // The run logs itself when it ends.
                Ok(r) => return r,
                Err(e) => error_response(&e),
            }
        }
        Route::Messages => match serve(&state, req, start, anthropic::Messages::parse).await {
            Ok(r) => return r,
            Err(e) => error_response(&e),
        },
        Route::Responses => match serve(&state, req, start, responses::Create::parse).await {
            Ok(r) => return r,
            Err(e) => error_response(&e),
        },
        Route::LoadLora => crate::lora::load(&state, req).await.unwrap_or_else(|e| error_response(&e)),
        Route::UnloadLora => crate::lora::unload(&state, req).await.unwrap_or_else(|e| error_response(&e)),
        Route::CountTokens => match tokenizer_call(&state, req, anthropic::count_tokens).await {
            Ok(v) => json_response(StatusCode::OK, &v),
            Err(e) => error_response(&e),
        },
    };
    log_plain(&method, &path, r.status(), start);
    r
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
    let created = now_secs();
    let root = state.config.model_root.as_deref().unwrap_or(&state.model_name);
    json!({"id": id, "object": "model", "created": created, "owned_by": "tandem", "root": root, "parent": null, "max_model_len": state.max_model_len()})
}

/// LoRA adapter `name` as vLLM lists one: `root` its directory, `parent` the base model.
fn adapter_entry(state: &AppState, name: &str) -> serde_json::Value {
    let a = state.lora.list().into_iter().find(|a| a.name == name);
    let (root, parent) = match a {
        Some(a) => (a.root, a.parent.unwrap_or_else(|| state.model_name.clone())),
        None => (String::new(), state.model_name.clone()),
    };
    json!({"id": name, "object": "model", "created": now_secs(), "owned_by": "tandem", "root": root, "parent": parent, "max_model_len": state.max_model_len()})
}

/// One entry per served name (vLLM lists each of `--served-model-name a b`), then one per
/// LoRA adapter.
fn models(state: &AppState) -> Response<ResponseBody> {
    let data: Vec<_> = std::iter::once(&state.model_name)
        .chain(&state.config.served_model_names)
        .map(|n| model_entry(state, n))
        .chain(state.lora.list().iter().map(|a| adapter_entry(state, &a.name)))
        .collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

fn metrics(state: &AppState) -> Response<ResponseBody> {
    let stats = state.engine.stats();
    let mut text = state.metrics.render(&stats, state.queued.load(Ordering::Relaxed));
    if state.config.max_loras > 0 {
        text.push_str(&state.lora.render_info(state.config.max_loras, &stats, now_secs()));
    }
    text.push_str(&state.responses.render(&state.model_name));
    let mut r = Response::new(ResponseBody::full(text));
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    r
}
