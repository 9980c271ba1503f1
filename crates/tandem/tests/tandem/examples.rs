//! CI runs both examples: their source files are included here as modules and their `run`
//! functions called on the tiny random model with the reference backend. That runs the very
//! code `cargo run --example` runs (only `main`'s argument parsing is left, and it is tested
//! below) without a cargo inside a test; `cargo test` also builds the examples as binaries.

use crate::common;

#[path = "../../examples/offline.rs"]
mod offline;
#[path = "../../examples/stream.rs"]
mod stream;

use tandem::Backend;

#[test]
fn offline_example_prints_the_batch_in_order() {
    let mut out = Vec::new();
    let outputs = offline::run(common::tiny_model(), Backend::Reference, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(outputs.len(), offline::PROMPTS.len());
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("loaded ") && lines[0].contains(" on reference (CPU)"), "{text}");
    for (i, p) in offline::PROMPTS.iter().enumerate() {
        assert!(
            lines[1 + i].starts_with(&format!("{p:?} -> {:?}", outputs[i].completions[0].text)),
            "line {}: {text}",
            1 + i
        );
        assert!(outputs[i].usage.completion_tokens >= 1);
    }
    assert!(lines[1 + offline::PROMPTS.len()].contains("tok/s for the batch"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_example_reads_one_stream_and_drops_the_other() {
    let mut out = Vec::new();
    let s = stream::run(common::tiny_model(), Backend::Reference, &mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(s.full_tokens, 32, "{text}");
    assert_eq!(s.dropped_after, stream::KEEP_AFTER);
    assert_eq!(s.stats.requests_abort_total, 1, "the dropped stream's request was aborted: {:?}", s.stats);
    assert_eq!(s.stats.requests_length_total, 1, "the other ran to its length: {:?}", s.stats);
    assert_eq!(s.stats.kv_usage, 0.0);
    assert!(text.contains("stream B, dropped after 3 items"), "{text}");
    assert!(text.contains(&format!("32 tokens: {:?}", s.full_text)), "{text}");
}

#[test]
fn example_arguments() {
    fn args(a: &[&str]) -> impl Iterator<Item = String> {
        let v: Vec<String> = std::iter::once("x").chain(a.iter().copied()).map(String::from).collect();
        v.into_iter()
    }
    let (m, b) = offline::parse_args(args(&["--model", "/m", "--backend", "wgpu"])).unwrap();
    assert_eq!((m.to_str(), b), (Some("/m"), Backend::Wgpu));
    assert_eq!(stream::parse_args(args(&["--model", "/m"])).unwrap().1, Backend::Auto);
    assert!(offline::parse_args(args(&["--backend", "tpu", "--model", "/m"])).unwrap_err().contains("unknown backend"));
    assert!(stream::parse_args(args(&[])).unwrap_err().contains("--model"));
}
