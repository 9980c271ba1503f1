//! Tests that skip themselves say why, and are counted once, as skipped.
//!
//! libtest cannot mark a test skipped at run time: a test that returns early is reported as
//! passed, and what it prints is captured and dropped. So [`note`] also appends a line to
//! `$TANDEM_SKIP_LOG` (when set) naming the test binary and the test (libtest runs each test on
//! a thread named after it), and `cargo xtask test` counts each noted test as skipped instead of
//! passed (xtask/src/test/count.rs reads the log beside libtest's output).
//!
//! [`note_part`] is for a test that ran but left some of its cases out (the op suite's cases a
//! backend does not support): the test stays passed and the line is listed beside the count.

use std::io::Write;

/// The kind of line in the skip log: the test skipped itself.
pub const SKIPPED: &str = "skipped";
/// The kind of line in the skip log: the test ran, with part of it left out.
pub const PART: &str = "part";

/// Records that the running test skipped itself, and why; the caller then returns.
pub fn note(reason: impl AsRef<str>) {
    log(SKIPPED, reason.as_ref());
}

/// Records that the running test (or command) left part of its checks out, and why.
pub fn note_part(reason: impl AsRef<str>) {
    log(PART, reason.as_ref());
}

/// One line of the skip log: `KIND \t BINARY \t TEST \t REASON`. BINARY is the executable's file
/// name (cargo prints it on its `Running` line); TEST is the current thread's name, or `-` on a
/// process's main thread or an unnamed thread (then no libtest test is known to have skipped).
pub fn line(kind: &str, binary: &str, test: Option<&str>, reason: &str) -> String {
    let clean = |s: &str| s.replace(['\t', '\n'], " ");
    format!("{kind}\t{}\t{}\t{}", clean(binary), clean(test.unwrap_or("-")), clean(reason))
}

fn log(kind: &str, reason: &str) {
    let what = if kind == SKIPPED { "SKIPPED" } else { "PARTLY SKIPPED" };
    eprintln!("{what}: {reason}");
    let Some(path) = std::env::var_os("TANDEM_SKIP_LOG") else { return };
    let exe = std::env::current_exe().ok();
    let binary = exe.as_deref().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned());
    let thread = std::thread::current();
    let test = thread.name().filter(|n| *n != "main");
    let l = line(kind, binary.as_deref().unwrap_or("?"), test, reason);
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        // One write of the whole line: with O_APPEND, lines of concurrent tests do not interleave.
        let _ = f.write_all(format!("{l}\n").as_bytes());
    }
}
