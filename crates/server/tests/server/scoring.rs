//! The request surface vLLM clients rely on, against the real engine over FakeModel: the one
//! context limit, `echo` with `logprobs` and `max_tokens` 0 (lm-evaluation-harness's
//! loglikelihood), vLLM's `prompt_logprobs`, `logit_bias`, `include_stop_str_in_output`.

use crate::common;

use common::*;
use serde_json::{json, Value};
use tandem_engine::fake_model::FakeModel;
use tandem_engine::{Engine, EngineConfig};
use tandem_server::engine_adapter::{decode_fn, TandemEngine};
use tandem_server::ServerConfig;

/// Issue 15, finding 1: a pool smaller than the model's context refused every request that
/// left out `max_tokens` (the server defaulted it from config.json, the engine enforced the
/// pool). The server takes the engine's limit once it is loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_context_limit_is_the_least_of_model_and_pool() {
    let tok = tokenizer();
    // 4 blocks of 16: 64 tokens, while the model's config says 4096.
    let fake = FakeModel::new(model_config(), 4, 16, 512, 8);
    let handle = Engine::spawn(Box::new(fake), decode_fn(tok.clone()), EngineConfig::default()).unwrap();
    let config =
        ServerConfig { addr: ([127, 0, 0, 1], 0).into(), max_model_len: 4096, vocab_size: VOCAB, ..Default::default() };
    let s = TestServer::with_client(config, TandemEngine::ready(handle), tok).await;
    let r = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hello"}], "temperature": 0}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let u = &r.json()["usage"];
    assert!(u["total_tokens"].as_u64().unwrap() <= 64, "{u}");
    assert_eq!(get(s.addr, "/v1/models").await.json()["data"][0]["max_model_len"], 64);
    // As vLLM 0.32: `max_tokens` past the room the pool's context leaves is trimmed to it.
    let r = post(s.addr, "/v1/completions", &json!({"prompt": "hello", "max_tokens": 80})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["finish_reason"], "length");
    assert_eq!(r.json()["usage"]["total_tokens"], 64, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_scores_the_prompt_as_lm_eval_reads_it() {
    let s = TestServer::start(Setup::default()).await;
    let prompt = "the cat sat on the mat";
    let ids = s.tokenizer.encode(prompt, true).unwrap();
    // Generate one token with its logprob, then score prompt + that token: the scored last
    // token's logprob must be the sampled one's (two paths through the engine agree).
    let g = post(s.addr, "/v1/completions", &json!({"prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": 2}))
        .await
        .json();
    let gen_lp = g["choices"][0]["logprobs"]["token_logprobs"][0].as_f64().unwrap();
    let gen_text = g["choices"][0]["text"].as_str().unwrap().to_string();
    let mut full = ids.clone();
    full.push(greedy_ids(&ids, 1)[0]);

    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": full, "max_tokens": 0, "echo": true, "logprobs": 1, "temperature": 0}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let c = &v["choices"][0];
    let lp = &c["logprobs"];
    let n = full.len();
    for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        assert_eq!(lp[key].as_array().unwrap().len(), n, "{key}: {lp}");
    }
    assert_eq!(lp["token_logprobs"][0], Value::Null, "nothing comes before the first token");
    assert_eq!(lp["top_logprobs"][0], Value::Null);
    let scored = lp["token_logprobs"][n - 1].as_f64().unwrap();
    assert!((scored - gen_lp).abs() < 1e-6, "scored {scored} vs sampled {gen_lp}");
    for i in 1..n {
        let l = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(l <= 0.0 && l.is_finite());
        let top = lp["top_logprobs"][i].as_object().unwrap();
        let tok_text = lp["tokens"][i].as_str().unwrap();
        assert_eq!(top[tok_text].as_f64().unwrap(), l, "the prompt's token is among its top entries");
        // lm-eval's is_greedy: the best of the top entries against the token's own.
        let best = top.values().map(|x| x.as_f64().unwrap()).fold(f64::NEG_INFINITY, f64::max);
        assert!(best >= l);
    }
    // Offsets grow by each token's text.
    let offs: Vec<u64> = lp["text_offset"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert!(offs.windows(2).all(|w| w[0] <= w[1]), "{offs:?}");
    assert_eq!(c["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 0);
    assert_eq!(c["text"].as_str().unwrap(), s.tokenizer.decode(&full, false).unwrap());

    // A string prompt echoes as given, followed by the completion.
    let r =
        post(s.addr, "/v1/completions", &json!({"prompt": prompt, "max_tokens": 1, "echo": true, "temperature": 0}))
            .await
            .json();
    assert_eq!(r["choices"][0]["text"].as_str().unwrap(), format!("{prompt}{gen_text}"));
    assert_eq!(r["choices"][0]["logprobs"], Value::Null);

    // Streamed, the first chunk carries the prompt; all chunks together equal the whole answer.
    let body = json!({"prompt": prompt, "max_tokens": 3, "echo": true, "logprobs": 0, "temperature": 0});
    let whole = post(s.addr, "/v1/completions", &body).await.json();
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let ev = sse_json(&post(s.addr, "/v1/completions", &sb).await.text());
    let text: String = ev.iter().map(|c| c["choices"][0]["text"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
    let tokens: Vec<Value> =
        ev.iter().flat_map(|c| c["choices"][0]["logprobs"]["tokens"].as_array().cloned().unwrap_or_default()).collect();
    assert_eq!(tokens, *whole["choices"][0]["logprobs"]["tokens"].as_array().unwrap());
    assert_eq!(tokens.len(), ids.len() + 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_prompt_logprobs_on_completions_and_chat() {
    let s = TestServer::start(Setup::default()).await;
    let ids = s.tokenizer.encode("hello world the cat", true).unwrap();
    let v = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 2, "prompt_logprobs": 1, "temperature": 0}),
    )
    .await
    .json();
    let pl = v["choices"][0]["prompt_logprobs"].as_array().unwrap();
    assert_eq!(pl.len(), ids.len());
    assert_eq!(pl[0], Value::Null);
    for (i, e) in pl.iter().enumerate().skip(1) {
        let e = e.as_object().unwrap();
        assert!(e.contains_key(&ids[i].to_string()), "the prompt token {} is at position {i}: {e:?}", ids[i]);
        assert!(e.len() <= 2, "the token and the top 1");
    }
    let v = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2, "prompt_logprobs": 0}),
    )
    .await
    .json();
    let pl = v["prompt_logprobs"].as_array().unwrap();
    assert!(pl.len() > 3 && pl[0].is_null() && pl[1].is_object(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_and_kept_stop_strings() {
    let s = TestServer::start(Setup::default()).await;
    let ids = s.tokenizer.encode("the cat", true).unwrap();
    let greedy = greedy_ids(&ids, 3);
    let forced = (0..VOCAB as u32).find(|t| !greedy.contains(t) && *t > 5).unwrap();
    let v = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 3, "temperature": 0, "logit_bias": {forced.to_string(): 100}}),
    )
    .await
    .json();
    let want = expected_text(&s.tokenizer, &ids, &[forced; 3]);
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), want, "+100 on one token makes it the greedy choice");
    let banned = post(s.addr, "/v1/completions", &json!({"prompt": ids, "max_tokens": 1, "temperature": 0, "logit_bias": {greedy[0].to_string(): -100}, "logprobs": 0})).await.json();
    assert_ne!(banned["choices"][0]["text"], expected_text(&s.tokenizer, &ids, &greedy[..1]).as_str());

    // A stop string made of the second generated word: cut before it, or kept with it.
    let text = expected_text(&s.tokenizer, &ids, &greedy);
    let words: Vec<&str> = text.split_whitespace().collect();
    let stop = words[1];
    for (keep, want) in [
        (false, text[..text.find(stop).unwrap()].to_string()),
        (true, text[..text.find(stop).unwrap() + stop.len()].to_string()),
    ] {
        let v = post(s.addr, "/v1/completions", &json!({"prompt": ids, "max_tokens": 3, "temperature": 0, "stop": stop, "include_stop_str_in_output": keep})).await.json();
        assert_eq!(v["choices"][0]["text"].as_str().unwrap(), want, "keep = {keep}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
}
