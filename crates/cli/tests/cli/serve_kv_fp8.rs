//! `tandem serve --kv-cache-dtype fp8` over loopback: on the reference the log says the KV
//! cache's type and block count, and a greedy completion comes back whole; on wgpu the same
//! completion comes back whole, streamed and not, with the same text.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::serve_wgpu::{request, start_with};

#[test]
fn fp8_kv_cache_serves_on_the_reference() {
    let model = std::env::temp_dir().join(format!("tandem-serve-kvfp8-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&model);
    tandem_model_files::random_model::write_random_model(
        &model,
        tandem_model_files::random_model::Shape::Tiny,
        1,
        tandem_core::DType::F32,
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .arg("serve")
        .arg(&model)
        .args(["--backend", "reference", "--port", &port.to_string(), "--kv-cache-dtype", "fp8"])
        .args(["--max-num-seqs", "4", "--served-model-name", "tiny", "--max-model-len", "256"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The log line that sizes the pool, passed on; the rest drained so the server never blocks.
    let (tx, rx) = mpsc::channel();
    let log = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(log).lines().map_while(|l| l.ok()) {
            if line.contains("KV cache sized") {
                let _ = tx.send(line);
            }
        }
    });
    let t0 = Instant::now();
    let healthy = loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() && request(port, "GET", "/health", None).0 == 200 {
            break true;
        }
        if t0.elapsed() > Duration::from_secs(60) || child.try_wait().unwrap().is_some() {
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let result = std::panic::catch_unwind(|| {
        assert!(healthy, "the server did not become healthy with --kv-cache-dtype fp8");
        let sized = rx.recv_timeout(Duration::from_secs(5)).expect("no 'KV cache sized' log line");
        assert!(sized.contains("fp8_e4m3") && sized.contains("blocks"), "{sized}");
        let req =
            json!({"model": "tiny", "prompt": "hello world", "max_tokens": 8, "temperature": 0, "ignore_eos": true});
        let (status, body) = request(port, "POST", "/v1/completions", Some(&req));
        assert_eq!(status, 200, "{body}");
        let whole: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(whole["usage"]["completion_tokens"], 8, "{body}");
    });
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&model);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn fp8_kv_cache_serves_on_wgpu() {
    let model = std::env::temp_dir().join(format!("tandem-serve-kvfp8-wgpu-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&model);
    tandem_model_files::random_model::write_random_model(
        &model,
        tandem_model_files::random_model::Shape::Tiny,
        1,
        tandem_core::DType::F32,
    )
    .unwrap();
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
