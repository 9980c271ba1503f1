//! Server benchmarks on loopback (numbers, not pass/fail):
//!
//! 1. `/health` requests per second: keep-alive connections, one request in flight each.
//! 2. Latency the server adds per streamed token: a stand-in engine steps every millisecond,
//!    sending one token to each open request and stamping each send; the client stamps each token's arrival; the difference
//!    is everything between the engine's channel and the client's socket (Run, SSE formatting,
//!    hyper, the kernel). Measured with 1 stream and with 64 concurrent streams.
//!
//! 3. The same through the real engine (`tandem_engine` over its `FakeModel`, paced at one step
//!    per millisecond): from the end of each forward pass to the client. This includes the
//!    engine's own sampling and detokenizing, so it bounds the server's share from above.
//!
//! Run: `cargo run -p tandem-server --example bench [health_secs] [connections]`
//! (the dev profile is optimised). Client and server share the machine's cores.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tandem_server::engine_client::{
    CompletionDelta, EngineClient, EngineStats, EngineUpdate, FinishReason, GenerateRequest, RequestId, Submission,
    SubmitRefusal,
};
use tandem_server::{Server, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Per request: the instant each token was sent.
type SendLog = Arc<Mutex<Vec<(RequestId, Vec<Instant>)>>>;

/// A stand-in engine: one thread that, every `interval` (a "step"), sends one token to each
/// open request, like a real engine's step, and stamps each send.
struct EmitEngine {
    next: AtomicU64,
    incoming: Arc<Mutex<Vec<Open>>>,
    sent: SendLog,
}

struct Open {
    id: RequestId,
    tx: tokio::sync::mpsc::UnboundedSender<EngineUpdate>,
    left: usize,
    stamps: Vec<Instant>,
}

impl EmitEngine {
    fn start(interval: Duration) -> Arc<Self> {
        let e = Arc::new(EmitEngine { next: AtomicU64::new(0), incoming: Arc::default(), sent: Arc::default() });
        let (incoming, sent) = (e.incoming.clone(), e.sent.clone());
        std::thread::spawn(move || {
            let mut open: Vec<Open> = Vec::new();
            let mut due = Instant::now();
            loop {
                // Pace by deadline, not by sleep length, so steps do not drift.
                due += interval;
                while Instant::now() < due {
                    std::thread::sleep(due - Instant::now());
                }
                open.append(&mut incoming.lock().unwrap());
                for o in &mut open {
                    o.left -= 1;
                    let finish = (o.left == 0).then_some(FinishReason::Length);
                    o.stamps.push(Instant::now());
                    let d = CompletionDelta {
                        index: 0,
                        text: format!(" r{}", o.id),
                        token_ids: vec![7],
                        logprobs: vec![],
                        prompt_logprobs: None,
                        finish,
                        stop_string: None,
                    };
                    let _ = o.tx.send(EngineUpdate {
                        deltas: vec![d],
                        queue_time: Some(Duration::ZERO),
                        ..Default::default()
                    });
                }
                let (done, still): (Vec<Open>, Vec<Open>) = open.drain(..).partition(|o| o.left == 0);
                open = still;
                sent.lock().unwrap().extend(done.into_iter().map(|o| (o.id, o.stamps)));
            }
        });
        e
    }
}

impl EngineClient for EmitEngine {
    fn submit(&self, req: GenerateRequest) -> Result<Submission, SubmitRefusal> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.incoming.lock().unwrap().push(Open {
            id,
            tx,
            left: req.params.sampling.max_tokens.unwrap_or(0),
            stamps: vec![],
        });
        Ok(Submission::channel(id, rx))
    }
    fn abort(&self, _id: RequestId) {}
    fn stats(&self) -> EngineStats {
        EngineStats::default()
    }
    fn is_ready(&self) -> bool {
        true
    }
}

/// A WordLevel tokenizer of 64 plain words `w0`..`w63` (no special tokens, so every token
/// has text and makes one event).
fn tokenizer() -> Arc<tandem_core::tokenizer::Tokenizer> {
    let dir = std::env::temp_dir().join(format!("tandem-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let vocab: serde_json::Map<String, serde_json::Value> = (0..64).map(|i| (format!("w{i}"), json!(i))).collect();
    let tok = json!({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}});
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    Arc::new(tandem_core::tokenizer::Tokenizer::from_dir(&dir).unwrap())
}

async fn health_client(addr: SocketAddr, until: Instant) -> u64 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let req = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n";
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    while Instant::now() < until {
        s.write_all(req).await.unwrap();
        let mut have = 0;
        // The reply has no body: it ends at the blank line.
        while !buf[..have].windows(4).any(|w| w == b"\r\n\r\n") {
            let r = s.read(&mut buf[have..]).await.unwrap();
            assert!(r > 0, "server closed");
            have += r;
        }
        assert!(buf.starts_with(b"HTTP/1.1 200"));
        n += 1;
    }
    n
}

