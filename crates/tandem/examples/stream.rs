//! Two concurrent streams from the async engine, one dropped early: the dropped one's request
//! is aborted and its KV blocks freed while the other goes on.
//!
//! `cargo run --release -p tandem --example stream -- --model DIR --backend auto|reference|wgpu|cuda`
//!
//! CI runs [`run`] itself (crates/tandem/tests/tandem/examples.rs includes this file) on a tiny random
//! model with the reference backend.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tandem::{AsyncLlm, Backend, LlmBuilder, SamplingParams, Stats};

// The tests include every example, so there this file is loaded once per example.
#[allow(clippy::duplicate_mod)]
#[path = "common/args.rs"]
mod args;
pub use args::parse_args;

/// What the run saw.
#[derive(Debug)]
pub struct Summary {
    /// The whole text of the stream read to its end.
    pub full_text: String,
    pub full_tokens: usize,
    /// Items the other stream gave before it was dropped.
    pub dropped_after: usize,
    /// The engine's stats once the dropped request was gone.
    pub stats: Stats,
}

pub const KEEP_AFTER: usize = 3;

/// Loads the model and runs two streams at once; the second is dropped after [`KEEP_AFTER`]
/// items.
pub async fn run(model: &Path, backend: Backend, out: &mut dyn Write) -> Result<Summary, Box<dyn std::error::Error>> {
    let llm = LlmBuilder::new(model).backend(backend).max_num_seqs(8).build_async()?;
    writeln!(out, "loaded {} on {} ({})", model.display(), llm.backend(), llm.device())?;
    let short = SamplingParams { temperature: 0.0, max_tokens: Some(32), ignore_eos: true, ..Default::default() };
    // Far longer than it will be read, so that it is still running when it is dropped.
    let long = SamplingParams { max_tokens: Some(1000), ..short.clone() };
    let mut a = llm.generate("Tell me a story about a lighthouse.", &short)?;
    let mut b = llm.generate("List every prime number:", &long)?;

    let read_all = async {
        let (mut text, mut tokens) = (String::new(), 0);
        while let Some(delta) = a.next().await {
            text.push_str(&delta.text);
            tokens += delta.token_ids.len();
        }
        (text, tokens)
    };
    let read_some = async {
        let mut seen = 0;
        while seen < KEEP_AFTER {
            if b.next().await.is_none() {
                break;
            }
            seen += 1;
        }
        drop(b); // aborts the request
        seen
    };
    let ((full_text, full_tokens), dropped_after) = tokio::join!(read_all, read_some);
    let stats = settled(&llm).await;
    writeln!(out, "stream A, read to its end: {full_tokens} tokens: {full_text:?}")?;
    writeln!(out, "stream B, dropped after {dropped_after} items")?;
    writeln!(
        out,
        "engine: {} aborted, {} finished by length, KV usage {:.0}%",
        stats.requests_abort_total,
        stats.requests_length_total,
        stats.kv_usage * 100.0
    )?;
    Ok(Summary { full_text, full_tokens, dropped_after, stats })
}

/// The engine's stats once no request is running or waiting (the abort is applied at the
/// engine's next look at its commands).
async fn settled(llm: &AsyncLlm) -> Stats {
    let t = Instant::now();
    loop {
        let s = llm.stats();
        if (s.num_running == 0 && s.num_waiting == 0) || t.elapsed() > Duration::from_secs(10) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> std::process::ExitCode {
    let outcome = match parse_args(std::env::args()) {
        Ok((model, backend)) => Ok(run(&model, backend, &mut std::io::stdout()).await),
        Err(e) => Err(e),
    };
    args::exit_code(outcome)
}
