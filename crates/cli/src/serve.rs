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
use tandem_core::KvDtype;
use tandem_engine::engine::{Engine, EngineConfig};
use tandem_engine::scheduler::{BatchMode, Policy};
use tandem_engine::speculative::SpeculativeConfig;
use tandem_server::engine_adapter::{decode_fn, TandemEngine};
use tandem_server::reasoning::{self, ReasoningParser};
use tandem_server::tool_parser::{self, ToolParser};
use tandem_server::ServerConfig;

use crate::backends::{self, BackendKind};

#[derive(clap::Args, Clone)]
pub struct EngineArgs {
    /// A Hugging Face model directory, or a GGUF file (served kept quantized) (default: the
    /// default model, fetched when absent).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// `auto`: cuda where a driver is found, else wgpu where an adapter is, else reference.
    #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
    pub backend: BackendKind,
    /// Most sequences in one step.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Token budget of one step (prefill chunks and decode tokens together). Default: the
    /// backend's, logged at start-up: 2048 on a GPU (CUDA, or wgpu on a GPU adapter), 32 on a
    /// CPU (reference, or wgpu on lavapipe), where a step of that many tokens takes about half a
    /// second on the default model, so a newcomer's first token is never far behind a long
    /// prompt's prefill.
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// KV blocks in the pool (default: sized from free device memory).
    #[arg(long)]
    pub num_kv_blocks: Option<usize>,
    /// Fraction of the device's total memory for weights, activations, step workspace and the
    /// KV pool together (as in vLLM), when --num-kv-blocks is not given.
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
    /// `fcfs` or `priority` (lower value first, ties by arrival); vLLM's `--scheduling-policy`.
    #[arg(long, visible_alias = "scheduling-policy", default_value = "fcfs")]
    pub policy: String,
    /// Turn prefix caching off (vLLM: `--no-enable-prefix-caching`).
    #[arg(long, visible_alias = "no-enable-prefix-caching")]
    pub no_prefix_caching: bool,
    /// Longest prompt + output (default: the model's context, capped by what the KV pool holds).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Schedule step N+1 while the model runs step N (vLLM's `--async-scheduling`). On by
    /// default, as SGLang's overlap scheduler is: every request's output is the same either
    /// way (steps that need host-side results run synchronously), and the engine's host work
    /// (detokenizing, stop strings, scheduling) hides behind the device's step.
    #[arg(long, overrides_with = "no_async_scheduling")]
    pub async_scheduling: bool,
    /// Run each step's forward and its postprocessing one after the other.
    #[arg(long, overrides_with = "async_scheduling")]
    pub no_async_scheduling: bool,
    /// What the KV cache stores: `auto` (bf16 on cuda, f32 elsewhere), `bf16`/`bfloat16`
    /// (cuda only), `f32`/`float32` (every backend; on cuda for checks), or vLLM's `fp8`
    /// (`fp8_e4m3`) and `fp8_e5m2`: one byte an element, scale 1.0 (the reference only, so
    /// far; another backend refuses it at load).
    #[arg(long, default_value = "auto", value_parser = parse_kv_cache_dtype)]
    pub kv_cache_dtype: KvCacheDtype,
    /// vLLM's: no prefill chunk longer than this, and a prompt longer than this is long; 0: no
    /// threshold. Default: while a request waits to start, a prefill chunk takes at most half
    /// the step's budget (so the newcomer starts next step); alone it takes the whole budget.
    #[arg(long)]
    pub long_prefill_token_threshold: Option<usize>,
    /// vLLM's: at most this many prompts partly prefilled at once (default: no limit).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_num_partial_prefills: Option<u64>,
    /// vLLM's: of those, at most this many longer than the threshold; shorter prompts behind a
    /// held-back long one go first (default: no limit).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_long_partial_prefills: Option<u64>,
    /// vLLM's JSON, e.g. `{"method": "ngram", "num_speculative_tokens": 4}` (also
    /// `prompt_lookup_min`, `prompt_lookup_max`) or `{"method": "suffix"}` (also the
    /// `suffix_decoding_*` fields) or `{"method": "eagle3", "model": DIR,
    /// "num_speculative_tokens": 3}` (an EAGLE-3 head) or `{"method": "mtp",
    /// "num_speculative_tokens": 1}` (the MTP layers the served model ships, MiMo's): greedy
    /// answers stay bitwise the same, sampled ones keep their distribution. Other methods and fields are refused by name.
    #[arg(long, value_parser = SpeculativeConfig::from_json)]
    pub speculative_config: Option<SpeculativeConfig>,
}

