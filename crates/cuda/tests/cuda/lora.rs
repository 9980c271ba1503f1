//! LoRA adapters on CUDA (the segmented update of kernels/lora.cu) against HF transformers +
//! peft: the golden files of tests/golden/lora by the rule the reference and wgpu pass (greedy
//! ids equal on every prompt, log-probabilities within 1e-3, the base rows giving HF's base
//! ids), each adapter alone, and the two adapters made for one model mixed in one batch with
//! the base model, each row giving the ids it gives alone. With an f32 KV cache, as the reference
//! and wgpu keep theirs (CUDA's default bf16 cache rounds each K/V value to 8 significant bits,
//! which alone can move a log-probability past 1e-3: see int4.rs). Without a driver it prints
//! SKIPPED; TANDEM_REQUIRE_CUDA=1 turns that into a failure.

use tandem_conformance::lora_golden::{check_lora_kv, check_lora_mixed_kv};
use tandem_core::backend::KvDtype;

const ADAPTERS: [&str; 5] = ["tiny-all", "tiny-rs", "tiny-phi3-fused", "tiny-qwen3-attn", "tiny-gemma3-all"];

#[test]
fn lora_goldens_match_peft_on_cuda() {
    for name in ADAPTERS {
        let Some(cuda) = crate::gpu_or_skip(&format!("lora::{name}")) else { return };
        let lines = check_lora_kv(cuda, name, 1e-3, Some(KvDtype::F32)).unwrap_or_else(|e| panic!("{e}"));
        lines.iter().for_each(|l| println!("{l}"));
    }
}

#[test]
fn lora_mixed_batch_matches_peft_and_each_row_alone_on_cuda() {
    let Some(cuda) = crate::gpu_or_skip("lora::mixed") else { return };
    let line = check_lora_mixed_kv(cuda, "tiny-all", Some("tiny-rs"), 1e-3, Some(KvDtype::F32))
        .unwrap_or_else(|e| panic!("{e}"));
    println!("{line}");
}
