//! Qwen3-MoE (`Qwen3MoeForCausalLM`): Qwen3's attention (per-head q/k norms), and a mixture of
//! experts (`mlp.gate` router, `mlp.experts.{e}.{gate,up,down}_proj`) routed by a softmax over
//! every expert, the top-k kept, renormalised where `norm_topk_prob`; layers in
//! `mlp_only_layers` (or skipped by `decoder_sparse_step`) keep a dense MLP. With
//! `use_sliding_window`, every layer slides.

use super::layers::{AttnOptions, Ffn, Layer, Loader, MLP_NAMES};
use super::Family;
use crate::backend::Backend;
use crate::config::{req, windows, ModelConfig, MoeConfig, RawConfig};
use crate::error::Result;

pub(super) const FAMILY: Family = Family {
    // transformers' `attribute_map`: the 5.x releases write `num_local_experts`.
    key_aliases: &[("num_experts", "num_local_experts")],
    rules,
    ..Family::new("Qwen3MoeForCausalLM", "qwen3_moe")
};

fn rules(raw: &RawConfig, cfg: &mut ModelConfig) -> std::result::Result<(), String> {
    // HF: layer i is sparse unless listed in mlp_only_layers, and (i + 1) a multiple of decoder_sparse_step.
    let step = raw.decoder_sparse_step.unwrap_or(1).max(1);
    let only = raw.mlp_only_layers.clone().unwrap_or_default();
    cfg.moe = Some(MoeConfig {
        num_experts: req(raw.num_experts, "num_experts")?,
        top_k: req(raw.num_experts_per_tok, "num_experts_per_tok")?,
        intermediate_size: req(raw.moe_intermediate_size, "moe_intermediate_size")?,
        norm_topk_prob: raw.norm_topk_prob.unwrap_or(false),
        dense_layers: (0..cfg.num_hidden_layers).filter(|i| only.contains(i) || (i + 1) % step != 0).collect(),
    });
    let window = match raw.use_sliding_window.unwrap_or(false) {
        true => raw.sliding_window()?.unwrap_or(Some(4096)),
        false => None,
    };
    cfg.layer_windows = windows(window, &vec![true; cfg.num_hidden_layers]);
    Ok(())
}

/// Layer `i` under HF's names.
pub(super) fn layer<B: Backend>(ld: &mut Loader<'_, B>, i: usize) -> Result<Layer<B>> {
    let p = format!("model.layers.{i}");
    let attn = ld.attention(&format!("{p}.self_attn"), AttnOptions { bias: ld.cfg.attention_bias, qk_norm: true })?;
    let ffn = match ld.cfg.is_moe_layer(i) {
        true => Ffn::Moe(ld.moe(&format!("{p}.mlp"), "gate", MLP_NAMES)?),
        false => Ffn::Dense(ld.mlp(&format!("{p}.mlp"), MLP_NAMES, ld.cfg.intermediate_size)?),
    };
    Ok(Layer::new(
        ld.norm(&format!("{p}.input_layernorm.weight"))?,
        attn,
        ld.norm(&format!("{p}.post_attention_layernorm.weight"))?,
        ffn,
    ))
}
