//! The loaded model ([`Model`]): its weights on the backend, its KV cache and the scratch one
//! step runs in, all allocated at load for the largest step ([`Model::from_weights`]).

use std::path::Path;

use super::graphs::{buckets, Padding};
use super::layers::{Layer, Loader};
use super::{layer_builder, ActDtypes, LoadOptions, FAMILIES};
use crate::backend::{kv_dtype_names, Backend, DType, GraphId, KvDtype, KvGeometry, U32Group, WorkspaceLimits};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::lora::slots::{LoraDtypes, LoraSlots};
use crate::lora::{LoraAdapter, LoraLimits};
use crate::memory::{kv_block_bytes, kv_pool_blocks, DeviceMemory, KvNeed};
use crate::meta::{self, MetaStaging};
use crate::weights::Weights;

/// What `b` stores an activation in when `readers` are the weight types of every matmul that
/// reads it: the backend's choice for that type where they agree, else f32.
fn stored_as<B: Backend>(b: &B, readers: &[DType]) -> DType {
    match readers.split_first() {
        Some((&first, rest)) if rest.iter().all(|&d| d == first) => b.activation_dtype(first),
        _ => DType::F32,
    }
}

/// Activation and metadata buffers, allocated once for the largest batch.
pub(super) struct Scratch<B: Backend> {
    pub(super) h: B::Buf,           // [T, hidden] residual stream
    pub(super) x: B::Buf,           // [T, hidden] normed (ActDtypes::x)
    pub(super) q: B::Buf,           // [T, q_dim]
    pub(super) k: B::Buf,           // [T, kv_dim]
    pub(super) v: B::Buf,           // [T, kv_dim]
    pub(super) attn: B::Buf,        // [T, q_dim]
    pub(super) o: B::Buf,           // [T, hidden]
    pub(super) gate: B::Buf,        // [T, intermediate]
    pub(super) up: B::Buf,          // [T, intermediate]
    pub(super) act: B::Buf,         // [T, intermediate] (ActDtypes::act)
    pub(super) last: B::Buf,        // [S, hidden] rows that need logits
    pub(super) last_normed: B::Buf, // [S, hidden] (ActDtypes::last_normed)
    pub(super) logits: B::Buf,      // [S, vocab]
    /// The raw q and k projections `[T, q_dim]`, `[T, kv_dim]`, for a family that norms them
    /// per head before rope (`layers::AttnOptions::qk_norm`).
    pub(super) qk_raw: Option<(B::Buf, B::Buf)>,
    /// A mixture of experts' router logits and routing weights `[T, experts]`, and one
    /// expert's output `[T, hidden]` (`layers::Moe::forward`).
    pub(super) moe: Option<(B::Buf, B::Buf, B::Buf)>,
    /// `[T, hidden]`: a block's output before its norm, for a family that norms it
    /// (`layers::Layer::out_norms`).
    pub(super) pre_norm: Option<B::Buf>,
    /// The step's metadata, the regions of `meta::layout` (`meta::TOKENS`, ...): token ids,
    /// positions, slots and token_seq `[T]`, logit rows `[S]`, block tables
    /// `[max_seqs, max_blocks_cap]`; one staging buffer, one upload.
    pub(super) meta: U32Group<B::Buf>,
}

pub struct Model<B: Backend> {
    pub(super) backend: B,
    pub(super) cfg: ModelConfig,
    pub(super) opts: LoadOptions,
    pub(super) geometry: KvGeometry,
    pub(super) kv_dtype: KvDtype,
    pub(super) matmul_operand: DType,
    /// Bytes the backend holds for the weights (`Device::weight_bytes` over the load).
    pub(super) weights_bytes: Option<u64>,
    pub(super) act_dtypes: ActDtypes,
    pub(super) max_blocks_cap: usize,
    pub(super) embed: B::Buf,
    pub(super) lm_head: Option<B::Buf>,
    pub(super) final_norm: B::Buf,
    pub(super) inv_freq: B::Buf,
    /// The sliding layers' rope table where they have their own (`ModelConfig::local_rope`).
    pub(super) local_inv_freq: Option<B::Buf>,
    /// √hidden in the embedding's type, where the family scales the embedding.
    pub(super) embed_scale: Option<f32>,
    pub(super) layers: Vec<Layer<B>>,
    /// (K, V) per layer.
    pub(super) caches: Vec<(B::Buf, B::Buf)>,
    pub(super) s: Scratch<B>,
    /// The pool as the engine sees it: `geometry` less the padding's scratch block.
    pub(super) kv_view: KvGeometry,
    pub(super) pad: Option<Padding>,
    /// One per bucket of `pad`: the captured decode step, where capture worked.
    pub(super) graphs: Vec<Option<GraphId>>,
    /// Writes each step into `s.meta`'s staging memory (and knows how much of each padded
    /// block-table row there already is the scratch block).
    pub(super) staging: MetaStaging,
    /// The LoRA adapter slots, where the model was loaded with them.
    pub(super) lora: Option<LoraSlots<B>>,
    /// The hidden states entering these layers, kept for every token of a forward (a draft
    /// head reads them; `ModelRunner::set_aux_layers`); None: not kept.
    pub(super) aux: Option<AuxHidden>,
    /// A draft head whose weights are on this backend (`ModelRunner::load_draft_head`).
    pub(super) draft_head: Option<crate::device_head::DeviceHead<B>>,
}

/// The aux hidden states a forward keeps: the layers, and the last forward's rows
/// (`[tokens, layers.len() * hidden]`).
pub(super) struct AuxHidden {
    pub(super) layers: Vec<usize>,
    pub(super) rows: Vec<f32>,
}

