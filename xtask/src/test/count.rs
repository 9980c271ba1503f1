//! The count `cargo xtask test` closes with: every check it ran, once, as passed, failed or
//! skipped with its reason.
//!
//! libtest cannot mark a test skipped at run time: a test that finds no GPU notes why
//! (`tandem_core::skip::note`, a line in `$TANDEM_SKIP_LOG` naming its binary and itself) and
//! returns, and libtest reports it passed. [`libtest`] reads cargo's output and that log
//! together: each noted test that libtest passed counts once, as skipped; a note that names no
//! passed test is listed, not counted. The other steps (the op suite through the binary, the
//! Python checks, fuzzing, fmt, clippy, the fake-driver group) add their own checks with
//! [`Tally::pass`], [`Tally::fail`] and [`Tally::skip`], or a closing line read by [`summary`].

/// Checks passed, failed and skipped; the failed and skipped ones named, with how many each
/// line covers.
#[derive(Default, Debug, PartialEq)]
pub struct Tally {
    pub passed: u64,
    pub failed: Vec<(u64, String)>,
    pub skipped: Vec<(u64, String)>,
    /// Printed beside the count, not counted: a passing test's cases left out, a skip note
    /// that names no passed test.
    pub notes: Vec<String>,
}

impl Tally {
    pub fn pass(&mut self, n: u64) {
        self.passed += n;
    }

    pub fn fail(&mut self, n: u64, what: impl Into<String>) {
        if n > 0 {
            self.failed.push((n, what.into()));
        }
    }

    pub fn skip(&mut self, n: u64, why: impl Into<String>) {
        if n > 0 {
            self.skipped.push((n, why.into()));
        }
    }

    pub fn add(&mut self, other: Tally) {
        self.passed += other.passed;
        self.failed.extend(other.failed);
        self.skipped.extend(other.skipped);
        self.notes.extend(other.notes);
    }

    pub fn failed_count(&self) -> u64 {
        self.failed.iter().map(|f| f.0).sum()
    }

    pub fn skipped_count(&self) -> u64 {
        self.skipped.iter().map(|s| s.0).sum()
    }

    /// One step of `what`, by its exit status (a step without a count of its own).
    pub fn step(&mut self, what: &str, ok: bool) {
        if ok {
            self.pass(1);
        } else {
            self.fail(1, what);
        }
    }

    /// A step that printed [`summary`] lines (`lines`; a step of several programs prints one
    /// each), and its exit status: a step that failed without counting a failure (it died) is
    /// one failure more; one without a summary counts as one check. `why`: the reason for its
    /// skips where its summary gives none.
    pub fn counted_step(&mut self, what: &str, lines: &[String], ok: bool, why: Option<&str>) {
        let sums: Vec<Summary> = lines.iter().filter_map(|l| summary(l)).collect();
        if sums.is_empty() {
            return self.step(what, ok);
        }
        let failed: u64 = sums.iter().map(|s| s.failed).sum();
        for s in sums {
            self.pass(s.passed);
            self.fail(s.failed, what);
            let reason = s.why.as_deref().or(why).unwrap_or("no reason given");
            self.skip(s.skipped, format!("{what}: {reason}"));
        }
        if !ok && failed == 0 {
            self.fail(1, format!("{what}: exited with an error after its count"));
        }
    }

    /// The closing line, then what was skipped and what failed, each with its reason.
    pub fn report(&self) -> String {
        let mut out = String::new();
        for n in &self.notes {
            out += &format!("note: {n}\n");
        }
        for (n, why) in &self.skipped {
            out += &format!("skipped {n}: {why}\n");
        }
        for (n, what) in &self.failed {
            out += &format!("FAILED {n}: {what}\n");
        }
        out + &self.closing_line()
    }

    /// `tandem: P passed, F failed, S skipped`.
    pub fn closing_line(&self) -> String {
        format!("tandem: {} passed, {} failed, {} skipped", self.passed, self.failed_count(), self.skipped_count())
    }
}

/// A step's own count, `... N passed, M failed, K skipped` with an optional `(skipped: why)`.
#[derive(Debug, PartialEq)]
pub struct Summary {
    pub passed: u64,
    pub failed: u64,
    pub skipped: u64,
    pub why: Option<String>,
}

