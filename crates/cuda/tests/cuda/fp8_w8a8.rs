//! FP8 checkpoints run as W8A8 on CUDA (`TANDEM_CUDA_QUANT_TC=w8a8`: kernels/quant_mma_w8a8.cu,
//! activations quantized to e4m3 per token, on sm_89+ and on the fake driver, which says
//! sm_90) against the golden HF transformers wrote for tests/golden/fp8-block (transformers' own
//! quantizer, 128 x 128 block scales; tiny-fp8 is an f32 model, whose FP8 weights are widened at
//! load, so it never reaches the kernel). x rounded to e4m3 (2^-4 relative an element) moves a
//! log-probability far past the bf16 golden rule's 1e-3: up to 0.48 on this model on the fake
//! driver (2026-12-07), where the greedy ids of 3 of its 4 cases flip at a near tie (HF gaps
//! 0.18, 0.33 and 0.08, at steps 0, 7 and 11 of 12). The rule here: each of HF's top-5 log-probabilities within
//! [`W8A8_LOGPROB_TOL`] until the first step where our greedy id differs from HF's; such a flip
//! only at a near tie at that scale, where HF's gap between its first two is below twice the
//! tolerance (each side of the gap moved by at most it) and HF's token is in our top 5; each
//! case prints where it flipped. An f32 KV cache, as for the int4 goldens. The switch is
//! process-wide, read when the backend loads: this runs only where the environment sets it
//! (`cargo xtask fake-cuda --tests` does), and prints SKIPPED otherwise, as it does without a
//! driver (TANDEM_REQUIRE_CUDA=1: a failure).

use tandem_conformance::golden::{self, GoldenFile};
use tandem_core::backend::KvDtype;
use tandem_core::greedy::generate;
use tandem_core::model::LoadOptions;
use tandem_core::quant_layout::QuantLayout;
use tandem_core::weights::Weights;

/// The largest |Δ log-probability| against HF's top-5 allowed with e4m3 activations. This
/// model magnifies an activation rounding: quant_mma.cu's W8A16 path (x rounded to bf16) already
/// measures 4.1e-2 on it on the fake driver. e4m3's rounding is sqrt(7.07e-4 / 2.75e-6) = 16
/// times bf16's in RMS (crates/conformance limits::e4m3_rounding, limits::rounding), so 16 x
/// 5e-2; W8A8 measured 0.48 at worst (2026-12-07).
const W8A8_LOGPROB_TOL: f64 = 0.8;

fn w8a8_asked(test: &str) -> bool {
    let on = std::env::var("TANDEM_CUDA_QUANT_TC").is_ok_and(|v| v == "w8a8");
    if !on {
        tandem_core::skip::note(format!("{test}: TANDEM_CUDA_QUANT_TC=w8a8 is not set"));
    }
    on
}

fn check(name: &str, dir: &std::path::Path) {
    let test = format!("fp8_w8a8::{name}");
    if !w8a8_asked(&test) {
        return;
    }
    let Some(cuda) = crate::gpu_or_skip(&test) else { return };
    let g = GoldenFile::load(&golden::golden_dir().join(format!("{name}.json"))).unwrap();
    let w = Weights::open(dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let kept: Vec<_> = w.quantized().map(|(_, l)| l).collect();
    assert!(!kept.is_empty() && kept.iter().all(|l| matches!(l, QuantLayout::Fp8E4m3(_))), "{kept:?}");
    let cfg = tandem_core::ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let longest = g.cases.iter().map(|c| c.prompt_ids.len() + c.greedy.len()).max().unwrap_or(1);
    let opts = LoadOptions {
        max_batch_tokens: 16,
        max_seqs: 4,
        num_kv_blocks: longest.div_ceil(16) + 1,
        block_size: 16,
        kv_dtype: Some(KvDtype::F32),
        ..Default::default()
    };
    let mut model = tandem_core::Model::from_weights(cuda, cfg, &w, opts).unwrap();
    let mut worst: f64 = 0.0;
    for (i, case) in g.cases.iter().enumerate() {
        let steps = generate(&mut model, &case.prompt_ids, case.greedy.len(), &[], true, |_| {}).unwrap();
        let mut flipped = None;
        for (t, step) in steps.iter().enumerate() {
            let lp = log_softmax(&step.logits);
            let mut ours: Vec<u32> = (0..lp.len() as u32).collect();
            ours.sort_by(|&a, &b| lp[b as usize].total_cmp(&lp[a as usize]).then(a.cmp(&b)));
            if step.id != case.greedy[t] {
                let hf = case.greedy[t];
                assert!(
                    ours[..5].contains(&hf) && case.gap[t] < 2.0 * W8A8_LOGPROB_TOL,
                    "{name} case {i} step {t}: we chose {}, HF {hf} (our top-5 {:?}), HF's gap {:.3} is no near tie",
                    step.id,
                    &ours[..5],
                    case.gap[t]
                );
                flipped = Some((t, case.gap[t]));
                break;
            }
            for &(id, hf_lp) in &case.top5[t] {
                let err = (lp[id as usize] - hf_lp).abs();
                assert!(err <= W8A8_LOGPROB_TOL, "{name} case {i} step {t}: token {id} |Δlogprob| {err:.3}");
                worst = worst.max(err);
            }
        }
        println!("{name} case {i}: flipped at (step, HF gap) {flipped:?}");
    }
    println!("{name}: worst |Δlogprob| {worst:.2e} over {} cases before any flip", g.cases.len());
}

fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    let lse = logits.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln() + max;
    logits.iter().map(|&x| x as f64 - lse).collect()
}

#[test]
fn fp8_block_checkpoint_as_w8a8_keeps_hf_greedy_ids() {
    check("fp8-block", &golden::golden_dir().join("fp8-block"));
}
