//! For a fixed seed, the library's outputs equal the server's for the same request: the server
//! runs in-process on its own engine over the same tiny model (reference backend), is asked
//! over HTTP, and its texts, finish reasons, token counts and logprobs are compared with
//! [`tandem::Llm`]'s.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use serde_json::{json, Value};
use tandem::{Backend, FinishReason, Message, Output, SamplingParams};
use tandem_core::tokenizer::Tokenizer;
use tandem_server::engine_adapter::{decode_fn, TandemEngine};
use tandem_server::{Server, ServerConfig};

const MODEL: &str = "tiny";

/// The server as `tandem serve` wires it, on a fresh engine with the library's settings.
fn start_server(rt: &tokio::runtime::Runtime) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let b = common::builder();
    let mut tok = Tokenizer::from_dir(common::tiny_model()).unwrap();
    let loaded = tandem::load_model(Backend::Reference, common::tiny_model(), b.load_options().unwrap()).unwrap();
    let cfg = loaded.runner.config().clone();
    tok.add_eos_ids(&cfg.eos_token_ids);
    let tok = Arc::new(tok);
    let handle = tandem_engine::Engine::spawn(loaded.runner, decode_fn(tok.clone()), b.engine_config()).unwrap();
    let config = ServerConfig {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        max_model_len: handle.max_model_len(),
        vocab_size: cfg.vocab_size,
        ..Default::default()
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let addr = rt.block_on(async {
        let server = Server::bind(config, TandemEngine::ready(handle), tok, MODEL.into()).await.unwrap();
        let addr = server.local_addr().unwrap();
        tokio::spawn(server.run(async move {
            let _ = rx.await;
        }));
        addr
    });
    (addr, tx)
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> Value {
    let body = body.to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let (head, json) = reply.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP reply: {reply:?}"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{json}");
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

fn finish_name(f: &FinishReason) -> &'static str {
    match f {
        FinishReason::Stop { .. } => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
        FinishReason::Error(_) => "error",
    }
}

/// The server's choices (`choice[p * n + i]`) against the library's outputs.
fn assert_same(server: &Value, lib: &[Output], n: usize, text_of: impl Fn(&Value) -> &str) {
    let choices = server["choices"].as_array().unwrap();
    assert_eq!(choices.len(), lib.len() * n);
    for (p, out) in lib.iter().enumerate() {
        for (i, c) in out.completions.iter().enumerate() {
            let s = &choices[p * n + i];
            assert_eq!(text_of(s), c.text, "prompt {p} completion {i}");
            assert_eq!(s["finish_reason"], finish_name(&c.finish_reason), "prompt {p} completion {i}");
            if let Some(lp) = &c.logprobs {
                // JSON carries the f32 in its shortest form: back to f32, it is the same bits.
                let server_lp: Vec<f32> = s["logprobs"]["token_logprobs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap() as f32)
                    .collect();
                let ours: Vec<f32> = lp.iter().map(|l| l.logprob).collect();
                assert_eq!(server_lp, ours, "prompt {p} completion {i}: the same tokens, so the same logprobs");
            }
        }
    }
    let completion_tokens: usize = lib.iter().map(|o| o.usage.completion_tokens).sum();
    let prompt_tokens: usize = lib.iter().map(|o| o.usage.prompt_tokens).sum();
    assert_eq!(server["usage"]["completion_tokens"], completion_tokens);
    assert_eq!(server["usage"]["prompt_tokens"], prompt_tokens);
}

#[test]
fn library_outputs_equal_the_servers_for_a_fixed_seed() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (addr, stop_server) = start_server(&rt);
    let llm = common::builder().build().unwrap();

    // Completions: two prompts, two sampled completions each, a stop string, logprobs.
    let prompts = ["The capital of France is", "def main():"];
    let params = SamplingParams {
        n: 2,
        temperature: 0.9,
        top_p: 0.95,
        top_k: 40,
        seed: Some(1234),
        max_tokens: Some(14),
        logprobs: Some(1),
        ..Default::default()
    };
    let body = json!({"model": MODEL, "prompt": prompts, "n": 2, "temperature": 0.9, "top_p": 0.95, "top_k": 40, "seed": 1234, "max_tokens": 14, "logprobs": 1});
    let server = post(addr, "/v1/completions", &body);
    let lib = llm.generate(prompts, &params).unwrap();
    assert!(lib.iter().all(|o| o.completions.iter().all(|c| !c.token_ids.is_empty())));
    assert_same(&server, &lib, 2, |c| c["text"].as_str().unwrap());

    // The same with a stop string taken from what the library generated, so that it fires.
    let first = &lib[0].completions[0].text;
    let stop: String = first.chars().skip(first.chars().count() / 2).take(2).collect();
    assert!(!stop.is_empty(), "a 14-token completion has text to cut: {first:?}");
    let params = SamplingParams { stop: vec![stop.clone()], logprobs: None, ..params.clone() };
    let body = json!({"model": MODEL, "prompt": prompts, "n": 2, "temperature": 0.9, "top_p": 0.95, "top_k": 40, "seed": 1234, "max_tokens": 14, "stop": [stop]});
    let lib = llm.generate(prompts, &params).unwrap();
    assert!(matches!(lib[0].completions[0].finish_reason, FinishReason::Stop { .. }), "{:?}", lib[0].completions[0]);
    assert_same(&post(addr, "/v1/completions", &body), &lib, 2, |c| c["text"].as_str().unwrap());

    // Chat, greedy and sampled.
    let convo = [Message::system("Be brief."), Message::user("Name a colour.")];
    let msgs = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]);
    for (temperature, seed) in [(0.0, None), (1.0, Some(7u64))] {
        let params = SamplingParams { temperature, seed, max_tokens: Some(12), ..Default::default() };
        let mut body = json!({"model": MODEL, "messages": msgs, "temperature": temperature, "max_tokens": 12});
        if let Some(s) = seed {
            body["seed"] = json!(s);
        }
        let lib = llm.chat([convo.clone()], &params).unwrap();
        assert_same(&post(addr, "/v1/chat/completions", &body), &lib, 1, |c| c["message"]["content"].as_str().unwrap());
    }
    let _ = stop_server.send(());
}
