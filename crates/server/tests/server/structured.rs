//! Structured output and tool calls over HTTP, on the tiny random model (byte-level BPE
//! tokenizer, reference backend) with the real engine and `tandem-structured`: every form's
//! outputs parse and validate (the `jsonschema` crate) across seeds and temperatures, streamed
//! and whole, with n > 1; bad specs are 400s naming their field; tools "required", named,
//! "none" and "auto" answer in OpenAI's shape.
//!
//! Schemas are bounded (enums, small integers, maxLength): a random model writes random text,
//! and an unbounded string would run to max_tokens.

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde_json::{json, Value};
use tandem_core::model::{LoadOptions, Model};
use tandem_core::tokenizer::Tokenizer;
use tandem_core::ModelConfig;
use tandem_engine::{Engine, EngineConfig, EngineHandle};
use tandem_server::engine_adapter::{decode_fn, TandemEngine};
use tandem_server::{Server, ServerConfig};
use tandem_structured::Structured;

use common::{post, sse_json};

/// The tiny random model, written once per test binary.
pub(crate) fn tiny_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("tandem-structured-test-{}", std::process::id()));
        tandem_model_files::random_model::write_random_model(
            &dir,
            tandem_model_files::random_model::Shape::Tiny,
            1,
            tandem_core::DType::F32,
        )
        .expect("writing the tiny model");
        dir
    })
}

/// A template that renders tools and Hermes-style `<tool_call>` blocks (as Qwen2.5's does, in
/// miniature), for the tests of what reaches the template and of "auto".
const TOOL_TEMPLATE: &str = "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools> Answer in <tool_call></tool_call> tags.<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }}:{{ c.function.arguments.city }}</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The tiny model with [`TOOL_TEMPLATE`] as its chat template.
pub(crate) fn tool_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let src = tiny_dir();
        let dir = std::env::temp_dir().join(format!("tandem-structured-test-tools-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["config.json", "model.safetensors", "tokenizer.json", "generation_config.json"] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        let mut cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(src.join("tokenizer_config.json")).unwrap()).unwrap();
        cfg["chat_template"] = json!(TOOL_TEMPLATE);
        std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
        dir
    })
}

pub(crate) struct Tiny {
    pub(crate) addr: SocketAddr,
    engine: EngineHandle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Tiny {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.engine.shutdown();
    }
}

/// The server as `tandem serve` wires it: the model, its tokenizer with the config's EOS ids,
/// and the structured-output compiler built from the same directory.
pub(crate) async fn start(dir: &Path, structured: bool) -> Tiny {
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let mut tok = Tokenizer::from_dir(dir).unwrap();
    tok.add_eos_ids(&cfg.eos_token_ids);
    let tok = Arc::new(tok);
    let opts = LoadOptions { max_seqs: 16, max_batch_tokens: 512, num_kv_blocks: 256, ..LoadOptions::default() };
    let model = Model::load(tandem_reference::RefBackend::new(), dir, opts).unwrap();
    let engine = Engine::spawn(Box::new(model), decode_fn(tok.clone()), EngineConfig::default()).unwrap();
    let config = ServerConfig {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        max_model_len: engine.max_model_len(),
        vocab_size: cfg.vocab_size,
        ..Default::default()
    };
    let server = Server::bind(config, TandemEngine::ready(engine.clone()), tok.clone(), "tiny".into()).await.unwrap();
    if structured {
        server.set_structured(Structured::from_model_dir(dir, &tok.eos_ids).map(Arc::new).map_err(|e| e.to_string()));
    }
    let addr = server.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    Tiny { addr, engine, stop: Some(tx) }
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
            "color": {"enum": ["red", "green", "blue"]},
            "ok": {"type": "boolean"}
        },
        "required": ["name", "age", "color", "ok"],
        "additionalProperties": false
    })
}

