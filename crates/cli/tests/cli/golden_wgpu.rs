//! The wgpu backend against HF transformers: the same golden files and rule as the reference
//! backend (crates/conformance/tests/golden_reference.rs), on software or real Vulkan.

use tandem_conformance::golden;

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

fn check(name: &str) {
    if let Some(b) = wgpu() {
        golden::assert_golden(b, name, &golden::golden_model(name), 1e-3);
    }
}

tandem_conformance::golden_tests!(check);

#[test]
fn smollm2_135m() {
    let Some(dir) = golden::smollm2_dir() else { return };
    if let Some(b) = wgpu() {
        golden::assert_golden(b, "smollm2-135m", &dir, 1e-3);
    }
}

/// The Qwen3-MoE directory transformers 5.25 saved (`num_local_experts`, `rope_parameters`)
/// passes tiny-qwen3-moe's golden on wgpu too.
#[test]
fn qwen3_moe_saved_by_transformers5() {
    if let Some(b) = wgpu() {
        golden::assert_golden(b, "tiny-qwen3-moe", &golden::golden_dir().join("tiny-qwen3-moe-tf5"), 1e-3);
    }
}

/// The int4 checkpoints of tests/golden/int4 (compressed-tensors' own, and the same values in
/// AWQ's and GPTQ's layouts), kept 4-bit on wgpu, pass the golden HF transformers wrote.
#[test]
fn int4_checkpoints_kept_quantized() {
    for format in ["ct", "awq", "gptq"] {
        if let Some(b) = wgpu() {
            golden::assert_golden(b, "int4/ct", &golden::golden_dir().join("int4").join(format), 1e-3);
        }
    }
}

/// The FP8 checkpoint of tests/golden/fp8-block (transformers' own quantizer, e4m3 with 128 x
/// 128 block scales), kept in 8 bits on wgpu, passes the golden transformers wrote on its own
/// load of it. Its weights take the kept bytes: with weights in buffers, at most 1.15x the
/// file (bf16 projections alone would take 1.5x); in textures (the default on CPU adapters)
/// every projection is still held quantized, but each small weight pads to whole 64 KiB texture
/// rows, so this tiny model's byte count there says nothing about 8 bits.
#[test]
fn fp8_block_checkpoint_kept_in_8_bits() {
    let Some(b) = wgpu() else { return };
    let dir = golden::golden_dir().join("fp8-block");
    let cfg = tandem_core::ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let w = tandem_core::weights::Weights::open(&dir).unwrap();
    for (name, layout) in w.quantized() {
        let up = tandem_core::backend::Storage::upload_weight(&b, &w.get(name, w.shape(name).unwrap()).unwrap());
        assert_eq!(up.unwrap().kind(), tandem_wgpu::BufKind::Quant(layout), "{name}");
    }
    let opts = tandem_core::model::LoadOptions {
        max_batch_tokens: 16,
        max_seqs: 1,
        num_kv_blocks: 4,
        block_size: 16,
        ..Default::default()
    };
    let buffers = tandem_wgpu::WgpuOptions { texel_weights: Some(false), ..Default::default() };
    let plain = tandem_wgpu::WgpuBackend::with_options(buffers).unwrap();
    let m = tandem_core::Model::from_weights(plain, cfg, &w, opts).unwrap();
    let held = tandem_core::ModelRunner::weights_bytes(&m).expect("wgpu counts its weight bytes");
    drop(m);
    let file = std::fs::metadata(dir.join("model.safetensors")).unwrap().len();
    assert!((held as f64) <= 1.15 * file as f64, "held {held} bytes for a {file}-byte file");
    golden::assert_golden(b, "fp8-block", &dir, 1e-3);
}
