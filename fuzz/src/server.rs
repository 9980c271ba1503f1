//! The whole HTTP path in one process: hyper serves the real router over an in-memory pipe, and
//! an engine whose output (token ids, finish reasons, logprobs) comes from the fuzz input, so
//! request parsing, the formatters and the SSE framing all meet inputs a client or a model may
//! produce.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tandem_core::tokenizer::Tokenizer;
use tandem_server::engine_client::{
    CompletionDelta, EngineStats, EngineUpdate, FinishReason, GenerateRequest, RequestId, Submission, SubmitRefusal,
    TokenLogprob,
};
use tandem_server::{AppState, EngineClient, Server, ServerConfig};

pub const MAX_MODEL_LEN: usize = 512;

/// An engine that answers every request from a script of bytes (the fuzz input's), the way the
/// real one shapes its output: ids below the vocabulary, text decoded from them, as many
/// logprobs as were asked for, one finish per choice.
pub struct ScriptedEngine {
    tok: Arc<Tokenizer>,
    script: Mutex<Vec<u8>>,
    next: AtomicU64,
}

impl ScriptedEngine {
    pub fn set_script(&self, s: &[u8]) {
        *self.script.lock().unwrap() = s.to_vec();
    }
}

impl EngineClient for ScriptedEngine {
    fn submit(&self, req: GenerateRequest) -> Result<Submission, SubmitRefusal> {
        let script = self.script.lock().unwrap().clone();
        let mut b = crate::Bytes::new(&script);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if b.u8() == 255 {
            return Err(SubmitRefusal::Overloaded("the fuzz script refuses".into()));
        }
        let vocab = self.tok.vocab_size().max(1) as u32;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let p = &req.params.sampling;
        for index in 0..p.n {
            let budget = p.max_tokens.unwrap_or(0).min(12);
            let mut made = 0;
            let mut first = true;
            loop {
                let k = (b.u8() as usize % 4).min(budget - made);
                let ids: Vec<u32> = (0..k).map(|_| b.u32() % vocab).collect();
                made += k;
                let text = self.tok.decode(&ids, true).unwrap_or_default();
                let top = |b: &mut crate::Bytes, n: usize| {
                    (0..n).map(|_| (b.u32() % vocab, -f32::from(b.u8()) / 16.0)).collect::<Vec<_>>()
                };
                let logprobs = match p.logprobs {
                    Some(n) => ids
                        .iter()
                        .map(|&t| TokenLogprob {
                            token: t,
                            logprob: -f32::from(b.u8()) / 32.0,
                            top: top(&mut b, n.min(20)),
                            rank: None,
                        })
                        .collect(),
                    None => Vec::new(),
                };
                let prompt_logprobs = match (first, p.prompt_logprobs) {
                    (true, Some(n)) => Some(
                        (0..req.prompt.len())
                            .map(|i| {
                                (i > 0).then(|| TokenLogprob {
                                    token: req.prompt[i],
                                    logprob: -f32::from(b.u8()) / 16.0,
                                    top: top(&mut b, n.min(20)),
                                    rank: None,
                                })
                            })
                            .collect(),
                    ),
                    _ => None,
                };
                first = false;
                let end = made >= budget || b.u8() % 3 == 0;
                // Aborts come from the server itself (a timeout, a shutdown), not from a model.
                let finish = end.then(|| if b.u8() % 3 == 0 { FinishReason::Length } else { FinishReason::Stop });
                let stop_string = match &finish {
                    Some(FinishReason::Stop) if !p.stop.is_empty() && b.u8() & 1 == 1 => Some(p.stop[0].clone()),
                    _ => None,
                };
                let delta =
                    CompletionDelta { index, text, token_ids: ids, logprobs, prompt_logprobs, finish, stop_string };
                let _ = tx.send(EngineUpdate {
                    deltas: vec![delta],
                    queue_time: None,
                    num_preemptions: None,
                    num_cached_tokens: None,
                });
                if end {
                    break;
                }
            }
        }
        Ok(Submission::channel(id, rx))
    }
    fn abort(&self, _id: RequestId) {}
    fn stats(&self) -> EngineStats {
        EngineStats::default()
    }
    fn is_ready(&self) -> bool {
        true
    }
    fn max_model_len(&self) -> Option<usize> {
        Some(MAX_MODEL_LEN)
    }
}

