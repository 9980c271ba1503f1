//! `tandem serve --kv-cache-dtype fp8` over loopback: on the reference the log says the KV
//! cache's type and block count, and a greedy completion comes back whole; on wgpu the same
//! completion comes back whole, streamed and not, with the same text.

use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

use super::serve_wgpu::{request, spawn_server, start_with, tiny_model};

#[test]
fn fp8_kv_cache_serves_on_the_reference() {
    let model = tiny_model("tandem-serve-kvfp8");
    // The log line that sizes the pool, passed on.
    let (tx, rx) = mpsc::channel();
    let started = spawn_server(
        &model,
        &[
            "--backend",
            "reference",
            "--kv-cache-dtype",
            "fp8",
            "--max-num-seqs",
            "4",
            "--served-model-name",
            "tiny",
            "--max-model-len",
            "256",
        ],
        move |line| {
            if line.contains("KV cache sized") {
                let _ = tx.send(line);
            }
        },
    );
    let result = std::panic::catch_unwind(move || {
        let server = started.unwrap_or_else(|e| panic!("--kv-cache-dtype fp8 on the reference: {e}"));
        let port = server.port;
        let sized = rx.recv_timeout(Duration::from_secs(5)).expect("no 'KV cache sized' log line");
        assert!(sized.contains("fp8_e4m3") && sized.contains("blocks"), "{sized}");
        let req =
            json!({"model": "tiny", "prompt": "hello world", "max_tokens": 8, "temperature": 0, "ignore_eos": true});
        let (status, body) = request(port, "POST", "/v1/completions", Some(&req));
        assert_eq!(status, 200, "{body}");
        let whole: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(whole["usage"]["completion_tokens"], 8, "{body}");
    });
    let _ = std::fs::remove_dir_all(&model);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn fp8_kv_cache_serves_on_wgpu() {
    let model = tiny_model("tandem-serve-kvfp8-wgpu");
    let Some(server) = start_with(&model, &["--kv-cache-dtype", "fp8"]) else { return };
    let req = json!({"model": "tiny", "prompt": "hello world", "max_tokens": 8, "temperature": 0, "ignore_eos": true});
    let (status, body) = request(server.port, "POST", "/v1/completions", Some(&req));
    assert_eq!(status, 200, "{body}");
    let whole: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(whole["usage"]["completion_tokens"], 8, "{body}");
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let (status, body) = request(server.port, "POST", "/v1/completions", Some(&streamed));
    assert_eq!(status, 200, "{body}");
    let text: String = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap(), "{body}");
    drop(server);
    let _ = std::fs::remove_dir_all(&model);
}
