//! Qwen3 (`Qwen3ForCausalLM`): Llama's layer with an RMS norm over each head of q and of k
//! (`self_attn.q_norm`, `self_attn.k_norm`, `[head_dim]` each) between the projection and rope,
//! no q/k/v biases by default, and a head_dim of its own (not hidden / heads: Qwen3-0.6B has
//! hidden 1024, 16 heads of 128). It slides as Qwen2 does.

use super::layers::{AttnOptions, Ffn, Layer, Loader, MLP_NAMES};
use super::Family;
use crate::backend::Backend;
use crate::config::{ModelConfig, RawConfig};
use crate::error::Result;

pub(super) const FAMILY: Family = Family { rules, ..Family::new("Qwen3ForCausalLM", "qwen3") };

fn rules(raw: &RawConfig, cfg: &mut ModelConfig) -> std::result::Result<(), String> {
    cfg.layer_windows = super::qwen2::qwen_windows(raw, cfg.num_hidden_layers)?;
    Ok(())
}

/// Layer `i` under HF's names.
pub(super) fn layer<B: Backend>(ld: &mut Loader<'_, B>, i: usize) -> Result<Layer<B>> {
    let p = format!("model.layers.{i}");
    let attn = ld.attention(&format!("{p}.self_attn"), AttnOptions { bias: ld.cfg.attention_bias, qk_norm: true })?;
    let mlp = ld.mlp(&format!("{p}.mlp"), MLP_NAMES, ld.cfg.intermediate_size)?;
    Ok(Layer::new(
        ld.norm(&format!("{p}.input_layernorm.weight"))?,
        attn,
        ld.norm(&format!("{p}.post_attention_layernorm.weight"))?,
        Ffn::Dense(mlp),
    ))
}
