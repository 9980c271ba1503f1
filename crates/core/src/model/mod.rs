//! The forward pass, written once against [`Backend`], over decoder layers each family
//! composes from shared pieces ([`layers`]): one file per family ([`llama`]: Llama, Mistral,
//! Qwen2, SmolLM; [`qwen3`]; [`qwen3_moe`]; [`mixtral`]; [`gemma3`]) says what its layer has
//! and where its weights are. One call runs a
//! flattened batch: prefill chunks and decode tokens of many sequences, each with its own
//! positions and block table.
//!
//! Adding a family: a file here with its `FAMILIES` (architecture and `model_type` names, and
//! the model-wide traits of [`Family`]) and
//! a `layer` function built from [`layers::Loader`]'s pieces, one row in [`Model::from_weights`]'s
//! table, its config fields in `config.rs`, a seeded shape in `tandem-models`' random_model.rs,
//! and golden data from HF transformers (tests/make_golden.sh).

mod gemma3;
mod layers;
mod llama;
mod mixtral;
mod qwen3;
mod qwen3_moe;

use std::path::Path;

use crate::backend::{
    kv_dtype_names, AttnArgs, Backend, DType, GraphId, KvDest, KvDtype, KvGeometry, NormIn, U32Group, WorkspaceLimits,
};
use crate::batch::ForwardBatch;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::memory::{plan_kv_blocks, DeviceMemory, KvNeed};
use crate::meta::{self, MetaStaging, PadRows};
use crate::sampling::{logprobs_rows, sample_row, sample_rows_masked, RowMasks, SampleSpec, TokenLogprobs};
use crate::weights::Weights;
use layers::{Ffn, FfnBufs, Layer, Loader, QkvBufs};

/// One architecture the model layer runs: `architectures[0]` of config.json and the
/// `model_type` that names it where `architectures` is absent.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    pub architecture: &'static str,
    pub model_type: &'static str,
    /// The input embedding is multiplied by √hidden, rounded to the embedding's type as HF
    /// does (Gemma); the tied head reads the table unscaled.
    pub scaled_embedding: bool,
    /// Every RMS norm weight is stored as `w - 1`: the norm multiplies by `1 + w` (Gemma).
    pub norm_plus_one: bool,
}

impl Family {
    /// A family with Llama's model-wide traits (an unscaled embedding, plain norm weights).
    pub const fn new(architecture: &'static str, model_type: &'static str) -> Family {
        Family { architecture, model_type, scaled_embedding: false, norm_plus_one: false }
    }
}

/// Every architecture this build runs, family file by family file.
pub fn families() -> impl Iterator<Item = &'static Family> {
    llama::FAMILIES
        .iter()
        .chain(qwen3::FAMILIES)
        .chain(qwen3_moe::FAMILIES)
        .chain(mixtral::FAMILIES)
        .chain(gemma3::FAMILIES)
}

/// What the engine needs from a loaded model, whatever the backend. Object-safe.
pub trait ModelRunner: Send {
    fn config(&self) -> &ModelConfig;
    fn backend_name(&self) -> &'static str;
    fn kv_geometry(&self) -> KvGeometry;
    /// What the KV cache stores (its bytes per token follow it). The default is for runners
    /// without a real cache (test doubles); a loaded model reports what it allocated.
    fn kv_dtype(&self) -> KvDtype {
        KvDtype::F32
    }
    /// Most tokens one [`ModelRunner::forward`] accepts.
    fn max_batch_tokens(&self) -> usize;
    /// Most sequences one forward accepts.
    fn max_seqs(&self) -> usize;
    /// Most logit rows one forward returns (at least `max_seqs`; the rest serve prompt logprobs).
    fn max_logit_rows(&self) -> usize {
        self.max_seqs()
    }
    /// Kernels the backend has launched so far, where it counts them ([`Device::launch_count`]).
    fn launch_count(&self) -> Option<u64> {
        None
    }
    /// What a projection's input is rounded to before it meets this model's weights
    /// ([`Storage::matmul_operand`]): f32 (no rounding) unless the backend computes in 16 bits.
    fn matmul_operand(&self) -> DType {
        DType::F32
    }
    /// What the projections' stored inputs are ([`ActDtypes`]); f32 by default.
    fn activation_dtypes(&self) -> ActDtypes {
        ActDtypes { x: DType::F32, act: DType::F32, last_normed: DType::F32 }
    }
    /// Runs the batch, writing K/V into the cache; returns f32 logits `[logit_rows.len(), vocab]`.
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>>;
    /// Runs the batch and turns logit row `r` into a token id by `specs[r]` (one spec per
    /// logit row) where the logits are, so that only ids leave the device. The ids equal
    /// [`sample_row`] of the rows [`ModelRunner::forward`] would return. The default is that:
    /// `forward`, then the host.
    fn forward_sampled(&mut self, batch: &ForwardBatch, specs: &[SampleSpec]) -> Result<Vec<u32>> {
        let (logits, vocab) = host_logits(self, batch, specs)?;
        Ok(logits.chunks_exact(vocab).zip(specs).map(|(row, s)| sample_row(row, s)).collect())
    }
    /// As [`ModelRunner::forward_sampled`], some rows masked (structured output) or edited
    /// (penalties, `logit_bias`, bans: the edits of [`RowMasks`]). `masks` is called once, after the forward is on its way and before the sample needs it, so a caller
    /// can compute the masks while the device runs; its error fails the step. The ids equal
    /// [`crate::sampling::sample_rows_masked`] of what [`ModelRunner::forward`] would return.
    /// The default: `forward`, then the host.
    fn forward_sampled_masked(
        &mut self,
        batch: &ForwardBatch,
        specs: &[SampleSpec],
        masks: &mut dyn FnMut() -> Result<RowMasks>,
    ) -> Result<Vec<u32>> {
        let (logits, vocab) = host_logits(self, batch, specs)?;
        let m = masks()?;
        m.check(specs.len(), vocab).map_err(Error::Batch)?;
        Ok(sample_rows_masked(&logits, vocab, specs, &m))
    }
    /// As [`ModelRunner::forward_sampled_masked`], and for each row with `top_n[r] = Some(n)`
    /// the sampled token's logprob and top `n` of the raw logits
    /// ([`crate::sampling::logprobs_row`]), computed where the logits are. The default:
    /// `forward`, then the host.
    fn forward_sampled_logprobs(
        &mut self,
        batch: &ForwardBatch,
        specs: &[SampleSpec],
        masks: &mut dyn FnMut() -> Result<RowMasks>,
        top_n: &[Option<usize>],
    ) -> Result<(Vec<u32>, Vec<Option<TokenLogprobs>>)> {
        if top_n.len() != specs.len() {
            return Err(Error::Batch(format!("{} logprob counts for {} rows", top_n.len(), specs.len())));
        }
        let (logits, vocab) = host_logits(self, batch, specs)?;
        let m = masks()?;
        m.check(specs.len(), vocab).map_err(Error::Batch)?;
        let ids = sample_rows_masked(&logits, vocab, specs, &m);
        let lps = logprobs_rows(&logits, vocab, &ids, top_n);
        Ok((ids, lps))
    }
}

