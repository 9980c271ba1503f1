//! The model families as this crate writes their directories (`random_model`'s shapes,
//! `convert`'s GGUF imports): the core's [`Family`] (the one family type, from the model
//! layer's list), and what this crate adds to each, keyed by its architecture: how its
//! checkpoint names its tensors and how llama.cpp's `general.architecture` names it.

pub use tandem_core::model::Family;

pub const LLAMA: &str = "LlamaForCausalLM";
pub const MISTRAL: &str = "MistralForCausalLM";
pub const QWEN2: &str = "Qwen2ForCausalLM";
pub const QWEN3: &str = "Qwen3ForCausalLM";
pub const QWEN3_MOE: &str = "Qwen3MoeForCausalLM";
pub const MIXTRAL: &str = "MixtralForCausalLM";
pub const GEMMA3: &str = "Gemma3ForCausalLM";
pub const PHI3: &str = "Phi3ForCausalLM";

/// The family of this architecture; every constant above names one.
pub fn named(architecture: &str) -> &'static Family {
    tandem_core::model::family_named(architecture)
        .unwrap_or_else(|| panic!("`{architecture}` is not in the model layer's family list"))
}

/// What this crate knows of a family's checkpoint beyond the core's [`Family`].
struct Checkpoint {
    architecture: &'static str,
    /// llama.cpp's `general.architecture`, also its metadata keys' prefix; None: no GGUF import.
    gguf: Option<&'static str>,
    /// Per-head RMS norms on q and k (`self_attn.q_norm`, `self_attn.k_norm`).
    qk_norm: bool,
    /// A MoE layer's block and its experts' gate, up and down projections' names.
    moe: Option<(&'static str, [&'static str; 3])>,
}

const MLP: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

const CHECKPOINTS: &[Checkpoint] = &[
    Checkpoint { architecture: LLAMA, gguf: Some("llama"), qk_norm: false, moe: None },
    Checkpoint { architecture: MISTRAL, gguf: Some("llama"), qk_norm: false, moe: None },
    Checkpoint { architecture: QWEN2, gguf: Some("qwen2"), qk_norm: false, moe: None },
    Checkpoint { architecture: QWEN3, gguf: Some("qwen3"), qk_norm: true, moe: None },
    Checkpoint { architecture: QWEN3_MOE, gguf: Some("qwen3moe"), qk_norm: true, moe: Some(("mlp", MLP)) },
    Checkpoint {
        architecture: MIXTRAL,
        gguf: Some("llama"),
        qk_norm: false,
        moe: Some(("block_sparse_moe", ["w1", "w3", "w2"])),
    },
    Checkpoint { architecture: GEMMA3, gguf: Some("gemma3"), qk_norm: true, moe: None },
    Checkpoint { architecture: PHI3, gguf: None, qk_norm: false, moe: None },
];

/// llama.cpp's `general.architecture` names the converter reads.
pub const GGUF_NAMES: &[&str] = &["llama", "qwen2", "qwen3", "qwen3moe", "gemma3"];

/// The family of a GGUF's `general.architecture`; `llama` with experts
/// (`llama.expert_count`) is Mixtral. Mistral's files say `llama` and convert as Llama.
pub fn from_gguf(name: &str, has_experts: bool) -> Option<&'static Family> {
    Some(named(match name {
        "llama" if has_experts => MIXTRAL,
        "llama" => LLAMA,
        "qwen2" => QWEN2,
        "qwen3" => QWEN3,
        "qwen3moe" => QWEN3_MOE,
        "gemma3" => GEMMA3,
        _ => return None,
    }))
}

/// A family's checkpoint traits (this crate's table, keyed by the core family's architecture).
pub trait CheckpointNames {
    /// Whether this is the family of `architecture`.
    fn is(&self, architecture: &str) -> bool;
    /// `config.json`'s `architectures[0]` and `model_type`.
    fn hf_names(&self) -> (&'static str, &'static str);
    /// Per-head RMS norms on q and k (`self_attn.q_norm`, `self_attn.k_norm`).
    fn qk_norm(&self) -> bool;
    /// A mixture of experts in every layer (Qwen3-MoE's `mlp_only_layers` aside).
    fn moe(&self) -> bool;
    /// Where a MoE layer's router and experts live in HF's names, and the experts' gate, up
    /// and down projections' names.
    fn moe_names(&self) -> (&'static str, [&'static str; 3]);
    /// The `general.architecture` llama.cpp writes for this family, also its metadata keys'
    /// prefix (`{arch}.block_count`, ...).
    fn gguf_name(&self) -> &'static str;
    /// llama.cpp's exporter permutes Q and K rows only for its `llama` architecture (its rope
    /// pairs adjacent dimensions there); Qwen and Gemma 3 use the NEOX rope and are stored as HF
    /// stores them (convert_hf_to_gguf.py's Gemma3Model derives from TextModel, not LlamaModel).
    fn gguf_permuted(&self) -> bool;
}

fn checkpoint(f: &Family) -> &'static Checkpoint {
    CHECKPOINTS
        .iter()
        .find(|c| c.architecture == f.architecture)
        .unwrap_or_else(|| panic!("no checkpoint names for `{}`", f.architecture))
}

impl CheckpointNames for Family {
    fn is(&self, architecture: &str) -> bool {
        self.architecture == architecture
    }
    fn hf_names(&self) -> (&'static str, &'static str) {
        (self.architecture, self.model_type)
    }
    fn qk_norm(&self) -> bool {
        checkpoint(self).qk_norm
    }
    fn moe(&self) -> bool {
        checkpoint(self).moe.is_some()
    }
    fn moe_names(&self) -> (&'static str, [&'static str; 3]) {
        checkpoint(self).moe.unwrap_or(("mlp", MLP))
    }
    fn gguf_name(&self) -> &'static str {
        checkpoint(self).gguf.unwrap_or("")
    }
    fn gguf_permuted(&self) -> bool {
        self.gguf_name() == "llama"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gguf_name_round_trips() {
        for &name in GGUF_NAMES {
            for experts in [false, true] {
                let f = from_gguf(name, experts).unwrap();
                assert_eq!(f.gguf_name(), name);
            }
        }
        assert_eq!(from_gguf("llama", true), Some(named(MIXTRAL)));
        assert_eq!(from_gguf("gemma2", false), None);
        assert!(named(MIXTRAL).gguf_permuted() && !named(QWEN3).gguf_permuted() && !named(GEMMA3).gguf_permuted());
    }

    /// Every family of the model layer has this crate's checkpoint names, and every row here
    /// is a family there.
    #[test]
    fn the_table_covers_the_model_layers_families() {
        let core: Vec<&str> = tandem_core::model::families().map(|f| f.architecture).collect();
        let here: Vec<&str> = CHECKPOINTS.iter().map(|c| c.architecture).collect();
        assert_eq!(core.len(), here.len(), "{core:?} vs {here:?}");
        assert!(core.iter().all(|a| here.contains(a)), "{core:?} vs {here:?}");
    }
}
