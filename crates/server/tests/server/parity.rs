//! Issue 28: the same request answered as vLLM 0.32 answers it, one test per difference the
//! side-by-side run found (model ids, `max_tokens` past the context, `continue_final_message`,
//! the overflow error, the smaller fields).

use crate::common;

use common::*;
use serde_json::{json, Value};

fn chat(content: &str) -> Value {
    json!([{"role": "user", "content": content}])
}

/// `vllm serve DIR --served-model-name a b`: `a` is reported, both are listed and accepted;
/// the directory's base name (an alias) is accepted, not listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_names_and_aliases() {
    let mut setup = Setup::default();
    setup.config.served_model_names = vec!["second".into()];
    setup.config.model_aliases = vec!["base".into()];
    setup.config.model_root = Some("/models/base".into());
    let s = TestServer::start(setup).await;
    for name in [MODEL, "second", "base"] {
        let r = post(s.addr, "/v1/completions", &json!({"model": name, "prompt": "hi", "max_tokens": 2})).await;
        assert_eq!(r.status, 200, "{name}: {}", r.text());
        assert_eq!(r.json()["model"], MODEL, "vLLM reports the first served name");
        let r = post(s.addr, "/v1/chat/completions", &json!({"model": name, "messages": chat("hi"), "max_tokens": 2})).await;
        assert_eq!(r.status, 200, "{name}: {}", r.text());
        assert_eq!(get(s.addr, &format!("/v1/models/{name}")).await.status, 200);
    }
    let r = post(s.addr, "/v1/completions", &json!({"model": "other", "prompt": "hi"})).await;
    assert_eq!(r.status, 404, "{}", r.text());
    let m = get(s.addr, "/v1/models").await.json();
    let ids: Vec<&str> = m["data"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [MODEL, "second"]);
    assert_eq!(m["data"][1]["root"], "/models/base");
}

/// vLLM 0.32 trims `max_tokens` to the room the prompt leaves (`get_max_tokens`): the answer
/// fills the context and ends with `length`, on completions and chat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_past_the_context_is_trimmed() {
    let s = TestServer::start(Setup::default()).await;
    let ctx = get(s.addr, "/v1/models").await.json()["data"][0]["max_model_len"].as_u64().unwrap();
    let r = post(s.addr, "/v1/completions", &json!({"prompt": "hi there", "max_tokens": 100_000, "temperature": 0})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["total_tokens"].as_u64(), Some(ctx), "{v}");
    let r = post(s.addr, "/v1/chat/completions", &json!({"messages": chat("hi"), "max_completion_tokens": 100_000})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["total_tokens"].as_u64(), Some(ctx), "{v}");
}

/// A prompt that fills the context is still refused: OpenAI's `context_length_exceeded` code
/// and vLLM's sentence, which client libraries read as an overflow, on every endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_overflow_is_recognisable() {
    let s = TestServer::start(Setup::default()).await;
    let ctx = get(s.addr, "/v1/models").await.json()["data"][0]["max_model_len"].as_u64().unwrap() as usize;
    let long: Vec<u32> = (0..ctx as u32 + 10).map(|i| 5 + i % 50).collect();
    let words = vec!["w5"; ctx + 10].join(" ");
    let cases = [
        ("/v1/completions", json!({"prompt": long, "max_tokens": 7}), "prompt", ctx + 10, 7),
        ("/v1/completions", json!({"prompt": long}), "prompt", ctx + 10, 1),
        ("/generate", json!({"prompt": long, "max_tokens": 3}), "prompt", ctx + 10, 3),
        ("/v1/chat/completions", json!({"messages": chat(&words), "max_tokens": 5}), "messages", 0, 5),
    ];
    for (path, body, param, prompt, completion) in cases {
        let r = post(s.addr, path, &body).await;
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        let e = &r.json()["error"];
        assert_eq!((e["code"].as_str(), e["param"].as_str(), e["type"].as_str()), (Some("context_length_exceeded"), Some(param), Some("invalid_request_error")), "{e}");
        let m = e["message"].as_str().unwrap();
        if prompt > 0 {
            assert_eq!(m, format!("This model's maximum context length is {ctx} tokens. However, you requested {} tokens ({prompt} in the messages, {completion} in the completion). Please reduce the length of the messages or completion.", prompt + completion));
        } else {
            assert!(m.starts_with(&format!("This model's maximum context length is {ctx} tokens. However, you requested ")) && m.ends_with(&format!(" in the messages, {completion} in the completion). Please reduce the length of the messages or completion.")), "{m}");
        }
    }
}

/// `continue_final_message` continues the last (assistant) message instead of closing it: the
/// prompt ends with its content, in chat and /tokenize alike; `add_generation_prompt: false`
/// closes it without opening a new turn; both true is vLLM's 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_final_message_prefills_the_answer() {
    let s = TestServer::start(Setup::default()).await;
    let msgs = json!([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "the cat"}]);
    let tok = &s.tokenizer;
    let open = tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nthe cat", false).unwrap();
    let closed = tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nthe cat<|im_end|>\n", false).unwrap();
    let r = post(s.addr, "/tokenize", &json!({"messages": msgs, "continue_final_message": true})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["tokens"], json!(open));
    let r = post(s.addr, "/tokenize", &json!({"messages": msgs, "add_generation_prompt": false})).await;
    assert_eq!(r.json()["tokens"], json!(closed));
    // The chat answer continues the open message: greedy after its ids.
    let r = post(s.addr, "/v1/chat/completions", &json!({"messages": msgs, "continue_final_message": true, "add_generation_prompt": false, "max_tokens": 4, "temperature": 0})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["usage"]["prompt_tokens"].as_u64(), Some(open.len() as u64), "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], expected_text(tok, &open, &greedy_ids(&open, 4)).as_str());
    for path in ["/v1/chat/completions", "/tokenize"] {
        let r = post(s.addr, path, &json!({"messages": msgs, "continue_final_message": true, "add_generation_prompt": true})).await;
        assert_eq!(r.status, 400, "{}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["message"], "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
        assert_eq!(e["param"], "continue_final_message");
    }
}