/// The default samplers' start: the specs checked, the forward run, its logits (and the
/// vocabulary, at least 1) checked against the rows.
fn host_logits<M: ModelRunner + ?Sized>(
    m: &mut M,
    batch: &ForwardBatch,
    specs: &[SampleSpec],
) -> Result<(Vec<f32>, usize)> {
    check_specs(batch, specs)?;
    let logits = m.forward(batch)?;
    let vocab = m.config().vocab_size.max(1);
    if logits.len() != specs.len() * vocab {
        return Err(Error::Batch(format!(
            "forward returned {} logits for {} rows of vocabulary {vocab}",
            logits.len(),
            specs.len()
        )));
    }
    Ok((logits, vocab))
}

fn check_specs(batch: &ForwardBatch, specs: &[SampleSpec]) -> Result<()> {
    if specs.len() != batch.logit_rows.len() {
        return Err(Error::Batch(format!("{} sampling specs for {} logit rows", specs.len(), batch.logit_rows.len())));
    }
    Ok(())
}

/// Sizes fixed at load time.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    pub max_batch_tokens: usize,
    pub max_seqs: usize,
    /// KV blocks in the pool; 0 sizes the pool from the backend's memory (see
    /// `gpu_memory_utilization`), or, where the backend cannot tell, to [`AUTO_KV_BYTES`].
    pub num_kv_blocks: usize,
    pub block_size: usize,
    /// Fraction of the device's TOTAL memory for weights, activations, step workspace and KV
    /// together (vLLM's meaning) when `num_kv_blocks` is 0; see [`crate::memory`].
    pub gpu_memory_utilization: f32,
    /// The context limit (prompt + output); None: the model's `max_position_embeddings`.
    /// Sizes block tables and the attention workspace, and the KV pool must hold one sequence
    /// this long.
    pub max_model_len: Option<usize>,
    /// Logit rows beyond `max_seqs` one forward can return, for requests that score their
    /// prompt (prompt logprobs): `[max_seqs + prompt_logit_rows, vocab]` f32 of scratch.
    pub prompt_logit_rows: usize,
    /// The KV cache's element type; None: the backend's default (`Storage::kv_dtypes()[0]`:
    /// bf16 on CUDA, f32 elsewhere). A type the backend does not store fails the load.
    pub kv_dtype: Option<KvDtype>,
    /// Capture each decode bucket once at load and replay it ([`Device::supports_graphs`]:
    /// CUDA graphs); false runs every step eagerly (`--enforce-eager`). With graphs, decode
    /// steps are padded to their bucket (`pad_decode`). Backends that do not capture ignore it.
    pub graphs: bool,
    /// Pad decode steps to a bucket even without graphs (tests: padded decode must give the
    /// same ids as unpadded on every backend). Graphs imply it.
    pub pad_decode: bool,
    /// The longest context a padded (graph) decode step serves; a step with a longer one
    /// runs eagerly. It fixes the block-table stride and the attention's partition count of
    /// the captured steps, so it bounds what each step uploads and launches for nothing.
    pub graph_max_context: usize,
}

/// Extra logit rows by default: a 128-token slice of a scored prompt per step.
pub const DEFAULT_PROMPT_LOGIT_ROWS: usize = 128;

/// Context bound of padded decode steps by default (vLLM's `max_seq_len_to_capture`).
pub const DEFAULT_GRAPH_MAX_CONTEXT: usize = 8192;

/// Capturing stops (the remaining buckets run eagerly) once it has taken this long at load.
const CAPTURE_BUDGET: std::time::Duration = std::time::Duration::from_secs(60);

/// Decode steps padded to a batch-size bucket, so that every step of one bucket has the same
/// shapes and scalars (what a captured graph fixes). Padding rows are token 0 at position 0
/// of their own one-block table, the reserved `scratch_block` (never handed to the engine):
/// they write their K/V there and nowhere else, and their logits and ids are dropped.
#[derive(Debug, Clone)]
struct Padding {
    /// Ascending: powers of two below the largest, then the most rows a step may have.
    buckets: Vec<usize>,
    scratch_block: u32,
    /// Block-table entries per row of a padded step (`max_context / block_size`).
    stride: usize,
    /// The attention's context bound for a padded step; longer decode steps run eagerly.
    max_context: usize,
}

impl Padding {
    /// A padded step of `rows` rows: what its launches depend on.
    fn shape(&self, rows: usize) -> StepShape {
        StepShape {
            tokens: rows,
            seqs: rows,
            logit_rows: rows,
            max_blocks: self.stride,
            max_context: self.max_context,
            decodes: rows,
        }
    }
    /// What its padding rows are, for the staging layout.
    fn rows(&self, block_size: usize) -> PadRows {
        // A block size beyond u32 makes the scratch slot overflow: an error when staged.
        PadRows {
            scratch_block: self.scratch_block,
            stride: self.stride,
            block_size: u32::try_from(block_size).unwrap_or(u32::MAX),
        }
    }
}

/// Batch-size buckets up to `cap`: 1, 2, 4, ... below cap, then cap.
fn buckets(cap: usize) -> Vec<usize> {
    let mut v: Vec<usize> =
        std::iter::successors(Some(1usize), |b| b.checked_mul(2)).take_while(|&b| b < cap).collect();
    v.push(cap);
    v
}

/// What a step's launches depend on besides buffer contents: what a graph fixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StepShape {
    tokens: usize,
    seqs: usize,
    logit_rows: usize,
    max_blocks: usize,
    max_context: usize,
    /// Leading tokens that are each a one-token sequence (`AttnArgs::decode_tokens`).
    decodes: usize,
}

/// KV pool size for backends that cannot report free memory (reference, wgpu).
pub const AUTO_KV_BYTES: u64 = 1 << 30;

