//! The real server and engine over the tiny random model (2 layers, a 384-token byte-level
//! BPE tokenizer, reference backend) with structured output on: for trying clients' JSON-schema
//! and tool-call helpers without a real model. Its text is random; its structure is not.
//! It is the golden `tiny` model (seed 1), and serves tests/golden/lora's `tiny-all` as LoRA
//! adapter `a` and `tiny-rs` as `b` over one slot (`b` waits off the device until asked for),
//! so a client can check an adapter's answer against HF + peft's golden ids.
//!
//! Run: `cargo run -p tandem-server --example tiny_server -- [addr]`, e.g.
//! `cargo run -p tandem-server --example tiny_server -- 127.0.0.1:8124`. The model is written
//! to a temp dir at start-up (well under a second). Stops on Ctrl-C or SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use tandem_core::lora::{LoraAdapter, LoraLimits};
use tandem_core::model::{LoadOptions, Model};
use tandem_core::tokenizer::Tokenizer;
use tandem_core::ModelConfig;
use tandem_engine::{Engine, EngineConfig};
use tandem_server::engine_adapter::{decode_fn, TandemEngine};
use tandem_server::lora::ServedAdapter;
use tandem_server::{shutdown_signal, Server, ServerConfig};
use tandem_structured::Structured;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let args: Vec<String> = std::env::args().collect();
    let addr = args.get(1).map_or("127.0.0.1:8124", String::as_str).parse()?;
    let dir = std::env::temp_dir().join(format!("tandem-tiny-server-{}", std::process::id()));
    tandem_model_files::random_model::write_random_model(
        &dir,
        tandem_model_files::random_model::Shape::Tiny,
        1,
        tandem_core::DType::F32,
    )?;
    let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
    let mut tok = Tokenizer::from_dir(&dir)?;
    tok.add_eos_ids(&cfg.eos_token_ids);
    let tok = Arc::new(tok);
    let opts = LoadOptions { max_seqs: 16, max_batch_tokens: 512, num_kv_blocks: 256, ..LoadOptions::default() };
    let lora = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/lora");
    let (all, rs) = (lora.join("tiny-all"), lora.join("tiny-rs"));
    let limits = LoraLimits { max_loras: 1, max_rank: 8 };
    let mut model = Model::load_with_lora(tandem_reference::RefBackend::new(), &dir, opts, limits)?;
    model.load_lora(0, &LoraAdapter::load(&all, &cfg)?)?;
    let engine_cfg = EngineConfig { lora_modules: vec![all.clone(), rs.clone()], ..EngineConfig::default() };
    let handle = Engine::spawn(Box::new(model), decode_fn(tok.clone()), engine_cfg)?;
    let adapter = |name: &str, dir: &std::path::Path, slot| ServedAdapter {
        name: name.into(),
        root: dir.to_string_lossy().into_owned(),
        parent: None,
        slot,
    };
    let config = ServerConfig {
        addr,
        max_model_len: handle.max_model_len(),
        vocab_size: cfg.vocab_size,
        shutdown_grace: Duration::from_secs(5),
        lora_adapters: vec![adapter("a", &all, 0), adapter("b", &rs, 1)],
        max_loras: limits.max_loras,
        ..Default::default()
    };
    let server = Server::bind(config, TandemEngine::ready(handle.clone()), tok.clone(), "tiny".into()).await?;
    server.set_structured(Structured::from_model_dir(&dir, &tok.eos_ids).map(Arc::new).map_err(|e| e.to_string()));
    println!("serving model `tiny` on http://{}", server.local_addr()?);
    server.run(shutdown_signal()).await?;
    handle.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
