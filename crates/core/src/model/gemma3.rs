//! Gemma 3, text only (`Gemma3ForCausalLM`, `model_type` `gemma3_text`): Qwen3's per-head q/k
//! norms, a GeGLU MLP (`hidden_activation` gelu_pytorch_tanh), "sandwich" norms (the
//! attention's and the MLP's outputs are normed before the residual add:
//! `post_attention_layernorm`, `post_feedforward_layernorm`; the MLP's input norm is
//! `pre_feedforward_layernorm`), every RMS norm multiplying by `1 + w`, the input embedding
//! scaled by √hidden, scores scaled by `query_pre_attn_scalar^-1/2`, and sliding-window layers
//! (five of every six by default) with their own rope base beside the global ones
//! (`ModelConfig::local_rope`, `layer_windows`). Tied embeddings; a 262k vocabulary.

use super::layers::{AttnOptions, Ffn, Layer, Loader, MLP_NAMES};
use super::Family;
use crate::backend::Backend;
use crate::error::Result;

pub(super) const FAMILIES: &[Family] =
    &[Family { scaled_embedding: true, norm_plus_one: true, ..Family::new("Gemma3ForCausalLM", "gemma3_text") }];

/// Layer `i` under HF's names.
pub(super) fn layer<B: Backend>(ld: &mut Loader<'_, B>, i: usize) -> Result<Layer<B>> {
    let p = format!("model.layers.{i}");
    let attn = ld.attention(&format!("{p}.self_attn"), AttnOptions { bias: ld.cfg.attention_bias, qk_norm: true })?;
    let mlp = ld.mlp(&format!("{p}.mlp"), MLP_NAMES, ld.cfg.intermediate_size)?;
    let out_norms = Some((
        ld.norm(&format!("{p}.post_attention_layernorm.weight"))?,
        ld.norm(&format!("{p}.post_feedforward_layernorm.weight"))?,
    ));
    Ok(Layer {
        input_norm: ld.norm(&format!("{p}.input_layernorm.weight"))?,
        attn,
        post_norm: ld.norm(&format!("{p}.pre_feedforward_layernorm.weight"))?,
        ffn: Ffn::Dense(mlp),
        out_norms,
    })
}
