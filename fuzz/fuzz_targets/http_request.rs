//! An HTTP request to the OpenAI, Anthropic and vLLM endpoints, answered by an engine whose
//! output comes from the input too: request parsing, structured-output compiles, tool-call and
//! reasoning parsers, the response formatters and the SSE framing. Never a panic, never a 5xx,
//! every JSON body JSON, every stream well-framed.
#![no_main]

use hyper::Method;
use libfuzzer_sys::fuzz_target;

const ENDPOINTS: [(&str, &str); 9] = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/generate"),
    ("GET", "/v1/models/fuzz-model"),
    ("GET", "/metrics"),
];

fuzz_target!(
    // The servers, the tokenizer and llguidance's token trie are built once, before libFuzzer's
    // per-input timeout starts counting (tens of seconds under ASan on a loaded machine).
    init: {
        tandem_fuzz::server::harness();
    },
    |data: &[u8]| {
    let h = tandem_fuzz::server::harness();
    let mut b = tandem_fuzz::Bytes::new(data);
    let (method, path) = ENDPOINTS[b.u8() as usize % ENDPOINTS.len()];
    let (state, engine) = &h.servers[b.u8() as usize % h.servers.len()];
    let script = b.take(255);
    let body = b.rest().to_vec();
    engine.set_script(script);
    let method = if method == "GET" { Method::GET } else { Method::POST };
    let headers: &[(&str, &str)] = if path.starts_with("/v1/messages") { &[("anthropic-version", "2023-06-01")] } else { &[] };
    let a = tandem_fuzz::server::send(state, &h.rt, method, path, headers, body);
    assert!(a.status.as_u16() < 500, "{path} answered {}: {}", a.status, String::from_utf8_lossy(&a.body));
    let text = std::str::from_utf8(&a.body).expect("the answer is UTF-8");
    if a.content_type.starts_with("text/event-stream") {
        if let Err(e) = tandem_fuzz::server::check_sse(text) {
            panic!("{path}: a malformed stream: {e}\n{text}");
        }
    } else if a.content_type.starts_with("application/json") {
        serde_json::from_str::<serde_json::Value>(text).unwrap_or_else(|e| panic!("{path}: the body is not JSON ({e}): {text}"));
    }
});