/// `--kv-cache-dtype`: None is `auto` (the backend's default, `Backend::kv_dtypes()[0]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheDtype(pub Option<KvDtype>);

impl KvCacheDtype {
    /// The flag's value as `tandem serve` takes it back.
    pub fn flag(self) -> &'static str {
        self.0.map_or("auto", KvDtype::name)
    }
}

/// vLLM's spellings where they mean what ours do: `fp8` is e4m3 as vLLM's is (scale 1.0); its
/// other fp8 caches (`fp8_inc`, `fp8_ds_mla`) are refused by name. Whether the backend stores
/// the type is checked at load, naming both.
pub fn parse_kv_cache_dtype(v: &str) -> std::result::Result<KvCacheDtype, String> {
    match v.to_ascii_lowercase().as_str() {
        "auto" => Ok(KvCacheDtype(None)),
        "bf16" | "bfloat16" => Ok(KvCacheDtype(Some(KvDtype::Bf16))),
        "f32" | "fp32" | "float32" | "float" => Ok(KvCacheDtype(Some(KvDtype::F32))),
        "fp8" | "fp8_e4m3" => Ok(KvCacheDtype(Some(KvDtype::Fp8E4m3))),
        "fp8_e5m2" => Ok(KvCacheDtype(Some(KvDtype::Fp8E5m2))),
        fp8 if fp8.starts_with("fp8") => {
            Err(format!("{v}: this fp8 KV cache is not supported (use fp8, fp8_e4m3 or fp8_e5m2)"))
        }
        _ => Err(format!("{v}: expected auto, bf16 (bfloat16), f32 (float32), fp8 (fp8_e4m3) or fp8_e5m2")),
    }
}

