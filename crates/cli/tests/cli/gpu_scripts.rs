//! The GPU check's Python helpers on made-up inputs: the summary's floors count the KV bytes
//! each benchmark says it stored (gpu/test_summarize.py), and latest.json merges field by field
//! (gpu/test_merge_latest.py). Needs only python3; without one each test says it is skipped.

use std::path::Path;
use std::process::Command;

#[test]
fn summary_floors_count_the_kv_bytes_the_run_stored() {
    let py = std::env::var("TANDEM_PYTHON").unwrap_or_else(|_| "python3".into());
    if !Command::new(&py).arg("--version").output().is_ok_and(|o| o.status.success()) {
        tandem_core::skip::note(format!("gpu/test_summarize.py: no `{py}`"));
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../gpu/test_summarize.py");
    let out = Command::new(&py).arg(&script).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("test_summarize: ok"), "{text}");
}

/// gpu/merge_latest.py (gpu/test_merge_latest.py): docs/gpu/latest.json merged field by field,
/// each figure with the run it was measured at; a fake-driver file is refused.
#[test]
fn latest_json_merges_field_by_field_and_refuses_the_fake() {
    let py = std::env::var("TANDEM_PYTHON").unwrap_or_else(|_| "python3".into());
    if !Command::new(&py).arg("--version").output().is_ok_and(|o| o.status.success()) {
        tandem_core::skip::note(format!("gpu/test_merge_latest.py: no `{py}`"));
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../gpu/test_merge_latest.py");
    let out = Command::new(&py).arg(&script).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("test_merge_latest: ok"), "{text}");
}
