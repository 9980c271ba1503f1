//! `config.json` of a model whose family the model layer runs (`crate::model::families`:
//! Llama, Mistral, Qwen2, SmolLM, Qwen3, Qwen3-MoE, Mixtral, Gemma 3): the fields every family
//! has, read here; what one family adds, defaults or refuses is its file's rules
//! (`crate::model::Family::rules`).

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};

/// Rotary embedding frequency adjustment (`rope_scaling` / `rope_parameters`).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// Llama 3.1's piecewise frequency rescaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
}

/// A mixture-of-experts feed-forward block's settings (Mixtral, Qwen3-MoE).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Experts per MoE layer (`num_local_experts`, `num_experts`).
    pub num_experts: usize,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub top_k: usize,
    /// Each expert's MLP width (Mixtral: `intermediate_size`; Qwen3-MoE: `moe_intermediate_size`).
    pub intermediate_size: usize,
    /// The kept routing weights divided by their sum (Mixtral always; Qwen3-MoE: `norm_topk_prob`).
    pub norm_topk_prob: bool,
    /// Layers that keep a dense MLP of `ModelConfig::intermediate_size` (Qwen3-MoE's
    /// `mlp_only_layers`, and those `decoder_sparse_step` skips).
    pub dense_layers: Vec<usize>,
}

/// The MLP's gate activation (`hidden_act`, Gemma's `hidden_activation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu` (`swish`): Llama, Mistral, Qwen, Mixtral.
    Silu,
    /// `gelu_pytorch_tanh`: GeGLU, Gemma.
    GeluTanh,
}

/// The rope of the sliding-window layers where it differs from the others' (Gemma 3: base
/// 10000, no scaling, against the global layers' 1e6 and their linear scaling).
#[derive(Debug, Clone, PartialEq)]
pub struct LocalRope {
    pub theta: f32,
    pub scaling: RopeScaling,
    /// Which layers use it (`layer_types` says `sliding_attention`).
    pub layers: Vec<bool>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Q, K and V projections carry a bias (Qwen2).
    pub attention_bias: bool,
    /// `torch_dtype` / `dtype`, as written ("bfloat16", "float16", "float32").
    pub dtype: Option<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// The MoE block of a mixture-of-experts family; None for a dense one.
    pub moe: Option<MoeConfig>,
    /// Each layer's sliding attention window in keys (0: full attention), as HF applies it:
    /// Mistral and Mixtral `sliding_window` on every layer (Mistral's default 4096 where the
    /// field is absent, none where it is null); Qwen2 and Qwen3 only with `use_sliding_window`,
    /// on the layers `layer_types` marks `sliding_attention` (default: from `max_window_layers`
    /// on), Qwen3-MoE on every layer. Empty or 0: every layer attends to its whole context.
    pub layer_windows: Vec<usize>,
    /// The MLP's activation.
    pub activation: Activation,
    /// Attention scores are scaled by `query_pre_attn_scalar^-1/2` instead of `head_dim^-1/2`
    /// (Gemma 3).
    pub query_pre_attn_scalar: Option<f32>,
    /// The sliding layers' own rope (Gemma 3); None: every layer uses `rope_theta` and
    /// `rope_scaling`.
    pub local_rope: Option<LocalRope>,
}

/// `config.json` as serde reads it, every field optional: the generic fields
/// [`ModelConfig::from_json`] reads, and those a family's rules read
/// ([`crate::model::Family::rules`]). A key transformers also writes under another name is read
/// under either ([`crate::model::Family::key_aliases`]).
#[derive(Deserialize)]
pub(crate) struct RawConfig {
    pub vocab_size: Option<usize>,
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub rms_norm_eps: Option<f64>,
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<serde_json::Value>,
    pub rope_parameters: Option<serde_json::Value>,
    pub max_position_embeddings: Option<usize>,
    pub tie_word_embeddings: Option<bool>,
    pub attention_bias: Option<bool>,
    pub torch_dtype: Option<String>,
    pub dtype: Option<String>,
    pub bos_token_id: Option<serde_json::Value>,
    pub eos_token_id: Option<serde_json::Value>,
    // Mixture of experts (Mixtral: num_local_experts; Qwen3-MoE: num_experts and the rest).
    pub num_local_experts: Option<usize>,
    pub num_experts: Option<usize>,
    pub num_experts_per_tok: Option<usize>,
    pub moe_intermediate_size: Option<usize>,
    pub norm_topk_prob: Option<bool>,
    pub decoder_sparse_step: Option<usize>,
    pub mlp_only_layers: Option<Vec<usize>>,
    // Sliding-window attention (see `ModelConfig::layer_windows`).
    #[serde(default, deserialize_with = "present")]
    pub sliding_window: Option<serde_json::Value>,
    pub use_sliding_window: Option<bool>,
    pub max_window_layers: Option<usize>,
    pub layer_types: Option<Vec<String>>,
    pub hidden_act: Option<String>,
    // Gemma 3.
    pub hidden_activation: Option<String>,
    pub query_pre_attn_scalar: Option<f64>,
    pub rope_local_base_freq: Option<f64>,
    pub sliding_window_pattern: Option<usize>,
    pub final_logit_softcapping: Option<f64>,
    pub attn_logit_softcapping: Option<f64>,
    pub use_bidirectional_attention: Option<bool>,
}