pub struct Harness {
    pub rt: tokio::runtime::Runtime,
    /// One server per parser setting: none; hermes + qwen3; llama3_json + deepseek_r1;
    /// mistral; qwen3_xml.
    pub servers: Vec<(Arc<AppState>, Arc<ScriptedEngine>)>,
}

pub fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let dir = crate::model_dir();
        let tok = Arc::new(Tokenizer::from_dir(&dir).expect("the fuzz model's tokenizer"));
        // One structured-output compiler for all five (llguidance reads the tokenizer once).
        let structured =
            tandem_structured::Structured::from_model_dir(&dir, &tok.eos_ids).map(Arc::new).map_err(|e| e.to_string());
        let parsers = [
            (None, None),
            (Some("hermes"), Some("qwen3")),
            (Some("llama3_json"), Some("deepseek_r1")),
            (Some("mistral"), None),
            (Some("qwen3_xml"), None),
        ];
        let servers = parsers
            .iter()
            .map(|&(t, r)| {
                let engine = Arc::new(ScriptedEngine {
                    tok: tok.clone(),
                    script: Mutex::new(Vec::new()),
                    next: AtomicU64::new(1),
                });
                let config = ServerConfig {
                    addr: SocketAddr::from(([127, 0, 0, 1], 0)),
                    max_model_len: MAX_MODEL_LEN,
                    vocab_size: tok.vocab_size(),
                    max_body_bytes: 1 << 16,
                    tool_call_parser: t.and_then(tandem_server::tool_parser::ToolParser::from_name),
                    reasoning_parser: r.and_then(tandem_server::reasoning::ReasoningParser::from_name),
                    ..ServerConfig::default()
                };
                let server =
                    rt.block_on(Server::bind(config, engine.clone(), tok.clone(), "fuzz-model".into())).expect("bind");
                server.set_structured(structured.clone());
                (server.state(), engine)
            })
            .collect();
        Harness { rt, servers }
    })
}

pub struct Answer {
    pub status: StatusCode,
    pub content_type: String,
    pub body: Vec<u8>,
}

/// Sends one request through hyper and the router, and reads the whole answer.
pub fn send(
    state: &Arc<AppState>,
    rt: &tokio::runtime::Runtime,
    method: hyper::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Answer {
    rt.block_on(async {
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let st = state.clone();
        let conn = tokio::spawn(async move {
            let svc = service_fn(move |req| tandem_server::router::handle(st.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(server_io), svc).await;
        });
        let (mut sender, client_conn) =
            hyper::client::conn::http1::handshake::<_, Full<bytes::Bytes>>(TokioIo::new(client_io))
                .await
                .expect("handshake");
        let client = tokio::spawn(client_conn);
        let mut req = Request::builder().method(method).uri(path).header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(bytes::Bytes::from(body))).expect("a request");
        let resp = sender.send_request(req).await.expect("an answer");
        let status = resp.status();
        let content_type = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let body = resp.into_body().collect().await.expect("the whole body").to_bytes().to_vec();
        drop(sender);
        let _ = client.await;
        let _ = conn.await;
        Answer { status, content_type, body }
    })
}

/// Checks a server-sent-event body: events separated by a blank line, each made of
/// `event:`/`data:` lines, every `data:` JSON (or OpenAI's `[DONE]`). Returns what is wrong.
pub fn check_sse(body: &str) -> Result<usize, String> {
    if !body.ends_with("\n\n") {
        return Err("the stream does not end with a blank line".into());
    }
    let mut events = 0;
    for ev in body[..body.len() - 2].split("\n\n") {
        events += 1;
        for line in ev.split('\n') {
            if let Some(d) = line.strip_prefix("data: ") {
                if d != "[DONE]" {
                    serde_json::from_str::<serde_json::Value>(d)
                        .map_err(|e| format!("event {events}: data is not JSON ({e}): {d:?}"))?;
                }
            } else if !line.starts_with("event: ") {
                return Err(format!("event {events}: a line that is neither `event:` nor `data:`: {line:?}"));
            }
        }
    }
    Ok(events)
}
