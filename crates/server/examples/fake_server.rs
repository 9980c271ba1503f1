//! The real server and engine over the engine crate's deterministic `FakeModel` and the tiny
//! test tokenizer: for trying clients (curl, the `openai` Python package) without a model.
//!
//! Run: `cargo run -p tandem-server --example fake_server -- [addr] [ms per step]`, e.g.
//! `cargo run -p tandem-server --example fake_server -- 127.0.0.1:8123 2`. Stops on Ctrl-C or
//! SIGTERM (gracefully). `RUST_LOG=info` shows one line per request. The context is 512 tokens;
//! `TANDEM_FAKE_MAX_MODEL_LEN=131072` gives room for an agent's prompt (Claude Code sends
//! tens of thousands of tokens of system prompt and tools).

use std::sync::Arc;
use std::time::Duration;

use tandem_core::tokenizer::Tokenizer;
use tandem_engine::fake_model::{fake_config, FakeModel};
use tandem_engine::{Engine, EngineConfig};
use tandem_server::engine_adapter::{decode_fn, TandemEngine};
use tandem_server::{serve, shutdown_signal, ServerConfig};

const VOCAB: usize = 64;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let args: Vec<String> = std::env::args().collect();
    let addr = args.get(1).map_or("127.0.0.1:8123", String::as_str).parse().expect("address like 127.0.0.1:8123");
    let delay = Duration::from_millis(args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0));
    let dir = std::env::temp_dir().join(format!("tandem-fake-server-{}", std::process::id()));
    tandem_server::test_support::write_tiny_tokenizer(&dir, VOCAB)?;
    let tok = Arc::new(Tokenizer::from_dir(&dir).expect("the tiny tokenizer loads"));
    // EOS "</s>" (id 2) is a real stop here, so answers end on their own sometimes.
    let max_len: usize = std::env::var("TANDEM_FAKE_MAX_MODEL_LEN").ok().and_then(|v| v.parse().ok()).unwrap_or(512);
    let mut fake = FakeModel::new(fake_config(VOCAB, &[2], max_len), (2 * max_len / 16).max(1024), 16, 1024, 128);
    fake.delay = delay; // paced like a real model
    let handle = Engine::spawn(Box::new(fake), decode_fn(tok.clone()), EngineConfig::default()).expect("engine starts");
    let config = ServerConfig {
        addr,
        max_model_len: handle.max_model_len(),
        vocab_size: VOCAB,
        api_key: std::env::var("TANDEM_API_KEY").ok(),
        shutdown_grace: Duration::from_secs(5),
        ..Default::default()
    };
    println!("serving model `fake` on http://{addr}");
    serve(config, TandemEngine::ready(handle.clone()), tok, "fake".into(), shutdown_signal()).await?;
    handle.shutdown();
    Ok(())
}
