//! OpenAI's Responses API against the real server: whole and streamed answers (the events,
//! their order and sequence numbers, the text), the store (`previous_response_id`, `GET`,
//! `DELETE`, its size and age limits counted in /metrics), reasoning items, 4xx answers in
//! OpenAI's error shape, a disconnect's abort (on FakeModel with the word-level tokenizer);
//! forced calls streamed as sampled, a function_call / function_call_output round trip and
//! `text.format` (on the tiny random model with structured output, `structured.rs`'s setup).
//! Also chat completions' streamed forced calls (OpenAI's chunk shape, a call cut by
//! `max_tokens`).

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// The `(event, data)` pairs of a Responses stream; each `event:` line names its data's
/// `type`, and `sequence_number` counts from 0 without gaps.
fn events(r: &Reply) -> Vec<(String, Value)> {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["content-type"], "text/event-stream");
    let body = r.text();
    assert!(body.ends_with("\n\n"), "{body:?}");
    let ev: Vec<(String, Value)> = body
        .trim_end_matches("\n\n")
        .split("\n\n")
        .map(|e| {
            let (name, data) = e.split_once('\n').unwrap_or_else(|| panic!("one event line and one data line: {e:?}"));
            let name = name.strip_prefix("event: ").unwrap_or_else(|| panic!("{e:?}")).to_string();
            let data: Value =
                serde_json::from_str(data.strip_prefix("data: ").unwrap_or_else(|| panic!("{e:?}"))).unwrap();
            assert_eq!(data["type"], name.as_str(), "{e}");
            (name, data)
        })
        .collect();
    for (i, (_, d)) in ev.iter().enumerate() {
        assert_eq!(d["sequence_number"], i, "{d}");
    }
    ev
}

/// Event names with runs of deltas folded into one, for order checks.
fn shape(ev: &[(String, Value)]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for (n, _) in ev {
        if n.ends_with(".delta") && out.last() == Some(&n.as_str()) {
            continue;
        }
        out.push(n);
    }
    out
}

fn concat(ev: &[(String, Value)], name: &str) -> String {
    ev.iter().filter(|(n, _)| n == name).map(|(_, d)| d["delta"].as_str().unwrap()).collect()
}

fn openai_error(r: &Reply, status: u16) -> Value {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    let e = &v["error"];
    assert!(
        e["message"].is_string() && e["type"].is_string() && e.get("param").is_some() && e.get("code").is_some(),
        "OpenAI's error shape: {v}"
    );
    e.clone()
}

fn prompt(s: &TestServer, msgs: &[Value]) -> Vec<u32> {
    let rendered = s.tokenizer.apply_chat_template(msgs, true).unwrap();
    s.tokenizer.encode(&rendered, false).unwrap()
}

