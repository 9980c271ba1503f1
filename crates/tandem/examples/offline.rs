//! Offline batch generation: a batch of prompts through one `Llm::generate` call, printed in
//! order.
//!
//! `cargo run --release -p tandem --example offline -- --model DIR --backend auto|reference|wgpu|cuda`
//!
//! CI runs [`run`] itself (crates/tandem/tests/tandem/examples.rs includes this file) on a tiny random
//! model with the reference backend.

use std::io::Write;
use std::path::Path;

use tandem::{Backend, LlmBuilder, Output, SamplingParams};

// The tests include every example, so there this file is loaded once per example.
#[allow(clippy::duplicate_mod)]
#[path = "common/args.rs"]
mod args;
pub use args::parse_args;

pub const PROMPTS: [&str; 4] =
    ["The capital of France is", "Write a haiku about the sea:", "def fibonacci(n):", "The three primary colours are"];

/// Loads the model, generates a completion for each of [`PROMPTS`] and writes them in order.
pub fn run(model: &Path, backend: Backend, out: &mut dyn Write) -> Result<Vec<Output>, Box<dyn std::error::Error>> {
    let llm = LlmBuilder::new(model).backend(backend).max_num_seqs(8).build()?;
    writeln!(out, "loaded {} on {} ({})", model.display(), llm.backend(), llm.device())?;
    // A seeded sample: the same text each run, whatever else shares the batch.
    let params =
        SamplingParams { temperature: 0.7, top_p: 0.9, seed: Some(1234), max_tokens: Some(24), ..Default::default() };
    let t = std::time::Instant::now();
    let outputs = llm.generate(PROMPTS, &params)?;
    let secs = t.elapsed().as_secs_f64();
    for (prompt, o) in PROMPTS.iter().zip(&outputs) {
        let c = &o.completions[0];
        writeln!(out, "{prompt:?} -> {:?} [{} tokens, {:?}]", c.text, c.token_ids.len(), c.finish_reason)?;
    }
    let tokens: usize = outputs.iter().map(|o| o.usage.completion_tokens).sum();
    writeln!(out, "{tokens} tokens in {secs:.2} s ({:.1} tok/s for the batch)", tokens as f64 / secs)?;
    Ok(outputs)
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    args::exit_code(parse_args(std::env::args()).map(|(model, backend)| run(&model, backend, &mut std::io::stdout())))
}
