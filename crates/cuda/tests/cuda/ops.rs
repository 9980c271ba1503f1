//! The op conformance suite (crates/conformance) on the CUDA backend, against the reference.
//! Needs a GPU: without a driver it prints SKIPPED with the reason, and fails instead when
//! TANDEM_REQUIRE_CUDA=1 (set it on the GPU machine). TANDEM_SEED fixes the inputs,
//! TANDEM_OPS filters the cases.

use tandem_cuda::CudaBackend;

#[test]
fn cuda_matches_the_reference_on_every_op() {
    let required = std::env::var("TANDEM_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    let backend = match CudaBackend::new(0) {
        Ok(b) => b,
        Err(e) => {
            assert!(!required, "TANDEM_REQUIRE_CUDA=1 but: {e}");
            tandem_core::skip::note(format!("cuda op suite: {e}"));
            return;
        }
    };
    let seed =
        std::env::var("TANDEM_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(tandem_conformance::fresh_seed);
    let filter = std::env::var("TANDEM_OPS").ok();
    println!("cuda on {} (sm_{}), seed {seed}", backend.device_name(), backend.arch());
    let report = tandem_conformance::run(&backend, filter.as_deref(), seed, &mut std::io::stdout());
    assert!(report.ok(), "{}", report.summary());
}

/// The segmented LoRA update: each row alone and the rows reversed give a row its bits in the
/// mixed batch (x in f32, and rounded to bf16 as for bf16 A).
#[test]
fn cuda_lora_rows_alone_match_the_batch() {
    use tandem_conformance::ops::{lora_rows_alone, Lora};
    use tandem_core::DType;
    let required = std::env::var("TANDEM_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    let backend = match CudaBackend::new(0) {
        Ok(b) => b,
        Err(e) => {
            assert!(!required, "TANDEM_REQUIRE_CUDA=1 but: {e}");
            tandem_core::skip::note(format!("cuda lora invariance: {e}"));
            return;
        }
    };
    for operand in [DType::F32, DType::BF16] {
        let case = Lora { rows: 37, inp: 576, out: 192, max_loras: 4, max_rank: 16, operand };
        lora_rows_alone(&backend, &case, 7).unwrap();
    }
}
