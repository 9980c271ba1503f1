//! Phi-3 (`Phi3ForCausalLM`, `model_type` `phi3`): Llama's layer with q, k and v in one
//! weight (`self_attn.qkv_proj`: q's rows, then k's, then v's) and gate and up in one
//! (`mlp.gate_up_proj`: the gate's rows first), both split at load; no biases, SiLU, untied by
//! default, every layer attending within `sliding_window` where it is set. Plain rope only:
//! `longrope` (Phi-3's 128k releases) and a `partial_rotary_factor` below 1 are refused.

use serde_json::Value;

use super::layers::{AttnOptions, Ffn, Layer, Loader};
use super::Family;
use crate::backend::Backend;
use crate::config::{windows, ModelConfig, RawConfig};
use crate::error::Result;

pub(super) const FAMILY: Family = Family { prepare, rules, ..Family::new("Phi3ForCausalLM", "phi3") };

/// Layer `i` under HF's names.
pub(super) fn layer<B: Backend>(ld: &mut Loader<'_, B>, i: usize) -> Result<Layer<B>> {
    let p = format!("model.layers.{i}");
    let attn = ld.attention_fused(&format!("{p}.self_attn"), "qkv_proj", AttnOptions::default())?;
    let mlp = ld.mlp_fused(&format!("{p}.mlp"), ["gate_up_proj", "down_proj"], ld.cfg.intermediate_size)?;
    Ok(Layer::new(
        ld.norm(&format!("{p}.input_layernorm.weight"))?,
        attn,
        ld.norm(&format!("{p}.post_attention_layernorm.weight"))?,
        Ffn::Dense(mlp),
    ))
}

/// Refuses a rope that rotates part of each head (`partial_rotary_factor`, at the top level
/// or in transformers 5's `rope_parameters`).
fn prepare(v: Value) -> std::result::Result<Value, String> {
    let top = v.get("partial_rotary_factor");
    let nested = v.get("rope_parameters").and_then(|p| p.get("partial_rotary_factor"));
    for f in [top, nested].into_iter().flatten() {
        if f.as_f64() != Some(1.0) {
            return Err(format!("`partial_rotary_factor` ({f}) is not supported (the whole head is rotated)"));
        }
    }
    Ok(v)
}

fn rules(raw: &RawConfig, cfg: &mut ModelConfig) -> std::result::Result<(), String> {
    cfg.attention_bias = false;
    cfg.layer_windows = windows(raw.sliding_window()?.flatten(), &vec![true; cfg.num_hidden_layers]);
    Ok(())
}
