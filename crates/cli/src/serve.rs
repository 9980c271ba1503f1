//! `tandem serve`: load a model, start the engine and the HTTP server.
//!
//! The server listens before the model is loaded: `/health` answers 503 until the engine is
//! ready, as vLLM's does, so an orchestrator can tell "starting" from "dead".

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tandem_core::model::LoadOptions;
use tandem_core::tokenizer::Tokenizer;
use tandem_engine::engine::{Engine, EngineConfig};
use tandem_engine::scheduler::{BatchMode, Policy};
use tandem_server::engine_adapter::{decode_fn, TandemEngine};
use tandem_server::ServerConfig;

use crate::backends::{self, BackendKind};

#[derive(clap::Args, Clone)]
pub struct EngineArgs {
    /// A Hugging Face model directory (default: the default model, fetched when absent).
    #[arg(long)]
    pub model: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = BackendKind::Wgpu)]
    pub backend: BackendKind,
    /// Most sequences in one step.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Token budget of one step (prefill chunks and decode tokens together).
    #[arg(long, default_value_t = 512)]
    pub max_num_batched_tokens: usize,
    /// KV blocks in the pool (default: sized from free device memory).
    #[arg(long)]
    pub num_kv_blocks: Option<usize>,
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f32,
    /// Tokens per KV block (16 or 32).
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// `continuous` batching, or `static` (the baseline: fill a batch, run it to the end).
    #[arg(long, default_value = "continuous")]
    pub scheduler: String,
    /// Static mode: how long to wait for a batch to fill.
    #[arg(long, default_value_t = 50)]
    pub max_wait_ms: u64,
    /// `fcfs` or `priority` (lower value first, ties by arrival).
    #[arg(long, default_value = "fcfs")]
    pub policy: String,
    #[arg(long)]
    pub no_prefix_caching: bool,
}

impl EngineArgs {
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            max_batch_tokens: self.max_num_batched_tokens,
            max_seqs: self.max_num_seqs,
            num_kv_blocks: self.num_kv_blocks.unwrap_or(0),
            block_size: self.block_size,
            gpu_memory_utilization: self.gpu_memory_utilization,
        }
    }

    pub fn engine_config(&self, max_pending: Option<usize>) -> Result<EngineConfig> {
        let mode = match self.scheduler.as_str() {
            "continuous" => BatchMode::Continuous,
            "static" => BatchMode::Static { batch_size: self.max_num_seqs, max_wait: Duration::from_millis(self.max_wait_ms) },
            other => anyhow::bail!("--scheduler {other}: expected `continuous` or `static`"),
        };
        let policy = match self.policy.as_str() {
            "fcfs" => Policy::Fcfs,
            "priority" => Policy::Priority,
            other => anyhow::bail!("--policy {other}: expected `fcfs` or `priority`"),
        };
        Ok(EngineConfig {
            max_num_batched_tokens: Some(self.max_num_batched_tokens),
            max_num_seqs: Some(self.max_num_seqs),
            policy,
            mode,
            enable_prefix_caching: !self.no_prefix_caching,
            max_pending_requests: max_pending,
            ..Default::default()
        })
    }
}

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    engine: EngineArgs,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Clients must send `Authorization: Bearer <key>` (all endpoints but /health).
    #[arg(long, env = "TANDEM_API_KEY")]
    api_key: Option<String>,
    /// Requests waiting for their first token beyond this are answered 429 at once.
    #[arg(long, default_value_t = 256)]
    max_queued_requests: usize,
    /// The model name clients use (default: the model directory's name).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Seconds running requests get to finish after SIGTERM / Ctrl-C.
    #[arg(long, default_value_t = 30)]
    shutdown_grace_s: u64,
}

pub fn run(a: Args) -> Result<()> {
    let dir = backends::resolve_model(a.engine.model.as_deref())?;
    let mut tok = Tokenizer::from_dir(&dir)?;
    let cfg = tandem_core::ModelConfig::from_file(&dir.join("config.json"))?;
    tok.add_eos_ids(&cfg.eos_token_ids);
    let tok = Arc::new(tok);
    let name = a.served_model_name.clone().unwrap_or_else(|| dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into()));
    let addr: SocketAddr = format!("{}:{}", a.host, a.port).parse().with_context(|| format!("--host {} --port {}: not an address", a.host, a.port))?;
    let server_cfg = ServerConfig {
        addr,
        api_key: a.api_key.clone(),
        max_queued_requests: a.max_queued_requests,
        max_model_len: cfg.max_position_embeddings,
        vocab_size: cfg.vocab_size,
        shutdown_grace: Duration::from_secs(a.shutdown_grace_s),
        ..Default::default()
    };
    let engine_cfg = a.engine.engine_config(None)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let engine = TandemEngine::loading();
        let server = tandem_server::Server::bind(server_cfg, engine.clone(), tok.clone(), name).await?;
        tracing::info!("listening on http://{} (loading {} on {})", server.local_addr()?, dir.display(), a.engine.backend.name());
        let (load_opts, backend, tok2) = (a.engine.load_options(), a.engine.backend, tok.clone());
        let loader = tokio::task::spawn_blocking(move || -> Result<()> {
            let runner = backends::load(backend, &dir, load_opts)?;
            let handle = Engine::spawn(runner, decode_fn(tok2), engine_cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
            engine.set(handle);
            tracing::info!("model loaded; ready");
            Ok(())
        });
        let serve = server.run(tandem_server::server::shutdown_signal());
        tokio::pin!(serve);
        tokio::select! {
            r = &mut serve => r.map_err(anyhow::Error::from),
            r = loader => {
                r.context("model loader")??;
                serve.await.map_err(anyhow::Error::from)
            }
        }
    })
}
