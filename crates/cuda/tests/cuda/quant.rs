//! A whole model kept quantized on CUDA: the tiny Q8_0 GGUF file
//! (`tandem_model_files::tiny_gguf`: every matrix, the embedding and the LM head in Q8_0) and
//! the tiny K-quant file (Q4_K projections and embedding, a Q6_K head: llama.cpp's Q4_K_M mix)
//! loaded from their blocks on CUDA (kernels/quant_matmul.cu) and on the reference, greedy ids
//! equal and logits within 1e-9 NMSE (both in f32: an f32 KV cache on CUDA). With
//! `TANDEM_CUDA_QUANT_TC=1` the matmuls run on the tensor cores (kernels/quant_mma.cu), which
//! round x to bf16: the logits are then held to 1e-4 NMSE (a unit roundoff of 2^-9 a matmul
//! input, through the model's layers), the greedy ids still equal. Without a driver it prints
//! SKIPPED; TANDEM_REQUIRE_CUDA=1 turns that into a failure.

use tandem_core::backend::KvDtype;
use tandem_core::greedy::{generate, Step};
use tandem_core::model::LoadOptions;
use tandem_core::{Model, ModelConfig};
use tandem_model_files::convert::{gguf_model_dir, gguf_weights};
use tandem_reference::RefBackend;

const PROMPT: [u32; 5] = [1, 40, 77, 200, 5];

#[test]
fn a_q8_0_gguf_model_gives_the_references_greedy_ids() {
    same_as_the_reference("tiny-q8_0.gguf", tandem_model_files::tiny_gguf::write_tiny_gguf, 0, true);
}

#[test]
fn a_q4_k_m_gguf_model_gives_the_references_greedy_ids() {
    // The tiny K-quant model repeats one id from this prompt (at salts 0 and 3): its ids are
    // compared, not required to vary; its logits carry the comparison.
    same_as_the_reference("tiny-q4_k.gguf", tandem_model_files::tiny_gguf::write_tiny_kquant_gguf, 0, false);
}

fn same_as_the_reference(
    file: &str,
    write: fn(&std::path::Path, usize) -> tandem_core::Result<()>,
    salt: usize,
    ids_vary: bool,
) {
    let test = format!("quant::same_as_the_reference({file})");
    let Some(cuda) = crate::gpu_or_skip(&test) else {
        return;
    };
    let tensor_cores = std::env::var("TANDEM_CUDA_QUANT_TC").is_ok_and(|v| v == "1");
    let limit = if tensor_cores { 1e-4 } else { 1e-9 };
    let root = std::env::temp_dir().join(format!("tandem-cuda-quant-{}-{file}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let gguf = root.join(file);
    write(&gguf, salt).unwrap();
    let w = gguf_weights(&gguf).unwrap();
    assert!(w.quantized().count() > 0);
    let dir = gguf_model_dir(&gguf, &root.join("cache")).unwrap();
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let opts = LoadOptions { max_batch_tokens: 16, max_seqs: 2, num_kv_blocks: 8, ..Default::default() };
    // An f32 cache on CUDA too (its default rounds K/V to bf16), so the logits differ only by
    // the order of f32 sums (and, on the tensor cores, x rounded to bf16).
    let f32_cache = LoadOptions { kv_dtype: Some(KvDtype::F32), ..opts };
    let mut on_cuda = Model::from_weights(cuda, cfg.clone(), &w, f32_cache).unwrap();
    let mut on_ref = Model::from_weights(RefBackend::new(), cfg, &w, opts).unwrap();
    let got = generate(&mut on_cuda, &PROMPT, 6, &[], true, |_| {}).unwrap();
    let want = generate(&mut on_ref, &PROMPT, 6, &[], true, |_| {}).unwrap();
    let ids = |s: &[Step]| s.iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(ids(&got), ids(&want), "{file}");
    if ids_vary {
        assert!(ids(&want).iter().any(|&i| i != want[0].id), "{file}: the greedy ids vary: {:?}", ids(&want));
    }
    for (i, (g, r)) in got.iter().zip(&want).enumerate() {
        let num: f64 = g.logits.iter().zip(&r.logits).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let den: f64 = r.logits.iter().map(|b| (*b as f64).powi(2)).sum();
        let nmse = num / den.max(1e-30);
        eprintln!("{file} step {i}: logits NMSE {nmse:.3e} (limit {limit:e}, tensor cores {tensor_cores})");
        assert!(nmse < limit, "{file} step {i}: logits NMSE {nmse} over {limit}");
    }
    std::fs::remove_dir_all(&root).unwrap();
}
