//! Mixtral (`MixtralForCausalLM`): Llama's attention, and in every layer a mixture of experts
//! (`block_sparse_moe`: router `gate`, experts' `w1` gate, `w3` up, `w2` down) routed by a
//! softmax over the top-k logits (HF: softmax over all, top-k, renormalised: the same weights).
//! Every layer attends within `sliding_window` where it is set.

use super::layers::{AttnOptions, Ffn, Layer, Loader};
use super::Family;
use crate::backend::Backend;
use crate::config::{req, windows, ModelConfig, MoeConfig, RawConfig};
use crate::error::Result;

pub(super) const FAMILY: Family = Family {
    // transformers' `attribute_map`: the 5.x releases write `num_local_experts`.
    key_aliases: &[("num_experts", "num_local_experts")],
    rules,
    ..Family::new("MixtralForCausalLM", "mixtral")
};

fn rules(raw: &RawConfig, cfg: &mut ModelConfig) -> std::result::Result<(), String> {
    cfg.moe = Some(MoeConfig {
        num_experts: req(raw.num_local_experts, "num_local_experts")?,
        top_k: req(raw.num_experts_per_tok, "num_experts_per_tok")?,
        intermediate_size: cfg.intermediate_size,
        norm_topk_prob: true,
        dense_layers: vec![],
    });
    cfg.layer_windows = windows(raw.sliding_window()?.flatten(), &vec![true; cfg.num_hidden_layers]);
    Ok(())
}

/// Layer `i` under HF's names.
pub(super) fn layer<B: Backend>(ld: &mut Loader<'_, B>, i: usize) -> Result<Layer<B>> {
    let p = format!("model.layers.{i}");
    let attn = ld.attention(&format!("{p}.self_attn"), AttnOptions { bias: ld.cfg.attention_bias, qk_norm: false })?;
    let moe = ld.moe(&format!("{p}.block_sparse_moe"), "gate", ["w1", "w3", "w2"])?;
    Ok(Layer::new(
        ld.norm(&format!("{p}.input_layernorm.weight"))?,
        attn,
        ld.norm(&format!("{p}.post_attention_layernorm.weight"))?,
        Ffn::Moe(moe),
    ))
}
