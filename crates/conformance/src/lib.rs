//! The op conformance suite: every op of a backend against the reference backend, by
//! normalized mean squared error (llama.cpp's test-backend-ops, for the [`Backend`] trait).
//!
//! Each [`Case`] makes fresh random inputs from a seed (splitmix64; the run's seed is printed
//! and each case's inputs depend only on it and the case's label, so `--op` reproduces a
//! case exactly), uploads the same inputs to the tested backend and to the reference, poisons
//! every output with NaN (plus a guard after it that must stay NaN), runs the op, reads back
//! and compares: NMSE = Σ(a-b)²/Σb² under a per-case limit, and no NaN/Inf.
//!
//! ```text
//! let report = tandem_conformance::run(&backend, Some("matmul"), seed, &mut std::io::stdout());
//! assert!(report.ok(), "{}", report.summary());
//! ```
//!
//! Perf mode ([`run_perf`]) times each case's op alone on one backend (median of a few runs).
//!
//! Besides the NMSE, a case fails when the backend returns an error or panics, writes past
//! the length it was given (the guard), or changes one of its inputs. Limits live in
//! [`ops::limits`]; `tests/conformance/tolerance.rs` measures how close honest variants (f32 sums in
//! another order, bf16 activations, a bf16 KV cache) come to them.
//!
//! Map:
//! - `case.rs`: [`Case`] and [`cases`], the list of every case with its parameters.
//! - `ops/`: one module per op family; each op is [`ops::Op`]: `generate` (host inputs from
//!   the seed) and `exec` (upload, poison, run, read back), shared by both backends.
//! - `compare.rs`: NMSE, NaN/Inf and exact index comparison. `report.rs`: printing.
//! - `staging.rs`: [`staging::check_u32_group`], the u32 groups a step's metadata travels in.
//! - `golden.rs`: layer 2 (whole model against HF transformers), separate from the op suite;
//!   `lora_golden.rs` the same for LoRA adapters against HF transformers + peft.
//!
//! To add a case, add a line to [`cases`]; to add an op, write an [`ops::Op`] and a `Spec`
//! variant in `case.rs`. To check one op on one backend: `tandem test-ops --backend wgpu
//! --op rms_norm [--seed N] [--perf]`, or `cargo run -p tandem-conformance --example
//! reference -- --op rms_norm` for the reference against itself.
//!
//! Architecture invariant: the suite knows only the [`Backend`] trait; it is written once and
//! every backend answers to the same cases.

use std::io::Write;

use tandem_core::backend::Backend;
use tandem_reference::RefBackend;

mod case;
pub mod compare;
pub mod golden;
pub mod lora_golden;
pub mod numerics;
pub mod ops;
mod report;
pub mod rng;
pub mod staging;

pub use case::{cases, Case, CaseResult, PerfResult};
pub use report::{PerfReport, Report};

/// A seed for runs that were not given one: `TANDEM_TEST_SEED` where set (the test command pins
/// it), else time-based; it is printed, so a failure can be rerun.
pub fn fresh_seed() -> u64 {
    if let Some(seed) = std::env::var("TANDEM_TEST_SEED").ok().and_then(|s| s.parse().ok()) {
        return seed;
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    rng::mix(nanos ^ std::process::id() as u64)
}

/// The cases a filter selects. A filter equal to one case's full label selects that case
/// alone (`add len=1` is also part of `add len=100003`).
pub fn selected(filter: Option<&str>) -> Vec<Case> {
    let all = cases();
    match filter {
        None => all,
        Some(f) if all.iter().any(|c| c.label() == f) => all.into_iter().filter(|c| c.label() == f).collect(),
        // An op's name selects that op alone (`rms_norm` is not `add_rms_norm`).
        Some(f) if all.iter().any(|c| c.op == f) => all.into_iter().filter(|c| c.op == f).collect(),
        Some(f) => all.into_iter().filter(|c| c.matches(f)).collect(),
    }
}

/// Runs the suite (or the cases `filter` selects) on `backend` against [`RefBackend`].
pub fn run<B: Backend>(backend: &B, filter: Option<&str>, seed: u64, out: &mut dyn Write) -> Report {
    run_against(backend, &RefBackend::new(), filter, seed, out)
}

/// Runs the suite on `backend` against any `reference` backend.
pub fn run_against<B: Backend, R: Backend>(
    backend: &B,
    reference: &R,
    filter: Option<&str>,
    seed: u64,
    out: &mut dyn Write,
) -> Report {
    let cases = selected(filter);
    report::say(
        out,
        &format!(
            "op conformance: backend {} against {}, seed {seed}, {} cases{}",
            backend.name(),
            reference.name(),
            cases.len(),
            filter.map_or(String::new(), |f| format!(" matching {f:?}"))
        ),
    );
    let mut rep = Report {
        backend: backend.name().to_string(),
        seed,
        filter: filter.map(String::from),
        results: vec![],
        passed: 0,
        failed: 0,
        skipped_cases: 0,
        skipped: None,
    };
    for c in &cases {
        let r = c.check(backend, reference, seed);
        report::say(out, &report::case_line(&r));
        if r.skipped.is_some() {
            rep.skipped_cases += 1;
        } else if r.passed() {
            rep.passed += 1;
        } else {
            rep.failed += 1;
        }
        rep.results.push(r);
    }
    // Listed where `cargo xtask test` collects skips, too: a line per op and reason, with how
    // many cases it skipped; the run itself (a test, a `tandem test-ops`) counts its cases.
    for line in rep.skip_notes() {
        tandem_core::skip::note_part(line);
    }
    if rep.failed > 0 {
        report::say(out, &format!("rerun one failing case with: --seed {seed} --op \"<op> <params as printed>\""));
    }
    // The summary is always the last line; tools read it.
    report::say(out, &rep.summary());
    rep
}

/// Times each selected case's op on `backend`: two warm-up samples, then `reps` samples of
/// [`ops::LAUNCHES_PER_SAMPLE`] launches and one wait; prints the median time per launch and
/// napkin-math GB/s and GFLOP/s.
pub fn run_perf<B: Backend>(
    backend: &B,
    filter: Option<&str>,
    seed: u64,
    reps: usize,
    out: &mut dyn Write,
) -> PerfReport {
    let cases = selected(filter);
    report::say(
        out,
        &format!(
            "op perf: backend {}, {} cases, {} samples each, seed {seed}",
            backend.name(),
            cases.len(),
            reps.max(1)
        ),
    );
    let results: Vec<PerfResult> = cases
        .iter()
        .map(|c| {
            let r = c.time(backend, seed, 2, reps);
            report::say(out, &report::perf_line(&r));
            r
        })
        .collect();
    PerfReport { backend: backend.name().to_string(), results }
}
