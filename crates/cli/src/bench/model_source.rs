//! Which model a benchmark runs: a directory (`--model`), a seeded random model of a standard
//! shape (`--random-shape`, written once into a cache folder, bf16), or the default model.
//! Also loads it on a backend, keeping the device's name for the report.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use tandem_core::model::{LoadOptions, ModelRunner};
use tandem_core::tokenizer::Tokenizer;
use tandem_core::{DType, ModelConfig};
use tandem_engine::{Engine, EngineHandle};
use tandem_model_files::Shape;

use crate::backends::{self, BackendKind};
use crate::serve::EngineArgs;

#[derive(clap::Args, Clone, Debug)]
pub struct RandomModelArgs {
    /// A seeded random model of this shape instead of --model: tiny, tiny-tied, tiny-hd128,
    /// smollm2-135m, qwen2.5-0.5b, llama-3.2-1b, llama-3-8b.
    #[arg(long)]
    pub random_shape: Option<String>,
    /// Seed of the random model's weights.
    #[arg(long, default_value_t = 1)]
    pub model_seed: u64,
    /// Where random models are written once and reused (default: <temp>/tandem-bench-models).
    #[arg(long)]
    pub model_cache: Option<PathBuf>,
}

/// A resolved model directory and what the report says about it.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub dir: PathBuf,
    /// The shape name for random models, else the folder's name.
    pub label: String,
    pub config: ModelConfig,
}

impl ModelInfo {
    pub fn to_json(&self, random: &RandomModelArgs) -> Value {
        let c = &self.config;
        json!({
            "dir": self.dir.display().to_string(),
            "label": self.label,
            "random_shape": random.random_shape,
            "random_seed": random.random_shape.as_ref().map(|_| random.model_seed),
            "architecture": c.architecture,
            "dtype": c.dtype,
            "intermediate_size": c.intermediate_size,
            "hidden_size": c.hidden_size,
            "num_layers": c.num_hidden_layers,
            "num_heads": c.num_attention_heads,
            "num_kv_heads": c.num_key_value_heads,
            "vocab_size": c.vocab_size,
            "max_position_embeddings": c.max_position_embeddings,
        })
    }
}

pub fn resolve(model: Option<&Path>, r: &RandomModelArgs) -> Result<ModelInfo> {
    let (dir, label) = match (model, &r.random_shape) {
        (Some(_), Some(_)) => bail!("give --model or --random-shape, not both"),
        // A GGUF file: the directory of its metadata beside a link to it (served kept quantized).
        (Some(dir), None) => (backends::resolve_model(Some(dir))?, super::report::dir_label(dir)),
        (None, Some(shape)) => (random_model_dir(shape, r)?, shape.clone()),
        (None, None) => {
            let dir = backends::resolve_model(None)?;
            let label = super::report::dir_label(&dir);
            (dir, label)
        }
    };
    let path = dir.join("config.json");
    if !path.exists() {
        bail!("{}: not a model directory (no config.json)", dir.display());
    }
    let config = ModelConfig::from_file(&path)?;
    Ok(ModelInfo { dir, label, config })
}

/// The cached random model of `shape`, written first when absent. It is written to a
/// sibling folder and renamed, so an interrupted write never looks like a model.
fn random_model_dir(name: &str, r: &RandomModelArgs) -> Result<PathBuf> {
    let shape = Shape::parse(name).ok_or_else(|| {
        let known: Vec<&str> = Shape::ALL.iter().map(|s| s.name()).collect();
        anyhow!("--random-shape {name}: unknown shape (known: {})", known.join(", "))
    })?;
    let cache = r.model_cache.clone().unwrap_or_else(|| std::env::temp_dir().join("tandem-bench-models"));
    let dir = cache.join(format!("{}-seed{}-bf16", shape.name(), r.model_seed));
    if dir.join("config.json").exists() && dir.join("model.safetensors").exists() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    let tmp = cache.join(format!(".{}-seed{}-bf16.{}", shape.name(), r.model_seed, std::process::id()));
    let t = Instant::now();
    eprintln!("writing a random {} model (seed {}) to {} ...", shape.name(), r.model_seed, dir.display());
    tandem_model_files::write_random_model(&tmp, shape, r.model_seed, DType::BF16)
        .with_context(|| format!("writing a random {} model to {}", shape.name(), tmp.display()))?;
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => {}
        // Another run wrote it meanwhile: use theirs.
        Err(_) if dir.join("model.safetensors").exists() => {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        Err(e) => return Err(e).with_context(|| format!("renaming {} to {}", tmp.display(), dir.display())),
    }
    eprintln!("  done in {:.1} s", t.elapsed().as_secs_f64());
    Ok(dir)
}

