//! `--tool-call-parser` and `--reasoning-parser` against the real server: an engine that
//! answers every request with a scripted text (a model's own tool-call or thinking markup, which
//! the word-level test tokenizer cannot write), read back as chat completions (whole and
//! streamed) and /v1/messages would read it.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::*;
use serde_json::{json, Value};
use tandem_server::engine_client::{
    CompletionDelta, EngineStats, EngineUpdate, FinishReason, GenerateRequest, RequestId, Submission, SubmitRefusal,
};
use tandem_server::reasoning::ReasoningParser;
use tandem_server::tool_parser::ToolParser;
use tandem_server::{EngineClient, ServerConfig};

/// Answers each request with `pieces`, one token and one update each, then a stop.
pub(crate) struct ScriptEngine {
    pieces: Vec<String>,
    next: AtomicU64,
}

impl EngineClient for ScriptEngine {
    fn submit(&self, _req: GenerateRequest) -> Result<Submission, SubmitRefusal> {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for (i, p) in self.pieces.iter().enumerate() {
            let last = i + 1 == self.pieces.len();
            let d = CompletionDelta {
                index: 0,
                text: p.clone(),
                token_ids: vec![5],
                logprobs: vec![],
                prompt_logprobs: None,
                finish: last.then_some(FinishReason::Stop),
                stop_string: None,
            };
            let _ = tx.send(EngineUpdate { deltas: vec![d], ..Default::default() });
        }
        Ok(Submission::channel(id, rx))
    }
    fn abort(&self, _id: RequestId) {}
    fn stats(&self) -> EngineStats {
        EngineStats::default()
    }
    fn is_ready(&self) -> bool {
        true
    }
}

pub(crate) async fn server(
    tools: Option<ToolParser>,
    reasoning: Option<ReasoningParser>,
    pieces: &[&str],
) -> TestServer {
    let config = ServerConfig {
        addr: ([127, 0, 0, 1], 0).into(),
        max_model_len: MAX_LEN,
        vocab_size: VOCAB,
        tool_call_parser: tools,
        reasoning_parser: reasoning,
        ..Default::default()
    };
    let engine =
        Arc::new(ScriptEngine { pieces: pieces.iter().map(|s| s.to_string()).collect(), next: AtomicU64::new(0) });
    TestServer::with_client(config, engine, tokenizer()).await
}

pub(crate) fn chat(stream: bool) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": "hello world"}], "stream": stream, "max_tokens": 20,
           "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]})
}

/// The deltas of a chat stream's chunks (the role chunk and `[DONE]` left out), with the
/// finish reason of the last.
fn deltas(body: &str) -> (Vec<Value>, Value) {
    let chunks = sse_json(body);
    let finish = chunks.iter().rev().find_map(|c| c["choices"][0]["finish_reason"].as_str().map(String::from));
    (chunks.iter().skip(1).filter_map(|c| c["choices"].get(0).map(|c| c["delta"].clone())).collect(), json!(finish))
}

fn joined(deltas: &[Value], key: &str) -> String {
    deltas.iter().filter_map(|d| d[key].as_str()).collect()
}

