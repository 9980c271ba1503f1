//! Mistral (`MistralForCausalLM`): Llama's layer, every layer attending within
//! `sliding_window` keys (MistralConfig's 4096 where the field is absent, none where it is null).

use super::Family;
use crate::config::{windows, ModelConfig, RawConfig};

pub(super) use super::llama::layer;

pub(super) const FAMILY: Family = Family { rules, ..Family::new("MistralForCausalLM", "mistral") };

fn rules(raw: &RawConfig, cfg: &mut ModelConfig) -> Result<(), String> {
    let window = raw.sliding_window()?.unwrap_or(Some(4096));
    cfg.layer_windows = windows(window, &vec![true; cfg.num_hidden_layers]);
    Ok(())
}
