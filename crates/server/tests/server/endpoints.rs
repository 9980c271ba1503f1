//! Each endpoint against the real server (real engine over FakeModel) on loopback: response
//! shapes, streaming chunk formats, logprobs, n, stop strings, /generate, /metrics.

use crate::common;

use common::*;
use serde_json::{json, Value};

fn prompt_ids(t: &tandem_core::tokenizer::Tokenizer, text: &str) -> Vec<u32> {
    t.encode(text, true).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_models_and_metrics() {
    let s = TestServer::start(Setup::default()).await;
    let r = get(s.addr, "/health").await;
    assert_eq!(r.status, 200);
    let r = get(s.addr, "/v1/models").await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["max_model_len"], MAX_LEN);
    let r = get(s.addr, "/metrics").await;
    assert_eq!(r.status, 200);
    assert!(r.headers["content-type"].to_str().unwrap().starts_with("text/plain; version=0.0.4"));
    let text = r.text();
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "tandem:batch_size",
        "tandem:server_queued_requests",
    ] {
        metric(&text, &format!("{name}{{model_name=\"{MODEL}\",engine=\"0\"}}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_is_the_models_greedy_text() {
    let s = TestServer::start(Setup::default()).await;
    let prompt = "hello world the cat";
    let r =
        post(s.addr, "/v1/completions", &json!({"model": MODEL, "prompt": prompt, "max_tokens": 7, "temperature": 0}))
            .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["content-type"], "application/json");
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(r.headers["x-request-id"], v["id"].as_str().unwrap());
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], MODEL);
    let ids = prompt_ids(&s.tokenizer, prompt);
    let want = expected_text(&s.tokenizer, &ids, &greedy_ids(&ids, 7));
    assert_eq!(v["choices"][0]["text"], want.as_str());
    assert_eq!(v["choices"][0]["index"], 0);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["choices"][0]["logprobs"], Value::Null);
    assert_eq!(v["usage"], json!({"prompt_tokens": ids.len(), "completion_tokens": 7, "total_tokens": ids.len() + 7}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_forms_and_n() {
    let s = TestServer::start(Setup::default()).await;
    let a = prompt_ids(&s.tokenizer, "the cat sat");
    let b: Vec<u32> = vec![7, 8, 9, 10, 11];
    // A list of two prompts (text, token ids) with n = 2: four choices, prompt-major.
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": [a.clone(), b.clone()], "n": 2, "max_tokens": 4, "temperature": 0}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let ch = v["choices"].as_array().unwrap();
    assert_eq!(ch.len(), 4);
    for (i, c) in ch.iter().enumerate() {
        assert_eq!(c["index"], i);
        let p = if i < 2 { &a } else { &b };
        assert_eq!(c["text"], expected_text(&s.tokenizer, p, &greedy_ids(p, 4)).as_str(), "choice {i}");
    }
    assert_eq!(v["usage"]["prompt_tokens"], a.len() + b.len());
    assert_eq!(v["usage"]["completion_tokens"], 16);
    // Token ids alone, and a list of strings.
    let r = post(s.addr, "/v1/completions", &json!({"prompt": b, "max_tokens": 3, "temperature": 0})).await;
    assert_eq!(r.json()["choices"][0]["text"], expected_text(&s.tokenizer, &b, &greedy_ids(&b, 3)).as_str());
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": ["the cat sat", "hello"], "max_tokens": 3, "temperature": 0}),
    )
    .await;
    assert_eq!(r.json()["choices"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_sampling_is_reproducible() {
    let s = TestServer::start(Setup::default()).await;
    let body = json!({"prompt": "hello world", "max_tokens": 12, "temperature": 1.0, "top_p": 0.9, "top_k": 20, "seed": 1234, "n": 3});
    let x = post(s.addr, "/v1/completions", &body).await.json();
    let y = post(s.addr, "/v1/completions", &body).await.json();
    assert_eq!(x["choices"], y["choices"]);
    let texts: Vec<&str> = x["choices"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert!(
        texts[0] != texts[1] || texts[1] != texts[2],
        "three samples of 12 tokens at temperature 1 all agree: {texts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_completion_matches_whole_and_ends_with_done() {
    let s = TestServer::start(Setup::default()).await;
    let body = json!({"prompt": "the cat sat on", "max_tokens": 9, "temperature": 0});
    let whole = post(s.addr, "/v1/completions", &body).await.json();
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    sb["stream_options"] = json!({"include_usage": true});
    let r = post(s.addr, "/v1/completions", &sb).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "text/event-stream");
    let ev = sse_json(&r.text());
    let (usage, chunks) = ev.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"], whole["usage"]);
    let mut text = String::new();
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(c["object"], "text_completion");
        assert!(c["id"].as_str().unwrap().starts_with("cmpl-"));
        assert_eq!(c["id"], chunks[0]["id"]);
        assert_eq!(c["usage"], Value::Null, "usage is null on every chunk but the last");
        let ch = &c["choices"][0];
        text += ch["text"].as_str().unwrap();
        let last = i + 1 == chunks.len();
        assert_eq!(ch["finish_reason"], if last { json!("length") } else { Value::Null }, "chunk {i}");
    }
    assert!(chunks.len() >= 2, "tokens arrive in several chunks");
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_whole_and_streamed() {
    let s = TestServer::start(Setup::default()).await;
    let msgs = json!([{"role": "system", "content": "the cat"}, {"role": "user", "content": [{"type": "text", "text": "hello world"}]}]);
    let r = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": msgs, "max_completion_tokens": 6, "temperature": 0}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    let m = &v["choices"][0]["message"];
    assert_eq!(m["role"], "assistant");
    // The prompt is the rendered template, encoded without adding a BOS.
    let rendered = s
        .tokenizer
        .apply_chat_template(
            &[json!({"role": "system", "content": "the cat"}), json!({"role": "user", "content": "hello world"})],
            true,
        )
        .unwrap();
    let ids = s.tokenizer.encode(&rendered, false).unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], ids.len());
    assert_eq!(m["content"], expected_text(&s.tokenizer, &ids, &greedy_ids(&ids, 6)).as_str());
    assert_eq!(v["choices"][0]["finish_reason"], "length");

    let r = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 6, "temperature": 0, "stream": true, "n": 2}),
    )
    .await;
    let ev = sse_json(&r.text());
    assert_eq!(ev[0]["object"], "chat.completion.chunk");
    assert_eq!(ev[0]["choices"].as_array().unwrap().len(), 2);
    for c in ev[0]["choices"].as_array().unwrap() {
        assert_eq!(c["delta"], json!({"role": "assistant", "content": ""}));
    }
    let mut text = [String::new(), String::new()];
    let mut finished = [0, 0];
    for e in &ev[1..] {
        assert!(e.get("usage").is_none(), "no usage field unless include_usage");
        for c in e["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            assert_eq!(finished[i], 0, "nothing after a choice's finish");
            if let Some(t) = c["delta"]["content"].as_str() {
                text[i] += t;
            }
            if !c["finish_reason"].is_null() {
                assert_eq!(c["finish_reason"], "length");
                finished[i] += 1;
            }
        }
    }
    assert_eq!(finished, [1, 1]);
    assert_eq!(text[0], m["content"].as_str().unwrap());
    assert_eq!(text[1], text[0], "greedy completions agree");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_shapes() {
    let s = TestServer::start(Setup::default()).await;
    let v = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "hello world", "max_tokens": 4, "temperature": 0, "logprobs": 3}),
    )
    .await
    .json();
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 4);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 4);
    assert_eq!(lp["text_offset"].as_array().unwrap().len(), 4);
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert!((3..=4).contains(&top.len()), "{top:?}");
        let l = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(l <= 0.0);
        // Greedy: the chosen token is the most likely one.
        let best = top.values().map(|x| x.as_f64().unwrap()).fold(f64::MIN, f64::max);
        assert!((best - l).abs() < 1e-6, "{best} vs {l}");
    }
    let v = post(s.addr, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0, "logprobs": true, "top_logprobs": 2})).await.json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 3);
    for e in content {
        assert!(e["token"].is_string() && e["logprob"].as_f64().unwrap() <= 0.0 && e["bytes"].is_array());
        assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_cut_the_text() {
    let s = TestServer::start(Setup::default()).await;
    let ids = prompt_ids(&s.tokenizer, "the mat");
    let full = expected_text(&s.tokenizer, &ids, &greedy_ids(&ids, 20));
    // A word from the middle of the greedy text as the stop string.
    let words: Vec<&str> = full.split_whitespace().collect();
    let stop = words[words.len() / 2];
    let cut = &full[..full.find(stop).unwrap()];
    for stream in [false, true] {
        let r = post(
            s.addr,
            "/v1/completions",
            &json!({"prompt": "the mat", "max_tokens": 20, "temperature": 0, "stop": [stop, "zzz"], "stream": stream}),
        )
        .await;
        let (text, finish) = if stream {
            let ev = sse_json(&r.text());
            (
                ev.iter().map(|e| e["choices"][0]["text"].as_str().unwrap().to_string()).collect::<String>(),
                ev.last().unwrap()["choices"][0]["finish_reason"].clone(),
            )
        } else {
            let v = r.json();
            (v["choices"][0]["text"].as_str().unwrap().to_string(), v["choices"][0]["finish_reason"].clone())
        };
        assert_eq!(text, cut, "stream={stream}");
        assert_eq!(finish, "stop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_endpoint() {
    let s = TestServer::start(Setup::default()).await;
    let one = post(s.addr, "/generate", &json!({"prompt": "hello world", "max_tokens": 5, "temperature": 0})).await;
    assert_eq!(one.status, 200, "{}", one.text());
    let ids = prompt_ids(&s.tokenizer, "hello world");
    let want = expected_text(&s.tokenizer, &ids, &greedy_ids(&ids, 5));
    assert_eq!(one.json()["text"], want.as_str());
    let many =
        post(s.addr, "/generate", &json!({"prompts": ["hello world", "the cat"], "max_tokens": 5, "temperature": 0}))
            .await
            .json();
    assert_eq!(many["texts"][0], want.as_str());
    assert_eq!(many["texts"].as_array().unwrap().len(), 2);
    let r = post(
        s.addr,
        "/generate",
        &json!({"prompts": ["hello world", "the cat"], "max_tokens": 5, "temperature": 0, "stream": true}),
    )
    .await;
    let mut texts = [String::new(), String::new()];
    for e in sse_json(&r.text()) {
        texts[e["index"].as_u64().unwrap() as usize] += e["text"].as_str().unwrap();
    }
    assert_eq!(texts[0], want);
    assert_eq!(texts[1], many["texts"][1].as_str().unwrap());
}

/// Parses a Prometheus text exposition strictly enough to catch format mistakes: comment
/// lines, metric names, label syntax, numeric values, and histogram bucket rules.
fn check_exposition(text: &str) -> usize {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars()
                .enumerate()
                .all(|(i, c)| c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit()))
    };
    let mut typed = std::collections::HashMap::new();
    let mut samples = 0;
    let mut last_bucket: Option<(String, f64, f64)> = None; // (series, le, count)
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let kind = parts.next().unwrap();
            let name = parts.next().unwrap();
            assert!(name_ok(name), "bad name {name}");
            if kind == "TYPE" {
                let t = parts.next().unwrap();
                assert!(["counter", "gauge", "histogram"].contains(&t), "{line}");
                assert!(typed.insert(name.to_string(), t.to_string()).is_none(), "TYPE twice: {name}");
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
        let v: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        let (name, labels) = match series.find('{') {
            Some(i) => {
                assert!(series.ends_with('}'), "{line}");
                (&series[..i], &series[i + 1..series.len() - 1])
            }
            None => (series, ""),
        };
        assert!(name_ok(name), "bad metric name in {line}");
        // Labels: name="value" pairs, values with only escaped quotes.
        let mut rest = labels;
        let mut le = None;
        while !rest.is_empty() {
            let eq = rest.find("=\"").unwrap_or_else(|| panic!("bad labels in {line}"));
            let lname = &rest[..eq];
            assert!(name_ok(lname), "bad label name in {line}");
            let body = &rest[eq + 2..];
            let mut end = None;
            let mut esc = false;
            for (i, c) in body.char_indices() {
                match (esc, c) {
                    (true, _) => esc = false,
                    (false, '\\') => esc = true,
                    (false, '"') => {
                        end = Some(i);
                        break;
                    }
                    _ => {}
                }
            }
            let end = end.unwrap_or_else(|| panic!("unterminated label in {line}"));
            if lname == "le" {
                le = Some(&body[..end]);
            }
            rest = &body[end + 1..];
            rest = rest.strip_prefix(',').unwrap_or(rest);
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|f| typed.get(*f).is_some_and(|t| t == "histogram"));
        match family {
            Some(_) if name.ends_with("_bucket") => {
                let le: f64 = match le.expect("bucket without le") {
                    "+Inf" => f64::INFINITY,
                    x => x.parse().unwrap(),
                };
                if let Some((s, ple, pc)) = &last_bucket {
                    if s == name {
                        assert!(le > *ple && v >= *pc, "buckets must grow: {line}");
                    }
                }
                last_bucket = Some((name.to_string(), le, v));
            }
            Some(_) if name.ends_with("_count") => {
                let (s, le, c) = last_bucket.take().expect("count after buckets");
                assert!(
                    s.starts_with(name.trim_end_matches("_count")) && le.is_infinite() && c == v,
                    "+Inf bucket equals count: {line}"
                );
            }
            Some(_) => {}
            None => assert!(typed.contains_key(name), "sample without TYPE: {line}"),
        }
        samples += 1;
    }
    samples
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_tokens_and_parse() {
    let s = TestServer::start(Setup::default()).await;
    for _ in 0..3 {
        let r = post(
            s.addr,
            "/v1/completions",
            &json!({"prompt": "hello world the cat", "max_tokens": 5, "temperature": 0}),
        )
        .await;
        assert_eq!(r.status, 200);
    }
    let text = get(s.addr, "/metrics").await.text();
    assert!(check_exposition(&text) > 50);
    let l = format!("{{model_name=\"{MODEL}\",engine=\"0\"}}");
    assert_eq!(metric(&text, &format!("vllm:generation_tokens_total{l}")), 15.0);
    assert_eq!(metric(&text, &format!("vllm:prompt_tokens_total{l}")), 12.0);
    assert_eq!(metric(&text, &format!("vllm:e2e_request_latency_seconds_count{l}")), 3.0);
    assert_eq!(metric(&text, &format!("vllm:time_to_first_token_seconds_count{l}")), 3.0);
    assert_eq!(metric(&text, &format!("vllm:inter_token_latency_seconds_count{l}")), 12.0);
    assert_eq!(metric(&text, &format!("vllm:request_queue_time_seconds_count{l}")), 3.0);
    assert_eq!(
        metric(
            &text,
            &format!("vllm:request_success_total{{model_name=\"{MODEL}\",engine=\"0\",finished_reason=\"length\"}}")
        ),
        3.0
    );
    // The same prompt three times: the later ones hit the prefix cache (full blocks only; 4
    // tokens fill none), so queries count and hits stay 0 here.
    assert_eq!(metric(&text, &format!("vllm:prefix_cache_queries_total{l}")), 12.0);
    assert_eq!(metric(&text, &format!("vllm:num_requests_running{l}")), 0.0);
    assert_eq!(metric(&text, &format!("vllm:kv_cache_usage_perc{l}")), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_the_blocking_parse_threshold_answer_the_same() {
    let s = TestServer::start(Setup::default()).await;
    // Over the 16 KiB threshold in bytes, under the context in tokens: padding spaces.
    let prompt = format!("{}hello world the cat", " ".repeat(20_000));
    let r = post(s.addr, "/v1/completions", &json!({"prompt": prompt, "max_tokens": 4, "temperature": 0})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let ids = prompt_ids(&s.tokenizer, &prompt);
    assert_eq!(ids.len(), 4);
    assert_eq!(r.json()["choices"][0]["text"], expected_text(&s.tokenizer, &ids, &greedy_ids(&ids, 4)).as_str());
    let bad = post(s.addr, "/v1/completions", &json!({"prompt": prompt, "max_tokens": 0})).await;
    assert_eq!(bad.status, 400);
}
