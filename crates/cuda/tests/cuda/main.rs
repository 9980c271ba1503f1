//! Every integration test of this crate in one test binary, each file a module: the crate's
//! dependencies' generic code is compiled and linked once rather than once per file, which
//! is what a cold CI build spends its time on. Run one module with
//! `cargo test -p tandem-cuda --test cuda <module>::`.

mod cublaslt;
mod emulation;
mod fp8;
mod fp8_w8a8;
mod gpu_invariance;
mod graphs;
mod int4;
mod kernels_check;
mod kv_fp8;
mod launches;
mod lora;
mod moe;
mod no_driver;
mod ops;
mod quant;
mod sampling_emu;
mod staging;

/// The GPU, or None where there is none (a driver missing, no device): the test then notes
/// itself skipped as `test`, unless TANDEM_REQUIRE_CUDA=1 makes that a failure.
pub(crate) fn gpu_or_skip(test: &str) -> Option<tandem_cuda::CudaBackend> {
    match tandem_cuda::CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            assert!(!std::env::var("TANDEM_REQUIRE_CUDA").is_ok_and(|v| v == "1"), "TANDEM_REQUIRE_CUDA=1 but: {e}");
            tandem_core::skip::note(format!("{test}: {e}"));
            None
        }
    }
}

/// The GPU tests' random model of `shape` (bf16 weights, seed 7), written once per process and
/// shared by every test that loads one (on a GPU the head_dim-64 shape is SmolLM2-135M's: 270 MB
/// written once, not once a test). The folders of earlier runs whose process is gone are removed
/// when the first is made.
pub(crate) fn random_model(shape: tandem_model_files::random_model::Shape) -> std::path::PathBuf {
    use std::sync::Mutex;
    static MADE: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let tmp = std::env::temp_dir();
    let dir = tmp.join(format!("tandem-cuda-tests-{}-{}", shape.name(), std::process::id()));
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    if made.is_empty() {
        for e in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name
                .strip_prefix("tandem-cuda-tests-")
                .and_then(|r| r.rsplit('-').next())
                .and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    if !made.contains(&shape.name().to_string()) {
        let _ = std::fs::remove_dir_all(&dir);
        tandem_model_files::random_model::write_random_model(&dir, shape, 7, tandem_core::DType::BF16).unwrap();
        made.push(shape.name().to_string());
    }
    dir
}

/// The head_dim-64 model shape of the GPU tests: SmolLM2-135M's on a GPU, its layer in a
/// 2-layer, 384-token model on the fake driver (`cargo xtask fake-cuda` sets
/// TANDEM_FAKE_CUDA=1), where every kernel runs on the host emulator.
pub(crate) fn shape_hd64() -> tandem_model_files::random_model::Shape {
    use tandem_model_files::random_model::Shape;
    if std::env::var("TANDEM_FAKE_CUDA").is_ok_and(|v| v == "1") {
        Shape::SmallHd64
    } else {
        Shape::Smollm2_135m
    }
}
