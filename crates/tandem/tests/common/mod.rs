//! A tiny random model (2 layers, hidden 64, a 384-token BPE tokenizer with a chat template),
//! written once per test binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tandem::{Backend, LlmBuilder};

pub fn tiny_model() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("tandem-lib-test-{}", std::process::id()));
        tandem_model_files::random_model::write_random_model(
            &dir,
            tandem_model_files::random_model::Shape::Tiny,
            1,
            tandem_core::DType::F32,
        )
        .expect("writing the tiny model");
        dir
    })
}

/// The reference backend: these tests check the library's wiring, not a backend.
pub fn builder() -> LlmBuilder {
    builder_for(tiny_model())
}

/// The same settings on another model directory.
pub fn builder_for(dir: &Path) -> LlmBuilder {
    LlmBuilder::new(dir).backend(Backend::Reference).max_num_seqs(16).max_num_batched_tokens(256).num_kv_blocks(256)
}
