//! A whole model kept quantized on CUDA: the tiny Q8_0 GGUF file
//! (`tandem_model_files::tiny_gguf`: every matrix, the embedding and the LM head in Q8_0) loaded
//! from its blocks on CUDA (kernels/quant_matmul.cu) and on the reference, greedy ids equal and
//! logits within 1e-9 NMSE (both in f32: an f32 KV cache on CUDA). Without a driver it prints SKIPPED; TANDEM_REQUIRE_CUDA=1 turns
//! that into a failure.

use tandem_core::backend::KvDtype;
use tandem_core::greedy::{generate, Step};
use tandem_core::model::LoadOptions;
use tandem_core::{Model, ModelConfig};
use tandem_model_files::convert::{gguf_model_dir, gguf_weights};
use tandem_reference::RefBackend;

const PROMPT: [u32; 5] = [1, 40, 77, 200, 5];

#[test]
fn a_q8_0_gguf_model_gives_the_references_greedy_ids() {
    let Some(cuda) = crate::gpu_or_skip("quant::a_q8_0_gguf_model_gives_the_references_greedy_ids") else {
        return;
    };
    let root = std::env::temp_dir().join(format!("tandem-cuda-quant-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let gguf = root.join("tiny-q8_0.gguf");
    tandem_model_files::tiny_gguf::write_tiny_gguf(&gguf, 0).unwrap();
    let w = gguf_weights(&gguf).unwrap();
    assert!(w.quantized().count() > 0);
    let dir = gguf_model_dir(&gguf, &root.join("cache")).unwrap();
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let opts = LoadOptions { max_batch_tokens: 16, max_seqs: 2, num_kv_blocks: 8, ..Default::default() };
    // An f32 cache on CUDA too (its default rounds K/V to bf16), so the logits differ only by
    // the order of f32 sums.
    let f32_cache = LoadOptions { kv_dtype: Some(KvDtype::F32), ..opts };
    let mut on_cuda = Model::from_weights(cuda, cfg.clone(), &w, f32_cache).unwrap();
    let mut on_ref = Model::from_weights(RefBackend::new(), cfg, &w, opts).unwrap();
    let got = generate(&mut on_cuda, &PROMPT, 6, &[], true, |_| {}).unwrap();
    let want = generate(&mut on_ref, &PROMPT, 6, &[], true, |_| {}).unwrap();
    let ids = |s: &[Step]| s.iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(ids(&got), ids(&want));
    assert!(ids(&want).iter().any(|&i| i != want[0].id), "the greedy ids vary: {:?}", ids(&want));
    for (g, r) in got.iter().zip(&want) {
        let num: f64 = g.logits.iter().zip(&r.logits).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let den: f64 = r.logits.iter().map(|b| (*b as f64).powi(2)).sum();
        assert!(num / den.max(1e-30) < 1e-9, "logits NMSE {}", num / den);
    }
    std::fs::remove_dir_all(&root).unwrap();
}