impl<B: Backend> Model<B> {
    /// Loads `dir` (config.json + safetensors) onto `backend`.
    pub fn load(backend: B, dir: &Path, opts: LoadOptions) -> Result<Self> {
        let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
        let weights = Weights::open(dir)?;
        Self::from_weights(backend, cfg, &weights, opts)
    }

    pub fn from_weights(backend: B, cfg: ModelConfig, w: &Weights, opts: LoadOptions) -> Result<Self> {
        Self::from_weights_lora(backend, cfg, w, opts, None)
    }

    /// Loads `dir` with `lora` adapter slots (empty; [`Model::load_lora`] fills them).
    pub fn load_with_lora(backend: B, dir: &Path, opts: LoadOptions, lora: LoraLimits) -> Result<Self> {
        let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
        let weights = Weights::open(dir)?;
        Self::from_weights_lora(backend, cfg, &weights, opts, Some(lora))
    }

    /// As [`Model::from_weights`], with adapter slots where `lora` is given: then gate and up
    /// stay apart, norms are never folded into the projections, and no graph is captured (the
    /// updates follow the loaded adapters, not the step's shape alone).
    pub fn from_weights_lora(
        backend: B,
        cfg: ModelConfig,
        w: &Weights,
        opts: LoadOptions,
        lora: Option<LoraLimits>,
    ) -> Result<Self> {
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
        // A weight kept quantized goes only to a backend that runs its layout (crate::quant_layout).
        let mut quantized = 0usize;
        for (name, layout) in w.quantized() {
            layout.check_backend(b.name(), name)?;
            quantized += 1;
        }
        tracing::info!(bytes = w.stored_bytes(), quantized, "model weights");
        let held_before = b.weight_bytes();
        let graphs_on = opts.graphs && b.supports_graphs() && lora.is_none();
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
        let found = FAMILIES.iter().position(|f| f.architecture == arch);
        let Some((family, layer)) = found.and_then(|i| Some((FAMILIES[i], layer_builder::<B>(i)?))) else {
            return Err(Error::config(Path::new("config.json"), format!("no model layer for architecture `{arch}`")));
        };
        ld.norm_plus_one = family.norm_plus_one;
        ld.split_gate_up = lora.is_some();
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
        let weights_bytes = held_before.zip(b.weight_bytes()).map(|(before, after)| after.saturating_sub(before));
        if let Some(bytes) = weights_bytes {
            tracing::info!(bytes, backend = b.name(), "model weights held");
        }
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
        let lora = match lora {
            Some(limits) => {
                let common = |readers: &[DType], stored: DType| match (stored, readers.first()) {
                    (DType::F32, _) | (_, None) => DType::F32,
                    (_, Some(&d)) => d,
                };
                let dtypes =
                    LoraDtypes { x: common(&x_readers, act_dtypes.x), act: common(&act_readers, act_dtypes.act) };
                Some(LoraSlots::new(b, limits, dtypes, &cfg, t)?)
            }
            None => None,
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
        // An fp8 cache takes the checkpoint's per-layer K and V scales where it has them
        // (crate::kv_scales); any other cache ignores them, as vLLM's does.
        let scales = match kv_dtype.fp8() {
            Some(_) => crate::kv_scales::read(w, cfg.num_hidden_layers)?,
            None => None,
        };
        if scales.is_some() && kv_dtype == KvDtype::Fp8E5m2 {
            return Err(Error::backend(
                b.name(),
                "the checkpoint has fp8 KV scales (k_scale / v_scale), which vLLM honours with fp8_e4m3 only: use --kv-cache-dtype fp8",
            ));
        }
        if let Some(s) = &scales {
            tracing::info!(layers = s.len(), first = ?s.first(), "fp8 KV cache scales from the checkpoint");
        }
        let mut caches = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            caches.push(match scales.as_ref().map(|s| s[i]) {
                Some([ks, vs]) => {
                    (b.alloc_kv_scaled(geometry, kv_dtype, ks)?, b.alloc_kv_scaled(geometry, kv_dtype, vs)?)
                }
                None => (b.alloc_kv_as(geometry, kv_dtype)?, b.alloc_kv_as(geometry, kv_dtype)?),
            });
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
            weights_bytes,
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
            lora,
            aux: None,
            draft_head: None,
        };
        if graphs_on {
            model.capture_graphs()?;
        }
        Ok(model)
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

    /// Puts `adapter` into LoRA slot `slot` (what a batch's `adapters` name), replacing what
    /// was there; refused where the model has no slots, or the slot or the rank is over the limit.
    pub fn load_lora(&mut self, slot: usize, adapter: &LoraAdapter) -> Result<()> {
        match &mut self.lora {
            Some(l) => l.load(&self.backend, slot, adapter),
            None => Err(Error::config(&adapter.dir, "the model was loaded without LoRA slots (--enable-lora)")),
        }
    }

    /// Empties LoRA slot `slot`.
    pub fn unload_lora(&mut self, slot: usize) {
        if let Some(l) = &mut self.lora {
            l.unload(slot);
        }
    }

    /// Which LoRA slots hold an adapter (empty without LoRA).
    pub fn lora_slots(&self) -> Vec<bool> {
        self.lora.as_ref().map_or_else(Vec::new, |l| (0..l.limits().max_loras).map(|s| l.occupied(s)).collect())
    }

    /// The LoRA limits the model was loaded with, if any.
    pub fn lora_limits(&self) -> Option<LoraLimits> {
        self.lora.as_ref().map(LoraSlots::limits)
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Longest sequence (in tokens) one block-table row can describe.
    pub fn max_context(&self) -> usize {
        self.max_blocks_cap * self.opts.block_size
    }
}