pub(crate) fn validate(schema: &Value, text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    let validator = jsonschema::validator_for(schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{text} breaks the schema: {errors:?}");
}

/// `logit_bias` -100 on every token that is only whitespace. JSON allows whitespace between any
/// two tokens (up to `tandem_structured::MAX_JSON_WHITESPACE` characters each), and a random
/// model, unlike a trained one, fills every gap and runs out of tokens; the constraint is what
/// is under test, not the model's taste.
pub(crate) fn no_whitespace() -> Value {
    static BIAS: OnceLock<Value> = OnceLock::new();
    BIAS.get_or_init(|| {
        let tok = Tokenizer::from_dir(tiny_dir()).unwrap();
        let mut bias = serde_json::Map::new();
        for id in 0..tok.vocab_size() as u32 {
            let t = tok.decode(&[id], false).unwrap_or_default();
            if !t.is_empty() && t.chars().all(char::is_whitespace) {
                bias.insert(id.to_string(), json!(-100));
            }
        }
        assert!(bias.len() >= 3, "the tiny tokenizer has whitespace tokens: {bias:?}");
        Value::Object(bias)
    })
    .clone()
}

const TEMPERATURES: [f64; 4] = [0.0, 0.7, 1.0, 1.5];
const SEEDS: [u64; 3] = [1, 2, 3];

fn chat(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "Describe a person."}], "max_tokens": 200, "logit_bias": no_whitespace()});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn completion(extra: Value) -> Value {
    let mut body = json!({"prompt": "A person:", "max_tokens": 200, "logit_bias": no_whitespace()});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Each choice's text and finish reason, asserting a 200.
async fn texts(addr: SocketAddr, path: &str, body: &Value) -> Vec<(String, String)> {
    let r = post(addr, path, body).await;
    assert_eq!(r.status, 200, "{body}: {}", r.text());
    let v = r.json();
    v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let text = if path.contains("chat") {
                c["message"]["content"].as_str().unwrap_or_default()
            } else {
                c["text"].as_str().unwrap()
            };
            (text.to_string(), c["finish_reason"].as_str().unwrap().to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_forms_validate_across_seeds_and_temperatures() {
    let t = start(tiny_dir(), true).await;
    let schema = person_schema();
    let forms = [
        (
            "/v1/chat/completions",
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": true}}}),
        ),
        (
            "/v1/completions",
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}}),
        ),
        ("/v1/completions", json!({"guided_json": schema})),
        ("/v1/chat/completions", json!({"guided_json": schema.to_string()})),
        ("/v1/chat/completions", json!({"structured_outputs": {"json": schema}})),
    ];
    for (path, form) in &forms {
        for &temperature in &TEMPERATURES {
            for &seed in &SEEDS {
                let mut extra = form.clone();
                extra["temperature"] = json!(temperature);
                extra["seed"] = json!(seed);
                let body = if path.contains("chat") { chat(extra) } else { completion(extra) };
                for (text, finish) in texts(t.addr, path, &body).await {
                    assert_eq!(finish, "stop", "{form} t={temperature} seed={seed}: {text:?}");
                    validate(&schema, &text);
                }
            }
        }
    }
    // Every constrained token computed a mask, and /metrics counts them.
    let text = common::get(t.addr, "/metrics").await.text();
    let series = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    let masks = series("tandem:structured_output_masks_total{");
    let generated = series("vllm:generation_tokens_total{");
    assert!(masks >= generated && generated > 0.0, "masks {masks}, generated tokens {generated}");
    assert!(series("tandem:structured_output_mask_seconds_total{") > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_any_whitespace_writes_compact_json() {
    let t = start(tiny_dir(), true).await;
    let schema = person_schema();
    for &temperature in &TEMPERATURES {
        for &seed in &SEEDS {
            // No logit bias here: the option alone keeps whitespace out.
            let body = json!({"prompt": "A person:", "max_tokens": 200, "temperature": temperature, "seed": seed, "structured_outputs": {"json": schema, "disable_any_whitespace": true}});
            for (text, finish) in texts(t.addr, "/v1/completions", &body).await {
                assert_eq!(finish, "stop", "t={temperature} seed={seed}: {text:?}");
                validate(&schema, &text);
                let outside_strings: String = text.split('"').step_by(2).collect();
                assert!(!outside_strings.contains(char::is_whitespace), "whitespace between tokens: {text:?}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_object_regex_choice_and_grammar_hold() {
    let t = start(tiny_dir(), true).await;
    let is_regex_match = |s: &str| {
        // (yes|no)-[0-9]{1,3}
        let Some((word, digits)) = s.split_once('-') else { return false };
        (word == "yes" || word == "no") && (1..=3).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit())
    };
    let is_tuple = |s: &str| {
        // "(" item ("," item)? ("," item)? ")" with item a, b or c
        let Some(inner) = s.strip_prefix('(').and_then(|s| s.strip_suffix(')')) else { return false };
        let items: Vec<&str> = inner.split(',').collect();
        (1..=3).contains(&items.len()) && items.iter().all(|i| ["a", "b", "c"].contains(i))
    };
    let grammar = "start: \"(\" item (\",\" item)? (\",\" item)? \")\"\nitem: \"a\" | \"b\" | \"c\"";
    let colors = ["red", "green", "blue"];
    let mut json_objects_done = 0;
    for &temperature in &TEMPERATURES {
        for &seed in &SEEDS {
            let s = json!({"temperature": temperature, "seed": seed, "max_tokens": 60});
            let with = |k: &str, v: Value| {
                let mut b = s.clone();
                b[k] = v;
                b
            };
            for (text, finish) in
                texts(t.addr, "/v1/completions", &completion(with("guided_regex", json!("(yes|no)-[0-9]{1,3}")))).await
            {
                assert!(finish == "stop" && is_regex_match(&text), "regex: {text:?} ({finish})");
            }
            for (text, finish) in texts(
                t.addr,
                "/v1/chat/completions",
                &chat(with("structured_outputs", json!({"regex": "(yes|no)-[0-9]{1,3}"}))),
            )
            .await
            {
                assert!(finish == "stop" && is_regex_match(&text), "structured_outputs.regex: {text:?} ({finish})");
            }
            for (text, finish) in
                texts(t.addr, "/v1/chat/completions", &chat(with("guided_choice", json!(colors)))).await
            {
                assert!(finish == "stop" && colors.contains(&text.as_str()), "choice: {text:?} ({finish})");
            }
            for (text, finish) in
                texts(t.addr, "/v1/completions", &completion(with("structured_outputs", json!({"choice": colors}))))
                    .await
            {
                assert!(
                    finish == "stop" && colors.contains(&text.as_str()),
                    "structured_outputs.choice: {text:?} ({finish})"
                );
            }
            for (text, finish) in
                texts(t.addr, "/v1/completions", &completion(with("guided_grammar", json!(grammar)))).await
            {
                assert!(finish == "stop" && is_tuple(&text), "grammar: {text:?} ({finish})");
            }
            for (text, finish) in
                texts(t.addr, "/v1/chat/completions", &chat(with("structured_outputs", json!({"grammar": grammar}))))
                    .await
            {
                assert!(finish == "stop" && is_tuple(&text), "structured_outputs.grammar: {text:?} ({finish})");
            }
            // Any object: keys and strings are unbounded, so a random model may run out of
            // tokens first; what it finished must be an object, and what it did not, the start
            // of one.
            for (form, path) in [
                (json!({"response_format": {"type": "json_object"}}), "/v1/chat/completions"),
                (json!({"structured_outputs": {"json_object": true}}), "/v1/completions"),
            ] {
                let mut b = s.clone();
                for (k, v) in form.as_object().unwrap() {
                    b[k] = v.clone();
                }
                let body = if path.contains("chat") { chat(b) } else { completion(b) };
                for (text, finish) in texts(t.addr, path, &body).await {
                    if finish == "stop" {
                        let v: Value = serde_json::from_str(&text)
                            .unwrap_or_else(|e| panic!("json_object: not JSON ({e}): {text:?}"));
                        assert!(v.is_object(), "json_object: {text:?}");
                        json_objects_done += 1;
                    } else {
                        assert_eq!(finish, "length");
                        assert!(text.trim_start().starts_with('{'), "json_object cut short: {text:?}");
                    }
                }
            }
        }
    }
    assert!(json_objects_done > 0, "no json_object answer finished in 60 tokens");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_and_n_choices_are_constrained_too() {
    let t = start(tiny_dir(), true).await;
    let schema = person_schema();
    let form = json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema}});
    for seed in SEEDS {
        let body = chat(json!({"response_format": form, "temperature": 1.0, "seed": seed, "n": 3}));
        let whole = texts(t.addr, "/v1/chat/completions", &body).await;
        assert_eq!(whole.len(), 3);
        for (text, finish) in &whole {
            assert_eq!(finish, "stop");
            validate(&schema, text);
        }
        let mut sbody = body.clone();
        sbody["stream"] = json!(true);
        let r = post(t.addr, "/v1/chat/completions", &sbody).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let mut streamed = vec![(String::new(), String::new()); 3];
        for ev in sse_json(&r.text()) {
            for c in ev["choices"].as_array().unwrap() {
                let i = c["index"].as_u64().unwrap() as usize;
                streamed[i].0.push_str(c["delta"]["content"].as_str().unwrap_or_default());
                if let Some(f) = c["finish_reason"].as_str() {
                    streamed[i].1 = f.to_string();
                }
            }
        }
        assert_eq!(streamed, whole, "seed {seed}: the stream carries the same constrained texts");
        // Completions, streamed, with n = 2 of a choice.
        let body = completion(
            json!({"guided_choice": ["left", "right", "up", "down"], "temperature": 1.5, "seed": seed, "n": 2, "stream": true}),
        );
        let r = post(t.addr, "/v1/completions", &body).await;
        let mut texts = [String::new(), String::new()];
        for ev in sse_json(&r.text()) {
            for c in ev["choices"].as_array().unwrap() {
                texts[c["index"].as_u64().unwrap() as usize].push_str(c["text"].as_str().unwrap());
            }
        }
        for text in &texts {
            assert!(["left", "right", "up", "down"].contains(&text.as_str()), "{text:?}");
        }
    }
    // n > 1 gives each completion its own constraint: with sampling, they are not all alike.
    let body = completion(json!({"guided_json": schema, "temperature": 1.5, "seed": 9, "n": 6}));
    let got = texts(t.addr, "/v1/completions", &body).await;
    for (text, _) in &got {
        validate(&schema, text);
    }
    assert!(got.iter().any(|(x, _)| *x != got[0].0), "six sampled completions all equal: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_specs_are_400s_naming_their_field() {
    let t = start(tiny_dir(), true).await;
    let cases = [
        (json!({"guided_regex": "(unclosed"}), "guided_regex", "invalid regex"),
        (json!({"guided_json": {"type": "nonsense"}}), "guided_json", "invalid json_schema"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 3}}}}),
            "response_format.json_schema.schema",
            "invalid json_schema",
        ),
        (json!({"guided_grammar": "start: missing_rule"}), "guided_grammar", "invalid grammar"),
        (json!({"structured_outputs": {"grammar": "start: ("}}), "structured_outputs.grammar", "invalid grammar"),
        (json!({"guided_choice": []}), "guided_choice", "empty"),
        (json!({"guided_json": "{"}), "guided_json", "not JSON"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}),
            "response_format.json_schema.name",
            "required",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format.json_schema.schema",
            "required",
        ),
        (json!({"guided_regex": "a", "guided_choice": ["a"]}), "guided_choice", "one structured-output form"),
    ];
    for (form, field, msg) in cases {
        for path in ["/v1/completions", "/v1/chat/completions"] {
            let body = if path.contains("chat") { chat(form.clone()) } else { completion(form.clone()) };
            let r = post(t.addr, path, &body).await;
            assert_eq!(r.status, 400, "{path} {form}: {}", r.text());
            let e = &r.json()["error"];
            assert_eq!(e["param"], field, "{path} {form}: {e}");
            assert!(e["message"].as_str().unwrap().contains(msg), "{path} {form}: {e}");
        }
    }
    // The server still serves after the refusals.
    let ok = texts(t.addr, "/v1/completions", &completion(json!({"guided_choice": ["x"]}))).await;
    assert_eq!(ok, vec![("x".to_string(), "stop".to_string())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_compiler_says_so() {
    let t = start(tiny_dir(), false).await;
    let r = post(t.addr, "/v1/chat/completions", &chat(json!({"response_format": {"type": "json_object"}}))).await;
    assert_eq!(r.status, 400);
    let e = &r.json()["error"];
    assert_eq!(e["param"], "response_format");
    assert!(e["message"].as_str().unwrap().contains("not available"), "{e}");
    let ok =
        texts(t.addr, "/v1/chat/completions", &chat(json!({"response_format": {"type": "text"}, "max_tokens": 4})))
            .await;
    assert_eq!(ok.len(), 1, "text needs no compiler");
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"], "additionalProperties": false}}}
    ])
}

