//! The same request answered as vLLM 0.32 answers it, one test per difference found beside it
//! (model ids, `max_tokens` past the context, `continue_final_message`, the overflow error, the
//! smaller fields, echo's prompt logprobs, `/tokenize` with both forms, the /metrics families).

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
        let r = post(s.addr, "/v1/chat/completions", &json!({"model": name, "messages": chat("hi"), "max_tokens": 2}))
            .await;
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
    let r =
        post(s.addr, "/v1/completions", &json!({"prompt": "hi there", "max_tokens": 100_000, "temperature": 0})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["total_tokens"].as_u64(), Some(ctx), "{v}");
    let r =
        post(s.addr, "/v1/chat/completions", &json!({"messages": chat("hi"), "max_completion_tokens": 100_000})).await;
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
        assert_eq!(
            (e["code"].as_str(), e["param"].as_str(), e["type"].as_str()),
            (Some("context_length_exceeded"), Some(param), Some("invalid_request_error")),
            "{e}"
        );
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
    let closed =
        tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nthe cat<|im_end|>\n", false).unwrap();
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
        let r = post(
            s.addr,
            path,
            &json!({"messages": msgs, "continue_final_message": true, "add_generation_prompt": true}),
        )
        .await;
        assert_eq!(r.status, 400, "{}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["message"], "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
        assert_eq!(e["param"], "continue_final_message");
    }
}

/// `/ping` answers as `/health`, to GET and POST (vLLM's SageMaker probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_is_health() {
    let s = TestServer::start(Setup::default()).await;
    for method in ["GET", "POST"] {
        let r = request(s.addr, method, "/ping", &[], bytes::Bytes::new()).await;
        assert_eq!(r.status, 200, "{method}");
    }
    assert_eq!(request(s.addr, "DELETE", "/ping", &[], bytes::Bytes::new()).await.status, 405);
}

/// `best_of: 4, n: 2`: four sampled, the two of highest cumulative logprob answered, best
/// first. Seeded sampling keys each draw by completion index, so `n: 4` with the same seed
/// shows the four candidates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_of_keeps_the_n_most_likely() {
    let s = TestServer::start(Setup::default()).await;
    let all = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "the cat", "n": 4, "max_tokens": 6, "temperature": 1.5, "seed": 7, "logprobs": 0}),
    )
    .await
    .json();
    let mut cands: Vec<(f64, String)> = all["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["logprobs"]["token_logprobs"].as_array().unwrap().iter().map(|l| l.as_f64().unwrap()).sum(),
                c["text"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    cands.sort_by(|a, b| b.0.total_cmp(&a.0));
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "the cat", "n": 2, "best_of": 4, "max_tokens": 6, "temperature": 1.5, "seed": 7}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let texts: Vec<&str> = v["choices"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert_eq!(texts, [cands[0].1.as_str(), cands[1].1.as_str()], "{cands:?}");
    assert_eq!(v["choices"][1]["index"], 1);
    assert!(v["choices"][0]["logprobs"].is_null(), "logprobs were not asked for: {v}");
    assert_eq!(v["usage"]["completion_tokens"], 12, "the answered choices' tokens: {v}");
}

/// `stop_reason`: the stop string or stop token id that ended a choice, null otherwise; and
/// the keys vLLM sends as null are there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_reason_and_null_keys() {
    let s = TestServer::start(Setup::default()).await;
    let prompt: Vec<u32> = vec![5, 6, 7];
    let ids = greedy_ids(&prompt, 8);
    let stop_word = s.tokenizer.decode(&[ids[2]], false).unwrap();
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "stop": [stop_word.trim()]}),
    )
    .await
    .json();
    assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
    assert_eq!(r["choices"][0]["stop_reason"], stop_word.trim(), "{r}");
    assert!(
        r["choices"][0]["prompt_logprobs"].is_null()
            && r["choices"][0]["token_ids"].is_null()
            && r["choices"][0].get("token_ids").is_some(),
        "{r}"
    );
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "stop_token_ids": [ids[3]]}),
    )
    .await
    .json();
    assert_eq!(
        (r["choices"][0]["finish_reason"].as_str(), r["choices"][0]["stop_reason"].as_u64()),
        (Some("stop"), Some(ids[3] as u64)),
        "{r}"
    );
    let r = post(s.addr, "/v1/completions", &json!({"prompt": prompt, "max_tokens": 2})).await.json();
    assert!(r["choices"][0]["stop_reason"].is_null() && r["choices"][0].get("stop_reason").is_some(), "{r}");
    let r = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": chat("hi"), "max_tokens": 8, "temperature": 0, "stop_token_ids": [ids[0]]}),
    )
    .await
    .json();
    let c = &r["choices"][0];
    for key in ["refusal", "reasoning"] {
        assert!(c["message"].get(key).is_some_and(Value::is_null), "{key}: {r}");
    }
    assert!(
        c.get("stop_reason").is_some()
            && c.get("token_ids").is_some_and(Value::is_null)
            && r.get("prompt_logprobs").is_some_and(Value::is_null),
        "{r}"
    );
    // Streamed: the finishing chunk names it.
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "stop_token_ids": [ids[3]], "stream": true}),
    )
    .await;
    let ev = sse_json(&r.text());
    let last = ev.iter().rev().find(|e| !e["choices"][0]["finish_reason"].is_null()).unwrap();
    assert_eq!(last["choices"][0]["stop_reason"].as_u64(), Some(ids[3] as u64), "{ev:?}");
}

