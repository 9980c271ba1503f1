//! [`LlmBuilder`]: a model directory, a backend and the engine's settings, to a loaded engine.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tandem_core::model::LoadOptions;
use tandem_core::tokenizer::Tokenizer;
use tandem_core::KvDtype;
use tandem_engine::{BatchMode, Engine, EngineConfig, Policy, SpeculativeConfig};

use crate::backend::{load_model_with_lora, Backend};
use crate::error::{Error, Result};
use crate::llm::{AsyncLlm, Core, Llm};
use crate::lora_modules::LoraModules;

/// How many KV blocks the pool holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvMemory {
    /// This many blocks of `block_size` tokens.
    Blocks(usize),
    /// This fraction of the device memory free after the weights (CUDA); the reference and
    /// wgpu backends cannot tell free memory and take `tandem_core::model::AUTO_KV_BYTES`.
    Fraction(f32),
}

/// Which batching the engine does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheduler {
    /// Continuous batching: sequences join and leave the batch at every step (vLLM's).
    Continuous,
    /// The baseline: fill a batch of up to `max_num_seqs` (waiting at most `max_wait` for it
    /// to fill) and run it to the end before taking new requests.
    Static { max_wait: Duration },
}

/// Settings for a loaded engine; [`LlmBuilder::build`] loads the model and starts the engine
/// thread. The defaults are `tandem serve`'s.
#[derive(Debug, Clone)]
pub struct LlmBuilder {
    model: PathBuf,
    backend: Backend,
    max_num_seqs: usize,
    max_num_batched_tokens: Option<usize>,
    block_size: usize,
    kv_memory: KvMemory,
    scheduler: Scheduler,
    policy: Policy,
    prefix_caching: bool,
    seed: u64,
    max_model_len: Option<usize>,
    kv_dtype: Option<KvDtype>,
    enforce_eager: bool,
    long_prefill_token_threshold: Option<usize>,
    max_num_partial_prefills: usize,
    max_long_partial_prefills: usize,
    speculative: Option<SpeculativeConfig>,
    lora: Option<LoraModules>,
}

impl LlmBuilder {
    /// A Hugging Face model directory (`config.json`, safetensors, `tokenizer.json`; fetch one
    /// with `fetch-model`), or a GGUF file, served with its weights kept quantized where the
    /// backend runs their layouts (the reference does; see `tandem_core::quant_layout`).
    pub fn new(model_dir: impl AsRef<Path>) -> Self {
        LlmBuilder {
            model: model_dir.as_ref().to_path_buf(),
            backend: Backend::Auto,
            max_num_seqs: 64,
            max_num_batched_tokens: None,
            block_size: 16,
            kv_memory: KvMemory::Fraction(0.9),
            scheduler: Scheduler::Continuous,
            policy: Policy::Fcfs,
            prefix_caching: true,
            seed: 0,
            max_model_len: None,
            kv_dtype: None,
            enforce_eager: false,
            long_prefill_token_threshold: None,
            max_num_partial_prefills: 0,
            max_long_partial_prefills: 0,
            speculative: None,
            lora: None,
        }
    }

