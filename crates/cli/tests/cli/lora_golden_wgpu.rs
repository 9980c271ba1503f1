//! LoRA adapters on wgpu against HF transformers + peft: the golden files of tests/golden/lora
//! by the same rule as the reference (crates/conformance/tests/conformance/lora_reference.rs),
//! each adapter alone and mixed in one batch with the base model and another adapter.

use tandem_conformance::lora_golden::{check_lora, check_lora_mixed};

fn wgpu() -> Option<tandem_wgpu::WgpuBackend> {
    match tandem_wgpu::WgpuBackend::new() {
        Ok(b) => Some(b),
        Err(e) if std::env::var_os("TANDEM_REQUIRE_WGPU").is_none() => {
            tandem_core::skip::note(format!("wgpu LoRA golden test: no adapter ({e})"));
            None
        }
        Err(e) => panic!("TANDEM_REQUIRE_WGPU is set but wgpu cannot start: {e}"),
    }
}

/// Adapter `name` alone, then mixed with the base model and `other` (made for the same model).
fn check(name: &str, other: Option<&str>) {
    let Some(b) = wgpu() else { return };
    check_lora(b, name, 1e-3).unwrap_or_else(|e| panic!("{e}")).iter().for_each(|l| println!("{l}"));
    let Some(b) = wgpu() else { return };
    println!("{}", check_lora_mixed(b, name, other, 1e-3).unwrap_or_else(|e| panic!("{e}")));
}

#[test]
fn lora_all_projections_matches_peft_on_wgpu() {
    check("tiny-all", Some("tiny-rs"));
}

#[test]
fn lora_rslora_regex_targets_matches_peft_on_wgpu() {
    check("tiny-rs", Some("tiny-all"));
}

#[test]
fn lora_phi3_fused_projections_matches_peft_on_wgpu() {
    check("tiny-phi3-fused", None);
}

#[test]
fn lora_qwen3_qk_norm_matches_peft_on_wgpu() {
    check("tiny-qwen3-attn", None);
}

#[test]
fn lora_gemma3_sandwich_norms_matches_peft_on_wgpu() {
    check("tiny-gemma3-all", None);
}