impl EngineArgs {
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            max_batch_tokens: self.max_num_batched_tokens.unwrap_or(0),
            max_seqs: self.max_num_seqs,
            num_kv_blocks: self.num_kv_blocks.unwrap_or(0),
            block_size: self.block_size,
            gpu_memory_utilization: self.gpu_memory_utilization,
            max_model_len: self.max_model_len,
            kv_dtype: self.kv_cache_dtype.0,
            ..Default::default()
        }
    }

    pub fn engine_config(&self, max_pending: Option<usize>) -> Result<EngineConfig> {
        let mode = match self.scheduler.as_str() {
            "continuous" => BatchMode::Continuous,
            "static" => {
                BatchMode::Static { batch_size: self.max_num_seqs, max_wait: Duration::from_millis(self.max_wait_ms) }
            }
            other => anyhow::bail!("--scheduler {other}: expected `continuous` or `static`"),
        };
        let policy = match self.policy.as_str() {
            "fcfs" => Policy::Fcfs,
            "priority" => Policy::Priority,
            other => anyhow::bail!("--policy {other}: expected `fcfs` or `priority`"),
        };
        Ok(EngineConfig {
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: Some(self.max_num_seqs),
            policy,
            mode,
            enable_prefix_caching: !self.no_prefix_caching,
            max_pending_requests: max_pending,
            max_model_len: self.max_model_len,
            async_scheduling: !self.no_async_scheduling,
            long_prefill_token_threshold: self.long_prefill_token_threshold,
            max_num_partial_prefills: self.max_num_partial_prefills.unwrap_or(0) as usize,
            max_long_partial_prefills: self.max_long_partial_prefills.unwrap_or(0) as usize,
            speculative: self.speculative_config.clone(),
            ..Default::default()
        })
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// The model directory or GGUF file, as `vllm serve MODEL` takes it (or `--model DIR`).
    #[arg(value_name = "MODEL_DIR", conflicts_with = "model")]
    model_dir: Option<PathBuf>,
    #[command(flatten)]
    engine: EngineArgs,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Clients must send `Authorization: Bearer <key>` (all endpoints but /health).
    #[arg(long, env = "TANDEM_API_KEY")]
    api_key: Option<String>,
    /// Sequences that may wait for admission beyond the `--max-num-seqs` running; beyond
    /// that a request is answered 429 at once.
    #[arg(long, default_value_t = 256)]
    max_queued_requests: usize,
    /// The model names clients use, as vLLM's: the first is the one responses report, all are
    /// listed and accepted. Default: the model directory as given (its base name is accepted too).
    #[arg(long, num_args = 1..)]
    served_model_name: Vec<String>,
    /// A generation request running longer than this many seconds is aborted (its choices end
    /// with finish_reason "abort", or 408 when nothing was produced yet). Default: no bound.
    #[arg(long)]
    request_timeout_s: Option<f64>,
    /// Browser origins answered with CORS headers (`*` for any; repeat or comma-separate).
    #[arg(long, value_delimiter = ',')]
    allowed_origins: Vec<String>,
    /// Seconds running requests get to finish after SIGTERM / Ctrl-C.
    #[arg(long, default_value_t = 30)]
    shutdown_grace_s: u64,
    /// Publish KV-cache events (blocks entering and leaving the prefix cache) on a ZeroMQ PUB
    /// socket at `tcp://HOST:PORT` (`*` for every interface), in vLLM's KV event format, for
    /// routers' KV-aware policies: `vllm-router --policy kv_aware --kv-event-source
    /// URL=tcp://HOST:PORT`. docs/scale-out.md.
    #[arg(long, value_name = "tcp://HOST:PORT")]
    kv_events_endpoint: Option<String>,
    /// `auto`: the model's generation_config.json gives the sampling defaults under each
    /// request's values (vLLM's default); `vllm`: ignore it; or a folder holding one.
    #[arg(long, default_value = "auto")]
    generation_config: String,
    /// vLLM's: `auto` (the checkpoint's), or the checkpoint's own dtype. Weights run in the
    /// dtype they are stored in; a conversion at load is refused, not faked.
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Seeds the sampling of requests that bring no seed of their own (not in `EngineArgs`:
    /// the benchmarks have a `--seed` of their own, for their workloads).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// vLLM's; only 1 (one device) is supported.
    #[arg(long, visible_alias = "tp", default_value_t = 1)]
    tensor_parallel_size: usize,
    /// vLLM's: `gguf` serves a GGUF file's weights kept in their stored layouts; `fp8` an FP8
    /// checkpoint's kept in 8 bits; `awq`, `gptq` (also `awq_marlin`, `gptq_marlin`) an int4
    /// checkpoint kept 4-bit; `compressed-tensors` either. Detected from the file or config.json
    /// when not given, and must match what the checkpoint is; other methods are refused by name.
    #[arg(long, short = 'q')]
    quantization: Option<String>,
    /// vLLM's: prefix caching is on by default (`--no-enable-prefix-caching` turns it off).
    #[arg(long, conflicts_with = "no_prefix_caching")]
    enable_prefix_caching: bool,
    /// vLLM's: prefill is always chunked here (`--no-enable-chunked-prefill` is refused).
    #[arg(long)]
    enable_chunked_prefill: bool,
    /// vLLM's: run without CUDA graphs. By default the CUDA backend captures each decode
    /// batch-size bucket at load and replays it (`LoadOptions::graphs`); this runs every step
    /// eagerly, unpadded. Other backends always run eagerly.
    #[arg(long)]
    enforce_eager: bool,
    /// vLLM's switch for `tool_choice: "auto"`. Accepted: tandem parses "auto" answers with
    /// `--tool-call-parser`, or for `<tool_call>` blocks whenever the chat template writes them,
    /// with or without it.
    #[arg(long)]
    enable_auto_tool_choice: bool,
    /// vLLM's: serve LoRA adapters over the model (`--lora-modules`; a request names one as its
    /// `model`).
    #[arg(long)]
    enable_lora: bool,
    /// vLLM's: `name=path` (a PEFT directory), or `{"name": "a", "path": "DIR",
    /// "base_model_name": "M"}`; several may follow one flag.
    #[arg(long, num_args = 1.., value_parser = parse_lora_module)]
    lora_modules: Vec<tandem::LoraModule>,
    /// vLLM's: adapters on the device at once.
    #[arg(long, default_value_t = 1)]
    max_loras: usize,
    /// vLLM's: the largest adapter rank served.
    #[arg(long, default_value_t = 16)]
    max_lora_rank: usize,
    /// vLLM's: most adapters kept in host memory (default: --max-loras), the least recently
    /// used beyond it read again from its directory; adapters beyond --max-loras (named here or
    /// loaded at run time) wait there and are swapped into a slot a request needs.
    #[arg(long)]
    max_cpu_loras: Option<usize>,
    /// vLLM's tool-call parser for "auto": `hermes` (`<tool_call>{...}</tool_call>`: Qwen2.5,
    /// Hermes, SmolLM3), `llama3_json` (Llama 3.x JSON calls), `mistral` (`[TOOL_CALLS]`) or
    /// `qwen3_xml` (Qwen3-Coder's `<function=...>` calls).
    #[arg(long)]
    tool_call_parser: Option<String>,
    /// vLLM's reasoning parser: `qwen3` or `deepseek_r1`. A chat answer's `<think>` block goes to
    /// `reasoning_content` (and `reasoning`); on /v1/messages it is a `thinking` block.
    #[arg(long)]
    reasoning_parser: Option<String>,
}

fn parse_lora_module(v: &str) -> std::result::Result<tandem::LoraModule, String> {
    tandem::LoraModule::parse(v).map_err(|e| e.to_string())
}

/// vLLM `serve` flags that tandem does not implement: refused by name, never ignored.
const VLLM_UNSUPPORTED: &[&str] = &[
    "--pipeline-parallel-size",
    "-pp",
    "--data-parallel-size",
    "-dp",
    "--tokenizer",
    "--tokenizer-mode",
    "--trust-remote-code",
    "--revision",
    "--download-dir",
    "--load-format",
    "--max-logprobs",
    "--swap-space",
    "--cpu-offload-gb",
    "--cuda-graph-sizes",
    "--max-seq-len-to-capture",
    "--guided-decoding-backend",
    "--chat-template",
    "--response-role",
    "--ssl-keyfile",
    "--ssl-certfile",
    "--root-path",
    "--middleware",
    "--enable-sleep-mode",
    "--kv-transfer-config",
    "--num-scheduler-steps",
    "--preemption-mode",
    "--no-enable-chunked-prefill",
    "--hf-overrides",
    "--override-generation-config",
    "--limit-mm-per-prompt",
    "--mm-processor-kwargs",
    "--distributed-executor-backend",
    "--enable-expert-parallel",
    "--rope-scaling",
    "--rope-theta",
];

/// A vLLM flag tandem does not have: an error naming it (clap's own error would say only
/// "unexpected argument").
pub fn refuse_vllm_only_flags(args: &[String]) -> Result<()> {
    for a in args {
        let name = a.split('=').next().unwrap_or(a);
        if VLLM_UNSUPPORTED.contains(&name) {
            anyhow::bail!(
                "`{name}` is a vLLM flag that tandem does not support (see docs/openai-compat.md for the flags it has)"
            );
        }
    }
    Ok(())
}

impl Args {
    /// The vLLM-compatibility flags that tandem accepts only with values it implements.
    fn check_vllm_values(&self, cfg: &tandem_core::ModelConfig, dir: &std::path::Path) -> Result<()> {
        let method = tandem_core::fp8::method_of(&dir.join("config.json"));
        match (self.quantization.as_deref(), method.as_deref()) {
            (None, _) => {}
            (Some("gguf"), _) if tandem::is_gguf_dir(dir) => {}
            (Some("gguf"), _) => {
                anyhow::bail!("--quantization gguf: {} is not a GGUF file (serve FILE.gguf)", dir.display())
            }
            (Some(q @ ("fp8" | "compressed-tensors")), Some(m)) if q == m => {}
            (Some(m @ ("awq" | "awq_marlin" | "gptq" | "gptq_marlin")), _) => {
                let config = dir.join("config.json");
                let found = tandem_core::int4::format_of(&config)?;
                if found.map(|f| f.name()) != Some(m.trim_end_matches("_marlin")) {
                    anyhow::bail!(
                        "--quantization {m}: {} does not describe an int4 {} checkpoint (its quantization_config: {})",
                        config.display(),
                        m.trim_end_matches("_marlin"),
                        found.map_or("none of awq, gptq, compressed-tensors pack-quantized", |f| f.name())
                    )
                }
            }
            (Some(q @ ("fp8" | "compressed-tensors")), Some(m)) => anyhow::bail!(
                "--quantization {q}: {}/config.json says `quant_method` `{m}`; the two must match (as vLLM requires)",
                dir.display()
            ),
            (Some(q @ ("fp8" | "compressed-tensors")), None) => anyhow::bail!(
                "--quantization {q}: {} is not a {q} checkpoint (config.json has no `quantization_config`); \
                 quantizing 16-bit weights at load is not supported",
                dir.display()
            ),
            (Some(other), _) => anyhow::bail!(
                "--quantization {other}: not supported (tandem serves gguf files, fp8, awq, gptq and compressed-tensors \
                 (FP8 or int4) checkpoints, kept quantized; detected when not given)"
            ),
        }
        if self.tensor_parallel_size != 1 {
            anyhow::bail!(
                "--tensor-parallel-size {}: tandem runs on one device; only 1 is supported",
                self.tensor_parallel_size
            );
        }
        let stored = cfg.dtype.as_deref().unwrap_or("unknown");
        let canon = |d: &str| match d {
            "bfloat16" | "bf16" => "bfloat16",
            "float16" | "half" | "fp16" => "float16",
            "float32" | "float" | "fp32" => "float32",
            other => {
                if other == "auto" {
                    "auto"
                } else {
                    "?"
                }
            }
        };
        match canon(&self.dtype) {
            "auto" => Ok(()),
            "?" => anyhow::bail!("--dtype {}: expected auto, bfloat16, float16 or float32", self.dtype),
            want if want == canon(stored) => Ok(()),
            want => anyhow::bail!("--dtype {want}: {} stores its weights as {stored}, and tandem runs weights in the dtype they are stored in (use --dtype auto)", dir.display()),
        }
    }

    /// `--enable-lora` and its flags as the model loader takes them (`None`: LoRA off).
    fn lora(&self, cfg: &tandem_core::ModelConfig) -> Result<Option<tandem::LoraModules>> {
        let given = !self.lora_modules.is_empty() || self.max_cpu_loras.is_some();
        if !self.enable_lora {
            if given {
                anyhow::bail!("--lora-modules and --max-cpu-loras need --enable-lora");
            }
            return Ok(None);
        }
        let limits = tandem_core::lora::LoraLimits { max_loras: self.max_loras, max_rank: self.max_lora_rank };
        let m = tandem::LoraModules { limits, max_cpu_loras: self.max_cpu_loras, modules: self.lora_modules.clone() };
        m.check(cfg)?;
        Ok(Some(m))
    }

    fn sampling_defaults(&self, dir: &std::path::Path) -> Result<tandem_server::config::SamplingDefaults> {
        let from = match self.generation_config.as_str() {
            "vllm" => return Ok(Default::default()),
            "auto" => dir.to_path_buf(),
            folder => PathBuf::from(folder),
        };
        if self.generation_config != "auto" && !from.join("generation_config.json").exists() {
            anyhow::bail!(
                "--generation-config {}: no generation_config.json there (use auto, vllm or a folder holding one)",
                from.display()
            );
        }
        let Some(g) = tandem_core::GenerationConfig::from_dir(&from)? else { return Ok(Default::default()) };
        let d = tandem_server::config::SamplingDefaults::from_generation_config(&g);
        if !d.is_empty() {
            tracing::info!("sampling defaults from {}: {d:?} (under each request's own values; --generation-config vllm ignores them)", from.join("generation_config.json").display());
        }
        Ok(d)
    }
}

/// The adapters of `--lora-modules` as the server lists them, adapter `i` under engine id `i`.
fn served_adapters(l: &tandem::LoraModules) -> Vec<tandem_server::lora::ServedAdapter> {
    let adapter = |(slot, m): (usize, &tandem::LoraModule)| tandem_server::lora::ServedAdapter {
        name: m.name.clone(),
        root: m.path.to_string_lossy().into_owned(),
        parent: m.base_model_name.clone(),
        slot: slot as u32,
    };
    l.modules.iter().enumerate().map(adapter).collect()
}

/// The names the model is served under, as `vllm serve` names it.
#[derive(Debug, PartialEq)]
struct ServedNames {
    /// What responses report: the first `--served-model-name`, else the model path as given.
    name: String,
    /// The other `--served-model-name`s: listed and accepted.
    others: Vec<String>,
    /// Accepted, not listed: the directory's base name (what earlier versions served).
    aliases: Vec<String>,
    /// The model path, `root` in `/v1/models`.
    root: String,
}

impl ServedNames {
    /// `given`: the path on the command line (None: the default model, fetched to `dir`).
    fn new(given: Option<&std::path::Path>, dir: &std::path::Path, served: &[String]) -> ServedNames {
        let base = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
        let root = given.unwrap_or(dir).to_string_lossy().into_owned();
        if let Some((first, rest)) = served.split_first() {
            return ServedNames { name: first.clone(), others: rest.to_vec(), aliases: Vec::new(), root };
        }
        match given {
            Some(p) => {
                let name = p.to_string_lossy().into_owned();
                let aliases = if base != name { vec![base] } else { Vec::new() };
                ServedNames { name, others: Vec::new(), aliases, root }
            }
            None => ServedNames { name: base, others: Vec::new(), aliases: Vec::new(), root },
        }
    }
}

pub fn run(mut a: Args) -> Result<()> {
    if a.model_dir.is_some() {
        a.engine.model = a.model_dir.take();
    }
    let dir = backends::resolve_model(a.engine.model.as_deref())?;
    let mut tok = Tokenizer::from_dir(&dir)?;
    let cfg = tandem_core::ModelConfig::from_file(&dir.join("config.json"))?;
    a.check_vllm_values(&cfg, &dir)?;
    let tool_call_parser = match a.tool_call_parser.as_deref() {
        None => None,
        Some(p) => Some(ToolParser::from_name(p).ok_or_else(|| {
            anyhow::anyhow!("--tool-call-parser {p}: tandem parses {}", tool_parser::NAMES.join(", "))
        })?),
    };
    let reasoning_parser =
        match a.reasoning_parser.as_deref() {
            None => None,
            Some(p) => Some(ReasoningParser::from_name(p).ok_or_else(|| {
                anyhow::anyhow!("--reasoning-parser {p}: tandem parses {}", reasoning::NAMES.join(", "))
            })?),
        };
    match tool_call_parser {
        Some(p) => tracing::info!("--tool-call-parser {}: \"auto\" answers are read for its calls", p.name()),
        None if a.enable_auto_tool_choice => tracing::info!("--enable-auto-tool-choice: \"auto\" answers are parsed for <tool_call> blocks when the chat template writes them"),
        None => {}
    }
    if a.enforce_eager {
        tracing::info!("--enforce-eager: no CUDA graphs, every step runs eagerly");
    }
    let sampling_defaults = a.sampling_defaults(&dir)?;
    let lora = a.lora(&cfg)?;
    let timeout = match a.request_timeout_s {
        Some(t) if !(t.is_finite() && t > 0.0) => {
            anyhow::bail!("--request-timeout-s {t}: expected a positive number of seconds")
        }
        t => t.map(Duration::from_secs_f64),
    };
    tok.add_eos_ids(&cfg.eos_token_ids);
    let tok = Arc::new(tok);
    let names = ServedNames::new(a.engine.model.as_deref(), &dir, &a.served_model_name);
    let name = names.name.clone();
    let addr: SocketAddr = format!("{}:{}", a.host, a.port)
        .parse()
        .with_context(|| format!("--host {} --port {}: not an address", a.host, a.port))?;
    let server_cfg = ServerConfig {
        addr,
        api_key: a.api_key.clone(),
        max_queued_requests: a.max_queued_requests,
        max_num_seqs: a.engine.max_num_seqs,
        max_model_len: a.engine.max_model_len.unwrap_or(usize::MAX).min(cfg.max_position_embeddings),
        sampling_defaults,
        request_timeout: timeout,
        allowed_origins: a.allowed_origins.clone(),
        tool_call_parser,
        reasoning_parser,
        vocab_size: cfg.vocab_size,
        shutdown_grace: Duration::from_secs(a.shutdown_grace_s),
        served_model_names: names.others,
        model_aliases: names.aliases,
        model_root: Some(names.root),
        lora_adapters: lora.as_ref().map_or_else(Vec::new, served_adapters),
        max_loras: lora.as_ref().map_or(0, |l| l.limits.max_loras),
        runtime_lora_updating: tandem_server::lora::runtime_updating_allowed(),
        ..Default::default()
    };
    let mut engine_cfg = a.engine.engine_config(None)?;
    engine_cfg.speculative = engine_cfg.speculative.map(|s| s.for_target(&dir));
    engine_cfg.seed = a.seed;
    engine_cfg.max_cpu_loras = lora.as_ref().map(tandem::LoraModules::max_cpu_loras);
    engine_cfg.lora_modules = lora.as_ref().map_or_else(Vec::new, tandem::LoraModules::dirs);
    if let Some(endpoint) = &a.kv_events_endpoint {
        if a.engine.no_prefix_caching {
            anyhow::bail!("--kv-events-endpoint publishes the prefix cache's changes: it needs prefix caching (drop --no-prefix-caching)");
        }
        let (tx, rx) = std::sync::mpsc::channel();
        tandem_server::kv_events::spawn(endpoint, rx, a.engine.block_size)
            .map_err(|e| anyhow::anyhow!("--kv-events-endpoint: {e}"))?;
        engine_cfg.kv_events = Some(tx);
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let engine = TandemEngine::loading();
    let engine_at_exit = engine.clone();
    let served = rt.block_on(async move {
        let server = tandem_server::Server::bind(server_cfg, engine.clone(), tok.clone(), name).await?;
        tracing::info!(
            "listening on http://{} (loading {} on {})",
            server.local_addr()?,
            dir.display(),
            a.engine.backend.name()
        );
        let load_opts = LoadOptions { graphs: !a.enforce_eager, ..a.engine.load_options() };
        let (backend, tok2) = (a.engine.backend, tok.clone());
        let state = server.state();
        let loader = tokio::task::spawn_blocking(move || -> Result<()> {
            // Before the engine is set, so that no request sees a ready server without it.
            // A tokenizer llguidance cannot read costs structured output, not the server.
            let structured = match tandem_structured::Structured::from_model_dir(&dir, &tok2.eos_ids) {
                Ok(s) => Ok(Arc::new(s)),
                Err(e) => {
                    tracing::warn!("structured output and tool_choice \"required\"/named are off for this model: {e}");
                    Err(format!("this model's tokenizer cannot be used for it: {e}"))
                }
            };
            let _ = state.structured.set(structured);
            let runner = backends::load_with_lora(backend, &dir, load_opts, lora.as_ref())?;
            let (kv, geo) = (runner.kv_dtype(), runner.kv_geometry());
            tracing::info!(
                kv_cache_dtype = kv.name(),
                kv_blocks = geo.num_blocks,
                block_size = geo.block_size,
                activations = runner.activation_dtypes().x.name(),
                "KV cache"
            );
            let handle = Engine::spawn(runner, decode_fn(tok2), engine_cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
            let max_model_len = handle.max_model_len();
            engine.set(handle);
            tracing::info!(max_model_len, "model loaded; ready");
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
    });
    // The engine thread and its model worker stop, and drop the model and its device, before
    // main returns: process exit tearing the device's driver down while a step still ran on
    // another thread crashed `tandem serve --backend wgpu` on SIGTERM about once in eight runs
    // beside other GPU work (SIGSEGV, lavapipe).
    if let Some(h) = engine_at_exit.handle() {
        h.shutdown();
    }
    drop(rt);
    served
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vLLM's `auto`, `fp8`, `fp8_e4m3`, `fp8_e5m2` and our spellings of the others; vLLM's other
    /// fp8 caches are refused by name, anything else lists what is accepted; `flag()` gives back
    /// a value the parser takes.
    #[test]
    fn kv_cache_dtype_spellings() {
        for (v, want) in [
            ("auto", None),
            ("bf16", Some(KvDtype::Bf16)),
            ("bfloat16", Some(KvDtype::Bf16)),
            ("BF16", Some(KvDtype::Bf16)),
            ("f32", Some(KvDtype::F32)),
            ("float32", Some(KvDtype::F32)),
            ("fp32", Some(KvDtype::F32)),
            ("fp8", Some(KvDtype::Fp8E4m3)),
            ("FP8_E4M3", Some(KvDtype::Fp8E4m3)),
            ("fp8_e5m2", Some(KvDtype::Fp8E5m2)),
        ] {
            let got = parse_kv_cache_dtype(v).unwrap();
            assert_eq!(got, KvCacheDtype(want), "{v}");
            assert_eq!(parse_kv_cache_dtype(got.flag()).unwrap(), got);
        }
        for v in ["fp8_inc", "fp8_ds_mla"] {
            assert!(parse_kv_cache_dtype(v).unwrap_err().contains("this fp8 KV cache is not supported"), "{v}");
        }
        assert!(parse_kv_cache_dtype("half").unwrap_err().contains("expected auto, bf16"));
    }

    /// `vllm serve DIR` serves `DIR` as typed (the base name accepted too); `--served-model-name
    /// a b` serves `a`, lists and accepts `b`.
    #[test]
    fn served_names_as_vllm() {
        let dir = std::path::Path::new("/models/SmolLM2-135M");
        let n = ServedNames::new(Some(std::path::Path::new("models/SmolLM2-135M/")), dir, &[]);
        assert_eq!(
            (n.name.as_str(), n.aliases.as_slice(), n.root.as_str()),
            ("models/SmolLM2-135M/", &["SmolLM2-135M".to_string()][..], "models/SmolLM2-135M/")
        );
        let n = ServedNames::new(Some(std::path::Path::new("SmolLM2-135M")), dir, &[]);
        assert!(n.aliases.is_empty(), "{n:?}");
        let n = ServedNames::new(Some(dir), dir, &["a".into(), "b".into()]);
        assert_eq!(
            n,
            ServedNames {
                name: "a".into(),
                others: vec!["b".into()],
                aliases: vec![],
                root: "/models/SmolLM2-135M".into()
            }
        );
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: Args,
        }
        let p = <P as clap::Parser>::try_parse_from(["tandem", "DIR", "--served-model-name", "a", "b"]).unwrap();
        assert_eq!(
            (p.a.model_dir.as_deref(), p.a.served_model_name.as_slice()),
            (Some(std::path::Path::new("DIR")), &["a".to_string(), "b".to_string()][..])
        );
    }

    /// Async scheduling is on unless `--no-async-scheduling` comes last (vLLM's spelling of both).
    #[test]
    fn async_scheduling_flags() {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            e: EngineArgs,
        }
        let on = |args: &[&str]| {
            let p = <P as clap::Parser>::try_parse_from(std::iter::once("tandem").chain(args.iter().copied())).unwrap();
            p.e.engine_config(None).unwrap().async_scheduling
        };
        assert!(on(&[]));
        assert!(on(&["--async-scheduling"]));
        assert!(!on(&["--no-async-scheduling"]));
        assert!(!on(&["--async-scheduling", "--no-async-scheduling"]));
        assert!(on(&["--no-async-scheduling", "--async-scheduling"]));
    }

    /// `--speculative-config` takes vLLM's JSON; what the engine cannot honour stops the start.
    #[test]
    fn speculative_config_flag() {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            e: EngineArgs,
        }
        let parse =
            |args: &[&str]| <P as clap::Parser>::try_parse_from(std::iter::once("tandem").chain(args.iter().copied()));
        assert_eq!(parse(&[]).unwrap().e.engine_config(None).unwrap().speculative, None);
        let p = parse(&["--speculative-config", r#"{"method": "ngram", "num_speculative_tokens": 3}"#]).unwrap();
        assert_eq!(p.e.engine_config(None).unwrap().speculative.map(|s| s.num_speculative_tokens), Some(3));
        let e = parse(&["--speculative-config", r#"{"method": "eagle3", "num_speculative_tokens": 3}"#]).err().unwrap();
        assert!(e.to_string().contains("eagle3"), "{e}");
    }
}