/// Bytes of one KV block: K and V, every layer, `block_size` tokens of `kv_heads * head_dim`
/// elements of `dtype`. A bf16 cache's block is half an f32 one, so the same memory holds twice
/// the blocks.
pub fn kv_block_bytes(cfg: &ModelConfig, block_size: usize, dtype: KvDtype) -> u64 {
    (2 * cfg.num_hidden_layers * block_size * cfg.kv_dim() * dtype.size()) as u64
}

/// The pool's block count: planned from the device's memory where it was measured
/// ([`plan_kv_blocks`]), else [`AUTO_KV_BYTES`] worth, never more than `need.max_blocks`.
pub fn kv_pool_blocks(
    measured: Option<&DeviceMemory>,
    gpu_memory_utilization: f32,
    need: &KvNeed,
) -> std::result::Result<usize, String> {
    let blocks = match measured {
        Some(m) => plan_kv_blocks(m, gpu_memory_utilization, need)?,
        None => ((AUTO_KV_BYTES / need.block_bytes.max(1)) as usize).min(need.max_blocks),
    };
    if blocks == 0 {
        return Err(format!("AUTO_KV_BYTES holds no KV block of {} bytes; pass num_kv_blocks", need.block_bytes));
    }
    Ok(blocks)
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            max_batch_tokens: 512,
            max_seqs: 64,
            num_kv_blocks: 256,
            block_size: 16,
            gpu_memory_utilization: 0.9,
            max_model_len: None,
            prompt_logit_rows: DEFAULT_PROMPT_LOGIT_ROWS,
            kv_dtype: None,
            graphs: true,
            pad_decode: false,
            graph_max_context: DEFAULT_GRAPH_MAX_CONTEXT,
        }
    }
}

/// The element types of the stored activations a matmul reads (the rest are f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActDtypes {
    /// The norms' output, read by the q/k/v and gate/up projections.
    pub x: DType,
    /// The MLP activation, read by the down projection.
    pub act: DType,
    /// The final norm's rows, read by the head.
    pub last_normed: DType,
}

/// What `b` stores an activation in when `readers` are the weight types of every matmul that
/// reads it: the backend's choice for that type where they agree, else f32.
fn stored_as<B: Backend>(b: &B, readers: &[DType]) -> DType {
    match readers.split_first() {
        Some((&first, rest)) if rest.iter().all(|&d| d == first) => b.activation_dtype(first),
        _ => DType::F32,
    }
}

/// Activation and metadata buffers, allocated once for the largest batch.
struct Scratch<B: Backend> {
    h: B::Buf,           // [T, hidden] residual stream
    x: B::Buf,           // [T, hidden] normed (ActDtypes::x)
    q: B::Buf,           // [T, q_dim]
    k: B::Buf,           // [T, kv_dim]
    v: B::Buf,           // [T, kv_dim]
    attn: B::Buf,        // [T, q_dim]
    o: B::Buf,           // [T, hidden]
    gate: B::Buf,        // [T, intermediate]
    up: B::Buf,          // [T, intermediate]
    act: B::Buf,         // [T, intermediate] (ActDtypes::act)
    last: B::Buf,        // [S, hidden] rows that need logits
    last_normed: B::Buf, // [S, hidden] (ActDtypes::last_normed)
    logits: B::Buf,      // [S, vocab]
    /// The raw q and k projections `[T, q_dim]`, `[T, kv_dim]`, for a family that norms them
    /// per head before rope (`layers::AttnOptions::qk_norm`).
    qk_raw: Option<(B::Buf, B::Buf)>,
    /// A mixture of experts' router logits and routing weights `[T, experts]`, and one
    /// expert's output `[T, hidden]` (`layers::Moe::forward`).
    moe: Option<(B::Buf, B::Buf, B::Buf)>,
    /// `[T, hidden]`: a block's output before its norm, for a family that norms it
    /// (`layers::Layer::out_norms`).
    pre_norm: Option<B::Buf>,
    /// The step's metadata, the regions of `meta::layout` (`meta::TOKENS`, ...): token ids,
    /// positions, slots and token_seq `[T]`, logit rows `[S]`, block tables
    /// `[max_seqs, max_blocks_cap]`; one staging buffer, one upload.
    meta: U32Group<B::Buf>,
}

/// The model's former name, from when it ran the Llama family only.
pub type LlamaModel<B> = Model<B>;

pub struct Model<B: Backend> {
    backend: B,
    cfg: ModelConfig,
    opts: LoadOptions,
    geometry: KvGeometry,
    kv_dtype: KvDtype,
    matmul_operand: DType,
    act_dtypes: ActDtypes,
    max_blocks_cap: usize,
    embed: B::Buf,
    lm_head: Option<B::Buf>,
    final_norm: B::Buf,
    inv_freq: B::Buf,
    /// The sliding layers' rope table where they have their own (`ModelConfig::local_rope`).
    local_inv_freq: Option<B::Buf>,
    /// √hidden in the embedding's type, where the family scales the embedding.
    embed_scale: Option<f32>,
    layers: Vec<Layer<B>>,
    /// (K, V) per layer.
    caches: Vec<(B::Buf, B::Buf)>,
    s: Scratch<B>,
    /// The pool as the engine sees it: `geometry` less the padding's scratch block.
    kv_view: KvGeometry,
    pad: Option<Padding>,
    /// One per bucket of `pad`: the captured decode step, where capture worked.
    graphs: Vec<Option<GraphId>>,
    /// Writes each step into `s.meta`'s staging memory (and knows how much of each padded
    /// block-table row there already is the scratch block).
    staging: MetaStaging,
}

impl<B: Backend> Model<B> {
    /// Loads `dir` (config.json + safetensors) onto `backend`.
    pub fn load(backend: B, dir: &Path, opts: LoadOptions) -> Result<Self> {
        let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
        let weights = Weights::open(dir)?;
        Self::from_weights(backend, cfg, &weights, opts)
    }

