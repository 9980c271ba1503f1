//! Mixtral (`MixtralForCausalLM`): Llama's attention, and in every layer a mixture of experts
//! (`block_sparse_moe`: router `gate`, experts' `w1` gate, `w3` up, `w2` down) routed by a
//! softmax over the top-k logits (HF: softmax over all, top-k, renormalised: the same weights).

use super::layers::{AttnOptions, Ffn, Layer, Loader};
use super::Family;
use crate::backend::Backend;
use crate::error::Result;

pub(super) const FAMILIES: &[Family] = &[Family::new("MixtralForCausalLM", "mixtral")];

/// Layer `i` under HF's names.
pub(super) fn layer<B: Backend>(ld: &mut Loader<'_, B>, i: usize) -> Result<Layer<B>> {
    let p = format!("model.layers.{i}");
    let attn = ld.attention(&format!("{p}.self_attn"), AttnOptions { bias: ld.cfg.attention_bias, qk_norm: false })?;
    let moe = ld.moe(&format!("{p}.block_sparse_moe"), "gate", ["w1", "w3", "w2"])?;
    Ok(Layer {
        input_norm: ld.norm(&format!("{p}.input_layernorm.weight"))?,
        attn,
        post_norm: ld.norm(&format!("{p}.post_attention_layernorm.weight"))?,
        ffn: Ffn::Moe(moe),
        out_norms: None,
    })
}
