//! Anthropic's Messages API against the real server: whole and streamed answers (the event
//! names and order, the text), `stop_sequences`, `count_tokens`, `x-api-key`, 4xx answers in
//! Anthropic's error shape, a disconnect's abort (on FakeModel with the word-level tokenizer);
//! tools forced, "any" and round-tripped through `tool_result` (on the tiny random model with
//! structured output, in `structured.rs`'s setup).

use crate::common;

use std::sync::Arc;

use common::*;
use serde_json::{json, Value};

/// The `(event, data)` pairs of an Anthropic stream; each `event:` line names its data's `type`.
fn events(r: &Reply) -> Vec<(String, Value)> {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["content-type"], "text/event-stream");
    let body = r.text();
    assert!(body.ends_with("\n\n"), "{body:?}");
    body.trim_end_matches("\n\n")
        .split("\n\n")
        .map(|e| {
            let (name, data) = e.split_once('\n').unwrap_or_else(|| panic!("one event line and one data line: {e:?}"));
            let name = name.strip_prefix("event: ").unwrap_or_else(|| panic!("{e:?}")).to_string();
            let data: Value =
                serde_json::from_str(data.strip_prefix("data: ").unwrap_or_else(|| panic!("{e:?}"))).unwrap();
            assert_eq!(data["type"], name.as_str(), "{e}");
            (name, data)
        })
        .collect()
}

/// The event names with runs of deltas folded into one, for order checks.
fn shape(ev: &[(String, Value)]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for (n, _) in ev {
        if n == "ping" || (n == "content_block_delta" && out.last() == Some(&"content_block_delta")) {
            continue;
        }
        out.push(n);
    }
    out
}

/// The text of a stream's text deltas (the partial JSON of its input deltas), by block index.
fn deltas(ev: &[(String, Value)], kind: &str, field: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (_, d) in ev.iter().filter(|(n, _)| n == "content_block_delta") {
        let i = d["index"].as_u64().unwrap() as usize;
        if out.len() <= i {
            out.resize(i + 1, String::new());
        }
        if d["delta"]["type"] == kind {
            out[i] += d["delta"][field].as_str().unwrap();
        }
    }
    out
}

fn anthropic_error(r: &Reply, status: u16, kind: &str) -> String {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], kind, "{v}");
    v["error"]["message"].as_str().unwrap_or_else(|| panic!("a message: {v}")).to_string()
}

