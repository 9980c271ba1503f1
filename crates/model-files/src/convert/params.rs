//! What a GGUF's metadata says about the model, read once: the Llama-family shape, a mixture
//! of experts' counts, Gemma 3's attention layout.

use tandem_core::{Error, Result};

use crate::family::{CheckpointNames, Family, GEMMA3, QWEN3_MOE};
use crate::gguf::GgufFile;

/// Gemma 3's attention layout. llama.cpp's loader (src/llama-model.cpp, `LLM_ARCH_GEMMA3` in
/// `load_hparams`) reads only the window from the file and fixes the rest for the architecture:
/// `set_swa_pattern(6)` (layer `i` slides unless `i % 6 == 5`, which is HF's `layer_types` for
/// `sliding_window_pattern` 6), the sliding layers' rope base 10000 with no scaling
/// (`rope_freq_base_train_swa`, `rope_freq_scale_train_swa`), and the attention scale
/// `1/sqrt(head_dim)`, except `1/sqrt(hidden / heads)` for the 62-layer 27B model (HF's
/// `query_pre_attn_scalar`, 168 there). The global layers' rope is `rope.freq_base` with the
/// file's linear scaling, as HF scales only the global layers.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct GemmaParams {
    pub(super) sliding_window: usize,
    /// `rope.scaling.factor` where `rope.scaling.type` is `linear` (Gemma 3 4B and up: 8).
    pub(super) linear_factor: Option<f32>,
    pub(super) final_logit_softcapping: Option<f32>,
}

impl GemmaParams {
    /// llama.cpp's `set_swa_pattern(6)`.
    const PATTERN: usize = 6;
    /// HF's `rope_local_base_freq`; llama.cpp's `rope_freq_base_train_swa`.
    pub(super) const LOCAL_ROPE_BASE: f32 = 10000.0;

    pub(super) fn layer_types(layers: usize) -> Vec<&'static str> {
        (0..layers).map(|i| if (i + 1) % Self::PATTERN == 0 { "full_attention" } else { "sliding_attention" }).collect()
    }
}

/// A mixture of experts' sizes, from `{arch}.expert_count` and friends.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct MoeParams {
    pub(super) experts: usize,
    pub(super) top_k: usize,
    /// Each expert's MLP width.
    pub(super) ff: usize,
}

/// Hyper-parameters read from `{arch}.*` metadata.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct LlamaParams {
    pub(super) family: &'static Family,
    pub(super) layers: usize,
    pub(super) hidden: usize,
    pub(super) intermediate: usize,
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) head_dim: usize,
    pub(super) rms_eps: f32,
    pub(super) rope_theta: f32,
    pub(super) context: usize,
    pub(super) moe: Option<MoeParams>,
    pub(super) gemma: Option<GemmaParams>,
}

