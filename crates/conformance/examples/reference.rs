//! Runs the conformance suite (or perf mode) on the reference backend against itself; a quick
//! way to see the output format and the case list before a backend exists.
//!
//! `cargo run -p tandem-conformance --example reference -- [--op NAME] [--seed N] [--perf [REPS]]`

use tandem_conformance::{fresh_seed, run, run_perf};
use tandem_reference::RefBackend;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let filter = value("--op");
    let seed = match value("--seed").map(|s| s.parse::<u64>()) {
        Some(Ok(s)) => s,
        Some(Err(e)) => {
            eprintln!("--seed: {e}");
            std::process::exit(2);
        }
        None => fresh_seed(),
    };
    let b = RefBackend::new();
    let mut out = std::io::stdout();
    if args.iter().any(|a| a == "--perf") {
        let reps = value("--perf").and_then(|r| r.parse().ok()).unwrap_or(5);
        run_perf(&b, filter.as_deref(), seed, reps, &mut out);
    } else if !run(&b, filter.as_deref(), seed, &mut out).ok() {
        std::process::exit(1);
    }
}