fn prompt(s: &TestServer, system: &str, user: &str) -> Vec<u32> {
    let rendered = s
        .tokenizer
        .apply_chat_template(
            &[json!({"role": "system", "content": system}), json!({"role": "user", "content": user})],
            true,
        )
        .unwrap();
    s.tokenizer.encode(&rendered, false).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_whole_and_streamed() {
    let s = TestServer::start(Setup::default()).await;
    let body = json!({"model": MODEL, "system": [{"type": "text", "text": "the cat"}], "messages": [{"role": "user", "content": [{"type": "text", "text": "hello world", "cache_control": {"type": "ephemeral"}}]}],
                      "max_tokens": 6, "temperature": 0, "metadata": {"user_id": "u1"}});
    let r = post(s.addr, "/v1/messages", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let ids = prompt(&s, "the cat", "hello world");
    let want = expected_text(&s.tokenizer, &ids, &greedy_ids(&ids, 6));
    let id = v["id"].as_str().unwrap();
    assert!(id.starts_with("msg_") && id.len() == 28, "{id}");
    assert_eq!(r.headers["x-request-id"], id);
    assert_eq!(
        v,
        json!({"id": id, "type": "message", "role": "assistant", "content": [{"type": "text", "text": want}], "model": MODEL, "stop_reason": "max_tokens", "stop_sequence": null,
               "usage": {"input_tokens": ids.len(), "output_tokens": 6}})
    );

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let ev = events(&post(s.addr, "/v1/messages", &sbody).await);
    assert_eq!(
        shape(&ev),
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert!(ev.iter().filter(|(n, _)| n == "content_block_delta").count() >= 2, "tokens arrive in several deltas");
    let start = &ev[0].1["message"];
    assert!(start["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        (start["content"].clone(), start["stop_reason"].clone(), start["usage"]["input_tokens"].clone()),
        (json!([]), Value::Null, json!(ids.len()))
    );
    let block = ev.iter().find(|(n, _)| n == "content_block_start").unwrap();
    assert_eq!(
        block.1,
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    );
    assert_eq!(deltas(&ev, "text_delta", "text"), vec![want]);
    let md = &ev.iter().find(|(n, _)| n == "message_delta").unwrap().1;
    assert_eq!(
        (
            md["delta"]["stop_reason"].clone(),
            md["delta"]["stop_sequence"].clone(),
            md["usage"]["output_tokens"].clone()
        ),
        (json!("max_tokens"), Value::Null, json!(6))
    );

    // Claude Code asks for more than a small model's context holds: trimmed to the room left.
    let r = post(s.addr, "/v1/messages", &json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 32000, "temperature": 0})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(
        v["usage"]["input_tokens"].as_u64().unwrap() + v["usage"]["output_tokens"].as_u64().unwrap(),
        MAX_LEN as u64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sequences_name_the_one_that_stopped() {
    let s = TestServer::start(Setup::default()).await;
    let ids = prompt(&s, "the cat", "hello world");
    let full = expected_text(&s.tokenizer, &ids, &greedy_ids(&ids, 12));
    let word = full.split_whitespace().nth(3).unwrap();
    let stop = format!(" {word}");
    let want = &full[..full.find(&stop).unwrap()];
    let body = json!({"model": MODEL, "system": "the cat", "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 12, "temperature": 0,
                      "stop_sequences": ["never there", stop]});
    let v = post(s.addr, "/v1/messages", &body).await.json();
    assert_eq!((v["stop_reason"].clone(), v["stop_sequence"].clone()), (json!("stop_sequence"), json!(stop)), "{v}");
    assert_eq!(v["content"], json!([{"type": "text", "text": want}]));

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let ev = events(&post(s.addr, "/v1/messages", &sbody).await);
    assert_eq!(deltas(&ev, "text_delta", "text"), vec![want.to_string()], "the stop sequence is never streamed");
    let md = &ev.iter().find(|(n, _)| n == "message_delta").unwrap().1;
    assert_eq!(
        (md["delta"]["stop_reason"].clone(), md["delta"]["stop_sequence"].clone()),
        (json!("stop_sequence"), json!(stop))
    );

    let v = post(s.addr, "/v1/messages", &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stop_sequences": ["never there"]})).await.json();
    assert_eq!((v["stop_reason"].clone(), v["stop_sequence"].clone()), (json!("max_tokens"), Value::Null));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_is_the_prompt_that_runs() {
    let s = TestServer::start(Setup::default()).await;
    let body = json!({"model": MODEL, "system": "the cat", "messages": [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "the mat"}, {"role": "user", "content": "sat"}]});
    let r = post(s.addr, "/v1/messages/count_tokens", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let n = r.json()["input_tokens"].as_u64().unwrap();
    let mut gen = body.clone();
    gen["max_tokens"] = json!(1);
    assert_eq!(post(s.addr, "/v1/messages", &gen).await.json()["usage"]["input_tokens"].as_u64(), Some(n));
    let msg = anthropic_error(
        &post(s.addr, "/v1/messages/count_tokens", &json!({"model": MODEL})).await,
        400,
        "invalid_request_error",
    );
    assert!(msg.contains("`messages` is required"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_api_key_and_bearer_both_work() {
    let mut setup = Setup::default();
    setup.config.api_key = Some("sekrit".into());
    let s = TestServer::start(setup).await;
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string();
    for path in ["/v1/messages", "/v1/messages/count_tokens"] {
        anthropic_error(&request(s.addr, "POST", path, &[], body.clone()).await, 401, "authentication_error");
        anthropic_error(
            &request(s.addr, "POST", path, &[("x-api-key", "wrong")], body.clone()).await,
            401,
            "authentication_error",
        );
        for h in [("x-api-key", "sekrit"), ("authorization", "Bearer sekrit")] {
            let r = request(s.addr, "POST", path, &[h, ("anthropic-version", "2023-06-01")], body.clone()).await;
            assert_eq!(r.status, 200, "{h:?}: {}", r.text());
        }
    }
    // The OpenAI routes take the Anthropic header too.
    let r = request(
        s.addr,
        "POST",
        "/v1/completions",
        &[("x-api-key", "sekrit")],
        json!({"prompt": "hi", "max_tokens": 2}).to_string(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_4xx_in_anthropics_shape() {
    let s = TestServer::start(Setup::default()).await;
    let user = json!([{"role": "user", "content": "hi"}]);
    let long = vec!["hello"; MAX_LEN].join(" ");
    let cases = [
        (json!({"messages": user, "max_tokens": 2}), 400, "invalid_request_error", "`model` is required"),
        (json!({"model": "claude-x", "messages": user, "max_tokens": 2}), 404, "not_found_error", "claude-x"),
        (json!({"model": MODEL, "messages": user}), 400, "invalid_request_error", "`max_tokens` is required"),
        (json!({"model": MODEL, "messages": user, "max_tokens": 0}), 400, "invalid_request_error", "max_tokens"),
        (
            json!({"model": MODEL, "messages": user, "max_tokens": 2, "temperature": "hot"}),
            400,
            "invalid_request_error",
            "temperature",
        ),
        (
            json!({"model": MODEL, "messages": user, "max_tokens": 2, "top_k": 1.5}),
            400,
            "invalid_request_error",
            "top_k",
        ),
        (
            json!({"model": MODEL, "messages": user, "max_tokens": 2, "stop_sequences": "x"}),
            400,
            "invalid_request_error",
            "stop_sequences",
        ),
        (
            json!({"model": MODEL, "messages": user, "max_tokens": 2, "stop_sequences": [""]}),
            400,
            "invalid_request_error",
            "stop_sequences[0]",
        ),
        (
            json!({"model": MODEL, "messages": user, "max_tokens": 2, "mcp_servers": [{"url": "x"}]}),
            400,
            "invalid_request_error",
            "mcp_servers",
        ),
        (
            json!({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}], "max_tokens": 2}),
            400,
            "invalid_request_error",
            "messages[0].content[0].type",
        ),
        (
            json!({"model": MODEL, "messages": user, "max_tokens": 2, "tools": [{"name": "f"}]}),
            400,
            "invalid_request_error",
            "tools[0].input_schema",
        ),
        (
            json!({"model": MODEL, "messages": user, "max_tokens": 2, "tool_choice": {"type": "tool", "name": "f"}}),
            400,
            "invalid_request_error",
            "needs `tools`",
        ),
        (
            json!({"model": MODEL, "messages": [{"role": "user", "content": long}], "max_tokens": 2}),
            400,
            "invalid_request_error",
            "prompt is too long: ",
        ),
    ];
    for (body, status, kind, msg) in cases {
        let m = anthropic_error(&post(s.addr, "/v1/messages", &body).await, status, kind);
        assert!(m.contains(msg), "{body}: {m}");
    }
    let m =
        anthropic_error(&request(s.addr, "POST", "/v1/messages", &[], "{not json").await, 400, "invalid_request_error");
    assert!(m.contains("not valid JSON"), "{m}");
    anthropic_error(&request(s.addr, "GET", "/v1/messages", &[], "").await, 405, "invalid_request_error");
    anthropic_error(&request(s.addr, "POST", "/v1/messages/batches", &[], "{}").await, 404, "not_found_error");
    // Nothing leaked: every refused request left the engine and the server's queue empty.
    let text = get(s.addr, "/metrics").await.text();
    assert_eq!(metric(&text, &format!("tandem:server_queued_requests{{model_name=\"{MODEL}\",engine=\"0\"}}")), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_client_that_leaves_aborts_its_request() {
    crate::lifecycle::streaming_client_that_leaves_aborts(
        "/v1/messages",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": true}),
    )
    .await;
}

mod tools {
    use super::*;
    use crate::structured::{start, tiny_dir, tool_dir, validate};

    fn weather() -> Value {
        json!([
            {"name": "get_weather", "description": "Weather in a city", "cache_control": {"type": "ephemeral"},
             "input_schema": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"], "additionalProperties": false}},
            {"name": "get_time", "input_schema": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"], "additionalProperties": false}}
        ])
    }

    fn schema(name: &str) -> Value {
        weather().as_array().unwrap().iter().find(|t| t["name"] == name).unwrap()["input_schema"].clone()
    }

    fn ask(extra: Value) -> Value {
        let mut b = json!({"model": "tiny", "messages": [{"role": "user", "content": "What is the weather in Oslo?"}], "tools": weather(), "max_tokens": 300});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    }

    /// Checks a message's `tool_use` blocks against the tools; returns (id, name, input).
    fn tool_uses(v: &Value) -> Vec<(String, String, Value)> {
        let uses: Vec<_> =
            v["content"].as_array().unwrap().iter().filter(|b| b["type"] == "tool_use").cloned().collect();
        assert!(!uses.is_empty(), "{v}");
        uses.iter()
            .map(|b| {
                let id = b["id"].as_str().unwrap().to_string();
                assert!(id.starts_with("toolu_"), "{b}");
                let name = b["name"].as_str().unwrap().to_string();
                validate(&schema(&name), &b["input"].to_string());
                (id, name, b["input"].clone())
            })
            .collect()
    }

    /// Greedy, the streamed answer must equal the whole one; sampled (Anthropic's API has no
    /// seed), each must still be valid calls.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forced_and_any_tool_use_whole_and_streamed() {
        let t = start(tiny_dir(), true).await;
        for temperature in [0.0, 1.0] {
            // A named tool: its input streams as input_json_delta from the first token.
            let body = ask(
                json!({"tool_choice": {"type": "tool", "name": "get_time"}, "temperature": temperature, "top_k": 40}),
            );
            let r = post(t.addr, "/v1/messages", &body).await;
            assert_eq!(r.status, 200, "{}", r.text());
            let v = r.json();
            assert_eq!(v["stop_reason"], "tool_use", "{v}");
            let whole = tool_uses(&v);
            assert_eq!((whole.len(), whole[0].1.as_str()), (1, "get_time"));
            let mut sbody = body.clone();
            sbody["stream"] = json!(true);
            let ev = events(&post(t.addr, "/v1/messages", &sbody).await);
            assert_eq!(
                shape(&ev),
                [
                    "message_start",
                    "content_block_start",
                    "content_block_delta",
                    "content_block_stop",
                    "message_delta",
                    "message_stop"
                ]
            );
            let block = &ev.iter().find(|(n, _)| n == "content_block_start").unwrap().1["content_block"];
            assert_eq!(
                (block["type"].clone(), block["name"].clone(), block["input"].clone()),
                (json!("tool_use"), json!("get_time"), json!({}))
            );
            let input: Value = serde_json::from_str(&deltas(&ev, "input_json_delta", "partial_json")[0]).unwrap();
            validate(&schema("get_time"), &input.to_string());
            if temperature == 0.0 {
                assert_eq!(input, whole[0].2, "streamed input equals the whole answer's");
            }
            assert_eq!(ev.iter().find(|(n, _)| n == "message_delta").unwrap().1["delta"]["stop_reason"], "tool_use");

            // "any": one or more calls of any tool, each its own block.
            let body = ask(json!({"tool_choice": {"type": "any"}, "temperature": temperature}));
            let v = post(t.addr, "/v1/messages", &body).await.json();
            assert_eq!(v["stop_reason"], "tool_use", "{v}");
            let whole = tool_uses(&v);
            let mut sbody = body.clone();
            sbody["stream"] = json!(true);
            let ev = events(&post(t.addr, "/v1/messages", &sbody).await);
            let starts =
                ev.iter().filter(|(n, d)| n == "content_block_start" && d["content_block"]["type"] == "tool_use");
            let streamed: Vec<(String, Value)> = deltas(&ev, "input_json_delta", "partial_json")
                .iter()
                .zip(starts)
                .map(|(j, (_, d))| {
                    (d["content_block"]["name"].as_str().unwrap().to_string(), serde_json::from_str(j).unwrap())
                })
                .collect();
            for (name, input) in &streamed {
                validate(&schema(name), &input.to_string());
            }
            assert_eq!(ev.iter().find(|(n, _)| n == "message_delta").unwrap().1["delta"]["stop_reason"], "tool_use");
            if temperature == 0.0 {
                let want: Vec<(String, Value)> = whole.into_iter().map(|(_, n, i)| (n, i)).collect();
                assert_eq!(streamed, want);
            }
        }
    }

    /// "auto" with a template that writes `<tool_call>` (the default with tools): an answer
    /// without calls streams as text, equal to the whole answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn auto_with_call_markup_streams_text() {
        let t = start(tool_dir(), true).await;
        let body = ask(json!({"temperature": 0, "max_tokens": 12}));
        let v = post(t.addr, "/v1/messages", &body).await.json();
        assert_eq!(v["stop_reason"], "max_tokens", "{v}");
        let mut sbody = body.clone();
        sbody["stream"] = json!(true);
        let ev = events(&post(t.addr, "/v1/messages", &sbody).await);
        assert_eq!(
            shape(&ev),
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert!(ev.iter().filter(|(n, _)| n == "content_block_delta").count() >= 2, "it streams");
        assert_eq!(json!([{"type": "text", "text": deltas(&ev, "text_delta", "text")[0]}]), v["content"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tool_use_then_tool_result_round_trips() {
        let t = start(tool_dir(), true).await;
        let v = post(
            t.addr,
            "/v1/messages",
            &ask(json!({"tool_choice": {"type": "tool", "name": "get_weather"}, "temperature": 0})),
        )
        .await
        .json();
        let calls = tool_uses(&v);
        let (id, _, input) = &calls[0];
        // The answer goes back as the assistant's turn, with the result in the next user turn.
        let convo = json!([
            {"role": "user", "content": "What is the weather in Oslo?"},
            {"role": "assistant", "content": v["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": [{"type": "text", "text": "sunny"}]}]}
        ]);
        let r = post(t.addr, "/v1/messages", &json!({"model": "tiny", "messages": convo, "tools": weather(), "tool_choice": {"type": "none"}, "max_tokens": 4})).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let answer = r.json();
        assert_eq!(answer["content"][0]["type"], "text", "{answer}");
        assert!(matches!(answer["stop_reason"].as_str(), Some("max_tokens" | "end_turn")), "{answer}");
        // It rendered as the OpenAI form of the same conversation renders (/tokenize).
        let openai = json!([
            {"role": "user", "content": "What is the weather in Oslo?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "get_weather", "arguments": input.to_string()}}]},
            {"role": "tool", "tool_call_id": id, "content": "sunny"}
        ]);
        let openai_tools: Vec<Value> = weather().as_array().unwrap().iter().map(|t| json!({"type": "function", "function": {"name": t["name"], "description": t.get("description"), "parameters": t["input_schema"]}})).collect();
        let tk = post(t.addr, "/tokenize", &json!({"messages": openai, "tools": openai_tools})).await.json();
        let n =
            post(t.addr, "/v1/messages/count_tokens", &json!({"model": "tiny", "messages": convo, "tools": weather()}))
                .await
                .json();
        assert_eq!(n["input_tokens"], tk["count"], "count_tokens renders as chat does");
        assert_eq!(answer["usage"]["input_tokens"], tk["count"]);
        let ids: Vec<u32> = tk["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
        let rendered = tandem_core::tokenizer::Tokenizer::from_dir(tool_dir()).unwrap().decode(&ids, false).unwrap();
        let city = input["city"].as_str().unwrap();
        assert!(
            rendered.contains(&format!("<tool_call>get_weather:{city}</tool_call>")),
            "the call's input reaches the template as a mapping: {rendered}"
        );
        assert!(rendered.contains("<|im_start|>tool\nsunny<|im_end|>"), "{rendered}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_answer_an_anthropic_client_in_its_shape() {
    let s = TestServer::start(Setup::default()).await;
    let av = ("anthropic-version", "2023-06-01");
    let info = json!({"type": "model", "id": MODEL, "display_name": MODEL, "created_at": "1970-01-01T00:00:00Z", "lifecycle": "active", "max_input_tokens": MAX_LEN, "max_tokens": MAX_LEN});
    let r = request(s.addr, "GET", "/v1/models", &[av], "").await;
    assert_eq!(r.json(), json!({"data": [info], "has_more": false, "first_id": MODEL, "last_id": MODEL}));
    assert_eq!(request(s.addr, "GET", &format!("/v1/models/{MODEL}"), &[av], "").await.json(), info);
    anthropic_error(&request(s.addr, "GET", "/v1/models/claude-x", &[av], "").await, 404, "not_found_error");
    // Without the header: OpenAI's shapes, as before.
    assert_eq!(get(s.addr, "/v1/models").await.json()["object"], "list");
    let one = get(s.addr, &format!("/v1/models/{MODEL}")).await.json();
    assert_eq!((one["object"].clone(), one["id"].clone()), (json!("model"), json!(MODEL)));
    assert_eq!(get(s.addr, "/v1/models/other").await.json()["error"]["code"], 404);
}

/// A template that takes a system message only first (as Mistral's and Gemma's): a later one,
/// as Claude Code sends, is folded into the user turn before it rather than refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_system_messages_fold_for_a_strict_template() {
    use tandem_core::tokenizer::Tokenizer;
    use tandem_engine::fake_model::FakeModel;
    use tandem_engine::{Engine, EngineConfig};
    use tandem_server::engine_adapter::{decode_fn, TandemEngine};
    let dir = tokenizer_dir();
    let path = dir.join("tokenizer_config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg["chat_template"] = json!("{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}{{ raise_exception('system only first') }}{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}");
    std::fs::write(&path, cfg.to_string()).unwrap();
    let tok = Arc::new(Tokenizer::from_dir(&dir).unwrap());
    let handle = Engine::spawn(
        Box::new(FakeModel::new(model_config(), 512, 16, 512, 128)),
        decode_fn(tok.clone()),
        EngineConfig::default(),
    )
    .unwrap();
    let mut config = Setup::default().config;
    config.max_model_len = handle.max_model_len();
    let mut s = TestServer::with_client(config, TandemEngine::ready(handle.clone()), tok.clone()).await;
    s.engine = Some(handle);

    let body = json!({"model": MODEL, "system": "world", "messages": [{"role": "user", "content": "hello"}, {"role": "system", "content": "the cat"}], "max_tokens": 2});
    let r = post(s.addr, "/v1/messages", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let folded = tok
        .apply_chat_template(
            &[json!({"role": "system", "content": "world"}), json!({"role": "user", "content": "hello\n\nthe cat"})],
            true,
        )
        .unwrap();
    let n = tok.encode(&folded, false).unwrap().len();
    assert_eq!(r.json()["usage"]["input_tokens"], n);
    assert_eq!(post(s.addr, "/v1/messages/count_tokens", &body).await.json()["input_tokens"], n);
}
