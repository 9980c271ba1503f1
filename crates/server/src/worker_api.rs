//! What the LLM routers in front of replicas (vLLM's `vllm-router`, SGLang's `sglang-router`)
//! ask a worker beyond the OpenAI API, served with SGLang's meaning (docs/scale-out.md lists
//! which router calls what):
//!
//! - `GET /get_load`: `[{"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"}]`, one entry
//!   per data-parallel rank (Tandem has one); `num_tokens` counts the prompt tokens (times `n`)
//!   and generated tokens of the requests this server has running or waiting. sglang-router's
//!   `power_of_two` policy sums `num_tokens`; vllm-router 0.1 reads an older shape
//!   (`{"load": N}`) no current engine serves, and falls back to its own counts.
//! - `GET /get_server_info` (and `/server_info`, SGLang's newer name): the serving limits
//!   (`tp_size`, `dp_size`, `max_running_requests`, `context_length`, ...) the sglang router reads
//!   when it registers a worker, and the served model's name (its model id).
//! - `GET /get_model_info` (and `/model_info`): the served model, as SGLang describes it.
//! - `GET /health_generate`: readiness proven by generating one token (SGLang's meaning; the
//!   routers proxy it): 200, or 503 with the reason. Open to all, as `/health` is.
//! - `POST /flush_cache`: answered 501 saying why: the engine's prefix cache cannot be dropped
//!   on demand (its unused blocks are evicted, least recently used first, as the pool needs them).
//!
//! Everything but `/health_generate` sits behind the API key, as the OpenAI routes do.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;
use tandem_engine::SamplingParams;

use crate::body::ResponseBody;
use crate::engine_client::{FinishReason, GenerateRequest, RequestParams};
use crate::error::ApiError;
use crate::reply::json_response;
use crate::state::AppState;

/// How long `/health_generate` waits for its one token.
const HEALTH_GENERATE_TIMEOUT: Duration = Duration::from_secs(20);

/// True for the paths this module answers.
pub(crate) fn serves(path: &str) -> bool {
    matches!(
        path,
        "/get_load"
            | "/get_server_info"
            | "/server_info"
            | "/get_model_info"
            | "/model_info"
            | "/health_generate"
            | "/flush_cache"
    )
}

/// True for the paths open without the API key.
pub(crate) fn open(path: &str) -> bool {
    path == "/health_generate"
}

/// Answers one of [`serves`]'s paths; errors come back as `Err` for the caller to shape.
pub(crate) async fn route(state: &Arc<AppState>, req: Request<Incoming>) -> Result<Response<ResponseBody>, ApiError> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let want = if path == "/flush_cache" { Method::POST } else { Method::GET };
    if method != want && !(want == Method::GET && method == Method::HEAD) {
        return Err(ApiError::method_not_allowed(method.as_str(), &path, want.as_str()));
    }
    match path.as_str() {
        "/get_load" => Ok(json_response(StatusCode::OK, &load(state))),
        "/get_server_info" | "/server_info" => Ok(json_response(StatusCode::OK, &server_info(state))),
        "/get_model_info" | "/model_info" => Ok(json_response(StatusCode::OK, &model_info(state))),
        "/health_generate" => health_generate(state).await.map(|()| json_response(StatusCode::OK, &json!({"status": "ok"}))),
        _ => Err(ApiError {
            status: StatusCode::NOT_IMPLEMENTED,
            message: "this server cannot flush its prefix cache on demand: cached blocks no request holds are evicted, least recently used first, as the KV pool needs them".into(),
            kind: "not_implemented_error",
            param: None,
            code: None,
            status_code: false,
            retry_after: None,
        }),
    }
}

fn load(state: &AppState) -> serde_json::Value {
    let s = state.engine.stats();
    json!([{
        "dp_rank": 0,
        "num_reqs": s.num_running + s.num_waiting,
        "num_waiting_reqs": s.num_waiting,
        "num_tokens": state.tokens_in_flight.load(Ordering::Relaxed),
    }])
}

fn server_info(state: &AppState) -> serde_json::Value {
    let c = &state.config;
    json!({
        "served_model_name": state.model_name,
        "is_generation": true,
        "tp_size": 1,
        "dp_size": 1,
        "disaggregation_mode": "null",
        "context_length": state.max_model_len(),
        "max_running_requests": c.max_num_seqs,
        "max_queued_requests": c.max_queued_requests,
        "version": env!("CARGO_PKG_VERSION"),
        "engine": "tandem",
    })
}

fn model_info(state: &AppState) -> serde_json::Value {
    json!({
        "served_model_name": state.model_name,
        "is_generation": true,
        "max_context_length": state.max_model_len(),
        "vocab_size": state.config.vocab_size,
        "eos_token_ids": state.tokenizer.eos_ids,
        "weight_version": "default",
        "preferred_sampling_params": null,
        "has_image_understanding": false,
        "has_audio_understanding": false,
    })
}

/// One greedy token through the engine, bypassing the queue bound (a probe must not be refused
/// because clients filled the queue: that is load, not ill health).
async fn health_generate(state: &AppState) -> Result<(), ApiError> {
    crate::pipeline::ready(state)?;
    let prompt = state.tokenizer.encode("ping", false).ok().filter(|t| !t.is_empty()).unwrap_or_else(|| vec![0]);
    let sampling = SamplingParams { temperature: 0.0, max_tokens: Some(1), ignore_eos: true, ..Default::default() };
    let params = RequestParams { sampling, adapter: None };
    let mut sub = state
        .engine
        .submit(GenerateRequest { prompt, params, priority: 0 })
        .map_err(|e| ApiError::unavailable(format!("the engine refused the probe request: {e:?}")))?;
    // Aborts the probe if it times out or its client leaves first.
    struct Probe<'a>(&'a AppState, u64, bool);
    impl Drop for Probe<'_> {
        fn drop(&mut self) {
            if !self.2 {
                self.0.engine.abort(self.1);
            }
        }
    }
    let mut probe = Probe(state, sub.id, false);
    let wait = async {
        loop {
            match std::future::poll_fn(|cx| sub.updates.poll_next(cx)).await {
                Some(u) => {
                    if let Some(f) = u.deltas.iter().find_map(|d| d.finish.clone()) {
                        return match f {
                            FinishReason::Error(m) => {
                                Err(ApiError::unavailable(format!("the probe request failed: {m}")))
                            }
                            FinishReason::Abort => Err(ApiError::unavailable("the probe request was aborted")),
                            FinishReason::Stop | FinishReason::Length => Ok(()),
                        };
                    }
                }
                None => return Err(ApiError::unavailable("the engine ended the probe request without output")),
            }
        }
    };
    let r = tokio::time::timeout(HEALTH_GENERATE_TIMEOUT, wait).await;
    probe.2 = r.is_ok();
    r.unwrap_or_else(|_| {
        Err(ApiError::unavailable(format!(
            "the probe request produced no token within {} s",
            HEALTH_GENERATE_TIMEOUT.as_secs()
        )))
    })
}
