//! What vLLM's and SGLang's routers ask a worker (issue 30, src/worker_api.rs): `/get_load`
//! counting the tokens in flight and back to zero, `/server_info` and `/model_info` in SGLang's
//! shapes, `/health_generate` proving a token can be generated, `/flush_cache` refused saying
//! why, and which of them the API key guards.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tandem_server::ServerConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_load_counts_the_tokens_of_requests_in_flight() {
    let s = TestServer::start(Setup { delay: Duration::from_millis(20), ..Setup::default() }).await;
    let idle = get(s.addr, "/get_load").await;
    assert_eq!(idle.status, 200, "{}", idle.text());
    assert_eq!(idle.json(), json!([{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]));
    let prompt = "hello world the cat sat";
    let prompt_tokens = s.tokenizer.encode(prompt, true).unwrap().len();
    let addr = s.addr;
    // Two completions of one prompt, 40 tokens each at 20 ms a step: in flight for most of a second.
    let run = tokio::spawn(async move {
        post(addr, "/v1/completions", &json!({"prompt": prompt, "max_tokens": 40, "n": 2})).await
    });
    let t0 = Instant::now();
    let busy = loop {
        let v = get(s.addr, "/get_load").await.json();
        if v[0]["num_reqs"].as_u64().unwrap() >= 1 && v[0]["num_tokens"].as_u64().unwrap() > 2 * prompt_tokens as u64 {
            break v;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the request never showed in /get_load: {v}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // Prompt tokens count once per completion, and generated ones are added as they come.
    let n = busy[0]["num_tokens"].as_u64().unwrap() as usize;
    assert!(n > 2 * prompt_tokens && n <= 2 * (prompt_tokens + 40), "{busy}");
    let r = run.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(get(s.addr, "/get_load").await.json()[0]["num_tokens"], 0, "the count goes back to zero");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_and_model_info_in_sglangs_shapes() {
    let s = TestServer::start(Setup::default()).await;
    let info = get(s.addr, "/get_server_info").await;
    assert_eq!(info.status, 200, "{}", info.text());
    let v = info.json();
    assert_eq!(v["served_model_name"], MODEL);
    assert_eq!((v["tp_size"].as_u64(), v["dp_size"].as_u64()), (Some(1), Some(1)));
    assert_eq!(v["context_length"], MAX_LEN);
    assert!(v["max_running_requests"].as_u64().unwrap() > 0);
    // SGLang's newer names answer the same.
    assert_eq!(get(s.addr, "/server_info").await.json(), v);
    let m = get(s.addr, "/get_model_info").await.json();
    assert_eq!(m["served_model_name"], MODEL);
    assert_eq!(m["is_generation"], true);
    assert_eq!(m["max_context_length"], MAX_LEN);
    assert_eq!(m["vocab_size"], VOCAB);
    // No path: a router would try to load a tokenizer from it.
    assert!(m.get("model_path").is_none() && m.get("tokenizer_path").is_none(), "{m}");
    assert_eq!(get(s.addr, "/model_info").await.json(), m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_generate_generates_and_flush_cache_says_why_not() {
    let s = TestServer::start(Setup::default()).await;
    let before = s.engine.as_ref().unwrap().stats().generation_tokens_total;
    let h = get(s.addr, "/health_generate").await;
    assert_eq!(h.status, 200, "{}", h.text());
    assert_eq!(s.engine.as_ref().unwrap().stats().generation_tokens_total, before + 1, "one token generated");
    let f = post(s.addr, "/flush_cache", &json!({})).await;
    assert_eq!(f.status, 501, "{}", f.text());
    assert!(f.json()["error"]["message"].as_str().unwrap().contains("cannot flush its prefix cache"), "{}", f.text());
    let wrong = get(s.addr, "/flush_cache").await;
    assert_eq!(wrong.status, 405);
    assert_eq!(post(s.addr, "/get_load", &json!({})).await.status, 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_loading_health_generate_is_503_and_load_is_zero() {
    let engine = tandem_server::engine_adapter::TandemEngine::loading();
    let config = ServerConfig {
        addr: ([127, 0, 0, 1], 0).into(),
        max_model_len: MAX_LEN,
        vocab_size: VOCAB,
        ..Default::default()
    };
    let s = TestServer::with_client(config, engine, tokenizer()).await;
    let h = get(s.addr, "/health_generate").await;
    assert_eq!(h.status, 503, "{}", h.text());
    assert!(h.text().contains("still loading"), "{}", h.text());
    assert_eq!(get(s.addr, "/get_load").await.json()[0]["num_reqs"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_guards_all_but_health_generate() {
    let mut setup = Setup::default();
    setup.config.api_key = Some("sekrit".into());
    let s = TestServer::start(setup).await;
    for path in ["/get_load", "/get_server_info", "/server_info", "/get_model_info", "/model_info"] {
        assert_eq!(get(s.addr, path).await.status, 401, "{path}");
        let ok = request(s.addr, "GET", path, &[("authorization", "Bearer sekrit")], "").await;
        assert_eq!(ok.status, 200, "{path}: {}", ok.text());
    }
    assert_eq!(post(s.addr, "/flush_cache", &json!({})).await.status, 401);
    assert_eq!(get(s.addr, "/health_generate").await.status, 200);
}