    /// Default [`Backend::Auto`].
    pub fn backend(mut self, b: Backend) -> Self {
        self.backend = b;
        self
    }
    /// Most sequences in one step (default 64).
    pub fn max_num_seqs(mut self, n: usize) -> Self {
        self.max_num_seqs = n;
        self
    }
    /// Token budget of one step, prefill chunks and decode tokens together (default: the
    /// backend's, [`crate::backend::GPU_BATCH_TOKENS`] on a GPU and
    /// [`crate::backend::CPU_BATCH_TOKENS`] on a CPU, so that a step stays short there).
    pub fn max_num_batched_tokens(mut self, n: usize) -> Self {
        self.max_num_batched_tokens = Some(n);
        self
    }
    /// vLLM's `long_prefill_token_threshold`: no prefill chunk longer than `n` tokens, and a
    /// prompt longer than `n` is long; 0: no threshold. Default: while a request waits to
    /// start, a running prefill takes at most half the step's budget.
    pub fn long_prefill_token_threshold(mut self, n: usize) -> Self {
        self.long_prefill_token_threshold = Some(n);
        self
    }
    /// vLLM's `max_num_partial_prefills`: at most `n` prompts partly prefilled at once
    /// (default: no limit).
    pub fn max_num_partial_prefills(mut self, n: usize) -> Self {
        self.max_num_partial_prefills = n;
        self
    }
    /// vLLM's `max_long_partial_prefills`: of those, at most `n` long ones (default: no limit).
    pub fn max_long_partial_prefills(mut self, n: usize) -> Self {
        self.max_long_partial_prefills = n;
        self
    }
    /// Speculative decoding (vLLM's `speculative_config`; default off): greedy answers stay
    /// bitwise the same. [`SpeculativeConfig::from_json`] reads vLLM's JSON; a config the
    /// engine cannot honour fails the build, naming the field.
    pub fn speculative_config(mut self, c: SpeculativeConfig) -> Self {
        self.speculative = Some(c);
        self
    }
    /// Tokens per KV block: 16 (default) or 32.
    pub fn block_size(mut self, n: usize) -> Self {
        self.block_size = n;
        self
    }
    /// A KV pool of exactly `n` blocks.
    pub fn num_kv_blocks(mut self, n: usize) -> Self {
        self.kv_memory = KvMemory::Blocks(n);
        self
    }
    /// A KV pool sized from free device memory (default 0.9 of it).
    pub fn gpu_memory_utilization(mut self, fraction: f32) -> Self {
        self.kv_memory = KvMemory::Fraction(fraction);
        self
    }
    pub fn kv_memory(mut self, m: KvMemory) -> Self {
        self.kv_memory = m;
        self
    }
    /// LoRA adapters over the model (vLLM's `enable_lora`, `lora_modules`, `max_loras`,
    /// `max_lora_rank`, `max_cpu_loras`): adapter `i` under id `i` (in slot `i` at load for the
    /// first `max_loras`, the others swapped in when a request needs them), a bad one failing
    /// the build naming it. [`Llm::lora_slot`] gives a name's id for
    /// `EngineHandle::submit_with_adapter`.
    pub fn lora(mut self, modules: LoraModules) -> Self {
        self.lora = Some(modules);
        self
    }
    /// Run every step eagerly (vLLM's `enforce_eager`): no CUDA graphs. By default the CUDA
    /// backend captures each decode batch-size bucket at load and replays it.
    pub fn enforce_eager(mut self, on: bool) -> Self {
        self.enforce_eager = on;
        self
    }
    /// Default [`Scheduler::Continuous`].
    pub fn scheduler(mut self, s: Scheduler) -> Self {
        self.scheduler = s;
        self
    }
    /// [`Policy::Fcfs`] (default) or [`Policy::Priority`] (lower value first, ties by arrival).
    pub fn policy(mut self, p: Policy) -> Self {
        self.policy = p;
        self
    }
    /// Reuse the KV of shared prompt prefixes (default on).
    pub fn prefix_caching(mut self, on: bool) -> Self {
        self.prefix_caching = on;
        self
    }
    /// Seeds the sampling of requests that bring no seed of their own (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Longest prompt + output accepted (default: the least of the model's context and what
    /// the KV pool holds).
    pub fn max_model_len(mut self, n: usize) -> Self {
        self.max_model_len = Some(n);
        self
    }

    /// What the KV cache stores (default: the backend's choice, bf16 on CUDA and f32 elsewhere,
    /// as `--kv-cache-dtype auto`). A type the backend does not store fails `build`.
    pub fn kv_cache_dtype(mut self, dtype: KvDtype) -> Self {
        self.kv_dtype = Some(dtype);
        self
    }

