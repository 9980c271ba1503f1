//! What vLLM's clients rely on beyond OpenAI's API (issue 15): `/tokenize`, `/detokenize`,
//! `/version`, the client's `X-Request-Id` echoed, CORS behind `allowed_origins`, an unknown
//! model as vLLM's 404.

use crate::common;

use common::*;
use serde_json::{json, Value};

fn chat_msgs() -> Value {
    json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello the cat"}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_detokenize_in_vllms_shapes() {
    let s = TestServer::start(Setup::default()).await;
    let tok = s.tokenizer.clone();
    let text = "hello world the cat";
    // A prompt: special tokens by default, as vLLM.
    let r = post(s.addr, "/tokenize", &json!({"model": MODEL, "prompt": text})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let want = tok.encode(text, true).unwrap();
    assert_eq!(v, json!({"count": want.len(), "max_model_len": MAX_LEN, "tokens": want, "token_strs": null}));
    let v = post(s.addr, "/tokenize", &json!({"prompt": text, "add_special_tokens": false, "return_token_strs": true}))
        .await
        .json();
    let plain = tok.encode(text, false).unwrap();
    assert_eq!(v["tokens"], json!(plain));
    let strs: Vec<String> = plain.iter().map(|&t| tok.id_to_token(t).unwrap()).collect();
    assert_eq!(v["token_strs"], json!(strs));
    // The same prompt through /v1/completions counts the same tokens.
    let c = post(s.addr, "/v1/completions", &json!({"prompt": text, "max_tokens": 1})).await.json();
    assert_eq!(c["usage"]["prompt_tokens"], json!(want.len()));

    // Messages: the chat template, as /v1/chat/completions renders it.
    let v = post(s.addr, "/tokenize", &json!({"messages": chat_msgs()})).await.json();
    let chat = post(s.addr, "/v1/chat/completions", &json!({"messages": chat_msgs(), "max_tokens": 1})).await.json();
    assert_eq!(v["count"], chat["usage"]["prompt_tokens"], "{v} vs {chat}");
    let rendered = tok.apply_chat_template(chat_msgs().as_array().unwrap(), true).unwrap();
    assert_eq!(v["tokens"], json!(tok.encode(&rendered, false).unwrap()));
    let no_gen =
        post(s.addr, "/tokenize", &json!({"messages": chat_msgs(), "add_generation_prompt": false})).await.json();
    assert!(no_gen["count"].as_u64().unwrap() < v["count"].as_u64().unwrap(), "without the assistant header: {no_gen}");

    // Detokenize turns the ids back into the text, special tokens kept.
    let ids = v["tokens"].clone();
    let r = post(s.addr, "/detokenize", &json!({"model": MODEL, "tokens": ids})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let back: Vec<u32> = serde_json::from_value(ids).unwrap();
    assert_eq!(r.json(), json!({"prompt": tok.decode(&back, false).unwrap()}));
    assert_eq!(
        post(s.addr, "/detokenize", &json!({"tokens": want})).await.json()["prompt"],
        tok.decode(&want, false).unwrap().as_str()
    );
    assert_eq!(post(s.addr, "/detokenize", &json!({"tokens": []})).await.json(), json!({"prompt": ""}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenizer_endpoints_refuse_bad_input_naming_the_field() {
    let s = TestServer::start(Setup::default()).await;
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        ("/tokenize", json!({}), 400, "prompt"),
        ("/tokenize", json!({"prompt": 5}), 400, "prompt"),
        ("/tokenize", json!({"messages": "hi"}), 400, "messages"),
        (
            "/tokenize",
            json!({"messages": chat_msgs(), "continue_final_message": true, "add_generation_prompt": true}),
            400,
            "continue_final_message",
        ),
        ("/tokenize", json!({"prompt": "x", "add_special_tokens": "yes"}), 400, "add_special_tokens"),
        ("/tokenize", json!({"prompt": "x", "model": "gpt-9"}), 404, "model"),
        ("/detokenize", json!({}), 400, "tokens"),
        ("/detokenize", json!({"tokens": "abc"}), 400, "tokens"),
        ("/detokenize", json!({"tokens": [1, -2]}), 400, "tokens"),
        ("/detokenize", json!({"tokens": [1, VOCAB]}), 400, "tokens"),
        ("/detokenize", json!({"tokens": [1], "model": "gpt-9"}), 404, "model"),
    ];
    for (path, body, status, param) in cases {
        let r = post(s.addr, path, &body).await;
        assert_eq!(r.status, status, "{path} {body}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{path} {body}: {}", r.text());
    }
    let r = request(s.addr, "POST", "/tokenize", &[], "{not json").await;
    assert_eq!(r.status, 400);
    let r = get(s.addr, "/tokenize").await;
    assert_eq!(r.status, 405);
    assert_eq!(r.headers["allow"], "POST");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenizer_endpoints_need_the_api_key_and_version_does_not() {
    let mut setup = Setup::default();
    setup.config.api_key = Some("sekrit".into());
    let s = TestServer::start(setup).await;
    for path in ["/tokenize", "/detokenize"] {
        let body = json!({"prompt": "hi", "tokens": [1]});
        let r = post(s.addr, path, &body).await;
        assert_eq!(r.status, 401, "{path}");
    }
    let r = request(
        s.addr,
        "POST",
        "/tokenize",
        &[("authorization", "Bearer sekrit")],
        json!({"prompt": "hi"}).to_string(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = request(
        s.addr,
        "POST",
        "/detokenize",
        &[("authorization", "Bearer sekrit")],
        json!({"tokens": [5]}).to_string(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // /version is open, as in vLLM (like /health).
    let r = get(s.addr, "/version").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(r.json(), json!({"version": env!("CARGO_PKG_VERSION")}));
    assert_eq!(request(s.addr, "POST", "/version", &[], "").await.status, 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_request_id_is_echoed_on_every_response() {
    let s = TestServer::start(Setup::default()).await;
    let id = [("x-request-id", "client-7f3a")];
    let gen = json!({"prompt": "hi", "max_tokens": 2}).to_string();
    let cases: Vec<(&str, &str, String, u16)> = vec![
        ("POST", "/v1/completions", gen.clone(), 200),
        ("POST", "/v1/completions", json!({"prompt": "hi", "max_tokens": 2, "stream": true}).to_string(), 200),
        ("POST", "/v1/chat/completions", json!({"messages": chat_msgs(), "max_tokens": 2}).to_string(), 200),
        ("POST", "/tokenize", json!({"prompt": "hi"}).to_string(), 200),
        ("GET", "/v1/models", String::new(), 200),
        ("GET", "/metrics", String::new(), 200),
        ("GET", "/health", String::new(), 200),
        ("POST", "/v1/completions", json!({"prompt": "hi", "n": 0}).to_string(), 400),
        ("GET", "/nowhere", String::new(), 404),
    ];
    for (m, p, body, status) in cases {
        let r = request(s.addr, m, p, &id, body).await;
        assert_eq!(r.status, status, "{m} {p}: {}", r.text());
        assert_eq!(r.headers["x-request-id"], "client-7f3a", "{m} {p}");
        assert_eq!(r.headers.get_all("x-request-id").iter().count(), 1, "one id, not ours beside it");
    }
    // Without one, a generation response carries its own id, the one in its body.
    let r = request(s.addr, "POST", "/v1/completions", &[], gen).await;
    assert_eq!(r.headers["x-request-id"], r.json()["id"].as_str().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_is_off_by_default() {
    let s = TestServer::start(Setup::default()).await;
    let r = request(s.addr, "GET", "/v1/models", &[("origin", "https://app.example")], "").await;
    assert_eq!(r.status, 200);
    assert!(r.headers.get("access-control-allow-origin").is_none());
    // No preflight either: OPTIONS is not a method served here.
    let r = request(
        s.addr,
        "OPTIONS",
        "/v1/completions",
        &[("origin", "https://app.example"), ("access-control-request-method", "POST")],
        "",
    )
    .await;
    assert_eq!(r.status, 405);
    assert!(r.headers.get("access-control-allow-origin").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_for_listed_origins_with_preflight_before_the_api_key() {
    let mut setup = Setup::default();
    setup.config.allowed_origins = vec!["https://app.example".into(), "http://localhost:3000".into()];
    setup.config.api_key = Some("sekrit".into());
    let s = TestServer::start(setup).await;
    let ok = "https://app.example";
    let preflight = |origin: &'static str, method: &'static str| {
        let addr = s.addr;
        async move {
            request(
                addr,
                "OPTIONS",
                "/v1/chat/completions",
                &[
                    ("origin", origin),
                    ("access-control-request-method", method),
                    ("access-control-request-headers", "authorization, content-type"),
                ],
                "",
            )
            .await
        }
    };
    // The preflight carries no key and is answered all the same.
    let r = preflight(ok, "POST").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["access-control-allow-origin"], ok);
    assert_eq!(r.headers["vary"], "Origin");
    assert!(r.headers["access-control-allow-methods"].to_str().unwrap().split(", ").any(|m| m == "POST"));
    assert_eq!(r.headers["access-control-allow-headers"], "authorization, content-type");
    assert!(r.headers.contains_key("access-control-max-age"));
    // Another origin: refused, without CORS headers. A method not served: refused, in words
    // the allowed page may read.
    let r = preflight("https://evil.example", "POST").await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.headers.get("access-control-allow-origin").is_none());
    let r = preflight(ok, "DELETE").await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("DELETE"));
    assert!(r.headers.get("access-control-allow-methods").is_none());
    // The actual requests: allowed origins get the header (and can read X-Request-Id), others not.
    let auth = ("authorization", "Bearer sekrit");
    let r = request(
        s.addr,
        "POST",
        "/v1/chat/completions",
        &[auth, ("origin", "http://localhost:3000")],
        json!({"messages": chat_msgs(), "max_tokens": 2}).to_string(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["access-control-allow-origin"], "http://localhost:3000");
    assert_eq!(r.headers["access-control-expose-headers"], "x-request-id");
    let r = request(s.addr, "GET", "/v1/models", &[auth, ("origin", "https://evil.example")], "").await;
    assert_eq!(r.status, 200);
    assert!(r.headers.get("access-control-allow-origin").is_none());
    // Errors carry it too, so that the page can read why.
    let r = request(s.addr, "GET", "/v1/models", &[("origin", ok)], "").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.headers["access-control-allow-origin"], ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_for_any_origin() {
    let mut setup = Setup::default();
    setup.config.allowed_origins = vec!["*".into()];
    let s = TestServer::start(setup).await;
    let r = request(
        s.addr,
        "OPTIONS",
        "/tokenize",
        &[("origin", "https://anywhere.example"), ("access-control-request-method", "POST")],
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["access-control-allow-origin"], "*");
    assert!(r.headers.get("vary").is_none(), "the answer does not depend on the origin");
    let r = request(
        s.addr,
        "POST",
        "/v1/completions",
        &[("origin", "https://anywhere.example")],
        json!({"prompt": "hi", "max_tokens": 1, "stream": true}).to_string(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["access-control-allow-origin"], "*");
    // A request without Origin (not from a browser) gets none.
    assert!(get(s.addr, "/v1/models").await.headers.get("access-control-allow-origin").is_none());
}
