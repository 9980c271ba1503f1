//! Llama and SmolLM (`LlamaForCausalLM`): a decoder layer of RMS norm, attention (q/k/v
//! biases where `attention_bias`), RMS norm, gated MLP. Mistral and Qwen2 share this layer
//! ([`super::mistral`], [`super::qwen2`]); Llama has no sliding window whatever the file says.

use super::layers::{AttnOptions, Ffn, Layer, Loader, MLP_NAMES};
use super::Family;
use crate::backend::Backend;
use crate::error::Result;

pub(super) const FAMILY: Family = Family::new("LlamaForCausalLM", "llama");

/// Layer `i` under HF's names.
pub(super) fn layer<B: Backend>(ld: &mut Loader<'_, B>, i: usize) -> Result<Layer<B>> {
    let p = format!("model.layers.{i}");
    let attn = ld.attention(&format!("{p}.self_attn"), AttnOptions { bias: ld.cfg.attention_bias, qk_norm: false })?;
    let mlp = ld.mlp(&format!("{p}.mlp"), MLP_NAMES, ld.cfg.intermediate_size)?;
    Ok(Layer::new(
        ld.norm(&format!("{p}.input_layernorm.weight"))?,
        attn,
        ld.norm(&format!("{p}.post_attention_layernorm.weight"))?,
        Ffn::Dense(mlp),
    ))
}