fn tool_schema(tools: &Value, name: &str) -> Value {
    tools.as_array().unwrap().iter().find(|t| t["function"]["name"] == name).unwrap_or_else(|| panic!("no tool {name}"))
        ["function"]["parameters"]
        .clone()
}

/// Checks a message's tool calls against the declared tools; returns (name, arguments).
fn check_calls(tools: &Value, calls: &Value) -> Vec<(String, String)> {
    let calls = calls.as_array().unwrap_or_else(|| panic!("no tool_calls: {calls}"));
    assert!(!calls.is_empty());
    calls
        .iter()
        .map(|c| {
            assert!(c["id"].as_str().unwrap().starts_with("call_"), "{c}");
            assert_eq!(c["type"], "function");
            let name = c["function"]["name"].as_str().unwrap().to_string();
            let args = c["function"]["arguments"]
                .as_str()
                .unwrap_or_else(|| panic!("arguments are a JSON string: {c}"))
                .to_string();
            validate(&tool_schema(tools, &name), &args);
            (name, args)
        })
        .collect()
}

/// Calls' (name, arguments) with the arguments parsed, to compare texts that differ in spacing.
pub(crate) fn same_json(calls: Vec<(String, String)>) -> Vec<(String, Value)> {
    calls.into_iter().map(|(n, a)| (n, serde_json::from_str(&a).unwrap_or_else(|e| panic!("{e}: {a}")))).collect()
}

