//! The GPU check's summary (gpu/summarize.py) on made-up inputs: its floors count the KV bytes
//! each benchmark says it stored (gpu/test_summarize.py). Needs only python3; without one the
//! test says it is skipped.

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
