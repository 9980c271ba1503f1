//! Test support: the tiny word-level tokenizer of `tandem_server::test_support`, the real engine over the
//! engine crate's deterministic `FakeModel` (optionally slowed down), a server on 127.0.0.1
//! port 0, and a small hyper HTTP/1.1 client.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tandem_core::tokenizer::Tokenizer;
use tandem_core::ModelConfig;
use tandem_engine::fake_model::{fake_config, FakeModel};
use tandem_engine::{Engine, EngineConfig, EngineHandle};
use tandem_server::engine_adapter::{decode_fn, TandemEngine};
use tandem_server::engine_client::{EngineStats, EngineUpdate, GenerateRequest, RequestId, Submission, SubmitRefusal};
use tandem_server::{EngineClient, Server, ServerConfig};
use tokio::net::TcpStream;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

pub const VOCAB: usize = 64;
pub const MAX_LEN: usize = 256;
pub const MODEL: &str = "tiny-test";

static DIRS: AtomicUsize = AtomicUsize::new(0);

/// The tiny word-level tokenizer with a ChatML template, in a fresh temp dir.
pub fn tokenizer_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tandem-server-test-{}-{}",
        std::process::id(),
        DIRS.fetch_add(1, Ordering::SeqCst)
    ));
    tandem_server::test_support::write_tiny_tokenizer(&dir, VOCAB).unwrap();
    dir
}

pub fn tokenizer() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::from_dir(&tokenizer_dir()).unwrap())
}

/// No EOS id: generation ends on length or stop strings only, so tests know token counts.
pub fn model_config() -> ModelConfig {
    fake_config(VOCAB, &[], MAX_LEN)
}

pub struct Setup {
    pub delay: Duration,
    pub num_blocks: usize,
    pub fail_calls: Vec<usize>,
    /// Forward calls that fail as a lost device does (fatal: the engine stops).
    pub fatal_calls: Vec<usize>,
    pub config: ServerConfig,
}

impl Default for Setup {
    fn default() -> Self {
        let config = ServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            max_model_len: MAX_LEN,
            vocab_size: VOCAB,
            ..Default::default()
        };
        Setup { delay: Duration::ZERO, num_blocks: 512, fail_calls: vec![], fatal_calls: vec![], config }
    }
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub engine: Option<EngineHandle>,
    pub tokenizer: Arc<Tokenizer>,
    stop: Option<oneshot::Sender<()>>,
    pub task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    /// The real engine over `FakeModel`.
    pub async fn start(s: Setup) -> TestServer {
        let tok = tokenizer();
        let mut fake = FakeModel::new(model_config(), s.num_blocks, 16, 512, 128);
        fake.fail_calls = s.fail_calls.clone();
        fake.fatal_calls = s.fatal_calls.clone();
        // A sleep per forward, so that requests last long enough to be cut off.
        fake.delay = s.delay;
        let handle = Engine::spawn(Box::new(fake), decode_fn(tok.clone()), EngineConfig::default()).unwrap();
        let mut config = s.config;
        config.max_model_len = handle.max_model_len();
        let mut t = Self::with_client(config, TandemEngine::ready(handle.clone()), tok).await;
        t.engine = Some(handle);
        t
    }

    /// Any engine client (tests that need an engine that stalls or is not ready).
    pub async fn with_client(config: ServerConfig, engine: Arc<dyn EngineClient>, tok: Arc<Tokenizer>) -> TestServer {
        let server = Server::bind(config, engine, tok.clone(), MODEL.to_string()).await.unwrap();
        let addr = server.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async move {
            let _ = rx.await;
        }));
        TestServer { addr, engine: None, tokenizer: tok, stop: Some(tx), task: Some(task) }
    }

    pub fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    pub async fn stopped(&mut self) {
        self.shutdown();
        if let Some(t) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(10), t).await.expect("server stops").unwrap().unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown();
        if let Some(e) = &self.engine {
            e.shutdown();
        }
    }
}

/// One connection.
pub struct Client {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    pub conn: tokio::task::JoinHandle<()>,
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        Client { sender, conn }
    }

    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Response<Incoming> {
        let mut b = Request::builder().method(method).uri(path).header("host", "localhost");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        self.sender.ready().await.unwrap();
        self.sender.send_request(b.body(Full::new(body.into())).unwrap()).await.unwrap()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // Closing the socket is what a vanished client looks like to the server.
        self.conn.abort();
    }
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Reply {
    let mut c = Client::connect(addr).await;
    let r = c.send(method, path, headers, body).await;
    let (parts, body) = r.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply { status: parts.status, headers: parts.headers, body }
}

pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    request(addr, "GET", path, &[], Bytes::new()).await
}

pub async fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    request(addr, "POST", path, &[("content-type", "application/json")], body.to_string()).await
}

/// Splits a server-sent-event body into its `data:` payloads, checking the framing.
pub fn sse_events(body: &str) -> Vec<String> {
    assert!(body.ends_with("\n\n"), "events end with a blank line: {body:?}");
    body.trim_end_matches("\n\n")
        .split("\n\n")
        .map(|e| e.strip_prefix("data: ").unwrap_or_else(|| panic!("event without `data: `: {e:?}")).to_string())
        .collect()
}

/// The JSON events of a stream, checking it ends with `[DONE]` exactly once.
pub fn sse_json(body: &str) -> Vec<Value> {
    let ev = sse_events(body);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{body}");
    assert_eq!(ev.iter().filter(|e| *e == "[DONE]").count(), 1);
    ev[..ev.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap_or_else(|x| panic!("{x}: {e}"))).collect()
}

/// A metric's value from an exposition text, by exact series (`name{labels}`) prefix.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no series {series} in\n{text}"))
}

/// Text the engine streams for greedy `ids` after `prompt` (its detokenizer decodes the output
/// with the last five prompt tokens as context).
pub fn expected_text(tok: &Tokenizer, prompt: &[u32], ids: &[u32]) -> String {
    let ctx = &prompt[prompt.len().saturating_sub(5)..];
    let all: Vec<u32> = ctx.iter().chain(ids).copied().collect();
    let full = tok.decode(&all, true).unwrap();
    let pre = tok.decode(ctx, true).unwrap();
    full[pre.len()..].to_string()
}

pub fn greedy_ids(prompt: &[u32], n: usize) -> Vec<u32> {
    FakeModel::greedy(&model_config(), prompt, n, true)
}

/// An engine that accepts requests and never answers; it records aborts.
#[derive(Default)]
pub struct StallEngine {
    pub next: AtomicU64,
    pub open: Mutex<HashMap<RequestId, UnboundedSender<EngineUpdate>>>,
    pub aborted: Mutex<Vec<RequestId>>,
}

impl EngineClient for StallEngine {
    fn submit(&self, _req: GenerateRequest) -> Result<Submission, SubmitRefusal> {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.open.lock().unwrap().insert(id, tx);
        Ok(Submission::channel(id, rx))
    }
    fn abort(&self, id: RequestId) {
        // Like the real engine: the request ends with an abort, and its channel closes.
        if self.open.lock().unwrap().remove(&id).is_some() {
            self.aborted.lock().unwrap().push(id);
        }
    }
    fn stats(&self) -> EngineStats {
        EngineStats { num_running: self.open.lock().unwrap().len(), ..Default::default() }
    }
    fn is_ready(&self) -> bool {
        true
    }
}