fn output_text(v: &Value) -> String {
    v["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .map(|i| i["content"][0]["text"].as_str().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_whole_and_streamed() {
    let s = TestServer::start(Setup::default()).await;
    let body = json!({"model": MODEL, "instructions": "the cat", "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello world"}]}],
                      "max_output_tokens": 6, "temperature": 0, "metadata": {"k": "v"}});
    let r = post(s.addr, "/v1/responses", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let ids = prompt(
        &s,
        &[json!({"role": "system", "content": "the cat"}), json!({"role": "user", "content": "hello world"})],
    );
    let want = expected_text(&s.tokenizer, &ids, &greedy_ids(&ids, 6));
    let id = v["id"].as_str().unwrap();
    assert!(id.starts_with("resp_") && id.len() == 29, "{id}");
    assert_eq!(r.headers["x-request-id"], id);
    assert_eq!(
        (v["object"].as_str(), v["status"].as_str(), v["incomplete_details"].clone()),
        (Some("response"), Some("incomplete"), json!({"reason": "max_output_tokens"})),
        "{v}"
    );
    assert_eq!(
        (v["instructions"].clone(), v["metadata"].clone(), v["max_output_tokens"].clone(), v["model"].clone()),
        (json!("the cat"), json!({"k": "v"}), json!(6), json!(MODEL))
    );
    let out = v["output"].as_array().unwrap();
    assert_eq!(out.len(), 1, "{v}");
    assert_eq!(
        (out[0]["type"].as_str(), out[0]["role"].as_str(), out[0]["content"][0]["type"].as_str()),
        (Some("message"), Some("assistant"), Some("output_text"))
    );
    assert_eq!(output_text(&v), want);
    assert_eq!(
        v["usage"],
        json!({"input_tokens": ids.len(), "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 6, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": ids.len() + 6})
    );

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let ev = events(&post(s.addr, "/v1/responses", &sbody).await);
    assert_eq!(
        shape(&ev),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.incomplete"
        ]
    );
    assert!(
        ev.iter().filter(|(n, _)| n == "response.output_text.delta").count() >= 2,
        "tokens arrive in several deltas"
    );
    assert_eq!(ev[0].1["response"]["status"], "in_progress");
    assert_eq!(concat(&ev, "response.output_text.delta"), want);
    let done = &ev.iter().find(|(n, _)| n == "response.output_text.done").unwrap().1;
    assert_eq!(done["text"], want.as_str());
    let item_id = &ev[2].1["item"]["id"];
    assert!(ev
        .iter()
        .filter(|(n, _)| n.contains("output_text") || n.contains("content_part"))
        .all(|(_, d)| &d["item_id"] == item_id && d["output_index"] == 0));
    let last = &ev.last().unwrap().1["response"];
    assert_eq!(
        (output_text(last), last["usage"]["output_tokens"].clone(), last["id"].clone()),
        (want.clone(), json!(6), ev[0].1["response"]["id"].clone())
    );

    // A bare string is one user message; no `max_output_tokens`: what the context leaves.
    let v = post(s.addr, "/v1/responses", &json!({"input": "hello", "temperature": 0})).await.json();
    assert_eq!(v["usage"]["total_tokens"], MAX_LEN, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_continue_and_can_be_read_and_deleted() {
    let s = TestServer::start(Setup::default()).await;
    let first = post(s.addr, "/v1/responses", &json!({"model": MODEL, "input": "hello world", "instructions": "the cat", "max_output_tokens": 3, "temperature": 0})).await.json();
    let id = first["id"].as_str().unwrap();
    assert_eq!(get(s.addr, &format!("/v1/responses/{id}")).await.json(), first);

    // The follow-up sees the first input and answer, not its instructions.
    let second = post(
        s.addr,
        "/v1/responses",
        &json!({"model": MODEL, "input": "sat", "previous_response_id": id, "max_output_tokens": 2, "temperature": 0}),
    )
    .await
    .json();
    assert_eq!(second["previous_response_id"], id);
    let convo = [
        json!({"role": "user", "content": "hello world"}),
        json!({"role": "assistant", "content": output_text(&first)}),
        json!({"role": "user", "content": "sat"}),
    ];
    let ids = prompt(&s, &convo);
    assert_eq!(second["usage"]["input_tokens"], ids.len(), "{second}");
    assert_eq!(output_text(&second), expected_text(&s.tokenizer, &ids, &greedy_ids(&ids, 2)));
    // Streamed answers are stored too, and chains go on.
    let ev = events(
        &post(
            s.addr,
            "/v1/responses",
            &json!({"input": "mat", "previous_response_id": second["id"], "max_output_tokens": 2, "stream": true}),
        )
        .await,
    );
    let third = ev.last().unwrap().1["response"].clone();
    assert_eq!(get(s.addr, &format!("/v1/responses/{}", third["id"].as_str().unwrap())).await.json(), third);

    let unstored =
        post(s.addr, "/v1/responses", &json!({"input": "hi", "max_output_tokens": 1, "store": false})).await.json();
    assert_eq!(unstored["store"], false);
    openai_error(&get(s.addr, &format!("/v1/responses/{}", unstored["id"].as_str().unwrap())).await, 404);

    let r = request(s.addr, "DELETE", &format!("/v1/responses/{id}"), &[], "").await;
    assert_eq!(r.json(), json!({"id": id, "object": "response", "deleted": true}));
    let e = openai_error(&get(s.addr, &format!("/v1/responses/{id}")).await, 404);
    assert!(e["message"].as_str().unwrap().contains(id), "{e}");
    openai_error(&request(s.addr, "DELETE", &format!("/v1/responses/{id}"), &[], "").await, 404);
    let e = openai_error(&post(s.addr, "/v1/responses", &json!({"input": "x", "previous_response_id": id})).await, 400);
    assert_eq!(
        (e["param"].as_str(), e["code"].as_str()),
        (Some("previous_response_id"), Some("previous_response_not_found"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_is_bounded_by_count_bytes_and_age() {
    let mut setup = Setup::default();
    setup.config.responses_capacity = 2;
    setup.config.responses_ttl = Duration::from_millis(400);
    let s = TestServer::start(setup).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            post(s.addr, "/v1/responses", &json!({"input": "hi", "max_output_tokens": 1})).await.json()["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    openai_error(&get(s.addr, &format!("/v1/responses/{}", ids[0])).await, 404);
    assert_eq!(get(s.addr, &format!("/v1/responses/{}", ids[2])).await.status, 200);
    let l = format!("{{model_name=\"{MODEL}\",engine=\"0\"}}");
    let m = get(s.addr, "/metrics").await.text();
    assert_eq!(
        (metric(&m, &format!("tandem:responses_evicted_total{l}")), metric(&m, &format!("tandem:responses_stored{l}"))),
        (1.0, 2.0),
        "{m}"
    );
    let bytes = metric(&m, &format!("tandem:responses_stored_bytes{l}"));
    assert!(bytes > 2.0 * 500.0, "two responses' JSON: {bytes} bytes");
    tokio::time::sleep(Duration::from_millis(500)).await;
    openai_error(&get(s.addr, &format!("/v1/responses/{}", ids[2])).await, 404);
    let m = get(s.addr, "/metrics").await.text();
    assert_eq!(
        (metric(&m, &format!("tandem:responses_evicted_total{l}")), metric(&m, &format!("tandem:responses_stored{l}"))),
        (3.0, 0.0),
        "{m}"
    );
    assert_eq!(metric(&m, &format!("tandem:responses_stored_bytes{l}")), 0.0);

    // A byte bound: a response larger than the whole store is not kept (and counted).
    let mut setup = Setup::default();
    setup.config.responses_max_bytes = 300;
    let s = TestServer::start(setup).await;
    let id = post(s.addr, "/v1/responses", &json!({"input": "hi", "max_output_tokens": 1})).await.json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    openai_error(&get(s.addr, &format!("/v1/responses/{id}")).await, 404);
    let m = get(s.addr, "/metrics").await.text();
    assert_eq!(
        (metric(&m, &format!("tandem:responses_evicted_total{l}")), metric(&m, &format!("tandem:responses_stored{l}"))),
        (1.0, 0.0),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_comes_as_a_reasoning_item() {
    let mut setup = Setup::default();
    // DeepSeek-R1's reading: an answer with no `</think>` is all reasoning.
    setup.config.reasoning_parser = Some(tandem_server::reasoning::ReasoningParser::DeepSeekR1);
    let s = TestServer::start(setup).await;
    let body = json!({"input": "hello world", "max_output_tokens": 5, "temperature": 0});
    let v = post(s.addr, "/v1/responses", &body).await.json();
    let ids = prompt(&s, &[json!({"role": "user", "content": "hello world"})]);
    let want = expected_text(&s.tokenizer, &ids, &greedy_ids(&ids, 5));
    let out = v["output"].as_array().unwrap();
    assert_eq!(
        (out.len(), out[0]["type"].as_str(), out[0]["content"][0]["text"].as_str()),
        (1, Some("reasoning"), Some(want.as_str())),
        "{v}"
    );
    assert!(v["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64().unwrap() > 0, "{v}");
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let ev = events(&post(s.addr, "/v1/responses", &sbody).await);
    assert_eq!(concat(&ev, "response.reasoning_text.delta"), want);
    assert!(ev.iter().all(|(n, _)| n != "response.output_text.delta"));
    assert_eq!(ev.last().unwrap().1["response"]["output"][0]["type"], "reasoning");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_4xx_in_openais_shape() {
    let s = TestServer::start(Setup::default()).await;
    let long = vec!["hello"; MAX_LEN].join(" ");
    let f = json!([{"type": "function", "name": "f", "parameters": {"type": "object"}}]);
    let cases = [
        (json!({"model": "gpt-x", "input": "hi"}), 404, "model"),
        (json!({}), 400, "input"),
        (json!({"input": 3}), 400, "input"),
        (json!({"input": []}), 400, "input"),
        (json!({"input": [{"role": "tool", "content": "x"}]}), 400, "input[0].role"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            400,
            "input[0].content[0].type",
        ),
        (json!({"input": [{"type": "item_reference", "id": "x"}]}), 400, "input[0].type"),
        (json!({"input": [{"type": "function_call", "name": "f"}]}), 400, "input[0]"),
        (json!({"input": "hi", "max_output_tokens": 0}), 400, "max_output_tokens"),
        (json!({"input": "hi", "temperature": "hot"}), 400, "temperature"),
        (json!({"input": "hi", "background": true}), 400, "background"),
        (json!({"input": "hi", "conversation": "conv_1"}), 400, "conversation"),
        (json!({"input": "hi", "truncation": "auto"}), 400, "truncation"),
        (json!({"input": "hi", "top_logprobs": 2}), 400, "top_logprobs"),
        (json!({"input": "hi", "instructions": 5}), 400, "instructions"),
        (json!({"input": "hi", "tools": [{"type": "web_search"}]}), 400, "tools[0].type"),
        (json!({"input": "hi", "tools": [{"type": "function", "parameters": {}}]}), 400, "tools[0].name"),
        (
            json!({"input": "hi", "tools": [f[0], {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "g"}, {"type": "function", "parameters": {}}]}]}),
            400,
            "tools[1].tools[1].name",
        ),
        (
            json!({"input": "hi", "tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]}]}),
            400,
            "tools[0].tools[0].type",
        ),
        (json!({"input": "hi", "tools": f, "tool_choice": {"type": "function", "name": "g"}}), 400, "tool_choice.name"),
        (json!({"input": "hi", "tool_choice": "required"}), 400, "tool_choice"),
        (json!({"input": "hi", "text": {"format": {"type": "json_schema", "schema": {}}}}), 400, "text.format.name"),
        (json!({"input": "hi", "text": {"format": {"type": "yaml"}}}), 400, "text.format.type"),
        (json!({"input": "hi", "text": {"format": {"type": "json_object"}}}), 400, "text.format"),
        (json!({"input": long}), 400, "input"),
    ];
    for (body, status, param) in cases {
        let e = openai_error(&post(s.addr, "/v1/responses", &body).await, status);
        assert_eq!(e["param"].as_str(), Some(param), "{body}: {e}");
    }
    openai_error(&request(s.addr, "POST", "/v1/responses", &[], "{not json").await, 400);
    openai_error(&request(s.addr, "GET", "/v1/responses", &[], "").await, 405);
    let r = request(s.addr, "PUT", "/v1/responses/resp_1", &[], "").await;
    assert_eq!(r.headers["allow"], "GET, DELETE");
    openai_error(&r, 405);
    let text = get(s.addr, "/metrics").await.text();
    assert_eq!(
        metric(&text, &format!("tandem:server_queued_requests{{model_name=\"{MODEL}\",engine=\"0\"}}")),
        0.0,
        "nothing leaked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_client_that_leaves_aborts_its_request() {
    crate::lifecycle::streaming_client_that_leaves_aborts(
        "/v1/responses",
        json!({"input": "hi", "max_output_tokens": 5, "stream": true}),
    )
    .await;
}

mod tools {
    use super::*;
    use crate::structured::{no_whitespace, same_json, start, streamed_calls, tiny_dir, tool_dir, validate};

    fn weather() -> Value {
        json!([
            {"type": "function", "name": "get_weather", "description": "Weather in a city", "strict": true,
             "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"], "additionalProperties": false}},
            {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"], "additionalProperties": false}}
        ])
    }

    fn schema(name: &str) -> Value {
        weather().as_array().unwrap().iter().find(|t| t["name"] == name).unwrap()["parameters"].clone()
    }

    fn ask(extra: Value) -> Value {
        let mut b = json!({"model": "tiny", "input": "What is the weather in Oslo?", "tools": weather(), "max_output_tokens": 300, "logit_bias": no_whitespace()});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    }

    /// A response's function_call items, checked against the tools: (name, arguments).
    fn calls(v: &Value) -> Vec<(String, String)> {
        let items: Vec<&Value> =
            v["output"].as_array().unwrap().iter().filter(|i| i["type"] == "function_call").collect();
        assert!(!items.is_empty(), "{v}");
        items
            .iter()
            .map(|i| {
                assert!(
                    i["id"].as_str().unwrap().starts_with("fc_") && i["call_id"].as_str().unwrap().starts_with("call_"),
                    "{i}"
                );
                assert_eq!(i["status"], "completed", "{i}");
                let (name, args) =
                    (i["name"].as_str().unwrap().to_string(), i["arguments"].as_str().unwrap().to_string());
                validate(&schema(&name), &args);
                (name, args)
            })
            .collect()
    }

    /// Named and "required": the arguments stream as sampled, in more than one delta, and add
    /// up to the whole answer's calls.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forced_calls_stream_their_arguments() {
        let t = start(tiny_dir(), true).await;
        for choice in [json!({"type": "function", "name": "get_weather"}), json!("required")] {
            let body = ask(json!({"tool_choice": choice, "temperature": 0}));
            let r = post(t.addr, "/v1/responses", &body).await;
            assert_eq!(r.status, 200, "{}", r.text());
            let v = r.json();
            assert_eq!(v["status"], "completed", "{v}");
            let whole = calls(&v);
            let mut sbody = body.clone();
            sbody["stream"] = json!(true);
            let ev = events(&post(t.addr, "/v1/responses", &sbody).await);
            let added: Vec<&Value> = ev
                .iter()
                .filter(|(n, d)| n == "response.output_item.added" && d["item"]["type"] == "function_call")
                .map(|(_, d)| &d["item"])
                .collect();
            assert_eq!(added.len(), whole.len(), "{choice}");
            assert!(added.iter().all(|i| i["arguments"] == "" && i["status"] == "in_progress"));
            let mut streamed = Vec::new();
            for (k, item) in added.iter().enumerate() {
                let pieces: Vec<&str> = ev
                    .iter()
                    .filter(|(n, d)| n == "response.function_call_arguments.delta" && d["item_id"] == item["id"])
                    .map(|(_, d)| d["delta"].as_str().unwrap())
                    .collect();
                assert!(pieces.len() > 1, "{choice}: call {k}'s arguments in several deltas: {pieces:?}");
                let done = &ev
                    .iter()
                    .find(|(n, d)| n == "response.function_call_arguments.done" && d["item_id"] == item["id"])
                    .unwrap()
                    .1;
                assert_eq!(done["arguments"], pieces.concat());
                streamed.push((item["name"].as_str().unwrap().to_string(), pieces.concat()));
            }
            assert_eq!(same_json(streamed), same_json(whole), "{choice}: streamed calls equal the whole answer's");
            let last = &ev.last().unwrap();
            assert_eq!(last.0, "response.completed");
            calls(&last.1["response"]);
        }
    }

    /// A `namespace` tool's functions are served as functions; their calls name the namespace.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn namespaced_functions_are_called_with_their_namespace() {
        let t = start(tiny_dir(), true).await;
        let ns = json!([{"type": "function", "name": "get_time", "parameters": schema("get_time")},
                        {"type": "namespace", "name": "weather", "description": "Weather tools", "tools": [weather()[0].clone()]}]);
        for stream in [false, true] {
            let body = ask(
                json!({"tools": ns, "tool_choice": {"type": "function", "name": "get_weather"}, "temperature": 0, "stream": stream}),
            );
            let r = post(t.addr, "/v1/responses", &body).await;
            let v = if stream { events(&r).last().unwrap().1["response"].clone() } else { r.json() };
            let (name, args) = calls(&v).remove(0);
            assert_eq!((name.as_str(), v["output"][0]["namespace"].as_str()), ("get_weather", Some("weather")), "{v}");
            validate(&schema("get_weather"), &args);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn function_call_then_output_round_trips() {
        let t = start(tool_dir(), true).await;
        let v = post(
            t.addr,
            "/v1/responses",
            &ask(json!({"tool_choice": {"type": "function", "name": "get_weather"}, "temperature": 0})),
        )
        .await
        .json();
        let item = v["output"].as_array().unwrap().iter().find(|i| i["type"] == "function_call").unwrap().clone();
        let input: Value = serde_json::from_str(item["arguments"].as_str().unwrap()).unwrap();
        // The call goes back as an input item, with its output after it.
        let next = json!([
            {"role": "user", "content": "What is the weather in Oslo?"},
            item,
            {"type": "function_call_output", "call_id": item["call_id"], "output": "sunny"}
        ]);
        let r = post(
            t.addr,
            "/v1/responses",
            &json!({"model": "tiny", "input": next, "tools": weather(), "tool_choice": "none", "max_output_tokens": 4}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let answer = r.json();
        assert_eq!(answer["output"][0]["type"], "message", "{answer}");
        // It rendered as the chat form of the same conversation renders.
        let chat = json!([
            {"role": "user", "content": "What is the weather in Oslo?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": item["call_id"], "type": "function", "function": {"name": "get_weather", "arguments": item["arguments"]}}]},
            {"role": "tool", "tool_call_id": item["call_id"], "content": "sunny"}
        ]);
        let chat_tools: Vec<Value> = weather().as_array().unwrap().iter().map(|t| json!({"type": "function", "function": {"name": t["name"], "description": t.get("description"), "parameters": t["parameters"]}})).collect();
        let tk = post(t.addr, "/tokenize", &json!({"messages": chat, "tools": chat_tools})).await.json();
        assert_eq!(answer["usage"]["input_tokens"], tk["count"]);
        let ids: Vec<u32> = tk["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
        let rendered = tandem_core::tokenizer::Tokenizer::from_dir(tool_dir()).unwrap().decode(&ids, false).unwrap();
        let city = input["city"].as_str().unwrap();
        assert!(
            rendered.contains(&format!("<tool_call>get_weather:{city}</tool_call>")),
            "the call's arguments reach the template as a mapping: {rendered}"
        );
        assert!(rendered.contains("<|im_start|>tool\nsunny<|im_end|>"), "{rendered}");
        // The same through previous_response_id: the stored call, then its output.
        let r = post(t.addr, "/v1/responses", &json!({"model": "tiny", "previous_response_id": v["id"], "input": [{"type": "function_call_output", "call_id": item["call_id"], "output": "sunny"}], "tools": weather(), "tool_choice": "none", "max_output_tokens": 4})).await;
        assert_eq!(r.json()["usage"]["input_tokens"], tk["count"], "{}", r.text());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn text_format_constrains_the_answer() {
        let t = start(tiny_dir(), true).await;
        let schema = json!({"type": "object", "properties": {"color": {"enum": ["red", "green"]}, "n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["color", "n"], "additionalProperties": false});
        for seed in [1, 2] {
            let body = json!({"model": "tiny", "input": "Pick.", "text": {"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": true}}, "temperature": 1.0, "seed": seed, "max_output_tokens": 100, "logit_bias": no_whitespace()});
            let v = post(t.addr, "/v1/responses", &body).await.json();
            assert_eq!(v["status"], "completed", "{v}");
            validate(&schema, &output_text(&v));
            assert_eq!(v["text"]["format"]["name"], "pick");
        }
        let e = openai_error(&post(t.addr, "/v1/responses", &json!({"model": "tiny", "input": "x", "text": {"format": {"type": "json_schema", "name": "bad", "schema": {"type": "nope"}}}})).await, 400);
        assert_eq!(e["param"], "text.format.schema", "{e}");
    }

    /// Chat completions: a forced call's arguments stream as sampled (OpenAI's chunk shape),
    /// adding up to the whole answer's; a call cut by `max_tokens` is a partial call.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn chat_streams_forced_calls_and_cuts_them_as_calls() {
        let t = start(tiny_dir(), true).await;
        let chat_tools: Vec<Value> = weather()
            .as_array()
            .unwrap()
            .iter()
            .map(|t| json!({"type": "function", "function": {"name": t["name"], "parameters": t["parameters"]}}))
            .collect();
        let body = json!({"model": "tiny", "messages": [{"role": "user", "content": "Weather?"}], "tools": chat_tools, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                          "temperature": 0, "max_tokens": 300, "logit_bias": no_whitespace()});
        let v = post(t.addr, "/v1/chat/completions", &body).await.json();
        let whole = v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].as_str().unwrap().to_string();
        validate(&schema("get_weather"), &whole);
        let mut sbody = body.clone();
        sbody["stream"] = json!(true);
        let (calls, pieces, finish) =
            streamed_calls(&sse_json(&post(t.addr, "/v1/chat/completions", &sbody).await.text()));
        assert_eq!((calls.len(), finish.as_deref()), (1, Some("stop")));
        assert!(pieces > 1, "the arguments come in {pieces} chunks");
        assert_eq!(calls[0]["function"]["arguments"], whole, "a named call's streamed arguments are its text");

        for choice in [json!({"type": "function", "function": {"name": "get_weather"}}), json!("required")] {
            let mut cut = body.clone();
            cut["tool_choice"] = choice.clone();
            cut["max_tokens"] = json!(8);
            let v = post(t.addr, "/v1/chat/completions", &cut).await.json();
            let c = &v["choices"][0];
            assert_eq!(
                (c["finish_reason"].as_str(), c["message"]["content"].clone()),
                (Some("length"), Value::Null),
                "{choice}: {v}"
            );
            let calls = c["message"]["tool_calls"].as_array().cloned().unwrap_or_default();
            assert!(
                calls.iter().all(|c| c["function"]["name"] == "get_weather" || c["function"]["name"] == "get_time"),
                "{v}"
            );
            cut["stream"] = json!(true);
            let (streamed, _, finish) =
                streamed_calls(&sse_json(&post(t.addr, "/v1/chat/completions", &cut).await.text()));
            assert_eq!(finish.as_deref(), Some("length"), "{choice}");
            let names = |c: &[Value]| c.iter().map(|c| c["function"]["name"].clone()).collect::<Vec<_>>();
            assert_eq!(names(&streamed), names(&calls), "{choice}");
            if choice.is_object() {
                assert!(
                    !calls.is_empty()
                        && serde_json::from_str::<Value>(calls[0]["function"]["arguments"].as_str().unwrap()).is_err(),
                    "a cut call's arguments are partial: {v}"
                );
                assert_eq!(streamed[0]["function"]["arguments"], calls[0]["function"]["arguments"]);
            }
        }
    }
}