/// Streams one completion over a raw socket; returns the engine's request id (each token's
/// text is ` r<id>`) and each token's arrival time.
async fn stream_client(addr: SocketAddr, tokens: usize) -> (RequestId, Vec<Instant>) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let body = json!({"prompt": "w1 w2", "max_tokens": tokens, "stream": true}).to_string();
    let req = format!("POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len());
    s.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::with_capacity(tokens);
    let mut buf = vec![0u8; 65536];
    let mut tail: Vec<u8> = Vec::new();
    let mut id = None;
    loop {
        let r = s.read(&mut buf).await.unwrap();
        if r == 0 {
            break;
        }
        let now = Instant::now();
        // Count `"text":" r<id>"` occurrences (one per token), across read boundaries.
        tail.extend_from_slice(&buf[..r]);
        let pat = b"\"text\":\" ";
        let mut i = 0;
        while let Some(p) = tail[i..].windows(pat.len()).position(|w| w == pat) {
            let at = i + p + pat.len();
            let Some(end) = tail[at..].iter().position(|&b| b == b'"') else { break };
            // The stand-in engine's tokens read ` r<id>`; the real engine's ` w<n>`.
            id = id
                .or_else(|| {
                    std::str::from_utf8(&tail[at..at + end]).ok().and_then(|x| x.strip_prefix('r')?.parse().ok())
                })
                .or(Some(u64::MAX));
            got.push(now);
            i = at + end;
        }
        let done = tail.windows(12).any(|w| w == b"data: [DONE]");
        // Keep only what may still hold the start of a token.
        tail.drain(..i);
        if done {
            break;
        }
    }
    (id.expect("tokens arrived"), got)
}

/// `FakeModel` paced at one step per `delay`, recording when each forward pass ends.
struct StampModel {
    inner: tandem_engine::fake_model::FakeModel,
    delay: Duration,
    ends: Arc<Mutex<Vec<Instant>>>,
}

impl tandem_core::ModelRunner for StampModel {
    fn config(&self) -> &tandem_core::ModelConfig {
        self.inner.config()
    }
    fn backend_name(&self) -> &'static str {
        "fake-stamped"
    }
    fn kv_geometry(&self) -> tandem_core::backend::KvGeometry {
        self.inner.kv_geometry()
    }
    fn max_batch_tokens(&self) -> usize {
        self.inner.max_batch_tokens()
    }
    fn max_seqs(&self) -> usize {
        self.inner.max_seqs()
    }
    fn forward(&mut self, b: &tandem_core::ForwardBatch) -> tandem_core::Result<Vec<f32>> {
        std::thread::sleep(self.delay);
        let r = self.inner.forward(b);
        self.ends.lock().unwrap().push(Instant::now());
        r
    }
}

fn summary(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    let pct = |p: f64| v[((v.len() - 1) as f64 * p) as usize];
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    format!(
        "n={} mean={mean:.1}us p50={:.1}us p90={:.1}us p99={:.1}us max={:.1}us",
        v.len(),
        pct(0.5),
        pct(0.9),
        pct(0.99),
        pct(1.0)
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let conns: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(32);
    let engine = EmitEngine::start(Duration::from_micros(1000));
    let sent = engine.sent.clone();
    let config =
        ServerConfig { addr: ([127, 0, 0, 1], 0).into(), vocab_size: 8, max_model_len: 100_000, ..Default::default() };
    let server = Server::bind(config, engine, tokenizer(), "bench".into()).await.unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.run(std::future::pending()));

    // 1. /health
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let t = Instant::now();
    let tasks: Vec<_> = (0..conns).map(|_| tokio::spawn(health_client(addr, until))).collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    println!(
        "/health: {total} requests in {:.2}s over {conns} keep-alive connections = {:.0} req/s",
        t.elapsed().as_secs_f64(),
        total as f64 / t.elapsed().as_secs_f64()
    );

    // 2. added latency per streamed token
    for streams in [1usize, 64] {
        sent.lock().unwrap().clear();
        let tokens = 500;
        let tasks: Vec<_> = (0..streams).map(|_| tokio::spawn(stream_client(addr, tokens))).collect();
        let mut arrivals = Vec::new();
        for t in tasks {
            arrivals.push(t.await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let sent: std::collections::HashMap<RequestId, Vec<Instant>> = sent.lock().unwrap().iter().cloned().collect();
        let mut lat = Vec::new();
        for (id, a) in &arrivals {
            let s = &sent[id];
            assert_eq!(a.len(), s.len(), "every token arrived");
            lat.extend(a.iter().zip(s.iter()).map(|(a, s)| (*a - *s).as_secs_f64() * 1e6));
        }
        println!(
            "engine send -> client receive, {streams} stream(s) x {tokens} tokens (one engine step per ms): {}",
            summary(lat)
        );
    }

    // 3. the real engine
    let tok = tokenizer();
    let ends = Arc::new(Mutex::new(Vec::new()));
    let fake = tandem_engine::fake_model::FakeModel::new(
        tandem_engine::fake_model::fake_config(64, &[], 4096),
        512,
        16,
        512,
        64,
    );
    let model = StampModel { inner: fake, delay: Duration::from_millis(1), ends: ends.clone() };
    let handle = tandem_engine::Engine::spawn(
        Box::new(model),
        tandem_server::engine_adapter::decode_fn(tok.clone()),
        Default::default(),
    )
    .unwrap();
    let config = ServerConfig {
        addr: ([127, 0, 0, 1], 0).into(),
        vocab_size: 64,
        max_model_len: handle.max_model_len(),
        ..Default::default()
    };
    let server =
        Server::bind(config, tandem_server::engine_adapter::TandemEngine::ready(handle.clone()), tok, "bench".into())
            .await
            .unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.run(std::future::pending()));
    let tokens = 300;
    let (_, arrivals) = stream_client(addr, tokens).await;
    let ends = ends.lock().unwrap().clone();
    // One request: forward call k (the prefill is call 0) yields output token k.
    assert_eq!(arrivals.len(), tokens, "one event per token");
    assert_eq!(ends.len(), tokens);
    let lat: Vec<f64> = arrivals.iter().zip(&ends).map(|(a, e)| (*a - *e).as_secs_f64() * 1e6).collect();
    println!("real engine: forward end -> client receive, 1 stream x {tokens} tokens (1 ms steps): {}", summary(lat));
    handle.shutdown();
}
