//! Gemma 3, text only (`Gemma3ForCausalLM`, `model_type` `gemma3_text`): Qwen3's per-head q/k
//! norms, a GeGLU MLP (`hidden_activation` gelu_pytorch_tanh), "sandwich" norms (the
//! attention's and the MLP's outputs are normed before the residual add:
//! `post_attention_layernorm`, `post_feedforward_layernorm`; the MLP's input norm is
//! `pre_feedforward_layernorm`), every RMS norm multiplying by `1 + w`, the input embedding
//! scaled by √hidden, scores scaled by `query_pre_attn_scalar^-1/2`, and sliding-window layers
//! (five of every six by default) with their own rope base beside the global ones
//! (`ModelConfig::local_rope`, `layer_windows`). Tied embeddings; a 262k vocabulary. A
//! multimodal release (`Gemma3ForConditionalGeneration`) reads as its text model.

use serde_json::{json, Value};

use super::layers::{AttnOptions, Ffn, Layer, Loader, MLP_NAMES};
use super::Family;
use crate::backend::Backend;
use crate::config::{parse_rope_scaling, windows, Activation, LocalRope, ModelConfig, RawConfig};
use crate::error::Result;

pub(super) const FAMILY: Family = Family {
    also: &["Gemma3ForConditionalGeneration", "gemma3"],
    scaled_embedding: true,
    norm_plus_one: true,
    prepare,
    rules,
    ..Family::new("Gemma3ForCausalLM", "gemma3_text")
};

/// Layer `i` under HF's names.
pub(super) fn layer<B: Backend>(ld: &mut Loader<'_, B>, i: usize) -> Result<Layer<B>> {
    let p = format!("model.layers.{i}");
    let attn = ld.attention(&format!("{p}.self_attn"), AttnOptions { bias: ld.cfg.attention_bias, qk_norm: true })?;
    let mlp = ld.mlp(&format!("{p}.mlp"), MLP_NAMES, ld.cfg.intermediate_size)?;
    Ok(Layer::new(
        ld.norm(&format!("{p}.input_layernorm.weight"))?,
        attn,
        ld.norm(&format!("{p}.pre_feedforward_layernorm.weight"))?,
        Ffn::Dense(mlp),
    )
    .with_out_norms(
        ld.norm(&format!("{p}.post_attention_layernorm.weight"))?,
        ld.norm(&format!("{p}.post_feedforward_layernorm.weight"))?,
    ))
}

/// Gemma 3's text model as the model layer reads it: a multimodal checkpoint
/// (`Gemma3ForConditionalGeneration`, `model_type` gemma3: the 4B, 12B and 27B releases) gives its
/// `text_config` (the token ids and dtype from the top level where it has none; its weights
/// answer to the text model's names, see `Weights::get`), and the fields a Gemma 3 text config
/// leaves out take `Gemma3TextConfig`'s defaults (the released files rely on them).
fn prepare(mut v: Value) -> std::result::Result<Value, String> {
    let arch = v.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str).map(String::from);
    let model_type = v.get("model_type").and_then(Value::as_str).map(String::from);
    let multimodal = match (arch.as_deref(), model_type.as_deref()) {
        (Some(a), _) => a == "Gemma3ForConditionalGeneration",
        (None, t) => t == Some("gemma3"),
    };
    if multimodal {
        let Some(Value::Object(mut text)) = v.get("text_config").cloned() else {
            return Err("Gemma3ForConditionalGeneration without a `text_config` object".into());
        };
        for k in ["bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype", "tie_word_embeddings"] {
            if let (false, Some(x)) = (text.contains_key(k), v.get(k)) {
                text.insert(k.into(), x.clone());
            }
        }
        text.insert("architectures".into(), json!(["Gemma3ForCausalLM"]));
        v = Value::Object(text);
    }
    let Value::Object(o) = &mut v else { return Err("config.json is not a JSON object".into()) };
    let defaults = json!({
        "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6, "bos_token_id": 2, "eos_token_id": 1, "tie_word_embeddings": true,
        "query_pre_attn_scalar": 256, "sliding_window": 4096
    });
    if !o.contains_key("rope_parameters") {
        o.entry("rope_theta").or_insert(json!(1000000.0));
    }
    if let Value::Object(d) = defaults {
        for (k, x) in d {
            o.entry(k).or_insert(x);
        }
    }
    Ok(v)
}

fn rules(raw: &RawConfig, cfg: &mut ModelConfig) -> std::result::Result<(), String> {
    for (name, v) in
        [("final_logit_softcapping", raw.final_logit_softcapping), ("attn_logit_softcapping", raw.attn_logit_softcapping)]
    {
        if let Some(v) = v {
            return Err(format!("`{name}` ({v}) is not supported (Gemma 3 checkpoints leave it null)"));
        }
    }
    if raw.use_bidirectional_attention == Some(true) {
        return Err("`use_bidirectional_attention` is not supported (a causal language model attends to earlier tokens only)".into());
    }
    if raw.hidden_activation.is_none() && raw.hidden_act.is_none() {
        cfg.activation = Activation::GeluTanh;
    }
    let layers = cfg.num_hidden_layers;
    // Every layer but each `sliding_window_pattern`th (6: five local layers, then a global
    // one), unless `layer_types` says.
    let pattern = raw.sliding_window_pattern.unwrap_or(6).max(1);
    let sliding = raw.layer_types(layers, |i| (i + 1) % pattern != 0)?;
    cfg.layer_windows = windows(raw.sliding_window()?.unwrap_or(Some(4096)), &sliding);
    cfg.query_pre_attn_scalar = Some(raw.query_pre_attn_scalar.unwrap_or(256.0) as f32);
    // The sliding layers' rope: `rope_parameters.sliding_attention` (transformers 5) or
    // `rope_local_base_freq` (older files), never scaled.
    let local = raw.rope_parameters_per_type().and_then(|p| p.get("sliding_attention")).filter(|v| !v.is_null());
    let theta =
        local.and_then(|p| p.get("rope_theta")).and_then(|v| v.as_f64()).or(raw.rope_local_base_freq).unwrap_or(10000.0)
            as f32;
    cfg.local_rope = Some(LocalRope { theta, scaling: parse_rope_scaling(local)?, layers: sliding });
    Ok(())
}