    /// The sizes fixed when the model is loaded.
    pub fn load_options(&self) -> Result<LoadOptions> {
        if self.max_num_seqs == 0 || self.max_num_batched_tokens == Some(0) {
            return Err(Error::Config(format!(
                "max_num_seqs ({}) and max_num_batched_tokens (0) must be positive",
                self.max_num_seqs
            )));
        }
        if !(self.block_size == 16 || self.block_size == 32) {
            return Err(Error::Config(format!("block_size must be 16 or 32, got {}", self.block_size)));
        }
        if let Some(s) = &self.speculative {
            s.validate().map_err(Error::Config)?;
        }
        let (num_kv_blocks, gpu_memory_utilization) = match self.kv_memory {
            KvMemory::Blocks(0) => return Err(Error::Config("num_kv_blocks must be positive".into())),
            KvMemory::Blocks(n) => (n, 0.9),
            KvMemory::Fraction(f) if !(f > 0.0 && f <= 1.0) => {
                return Err(Error::Config(format!("gpu_memory_utilization must be in (0, 1], got {f}")))
            }
            KvMemory::Fraction(f) => (0, f),
        };
        Ok(LoadOptions {
            max_batch_tokens: self.max_num_batched_tokens.unwrap_or(0),
            max_seqs: self.max_num_seqs,
            num_kv_blocks,
            block_size: self.block_size,
            gpu_memory_utilization,
            max_model_len: self.max_model_len,
            kv_dtype: self.kv_dtype,
            graphs: !self.enforce_eager,
            ..LoadOptions::default()
        })
    }

    /// The engine's settings.
    pub fn engine_config(&self) -> EngineConfig {
        let mode = match self.scheduler {
            Scheduler::Continuous => BatchMode::Continuous,
            Scheduler::Static { max_wait } => BatchMode::Static { batch_size: self.max_num_seqs, max_wait },
        };
        EngineConfig {
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: Some(self.max_num_seqs),
            policy: self.policy,
            mode,
            enable_prefix_caching: self.prefix_caching,
            seed: self.seed,
            max_model_len: self.max_model_len,
            long_prefill_token_threshold: self.long_prefill_token_threshold,
            max_num_partial_prefills: self.max_num_partial_prefills,
            max_long_partial_prefills: self.max_long_partial_prefills,
            speculative: self.speculative.clone(),
            max_cpu_loras: self.lora.as_ref().map(LoraModules::max_cpu_loras),
            lora_modules: self.lora.as_ref().map_or_else(Vec::new, LoraModules::dirs),
            ..Default::default()
        }
    }

    fn start(mut self) -> Result<Arc<Core>> {
        let opts = self.load_options()?;
        self.model = crate::backend::model_dir(&self.model)?;
        let mut tok = Tokenizer::from_dir(&self.model)?;
        let t0 = Instant::now();
        let loaded = load_model_with_lora(self.backend, &self.model, opts, self.lora.as_ref())?;
        tok.add_eos_ids(&loaded.runner.config().eos_token_ids.clone());
        let tok = Arc::new(tok);
        let geo = loaded.runner.kv_geometry();
        let kv_dtype = loaded.runner.kv_dtype();
        // A generation config that cannot be read fails the build, naming the file, as serve does.
        let defaults = crate::llm::sampling_defaults(tandem_core::GenerationConfig::from_dir(&self.model)?.as_ref());
        tracing::info!(backend = loaded.backend.name(), device = %loaded.device, kv_blocks = geo.num_blocks, load_ms = t0.elapsed().as_millis() as u64, "loaded {}", self.model.display());
        let handle =
            Engine::spawn(loaded.runner, tandem_engine::tokenizer_decode_fn(tok.clone()), self.engine_config())
                .map_err(|e| Error::Config(e.to_string()))?;
        Ok(Arc::new(Core {
            handle,
            tok,
            backend: loaded.backend,
            device: loaded.device,
            kv_blocks: geo.num_blocks,
            kv_dtype,
            defaults,
            model_dir: self.model.clone(),
            structured: Default::default(),
            lora: self.lora.take(),
        }))
    }

    /// Loads the model and starts the engine, for offline (blocking) use.
    pub fn build(self) -> Result<Llm> {
        Ok(Llm { core: self.start()? })
    }

    /// Loads the model and starts the engine, for streaming from async code.
    pub fn build_async(self) -> Result<AsyncLlm> {
        Ok(AsyncLlm { core: self.start()? })
    }
}
