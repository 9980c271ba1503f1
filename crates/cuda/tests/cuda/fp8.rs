//! A bf16 model with FP8 e4m3 projections (128 x 128 block scales, as Qwen3-*-FP8 ships) kept
//! in 8 bits on CUDA (kernels/quant_matmul.cu's `fp8` kernels) and on the reference: greedy ids
//! equal, and logits no farther from the reference's than those of the same model widened to
//! bf16 on CUDA (which stores a bf16 model's activations in 16 bits: ~1e-6 NMSE; an f32 KV
//! cache on CUDA). Without a driver it prints SKIPPED; TANDEM_REQUIRE_CUDA=1 turns that into a
//! failure.

use tandem_core::backend::KvDtype;
use tandem_core::greedy::{generate, Step};
use tandem_core::model::LoadOptions;
use tandem_core::quant_layout::QuantLayout;
use tandem_core::weights::Weights;
use tandem_core::{DType, Model, ModelConfig};
use tandem_reference::RefBackend;

const PROMPT: [u32; 5] = [1, 40, 77, 200, 5];

#[test]
fn an_fp8_model_kept_in_8_bits_gives_the_references_greedy_ids() {
    let Some(cuda) = crate::gpu_or_skip("fp8::an_fp8_model_kept_in_8_bits_gives_the_references_greedy_ids") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("tandem-cuda-fp8-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let shape = tandem_model_files::random_model::Shape::parse("tiny").unwrap();
    tandem_model_files::random_model::write_random_model(&dir, shape, 21, DType::BF16).unwrap();
    tandem_model_files::fp8::quantize_dir(&dir, [128, 128]).unwrap();
    let w = Weights::open(&dir).unwrap();
    assert!(w.quantized().count() > 0 && w.quantized().all(|(_, l)| matches!(l, QuantLayout::Fp8E4m3(_))));
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let opts = LoadOptions { max_batch_tokens: 16, max_seqs: 2, num_kv_blocks: 8, ..Default::default() };
    let f32_cache = LoadOptions { kv_dtype: Some(KvDtype::F32), ..opts };
    // The same model as tandem loaded it before: every kept weight widened to bf16.
    let mut widened = Weights::open(&dir).unwrap();
    for name in w.quantized().map(|(n, _)| n.to_string()).collect::<Vec<_>>() {
        let shape = w.shape(&name).unwrap().to_vec();
        widened.replace(&name, DType::BF16, &shape, &w.get(&name, &shape).unwrap().to_f32()).unwrap();
    }
    let cuda_wide = tandem_cuda::CudaBackend::new(0).unwrap();
    let mut on_cuda = Model::from_weights(cuda, cfg.clone(), &w, f32_cache).unwrap();
    let mut on_cuda_wide = Model::from_weights(cuda_wide, cfg.clone(), &widened, f32_cache).unwrap();
    let mut on_ref = Model::from_weights(RefBackend::new(), cfg, &w, opts).unwrap();
    let got = generate(&mut on_cuda, &PROMPT, 6, &[], true, |_| {}).unwrap();
    let wide = generate(&mut on_cuda_wide, &PROMPT, 6, &[], true, |_| {}).unwrap();
    let want = generate(&mut on_ref, &PROMPT, 6, &[], true, |_| {}).unwrap();
    let ids = |s: &[Step]| s.iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(ids(&got), ids(&want));
    assert_eq!(ids(&wide), ids(&want));
    let nmse = |a: &[Step]| -> f64 {
        let (mut num, mut den) = (0f64, 0f64);
        for (g, r) in a.iter().zip(&want) {
            num += g.logits.iter().zip(&r.logits).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>();
            den += r.logits.iter().map(|b| (*b as f64).powi(2)).sum::<f64>();
        }
        num / den.max(1e-30)
    };
    let (kept, widened) = (nmse(&got), nmse(&wide));
    eprintln!("logits NMSE against the reference: kept {kept:.3e}, widened {widened:.3e}");
    assert!(kept <= 2.0 * widened + 1e-9 && kept < 1e-4, "kept {kept:.3e}, widened {widened:.3e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