impl LlamaParams {
    pub(super) fn from_gguf(g: &GgufFile) -> Result<Self> {
        let name = g.get_str("general.architecture")?;
        let Some(family) = crate::family::from_gguf(name, g.get(&format!("{name}.expert_count")).is_some()) else {
            return Err(Error::config(
                &g.path,
                format!(
                    "general.architecture is `{name}`; this converter reads {}",
                    crate::family::GGUF_NAMES.join(", ")
                ),
            ));
        };
        let k = family.gguf_name();
        let has = |key: &str| g.get(&format!("{k}.{key}")).is_some();
        let u = |key: &str| g.get_u64(&format!("{k}.{key}")).map(|v| v as usize);
        let f = |key: &str| g.get_f64(&format!("{k}.{key}")).map(|v| v as f32);
        let heads = u("attention.head_count")?;
        let hidden = u("embedding_length")?;
        let kv_heads = if has("attention.head_count_kv") { u("attention.head_count_kv")? } else { heads };
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(Error::config(
                &g.path,
                format!("{k}.attention.head_count ({heads}) must be a positive multiple of head_count_kv ({kv_heads})"),
            ));
        }
        let head_dim = if has("attention.key_length") { u("attention.key_length")? } else { hidden / heads };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(Error::config(&g.path, format!("head dimension {head_dim} must be positive and even")));
        }
        let mut linear_factor = None;
        if let Some(kind) = g.get(&format!("{k}.rope.scaling.type")).and_then(|v| v.as_str()) {
            match kind {
                "none" => {}
                // Gemma 3's global layers (HF's rope_scaling applies to those only, as llama.cpp's).
                "linear" if family.is(GEMMA3) => {
                    let factor = f("rope.scaling.factor")?;
                    if !(factor.is_finite() && factor > 0.0) {
                        return Err(Error::config(
                            &g.path,
                            format!("{k}.rope.scaling.factor is {factor}, expected a positive number"),
                        ));
                    }
                    linear_factor = (factor != 1.0).then_some(factor);
                }
                _ => {
                    return Err(Error::config(
                        &g.path,
                        format!("{k}.rope.scaling.type `{kind}` is not supported by this converter for `{k}`"),
                    ))
                }
            }
        }
        if g.tensor("rope_freqs.weight").is_some() {
            return Err(Error::config(
                &g.path,
                "tensor `rope_freqs.weight` (Llama 3.1 rope scaling) is not supported by this converter",
            ));
        }
        // Every layer has nine tensors at least: a count the file cannot hold is refused before
        // anything is sized from it (found by fuzz/gguf: a huge block_count in a 6 KB file).
        let layers = u("block_count")?;
        if layers == 0 || layers > g.tensors.len() / 9 {
            return Err(Error::config(
                &g.path,
                format!(
                    "{k}.block_count is {layers}, but the file's {} tensors hold at most {} layers of 9",
                    g.tensors.len(),
                    g.tensors.len() / 9
                ),
            ));
        }
        let intermediate = u("feed_forward_length").or_else(|e| {
            if family.is(QWEN3_MOE) {
                u("expert_feed_forward_length")
            } else {
                Err(e)
            }
        })?;
        let moe = match family.moe() {
            true => {
                let experts = u("expert_count")?;
                let top_k = u("expert_used_count")?;
                let ff = if family.is(QWEN3_MOE) { u("expert_feed_forward_length")? } else { intermediate };
                if experts == 0 || top_k == 0 || top_k > experts || experts > g.tensors.len() * 1024 {
                    return Err(Error::config(
                        &g.path,
                        format!("{k}.expert_used_count ({top_k}) must be in 1..={k}.expert_count ({experts})"),
                    ));
                }
                Some(MoeParams { experts, top_k, ff })
            }
            false => None,
        };
        let gemma = if family.is(GEMMA3) {
            if has("attention.value_length") && u("attention.value_length")? != head_dim {
                return Err(Error::config(
                    &g.path,
                    format!(
                        "{k}.attention.value_length ({}) differs from key_length ({head_dim})",
                        u("attention.value_length")?
                    ),
                ));
            }
            // llama.cpp's loader requires the key for gemma3 (a get_key without `false`).
            let sliding_window = u("attention.sliding_window")?;
            if sliding_window == 0 {
                return Err(Error::config(&g.path, format!("{k}.attention.sliding_window is 0")));
            }
            let softcap = if has("final_logit_softcapping") { Some(f("final_logit_softcapping")?) } else { None };
            Some(GemmaParams { sliding_window, linear_factor, final_logit_softcapping: softcap })
        } else {
            None
        };
        Ok(LlamaParams {
            family,
            layers,
            hidden,
            intermediate,
            heads,
            kv_heads,
            head_dim,
            rms_eps: f("attention.layer_norm_rms_epsilon")?,
            rope_theta: if has("rope.freq_base") { f("rope.freq_base")? } else { 10000.0 },
            context: u("context_length")?,
            moe,
            gemma,
        })
    }
}