/// The tool calls of choice 0 of a streamed chat answer, put together as a client does, with
/// the number of chunks that carried pieces of arguments and the finish reason. Checks
/// OpenAI's shape: a call's first chunk alone has its id, type and name, with empty
/// arguments; later ones only its index and pieces; no content beside calls.
pub(crate) fn streamed_calls(events: &[Value]) -> (Vec<Value>, usize, Option<String>) {
    let mut calls: Vec<Value> = Vec::new();
    let mut pieces = 0;
    let mut finish = None;
    for ev in events {
        for ch in ev["choices"].as_array().unwrap().iter().filter(|c| c["index"] == 0) {
            assert!(
                ch["delta"].get("content").is_none_or(|c| c == "" || c.is_null()),
                "no content beside the calls: {ch}"
            );
            for call in ch["delta"].get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                let k = call["index"].as_u64().unwrap() as usize;
                if call.get("id").is_some() {
                    assert_eq!(k, calls.len(), "calls start in order: {call}");
                    assert_eq!(
                        (call["type"].as_str(), call["function"]["arguments"].as_str()),
                        (Some("function"), Some("")),
                        "a call's first chunk: {call}"
                    );
                    assert!(call["function"]["name"].is_string(), "{call}");
                    calls.push(call.clone());
                } else {
                    assert!(
                        call.get("type").is_none() && call["function"].get("name").is_none(),
                        "later chunks carry arguments only: {call}"
                    );
                    let piece = call["function"]["arguments"].as_str().unwrap();
                    let args = format!("{}{piece}", calls[k]["function"]["arguments"].as_str().unwrap());
                    calls[k]["function"]["arguments"] = json!(args);
                    pieces += 1;
                }
            }
            finish = ch["finish_reason"].as_str().map(String::from).or(finish);
        }
    }
    (calls, pieces, finish)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_choice_required_and_named_give_valid_calls() {
    let t = start(tiny_dir(), true).await;
    let tools = weather_tools();
    for &temperature in &TEMPERATURES {
        for &seed in &SEEDS {
            let body = chat(
                json!({"tools": tools, "tool_choice": "required", "temperature": temperature, "seed": seed, "max_tokens": 300}),
            );
            let r = post(t.addr, "/v1/chat/completions", &body).await;
            assert_eq!(r.status, 200, "{}", r.text());
            let c = &r.json()["choices"][0];
            assert_eq!(c["finish_reason"], "tool_calls", "{c}");
            assert_eq!(c["message"]["content"], Value::Null, "{c}");
            let whole = check_calls(&tools, &c["message"]["tool_calls"]);

            // Streamed: each call's arguments as they are sampled, in OpenAI's chunk shape.
            let mut sbody = body.clone();
            sbody["stream"] = json!(true);
            let r = post(t.addr, "/v1/chat/completions", &sbody).await;
            let (calls, pieces, finish) = streamed_calls(&sse_json(&r.text()));
            assert_eq!(finish.as_deref(), Some("tool_calls"));
            assert!(pieces > calls.len(), "arguments come in several chunks: {pieces} for {} calls", calls.len());
            assert_eq!(
                same_json(check_calls(&tools, &Value::Array(calls))),
                same_json(whole),
                "t={temperature} seed={seed}: streamed calls equal the whole answer's"
            );

            let body = chat(
                json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_time"}}, "temperature": temperature, "seed": seed, "n": 2}),
            );
            let r = post(t.addr, "/v1/chat/completions", &body).await;
            assert_eq!(r.status, 200, "{}", r.text());
            for c in r.json()["choices"].as_array().unwrap() {
                // vLLM's (and OpenAI's) finish for a forced function: the engine's own.
                assert_eq!(c["finish_reason"], "stop", "{c}");
                let calls = check_calls(&tools, &c["message"]["tool_calls"]);
                assert_eq!(calls.len(), 1);
                assert_eq!(calls[0].0, "get_time");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_reach_the_template_and_auto_parses_tool_call_blocks() {
    let t = start(tool_dir(), true).await;
    let tools = weather_tools();
    let tokenize = |body: Value| async move {
        let r = post(t.addr, "/tokenize", &body).await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["count"].as_u64().unwrap()
    };
    let msgs = json!([{"role": "user", "content": "Weather?"}]);
    let bare = tokenize(json!({"messages": msgs})).await;
    let with_tools = tokenize(json!({"messages": msgs, "tools": tools})).await;
    assert!(with_tools > bare, "the template renders the tools: {with_tools} vs {bare} tokens");

    // "none": tools rendered, text unparsed, even a text that holds a call.
    let call_rx =
        r#"<tool_call>\{"name": "get_weather", "arguments": \{"city": "(Paris|Oslo)", "days": [1-7]\}\}</tool_call>"#;
    let body =
        json!({"messages": msgs, "tools": tools, "tool_choice": "none", "guided_regex": call_rx, "max_tokens": 200});
    let r = post(t.addr, "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let c = &r.json()["choices"][0];
    assert_eq!(r.json()["usage"]["prompt_tokens"], with_tools, "chat renders tools as /tokenize does");
    assert!(
        c["message"].get("tool_calls").is_none()
            && c["message"]["content"].as_str().unwrap().starts_with("<tool_call>"),
        "{c}"
    );
    assert_eq!(c["finish_reason"], "stop");

    // "auto" (the default with tools): the template writes <tool_call>, so blocks are parsed.
    // The regex makes the tiny model write one; the parse is what is under test.
    for stream in [false, true] {
        let body = json!({"messages": msgs, "tools": tools, "guided_regex": call_rx, "max_tokens": 200, "stream": stream, "seed": 4, "temperature": 1.0});
        let r = post(t.addr, "/v1/chat/completions", &body).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let (calls, finish) = if stream {
            // The call's arguments stream from the `<tool_call>` on, in pieces.
            let (calls, pieces, finish) = streamed_calls(&sse_json(&r.text()));
            assert!(pieces > 1, "{pieces} argument chunks");
            (Value::Array(calls), finish.unwrap())
        } else {
            let c = r.json()["choices"][0].clone();
            assert_eq!(c["message"]["content"], Value::Null, "{c}");
            (c["message"]["tool_calls"].clone(), c["finish_reason"].as_str().unwrap().to_string())
        };
        assert_eq!(finish, "tool_calls");
        let calls = check_calls(&tools, &calls);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].0, "get_weather");
    }
    // "auto" on free text: plain content, the engine's finish.
    let r =
        post(t.addr, "/v1/chat/completions", &json!({"messages": msgs, "tools": tools, "max_tokens": 8, "seed": 1}))
            .await;
    let c = &r.json()["choices"][0];
    assert!(c["message"]["content"].is_string() && c["message"].get("tool_calls").is_none(), "{c}");

    // A conversation with a call and its result renders through the template.
    let convo = json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    ]);
    let r = post(t.addr, "/tokenize", &json!({"messages": convo, "tools": tools, "return_token_strs": true})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let ids: Vec<u32> = r.json()["tokens"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let tok = Tokenizer::from_dir(tool_dir()).unwrap();
    let rendered = tok.decode(&ids, false).unwrap();
    assert!(
        rendered.contains("<tool_call>get_weather:Oslo</tool_call>"),
        "the call's arguments reach the template as a mapping: {rendered}"
    );
    assert!(rendered.contains("<|im_start|>tool\nsunny<|im_end|>"), "{rendered}");
    let r = post(t.addr, "/v1/chat/completions", &json!({"messages": convo, "tools": tools, "max_tokens": 4})).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tool_requests_are_400s() {
    let t = start(tiny_dir(), true).await;
    let tools = weather_tools();
    let bad_schema = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "nonsense"}}}}}]);
    let cases = [
        (
            json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_stock"}}}),
            "tool_choice.function.name",
            "not among the tools",
        ),
        (json!({"tool_choice": "required"}), "tool_choice", "needs `tools`"),
        (json!({"tools": bad_schema, "tool_choice": "required"}), "tools", "invalid json_schema"),
        (
            json!({"tools": bad_schema, "tool_choice": {"type": "function", "function": {"name": "f"}}}),
            "tools[0].function.parameters",
            "invalid json_schema",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"parameters": {}}}]}),
            "tools[0].function.name",
            "required",
        ),
        (
            json!({"tools": tools, "tool_choice": "required", "guided_regex": "a"}),
            "guided_regex",
            "constrains the answer already",
        ),
    ];
    for (extra, field, msg) in cases {
        let r = post(t.addr, "/v1/chat/completions", &chat(extra.clone())).await;
        assert_eq!(r.status, 400, "{extra}: {}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["param"], field, "{extra}: {e}");
        assert!(e["message"].as_str().unwrap().contains(msg), "{extra}: {e}");
    }
    let r = post(t.addr, "/v1/completions", &completion(json!({"tools": tools}))).await;
    assert_eq!(
        (r.status.as_u16(), r.json()["error"]["param"].clone()),
        (400, json!("tools")),
        "tools are a chat field"
    );
}