/// Loads a model on a backend (through the library's one wiring); also returns the device's
/// name (adapter or GPU) for the report.
pub fn load_runner(kind: BackendKind, dir: &Path, opts: LoadOptions) -> Result<(Box<dyn ModelRunner>, String)> {
    let m = backends::load_model(kind, dir, opts)?;
    let device = match m.backend {
        tandem::Backend::Reference => {
            format!("CPU reference ({})", super::report::machine()["cpu"].as_str().unwrap_or("unknown"))
        }
        _ => m.device,
    };
    Ok((m.runner, device))
}

/// A running engine and what the report says about it.
pub struct Started {
    pub handle: EngineHandle,
    pub device: String,
    pub load_s: f64,
    pub kv_blocks: usize,
    pub block_size: usize,
    /// What the KV cache stores (as the runner reports it, `auto` resolved).
    pub kv_dtype: tandem_core::KvDtype,
}

impl Started {
    pub fn backend_json(&self, kind: BackendKind) -> Value {
        json!({"name": kind.name(), "device": self.device, "kv_blocks": self.kv_blocks, "block_size": self.block_size, "kv_cache_dtype": self.kv_dtype.name(), "kv_elem_bytes": self.kv_dtype.size()})
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}

/// Loads the model and spawns an engine with `ea`'s settings.
pub fn start_engine(model: &ModelInfo, ea: &EngineArgs) -> Result<Started> {
    let t = Instant::now();
    let mut tok = Tokenizer::from_dir(&model.dir)?;
    tok.add_eos_ids(&model.config.eos_token_ids);
    let (runner, device) = load_runner(ea.backend, &model.dir, ea.load_options())?;
    let (geo, kv_dtype) = (runner.kv_geometry(), runner.kv_dtype());
    let mut cfg = ea.engine_config(None)?;
    cfg.speculative = cfg.speculative.map(|s| s.for_target(&model.dir));
    let handle = Engine::spawn(runner, tandem_server::engine_adapter::decode_fn(Arc::new(tok)), cfg)
        .map_err(|e| anyhow!("{e}"))?;
    Ok(Started {
        handle,
        device,
        load_s: t.elapsed().as_secs_f64(),
        kv_blocks: geo.num_blocks,
        block_size: geo.block_size,
        kv_dtype,
    })
}

/// The engine settings as the report records them.
pub fn engine_json(ea: &EngineArgs) -> Value {
    json!({
        "backend": ea.backend.name(),
        "scheduler": ea.scheduler,
        "max_num_seqs": ea.max_num_seqs,
        "max_num_batched_tokens": ea.max_num_batched_tokens,
        "num_kv_blocks": ea.num_kv_blocks,
        "gpu_memory_utilization": (f64::from(ea.gpu_memory_utilization) * 1e4).round() / 1e4,
        "block_size": ea.block_size,
        "max_wait_ms": ea.max_wait_ms,
        "policy": ea.policy,
        "prefix_caching": !ea.no_prefix_caching,
        "kv_cache_dtype": ea.kv_cache_dtype.flag(),
    })
}

/// The same settings as `tandem serve` flags (for `bench serve --spawn`).
pub fn engine_flags(ea: &EngineArgs, dir: &Path) -> Vec<String> {
    let mut f = vec![
        "--model".into(),
        dir.display().to_string(),
        "--backend".into(),
        ea.backend.name().into(),
        "--max-num-seqs".into(),
        ea.max_num_seqs.to_string(),
        "--gpu-memory-utilization".into(),
        ea.gpu_memory_utilization.to_string(),
        "--block-size".into(),
        ea.block_size.to_string(),
        "--scheduler".into(),
        ea.scheduler.clone(),
        "--max-wait-ms".into(),
        ea.max_wait_ms.to_string(),
        "--policy".into(),
        ea.policy.clone(),
        "--kv-cache-dtype".into(),
        ea.kv_cache_dtype.flag().into(),
    ];
    if let Some(n) = ea.num_kv_blocks {
        f.extend(["--num-kv-blocks".into(), n.to_string()]);
    }
    if let Some(n) = ea.max_num_batched_tokens {
        f.extend(["--max-num-batched-tokens".into(), n.to_string()]);
    }
    if ea.no_prefix_caching {
        f.push("--no-prefix-caching".into());
    }
    f
}
