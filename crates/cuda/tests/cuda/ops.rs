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
