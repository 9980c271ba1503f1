//! `cargo xtask <task>`: all project tooling, one file per task.
//!
//! Add a task by adding a file `src/<task>.rs` with an `Args` struct and a `run` function, then
//! one variant in [`Task`] and one arm in `main`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

mod bench;
mod convert_gguf;
mod fake_cuda;
mod fetch_model;
mod fuzz;
mod gen_model;
mod gpu_bundle;
mod gpu_rehearsal;
mod kernels;
mod kernels_predict;
mod perf_calibration;
mod perf_cases;
mod perf_code;
mod perf_model;
mod perf_timings;
mod serve;
mod test;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Tandem project tooling")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Download, verify and convert the default model into models/ (nothing to do if it is there).
    FetchModel(fetch_model::Args),
    /// Write a seeded random model (config, safetensors, tokenizer) of a known shape.
    GenModel(gen_model::Args),
    /// Convert a local GGUF file (llama, qwen2, qwen3, qwen3moe, gemma3) into a Hugging Face directory.
    ///
    /// Tensor types read (dequantised, then stored as bf16): F32, F16, BF16, Q8_0, Q4_0, Q4_1,
    /// Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, so llama.cpp's Q4_K_M, Q5_K_M, Q6_K,
    /// Q8_0, Q3_K_*, Q2_K and Q4_0/Q5_0/Q5_1 files convert. IQ*, TQ* and FP4 types are
    /// refused, naming the tensor and its type, before anything is written.
    ConvertGguf(convert_gguf::Args),
    /// Every test, as CI runs them (fetches the default model first).
    Test(test::Args),
    /// Serve the default (or a given) model over HTTP: `tandem serve` in a release build.
    Serve(serve::Args),
    /// The CUDA kernels' compile check (NVRTC + ptxas; no GPU needed), or `--predict`: the
    /// CPU performance model calibrated against the committed H200 timings.
    Kernels(kernels::Args),
    /// The CUDA backend on the fake driver (crates/fake-cuda), no GPU: `-- ARGS` runs a `tandem`
    /// command on it, `--tests` crates/cuda's GPU-only tests.
    FakeCuda(fake_cuda::Args),
    /// Build the release binary and put it, the GPU check scripts and the kernels in bundle/.
    GpuBundle(gpu_bundle::Args),
    /// The GPU call rehearsed on the fake driver: the bundle's check.sh and a short tune.sh at
    /// tiny shapes, leaving in OUT exactly what the device would return (<= 8 files).
    GpuRehearsal(gpu_rehearsal::Args),
    /// The fuzz targets in fuzz/ (cargo-fuzz on nightly): regressions replayed, then each
    /// target fuzzed for `--seconds`.
    Fuzz(fuzz::Args),
    /// Benchmarks from a release build: `tandem bench <kind> ...` (throughput, serve, compare,
    /// sweep, load, decode).
    Bench(bench::Args),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    match Cli::parse().task {
        Task::FetchModel(a) => fetch_model::run(a),
        Task::GenModel(a) => gen_model::run(a),
        Task::ConvertGguf(a) => convert_gguf::run(a),
        Task::Test(a) => test::run(a),
        Task::Serve(a) => serve::run(a),
        Task::Kernels(a) => kernels::run(a),
        Task::GpuBundle(a) => gpu_bundle::run(a),
        Task::GpuRehearsal(a) => gpu_rehearsal::run(a),
        Task::FakeCuda(a) => fake_cuda::run(a),
        Task::Fuzz(a) => fuzz::run(a),
        Task::Bench(a) => bench::run(a),
    }
}

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}
