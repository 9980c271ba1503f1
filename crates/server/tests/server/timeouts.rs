//! The server's time bounds (issue 15, findings 6 and 7), each reproduced by a client that
//! misbehaves on loopback: a body that stops half way is answered 408 and its connection
//! closed; a request past `request_timeout` ends with finish_reason "abort" (or 408 when it has
//! nothing to show) and its engine request is aborted; on shutdown, connections with no request
//! in progress are dropped at once, so the server exits when the last stream ends.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use http_body_util::BodyExt;
use serde_json::json;
use tandem_server::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn config() -> ServerConfig {
    ServerConfig { addr: ([127, 0, 0, 1], 0).into(), max_model_len: MAX_LEN, vocab_size: VOCAB, ..Default::default() }
}

fn l() -> String {
    format!("{{model_name=\"{MODEL}\",engine=\"0\"}}")
}

/// Reads until the peer closes; panics if that takes longer than `limit`.
async fn read_to_close(sock: &mut TcpStream, limit: Duration) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let t = Instant::now();
    loop {
        let left = limit
            .checked_sub(t.elapsed())
            .unwrap_or_else(|| panic!("still open after {limit:?}; got {:?}", String::from_utf8_lossy(&out)));
        match tokio::time::timeout(left, sock.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return String::from_utf8_lossy(&out).into_owned(),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => panic!("still open after {limit:?}; got {:?}", String::from_utf8_lossy(&out)),
        }
    }
}

