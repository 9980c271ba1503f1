//! The real server: `tandem serve --backend wgpu` on a tiny random model, over loopback.
//! The server crate's own tests use a fake model; this one runs the whole stack (binary, flags,
//! model loading, engine, wgpu) and checks what a client sees: /health turning 200, a greedy
//! completion equal whether streamed or not, a chat completion, /metrics after the requests,
//! a 400 that names its field, and a clean exit on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub(crate) struct Server {
    child: Child,
    pub(crate) port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request on a fresh connection; (status, body).
pub(crate) fn request(port: u16, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{payload}", payload.len()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text[9..12].parse().unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { unchunk(rest) } else { rest.to_string() };
    (status, body)
}

fn unchunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

/// A seeded random model of `shape` (f32, seed 1), written afresh in the temp folder
/// `NAME-PID`.
pub(crate) fn random_model(name: &str, shape: tandem_model_files::random_model::Shape) -> std::path::PathBuf {
    let model = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&model);
    tandem_model_files::random_model::write_random_model(&model, shape, 1, tandem_core::DType::F32).unwrap();
    model
}

/// [`random_model`] of the tiny shape.
pub(crate) fn tiny_model(name: &str) -> std::path::PathBuf {
    random_model(name, tandem_model_files::random_model::Shape::Tiny)
}

fn start(model: &std::path::Path) -> Option<Server> {
    start_with(model, &[])
}

/// [`start`] with more flags.
pub(crate) fn start_with(model: &std::path::Path, flags: &[&str]) -> Option<Server> {
    if tandem_wgpu::WgpuBackend::new().is_err() {
        assert!(std::env::var_os("TANDEM_REQUIRE_WGPU").is_none(), "TANDEM_REQUIRE_WGPU is set but wgpu cannot start");
        tandem_core::skip::note("serve on wgpu: no adapter");
        return None;
    }
    // vLLM's spelling: the model directory positional, --max-model-len below the pool's.
    let args = [
        &["--backend", "wgpu", "--num-kv-blocks", "64", "--max-num-seqs", "8"][..],
        &["--served-model-name", "tiny", "--max-model-len", "300"],
        flags,
    ]
    .concat();
    Some(spawn_server(model, &args, |_| {}).unwrap_or_else(|e| panic!("tandem serve --backend wgpu: {e}")))
}

/// `tandem serve MODEL --port P ARGS` on a free loopback port (RUST_LOG=info, NO_COLOR), each
/// log line handed to `on_log` (the log is drained to its end, so the server never blocks on a
/// full pipe); the server once /health answers 200, or why not: it exited, or 60 s passed.
pub(crate) fn spawn_server(
    model: &std::path::Path,
    args: &[&str],
    mut on_log: impl FnMut(String) + Send + 'static,
) -> Result<Server, String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .arg("serve")
        .arg(model)
        .args(["--port", &port.to_string()])
        .args(args)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(log).lines() {
            match line {
                Ok(line) => on_log(line),
                // A line that is not UTF-8 is skipped; the pipe is still read to its end.
                Err(_) => continue,
            }
        }
    });
    let mut server = Server { child, port };
    let t0 = Instant::now();
    loop {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
            drop(s);
            if request(port, "GET", "/health", None).0 == 200 {
                return Ok(server);
            }
        }
        if let Some(status) = server.child.try_wait().unwrap() {
            return Err(format!("the server exited before it was healthy ({status})"));
        }
        if t0.elapsed() > Duration::from_secs(60) {
            return Err("server not healthy after 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn wgpu_server_answers_like_a_client_expects() {
    let model = tiny_model("tandem-serve-test");
    let Some(mut server) = start(&model) else { return };
    let port = server.port;

    let (status, body) = request(port, "GET", "/v1/models", None);
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["data"][0]["max_model_len"],
        300,
        "--max-model-len is the context limit: {body}"
    );

    let req = json!({"model": "tiny", "prompt": "hello world", "max_tokens": 8, "temperature": 0, "ignore_eos": true});
    let (status, body) = request(port, "POST", "/v1/completions", Some(&req));
    assert_eq!(status, 200, "{body}");
    let whole: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(whole["usage"]["completion_tokens"], 8);
    let text = whole["choices"][0]["text"].as_str().unwrap().to_string();

    let mut streamed_req = req.clone();
    streamed_req["stream"] = json!(true);
    let (status, body) = request(port, "POST", "/v1/completions", Some(&streamed_req));
    assert_eq!(status, 200);
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    let streamed: String = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(streamed, text, "streamed text differs from the whole response");

    let chat =
        json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0});
    let (status, body) = request(port, "POST", "/v1/chat/completions", Some(&chat));
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");

    let (status, body) =
        request(port, "POST", "/v1/completions", Some(&json!({"model": "tiny", "prompt": "x", "top_p": 3})));
    assert_eq!(status, 400);
    assert!(body.contains("top_p"), "{body}");

    let (status, metrics) = request(port, "GET", "/metrics", None);
    assert_eq!(status, 200);
    let gauge = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    assert_eq!(gauge("vllm:num_requests_running"), 0.0, "{metrics}");
    assert_eq!(gauge("vllm:kv_cache_usage_perc"), 0.0, "{metrics}");
    assert!(gauge("vllm:generation_tokens") >= 20.0, "{metrics}");
    // Async scheduling is serve's default: the engine overlapped steps.
    assert!(gauge("tandem:async_steps_total") > 0.0, "{metrics}");

    // SIGTERM: a clean exit.
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = server.child.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no exit 20 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status}");
    let _ = std::fs::remove_dir_all(&model);
}

