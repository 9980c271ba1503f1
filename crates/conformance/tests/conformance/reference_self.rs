//! The suite run on the reference backend against itself: every case must pass, the output
//! must follow the agreed format, and the case list must be what the suite promises.

use std::collections::HashSet;

use tandem_conformance::{cases, run, run_perf, Report};
use tandem_reference::RefBackend;

#[test]
fn reference_passes_against_itself() {
    let mut out = Vec::new();
    let rep = run(&RefBackend::new(), None, 42, &mut out);
    let text = String::from_utf8(out).unwrap();
    assert!(rep.ok(), "{text}");
    // The reference has no routed experts (moe_prepare gives no table): those cases are
    // skipped, each saying why, and counted.
    let routed = cases().iter().filter(|c| c.op == "moe_routed").count();
    assert!(routed >= 4);
    assert_eq!(rep.passed, cases().len() - routed);
    assert_eq!(rep.skipped_cases, routed);
    assert!(rep
        .results
        .iter()
        .filter(|r| r.op == "moe_routed")
        .all(|r| r.skipped.as_deref().is_some_and(|s| s.contains("no routed path"))));
    assert_eq!(rep.failed, 0);
    let last = text.lines().last().unwrap();
    assert_eq!(last, format!("reference: {} passed, 0 failed, {routed} skipped", cases().len() - routed));
    assert_eq!(text.lines().filter(|l| l.contains(" SKIP ")).count(), routed);
    // Counted once a run, with the count: one skip line for the lot, not one a case.
    let notes = rep.skip_notes();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].starts_with(&format!("op suite on reference: {routed} moe_routed cases skipped: "))
            && notes[0].contains("no routed path"),
        "{notes:?}"
    );
    // One line per case plus the header and the summary.
    assert_eq!(text.lines().count(), cases().len() + 2);
    assert!(text.lines().next().unwrap().contains("seed 42"));
}

#[test]
fn suite_covers_every_op_with_enough_cases() {
    let all = cases();
    assert!(all.len() >= 60, "only {} cases", all.len());
    let ops: HashSet<&str> = all.iter().map(|c| c.op).collect();
    for op in [
        "embedding",
        "gather_rows",
        "rms_norm",
        "add",
        "add_rms_norm",
        "matmul",
        "gate_up_silu",
        "gate_up_gelu",
        "rope",
        "silu_mul",
        "gelu_tanh_mul",
        "scale",
        "kv_write",
        "paged_attention",
        "argmax",
        "moe_route",
        "moe_accumulate",
        "moe_routed",
        "lora",
    ] {
        assert!(ops.contains(op), "no case for {op}");
    }
    // Labels must be unique: a case's seed and the filter both go by its label.
    let labels: HashSet<String> = all.iter().map(|c| c.label()).collect();
    assert_eq!(labels.len(), all.len(), "two cases share a label");
    // The shapes the brief asks for.
    let has = |op: &str, part: &str| all.iter().any(|c| c.op == op && c.params.contains(part));
    for part in [
        "m=1 ", "m=3 ", "m=16 ", "m=37 ", "m=128 ", "n=77 ", "n=1 ", "k=1000", "bias=yes", "bias=no", "w=f16",
        "w=bf16", "w=f32",
    ] {
        assert!(has("matmul", part), "no matmul case with {part}");
    }
    for part in
        ["block_size=16", "block_size=32", "gqa=1 ", "gqa=3 ", "gqa=4 ", "head_dim=64", "head_dim=128", "[20+13"]
    {
        assert!(has("paged_attention", part), "no attention case with {part}");
    }
    for part in ["block_size=16", "block_size=32"] {
        assert!(has("kv_write", part), "no kv_write case with {part}");
    }
    for part in ["table=f32", "table=bf16", "table=f16"] {
        assert!(has("embedding", part), "no embedding case with {part}");
    }
}

#[test]
fn filter_selects_by_op_and_an_empty_selection_is_not_a_pass() {
    let b = RefBackend::new();
    let mut out = Vec::new();
    let rep = run(&b, Some("argmax"), 1, &mut out);
    assert!(rep.ok());
    assert_eq!(rep.passed, cases().iter().filter(|c| c.op == "argmax").count());
    assert!(rep.results.iter().all(|r| r.op == "argmax"));

    let mut out = Vec::new();
    let rep = run(&b, Some("no_such_op"), 1, &mut out);
    assert!(!rep.ok(), "a filter that selects nothing must not pass");
    let text = String::from_utf8(out).unwrap();
    assert!(text.lines().last().unwrap().starts_with("reference: 0 passed, 0 failed"), "{text}");
}

#[test]
fn a_case_seed_depends_on_the_run_seed_and_label_only() {
    let all = cases();
    let c = &all[7];
    assert_eq!(c.seed(5), c.seed(5));
    assert_ne!(c.seed(5), c.seed(6));
    assert_ne!(c.seed(5), all[8].seed(5));
    // Filtering down to one case keeps its seed.
    let mut out = Vec::new();
    let rep = run(&RefBackend::new(), Some(&c.label()), 5, &mut out);
    assert_eq!(rep.results.len(), 1);
    assert_eq!(rep.results[0].seed, c.seed(5));
    // A label that is a prefix of another still selects one case.
    let mut out = Vec::new();
    let rep = run(&RefBackend::new(), Some("add len=1"), 5, &mut out);
    assert_eq!(rep.results.len(), 1, "{}", String::from_utf8(out).unwrap());
}

#[test]
fn perf_mode_times_each_selected_case() {
    let mut out = Vec::new();
    let rep = run_perf(&RefBackend::new(), Some("rms_norm"), 3, 3, &mut out);
    let n = cases().iter().filter(|c| c.op == "rms_norm").count();
    assert_eq!(rep.results.len(), n);
    for r in &rep.results {
        assert!(r.failure.is_none(), "{:?}", r.failure);
        assert_eq!(r.times.len(), 3);
        assert!(r.median().unwrap() > std::time::Duration::ZERO);
    }
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.lines().filter(|l| l.contains("median")).count(), n, "{text}");
}

#[test]
fn an_absent_backend_is_reported_as_skipped_and_not_ok() {
    let mut out = Vec::new();
    let rep = Report::skipped("cuda", "libcuda.so not found", &mut out);
    assert!(!rep.ok());
    assert_eq!(String::from_utf8(out).unwrap(), "cuda: 0 passed, 0 failed (skipped: libcuda.so not found)\n");
}
