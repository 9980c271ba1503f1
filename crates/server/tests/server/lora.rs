//! LoRA adapters through the server: a request's `model` names the adapter on every generation
//! API, each answer is the greedy answer of its adapter alone, an unknown model is vLLM's 404,
//! `/v1/models` lists each adapter with `parent` and `root` as vLLM does.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use serde_json::json;
use tandem_core::lora::{LoraAdapter, LoraLimits};
use tandem_core::model::LoadOptions;
use tandem_core::tokenizer::Tokenizer;
use tandem_core::{DType, Model, ModelConfig};
use tandem_engine::{Engine, EngineConfig};
use tandem_model_files::random_model::{write_random_model, Shape};
use tandem_reference::RefBackend;
use tandem_server::engine_adapter::{decode_fn, TandemEngine};
use tandem_server::lora::ServedAdapter;
use tandem_server::ServerConfig;

const VOCAB_TINY: usize = 384;

fn adapter_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/lora").join(name)
}

/// The tiny random model with `tiny-all` in slot 0 and `tiny-rs` in slot 1.
fn lora_model(dir: &Path) -> Model<RefBackend> {
    let opts =
        LoadOptions { max_batch_tokens: 64, max_seqs: 8, num_kv_blocks: 32, block_size: 16, ..Default::default() };
    let mut m = Model::load_with_lora(RefBackend::new(), dir, opts, LoraLimits { max_loras: 2, max_rank: 8 }).unwrap();
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    m.load_lora(0, &LoraAdapter::load(&adapter_dir("tiny-all"), &cfg).unwrap()).unwrap();
    m.load_lora(1, &LoraAdapter::load(&adapter_dir("tiny-rs"), &cfg).unwrap()).unwrap();
    m
}

struct LoraServer {
    server: TestServer,
    dir: PathBuf,
    tok: Arc<Tokenizer>,
}

