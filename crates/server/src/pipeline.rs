//! The one pipeline every generation endpoint runs, whatever its wire format: ready, read and
//! tokenize the body, compile the structured-output guide, start the run, then stream its
//! events or collect its answer.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_LENGTH};
use hyper::{Request, Response, StatusCode};
use serde_json::Value;

use crate::body::{EventFormat, ResponseBody};
use crate::engine_client::{FinishReason, TokenLogprob};
use crate::error::ApiError;
use crate::job::Job;
use crate::reply::{json_response, sse_response, X_REQUEST_ID};
use crate::run::Run;
use crate::state::AppState;

/// Bodies larger than this are parsed and tokenized on the blocking pool.
const BLOCKING_PARSE_BYTES: usize = 16 << 10;

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

/// The request body, within the configured size and read-time bounds.
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

/// The request with its job's structured-output form compiled, if it has one.
async fn compiled<W: WireRequest>(state: &Arc<AppState>, mut w: W) -> Result<W, ApiError> {
    if w.job().guide.is_some() {
        // Compiling a grammar can take milliseconds: off the threads that stream tokens.
        let st = state.clone();
        w = tokio::task::spawn_blocking(move || w.job_mut().compile_guide(&st).map(|()| w))
            .await
            .map_err(|e| ApiError::internal(format!("the structured-output compile task failed: {e}")))??;
    }
    Ok(w)
}

/// One choice of a whole (non-streamed) response.
#[derive(Debug, Default, Clone)]
pub struct ChoiceAcc {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    /// Its prompt's logprobs (shared by the prompt's completions).
    pub prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
    pub finish: Option<FinishReason>,
    /// The stop string that ended the text, when one did.
    pub stop_string: Option<String>,
    /// Its last token (the stop token, when one ended it) and how many it has.
    pub last_token: Option<u32>,
    pub tokens: usize,
    /// The sum of its tokens' logprobs (when logprobs were computed).
    pub cum_logprob: f64,
}

/// Waits for the whole run and gathers each choice's text. Engine failures become 500, a
/// shutdown's aborts 503, and a time bound that passed before any token 408.
pub async fn collect(run: &mut Run) -> Result<Vec<ChoiceAcc>, ApiError> {
    let mut acc = vec![ChoiceAcc::default(); run.finishes.len()];
    while let Some((p, upd)) = run.next_update().await {
        for d in upd.deltas {
            if let Some(pl) = &d.prompt_logprobs {
                for c in acc.iter_mut().skip(p * run.n).take(run.n) {
                    c.prompt_logprobs = Some(pl.clone());
                }
            }
            let Some(c) = acc.get_mut(p * run.n + d.index) else { continue };
            c.text.push_str(&d.text);
            c.tokens += d.token_ids.len();
            c.last_token = d.token_ids.last().copied().or(c.last_token);
            c.cum_logprob += d.logprobs.iter().map(|l| l.logprob as f64).sum::<f64>();
            c.logprobs.extend(d.logprobs);
            if d.finish.is_some() {
                c.finish = d.finish;
                c.stop_string = d.stop_string;
            }
        }
    }
    if let Some(e) = run.error() {
        return Err(ApiError::internal(format!("the engine failed this request: {e}")));
    }
    // Past its time bound a request answers what it has, as vLLM answers an aborted one; with
    // nothing to show, 408 says why.
    if run.timed_out() && run.completion_tokens == 0 {
        return Err(ApiError::timeout("the request ran past the server's request timeout before producing any token"));
    }
    if run.aborted() && !run.timed_out() {
        return Err(ApiError::unavailable("the request was aborted: the server is shutting down"));
    }
    Ok(acc)
}

/// A generation request in some wire format, read into its [`Job`]: what the pipeline asks of
/// it besides the job is its response's id and how its answer is written, streamed or whole.
pub(crate) trait WireRequest: Send + Sized + 'static {
    fn job(&self) -> &Job;
    fn job_mut(&mut self) -> &mut Job;
    /// Names the response (the id is kept for its answer), once the job is ready to start.
    fn id(&mut self, state: &AppState) -> String;
    /// The request field that holds the prompt, for errors about its length.
    fn prompt_param(&self) -> &'static str;
    /// The answer as server-sent events, as the run's updates come.
    fn stream(self, state: &Arc<AppState>) -> Box<dyn EventFormat>;
    /// The whole answer of a finished run.
    fn whole(self, state: &AppState, run: &Run, choices: Vec<ChoiceAcc>) -> Value;
}

/// The pipeline: ready, read (`parse`, off the async threads for a large body), compile the
/// guide, start the run, then stream its events or collect its answer. The response carries
/// its id as `X-Request-Id` (the id of the log line, for clients to quote).
pub(crate) async fn serve<W: WireRequest>(
    state: &Arc<AppState>,
    req: Request<Incoming>,
    start: Instant,
    parse: fn(&AppState, &[u8]) -> Result<W, ApiError>,
) -> Result<Response<ResponseBody>, ApiError> {
    ready(state)?;
    let mut w = compiled(state, tokenizer_call(state, req, parse).await?).await?;
    let reqs = w.job().requests(state)?;
    let id = w.id(state);
    let mut run = Run::start(state.clone(), reqs, w.prompt_param(), id.clone(), start)?;
    let request_id = HeaderValue::from_str(&id).map_err(|e| ApiError::internal(format!("bad response id: {e}")))?;
    let mut r = if w.job().p.stream {
        sse_response(run, w.stream(state))
    } else {
        // If the client leaves, hyper drops this future, and with it `run`, which aborts.
        let choices = collect(&mut run).await?;
        json_response(StatusCode::OK, &w.whole(state, &run, choices))
    };
    r.headers_mut().insert(X_REQUEST_ID, request_id);
    Ok(r)
}
