//! An FP8 checkpoint on the reference against HF transformers: tests/golden/fp8-block, a bf16
//! Llama whose projections transformers' own FP8 quantizer wrote in e4m3 with 128 x 128 block
//! scales (`quant_method: "fp8"`, tests/fp8_golden.py), kept in 8 bits at load.

use tandem_conformance::golden::{self, GoldenFile};
use tandem_core::model::LoadOptions;
use tandem_core::quant_layout::{Fp8Scales, QuantLayout};
use tandem_core::weights::Weights;
use tandem_core::{DType, Model, ModelConfig, ModelRunner};
use tandem_reference::RefBackend;

fn dir() -> std::path::PathBuf {
    golden::golden_dir().join("fp8-block")
}

fn open() -> (ModelConfig, Weights) {
    let cfg = ModelConfig::from_file(&dir().join("config.json")).unwrap();
    (cfg, Weights::open(&dir()).unwrap())
}

/// Every projection of the two layers (7 a layer) is kept as e4m3 runs, each 32 values led by
/// its block's f32 scale: 36 bytes a run.
#[test]
fn fp8_checkpoint_loads_kept_in_8_bits() {
    let (_, w) = open();
    let layouts: Vec<(&str, QuantLayout)> = w.quantized().collect();
    assert_eq!(layouts.len(), 14, "{layouts:?}");
    assert!(layouts.iter().all(|(_, l)| *l == QuantLayout::Fp8E4m3(Fp8Scales::Block)), "{layouts:?}");
    let up = w.get("model.layers.0.mlp.up_proj.weight", &[256, 256]).unwrap();
    assert_eq!(up.bytes().len(), 256 * 256 / 32 * 36);
}

/// `tandem:model_weights_bytes` on the reference: the kept model holds 2 - 36/32 bytes fewer
/// a projection value than the same model widened to bf16 at load, and no more than 1.15x the
/// checkpoint's tensor bytes.
#[test]
fn fp8_checkpoint_holds_8_bit_bytes() {
    let (cfg, kept) = open();
    let mut widened = Weights::open(&dir()).unwrap();
    let mut values = 0usize;
    let names: Vec<String> = kept.quantized().map(|(n, _)| n.to_string()).collect();
    for name in &names {
        let shape = kept.shape(name).unwrap().to_vec();
        values += shape.iter().product::<usize>();
        widened.replace(name, DType::BF16, &shape, &kept.get(name, &shape).unwrap().to_f32()).unwrap();
    }
    let opts =
        LoadOptions { max_batch_tokens: 16, max_seqs: 1, num_kv_blocks: 4, block_size: 16, ..Default::default() };
    let held = Model::from_weights(RefBackend::new(), cfg.clone(), &kept, opts).unwrap().weights_bytes().unwrap();
    let held_wide = Model::from_weights(RefBackend::new(), cfg, &widened, opts).unwrap().weights_bytes().unwrap();
    assert_eq!(held_wide - held, (values * 2 - values / 32 * 36) as u64, "kept {held}, widened {held_wide}");
    let file = std::fs::metadata(dir().join("model.safetensors")).unwrap().len();
    assert!((held as f64) <= 1.15 * file as f64, "held {held} bytes for a {file}-byte file");
}

/// The golden HF transformers wrote on its own load of the checkpoint (dequantized into bf16,
/// run in f32): greedy ids equal on every prompt, log-probabilities within 1e-3.
#[test]
fn fp8_checkpoint_passes_hf_golden() {
    let g = GoldenFile::load(&golden::golden_dir().join("fp8-block.json")).unwrap();
    let (cfg, w) = open();
    let lines = golden::check_weights(RefBackend::new(), cfg, &w, &g, 1e-3).unwrap();
    println!("{lines:?}");
    assert!(lines.iter().all(|l| l.contains("diverged at None")), "{lines:?}");
}

/// The golden tells a wrong scale: the checkpoint with one block's scale of one projection
/// doubled must fail it.
#[test]
fn fp8_golden_catches_a_wrong_block_scale() {
    let (cfg, mut w) = open();
    let name = "model.layers.0.self_attn.v_proj.weight";
    let shape = w.shape(name).unwrap().to_vec();
    let mut v = w.get(name, &shape).unwrap().to_f32();
    // The top-left 128 x 128 block.
    for r in 0..128 {
        v[r * shape[1]..][..128].iter_mut().for_each(|x| *x *= 2.0);
    }
    w.replace(name, DType::BF16, &shape, &v).unwrap();
    let g = GoldenFile::load(&golden::golden_dir().join("fp8-block.json")).unwrap();
    let told = match golden::check_weights(RefBackend::new(), cfg, &w, &g, 1e-3) {
        Err(e) => e,
        Ok(lines) => lines.into_iter().find(|l| !l.contains("diverged at None")).expect("a doubled scale must be told"),
    };
    println!("doubled block scale: {told}");
}
