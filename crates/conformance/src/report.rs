//! What a run found, and how it is printed: one line per case, then `name: N passed, N failed`.

use std::io::Write;

use crate::case::{CaseResult, PerfResult};

/// Results of one conformance run on one backend.
#[derive(Debug, Clone)]
pub struct Report {
    pub backend: String,
    pub seed: u64,
    /// The filter the run was given, if any.
    pub filter: Option<String>,
    pub results: Vec<CaseResult>,
    pub passed: usize,
    pub failed: usize,
    /// Cases the backend has no path for (each says why on its line; [`CaseResult::skipped`]).
    pub skipped_cases: usize,
    /// Why nothing ran, when the backend could not be started (see [`Report::skipped`]).
    pub skipped: Option<String>,
}

impl Report {
    /// The report for a backend that is absent (no driver, no device): nothing ran. Prints
    /// `cuda: 0 passed, 0 failed (skipped: <reason>)`. It is not ok; a caller that did not
    /// require the backend may treat it as a skip, one that did must fail.
    pub fn skipped(backend: &str, reason: &str, out: &mut dyn Write) -> Report {
        let rep = Report {
            backend: backend.to_string(),
            seed: 0,
            filter: None,
            results: vec![],
            passed: 0,
            failed: 0,
            skipped_cases: 0,
            skipped: Some(reason.to_string()),
        };
        say(out, &rep.summary());
        rep
    }

    /// True when at least one case ran and none failed: a filter that selects nothing is not
    /// a pass (a misspelt op name must not print "ok").
    pub fn ok(&self) -> bool {
        self.failed == 0 && self.passed > 0
    }

    /// The run's skipped cases as counted lines, one per op and reason (in the cases' order),
    /// each with how many cases it covers: `op suite on wgpu: 4 moe_routed cases skipped: why`,
    /// or the case's parameters where it is one.
    pub fn skip_notes(&self) -> Vec<String> {
        let mut groups: Vec<(&str, &str, &str, usize)> = vec![];
        for r in &self.results {
            let Some(why) = r.skipped.as_deref() else { continue };
            match groups.iter_mut().find(|g| g.0 == r.op && g.2 == why) {
                Some(g) => g.3 += 1,
                None => groups.push((r.op, &r.params, why, 1)),
            }
        }
        groups
            .into_iter()
            .map(|(op, params, why, n)| match n {
                1 => format!("op suite on {}: {op} {params}: {why}", self.backend),
                _ => format!("op suite on {}: {n} {op} cases skipped: {why}", self.backend),
            })
            .collect()
    }

    /// `wgpu: 57 passed, 0 failed`, and `, N skipped` where the backend lacks N cases' ops.
    pub fn summary(&self) -> String {
        let mut s = format!("{}: {} passed, {} failed", self.backend, self.passed, self.failed);
        if self.skipped_cases > 0 {
            s += &format!(", {} skipped", self.skipped_cases);
        }
        if let Some(why) = &self.skipped {
            s += &format!(" (skipped: {why})");
        } else if self.passed + self.failed + self.skipped_cases == 0 {
            s += &format!(" (no case matches {:?})", self.filter.as_deref().unwrap_or(""));
        }
        s
    }

    /// The results of the cases that failed.
    pub fn failures(&self) -> impl Iterator<Item = &CaseResult> {
        self.results.iter().filter(|r| !r.passed())
    }
}

pub(crate) fn case_line(r: &CaseResult) -> String {
    let nmse = r.nmse.map_or("-".to_string(), |e| format!("{e:.2e}"));
    let status = match (&r.failure, &r.skipped) {
        (Some(why), _) => format!("FAIL  {why}  (case seed {})", r.seed),
        (None, Some(why)) => format!("SKIP  {why}"),
        (None, None) => "ok".to_string(),
    };
    let limit = if r.limit == 0.0 { "exact".to_string() } else { format!("{:.0e}", r.limit) };
    format!("{:<16} {:<64} nmse={:<9} limit={limit:<6} {status}", r.op, r.params, nmse)
}

/// Results of a perf run on one backend.
#[derive(Debug, Clone)]
pub struct PerfReport {
    pub backend: String,
    pub results: Vec<PerfResult>,
}

impl PerfReport {
    /// Cases that could not be timed (the backend failed or panicked).
    pub fn failed(&self) -> usize {
        self.results.iter().filter(|r| r.failure.is_some()).count()
    }
}

pub(crate) fn perf_line(r: &PerfResult) -> String {
    let head = format!("{:<16} {:<64}", r.op, r.params);
    if let (None, Some(why)) = (&r.failure, &r.skipped) {
        return format!("{head} SKIP  {why}");
    }
    match (&r.failure, r.median(), r.min()) {
        (Some(why), _, _) => format!("{head} FAIL  {why}"),
        (None, Some(med), Some(min)) => {
            let s = med.as_secs_f64();
            let mut line = format!(
                "{head} median {:>10.1} us  min {:>10.1} us  ({} samples of {} launches)",
                s * 1e6,
                min.as_secs_f64() * 1e6,
                r.times.len(),
                crate::ops::LAUNCHES_PER_SAMPLE
            );
            if r.bytes > 0.0 {
                line += &format!("  {:>8.2} GB/s", r.bytes / s / 1e9);
            }
            if r.flops > 0.0 {
                line += &format!("  {:>8.2} GFLOP/s", r.flops / s / 1e9);
            }
            line
        }
        _ => format!("{head} no timings"),
    }
}

pub(crate) fn say(out: &mut dyn Write, line: &str) {
    // The report is also returned, so a closed output stream loses nothing that matters.
    let _ = writeln!(out, "{line}");
}