/// The converted SmolLM2-135M-Instruct: `$TANDEM_SMOLLM2_DIR`, else `models/SmolLM2-135M-Instruct`;
/// absent, the test says so (counted) unless `TANDEM_REQUIRE_MODEL` makes that a failure.
fn smollm2_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("TANDEM_SMOLLM2_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct"));
    if dir.join("config.json").exists() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("TANDEM_REQUIRE_MODEL").is_none(),
        "TANDEM_REQUIRE_MODEL is set but {} holds no model",
        dir.display()
    );
    tandem_core::skip::note(format!(
        "structured output on SmolLM2: no model at {} (run `cargo xtask fetch-model`)",
        dir.display()
    ));
    None
}

/// The real model's 49,152-token tokenizer goes through llguidance, and a trained model under
/// the constraint writes valid JSON and calls (greedy, reference backend; no logit bias).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_writes_valid_json_and_tool_calls() {
    let Some(dir) = smollm2_dir() else { return };
    let t = start(&dir, true).await;
    let schema = person_schema();
    let ask = |content: &str, extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 80});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let got = texts(
        t.addr,
        "/v1/chat/completions",
        &ask(
            "Describe a person as JSON.",
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}}),
        ),
    )
    .await;
    assert_eq!(got[0].1, "stop", "{got:?}");
    validate(&schema, &got[0].0);
    let got = texts(
        t.addr,
        "/v1/chat/completions",
        &ask("What is the capital of France?", json!({"guided_choice": ["Paris", "London", "Berlin"]})),
    )
    .await;
    assert!(["Paris", "London", "Berlin"].contains(&got[0].0.as_str()) && got[0].1 == "stop", "{got:?}");
    let tools = weather_tools();
    let r = post(
        t.addr,
        "/v1/chat/completions",
        &ask("What is the weather in Paris this week?", json!({"tools": tools, "tool_choice": "required"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let c = &r.json()["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{c}");
    check_calls(&tools, &c["message"]["tool_calls"]);
}

/// An unconstrained request gives the same text alone and beside constrained ones (greedy and
/// seeded): the masks touch only their own rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_neighbours_leave_other_requests_alone() {
    let t = start(tiny_dir(), true).await;
    let plain = [
        json!({"prompt": "The cat sat", "max_tokens": 32, "temperature": 0}),
        json!({"prompt": "Once upon", "max_tokens": 32, "temperature": 1.0, "seed": 7}),
    ];
    let mut solo = Vec::new();
    for body in &plain {
        solo.push(texts(t.addr, "/v1/completions", body).await);
    }
    let guided = completion(json!({"guided_json": person_schema(), "temperature": 1.0, "seed": 3, "n": 4}));
    for round in 0..3 {
        let tool_call =
            chat(json!({"tools": weather_tools(), "tool_choice": "required", "temperature": 0.7, "seed": round}));
        let (a, b, g1, g2) = tokio::join!(
            texts(t.addr, "/v1/completions", &plain[0]),
            texts(t.addr, "/v1/completions", &plain[1]),
            texts(t.addr, "/v1/completions", &guided),
            texts(t.addr, "/v1/chat/completions", &tool_call)
        );
        assert_eq!(
            (&a, &b),
            (&solo[0], &solo[1]),
            "round {round}: the unconstrained texts changed beside constrained requests"
        );
        for (text, _) in g1 {
            validate(&person_schema(), &text);
        }
        assert_eq!(g2.len(), 1);
    }
}

/// Issue 28: xgrammar's strictness, vLLM's default: a schema that lists properties and says
/// nothing of others gets no others; `structured_outputs.disable_additional_properties: false`
/// asks for the schema as written. A bias towards `,` makes the model want another key
/// wherever one may go: as written it adds one, strict it cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlisted_properties_are_not_generated() {
    let t = start(tiny_dir(), true).await;
    let tok = Tokenizer::from_dir(tiny_dir()).unwrap();
    let mut bias = no_whitespace();
    let comma: Vec<u32> =
        (0..tok.vocab_size() as u32).filter(|&id| tok.decode(&[id], false).is_ok_and(|t| t == ",")).collect();
    assert!(!comma.is_empty());
    for id in comma {
        bias[id.to_string()] = json!(8);
    }
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer", "maximum": 99}}, "required": ["a"]});
    let (mut strict_whole, mut loose_extra) = (0, 0);
    for seed in 1..=3u64 {
        for (so, strict) in
            [(json!({"json": schema}), true), (json!({"json": schema, "disable_additional_properties": false}), false)]
        {
            let body = completion(
                json!({"structured_outputs": so, "n": 4, "seed": seed, "temperature": 1.0, "max_tokens": 40, "logit_bias": bias}),
            );
            for (text, finish) in texts(t.addr, "/v1/completions", &body).await {
                if strict {
                    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?} ({finish})"));
                    assert_eq!(v.as_object().unwrap().keys().collect::<Vec<_>>(), ["a"], "{text}");
                    strict_whole += 1;
                } else if text.contains(',') {
                    loose_extra += 1;
                }
            }
        }
    }
    assert_eq!(strict_whole, 12);
    assert!(loose_extra > 0, "as written, the schema lets the model add keys (else this test shows nothing)");
}

