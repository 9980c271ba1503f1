//! The Hugging Face model families this crate writes directories of (`random_model`'s shapes,
//! `convert`'s GGUF imports), with what each one's config and tensor names need, and how
//! llama.cpp's `general.architecture` names map onto them.

/// A family as HF transformers names it (`architectures[0]`, `model_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    Mixtral,
    /// Gemma 3's text model (`Gemma3ForCausalLM`).
    Gemma3,
}

impl Family {
    /// llama.cpp's `general.architecture` names the converter reads.
    pub const GGUF_NAMES: &'static [&'static str] = &["llama", "qwen2", "qwen3", "qwen3moe", "gemma3"];

    /// `config.json`'s `architectures[0]` and `model_type`.
    pub fn hf_names(self) -> (&'static str, &'static str) {
        match self {
            Family::Llama => ("LlamaForCausalLM", "llama"),
            Family::Mistral => ("MistralForCausalLM", "mistral"),
            Family::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
            Family::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
            Family::Qwen3Moe => ("Qwen3MoeForCausalLM", "qwen3_moe"),
            Family::Mixtral => ("MixtralForCausalLM", "mixtral"),
            Family::Gemma3 => ("Gemma3ForCausalLM", "gemma3_text"),
        }
    }

    /// Per-head RMS norms on q and k (`self_attn.q_norm`, `self_attn.k_norm`).
    pub fn qk_norm(self) -> bool {
        matches!(self, Family::Qwen3 | Family::Qwen3Moe | Family::Gemma3)
    }

    /// A mixture of experts in every layer (Qwen3-MoE's `mlp_only_layers` aside).
    pub fn moe(self) -> bool {
        matches!(self, Family::Qwen3Moe | Family::Mixtral)
    }

    /// Where a MoE layer's router and experts live in HF's names, and the experts' gate, up
    /// and down projections' names.
    pub fn moe_names(self) -> (&'static str, [&'static str; 3]) {
        match self {
            Family::Mixtral => ("block_sparse_moe", ["w1", "w3", "w2"]),
            _ => ("mlp", ["gate_proj", "up_proj", "down_proj"]),
        }
    }

    /// The family of a GGUF's `general.architecture`; `llama` with experts
    /// (`llama.expert_count`) is Mixtral. Mistral's files say `llama` and convert as Llama.
    pub fn from_gguf(name: &str, has_experts: bool) -> Option<Family> {
        Some(match name {
            "llama" if has_experts => Family::Mixtral,
            "llama" => Family::Llama,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "qwen3moe" => Family::Qwen3Moe,
            "gemma3" => Family::Gemma3,
            _ => return None,
        })
    }

    /// The `general.architecture` llama.cpp writes for this family, also its metadata keys'
    /// prefix (`{arch}.block_count`, ...).
    pub fn gguf_name(self) -> &'static str {
        match self {
            Family::Llama | Family::Mistral | Family::Mixtral => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Qwen3Moe => "qwen3moe",
            Family::Gemma3 => "gemma3",
        }
    }

    /// llama.cpp's exporter permutes Q and K rows only for its `llama` architecture (its rope
    /// pairs adjacent dimensions there); Qwen and Gemma 3 use the NEOX rope and are stored as HF
    /// stores them (convert_hf_to_gguf.py's Gemma3Model derives from TextModel, not LlamaModel).
    pub fn gguf_permuted(self) -> bool {
        self.gguf_name() == "llama"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gguf_name_round_trips() {
        for &name in Family::GGUF_NAMES {
            for experts in [false, true] {
                let f = Family::from_gguf(name, experts).unwrap();
                assert_eq!(f.gguf_name(), name);
            }
        }
        assert_eq!(Family::from_gguf("llama", true), Some(Family::Mixtral));
        assert_eq!(Family::from_gguf("gemma2", false), None);
        assert!(Family::Mixtral.gguf_permuted() && !Family::Qwen3.gguf_permuted() && !Family::Gemma3.gguf_permuted());
    }
}