/// A required positive field.
/// The widest a hidden, MLP or vocabulary dimension may be (the largest released models stay
/// under 2^19); with [`MAX_COUNT`] it keeps every product the loader forms (heads x head_dim,
/// vocab x hidden, tokens x experts) far inside `usize` and the kernels' 32-bit offsets per row.
const MAX_WIDTH: usize = 1 << 24;
/// The most heads, layers, experts, or elements of one head a config may name.
const MAX_COUNT: usize = 1 << 16;

fn at_most(name: &str, v: usize, max: usize) -> std::result::Result<(), String> {
    if v > max {
        return Err(format!("{name} ({v}) is larger than any model Tandem can hold (at most {max})"));
    }
    Ok(())
}

pub(crate) fn req(v: Option<usize>, name: &str) -> std::result::Result<usize, String> {
    match v {
        Some(0) => Err(format!("`{name}` must be positive")),
        Some(x) => Ok(x),
        None => Err(format!("missing field `{name}`")),
    }
}

impl ModelConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json(&text).map_err(|msg| Error::config(path, msg))
    }

    /// The generic fields, then the family's rules ([`crate::model::Family::rules`]): its MoE
    /// block, sliding windows, defaults and refusals.
    pub fn from_json(text: &str) -> std::result::Result<Self, String> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not a valid config.json: {e}"))?;
        let family = crate::model::family_of(&value)?;
        let value = family.read_keys((family.prepare)(value)?);
        let raw: RawConfig = serde_json::from_value(value).map_err(|e| format!("not a valid config.json: {e}"))?;
        let hidden_size = req(raw.hidden_size, "hidden_size")?;
        let num_attention_heads = req(raw.num_attention_heads, "num_attention_heads")?;
        let num_key_value_heads = raw.num_key_value_heads.unwrap_or(num_attention_heads);
        if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
            return Err(format!(
                "num_attention_heads ({num_attention_heads}) must be a multiple of num_key_value_heads ({num_key_value_heads})"
            ));
        }
        let head_dim = match raw.head_dim {
            Some(h) if h > 0 => h,
            _ => {
                if hidden_size % num_attention_heads != 0 {
                    return Err(format!("hidden_size ({hidden_size}) is not a multiple of num_attention_heads ({num_attention_heads}) and no head_dim is given"));
                }
                hidden_size / num_attention_heads
            }
        };
        if head_dim % 2 != 0 {
            return Err(format!("head_dim ({head_dim}) must be even for rotary embeddings"));
        }
        let params = raw.global_rope_parameters();
        let rope_theta = raw
            .rope_theta
            .or_else(|| params.and_then(|p| p.get("rope_theta")).and_then(|v| v.as_f64()))
            .unwrap_or(10000.0) as f32;
        let scaling_json = raw.rope_scaling.as_ref().filter(|v| !v.is_null()).or(params);
        let rope_scaling = parse_rope_scaling(scaling_json)?;
        let intermediate_size = req(raw.intermediate_size, "intermediate_size")?;
        let num_hidden_layers = req(raw.num_hidden_layers, "num_hidden_layers")?;
        let vocab_size = req(raw.vocab_size, "vocab_size")?;
        at_most("hidden_size", hidden_size, MAX_WIDTH)?;
        at_most("intermediate_size", intermediate_size, MAX_WIDTH)?;
        at_most("vocab_size", vocab_size, MAX_WIDTH)?;
        at_most("num_attention_heads", num_attention_heads, MAX_COUNT)?;
        at_most("head_dim", head_dim, MAX_COUNT)?;
        at_most("num_hidden_layers", num_hidden_layers, MAX_COUNT)?;
        // Checked for every family, whether or not it slides.
        raw.sliding_window()?;
        let activation = match raw.hidden_activation.as_deref().or(raw.hidden_act.as_deref()) {
            None | Some("silu" | "swish") => Activation::Silu,
            Some("gelu_pytorch_tanh" | "gelu_tanh") => Activation::GeluTanh,
            Some(other) => {
                return Err(format!("unsupported MLP activation `{other}` (supported: silu, gelu_pytorch_tanh)"))
            }
        };
        let mut cfg = ModelConfig {
            architecture: family.architecture.to_string(),
            layer_windows: vec![0; num_hidden_layers],
            activation,
            query_pre_attn_scalar: None,
            local_rope: None,
            vocab_size,
            intermediate_size,
            num_hidden_layers,
            moe: None,
            hidden_size,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6) as f32,
            rope_theta,
            rope_scaling,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention_bias: raw.attention_bias.unwrap_or(false),
            dtype: raw.dtype.clone().or(raw.torch_dtype.clone()),
            bos_token_id: ids(raw.bos_token_id.as_ref()).first().copied(),
            eos_token_ids: ids(raw.eos_token_id.as_ref()),
        };
        (family.rules)(&raw, &mut cfg)?;
        if let Some(m) = &cfg.moe {
            at_most("the number of experts", m.num_experts, MAX_COUNT)?;
            at_most("the experts' intermediate_size", m.intermediate_size, MAX_WIDTH)?;
            if m.top_k > m.num_experts {
                return Err(format!("num_experts_per_tok ({}) exceeds the {} experts", m.top_k, m.num_experts));
            }
        }
        Ok(cfg)
    }

    /// Rotary inverse frequencies, one per pair of dimensions (head_dim / 2), scaling applied.
    /// Computed in f64 and rounded once, so every backend receives the same table.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        self.inv_freq_of(self.rope_theta, &self.rope_scaling)
    }

    /// [`ModelConfig::rope_inv_freq`] of the sliding layers where they have their own rope
    /// ([`ModelConfig::local_rope`]).
    pub fn local_rope_inv_freq(&self) -> Option<Vec<f32>> {
        self.local_rope.as_ref().map(|r| self.inv_freq_of(r.theta, &r.scaling))
    }

    /// Whether layer `l` uses the local rope.
    pub fn uses_local_rope(&self, l: usize) -> bool {
        self.local_rope.as_ref().is_some_and(|r| r.layers.get(l).copied().unwrap_or(false))
    }

    /// The attention's score scale.
    pub fn attn_scale(&self) -> f32 {
        1.0 / self.query_pre_attn_scalar.unwrap_or(self.head_dim as f32).sqrt()
    }

    fn inv_freq_of(&self, theta: f32, scaling: &RopeScaling) -> Vec<f32> {
        let half = self.head_dim / 2;
        (0..half)
            .map(|i| {
                let base = 1.0 / (theta as f64).powf((2 * i) as f64 / self.head_dim as f64);
                let f = match scaling {
                    RopeScaling::None => base,
                    RopeScaling::Linear { factor } => base / *factor as f64,
                    RopeScaling::Llama3 {
                        factor,
                        low_freq_factor,
                        high_freq_factor,
                        original_max_position_embeddings,
                    } => {
                        let (factor, lo, hi) = (*factor as f64, *low_freq_factor as f64, *high_freq_factor as f64);
                        let old = *original_max_position_embeddings as f64;
                        let wavelen = 2.0 * std::f64::consts::PI / base;
                        if wavelen < old / hi {
                            base
                        } else if wavelen > old / lo {
                            base / factor
                        } else {
                            let smooth = (old / wavelen - lo) / (hi - lo);
                            (1.0 - smooth) * base / factor + smooth * base
                        }
                    }
                };
                f as f32
            })
            .collect()
    }

    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }
    /// Whether layer `i` has a mixture of experts (else a dense MLP).
    pub fn is_moe_layer(&self, i: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| !m.dense_layers.contains(&i))
    }
    /// The widest MLP of any layer (dense or one expert): what the activation buffers hold.
    pub fn max_intermediate(&self) -> usize {
        let moe = self.moe.as_ref().map_or(0, |m| m.intermediate_size);
        if self.moe.as_ref().is_some_and(|m| m.dense_layers.is_empty()) {
            moe
        } else {
            moe.max(self.intermediate_size)
        }
    }
}