/// Issue 28: vLLM's grammar syntax (GBNF, what xgrammar takes) beside Lark:
/// `root ::= "yes" | "no"`, classes, repeats and rule references hold; a broken one is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gbnf_grammars_hold() {
    let t = start(tiny_dir(), true).await;
    let yes_no = "root ::= \"yes\" | \"no\"";
    let code = "root ::= \"id-\" digit{2,4} tail # a comment\ndigit ::= [0-9]\ntail ::= (\"!\" | [?.])";
    let code_ok = |t: &str| {
        t.strip_prefix("id-").is_some_and(|r| {
            r.len() >= 3
                && r.len() <= 5
                && r[..r.len() - 1].bytes().all(|b| b.is_ascii_digit())
                && r.ends_with(['!', '?', '.'])
        })
    };
    for seed in 1..=3u64 {
        for (field, g) in [("structured_outputs", json!({"grammar": yes_no})), ("guided_grammar", json!(yes_no))] {
            for (text, finish) in texts(
                t.addr,
                "/v1/completions",
                &completion(json!({field: g, "n": 3, "seed": seed, "temperature": 1.0})),
            )
            .await
            {
                assert!(text == "yes" || text == "no", "{text:?}");
                assert_eq!(finish, "stop");
            }
        }
        for (text, finish) in texts(
            t.addr,
            "/v1/chat/completions",
            &chat(json!({"structured_outputs": {"grammar": code}, "n": 3, "seed": seed, "temperature": 1.0})),
        )
        .await
        {
            assert!(code_ok(&text), "{text:?}");
            assert_eq!(finish, "stop");
        }
    }
    let r =
        post(t.addr, "/v1/completions", &completion(json!({"structured_outputs": {"grammar": "root ::= item"}}))).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "structured_outputs.grammar");
    assert!(
        r.json()["error"]["message"].as_str().unwrap().contains("GBNF: rule `item` is used but not defined"),
        "{}",
        r.text()
    );
}

