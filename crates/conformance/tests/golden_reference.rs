//! The reference backend against HF transformers (tests/golden, made by tests/hf_golden.py).

use tandem_conformance::golden::{self, GoldenFile};
use tandem_core::DType;
use tandem_reference::RefBackend;

fn check(name: &str, dir: &std::path::Path, tol: f64) {
    let g = GoldenFile::load(&golden::golden_dir().join(format!("{name}.json"))).unwrap();
    match golden::check_model(RefBackend::new(), dir, &g, tol) {
        Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
        Err(e) => panic!("{e}"),
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
