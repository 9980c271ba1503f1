//! Qwen3-MoE (`Qwen3MoeForCausalLM`): Qwen3's attention (per-head q/k norms), and a mixture of
//! experts (`mlp.gate` router, `mlp.experts.{e}.{gate,up,down}_proj`) routed by a softmax over
//! every expert, the top-k kept, renormalised where `norm_topk_prob`; layers in
//! `mlp_only_layers` (or skipped by `decoder_sparse_step`) keep a dense MLP.

use super::layers::{AttnOptions, Ffn, Layer, Loader, MLP_NAMES};
use super::Family;
use crate::backend::Backend;
use crate::error::Result;

pub(super) const FAMILIES: &[Family] = &[Family::new("Qwen3MoeForCausalLM", "qwen3_moe")];

/// Layer `i` under HF's names.
pub(super) fn layer<B: Backend>(ld: &mut Loader<'_, B>, i: usize) -> Result<Layer<B>> {
    let p = format!("model.layers.{i}");
    let attn = ld.attention(&format!("{p}.self_attn"), AttnOptions { bias: ld.cfg.attention_bias, qk_norm: true })?;
    let ffn = match ld.cfg.is_moe_layer(i) {
        true => Ffn::Moe(ld.moe(&format!("{p}.mlp"), "gate", MLP_NAMES)?),
        false => Ffn::Dense(ld.mlp(&format!("{p}.mlp"), MLP_NAMES, ld.cfg.intermediate_size)?),
    };
    Ok(Layer {
        input_norm: ld.norm(&format!("{p}.input_layernorm.weight"))?,
        attn,
        post_norm: ld.norm(&format!("{p}.post_attention_layernorm.weight"))?,
        ffn,
        out_norms: None,
    })
}
