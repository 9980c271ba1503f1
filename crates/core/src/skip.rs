//! Tests that skip themselves say why, and are counted.
//!
//! The test harness captures what a passing test prints, so a printed "SKIPPED" would vanish;
//! [`note`] also appends the line to `$TANDEM_SKIP_LOG` when set, and `cargo xtask test`
//! prints the count and the reasons at the end.

use std::io::Write;

/// Records that a test skipped itself, and why.
pub fn note(reason: impl AsRef<str>) {
    let line = format!("SKIPPED: {}", reason.as_ref());
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("TANDEM_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{line}");
        }
    }
}