/// `stream_options: {include_usage, continuous_usage_stats}`: every chunk carries the usage so
/// far; the last chunk the whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuous_usage_stats() {
    let s = TestServer::start(Setup::default()).await;
    for (path, body) in [
        (
            "/v1/completions",
            json!({"prompt": [5, 6, 7], "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true}}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": chat("hi"), "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true}}),
        ),
    ] {
        let ev = sse_json(&post(s.addr, path, &body).await.text());
        let mut seen = Vec::new();
        for e in &ev {
            let u = &e["usage"];
            assert!(u.is_object(), "{path}: every chunk has usage: {e}");
            assert_eq!(
                u["total_tokens"].as_u64(),
                Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap())
            );
            seen.push(u["completion_tokens"].as_u64().unwrap());
        }
        assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{path}: {seen:?}");
        assert_eq!(seen.last(), Some(&4), "{path}: {seen:?}");
        assert!(seen.iter().any(|&c| c > 0 && c < 4), "{path}: counts grow chunk by chunk: {seen:?}");
    }
    // Without `continuous_usage_stats`, chunks carry `usage: null` as before.
    let ev = sse_json(
        &post(
            s.addr,
            "/v1/completions",
            &json!({"prompt": [5, 6], "max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}}),
        )
        .await
        .text(),
    );
    assert!(ev[0]["usage"].is_null());
}

/// The first streamed chunk of an echo carries the prompt's ids, as vLLM's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_echo_carries_prompt_token_ids() {
    let s = TestServer::start(Setup::default()).await;
    let ev = sse_json(
        &post(s.addr, "/v1/completions", &json!({"prompt": [5, 6, 7], "max_tokens": 3, "echo": true, "stream": true}))
            .await
            .text(),
    );
    assert_eq!(ev[0]["choices"][0]["prompt_token_ids"], json!([5, 6, 7]), "{:?}", ev[0]);
    assert!(ev[1..].iter().all(|e| e["choices"][0].get("prompt_token_ids").is_none()));
}

/// `tool_choice: "none"` without tools is taken (nothing to call); another choice still needs tools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_choice_none_without_tools() {
    let s = TestServer::start(Setup::default()).await;
    let r =
        post(s.addr, "/v1/chat/completions", &json!({"messages": chat("hi"), "max_tokens": 2, "tool_choice": "none"}))
            .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": chat("hi"), "max_tokens": 2, "tool_choice": "required"}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
}