pub(crate) const LLAMA: &[&str] =
    &["Let me check.", "\n", "{\"name\": \"get_", "weather\", \"parameters\": ", "{\"city\": \"Paris\"}}"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama3_json_calls_come_as_tool_calls() {
    let s = server(Some(ToolParser::Llama3Json), None, LLAMA).await;
    let r = post(s.addr, "/v1/chat/completions", &chat(false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    assert_eq!(c["message"]["content"], "Let me check.");
    assert_eq!(
        c["message"]["tool_calls"][0]["function"],
        json!({"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"})
    );
    assert!(c["message"].get("reasoning_content").is_none(), "no reasoning parser: no field");

    // Streamed: the text before the call as it comes; the call named once its name is whole,
    // then its arguments as they come.
    let r = post(s.addr, "/v1/chat/completions", &chat(true)).await;
    let (d, finish) = deltas(&r.text());
    assert_eq!(finish, "tool_calls");
    assert_eq!(joined(&d, "content"), "Let me check.\n");
    assert_eq!(d[0]["content"], "Let me check.", "the content streams before the call is done");
    let calls: Vec<&Value> = d.iter().filter_map(|d| d.get("tool_calls")).map(|c| &c[0]).collect();
    assert_eq!(
        calls[0],
        &json!({"index": 0, "id": calls[0]["id"], "type": "function", "function": {"name": "get_weather", "arguments": ""}})
    );
    let args: Vec<&str> = calls[1..].iter().map(|c| c["function"]["arguments"].as_str().unwrap()).collect();
    assert_eq!(args, ["{\"city\": \"Paris\"}"], "the arguments as sampled");

    // /v1/responses streams the same call as function_call_arguments deltas.
    let body = json!({"model": MODEL, "input": "hello world", "stream": true, "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]});
    let body = post(s.addr, "/v1/responses", &body).await.text();
    let ev: Vec<Value> = body
        .trim_end()
        .split("\n\n")
        .map(|e| serde_json::from_str(e.split_once("\ndata: ").unwrap().1).unwrap())
        .collect();
    let kinds: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let text: String =
        ev.iter().filter(|e| e["type"] == "response.output_text.delta").map(|e| e["delta"].as_str().unwrap()).collect();
    assert_eq!(text, "Let me check.\n");
    let added = ev
        .iter()
        .find(|e| e["type"] == "response.output_item.added" && e["item"]["type"] == "function_call")
        .unwrap_or_else(|| panic!("{kinds:?}"));
    assert_eq!((added["output_index"].as_u64(), added["item"]["name"].as_str()), (Some(1), Some("get_weather")));
    let args: String = ev
        .iter()
        .filter(|e| e["type"] == "response.function_call_arguments.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(args, "{\"city\": \"Paris\"}");
    let done = &ev.last().unwrap()["response"];
    assert_eq!(
        (
            done["status"].as_str(),
            done["output"][1]["status"].as_str(),
            done["output"][0]["content"][0]["text"].as_str()
        ),
        (Some("completed"), Some("completed"), Some("Let me check.\n")),
        "{done}"
    );

    // /v1/messages reads the same answer with the same parser.
    let body = json!({"model": MODEL, "max_tokens": 20, "messages": [{"role": "user", "content": "hello world"}],
                      "tools": [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]});
    let v = post(s.addr, "/v1/messages", &body).await.json();
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    assert_eq!(v["content"][0], json!({"type": "text", "text": "Let me check."}));
    assert_eq!(
        (v["content"][1]["type"].as_str(), v["content"][1]["input"].clone()),
        (Some("tool_use"), json!({"city": "Paris"}))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_parser_the_json_is_content() {
    // The test template writes no <tool_call>: no parser at all, as before.
    let s = server(None, None, LLAMA).await;
    let v = post(s.addr, "/v1/chat/completions", &chat(false)).await.json();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["message"]["content"], LLAMA.concat());
}

const QWEN3: &[&str] = &["<th", "ink>\nThe user greets", ". Answer.\n</thi", "nk>\n\nHello", " there."];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen3_thinking_goes_to_reasoning_content() {
    let s = server(None, Some(ReasoningParser::Qwen3), QWEN3).await;
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 20, "chat_template_kwargs": {"enable_thinking": true}});
    let r = post(s.addr, "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let m = r.json()["choices"][0]["message"].clone();
    assert_eq!(m["content"], "\n\nHello there.");
    assert_eq!(m["reasoning_content"], "\nThe user greets. Answer.\n");
    assert_eq!(m["reasoning"], m["reasoning_content"]);

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let (d, finish) = deltas(&post(s.addr, "/v1/chat/completions", &sbody).await.text());
    assert_eq!(finish, "stop");
    assert_eq!(joined(&d, "reasoning_content"), "\nThe user greets. Answer.\n");
    assert_eq!(joined(&d, "reasoning"), "\nThe user greets. Answer.\n");
    assert_eq!(joined(&d, "content"), "\n\nHello there.");
    assert!(d.iter().all(|d| !d["content"].as_str().unwrap_or("").contains("think")), "no tag leaks: {d:?}");

    // A non-object `chat_template_kwargs` is a 400 naming it.
    let mut bad = body.clone();
    bad["chat_template_kwargs"] = json!("enable_thinking");
    let r = post(s.addr, "/v1/chat/completions", &bad).await;
    assert_eq!((r.status.as_u16(), r.json()["error"]["param"].clone()), (400, json!("chat_template_kwargs")));

    // /v1/messages: a thinking block before the text, whole and streamed.
    let body = json!({"model": MODEL, "max_tokens": 20, "messages": [{"role": "user", "content": "hello world"}]});
    let v = post(s.addr, "/v1/messages", &body).await.json();
    assert_eq!(
        v["content"],
        json!([{"type": "thinking", "thinking": "\nThe user greets. Answer.\n", "signature": ""}, {"type": "text", "text": "\n\nHello there."}]),
        "{v}"
    );
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let text = post(s.addr, "/v1/messages", &sbody).await.text();
    let thinking: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter(|d| d["delta"]["type"] == "thinking_delta")
        .map(|d| d["delta"]["thinking"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(thinking, "\nThe user greets. Answer.\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_then_a_call() {
    let pieces = [
        "Okay, weather in Paris.\n",
        "</think>\n\n",
        "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
    ];
    let s = server(Some(ToolParser::Mistral), Some(ReasoningParser::DeepSeekR1), &pieces).await;
    let v = post(s.addr, "/v1/chat/completions", &chat(false)).await.json();
    let c = &v["choices"][0];
    assert_eq!(
        (c["finish_reason"].as_str(), c["message"]["content"].clone()),
        (Some("tool_calls"), Value::Null),
        "{v}"
    );
    assert_eq!(c["message"]["reasoning_content"], "Okay, weather in Paris.\n");
    assert_eq!(c["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}");
    let (d, finish) = deltas(&post(s.addr, "/v1/chat/completions", &chat(true)).await.text());
    assert_eq!(finish, "tool_calls");
    assert_eq!(joined(&d, "reasoning_content"), "Okay, weather in Paris.\n");
    assert_eq!(joined(&d, "content"), "", "the blank before the call is held, then dropped");
}