    pub fn from_weights(backend: B, cfg: ModelConfig, w: &Weights, opts: LoadOptions) -> Result<Self> {
        if opts.max_batch_tokens == 0 || opts.max_seqs == 0 || opts.block_size == 0 || opts.max_model_len == Some(0) {
            return Err(Error::Batch(format!("load options must be positive: {opts:?}")));
        }
        // inter: the widest MLP (dense, or one expert), what the activation buffers hold.
        let (d, qd, kvd, inter, vocab) =
            (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim(), cfg.max_intermediate(), cfg.vocab_size);
        let b = &backend;
        let kv_dtype = opts.kv_dtype.or_else(|| b.kv_dtypes().first().copied()).unwrap_or(KvDtype::F32);
        if !b.kv_dtypes().contains(&kv_dtype) {
            return Err(Error::backend(
                b.name(),
                format!(
                    "a {} KV cache is not supported on {} (it stores {}; a bf16 cache needs --backend cuda)",
                    kv_dtype.name(),
                    b.name(),
                    kv_dtype_names(b.kv_dtypes())
                ),
            ));
        }
        let graphs_on = opts.graphs && b.supports_graphs();
        let padding = graphs_on || opts.pad_decode;
        let free_before_weights = b.free_memory();
        let up = |name: &str, shape: &[usize]| -> Result<B::Buf> { b.upload_weight(&w.get(name, shape)?) };
        let embed_view = w.get("model.embed_tokens.weight", &[vocab, d])?;
        // What this backend rounds a projection's input to, for weights of this model's type.
        let matmul_operand = b.matmul_operand(embed_view.dtype);
        let embed = b.upload_weight(&embed_view)?;
        // The weight types each stored activation meets (Storage::activation_dtype): x feeds
        // q/k/v and gate/up, act feeds down, the final norm's rows feed the head.
        let mut head_reader = embed_view.dtype;
        let lm_head = if w.contains("lm_head.weight") && !cfg.tie_word_embeddings {
            let head = w.get("lm_head.weight", &[vocab, d])?;
            head_reader = head.dtype;
            Some(b.upload_weight(&head)?)
        } else if cfg.tie_word_embeddings {
            None
        } else {
            Some(up("lm_head.weight", &[vocab, d])?) // fails with a clear "missing" error
        };
        // The family's layers: which pieces, under which names (one file per family).
        let mut ld = Loader::new(b, w, &cfg);
        let arch = cfg.architecture.as_str();
        let table: [(&'static [Family], layers::LayerFn<B>); 5] = [
            (qwen3::FAMILIES, qwen3::layer),
            (qwen3_moe::FAMILIES, qwen3_moe::layer),
            (mixtral::FAMILIES, mixtral::layer),
            (gemma3::FAMILIES, gemma3::layer),
            (llama::FAMILIES, llama::layer),
        ];
        let found =
            table.into_iter().find_map(|(fams, layer)| Some((fams.iter().find(|f| f.architecture == arch)?, layer)));
        let Some((family, layer)) = found else {
            return Err(Error::config(Path::new("config.json"), format!("no model layer for architecture `{arch}`")));
        };
        ld.norm_plus_one = family.norm_plus_one;
        let layers = (0..cfg.num_hidden_layers).map(|i| layer(&mut ld, i)).collect::<Result<Vec<_>>>()?;
        let qk_norm = layers.iter().any(|l| l.attn.qk_norm.is_some());
        let out_norms = layers.iter().any(|l| l.out_norms.is_some());
        let final_norm = ld.norm("model.norm.weight")?;
        let (x_readers, act_readers) = (std::mem::take(&mut ld.x_readers), std::mem::take(&mut ld.act_readers));
        drop(ld);
        let rope_table = |freqs: &[f32]| -> Result<B::Buf> {
            let mut buf = b.alloc_f32(freqs.len())?;
            b.write_f32(&mut buf, freqs)?;
            Ok(buf)
        };
        let inv_freq = rope_table(&cfg.rope_inv_freq())?;
        let local_inv_freq = cfg.local_rope_inv_freq().map(|f| rope_table(&f)).transpose()?;
        // HF: sqrt(hidden) as an f32 tensor, cast to the embedding's type, times the rows.
        let embed_scale = family.scaled_embedding.then(|| {
            let s = (d as f64).sqrt() as f32;
            match embed_view.dtype {
                DType::BF16 => half::bf16::from_f32(s).to_f32(),
                DType::F16 => half::f16::from_f32(s).to_f32(),
                DType::F32 => s,
            }
        });
        let free_after_weights = b.free_memory();
        let t = opts.max_batch_tokens;
        let sq = opts.max_seqs;
        let rows = sq + opts.prompt_logit_rows;
        let max_context = opts.max_model_len.unwrap_or(usize::MAX).min(cfg.max_position_embeddings).max(1);
        let max_blocks_cap = max_context.div_ceil(opts.block_size).max(1);
        let bt_len = sq
            .checked_mul(max_blocks_cap)
            .ok_or_else(|| Error::Batch(format!("{sq} sequences x {max_blocks_cap} blocks overflow")))?;
        let meta_layout = meta::layout(t, rows, bt_len)?;
        let act_dtypes = ActDtypes {
            x: stored_as(b, &x_readers),
            act: stored_as(b, &act_readers),
            last_normed: stored_as(b, &[head_reader]),
        };
        let s = Scratch {
            h: b.alloc_f32(t * d)?,
            x: b.alloc_activation(act_dtypes.x, t * d)?,
            q: b.alloc_f32(t * qd)?,
            k: b.alloc_f32(t * kvd)?,
            v: b.alloc_f32(t * kvd)?,
            attn: b.alloc_f32(t * qd)?,
            o: b.alloc_f32(t * d)?,
            gate: b.alloc_f32(t * inter)?,
            up: b.alloc_f32(t * inter)?,
            act: b.alloc_activation(act_dtypes.act, t * inter)?,
            last: b.alloc_f32(rows * d)?,
            last_normed: b.alloc_activation(act_dtypes.last_normed, rows * d)?,
            logits: b.alloc_f32(rows * vocab)?,
            qk_raw: if qk_norm { Some((b.alloc_f32(t * qd)?, b.alloc_f32(t * kvd)?)) } else { None },
            pre_norm: if out_norms { Some(b.alloc_f32(t * d)?) } else { None },
            moe: match &cfg.moe {
                Some(m) => {
                    Some((b.alloc_f32(t * m.num_experts)?, b.alloc_f32(t * m.num_experts)?, b.alloc_f32(t * d)?))
                }
                None => None,
            },
            meta: b.alloc_u32_group(&meta_layout)?,
        };
        if s.meta.parts.len() != meta::REGIONS {
            return Err(Error::backend(
                b.name(),
                format!("alloc_u32_group gave {} buffers for {} regions", s.meta.parts.len(), meta::REGIONS),
            ));
        }
        let limits = WorkspaceLimits {
            max_tokens: t,
            max_seqs: sq,
            max_logit_rows: rows,
            max_context: max_blocks_cap * opts.block_size,
            num_heads: cfg.num_attention_heads,
            head_dim: cfg.head_dim,
            // Only an f32 x needs scratch (a 16-bit copy for the tensor cores above 128 rows):
            // the attention output always, the others where they are stored in f32.
            max_k: [
                (true, qd),
                (act_dtypes.x == DType::F32, d),
                (act_dtypes.act == DType::F32, inter),
                (act_dtypes.last_normed == DType::F32, d),
            ]
            .into_iter()
            .filter_map(|(f32_x, k)| f32_x.then_some(k))
            .max()
            .unwrap_or(qd),
            max_n: vocab.max(qd + 2 * kvd).max(2 * inter).max(d).max(cfg.moe.as_ref().map_or(0, |m| m.num_experts)),
            kv_dtype,
            moe: cfg.moe.as_ref().map(|m| crate::backend::MoeLimits {
                experts: m.num_experts,
                top_k: m.top_k,
                hidden: d,
                inter: m.intermediate_size,
            }),
        };
        let workspace = b.reserve_workspace(&limits)?;
        if workspace > 0 {
            tracing::info!(mib = workspace >> 20, ?limits, "step workspace reserved");
        }
        let mut geometry = KvGeometry {
            num_blocks: opts.num_kv_blocks,
            block_size: opts.block_size,
            num_kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
        };
        if geometry.num_blocks == 0 {
            let measured = match (b.total_memory(), free_before_weights, free_after_weights, b.free_memory()) {
                (Some(total), Some(free_before_weights), Some(free_after_weights), Some(free_now)) => {
                    Some(DeviceMemory { total, free_before_weights, free_after_weights, free_now })
                }
                _ => None,
            };
            // Never more than every sequence at full context needs.
            let useful = sq * max_blocks_cap;
            let block_bytes = kv_block_bytes(&cfg, opts.block_size, kv_dtype);
            // The padding's scratch block comes out of the same memory.
            let extra = padding as usize;
            let need = KvNeed {
                block_bytes,
                min_blocks: max_blocks_cap + extra,
                max_blocks: useful + extra,
                max_context: limits.max_context,
            };
            geometry.num_blocks = kv_pool_blocks(measured.as_ref(), opts.gpu_memory_utilization, &need)
                .map_err(|e| Error::backend(b.name(), e))?
                .saturating_sub(extra)
                .max(1);
            tracing::info!(
                blocks = geometry.num_blocks,
                block_size = opts.block_size,
                kv_dtype = kv_dtype.name(),
                mib = (geometry.num_blocks as u64 * block_bytes) >> 20,
                "KV cache sized"
            );
        }
        let kv_view = geometry;
        let pad = padding.then(|| {
            // A padded step's context bound, whole blocks, never beyond the context limit.
            let stride =
                opts.graph_max_context.min(limits.max_context).div_ceil(opts.block_size).clamp(1, max_blocks_cap);
            geometry.num_blocks += 1;
            Padding {
                buckets: buckets(sq.min(t)),
                scratch_block: kv_view.num_blocks as u32,
                stride,
                max_context: stride * opts.block_size,
            }
        });
        let mut caches = Vec::with_capacity(cfg.num_hidden_layers);
        for _ in 0..cfg.num_hidden_layers {
            caches.push((b.alloc_kv_as(geometry, kv_dtype)?, b.alloc_kv_as(geometry, kv_dtype)?));
        }
        let graphs = vec![None; pad.as_ref().map_or(0, |p| p.buckets.len())];
        let staging = MetaStaging::new(meta_layout, sq);
        let mut model = Model {
            backend,
            cfg,
            opts,
            geometry,
            kv_dtype,
            matmul_operand,
            act_dtypes,
            max_blocks_cap,
            embed,
            lm_head,
            final_norm,
            inv_freq,
            local_inv_freq,
            embed_scale,
            layers,
            caches,
            s,
            kv_view,
            pad,
            graphs,
            staging,
        };
        if graphs_on {
            model.capture_graphs()?;
        }
        Ok(model)
    }

    /// Captures every bucket's decode step (largest first, within [`CAPTURE_BUDGET`]). Each is
    /// run once eagerly on a step of padding rows only (they touch only the scratch block),
    /// then recorded. If one capture fails, every bucket runs eagerly (logged: a backend that
    /// failed once is not trusted with the others); only a failure of the final sync (a lost
    /// device) fails the load.
    fn capture_graphs(&mut self) -> Result<()> {
        let Some(pad) = self.pad.clone() else { return Ok(()) };
        let start = std::time::Instant::now();
        let launches_before = self.backend.launch_count();
        for (i, &rows) in pad.buckets.iter().enumerate().rev() {
            if start.elapsed() > CAPTURE_BUDGET {
                tracing::warn!(
                    budget_s = CAPTURE_BUDGET.as_secs(),
                    left = i + 1,
                    "graph capture over its time budget: the smaller decode buckets run eagerly"
                );
                break;
            }
            match self.capture_bucket(&pad, rows) {
                Ok(g) => self.graphs[i] = Some(g),
                Err(e) => {
                    tracing::warn!(rows, error = %e, "capturing the decode step failed: decode steps run eagerly");
                    self.graphs.iter_mut().for_each(|g| *g = None);
                    break;
                }
            }
        }
        self.backend.sync()?;
        let captured: Vec<usize> =
            pad.buckets.iter().zip(&self.graphs).filter(|(_, g)| g.is_some()).map(|(b, _)| *b).collect();
        tracing::info!(ms = start.elapsed().as_millis() as u64, ?captured, max_context = pad.max_context, launches = ?launches_before.zip(self.backend.launch_count()).map(|(a, b)| b - a), "decode graphs captured");
        Ok(())
    }

    /// Runs a step of `rows` padding rows and no real one (they touch only the scratch block)
    /// eagerly, then records it.
    fn capture_bucket(&mut self, pad: &Padding, rows: usize) -> Result<GraphId> {
        let shape = pad.shape(rows);
        self.upload_padded(
            &ForwardBatch { max_blocks: pad.stride, ..Default::default() },
            pad.rows(self.opts.block_size),
            rows,
        )?;
        self.launch(shape)?;
        self.backend.begin_capture()?;
        let recorded = self.launch(shape);
        let graph = self.backend.end_capture();
        recorded?;
        graph
    }

    /// The bucket index a decode step pads to: every sequence one token with its logits, in
    /// order, within the padding's context bound and largest bucket. None: run as it is.
    fn decode_bucket(&self, batch: &ForwardBatch) -> Option<usize> {
        let pad = self.pad.as_ref()?;
        let n = batch.num_tokens();
        let in_order = |v: &[u32]| v.iter().enumerate().all(|(i, &x)| x as usize == i);
        if batch.num_seqs() != n
            || batch.logit_rows.len() != n
            || !in_order(&batch.token_seq)
            || !in_order(&batch.logit_rows)
        {
            return None;
        }
        if batch.positions.iter().any(|&p| p as usize >= pad.max_context) {
            return None;
        }
        pad.buckets.iter().position(|&b| b >= n)
    }

    /// The decode buckets and which of them replay a captured graph (tests, logs).
    pub fn decode_buckets(&self) -> Vec<(usize, bool)> {
        match &self.pad {
            Some(p) => p.buckets.iter().zip(&self.graphs).map(|(&b, g)| (b, g.is_some())).collect(),
            None => vec![],
        }
    }

    /// K then V of every layer, f32, over the blocks the engine owns (not the padding's
    /// scratch block): tests check that padding rows write nowhere else.
    pub fn read_kv_pool(&self) -> Result<Vec<f32>> {
        let n = self.kv_view.layer_elems();
        let mut out = Vec::with_capacity(2 * n * self.caches.len());
        for (k, v) in &self.caches {
            out.extend_from_slice(&self.backend.read_kv(k, self.geometry)?[..n]);
            out.extend_from_slice(&self.backend.read_kv(v, self.geometry)?[..n]);
        }
        Ok(out)
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Longest sequence (in tokens) one block-table row can describe.
    pub fn max_context(&self) -> usize {
        self.max_blocks_cap * self.opts.block_size
    }

    /// Queues the whole forward pass on the backend; logits are left in `self.s.logits`, the
    /// batch's logit rows first (a padded step's padding rows after them). A decode step is
    /// padded to its bucket where padding is on, and replays the bucket's graph where one was
    /// captured; every other step runs as it is.
    fn record(&mut self, batch: &ForwardBatch) -> Result<()> {
        if let Some(i) = self.decode_bucket(batch) {
            let pad = self.pad.as_ref().expect("decode_bucket implies padding");
            let rows = pad.buckets[i];
            let (shape, pad_rows) = (pad.shape(rows), pad.rows(self.opts.block_size));
            self.upload_padded(batch, pad_rows, rows)?;
            return match self.graphs[i] {
                Some(g) => match self.backend.replay(g) {
                    // A replay that could not be queued queued nothing: run the step eagerly,
                    // and every later one (a graph that failed once is not trusted again).
                    Err(e) if !e.is_fatal() => {
                        tracing::warn!(rows, error = %e, "replaying the decode graph failed: decode steps run eagerly from now on");
                        self.graphs.iter_mut().for_each(|g| *g = None);
                        self.launch(shape)
                    }
                    r => r,
                },
                None => self.launch(shape),
            };
        }
        self.upload(batch)?;
        let max_context = batch.positions.iter().copied().max().unwrap_or(0) as usize + 1;
        self.launch(StepShape {
            tokens: batch.num_tokens(),
            seqs: batch.num_seqs(),
            logit_rows: batch.logit_rows.len(),
            max_blocks: batch.max_blocks,
            max_context,
            decodes: crate::batch::leading_decodes(&batch.token_seq),
        })
    }

    /// The step's metadata into its buffers: staged in the group's host memory, then one
    /// upload (what a replay reads).
    fn upload(&mut self, batch: &ForwardBatch) -> Result<()> {
        let (b, s) = (&self.backend, &mut self.s);
        let used = self.staging.stage_batch(b.u32_staging(&mut s.meta)?, batch)?;
        b.upload_u32_group(&mut s.meta, &used)
    }

    /// A decode step (`decode_bucket`) padded to `rows` rows, written straight into the staging
    /// memory (no padded `ForwardBatch` is built, nothing allocated), then one upload.
    fn upload_padded(&mut self, batch: &ForwardBatch, pad: PadRows, rows: usize) -> Result<()> {
        let (b, s) = (&self.backend, &mut self.s);
        let used = self.staging.stage_padded(b.u32_staging(&mut s.meta)?, batch, pad, rows)?;
        b.upload_u32_group(&mut s.meta, &used)
    }

    /// Every op of the forward pass for a step of this shape, on the uploaded metadata: no
    /// upload, no read, nothing from the batch but `shape` (so it can be captured).
    fn launch(&mut self, shape: StepShape) -> Result<()> {
        let (b, c, s) = (&self.backend, &self.cfg, &mut self.s);
        let m = &s.meta.parts;
        let (ids, positions, slots, token_seq, block_tables, logit_rows) = (
            &m[meta::TOKENS],
            &m[meta::POSITIONS],
            &m[meta::SLOTS],
            &m[meta::TOKEN_SEQ],
            &m[meta::BLOCK_TABLES],
            &m[meta::LOGIT_ROWS],
        );
        let t = shape.tokens;
        let (d, qd) = (c.hidden_size, c.q_dim());
        let n_out = shape.logit_rows;
        let seqs = shape.seqs;
        let max_context = shape.max_context;

        b.embedding(&self.embed, ids, &mut s.h, t, d)?;
        if let Some(scale) = self.embed_scale {
            b.scale(&mut s.h, scale, t * d)?;
        }
        // Where the backend fuses norms into the fused projections (`FusedOps::fuses_norm`),
        // each residual add happens in the projection that produces it (`matmul_residual`,
        // which also writes h ∘ gamma of the next norm into x) and each norm in the projection
        // that consumes it (`NormIn`): per layer, o and down, then qkv and gate/up, with no
        // norm op between. Otherwise each residual add is fused with the norm that follows it
        // (`add_rms_norm`): after attention with the post-attention norm, after the MLP with
        // the next layer's input norm; the last layer's MLP residual is added alone.
        let fused_norm = b.fuses_norm(d, t) && self.layers.iter().all(Layer::fully_fused);
        let mut mlp_pending = false;
        let n_layers = self.layers.len();
        for (l, (layer, (k_cache, v_cache))) in self.layers.iter().zip(self.caches.iter_mut()).enumerate() {
            // The input norm: already folded into x by the previous layer's down projection
            // (fused), or run here.
            let fused_in = fused_norm && l > 0;
            if !fused_in {
                if mlp_pending {
                    b.add_rms_norm(&mut s.h, &s.o, &layer.input_norm, &mut s.x, t, d, c.rms_norm_eps)?;
                } else {
                    b.rms_norm(&s.h, &layer.input_norm, &mut s.x, t, d, c.rms_norm_eps)?;
                }
            }
            let norm = fused_in.then_some(NormIn { h: &s.h, gamma: &layer.input_norm, eps: c.rms_norm_eps });
            let inv_freq = match (&self.local_inv_freq, c.uses_local_rope(l)) {
                (Some(local), true) => local,
                _ => &self.inv_freq,
            };
            let kv = KvDest {
                k_cache: &mut *k_cache,
                v_cache: &mut *v_cache,
                positions,
                inv_freq,
                slots,
                geometry: self.geometry,
            };
            let bufs = QkvBufs { q: &mut s.q, k: &mut s.k, v: &mut s.v, raw: s.qk_raw.as_mut().map(|(q, k)| (q, k)) };
            layer.attn.project(b, c, &s.x, norm, bufs, kv, t)?;
            let args = AttnArgs {
                q: &s.q,
                k_cache,
                v_cache,
                positions,
                token_seq,
                block_tables,
                num_tokens: t,
                num_seqs: seqs,
                max_blocks: shape.max_blocks,
                max_context,
                decode_tokens: shape.decodes,
                num_heads: c.num_attention_heads,
                geometry: self.geometry,
                scale: c.attn_scale(),
                window: c.layer_windows.get(l).copied().unwrap_or(0),
            };
            b.paged_attention(&args, &mut s.attn)?;
            if fused_norm {
                b.matmul_residual(&s.attn, &layer.attn.o, &mut s.h, Some((&layer.post_norm, &mut s.x)), t, d, qd)?;
            } else {
                let attn_out = layer.out_norms.as_ref().map(|(a, _)| a);
                project_out(b, &s.attn, &layer.attn.o, attn_out, &mut s.pre_norm, &mut s.o, t, d, qd, c.rms_norm_eps)?;
                b.add_rms_norm(&mut s.h, &s.o, &layer.post_norm, &mut s.x, t, d, c.rms_norm_eps)?;
            }
            match &layer.ffn {
                Ffn::Dense(mlp) => {
                    let norm = fused_norm.then_some(NormIn { h: &s.h, gamma: &layer.post_norm, eps: c.rms_norm_eps });
                    mlp.activation(b, &s.x, &mut s.gate, &mut s.up, &mut s.act, t, d, norm)?;
                    if fused_norm {
                        let next = (l + 1 < n_layers).then(|| (&self.layers[l + 1].input_norm, &mut s.x));
                        b.matmul_residual(&s.act, &mlp.down, &mut s.h, next, t, d, mlp.inter)?;
                    } else {
                        let ffn_out = layer.out_norms.as_ref().map(|(_, f)| f);
                        project_out(
                            b,
                            &s.act,
                            &mlp.down,
                            ffn_out,
                            &mut s.pre_norm,
                            &mut s.o,
                            t,
                            d,
                            mlp.inter,
                            c.rms_norm_eps,
                        )?;
                        mlp_pending = true;
                    }
                }
                Ffn::Moe(moe) => {
                    // Never with fused norms (`Layer::fully_fused` is false): out is added below.
                    let bufs = FfnBufs {
                        x: &s.x,
                        gate: &mut s.gate,
                        up: &mut s.up,
                        act: &mut s.act,
                        out: &mut s.o,
                        moe: s.moe.as_mut().map(|(l, w, y)| (l, w, y)),
                    };
                    moe.forward(b, bufs, t, d)?;
                    mlp_pending = true;
                }
            }
        }
        if mlp_pending {
            b.add(&mut s.h, &s.o, t * d)?;
        }
        if n_out > 0 {
            b.gather_rows(&s.h, logit_rows, &mut s.last, n_out, d)?;
            b.rms_norm(&s.last, &self.final_norm, &mut s.last_normed, n_out, d, c.rms_norm_eps)?;
            let head = self.lm_head.as_ref().unwrap_or(&self.embed);
            b.matmul(&s.last_normed, head, None, &mut s.logits, n_out, c.vocab_size, d)?;
        }
        Ok(())
    }

    fn check(&self, batch: &ForwardBatch) -> Result<()> {
        let o = &self.opts;
        if batch.num_tokens() == 0 {
            return Err(Error::Batch("empty batch".into()));
        }
        if batch.num_tokens() > o.max_batch_tokens {
            return Err(Error::Batch(format!(
                "{} tokens, at most {} per forward",
                batch.num_tokens(),
                o.max_batch_tokens
            )));
        }
        if batch.num_seqs() > o.max_seqs {
            return Err(Error::Batch(format!("{} sequences, at most {} per forward", batch.num_seqs(), o.max_seqs)));
        }
        if batch.logit_rows.len() > o.max_seqs + o.prompt_logit_rows {
            return Err(Error::Batch(format!(
                "{} logit rows, at most {} per forward",
                batch.logit_rows.len(),
                o.max_seqs + o.prompt_logit_rows
            )));
        }
        if batch.max_blocks > self.max_blocks_cap {
            return Err(Error::Batch(format!(
                "{} blocks per sequence, at most {}",
                batch.max_blocks, self.max_blocks_cap
            )));
        }
        batch.validate(self.cfg.vocab_size, self.kv_view.slots(), self.kv_view.block_size)
    }

    /// Greedy ids for the logit rows, computed where the logits are (only ids leave the device).
    pub fn forward_argmax(&mut self, batch: &ForwardBatch) -> Result<Vec<u32>> {
        self.check(batch)?;
        self.record(batch)?;
        self.backend.argmax(&self.s.logits, batch.logit_rows.len(), self.cfg.vocab_size)
    }
}

/// A layer's output projection `x · wᵀ` (`[t, k]` by `[n, k]`) into `out`; with an output
/// norm (sandwich norms, `layers::Layer::out_norms`) the product lands in `pre` and is normed
/// into `out`, so that the residual add that follows adds the normed output.
#[allow(clippy::too_many_arguments)]
fn project_out<B: Backend>(
    b: &B,
    x: &B::Buf,
    w: &B::Buf,
    out_norm: Option<&B::Buf>,
    pre: &mut Option<B::Buf>,
    out: &mut B::Buf,
    t: usize,
    n: usize,
    k: usize,
    eps: f32,
) -> Result<()> {
    match (out_norm, pre) {
        (Some(gamma), Some(pre)) => {
            b.matmul(x, w, None, pre, t, n, k)?;
            b.rms_norm(pre, gamma, out, t, n, eps)
        }
        _ => b.matmul(x, w, None, out, t, n, k),
    }
}

impl<B: Backend> ModelRunner for Model<B> {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    fn backend_name(&self) -> &'static str {
        self.backend.name()
    }
    fn launch_count(&self) -> Option<u64> {
        self.backend.launch_count()
    }
    fn matmul_operand(&self) -> DType {
        self.matmul_operand
    }
    fn activation_dtypes(&self) -> ActDtypes {
        self.act_dtypes
    }
    fn kv_geometry(&self) -> KvGeometry {
        self.kv_view
    }
    fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }
    fn max_batch_tokens(&self) -> usize {
        self.opts.max_batch_tokens
    }
    fn max_seqs(&self) -> usize {
        self.opts.max_seqs
    }
    fn max_logit_rows(&self) -> usize {
        self.opts.max_seqs + self.opts.prompt_logit_rows
    }
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>> {
        self.check(batch)?;
        self.record(batch)?;
        let n = batch.logit_rows.len() * self.cfg.vocab_size;
        if n == 0 {
            // A prefill chunk that samples nothing: wait for it anyway, so that aborted work
            // never piles up on the device behind the host (issue 15, finding 5).
            self.backend.sync()?;
            return Ok(vec![]);
        }
        self.backend.read_f32(&self.s.logits, n)
    }
    fn forward_sampled(&mut self, batch: &ForwardBatch, specs: &[SampleSpec]) -> Result<Vec<u32>> {
        check_specs(batch, specs)?;
        self.check(batch)?;
        self.record(batch)?;
        if specs.is_empty() {
            // As in `forward`: a chunk that samples nothing still waits for its work.
            self.backend.sync()?;
            return Ok(vec![]);
        }
        self.backend.sample(&self.s.logits, specs.len(), self.cfg.vocab_size, specs)
    }
    fn forward_sampled_masked(
        &mut self,
        batch: &ForwardBatch,
        specs: &[SampleSpec],
        masks: &mut dyn FnMut() -> Result<RowMasks>,
    ) -> Result<Vec<u32>> {
        check_specs(batch, specs)?;
        self.check(batch)?;
        // Recorded (on a device: launched) before the masks are asked for, so they are computed
        // while the device runs.
        self.record(batch)?;
        let m = masks()?;
        if specs.is_empty() {
            self.backend.sync()?;
            return Ok(vec![]);
        }
        m.check(specs.len(), self.cfg.vocab_size).map_err(Error::Batch)?;
        self.backend.sample_masked(&self.s.logits, specs.len(), self.cfg.vocab_size, specs, &m)
    }
    fn forward_sampled_logprobs(
        &mut self,
        batch: &ForwardBatch,
        specs: &[SampleSpec],
        masks: &mut dyn FnMut() -> Result<RowMasks>,
        top_n: &[Option<usize>],
    ) -> Result<(Vec<u32>, Vec<Option<TokenLogprobs>>)> {
        check_specs(batch, specs)?;
        if top_n.len() != specs.len() {
            return Err(Error::Batch(format!("{} logprob counts for {} rows", top_n.len(), specs.len())));
        }
        self.check(batch)?;
        self.record(batch)?;
        let m = masks()?;
        if specs.is_empty() {
            self.backend.sync()?;
            return Ok((vec![], vec![]));
        }
        m.check(specs.len(), self.cfg.vocab_size).map_err(Error::Batch)?;
        self.backend.sample_logprobs(&self.s.logits, specs.len(), self.cfg.vocab_size, specs, &m, top_n)
    }
}