/// `tandem serve DIR` on each family beyond Llama (tiny random ones: Qwen3, Qwen3-MoE,
/// Mixtral, Mistral with a sliding window, Gemma 3): it loads and serves a completion, and a chat's `chat_template_kwargs` reach
/// Qwen3's template (`enable_thinking` false writes the empty think block into the prompt: more
/// prompt tokens).
#[test]
fn wgpu_serves_each_family() {
    use tandem_model_files::random_model::Shape;
    for shape in [Shape::TinyQwen3, Shape::TinyQwen3Moe, Shape::TinyMixtral, Shape::TinyMistral, Shape::TinyGemma3] {
        let model = random_model(&format!("tandem-serve-{}", shape.name()), shape);
        let Some(server) = start(&model) else { return };
        let port = server.port;
        let req =
            json!({"model": "tiny", "prompt": "hello world", "max_tokens": 6, "temperature": 0, "ignore_eos": true});
        let (status, body) = request(port, "POST", "/v1/completions", Some(&req));
        assert_eq!(status, 200, "{}: {body}", shape.name());
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap()["usage"]["completion_tokens"],
            6,
            "{}: {body}",
            shape.name()
        );
        let prompt_tokens = |kwargs: Value| {
            let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0, "chat_template_kwargs": kwargs});
            let (status, body) = request(port, "POST", "/v1/chat/completions", Some(&chat));
            assert_eq!(status, 200, "{}: {body}", shape.name());
            serde_json::from_str::<Value>(&body).unwrap()["usage"]["prompt_tokens"].as_u64().unwrap()
        };
        let (thinking, not) = (prompt_tokens(json!({})), prompt_tokens(json!({"enable_thinking": false})));
        if matches!(shape, Shape::TinyMixtral | Shape::TinyMistral | Shape::TinyGemma3) {
            assert_eq!(not, thinking, "{}: the template has no thinking switch", shape.name());
        } else {
            assert!(
                not > thinking,
                "{}: enable_thinking false gave {not} prompt tokens, the default {thinking}",
                shape.name()
            );
        }
        drop(server);
        let _ = std::fs::remove_dir_all(&model);
    }
}

/// With `--speculative-config` (n-gram drafts, then suffix, then an EAGLE-3 head made for this
/// shape, tests/golden/eagle3-tiny) a greedy completion's text is the server's without it,
/// whole and streamed, and /metrics counts the drafts.
#[test]
fn wgpu_server_with_speculation_gives_the_same_greedy_text() {
    let model = tiny_model("tandem-serve-spec");
    let prompts = ["the cat sat on the mat, the cat sat on the mat, the cat sat", "hello world", "a b c a b c a b"];
    // Each prompt's text whole, then streamed.
    let answers = |port: u16| -> Vec<(String, String)> {
        prompts
            .iter()
            .map(|p| {
                let req = json!({"model": "tiny", "prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": true});
                let (status, body) = request(port, "POST", "/v1/completions", Some(&req));
                assert_eq!(status, 200, "{body}");
                let whole =
                    serde_json::from_str::<Value>(&body).unwrap()["choices"][0]["text"].as_str().unwrap().to_string();
                let mut streamed_req = req.clone();
                streamed_req["stream"] = json!(true);
                let (status, body) = request(port, "POST", "/v1/completions", Some(&streamed_req));
                assert_eq!(status, 200, "{body}");
                let streamed: String = body
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter(|d| *d != "[DONE]")
                    .map(|d| {
                        serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"]
                            .as_str()
                            .unwrap_or("")
                            .to_string()
                    })
                    .collect();
                (whole, streamed)
            })
            .collect()
    };
    let Some(plain) = start(&model) else { return };
    let want = answers(plain.port);
    drop(plain);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(w.0, w.1, "prompt {i}: streamed text differs from the whole response");
    }
    let head = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/eagle3-tiny");
    let eagle3 = json!({"method": "eagle3", "model": head, "num_speculative_tokens": 3}).to_string();
    for config in [
        r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}"#,
        r#"{"method": "suffix", "num_speculative_tokens": 4}"#,
        &eagle3,
    ] {
        let Some(server) = start_with(&model, &["--speculative-config", config]) else { return };
        assert_eq!(answers(server.port), want, "{config}");
        let (status, metrics) = request(server.port, "GET", "/metrics", None);
        assert_eq!(status, 200);
        let drafts = metrics
            .lines()
            .find(|l| l.starts_with("vllm:spec_decode_num_drafts_total"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok());
        assert!(drafts.is_some_and(|d| d > 0.0), "{config}: no drafts counted: {metrics}");
    }
    let _ = std::fs::remove_dir_all(&model);
}