/// A field that may be null, kept apart from an absent one (`Some(Null)` vs `None`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

impl RawConfig {
    /// `sliding_window`: None where absent, `Some(None)` where null, else the positive window.
    pub fn sliding_window(&self) -> std::result::Result<Option<Option<usize>>, String> {
        Ok(match &self.sliding_window {
            None => None,
            Some(serde_json::Value::Null) => Some(None),
            Some(v) => match v.as_u64() {
                Some(0) | None => return Err(format!("`sliding_window` must be a positive integer or null, not {v}")),
                Some(n) => Some(Some(n as usize)),
            },
        })
    }

    /// Which layers slide, from `layer_types`, else `default(i)`.
    pub fn layer_types(
        &self,
        layers: usize,
        default: impl Fn(usize) -> bool,
    ) -> std::result::Result<Vec<bool>, String> {
        match &self.layer_types {
            Some(t) if t.len() != layers => {
                Err(format!("`layer_types` lists {} layers, the model has {layers}", t.len()))
            }
            Some(t) => t
                .iter()
                .map(|k| match k.as_str() {
                    "sliding_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(format!(
                        "unsupported layer type `{other}` in `layer_types` (supported: full_attention, sliding_attention)"
                    )),
                })
                .collect(),
            None => Ok((0..layers).map(default).collect()),
        }
    }

    /// transformers 5's `rope_parameters` per layer type (Gemma 3), where it has that shape.
    pub fn rope_parameters_per_type(&self) -> Option<&serde_json::Value> {
        self.rope_parameters
            .as_ref()
            .filter(|p| p.get("full_attention").is_some() || p.get("sliding_attention").is_some())
    }

    /// The model's rope settings: transformers 5's `rope_parameters` (older files use the top
    /// level); where it has one entry per layer type, the global one.
    fn global_rope_parameters(&self) -> Option<&serde_json::Value> {
        match self.rope_parameters_per_type() {
            Some(p) => p.get("full_attention").filter(|v| !v.is_null()),
            None => self.rope_parameters.as_ref(),
        }
    }
}