/// Issue 28: as vLLM (xgrammar), a completion whose grammar completed samples the EOS token the
/// grammar then forces, and counts it: usage has one token more than the text, the last
/// logprob entry is EOS, the text and `stop_reason` do not show it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_grammar_counts_the_eos_it_forces() {
    let t = start(tiny_dir(), true).await;
    let cfg: Value = serde_json::from_str(&std::fs::read_to_string(tiny_dir().join("config.json")).unwrap()).unwrap();
    let eos = cfg["eos_token_id"].as_u64().unwrap() as u32;
    let eos_text = Tokenizer::from_dir(tiny_dir()).unwrap().decode(&[eos], false).unwrap();
    for seed in 1..=3u64 {
        let body = completion(json!({"guided_choice": ["yes", "no"], "seed": seed, "temperature": 1.0, "logprobs": 0}));
        let v = post(t.addr, "/v1/completions", &body).await.json();
        let c = &v["choices"][0];
        assert!(c["text"] == "yes" || c["text"] == "no", "{v}");
        assert_eq!((c["finish_reason"].as_str(), c["stop_reason"].is_null()), (Some("stop"), true), "{v}");
        let tokens = c["logprobs"]["tokens"].as_array().unwrap();
        assert_eq!(tokens.last().and_then(Value::as_str), Some(eos_text.as_str()), "{v}");
        assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(tokens.len() as u64), "{v}");
        let text: String = tokens[..tokens.len() - 1].iter().map(|t| t.as_str().unwrap()).collect();
        assert_eq!(text, c["text"].as_str().unwrap());
    }
}