#[cfg(test)]
mod kv_pool_tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// Llama-3.2-1B's KV shape: 16 layers, 8 kv heads of 64.
    fn llama_1b() -> ModelConfig {
        ModelConfig::from_json(
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":2048,"intermediate_size":8192,"num_hidden_layers":16,
            "num_attention_heads":32,"num_key_value_heads":8,"head_dim":64,"vocab_size":128256,"max_position_embeddings":131072}"#,
        )
        .unwrap()
    }

    /// 2 x layers x kv_heads x head_dim x element size per token: 64 KiB (f32) and 32 KiB (bf16)
    /// for this shape, so the same memory holds exactly twice the bf16 blocks, on a measured
    /// device and where the backend cannot tell (AUTO_KV_BYTES).
    #[test]
    fn a_bf16_pool_has_twice_the_blocks_of_an_f32_one() {
        let c = llama_1b();
        assert_eq!(kv_block_bytes(&c, 16, KvDtype::F32), 16 * 2 * 16 * 512 * 4);
        assert_eq!(kv_block_bytes(&c, 16, KvDtype::Bf16), 16 * 2 * 16 * 512 * 2);
        // An H200-like device: 0.9 of 140 GiB less 1 GiB context, 2.5 GiB weights, 1.5 GiB workspace.
        let m = DeviceMemory {
            total: 140 * GIB,
            free_before_weights: 139 * GIB,
            free_after_weights: 139 * GIB - 5 * GIB / 2,
            free_now: 135 * GIB,
        };
        let blocks = |dtype: KvDtype, measured: Option<&DeviceMemory>| {
            let need = KvNeed {
                block_bytes: kv_block_bytes(&c, 16, dtype),
                min_blocks: 8,
                max_blocks: usize::MAX,
                max_context: 128,
            };
            kv_pool_blocks(measured, 0.9, &need).unwrap()
        };
        let (f32_blocks, bf16_blocks) = (blocks(KvDtype::F32, Some(&m)), blocks(KvDtype::Bf16, Some(&m)));
        assert_eq!(f32_blocks, ((140.0 * 0.9 - 5.0) * GIB as f64) as usize / (16 * 2 * 16 * 512 * 4));
        assert_eq!(bf16_blocks, 2 * f32_blocks, "{bf16_blocks} bf16 blocks vs {f32_blocks} f32");
        assert_eq!(blocks(KvDtype::F32, None), 1024);
        assert_eq!(blocks(KvDtype::Bf16, None), 2048);
        // A pool that could not hold one sequence in f32 can in bf16.
        let need = |dtype| KvNeed {
            block_bytes: kv_block_bytes(&c, 16, dtype),
            min_blocks: 24000,
            max_blocks: usize::MAX,
            max_context: 384000,
        };
        let small = DeviceMemory {
            total: 24 * GIB,
            free_before_weights: 23 * GIB,
            free_after_weights: 21 * GIB,
            free_now: 20 * GIB,
        };
        assert!(kv_pool_blocks(Some(&small), 0.9, &need(KvDtype::F32)).is_err());
        assert!(kv_pool_blocks(Some(&small), 0.9, &need(KvDtype::Bf16)).is_ok());
    }
}
