//! One log line per generation request, written when it ends, with its id, status, token
//! counts and timings. (A test binary of its own: it installs the global tracing subscriber.)

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::*;
use serde_json::json;

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_logs_one_line_at_its_end() {
    let cap = Capture::default();
    let w = cap.clone();
    tracing_subscriber::fmt().with_ansi(false).with_writer(move || w.clone()).init();
    let s = TestServer::start(Setup::default()).await;
    let r = post(s.addr, "/v1/completions", &json!({"prompt": "hello world", "max_tokens": 3})).await;
    let id = r.json()["id"].as_str().unwrap().to_string();
    let r = post(s.addr, "/v1/completions", &json!({"prompt": "hello world", "max_tokens": 2, "stream": true})).await;
    assert_eq!(r.status, 200);
    assert_eq!(post(s.addr, "/v1/completions", &json!({"prompt": 1})).await.status, 400);
    let text = String::from_utf8(cap.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("request finished")).collect();
    assert_eq!(lines.len(), 2, "{text}");
    let first = lines[0];
    for field in [
        format!("id={id}"),
        "status=200".into(),
        "prompt_tokens=2".into(),
        "completion_tokens=3".into(),
        "queue_ms=".into(),
        "ttft_ms=".into(),
        "total_ms=".into(),
    ] {
        assert!(first.contains(&field), "{field} missing in {first}");
    }
    assert!(lines[1].contains("completion_tokens=2"), "{}", lines[1]);
    let refused: Vec<&str> = text.lines().filter(|l| l.contains("path=\"/v1/completions\" status=400")).collect();
    assert_eq!(refused.len(), 1, "{text}");
}
