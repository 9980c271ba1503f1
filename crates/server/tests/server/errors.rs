//! Bad input and refusals, each answered with the right status and an OpenAI-style error body
//! naming the field: malformed JSON, wrong types, unknown model (404), out-of-range values, prompts
//! longer than the context, oversized bodies, unknown paths, wrong methods, missing API key.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tandem_server::ServerConfig;

/// Checks the error shape and returns the body's `error` object.
fn error_of(r: &Reply, status: u16) -> Value {
    assert_eq!(r.status, status, "{}", r.text());
    assert_eq!(r.headers["content-type"], "application/json");
    let v = r.json();
    let e = v["error"].clone();
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(e.as_object().unwrap().contains_key("param") && e.as_object().unwrap().contains_key("code"), "{v}");
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_400_naming_the_field() {
    let s = TestServer::start(Setup::default()).await;
    let long: Vec<u32> = (0..MAX_LEN as u32).map(|i| 5 + i % 50).collect();
    let cases: Vec<(&str, Value, Option<&str>, &str)> = vec![
        ("/v1/completions", json!({"prompt": "hi", "temperature": "warm"}), Some("temperature"), "must be a number"),
        ("/v1/completions", json!({"prompt": "hi", "temperature": 3}), Some("temperature"), "[0, 2]"),
        ("/v1/completions", json!({"prompt": "hi", "top_p": 0}), Some("top_p"), "(0, 1]"),
        ("/v1/completions", json!({"prompt": "hi", "max_tokens": -1}), Some("max_tokens"), "[0,"),
        ("/v1/completions", json!({"prompt": "hi", "max_tokens": 0}), Some("max_tokens"), "only with `echo`"),
        ("/v1/completions", json!({"prompt": "hi", "n": 0}), Some("n"), "[1,"),
        ("/v1/completions", json!({"prompt": "hi", "logprobs": 50}), Some("logprobs"), "[0, 20]"),
        ("/v1/completions", json!({"prompt": "hi", "stop": 5}), Some("stop"), "string"),
        ("/v1/completions", json!({"prompt": "hi", "stop_token_ids": [VOCAB]}), Some("stop_token_ids"), "vocabulary"),
        ("/v1/completions", json!({"prompt": 5}), Some("prompt"), "must be a string"),
        ("/v1/completions", json!({"prompt": []}), Some("prompt"), "empty"),
        ("/v1/completions", json!({"prompt": [1, 99999]}), Some("prompt"), "outside the vocabulary"),
        ("/v1/completions", json!({}), Some("prompt"), "required"),
        ("/v1/completions", json!({"prompt": long}), Some("prompt"), "maximum context length"),
        ("/v1/chat/completions", json!({"messages": "hi"}), Some("messages"), "list"),
        ("/v1/chat/completions", json!({"messages": []}), Some("messages"), "empty"),
        ("/v1/chat/completions", json!({"messages": [{"content": "x"}]}), Some("messages[0].role"), "string"),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": 7}]}),
            Some("messages[0].content"),
            "string",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
            Some("top_logprobs"),
            "logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}),
            Some("max_completion_tokens"),
            "at least 1",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "echo": true}),
            Some("echo"),
            "not supported on chat",
        ),
        ("/v1/completions", json!({"prompt": "hi", "n": 3, "best_of": 2}), Some("best_of"), "at least `n`"),
        ("/v1/completions", json!({"prompt": "hi", "best_of": 2, "stream": true}), Some("best_of"), "streamed"),
        ("/v1/completions", json!({"prompt": "hi", "logit_bias": {"5": 500}}), Some("logit_bias"), "[-100, 100]"),
        ("/v1/completions", json!({"prompt": "hi", "logit_bias": {"99999": 1}}), Some("logit_bias"), "vocabulary"),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}),
            Some("tools[0].function"),
            "required",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "tools": [{"type": "function"}]}),
            Some("tools"),
            "chat completions only",
        ),
        // This server was given no structured-output compiler (a word-level test tokenizer).
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}),
            Some("response_format"),
            "not available",
        ),
        ("/v1/completions", json!({"prompt": "hi", "guided_regex": "a+"}), Some("guided_regex"), "not available"),
        (
            "/v1/completions",
            json!({"prompt": "hi", "response_format": {"type": "xml"}}),
            Some("response_format.type"),
            "\"xml\"",
        ),
        ("/generate", json!({"prompt": "hi", "n": 2}), Some("n"), "one text"),
        ("/generate", json!({"text": "hi"}), Some("prompt"), "required"),
        ("/generate", json!({"prompts": "hi"}), Some("prompts"), "list"),
    ];
    for (path, body, param, msg) in cases {
        let e = error_of(&post(s.addr, path, &body).await, 400);
        assert_eq!(e["param"].as_str(), param, "{path} {body}: {e}");
        assert!(e["message"].as_str().unwrap().contains(msg), "{path} {body}: {e}");
        assert_eq!(e["type"], "invalid_request_error");
    }
    // An unknown model is 404 in vLLM's shape (its clients read `code` as the status).
    for (path, body) in [
        ("/v1/completions", json!({"prompt": "hi", "model": "gpt-9"})),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "model": "gpt-9"})),
    ] {
        let e = error_of(&post(s.addr, path, &body).await, 404);
        assert_eq!(e["type"], "NotFoundError", "{e}");
        assert_eq!(e["param"], "model");
        assert_eq!(e["code"], 404);
        assert!(e["message"].as_str().unwrap().contains("The model `gpt-9` does not exist"), "{e}");
    }
    // Not JSON, and JSON that is not an object.
    for body in ["{\"prompt\": ", "[1, 2]", ""] {
        let r = request(s.addr, "POST", "/v1/completions", &[], body.to_string()).await;
        let e = error_of(&r, 400);
        assert_eq!(e["param"], Value::Null);
    }
    // After all that, the server still serves.
    assert_eq!(post(s.addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 2})).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_path_and_method_errors() {
    let mut setup = Setup::default();
    setup.config.max_body_bytes = 1000;
    let s = TestServer::start(setup).await;
    let big = json!({"prompt": "hello ".repeat(400)});
    error_of(&post(s.addr, "/v1/completions", &big).await, 413);
    error_of(&get(s.addr, "/v2/nothing").await, 404);
    error_of(&get(s.addr, "/").await, 404);
    let r = get(s.addr, "/v1/completions").await;
    error_of(&r, 405);
    assert_eq!(r.headers["allow"], "POST");
    let r = request(s.addr, "POST", "/v1/models", &[], "").await;
    error_of(&r, 405);
    assert_eq!(r.headers["allow"], "GET");
    let r = request(s.addr, "DELETE", "/health", &[], "").await;
    error_of(&r, 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_guards_everything_but_health() {
    let mut setup = Setup::default();
    setup.config.api_key = Some("sekrit".into());
    let s = TestServer::start(setup).await;
    assert_eq!(get(s.addr, "/health").await.status, 200);
    let body = json!({"prompt": "hi", "max_tokens": 2}).to_string();
    for (m, p) in [
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/generate"),
    ] {
        let e = error_of(&request(s.addr, m, p, &[], body.clone()).await, 401);
        assert_eq!(e["code"], "invalid_api_key");
        error_of(&request(s.addr, m, p, &[("authorization", "Bearer wrong")], body.clone()).await, 401);
        error_of(&request(s.addr, m, p, &[("authorization", "sekrit")], body.clone()).await, 401);
    }
    let ok = request(s.addr, "POST", "/v1/completions", &[("authorization", "Bearer sekrit")], body).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(request(s.addr, "GET", "/v1/models", &[("authorization", "Bearer sekrit")], "").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_failure_is_500_and_the_server_keeps_serving() {
    // The first forward of the engine fails: the request in it fails, the next one succeeds.
    let s = TestServer::start(Setup { fail_calls: vec![0], ..Default::default() }).await;
    let e = error_of(&post(s.addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 3})).await, 500);
    assert!(e["message"].as_str().unwrap().contains("injected failure"), "{e}");
    assert_eq!(e["type"], "server_error");
    let r = post(s.addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 3})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let text = get(s.addr, "/metrics").await.text();
    assert_eq!(
        metric(
            &text,
            &format!("vllm:request_success_total{{model_name=\"{MODEL}\",engine=\"0\",finished_reason=\"error\"}}")
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_failure_mid_stream_sends_an_error_event() {
    let s = TestServer::start(Setup { fail_calls: vec![3], ..Default::default() }).await;
    let r = post(s.addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 10, "stream": true})).await;
    assert_eq!(r.status, 200);
    let ev = sse_json(&r.text());
    let err = ev.iter().find(|e| e.get("error").is_some()).expect("an error event");
    assert!(err["error"]["message"].as_str().unwrap().contains("injected failure"));
    assert_eq!(ev.last().unwrap()["choices"][0]["finish_reason"], "error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_device_fails_the_request_and_health_turns_503() {
    let s = TestServer::start(Setup { fatal_calls: vec![0], ..Default::default() }).await;
    assert_eq!(get(s.addr, "/health").await.status, 200);
    let e = error_of(&post(s.addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 3})).await, 500);
    assert!(e["message"].as_str().unwrap().contains("illegal address"), "{e}");
    let h = error_of(&get(s.addr, "/health").await, 503);
    assert!(h["message"].as_str().unwrap().contains("illegal address"), "{h}");
    // No new work reaches the dead device: refused before the engine sees it.
    let r = error_of(&post(s.addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 3})).await, 503);
    assert!(r["message"].as_str().unwrap().contains("engine stopped"), "{r}");
    assert_eq!(s.engine.as_ref().unwrap().stats().forward_errors_total, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_503_until_the_engine_is_set() {
    let engine = tandem_server::engine_adapter::TandemEngine::loading();
    let config = ServerConfig {
        addr: ([127, 0, 0, 1], 0).into(),
        max_model_len: MAX_LEN,
        vocab_size: VOCAB,
        ..Default::default()
    };
    let s = TestServer::with_client(config, engine.clone(), tokenizer()).await;
    error_of(&get(s.addr, "/health").await, 503);
    error_of(&post(s.addr, "/v1/completions", &json!({"prompt": "hi"})).await, 503);
    let fake = tandem_engine::fake_model::FakeModel::new(model_config(), 64, 16, 256, 16);
    let h = tandem_engine::Engine::spawn(
        Box::new(fake),
        tandem_server::engine_adapter::decode_fn(s.tokenizer.clone()),
        Default::default(),
    )
    .unwrap();
    engine.set(h.clone());
    assert_eq!(get(s.addr, "/health").await.status, 200);
    assert_eq!(post(s.addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 2})).await.status, 200);
    h.shutdown();
    // A stopped engine refuses: 500, and the server still answers.
    tokio::time::sleep(Duration::from_millis(10)).await;
    error_of(&post(s.addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 2})).await, 500);
    assert_eq!(get(s.addr, "/v1/models").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_over_the_limit_is_413_and_keep_alive_survives_errors() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut setup = Setup::default();
    setup.config.max_body_bytes = 1000;
    let s = TestServer::start(setup).await;
    // No Content-Length: the limit is enforced while the chunked body is read.
    let mut sock = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let chunk = "x".repeat(600);
    let req = format!("POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n258\r\n{chunk}\r\n258\r\n{chunk}\r\n0\r\n\r\n");
    sock.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf)).await.unwrap().unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");

    // One keep-alive connection: an error does not end it.
    let mut c = Client::connect(s.addr).await;
    for (body, want) in [
        ("{bad", 400u16),
        ("{\"prompt\": \"hi\", \"max_tokens\": 2}", 200),
        ("{\"prompt\": \"hi\", \"n\": 0}", 400),
        ("{\"prompt\": \"hi\", \"max_tokens\": 1}", 200),
    ] {
        let r = c.send("POST", "/v1/completions", &[], body.to_string()).await;
        assert_eq!(r.status(), want, "{body}");
        http_body_util::BodyExt::collect(r.into_body()).await.unwrap();
    }
    let r = c.send("HEAD", "/health", &[], "").await;
    assert_eq!(r.status(), 200);
}
