//! The wgpu backend against HF transformers: the same golden files and rule as the reference
//! backend (crates/conformance/tests/golden_reference.rs), on software or real Vulkan.

use tandem_conformance::golden;
use tandem_core::DType;

fn wgpu() -> Option<tandem_wgpu::WgpuBackend> {
    match tandem_wgpu::WgpuBackend::new() {
        Ok(b) => Some(b),
        Err(e) if std::env::var_os("TANDEM_REQUIRE_WGPU").is_none() => {
            tandem_core::skip::note(format!("wgpu golden test: no adapter ({e})"));
            None
        }
        Err(e) => panic!("TANDEM_REQUIRE_WGPU is set but wgpu cannot start: {e}"),
    }
}

fn check(name: &str, dir: &std::path::Path, tol: f64) {
    if let Some(b) = wgpu() {
        golden::assert_golden(b, name, dir, tol);
    }
}

#[test]
fn tiny_untied_gqa2_f32() {
    check("tiny", &golden::random_model("tiny", 1, DType::F32), 1e-3);
}

#[test]
fn tiny_tied_bf16() {
    check("tiny-tied", &golden::random_model("tiny-tied", 2, DType::BF16), 1e-3);
}

#[test]
fn tiny_qwen3_f32() {
    check("tiny-qwen3", &golden::random_model("tiny-qwen3", 3, DType::F32), 1e-3);
}

#[test]
fn tiny_qwen3_moe_f32() {
    check("tiny-qwen3-moe", &golden::random_model("tiny-qwen3-moe", 4, DType::F32), 1e-3);
}

#[test]
fn tiny_mixtral_f32() {
    check("tiny-mixtral", &golden::random_model("tiny-mixtral", 5, DType::F32), 1e-3);
}

/// Sliding windows (16 keys, shorter than the prompts): Mistral on every layer, Qwen2 on layer 1.
#[test]
fn tiny_mistral_window_f32() {
    check("tiny-mistral", &golden::random_model("tiny-mistral", 6, DType::F32), 1e-3);
}

#[test]
fn tiny_qwen2_window_f32() {
    check("tiny-qwen2", &golden::random_model("tiny-qwen2", 7, DType::F32), 1e-3);
}

#[test]
fn smollm2_135m() {
    let Some(dir) = golden::smollm2_dir() else { return };
    check("smollm2-135m", &dir, 1e-3);
}
