//! `tandem bench <kind>`: benchmarks that run from the binary alone (the GPU machine has no
//! Rust toolchain). Each writes a JSON report (machine, backend, model, commit, settings,
//! results), prints a Markdown table on stdout and, where a curve says more than a row, a PNG.
//!
//! - [`throughput`]: N prompts straight into the engine, all at once (vLLM's offline benchmark).
//! - [`serve`]: a streaming HTTP load generator against a running (or spawned) `tandem serve`.
//! - [`compare`]: static against continuous batching at a few concurrencies.
//! - [`sweep`]: `max_num_seqs` against throughput and latency.
//! - [`load`]: time to open and map a model; [`decode`]: the model runner alone, prefill
//!   tokens/s and decode tokens/s at several batch sizes, optionally beside HF transformers.
//! - [`speculative`]: tokens per forward and tokens/s without and with speculative decoding,
//!   on a copy-heavy and a free-text workload.
//! - [`lora`]: throughput with 0 (the base model alone), 1, 4 and 16 LoRA adapters mixed, in
//!   one run.
//! - [`kernels`]: the kernel lab (GEMMs and attention at a model's shapes; gpu/kernel_lab.py
//!   puts torch's figures beside them).

mod compare;
mod decode;
mod hf_baseline;
mod http_client;
mod kernels;
mod latency;
mod load;
mod lora;
mod measured;
mod model_source;
mod offline;
mod plot;
mod progress;
mod report;
mod run_args;
mod serve;
mod speculative;
mod sweep;
mod throughput;
mod workload;

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    kind: Kind,
}

#[derive(Subcommand)]
enum Kind {
    /// Offline throughput: every prompt submitted to the engine at once.
    Throughput(throughput::Args),
    /// Load generator against `tandem serve` over loopback HTTP (streaming).
    Serve(serve::Args),
    /// Static against continuous batching at several concurrencies.
    Compare(compare::Args),
    /// Throughput against latency over `max_num_seqs`.
    Sweep(sweep::Args),
    /// Time to open and map a model (config, tokenizer, safetensors headers + mmap).
    Load(load::Args),
    /// The model runner alone, greedy: prefill tokens/s and decode tokens/s per batch size.
    Decode(decode::Args),
    /// The kernel lab: each GEMM and attention kernel at a model's shapes, timed alone.
    Kernels(kernels::Args),
    /// Speculative decoding's acceptance and speed, with and without it, in one run.
    Speculative(speculative::Args),
    /// Throughput with 0 (the base model alone), 1, 4 and 16 LoRA adapters mixed, in one run.
    Lora(lora::Args),
}

/// Where a report goes.
#[derive(clap::Args, Clone)]
pub struct OutputArgs {
    /// Folder for the JSON report and plots (created if needed).
    #[arg(long, default_value = "bench-results")]
    pub output_dir: PathBuf,
    /// File stem of the report (default: the benchmark's kind, backend and model).
    #[arg(long)]
    pub name: Option<String>,
}

pub fn run(a: Args) -> Result<()> {
    match a.kind {
        Kind::Throughput(a) => throughput::run(a),
        Kind::Serve(a) => serve::run(a),
        Kind::Compare(a) => compare::run(a),
        Kind::Sweep(a) => sweep::run(a),
        Kind::Load(a) => load::run(a),
        Kind::Decode(a) => decode::run(a),
        Kind::Kernels(a) => kernels::run(a),
        Kind::Speculative(a) => speculative::run(a),
        Kind::Lora(a) => lora::run(a),
    }
}
