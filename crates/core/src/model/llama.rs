//! Llama and the families that share its layer exactly: Mistral, Qwen2 (q/k/v biases, from
//! `attention_bias`), SmolLM. A decoder layer: RMS norm, attention, RMS norm, gated MLP.

use super::layers::{AttnOptions, Ffn, Layer, Loader, MLP_NAMES};
use super::Family;
use crate::backend::Backend;
use crate::error::Result;

pub(super) const FAMILIES: &[Family] = &[
    Family::new("LlamaForCausalLM", "llama"),
    Family::new("MistralForCausalLM", "mistral"),
    Family::new("Qwen2ForCausalLM", "qwen2"),
];

/// Layer `i` under HF's names.
pub(super) fn layer<B: Backend>(ld: &mut Loader<'_, B>, i: usize) -> Result<Layer<B>> {
    let p = format!("model.layers.{i}");
    let attn = ld.attention(&format!("{p}.self_attn"), AttnOptions { bias: ld.cfg.attention_bias, qk_norm: false })?;
    let mlp = ld.mlp(&format!("{p}.mlp"), MLP_NAMES, ld.cfg.intermediate_size)?;
    Ok(Layer {
        input_norm: ld.norm(&format!("{p}.input_layernorm.weight"))?,
        attn,
        post_norm: ld.norm(&format!("{p}.post_attention_layernorm.weight"))?,
        ffn: Ffn::Dense(mlp),
        out_norms: None,
    })
}
