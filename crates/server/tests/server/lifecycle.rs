//! Requests over their lifetime: clients that vanish (streaming or not) abort their requests
//! and free their KV blocks; the bounded queue answers 429 at once; 64 concurrent streams
//! match their whole answers; shutdown drains, then aborts what outlives its deadline.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tandem_server::engine_client::{
    EngineClient, EngineStats, EngineUpdate, GenerateRequest, RequestId, Submission, SubmitRefusal,
};
use tandem_server::ServerConfig;

fn l() -> String {
    format!("{{model_name=\"{MODEL}\",engine=\"0\"}}")
}

/// Polls /metrics until nothing runs and every KV block is free; returns how long it took.
async fn wait_idle(s: &TestServer) -> Duration {
    let t = Instant::now();
    let mut m = String::new();
    while t.elapsed() < Duration::from_secs(2) {
        m = get(s.addr, "/metrics").await.text();
        if metric(&m, &format!("vllm:num_requests_running{}", l())) == 0.0
            && metric(&m, &format!("vllm:kv_cache_usage_perc{}", l())) == 0.0
        {
            return t.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!(
        "the engine did not go idle within 2 s:\n{}",
        m.lines().filter(|l| !l.starts_with('#') && !l.contains("_bucket")).collect::<Vec<_>>().join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_client_that_leaves_aborts_its_request() {
    let s = TestServer::start(Setup { delay: Duration::from_millis(5), ..Default::default() }).await;
    let mut c = Client::connect(s.addr).await;
    let body = json!({"prompt": "hello world", "max_tokens": 200, "stream": true, "ignore_eos": true}).to_string();
    let r = c.send("POST", "/v1/completions", &[], body).await;
    assert_eq!(r.status(), 200);
    let mut body = r.into_body();
    let mut tokens = 0;
    while tokens < 3 {
        let f = body.frame().await.unwrap().unwrap();
        tokens += f.data_ref().map_or(0, |d| String::from_utf8_lossy(d).matches("\"text\"").count());
    }
    // The request is running and holds KV blocks now.
    let m = get(s.addr, "/metrics").await.text();
    assert_eq!(metric(&m, &format!("vllm:num_requests_running{}", l())), 1.0);
    assert!(metric(&m, &format!("vllm:kv_cache_usage_perc{}", l())) > 0.0);
    drop(body);
    drop(c);
    let aborts = format!("vllm:request_success_total{{model_name=\"{MODEL}\",engine=\"0\",finished_reason=\"abort\"}}");
    let t = Instant::now();
    while metric(&get(s.addr, "/metrics").await.text(), &aborts) < 1.0 {
        assert!(t.elapsed() < Duration::from_secs(2), "the server did not notice the client leaving");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    eprintln!("streaming client gone -> request aborted in {:?}", t.elapsed());
    // The engine publishes its gauges after a step; when an abort leaves it idle it publishes
    // nothing more (reported to the engine's owner), so one short request makes it step once.
    let probe = post(s.addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 1})).await;
    assert_eq!(probe.status, 200);
    let took = wait_idle(&s).await;
    eprintln!("then engine idle, every KV block free, in {took:?}");
    let m = get(s.addr, "/metrics").await.text();
    assert_eq!(metric(&m, &aborts), 1.0);
    assert!(metric(&m, &format!("vllm:generation_tokens_total{}", l())) < 100.0, "aborted long before max_tokens");
}

/// Streams `body` to `path` on a server whose engine never answers (StallEngine), then drops
/// the client once the 200 arrives: the server must abort the engine request (id 0) within 2 s.
/// The Responses and Messages routes' disconnect tests.
pub async fn streaming_client_that_leaves_aborts(path: &str, body: Value) {
    let engine = Arc::new(StallEngine::default());
    let config = ServerConfig {
        addr: ([127, 0, 0, 1], 0).into(),
        max_model_len: MAX_LEN,
        vocab_size: VOCAB,
        ..Default::default()
    };
    let s = TestServer::with_client(config, engine.clone(), tokenizer()).await;
    let mut c = Client::connect(s.addr).await;
    let r = c.send("POST", path, &[], body.to_string()).await;
    assert_eq!(r.status(), 200);
    drop(r);
    drop(c);
    let t = Instant::now();
    while engine.aborted.lock().unwrap().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(2), "{path}: the request is aborted when its client leaves");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(*engine.aborted.lock().unwrap(), vec![0], "{path}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streaming_client_that_leaves_aborts_its_request() {
    let engine = Arc::new(StallEngine::default());
    let config = ServerConfig {
        addr: ([127, 0, 0, 1], 0).into(),
        max_model_len: MAX_LEN,
        vocab_size: VOCAB,
        ..Default::default()
    };
    let s = TestServer::with_client(config, engine.clone(), tokenizer()).await;
    let mut c = Client::connect(s.addr).await;
    let pending = tokio::spawn(async move {
        let _r = c.send("POST", "/v1/completions", &[], json!({"prompt": "hi"}).to_string()).await;
    });
    let t = Instant::now();
    while engine.open.lock().unwrap().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(2), "request never reached the engine");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    pending.abort(); // drops the client, closing its socket
    let t = Instant::now();
    while engine.aborted.lock().unwrap().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(2), "the server did not abort after the client left");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    eprintln!("non-streaming client gone -> abort in {:?}", t.elapsed());
    assert_eq!(*engine.aborted.lock().unwrap(), vec![0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_answers_429_at_once() {
    let engine = Arc::new(StallEngine::default());
    // One may run and one may wait: two in all.
    let config = ServerConfig {
        addr: ([127, 0, 0, 1], 0).into(),
        max_model_len: MAX_LEN,
        vocab_size: VOCAB,
        max_num_seqs: 1,
        max_queued_requests: 1,
        ..Default::default()
    };
    let s = TestServer::with_client(config, engine.clone(), tokenizer()).await;
    let addr = s.addr;
    let waiting: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { post(addr, "/v1/completions", &json!({"prompt": "hi"})).await }))
        .collect();
    let t = Instant::now();
    while engine.open.lock().unwrap().len() < 2 {
        assert!(t.elapsed() < Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let t = Instant::now();
    // A prompt list needs two slots: refused as a whole, nothing submitted.
    for body in [json!({"prompt": "hi"}), json!({"prompt": ["a", "b"]})] {
        let r = post(s.addr, "/v1/completions", &body).await;
        assert_eq!(r.status, 429, "{}", r.text());
        assert_eq!(r.headers["retry-after"], "1");
        assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");
    }
    assert!(t.elapsed() < Duration::from_millis(500), "429 must not wait");
    assert_eq!(metric(&get(s.addr, "/metrics").await.text(), &format!("tandem:server_queued_requests{}", l())), 2.0);
    assert_eq!(engine.open.lock().unwrap().len(), 2);
    for w in waiting {
        w.abort();
    }
    let t = Instant::now();
    while engine.aborted.lock().unwrap().len() < 2 {
        assert!(t.elapsed() < Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Slots are free again: a request is accepted (and stalls) rather than refused.
    let mut c = Client::connect(s.addr).await;
    let r = tokio::time::timeout(
        Duration::from_millis(200),
        c.send("POST", "/v1/completions", &[], json!({"prompt": "hi"}).to_string()),
    )
    .await;
    assert!(r.is_err(), "accepted into the queue, so no answer yet");
}

/// Issue 15, findings 2 and 3: `--max-num-seqs 8 --max-queued-requests 4` refused four of eight
/// concurrent requests (the bound counted requests until their first token), and a request
/// with more prompts than the bound got 429 forever instead of a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_bound_counts_only_what_waits_beyond_the_running_set() {
    let engine = Arc::new(StallEngine::default());
    let config = ServerConfig {
        addr: ([127, 0, 0, 1], 0).into(),
        max_model_len: MAX_LEN,
        vocab_size: VOCAB,
        max_num_seqs: 8,
        max_queued_requests: 4,
        ..Default::default()
    };
    let s = TestServer::with_client(config, engine.clone(), tokenizer()).await;
    let addr = s.addr;
    let open: Vec<_> = (0..12)
        .map(|_| tokio::spawn(async move { post(addr, "/v1/completions", &json!({"prompt": "hi"})).await }))
        .collect();
    let t = Instant::now();
    while engine.open.lock().unwrap().len() < 12 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "8 running + 4 waiting must all be accepted, got {}",
            engine.open.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let r = post(s.addr, "/v1/completions", &json!({"prompt": "hi"})).await;
    assert_eq!(r.status, 429, "the 13th waits beyond the bound: {}", r.text());
    // 13 sequences can never be admitted at once: 400, whatever else is waiting.
    let prompts: Vec<&str> = vec!["hi"; 13];
    let r = post(s.addr, "/v1/completions", &json!({"prompt": prompts})).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "prompt");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("8 running + 4 queued"), "{}", r.text());
    let r = post(s.addr, "/v1/completions", &json!({"prompt": "hi", "n": 13})).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "n");
    for o in open {
        o.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_streams_equal_their_whole_answers() {
    let s = TestServer::start(Setup::default()).await;
    let addr = s.addr;
    let body = |i: usize| json!({"prompt": format!("hello w{} the cat w{}", i % 40, i / 40), "max_tokens": 24, "temperature": 0.8, "seed": i, "top_k": 16});
    // Whole answers, one at a time.
    let mut whole = Vec::new();
    for i in 0..64 {
        let r = post(addr, "/v1/completions", &body(i)).await;
        assert_eq!(r.status, 200);
        whole.push(r.json()["choices"][0]["text"].as_str().unwrap().to_string());
    }
    // The same 64 requests streamed at once: seeded sampling must not depend on the batch.
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let mut b = body(i);
            b["stream"] = json!(true);
            tokio::spawn(async move {
                let r = post(addr, "/v1/completions", &b).await;
                assert_eq!(r.status, 200);
                let ev = sse_json(&r.text());
                assert_eq!(ev.last().unwrap()["choices"][0]["finish_reason"], "length");
                ev.iter().map(|e| e["choices"][0]["text"].as_str().unwrap().to_string()).collect::<String>()
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap(), whole[i], "request {i}");
    }
    let distinct: std::collections::HashSet<_> = whole.iter().collect();
    assert!(distinct.len() > 32, "prompts and seeds differ, so texts should too");
    wait_idle(&s).await;
}

async fn read_stream(mut body: hyper::body::Incoming) -> String {
    let mut out = Vec::new();
    while let Some(f) = body.frame().await {
        if let Ok(d) = f.unwrap().into_data() {
            out.extend_from_slice(&d);
        }
    }
    String::from_utf8(out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_running_requests_finish() {
    let mut s = TestServer::start(Setup { delay: Duration::from_millis(3), ..Default::default() }).await;
    let mut c = Client::connect(s.addr).await;
    let r = c
        .send("POST", "/v1/completions", &[], json!({"prompt": "hi", "max_tokens": 30, "stream": true}).to_string())
        .await;
    let mut body = r.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    s.shutdown();
    let rest = read_stream(body).await;
    let ev = sse_json(&(String::from_utf8_lossy(&first).into_owned() + &rest));
    assert_eq!(ev.last().unwrap()["choices"][0]["finish_reason"], "length");
    let n: usize = ev.len();
    assert!(n >= 2);
    s.stopped().await;
    assert!(tokio::net::TcpStream::connect(s.addr).await.is_err(), "no longer accepting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_aborts_what_outlives_the_deadline() {
    let mut setup = Setup { delay: Duration::from_millis(5), ..Default::default() };
    setup.config.shutdown_grace = Duration::from_millis(100);
    let mut s = TestServer::start(setup).await;
    let mut c = Client::connect(s.addr).await;
    let r = c
        .send("POST", "/v1/completions", &[], json!({"prompt": "hi", "max_tokens": 200, "stream": true}).to_string())
        .await;
    let mut body = r.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let t = Instant::now();
    s.shutdown();
    let rest = read_stream(body).await;
    let ev = sse_json(&(String::from_utf8_lossy(&first).into_owned() + &rest));
    let last: &Value = ev.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "abort");
    s.stopped().await;
    let took = t.elapsed();
    assert!(took < Duration::from_secs(3), "{took:?}");
    eprintln!("shutdown with a 100 ms grace took {took:?}");
}

/// Sends one token, then drops its end of the channel without finishing: an engine that died.
struct DyingEngine;

impl EngineClient for DyingEngine {
    fn submit(&self, req: GenerateRequest) -> Result<Submission, SubmitRefusal> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let d = tandem_server::engine_client::CompletionDelta {
            index: 0,
            text: " hello".into(),
            token_ids: vec![5],
            logprobs: vec![],
            prompt_logprobs: None,
            finish: None,
            stop_string: None,
        };
        tx.send(EngineUpdate { deltas: vec![d], ..Default::default() }).unwrap();
        assert_eq!(req.params.sampling.n, 2);
        Ok(Submission::channel(1, rx))
    }
    fn abort(&self, _id: RequestId) {}
    fn stats(&self) -> EngineStats {
        EngineStats::default()
    }
    fn is_ready(&self) -> bool {
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_stream_that_ends_early_fails_its_choices() {
    let config = ServerConfig {
        addr: ([127, 0, 0, 1], 0).into(),
        max_model_len: MAX_LEN,
        vocab_size: VOCAB,
        ..Default::default()
    };
    let s = TestServer::with_client(config, Arc::new(DyingEngine), tokenizer()).await;
    let r = post(s.addr, "/v1/completions", &json!({"prompt": "hi", "n": 2})).await;
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("engine stopped"));
    let r = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "n": 2, "stream": true}),
    )
    .await;
    assert_eq!(r.status, 200);
    let ev = sse_json(&r.text());
    assert_eq!(ev[1]["choices"][0]["delta"]["content"], " hello");
    let errors = ev.iter().filter(|e| e.get("error").is_some()).count();
    let finishes: Vec<&Value> = ev
        .iter()
        .flat_map(|e| e["choices"].as_array().into_iter().flatten())
        .filter_map(|c| c.get("finish_reason").filter(|f| !f.is_null()))
        .collect();
    assert_eq!(errors, 1, "one error event for the request");
    assert_eq!(finishes, vec!["error", "error"], "both choices end");
}