impl Drop for LoraServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A server over the tiny model with adapters `a` (slot 0) and `b` (slot 1, `base_model_name`
/// "m").
async fn lora_server(test: &str) -> LoraServer {
    lora_server_with(test, false).await
}

/// [`lora_server`], run-time loading routed where `runtime` (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`).
async fn lora_server_with(test: &str, runtime: bool) -> LoraServer {
    let dir = std::env::temp_dir().join(format!("tandem-server-lora-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_random_model(&dir, Shape::Tiny, 5, DType::F32).unwrap();
    let tok_dir = dir.join("tok");
    tandem_server::test_support::write_tiny_tokenizer(&tok_dir, VOCAB_TINY).unwrap();
    let tok = Arc::new(Tokenizer::from_dir(&tok_dir).unwrap());
    let handle = Engine::spawn(Box::new(lora_model(&dir)), decode_fn(tok.clone()), EngineConfig::default()).unwrap();
    let served = |name: &str, slot, parent: Option<&str>| ServedAdapter {
        name: name.into(),
        root: adapter_dir(if slot == 0 { "tiny-all" } else { "tiny-rs" }).to_string_lossy().into_owned(),
        parent: parent.map(String::from),
        slot,
    };
    let config = ServerConfig {
        addr: ([127, 0, 0, 1], 0).into(),
        max_model_len: handle.max_model_len(),
        vocab_size: VOCAB_TINY,
        lora_adapters: vec![served("a", 0, None), served("b", 1, Some("m"))],
        max_loras: 2,
        runtime_lora_updating: runtime,
        ..Default::default()
    };
    let mut server = TestServer::with_client(config, TandemEngine::ready(handle.clone()), tok.clone()).await;
    server.engine = Some(handle);
    LoraServer { server, dir, tok }
}

/// Greedy ids of `prompt` under `adapter` with the model alone (no engine, no server).
fn oracle(dir: &Path, adapter: Option<u32>, prompt: &[u32], steps: usize) -> Vec<u32> {
    let mut m = lora_model(dir);
    let s = tandem_core::greedy::generate_with(&mut m, adapter, prompt, steps, &[], false, |_| {}).unwrap();
    s.iter().map(|s| s.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_field_names_the_adapter_and_each_answer_is_its_own() {
    let s = lora_server("answers").await;
    let prompt = [7u32, 8, 9, 250, 31];
    let steps = 6;
    let body = |model: &str| json!({"model": model, "prompt": prompt, "max_tokens": steps, "temperature": 0, "ignore_eos": true});
    // All three at once: they share steps.
    let bodies = [body(MODEL), body("a"), body("b")];
    let (base, a, b) = tokio::join!(
        post(s.server.addr, "/v1/completions", &bodies[0]),
        post(s.server.addr, "/v1/completions", &bodies[1]),
        post(s.server.addr, "/v1/completions", &bodies[2]),
    );
    let mut texts = Vec::new();
    for (r, model, adapter) in [(base, MODEL, None), (a, "a", Some(0)), (b, "b", Some(1))] {
        assert_eq!(r.status, 200, "{model}: {}", r.text());
        let v = r.json();
        assert_eq!(v["model"], json!(model), "{v}");
        let want = s.tok.decode(&oracle(&s.dir, adapter, &prompt, steps), true).unwrap();
        // The answer continues the prompt: its text starts with the space before its first word.
        assert_eq!(v["choices"][0]["text"].as_str().unwrap().trim_start(), want, "{model}");
        texts.push(want);
    }
    assert!(texts[0] != texts[1] && texts[0] != texts[2], "the adapters change the answer: {texts:?}");
    // Chat, Responses and Anthropic's Messages take the adapter's name too.
    let msgs = json!([{"role": "user", "content": "hello the cat"}]);
    let chat =
        post(s.server.addr, "/v1/chat/completions", &json!({"model": "a", "messages": msgs, "max_tokens": 2})).await;
    assert_eq!(chat.status, 200, "{}", chat.text());
    assert_eq!(chat.json()["model"], json!("a"));
    let resp =
        post(s.server.addr, "/v1/responses", &json!({"model": "b", "input": "hello", "max_output_tokens": 2})).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["model"], json!("b"));
    let msg = json!({"model": "a", "messages": msgs, "max_tokens": 2});
    let m = post(s.server.addr, "/v1/messages", &msg).await;
    assert_eq!(m.status, 200, "{}", m.text());
    assert_eq!(m.json()["model"], json!("a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_model_is_vllms_404_and_models_lists_the_adapters() {
    let s = lora_server("models").await;
    for path in ["/v1/completions", "/v1/chat/completions"] {
        let body = json!({"model": "x", "prompt": "hello", "messages": [{"role": "user", "content": "hi"}]});
        let r = post(s.server.addr, path, &body).await;
        assert_eq!(r.status, 404, "{path}: {}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["type"], json!("NotFoundError"), "{e}");
        assert!(e["message"].as_str().unwrap().starts_with("The model `x` does not exist"), "{e}");
    }
    let v = get(s.server.addr, "/v1/models").await.json();
    let data = v["data"].as_array().unwrap();
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [MODEL, "a", "b"], "{v}");
    assert_eq!(data[0]["parent"], json!(null));
    assert_eq!(data[1]["parent"], json!(MODEL));
    assert_eq!(data[1]["root"], json!(adapter_dir("tiny-all").to_string_lossy()));
    assert_eq!(data[2]["parent"], json!("m"));
    let one = get(s.server.addr, "/v1/models/b").await;
    assert_eq!(one.status, 200, "{}", one.text());
    assert_eq!(one.json()["root"], json!(adapter_dir("tiny-rs").to_string_lossy()));
    assert_eq!(get(s.server.addr, "/v1/models/x").await.status, 404);
    // Idle: the series is there, naming no adapter.
    let m = get(s.server.addr, "/metrics").await.text();
    let idle = "vllm:lora_requests_info{max_lora=\"2\",waiting_lora_adapters=\"\",running_lora_adapters=\"\"}";
    assert!(m.lines().any(|l| l.starts_with(idle)), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_load_and_unload_at_run_time_as_vllm_answers() {
    let off = lora_server_with("runtime-off", false).await;
    let body = json!({"lora_name": "c", "lora_path": adapter_dir("tiny-rs")});
    assert_eq!(
        post(off.server.addr, "/v1/load_lora_adapter", &body).await.status,
        404,
        "not routed without the switch"
    );
    drop(off);

    let s = lora_server_with("runtime", true).await;
    let addr = s.server.addr;
    let load = |name: &str, path: PathBuf| json!({"lora_name": name, "lora_path": path});
    let error = |r: &Reply| r.json()["error"]["message"].as_str().unwrap_or_default().to_string();
    let r = post(addr, "/v1/load_lora_adapter", &load("a", adapter_dir("tiny-rs"))).await;
    assert_eq!((r.status.as_u16(), error(&r)), (400, "The lora adapter 'a' has already been loaded.".into()));
    let r = post(addr, "/v1/load_lora_adapter", &json!({"lora_name": "c"})).await;
    assert_eq!((r.status.as_u16(), error(&r)), (400, "Both 'lora_name' and 'lora_path' must be provided.".into()));
    let r = post(addr, "/v1/load_lora_adapter", &load("c", s.dir.join("nowhere"))).await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(error(&r).contains("No adapter found for"), "{}", r.text());
    // Both slots hold an adapter.
    let r = post(addr, "/v1/load_lora_adapter", &load("c", adapter_dir("tiny-rs"))).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(error(&r).contains("every LoRA slot holds an adapter"), "{}", r.text());

    let r = post(addr, "/v1/unload_lora_adapter", &json!({"lora_name": "a"})).await;
    assert_eq!((r.status.as_u16(), r.text()), (200, "Success: LoRA adapter 'a' removed successfully.".into()));
    let gen = |model: &str| json!({"model": model, "prompt": [7, 8, 9, 250, 31], "max_tokens": 5, "temperature": 0, "ignore_eos": true});
    assert_eq!(post(addr, "/v1/completions", &gen("a")).await.status, 404, "the name is gone at once");
    let r = post(addr, "/v1/unload_lora_adapter", &json!({"lora_name": "a"})).await;
    assert_eq!((r.status.as_u16(), error(&r)), (404, "The lora adapter 'a' cannot be found.".into()));

    // tiny-rs again under a new name, in the slot "a" left: answers as tiny-rs alone.
    let r = post(addr, "/v1/load_lora_adapter", &load("c", adapter_dir("tiny-rs"))).await;
    assert_eq!((r.status.as_u16(), r.text()), (200, "Success: LoRA adapter 'c' added successfully.".into()));
    let models = get(addr, "/v1/models").await.json();
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(ids, vec![MODEL, "b", "c"], "{models}");
    let want = s.tok.decode(&oracle(&s.dir, Some(1), &[7, 8, 9, 250, 31], 5), true).unwrap();
    for model in ["c", "b"] {
        let r = post(addr, "/v1/completions", &gen(model)).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["choices"][0]["text"].as_str().unwrap().trim_start(), want, "{model}");
    }
    assert_eq!(post(addr, "/v1/completions", &gen(MODEL)).await.status, 200, "the server still serves");
}