/// Reads a count line: `N passed, M failed` and optionally `, K skipped` and `(skipped: why)`
/// (the op suite's `wgpu: 120 passed, 0 failed, 4 skipped`, the Python checks' closing lines).
pub fn summary(line: &str) -> Option<Summary> {
    let number_before = |word: &str| -> Option<u64> {
        let at = line.find(word)?;
        line[..at].trim_end().rsplit([' ', ',', ':', '(']).next()?.parse().ok()
    };
    let passed = number_before(" passed, ")?;
    let failed = number_before(" failed")?;
    let skipped = number_before(" skipped").unwrap_or(0);
    let why = line.split_once("(skipped: ").map(|(_, r)| r.trim_end().trim_end_matches(')').to_string());
    let skipped = if skipped == 0 && why.is_some() { 1 } else { skipped };
    Some(Summary { passed, failed, skipped, why })
}

/// The tally of a `cargo test` run: `output`, cargo's stdout and stderr in order (its
/// `Running ... (target/debug/deps/BINARY)` lines name each test binary), and `skip_log`, the
/// lines `tandem_core::skip` wrote.
pub fn libtest<S: AsRef<str>>(output: &[S], skip_log: &str) -> Tally {
    let mut t = Tally::default();
    let mut binary = String::new();
    // The current binary printed its result line (a binary that dies prints none).
    let mut finished = true;
    let mut passed_tests: Vec<(String, String)> = vec![];
    let mut failed_names: Vec<String> = vec![];
    // With --nocapture and one thread, "test NAME ... " and its "ok" may be lines apart.
    let mut pending: Option<String> = None;
    let died = |t: &mut Tally, binary: &str| t.fail(1, format!("{}: ended without a result line", stem(binary)));
    for line in output {
        let line = line.as_ref().trim_end();
        let trimmed = line.trim_start();
        if let Some(bin) = running_binary(trimmed) {
            if !finished {
                died(&mut t, &binary);
            }
            binary = bin;
            finished = false;
            failed_names.clear();
            pending = None;
        } else if let Some(rest) = trimmed.strip_prefix("Doc-tests ") {
            if !finished {
                died(&mut t, &binary);
            }
            binary = format!("doc-tests {rest}");
            finished = false;
            pending = None;
        } else if let Some(rest) = line.strip_prefix("test result: ") {
            let count = |word: &str| {
                rest.split(';')
                    .find_map(|p| p.trim().strip_suffix(word)?.trim().rsplit(' ').next()?.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            t.pass(count(" passed"));
            let failed = count(" failed");
            let named = failed_names.len() as u64;
            for n in failed_names.drain(..).take(failed as usize) {
                t.fail(1, format!("{n} ({})", stem(&binary)));
            }
            t.fail(failed.saturating_sub(named), format!("{}: failed tests", stem(&binary)));
            t.skip(count(" ignored"), format!("{}: #[ignore]d tests", stem(&binary)));
            finished = true;
            pending = None;
        } else if let Some((name, outcome)) = line.strip_prefix("test ").and_then(|r| r.split_once(" ... ")) {
            let name = name.strip_suffix(" - should panic").unwrap_or(name).to_string();
            match outcome.trim() {
                "ok" => passed_tests.push((binary.clone(), name)),
                "FAILED" => failed_names.push(name),
                o if o.starts_with("ignored") => {}
                // What the test printed (--nocapture) came first; its result follows on a line
                // of its own.
                _ => pending = Some(name),
            }
        } else if let Some(name) = pending.take() {
            match trimmed {
                "ok" => passed_tests.push((binary.clone(), name)),
                "FAILED" => failed_names.push(name),
                _ => pending = Some(name),
            }
        }
    }
    if !finished {
        died(&mut t, &binary);
    }
    let mut counted: Vec<(String, String)> = vec![];
    for l in skip_log.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = l.splitn(4, '\t').collect();
        let [kind, bin, test, why] = f[..] else {
            t.notes.push(format!("an unreadable skip note: {l}"));
            continue;
        };
        let key = (bin.to_string(), test.to_string());
        let who = format!("{test} ({})", stem(bin));
        if kind == tandem_core::skip::PART {
            t.notes.push(format!("{who} left part out: {why}"));
        } else if counted.contains(&key) {
            // A test that noted twice is one skip.
        } else if passed_tests.contains(&key) {
            t.passed -= 1;
            t.skip(1, format!("{who}: {why}"));
            counted.push(key);
        } else {
            t.notes.push(format!("a skip noted by {who} names no passed test: {why}"));
        }
    }
    t
}

/// The binary of a cargo `Running` line: `Running tests/cuda/main.rs (target/debug/deps/cuda-0f3c)`.
fn running_binary(line: &str) -> Option<String> {
    let rest = line.strip_prefix("Running ")?;
    let path = rest.rsplit_once('(')?.1.strip_suffix(')')?;
    Some(path.rsplit('/').next().unwrap_or(path).to_string())
}

/// A binary's name without cargo's hash: `cuda-0f3c1a2b3c4d5e6f` -> `cuda`.
fn stem(binary: &str) -> &str {
    match binary.rsplit_once('-') {
        Some((s, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => s,
        _ => binary,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake run: one binary with a pass, a fail and a skip (which libtest calls passed), one
    /// that died mid-run, and a doc-test.
    #[test]
    fn a_pass_a_fail_and_a_skip_count_once_each() {
        let out = [
            "   Compiling tandem-cuda v0.1.0",
            "     Running tests/cuda/main.rs (target/debug/deps/cuda-0123456789abcdef)",
            "",
            "running 3 tests",
            "test ops::passes ... ok",
            "test ops::no_gpu ... ok",
            "test ops::fails ... FAILED",
            "",
            "failures:",
            "    ops::fails",
            "",
            "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s",
            "",
            "     Running unittests src/lib.rs (target/debug/deps/tandem_core-fedcba9876543210)",
            "running 1 test",
            "test skip::tests::a ... ",
            "   Doc-tests tandem_core",
            "running 1 test",
            "test crates/core/src/lib.rs - x (line 3) ... ok",
            "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s",
        ];
        let log = [
            "skipped\tcuda-0123456789abcdef\tops::no_gpu\tno CUDA driver",
            "skipped\tcuda-0123456789abcdef\tops::no_gpu\tno CUDA driver, again",
            "part\tcuda-0123456789abcdef\tops::passes\t4 moe cases: no kernel",
            "skipped\ttandem-0123456789abcdef\t-\tfrom a subprocess",
        ]
        .join("\n");
        let t = libtest(&out, &log);
        assert_eq!(t.passed, 2, "ops::passes and the doc-test; ops::no_gpu is a skip");
        assert_eq!(
            t.failed,
            vec![(1, "ops::fails (cuda)".to_string()), (1, "tandem_core: ended without a result line".to_string())]
        );
        assert_eq!(t.skipped, vec![(1, "ops::no_gpu (cuda): no CUDA driver".to_string())]);
        assert_eq!(t.notes.len(), 2, "{:?}", t.notes);
        assert!(t.notes[1].contains("names no passed test"));
        assert_eq!(t.closing_line(), "tandem: 2 passed, 2 failed, 1 skipped");
    }

    #[test]
    fn a_nocapture_result_on_its_own_line_is_read() {
        let out = [
            "     Running tests/x.rs (target/debug/deps/x-0123456789abcdef)",
            "test a::b ... printed by the test",
            "ok",
            "test result: ok. 1 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.1s",
        ];
        let t = libtest(&out, "skipped\tx-0123456789abcdef\ta::b\twhy");
        assert_eq!((t.passed, t.failed_count(), t.skipped_count()), (0, 0, 2), "{t:?}");
    }

    #[test]
    fn step_summaries_are_read() {
        assert_eq!(
            summary("wgpu: 120 passed, 1 failed, 4 skipped"),
            Some(Summary { passed: 120, failed: 1, skipped: 4, why: None })
        );
        assert_eq!(
            summary("cuda: 0 passed, 0 failed (skipped: no driver)"),
            Some(Summary { passed: 0, failed: 0, skipped: 1, why: Some("no driver".into()) })
        );
        assert_eq!(summary("all good"), None);
        let mut t = Tally::default();
        let client =
            ["client checks: 3 passed, 0 failed".to_string(), "client checks: 2 passed, 0 failed, 1 skipped".into()];
        t.counted_step("the client checks", &client, false, Some("no attribute"));
        t.counted_step("deploy/", &["no count here".into()], true, None);
        assert_eq!((t.passed, t.failed_count(), t.skipped_count()), (6, 1, 1));
        assert_eq!(t.skipped[0].1, "the client checks: no attribute");
    }
}
