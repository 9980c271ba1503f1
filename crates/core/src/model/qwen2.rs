//! Qwen2 (`Qwen2ForCausalLM`): Llama's layer with q/k/v biases unless `attention_bias` says
//! otherwise, and a sliding window only with `use_sliding_window`, on the layers `layer_types`
//! marks `sliding_attention` (default: from `max_window_layers` on). Qwen3 slides the same way.
//! MiMo (`MiMoForCausalLM`, `mimo`) is a Qwen2 model whose checkpoint also holds MTP layers
//! (`model.mtp_layers.N.*`, which the target's forward never reads; [`crate::mtp`] does).

use super::Family;
use crate::config::{windows, ModelConfig, RawConfig};

pub(super) use super::llama::layer;

pub(super) const FAMILY: Family = Family { rules, also: &["MiMoForCausalLM", "mimo"], ..Family::new("Qwen2ForCausalLM", "qwen2") };

fn rules(raw: &RawConfig, cfg: &mut ModelConfig) -> Result<(), String> {
    cfg.attention_bias = raw.attention_bias.unwrap_or(true);
    cfg.layer_windows = qwen_windows(raw, cfg.num_hidden_layers)?;
    Ok(())
}

/// Each layer's window as Qwen2's and Qwen3's configuration and modeling code apply it.
pub(super) fn qwen_windows(raw: &RawConfig, layers: usize) -> Result<Vec<usize>, String> {
    let sliding = raw.layer_types(layers, |i| i >= raw.max_window_layers.unwrap_or(28))?;
    let window = match raw.use_sliding_window.unwrap_or(false) {
        true => raw.sliding_window()?.unwrap_or(Some(4096)),
        false => None,
    };
    Ok(windows(window, &sliding))
}