/// The engine has stepped past every abort: nothing runs and every KV block is free.
async fn wait_idle(s: &TestServer) {
    // The engine publishes its gauges after a step; an abort that leaves it idle publishes
    // nothing more, so one short request makes it step once.
    assert_eq!(post(s.addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 1})).await.status, 200);
    let t = Instant::now();
    loop {
        let m = get(s.addr, "/metrics").await.text();
        if metric(&m, &format!("vllm:num_requests_running{}", l())) == 0.0
            && metric(&m, &format!("vllm:kv_cache_usage_perc{}", l())) == 0.0
        {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(2), "the engine did not go idle");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_half_way_is_408_and_the_connection_closed() {
    let mut setup = Setup::default();
    setup.config.body_read_timeout = Duration::from_millis(300);
    let s = TestServer::start(setup).await;
    // Complete headers, then 11 of the 100 body bytes promised, then silence.
    for (path, framing, part) in [
        ("/v1/completions", "content-length: 100\r\n", "{\"prompt\": "),
        ("/tokenize", "transfer-encoding: chunked\r\n", "b\r\n{\"prompt\": \r\n"),
    ] {
        let mut sock = TcpStream::connect(s.addr).await.unwrap();
        let t = Instant::now();
        sock.write_all(
            format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{framing}\r\n{part}")
                .as_bytes(),
        )
        .await
        .unwrap();
        let reply = read_to_close(&mut sock, Duration::from_secs(5)).await;
        let took = t.elapsed();
        assert!(reply.starts_with("HTTP/1.1 408"), "{path}: {reply}");
        assert!(reply.to_ascii_lowercase().contains("connection: close"), "{reply}");
        assert!(reply.contains("did not arrive within 0.3 s"), "{reply}");
        assert!(took >= Duration::from_millis(300), "answered before the timeout: {took:?}");
        eprintln!("{path}: half a body -> 408 and closed after {took:?}");
    }
    // A body that does arrive in time is unaffected.
    assert_eq!(post(s.addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 2})).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_past_the_request_timeout_ends_every_choice_with_abort() {
    let mut setup = Setup { delay: Duration::from_millis(10), ..Default::default() };
    setup.config.request_timeout = Some(Duration::from_millis(500));
    let s = TestServer::start(setup).await;
    let t = Instant::now();
    let body = json!({"prompt": "hello world", "max_tokens": 200, "n": 2, "stream": true, "ignore_eos": true, "stream_options": {"include_usage": true}});
    let r = post(s.addr, "/v1/completions", &body).await;
    let took = t.elapsed();
    assert_eq!(r.status, 200);
    let ev = sse_json(&r.text()); // ends with [DONE] exactly once
    let finishes: Vec<(u64, String)> = ev
        .iter()
        .flat_map(|e| e["choices"].as_array().into_iter().flatten())
        .filter(|c| !c["finish_reason"].is_null())
        .map(|c| (c["index"].as_u64().unwrap(), c["finish_reason"].as_str().unwrap().to_string()))
        .collect();
    let mut sorted = finishes.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        vec![(0, "abort".to_string()), (1, "abort".to_string())],
        "both choices end, once each: {finishes:?}"
    );
    let usage = &ev.last().unwrap()["usage"];
    let produced = usage["completion_tokens"].as_u64().unwrap();
    assert!(produced > 0 && produced < 400, "cut off mid-way: {usage}");
    assert!(took >= Duration::from_millis(500) && took < Duration::from_secs(3), "{took:?}");
    eprintln!("stream cut at the 500 ms bound after {took:?}, {produced} tokens");
    let m = get(s.addr, "/metrics").await.text();
    assert_eq!(
        metric(
            &m,
            &format!("vllm:request_success_total{{model_name=\"{MODEL}\",engine=\"0\",finished_reason=\"abort\"}}")
        ),
        2.0
    );
    assert!(metric(&m, &format!("vllm:generation_tokens_total{}", l())) < 400.0);
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_response_past_the_request_timeout_answers_its_text_with_abort() {
    let mut setup = Setup { delay: Duration::from_millis(10), ..Default::default() };
    setup.config.request_timeout = Some(Duration::from_millis(500));
    let s = TestServer::start(setup).await;
    let r = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "ignore_eos": true}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "abort", "{v}");
    let produced = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(produced > 0, "{v}");
    assert!(!v["choices"][0]["message"]["content"].as_str().unwrap().is_empty(), "the text produced so far: {v}");
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_nothing_by_its_timeout_is_408_and_aborted() {
    let engine = Arc::new(StallEngine::default());
    let mut c = config();
    c.request_timeout = Some(Duration::from_millis(200));
    let s = TestServer::with_client(c, engine.clone(), tokenizer()).await;
    let t = Instant::now();
    let r = post(s.addr, "/v1/completions", &json!({"prompt": "hi"})).await;
    let took = t.elapsed();
    assert_eq!(r.status, 408, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "timeout_error");
    assert!(took >= Duration::from_millis(200) && took < Duration::from_secs(2), "{took:?}");
    assert_eq!(*engine.aborted.lock().unwrap(), vec![0], "the engine request is aborted (its KV freed)");
    // Streamed, the headers left at once, so the bound ends the stream instead: abort, [DONE].
    let r =
        post(s.addr, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}))
            .await;
    assert_eq!(r.status, 200);
    let ev = sse_json(&r.text());
    assert_eq!(ev.last().unwrap()["choices"][0]["finish_reason"], "abort", "{ev:?}");
    assert_eq!(*engine.aborted.lock().unwrap(), vec![0, 1]);
    let m = get(s.addr, "/metrics").await.text();
    assert_eq!(
        metric(
            &m,
            &format!("vllm:request_success_total{{model_name=\"{MODEL}\",engine=\"0\",finished_reason=\"abort\"}}")
        ),
        2.0
    );
    assert_eq!(metric(&m, &format!("tandem:server_queued_requests{}", l())), 0.0, "queue slots released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_request_timeout_nothing_is_cut() {
    let engine = Arc::new(StallEngine::default());
    let s = TestServer::with_client(config(), engine.clone(), tokenizer()).await;
    let mut c = Client::connect(s.addr).await;
    // The request stays in flight while we look: dropping it first would close the connection,
    // and the server's abort of a vanished client could race the check below.
    let pending = tokio::spawn(async move {
        c.send("POST", "/v1/completions", &[], json!({"prompt": "hi"}).to_string()).await.status()
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!pending.is_finished(), "no answer: the request still waits on the engine");
    assert!(engine.aborted.lock().unwrap().is_empty());
    pending.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drops_idle_connections_and_exits_when_the_last_stream_ends() {
    // The default 30 s grace and 30 s header timeout: either would show in the exit time.
    let mut s = TestServer::start(Setup { delay: Duration::from_millis(5), ..Default::default() }).await;
    assert_eq!(Setup::default().config.shutdown_grace, Duration::from_secs(30));
    // Headers half sent.
    let mut half = TcpStream::connect(s.addr).await.unwrap();
    half.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    // Keep-alive, idle after one request.
    let mut idle = Client::connect(s.addr).await;
    let r = idle.send("GET", "/health", &[], "").await;
    assert_eq!(r.status(), 200);
    r.into_body().collect().await.unwrap();
    // Connected, nothing sent.
    let mut silent = TcpStream::connect(s.addr).await.unwrap();
    // A stream in flight, which must finish whole.
    let mut c = Client::connect(s.addr).await;
    let r = c
        .send(
            "POST",
            "/v1/completions",
            &[],
            json!({"prompt": "hi", "max_tokens": 40, "stream": true, "ignore_eos": true}).to_string(),
        )
        .await;
    let mut body = r.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await; // every socket above is accepted by now
    let t = Instant::now();
    s.shutdown();
    // The idle sockets close at once, while the stream goes on.
    read_to_close(&mut half, Duration::from_secs(1)).await;
    read_to_close(&mut silent, Duration::from_secs(1)).await;
    let closed_idle = t.elapsed();
    let mut rest = Vec::new();
    while let Some(f) = body.frame().await {
        if let Ok(d) = f.unwrap().into_data() {
            rest.extend_from_slice(&d);
        }
    }
    let stream_end = t.elapsed();
    let ev = sse_json(&(String::from_utf8_lossy(&first).into_owned() + &String::from_utf8_lossy(&rest)));
    assert_eq!(ev.last().unwrap()["choices"][0]["finish_reason"], "length", "the stream in flight drained whole");
    let task = s.task.take().unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the server exits once the stream ends")
        .unwrap()
        .unwrap();
    let exit = t.elapsed();
    eprintln!(
        "shutdown: idle sockets closed by {closed_idle:?}, stream ended at {stream_end:?}, server exited at {exit:?}"
    );
    assert!(
        exit - stream_end < Duration::from_secs(1),
        "exit {exit:?} long after the last stream ended at {stream_end:?}"
    );
    // The keep-alive client sees its connection closed too.
    let t = Instant::now();
    while !idle.conn.is_finished() {
        assert!(t.elapsed() < Duration::from_secs(1), "the idle keep-alive connection stays open");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
