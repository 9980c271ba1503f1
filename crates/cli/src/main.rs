//! `tandem`: the command-line entry point.
//!
//! - `tandem generate`: one prompt, completion text on stdout (logs on stderr).
//! - `tandem serve`: the HTTP server.
//! - `tandem test-ops`: the op conformance suite against one backend (like llama.cpp's
//!   test-backend-ops), for machines that have no Rust toolchain.

mod backends;
mod bench;
mod compare;
mod gen_model;
mod generate;
mod serve;
mod test_ops;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "tandem", version, about = "A serving engine for large language models")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// The CUDA backend's projections: `ours` (the default: our kernels, batch-invariant) or
    /// `cublaslt` (NVIDIA's cuBLASLt: not batch-invariant, a row's bits may depend on its
    /// batch). Sets TANDEM_CUDA_GEMM for this process.
    #[arg(long, global = true, value_parser = ["ours", "cublaslt"])]
    gemm: Option<String>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate a completion for one prompt and print it.
    Generate(generate::Args),
    /// Serve the OpenAI-compatible HTTP API.
    Serve(serve::Args),
    /// Check every op of a backend against the reference backend.
    TestOps(test_ops::Args),
    /// A whole model on one backend against another, and batch invariance through the engine.
    Compare(compare::Args),
    /// Write a seeded random model (the same bytes as `cargo xtask gen-model`).
    GenModel(gen_model::Args),
    /// Benchmarks: throughput, serve, compare, sweep, load, decode (JSON + Markdown + PNG).
    Bench(bench::Args),
}

/// Where models live: `$TANDEM_MODELS_DIR`, else `./models`.
pub fn models_dir() -> PathBuf {
    std::env::var_os("TANDEM_MODELS_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("models"))
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_some_and(|c| c == "serve") {
        if let Err(e) = serve::refuse_vllm_only_flags(&args[2..]) {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    }
    let cli = Cli::parse();
    if let Some(g) = &cli.gemm {
        // Before any thread or backend exists: the backend reads it at load (switches.rs).
        std::env::set_var("TANDEM_CUDA_GEMM", g);
    }
    let res = match cli.cmd {
        Cmd::Generate(a) => generate::run(a),
        Cmd::TestOps(a) => test_ops::run(a),
        Cmd::Serve(a) => serve::run(a),
        Cmd::Compare(a) => compare::run(a),
        Cmd::GenModel(a) => gen_model::run(a),
        Cmd::Bench(a) => bench::run(a),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod cli_tests {
    /// clap checks its definitions only when a subcommand is parsed: a flag named twice (a
    /// flattened `EngineArgs` next to a benchmark's own) would panic at run time.
    #[test]
    fn every_subcommand_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