/// Each layer's window: `window` on the `sliding` layers, 0 elsewhere and everywhere without one.
pub(crate) fn windows(window: Option<usize>, sliding: &[bool]) -> Vec<usize> {
    match window {
        Some(w) => sliding.iter().map(|&s| if s { w } else { 0 }).collect(),
        None => vec![0; sliding.len()],
    }
}

fn ids(v: Option<&serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect(),
        _ => vec![],
    }
}

pub(crate) fn parse_rope_scaling(v: Option<&serde_json::Value>) -> std::result::Result<RopeScaling, String> {
    let Some(v) = v else { return Ok(RopeScaling::None) };
    let kind = v.get("rope_type").or_else(|| v.get("type")).and_then(|t| t.as_str()).unwrap_or("default");
    let num = |k: &str| v.get(k).and_then(|x| x.as_f64());
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear {
            factor: num("factor").ok_or("rope_scaling of type linear needs `factor`")? as f32,
        }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: num("factor").ok_or("rope_scaling of type llama3 needs `factor`")? as f32,
            low_freq_factor: num("low_freq_factor").unwrap_or(1.0) as f32,
            high_freq_factor: num("high_freq_factor").unwrap_or(4.0) as f32,
            original_max_position_embeddings: num("original_max_position_embeddings").unwrap_or(8192.0) as usize,
        }),
        other => Err(format!("unsupported rope_scaling type `{other}` (supported: linear, llama3)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOL: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":576,"intermediate_size":1536,
        "num_hidden_layers":30,"num_attention_heads":9,"num_key_value_heads":3,"vocab_size":49152,
        "rms_norm_eps":1e-5,"rope_theta":100000,"tie_word_embeddings":true,"torch_dtype":"bfloat16"}"#;

    #[test]
    fn parses_smollm_shape() {
        let c = ModelConfig::from_json(SMOL).unwrap();
        assert_eq!((c.head_dim, c.kv_dim(), c.q_dim()), (64, 192, 576));
        assert_eq!(c.rope_theta, 100000.0);
        assert!(c.tie_word_embeddings && !c.attention_bias);
        assert_eq!(c.dtype.as_deref(), Some("bfloat16"));
    }

    /// A size no model has is refused before anything multiplies it (a fuzzing finding: heads x
    /// head_dim overflowed).
    #[test]
    fn sizes_beyond_any_model_are_refused_naming_the_field() {
        let big = SMOL.replace(
            r#""num_attention_heads":9,"num_key_value_heads":3"#,
            r#""num_attention_heads":4611686018427387904,"num_key_value_heads":1,"head_dim":8"#,
        );
        let e = ModelConfig::from_json(&big).unwrap_err();
        assert!(e.contains("num_attention_heads (4611686018427387904)"), "{e}");
        let e = ModelConfig::from_json(&SMOL.replace("49152", "99999999999")).unwrap_err();
        assert!(e.contains("vocab_size"), "{e}");
        let e = ModelConfig::from_json(&SMOL.replace(r#""num_hidden_layers":30"#, r#""num_hidden_layers":70000"#))
            .unwrap_err();
        assert!(e.contains("num_hidden_layers"), "{e}");
    }

    #[test]
    fn transformers5_rope_parameters() {
        let j = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
            "num_attention_heads":4,"vocab_size":100,"dtype":"float32",
            "rope_parameters":{"rope_theta":500000.0,"rope_type":"llama3","factor":32.0,"low_freq_factor":1.0,
            "high_freq_factor":4.0,"original_max_position_embeddings":8192}}"#;
        let c = ModelConfig::from_json(j).unwrap();
        assert_eq!(c.rope_theta, 500000.0);
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 32.0));
        let f = c.rope_inv_freq();
        assert_eq!(f.len(), 8);
        assert_eq!(f[0], 1.0); // highest frequency untouched
        assert_eq!(c.dtype.as_deref(), Some("float32"));
    }

    #[test]
    fn rejects_bad_configs() {
        assert!(ModelConfig::from_json("{").unwrap_err().contains("valid"));
        let e = ModelConfig::from_json(r#"{"architectures":["GPT2LMHeadModel"]}"#).unwrap_err();
        assert!(e.contains("GPT2LMHeadModel"), "{e}");
        let e = ModelConfig::from_json(r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64}"#).unwrap_err();
        assert!(e.contains("num_attention_heads"), "{e}");
        let e = ModelConfig::from_json(
            r#"{"model_type":"llama","hidden_size":64,"intermediate_size":1,"num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":3,"vocab_size":5}"#,
        )
        .unwrap_err();
        assert!(e.contains("multiple"), "{e}");
    }

    #[test]
    fn moe_configs() {
        let j = r#"{"architectures":["MixtralForCausalLM"],"hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,
            "num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100,"num_local_experts":4,"num_experts_per_tok":2}"#;
        let c = ModelConfig::from_json(j).unwrap();
        let m = c.moe.clone().unwrap();
        assert_eq!((m.num_experts, m.top_k, m.intermediate_size, m.norm_topk_prob), (4, 2, 96, true));
        assert!(c.is_moe_layer(0) && c.is_moe_layer(1));
        let j = r#"{"architectures":["Qwen3MoeForCausalLM"],"hidden_size":64,"intermediate_size":160,"num_hidden_layers":4,
            "num_attention_heads":4,"num_key_value_heads":2,"head_dim":32,"vocab_size":100,"num_experts":8,"num_experts_per_tok":2,
            "moe_intermediate_size":48,"norm_topk_prob":true,"decoder_sparse_step":2,"mlp_only_layers":[3]}"#;
        let c = ModelConfig::from_json(j).unwrap();
        let m = c.moe.clone().unwrap();
        assert_eq!((m.num_experts, m.top_k, m.intermediate_size, m.norm_topk_prob), (8, 2, 48, true));
        // Sparse where (i + 1) % 2 == 0 and i not in mlp_only_layers: layer 1 only.
        assert_eq!((0..4).map(|i| c.is_moe_layer(i)).collect::<Vec<_>>(), [false, true, false, false]);
        assert_eq!(c.max_intermediate(), 160);
        let e = ModelConfig::from_json(&j.replace(r#""num_experts":8"#, r#""num_experts":1"#)).unwrap_err();
        assert!(e.contains("num_experts_per_tok"), "{e}");
    }

    /// Where HF applies a sliding window, layer by layer (transformers 5's configuration and
    /// modeling code of each family).
    #[test]
    fn sliding_windows_per_family() {
        let base = r#""hidden_size":64,"intermediate_size":128,"num_hidden_layers":4,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100"#;
        let w = |extra: &str| ModelConfig::from_json(&format!("{{{base}{extra}}}")).map(|c| c.layer_windows);
        // Mistral: every layer; 4096 when the field is absent (MistralConfig's default), none when null.
        assert_eq!(w(r#","architectures":["MistralForCausalLM"],"sliding_window":7"#).unwrap(), [7; 4]);
        assert_eq!(w(r#","architectures":["MistralForCausalLM"]"#).unwrap(), [4096; 4]);
        assert_eq!(w(r#","architectures":["MistralForCausalLM"],"sliding_window":null"#).unwrap(), [0; 4]);
        assert_eq!(
            w(r#","architectures":["MixtralForCausalLM"],"num_local_experts":2,"num_experts_per_tok":1"#).unwrap(),
            [0; 4]
        );
        // Qwen2: only with use_sliding_window, from max_window_layers on, or as layer_types says.
        assert_eq!(w(r#","architectures":["Qwen2ForCausalLM"],"sliding_window":5"#).unwrap(), [0; 4]);
        assert_eq!(w(r#","architectures":["Qwen2ForCausalLM"],"sliding_window":5,"use_sliding_window":true,"max_window_layers":2"#).unwrap(), [0, 0, 5, 5]);
        let types = r#","layer_types":["sliding_attention","full_attention","sliding_attention","full_attention"]"#;
        assert_eq!(
            w(&format!(r#","architectures":["Qwen3ForCausalLM"],"sliding_window":5,"use_sliding_window":true{types}"#))
                .unwrap(),
            [5, 0, 5, 0]
        );
        // Llama has no sliding window whatever the file says.
        assert_eq!(w(r#","architectures":["LlamaForCausalLM"],"sliding_window":5"#).unwrap(), [0; 4]);
        assert!(w(r#","architectures":["MistralForCausalLM"],"sliding_window":0"#)
            .unwrap_err()
            .contains("sliding_window"));
        let e =
            w(r#","architectures":["Qwen2ForCausalLM"],"use_sliding_window":true,"layer_types":["full_attention"]"#)
                .unwrap_err();
        assert!(e.contains("layer_types"), "{e}");
    }

    /// Gemma 3 in both formats HF writes: the released files' top-level keys
    /// (`rope_local_base_freq`, `rope_scaling`, `sliding_window_pattern`) and transformers 5's
    /// `rope_parameters` per layer type with `layer_types`; softcapping is refused.
    #[test]
    fn gemma3_configs() {
        let base = r#""architectures":["Gemma3ForCausalLM"],"hidden_size":1152,"intermediate_size":6912,"num_hidden_layers":8,
            "num_attention_heads":4,"num_key_value_heads":1,"head_dim":256,"vocab_size":262144,"query_pre_attn_scalar":256,"sliding_window":512"#;
        let old = ModelConfig::from_json(&format!(r#"{{{base},"rope_theta":1000000,"rope_local_base_freq":10000,"rope_scaling":{{"rope_type":"linear","factor":8.0}},"final_logit_softcapping":null}}"#)).unwrap();
        assert_eq!(old.activation, Activation::GeluTanh);
        assert_eq!(old.attn_scale(), 1.0 / 16.0);
        assert_eq!(old.layer_windows, vec![512, 512, 512, 512, 512, 0, 512, 512]);
        let local = old.local_rope.clone().unwrap();
        assert_eq!((local.theta, &local.scaling), (10000.0, &RopeScaling::None));
        assert_eq!(local.layers, vec![true, true, true, true, true, false, true, true]);
        assert_eq!((old.rope_theta, &old.rope_scaling), (1000000.0, &RopeScaling::Linear { factor: 8.0 }));
        assert!(old.uses_local_rope(0) && !old.uses_local_rope(5));
        let (g, l) = (old.rope_inv_freq(), old.local_rope_inv_freq().unwrap());
        assert_eq!((g[0], l[0]), (1.0 / 8.0, 1.0));
        assert!(
            (l[1] - 10000f32.powf(-2.0 / 256.0)).abs() < 1e-7 && (g[1] - 1e6f32.powf(-2.0 / 256.0) / 8.0).abs() < 1e-7
        );
        let types = r#"["sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","sliding_attention","sliding_attention","full_attention"]"#;
        let new = ModelConfig::from_json(&format!(
            r#"{{{base},"layer_types":{types},"rope_parameters":{{"full_attention":{{"rope_type":"linear","factor":8.0,"rope_theta":1000000.0}},"sliding_attention":{{"rope_type":"default","rope_theta":10000.0}}}}}}"#
        ))
        .unwrap();
        assert_eq!(new.layer_windows, vec![512, 0, 512, 0, 512, 512, 512, 0]);
        assert_eq!(new.rope_inv_freq(), g);
        assert_eq!(new.local_rope_inv_freq().unwrap(), l);
        for (extra, what) in [
            (r#","final_logit_softcapping":30.0"#, "final_logit_softcapping"),
            (r#","attn_logit_softcapping":50.0"#, "attn_logit_softcapping"),
            (r#","hidden_activation":"relu""#, "relu"),
        ] {
            let e = ModelConfig::from_json(&format!("{{{base}{extra}}}")).unwrap_err();
            assert!(e.contains(what), "{e}");
        }
        // A Llama keeps silu and the head_dim scale.
        let llama = ModelConfig::from_json(SMOL).unwrap();
        assert_eq!((llama.activation, llama.attn_scale(), llama.local_rope.is_none()), (Activation::Silu, 0.125, true));
    }

    /// A Gemma 3 multimodal release's config.json (the 4B's layout: a sparse `text_config`, the
    /// token ids at the top level) reads as its text model with Gemma3TextConfig's defaults.
    #[test]
    fn gemma3_multimodal_config_reads_its_text_model() {
        let c = ModelConfig::from_json(
            r#"{"architectures":["Gemma3ForConditionalGeneration"],"model_type":"gemma3","boi_token_index":255999,"eos_token_id":[1,106],
            "image_token_index":262144,"mm_tokens_per_image":256,"torch_dtype":"bfloat16",
            "text_config":{"hidden_size":2560,"intermediate_size":10240,"model_type":"gemma3_text","num_hidden_layers":34,
                "rope_scaling":{"factor":8.0,"rope_type":"linear"},"sliding_window":1024},
            "vision_config":{"hidden_size":1152,"model_type":"siglip_vision_model","num_hidden_layers":27}}"#,
        )
        .unwrap();
        assert_eq!(c.architecture, "Gemma3ForCausalLM");
        assert_eq!(
            (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.vocab_size),
            (2560, 8, 4, 256, 262208)
        );
        assert_eq!(
            (c.eos_token_ids.clone(), c.bos_token_id, c.dtype.as_deref(), c.tie_word_embeddings),
            (vec![1, 106], Some(2), Some("bfloat16"), true)
        );
        assert_eq!(
            (c.rope_theta, &c.rope_scaling, c.attn_scale()),
            (1000000.0, &RopeScaling::Linear { factor: 8.0 }, 1.0 / 16.0)
        );
        assert_eq!(c.layer_windows.iter().filter(|&&w| w == 1024).count(), 29);
        assert_eq!((c.layer_windows[5], c.local_rope.as_ref().unwrap().theta), (0, 10000.0));
        let e = ModelConfig::from_json(r#"{"architectures":["Gemma3ForConditionalGeneration"]}"#).unwrap_err();
        assert!(e.contains("text_config"), "{e}");
    }

    /// Each family's config keys that transformers writes under two names (its config class's
    /// `attribute_map`: Qwen3-MoE and Mixtral's `num_experts` / `num_local_experts`) read the
    /// same under either: a directory saved by transformers 4.x and one saved by 5.x.
    #[test]
    fn every_family_reads_its_aliased_keys_under_either_name() {
        let base = r#""hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,
            "num_key_value_heads":2,"vocab_size":100,"num_experts_per_tok":2,"moe_intermediate_size":48"#;
        let mut checked = 0;
        for f in crate::model::families() {
            let spelled = |pick: fn(&(&'static str, &'static str)) -> &'static str| {
                let keys: String = f.key_aliases.iter().map(|k| format!(r#","{}":4"#, pick(k))).collect();
                format!(r#"{{"architectures":["{}"],{base}{keys}}}"#, f.architecture)
            };
            let (old, new) = (spelled(|k| k.0), spelled(|k| k.1));
            let a = ModelConfig::from_json(&old).unwrap_or_else(|e| panic!("{}: {e}", f.architecture));
            let b = ModelConfig::from_json(&new).unwrap_or_else(|e| panic!("{}: {e}", f.architecture));
            assert_eq!(a, b, "{}", f.architecture);
            checked += f.key_aliases.len();
        }
        assert!(checked >= 2, "{checked} aliased keys");
        // What transformers 5.25 writes for Qwen3-MoE, and the released checkpoints' spelling.
        for key in ["num_local_experts", "num_experts"] {
            for arch in ["Qwen3MoeForCausalLM", "MixtralForCausalLM"] {
                let c = ModelConfig::from_json(&format!(r#"{{"architectures":["{arch}"],{base},"{key}":8}}"#)).unwrap();
                assert_eq!(c.moe.unwrap().num_experts, 8, "{arch} {key}");
            }
        }
    }

    /// Phi-3 mini's config.json: plain rope, a window on every layer; longrope (the 128k
    /// releases) and a partial rotary factor are refused, naming the field.
    #[test]
    fn phi3_configs() {
        let base = r#""architectures":["Phi3ForCausalLM"],"model_type":"phi3","hidden_size":3072,"intermediate_size":8192,
            "num_hidden_layers":4,"num_attention_heads":32,"num_key_value_heads":32,"vocab_size":32064,"rms_norm_eps":1e-5,
            "rope_theta":10000.0,"max_position_embeddings":4096,"original_max_position_embeddings":4096,"hidden_act":"silu""#;
        let c = ModelConfig::from_json(&format!(r#"{{{base},"sliding_window":2047,"rope_scaling":null}}"#)).unwrap();
        assert_eq!((c.head_dim, c.layer_windows.clone(), c.attention_bias), (96, vec![2047; 4], false));
        assert_eq!(
            (c.rope_scaling.clone(), c.activation, c.tie_word_embeddings),
            (RopeScaling::None, Activation::Silu, false)
        );
        let longrope = r#","rope_scaling":{"type":"longrope","short_factor":[1.0],"long_factor":[1.0]}"#;
        let e = ModelConfig::from_json(&format!("{{{base}{longrope}}}")).unwrap_err();
        assert!(e.contains("rope_scaling") && e.contains("longrope"), "{e}");
        let e = ModelConfig::from_json(&format!(r#"{{{base},"partial_rotary_factor":0.5}}"#)).unwrap_err();
        assert!(e.contains("partial_rotary_factor"), "{e}");
        let v5 = r#","rope_parameters":{"rope_type":"default","rope_theta":10000.0,"partial_rotary_factor":1.0}"#;
        assert_eq!(ModelConfig::from_json(&format!("{{{base}{v5}}}")).unwrap().rope_theta, 10000.0);
    }

    #[test]
    fn qwen2_has_bias_by_default() {
        let j = r#"{"architectures":["Qwen2ForCausalLM"],"hidden_size":64,"intermediate_size":128,"num_hidden_layers":1,
            "num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100,"rope_scaling":null}"#;
        assert!(ModelConfig::from_json(j).unwrap().attention_bias);
    }
}

/// The sampling defaults a model ships in `generation_config.json` (vLLM's
/// `--generation-config auto` applies them under each request's own values). Absent fields,
/// and `do_sample: false` (greedy), are kept as HF writes them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct GenerationConfig {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub max_new_tokens: Option<usize>,
    pub do_sample: Option<bool>,
}

impl GenerationConfig {
    /// `dir/generation_config.json`; None when the file is absent. A file that is not valid
    /// JSON of this shape is an error naming it.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join("generation_config.json");
        if !path.exists() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let mut g: GenerationConfig = serde_json::from_str(&text).map_err(|e| Error::config(&path, e.to_string()))?;
        // HF ignores the sampling fields when do_sample is false: the model's default is greedy.
        if g.do_sample == Some(false) {
            g.temperature = Some(0.0);
        }
        Ok(Some(g))
    }
}

#[cfg(test)]
mod generation_config_tests {
    use super::*;

    #[test]
    fn reads_the_sampling_fields_and_greedy_when_do_sample_is_false() {
        let d = std::env::temp_dir().join(format!("tandem-gencfg-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        assert_eq!(GenerationConfig::from_dir(&d).unwrap(), None);
        std::fs::write(d.join("generation_config.json"), r#"{"temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_new_tokens": 64, "bos_token_id": 1, "do_sample": true}"#).unwrap();
        let g = GenerationConfig::from_dir(&d).unwrap().unwrap();
        assert_eq!((g.temperature, g.top_p, g.top_k, g.max_new_tokens), (Some(0.6), Some(0.9), Some(20), Some(64)));
        std::fs::write(d.join("generation_config.json"), r#"{"temperature": 0.6, "do_sample": false}"#).unwrap();
        assert_eq!(GenerationConfig::from_dir(&d).unwrap().unwrap().temperature, Some(0.0));
        std::fs::write(d.join("generation_config.json"), r#"{"temperature": "hot"}"#).unwrap();
        let e = GenerationConfig::from_dir(&d).unwrap_err().to_string();
        assert!(e.contains("generation_config.json"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