/// The metric names of every query in vLLM 0.32's example Grafana dashboard (committed
/// unchanged as test data, see tests/data/README.md).
fn dashboard_metrics() -> Vec<String> {
    fn exprs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => {
                for (k, x) in o {
                    match (k.as_str(), x) {
                        ("expr", Value::String(e)) => out.push(e.clone()),
                        _ => exprs(x, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|x| exprs(x, out)),
            _ => {}
        }
    }
    let dash: Value = serde_json::from_str(include_str!("../data/vllm_grafana.json")).unwrap();
    let mut e = Vec::new();
    exprs(&dash, &mut e);
    let mut names = Vec::new();
    for q in &e {
        let mut rest = q.as_str();
        while let Some(at) = rest.find("vllm:") {
            let tail = &rest[at..];
            let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(tail.len());
            names.push(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    names.sort();
    names.dedup();
    names
}

/// vLLM's dashboard does not go blank on Tandem: under load (requests running, streamed and
/// whole, n = 2), every series its queries select (`{model_name="$model_name"}`) is in
/// /metrics with our model's name, and the per-request histograms it plots have observations.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn vllm_grafana_dashboard_finds_every_series() {
    let names = dashboard_metrics();
    assert!(names.len() >= 20, "the dashboard's queries name {} metrics: {names:?}", names.len());
    let s = TestServer::start(Setup { delay: std::time::Duration::from_millis(5), ..Setup::default() }).await;
    let mut load = Vec::new();
    for i in 0..6u32 {
        let addr = s.addr;
        load.push(tokio::spawn(async move {
            let body = match i % 3 {
                0 => json!({"prompt": [5, 6, 7 + i], "max_tokens": 12, "n": 2}),
                1 => json!({"messages": chat("hello"), "max_tokens": 12, "stream": true}),
                _ => json!({"prompt": "the cat sat", "max_tokens": 12, "stream": true}),
            };
            let path = if i % 3 == 1 { "/v1/chat/completions" } else { "/v1/completions" };
            post(addr, path, &body).await.status
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let during = get(s.addr, "/metrics").await.text();
    for l in load {
        assert_eq!(l.await.unwrap(), 200);
    }
    let after = get(s.addr, "/metrics").await.text();
    let label = format!("model_name=\"{MODEL}\"");
    for text in [&during, &after] {
        for n in &names {
            let found = text
                .lines()
                .any(|l| l.strip_prefix(n.as_str()).is_some_and(|r| r.starts_with('{') && r.contains(&label)));
            assert!(found, "no series {n}{{{label}}} in /metrics:\n{text}");
        }
    }
    assert!(
        metric(&during, &format!("vllm:num_requests_running{{{label},engine=\"0\"}}")) > 0.0,
        "under load: {during}"
    );
    // Eight finished requests (six, two of them with n = 2), each in the per-request histograms.
    let l = format!("{{{label},engine=\"0\"}}");
    for h in [
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:request_time_per_output_token_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_params_max_tokens",
    ] {
        assert_eq!(metric(&after, &format!("{h}_count{l}")), 8.0, "{h}: {after}");
    }
    assert_eq!(metric(&after, &format!("vllm:request_generation_tokens_sum{l}")), 96.0);
    assert_eq!(metric(&after, &format!("vllm:request_max_num_generation_tokens_count{l}")), 6.0, "one per prompt");
    assert_eq!(metric(&after, &format!("vllm:request_params_n_sum{l}")), 8.0);
    assert!(metric(&after, &format!("vllm:iteration_tokens_total_count{l}")) > 0.0);
    assert!(
        metric(&after, &format!("vllm:request_decode_time_seconds_sum{l}")) > 0.0,
        "decodes took time (5 ms a step)"
    );
    assert!(
        after.contains("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"512\",engine=\"0\"} 1\n"),
        "{after}"
    );
}

/// vLLM's `rank` in `prompt_logprobs` entries: the top N ranked 1..N, the prompt's token by its
/// place in the whole vocabulary (inside the top N its place there, else past N).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_carry_rank() {
    let s = TestServer::start(Setup::default()).await;
    let prompt: Vec<u32> = vec![5, 9, 13, 7, 30, 31, 6];
    let v =
        post(s.addr, "/v1/completions", &json!({"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 5})).await.json();
    let pl = v["choices"][0]["prompt_logprobs"].as_array().unwrap().clone();
    assert!(pl[0].is_null());
    let (mut inside, mut outside) = (0, 0);
    for (p, e) in pl.iter().enumerate().skip(1) {
        let e = e.as_object().unwrap();
        let own = &e[&prompt[p].to_string()];
        let rank = own["rank"].as_u64().unwrap_or_else(|| panic!("position {p}: {e:?}"));
        // The top entries, best first, ranked 1..5.
        let mut top: Vec<(u64, f64)> = e
            .iter()
            .filter(|(k, _)| **k != prompt[p].to_string())
            .map(|(_, x)| (x["rank"].as_u64().unwrap(), x["logprob"].as_f64().unwrap()))
            .collect();
        top.sort_by_key(|t| t.0);
        let own_lp = own["logprob"].as_f64().unwrap();
        if rank <= 5 {
            inside += 1;
            assert!(top.iter().all(|t| t.0 != rank), "rank {rank} is the prompt token's own: {e:?}");
        } else {
            outside += 1;
            assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 2, 3, 4, 5], "{e:?}");
            assert!(top.iter().all(|t| t.1 >= own_lp), "a token ranked {rank} is below the top 5: {e:?}");
        }
    }
    // And against 20 top entries: a rank up to 20 is the token's place among them.
    let v = post(s.addr, "/v1/completions", &json!({"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 20}))
        .await
        .json();
    for (p, e) in v["choices"][0]["prompt_logprobs"].as_array().unwrap().iter().enumerate().skip(1) {
        let e = e.as_object().unwrap();
        let rank = e[&prompt[p].to_string()]["rank"].as_u64().unwrap();
        let lp = e[&prompt[p].to_string()]["logprob"].as_f64().unwrap();
        let better = e.values().filter(|x| x["logprob"].as_f64().unwrap() >= lp).count() as u64;
        if rank <= 20 {
            assert_eq!(rank, better, "position {p}: {e:?}");
        } else {
            // The 20 top entries and the token itself.
            assert_eq!((better, e.len()), (21, 21), "all 20 top entries beat a token ranked {rank}: {e:?}");
        }
    }
    assert_eq!(inside + outside, prompt.len() - 1);
}

/// Completions with `echo` and `logprobs` score the prompt: as in vLLM 0.32, each choice also
/// carries those scores in `prompt_logprobs` (one entry a prompt token, the first null);
/// without `logprobs` nothing is scored and the field stays null.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_with_logprobs_fills_prompt_logprobs() {
    let s = TestServer::start(Setup::default()).await;
    let prompt: Vec<u32> = vec![5, 9, 13, 7];
    for max_tokens in [0, 2] {
        let body = json!({"prompt": prompt, "echo": true, "logprobs": 1, "max_tokens": max_tokens});
        let r = post(s.addr, "/v1/completions", &body).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let pl = v["choices"][0]["prompt_logprobs"].as_array().unwrap_or_else(|| panic!("{v}")).clone();
        assert_eq!(pl.len(), prompt.len(), "{v}");
        assert!(pl[0].is_null());
        // The same scores as the echoed `logprobs` entries of the prompt.
        let lps = &v["choices"][0]["logprobs"]["token_logprobs"];
        for (p, e) in pl.iter().enumerate().skip(1) {
            let own = e[&prompt[p].to_string()]["logprob"].as_f64().unwrap();
            assert!((own - lps[p].as_f64().unwrap()).abs() < 1e-4, "position {p}: {e} against {lps}");
        }
        // Kept on purpose: nothing generated, nothing counted (vLLM counts one token at 0).
        let completion = v["usage"]["completion_tokens"].as_u64().unwrap();
        assert_eq!(completion, max_tokens, "{v}");
    }
    let v = post(s.addr, "/v1/completions", &json!({"prompt": prompt, "echo": true, "max_tokens": 2})).await.json();
    assert!(v["choices"][0]["prompt_logprobs"].is_null(), "{v}");
}

/// `/tokenize` with both `prompt` and `messages` answers as vLLM 0.32 does: its request type
/// is a union whose first member (the completion form) takes such a body, so the prompt is
/// tokenized and `messages` ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_with_prompt_and_messages_reads_the_prompt() {
    let s = TestServer::start(Setup::default()).await;
    let alone = post(s.addr, "/tokenize", &json!({"prompt": "hello world the cat"})).await;
    assert_eq!(alone.status, 200, "{}", alone.text());
    let both = post(s.addr, "/tokenize", &json!({"prompt": "hello world the cat", "messages": chat("hi")})).await;
    assert_eq!(both.status, 200, "{}", both.text());
    assert_eq!(both.json(), alone.json());
}

/// vLLM 0.32's /metrics families: the prefill KV computed per request (prompt tokens less
/// the prefix cache's), the tool parser's invocations with every label combination from the
/// start, and none of the v0 engine's throughput gauges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_families_of_vllm_0_32() {
    let s = TestServer::start(Setup::default()).await;
    let before = get(s.addr, "/metrics").await.text();
    let m = format!("model_name=\"{MODEL}\"");
    for request_type in ["chat_completions", "responses", "other"] {
        for mode in ["streaming", "non_streaming"] {
            for outcome in ["tool_call", "no_tool_call"] {
                let series = format!("vllm:tool_call_parser_invocations_total{{{m},mode=\"{mode}\",outcome=\"{outcome}\",request_type=\"{request_type}\"}}");
                assert_eq!(metric(&before, &series), 0.0, "{before}");
            }
        }
    }
    assert!(!before.contains("throughput_toks_per_s"), "vLLM 0.32 has no throughput gauges: {before}");
    // The same 40-token prompt twice: the second finds two 16-token blocks cached.
    let prompt: Vec<u32> = (0..40).map(|i| 5 + i % 50).collect();
    for _ in 0..2 {
        let r = post(s.addr, "/v1/completions", &json!({"prompt": prompt, "max_tokens": 2})).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let after = get(s.addr, "/metrics").await.text();
    let l = format!("{{{m},engine=\"0\"}}");
    assert!(after.contains("# TYPE vllm:request_prefill_kv_computed_tokens histogram\n"), "{after}");
    assert_eq!(metric(&after, &format!("vllm:request_prefill_kv_computed_tokens_count{l}")), 2.0, "{after}");
    let hits = metric(&after, &format!("vllm:prefix_cache_hits_total{l}"));
    assert_eq!(hits, 32.0, "{after}");
    assert_eq!(metric(&after, &format!("vllm:request_prefill_kv_computed_tokens_sum{l}")), 80.0 - hits, "{after}");
}

/// `vllm:tool_call_parser_invocations_total` counts the parser's reads: one a choice answered
/// whole, one a delta streamed, by whether it found a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_parser_invocations_are_counted() {
    use crate::parsers::{chat as tool_chat, server, LLAMA};
    use tandem_server::tool_parser::ToolParser;
    let s = server(Some(ToolParser::Llama3Json), None, LLAMA).await;
    assert_eq!(post(s.addr, "/v1/chat/completions", &tool_chat(false)).await.status, 200);
    let r = post(s.addr, "/v1/chat/completions", &tool_chat(true)).await;
    assert_eq!(r.status, 200);
    let _ = r.text();
    let text = get(s.addr, "/metrics").await.text();
    let series = |mode: &str, outcome: &str| {
        metric(&text, &format!("vllm:tool_call_parser_invocations_total{{model_name=\"{MODEL}\",mode=\"{mode}\",outcome=\"{outcome}\",request_type=\"chat_completions\"}}"))
    };
    assert_eq!((series("non_streaming", "tool_call"), series("non_streaming", "no_tool_call")), (1.0, 0.0), "{text}");
    // One a delta read (updates that arrive together are read as one): the text before the
    // call finds none, the call's pieces do once it is named.
    let streamed = series("streaming", "tool_call") + series("streaming", "no_tool_call");
    assert!((1.0..=LLAMA.len() as f64).contains(&streamed), "{text}");
    assert!(series("streaming", "tool_call") >= 1.0, "{text}");
}

/// vLLM's `estimated_*_per_gpu` counters, from the model's shape and the engine's steps: KV
/// written is exactly each computed token's K and V rows; reads and FLOPs grow with the work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_estimates_follow_the_work() {
    let s = TestServer::start(Setup::default()).await;
    let l = format!("{{model_name=\"{MODEL}\",engine=\"0\"}}");
    let read = |t: &str, n: &str| metric(t, &format!("vllm:estimated_{n}_per_gpu_total{l}"));
    let before = get(s.addr, "/metrics").await.text();
    for n in ["flops", "read_bytes", "write_bytes"] {
        assert!(before.contains(&format!("# TYPE vllm:estimated_{n}_per_gpu_total counter\n")), "{before}");
        assert_eq!(read(&before, n), 0.0);
    }
    let r = post(s.addr, "/v1/completions", &json!({"prompt": "hello world the cat", "max_tokens": 5})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let after = get(s.addr, "/metrics").await.text();
    let tokens = metric(&after, &format!("vllm:iteration_tokens_total_sum{l}"));
    // The fake model: one layer, one KV head of 4 dimensions, 2-byte weights and KV.
    let cfg = model_config();
    let kv_row = (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2) as f64;
    assert_eq!(read(&after, "write_bytes"), tokens * kv_row, "{after}");
    assert!(read(&after, "read_bytes") > read(&after, "write_bytes"), "{after}");
    assert!(read(&after, "flops") > 0.0, "{after}");
}
