//! Int4 checkpoints kept 4-bit on CUDA (kernels/quant_matmul.cu's `int4_g*` kernels): the
//! models of tests/golden/int4 (compressed-tensors' own checkpoint, and the same 4-bit values in
//! AWQ's and GPTQ's layouts; groups of 32) against the golden HF transformers wrote, by the rule
//! the reference and wgpu pass: greedy ids equal on every prompt, log-probabilities within 1e-3.
//! With an f32 KV cache, as the reference and wgpu keep theirs: CUDA's default bf16 cache rounds
//! each K/V value to 8 significant bits, which alone moves a log-probability by up to 1.3e-2 on
//! this model (measured on the fake driver), past the rule's 1e-3 and past the 6e-3 gap between
//! HF's first two tokens at one step. Without a driver it prints SKIPPED;
//! TANDEM_REQUIRE_CUDA=1 turns that into a failure.

use tandem_conformance::golden::{self, GoldenFile};
use tandem_core::backend::KvDtype;
use tandem_core::model::LoadOptions;
use tandem_core::quant_layout::QuantLayout;
use tandem_core::weights::Weights;

/// Each case of `g` on `format`'s checkpoint loaded on CUDA with a `kv` cache: a line a case,
/// or the first failure of the golden rule at `tol`.
fn check(format: &str, g: &GoldenFile, kv: KvDtype, tol: f64) -> Option<Result<Vec<String>, String>> {
    let cuda = crate::gpu_or_skip(&format!("int4::{format} ({kv:?} KV cache)"))?;
    let dir = golden::golden_dir().join("int4").join(format);
    let w = Weights::open(&dir).unwrap_or_else(|e| panic!("{format}: {e}"));
    let kept: Vec<_> = w.quantized().map(|(_, l)| l).collect();
    assert!(!kept.is_empty() && kept.iter().all(|l| *l == QuantLayout::Int4Group { group: 32 }), "{kept:?}");
    let cfg = tandem_core::ModelConfig::from_file(&dir.join("config.json")).unwrap();
    // golden::check_weights's options, the KV cache's type given.
    let longest = g.cases.iter().map(|c| c.prompt_ids.len() + c.greedy.len()).max().unwrap_or(1);
    let opts = LoadOptions {
        max_batch_tokens: 16,
        max_seqs: 4,
        num_kv_blocks: longest.div_ceil(16) + 1,
        block_size: 16,
        kv_dtype: Some(kv),
        ..Default::default()
    };
    let mut model = tandem_core::Model::from_weights(cuda, cfg, &w, opts).unwrap();
    Some(
        g.cases
            .iter()
            .enumerate()
            .map(|(i, case)| {
                let o = golden::check_case(&mut model, case, tol).map_err(|e| format!("{format} case {i}: {e}"))?;
                Ok(format!(
                    "{format} case {i}: diverged at {:?}, max |Δlogprob| {:.2e}",
                    o.diverged_at, o.max_logprob_err
                ))
            })
            .collect(),
    )
}

#[test]
fn int4_checkpoints_pass_hf_golden_kept_4_bit() {
    let g = GoldenFile::load(&golden::golden_dir().join("int4/ct.json")).unwrap();
    for format in ["ct", "awq", "gptq"] {
        let Some(lines) = check(format, &g, KvDtype::F32, 1e-3) else { return };
        let lines = lines.unwrap_or_else(|e| panic!("{e}"));
        println!("{lines:?}");
        assert_eq!(lines.len(), g.cases.len(), "{format}");
        assert!(lines.iter().all(|l| l.contains("diverged at None")), "{format}: {lines:?}");
    }
}
