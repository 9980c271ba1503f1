//! The report every benchmark writes: where it ran (cores, CPU, backend and device, commit,
//! date), what it ran (model, settings) and what it measured; plus a Markdown table printer.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::OutputArgs;

/// The machine: logical cores, CPU model (from /proc/cpuinfo where it exists), OS, load.
pub fn machine() -> Value {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let os = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=").map(|v| v.trim_matches('"').to_string())))
        .unwrap_or_else(|| std::env::consts::OS.into());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("MemTotal:").and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            })
        })
        .map(|kb| (kb / (1024.0 * 1024.0) * 10.0).round() / 10.0);
    // Other work on a shared box skews every figure: record how busy it was.
    let loadavg = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    json!({"cores": cores, "cpu": cpu, "memory_gib": mem_gib, "os": os, "arch": std::env::consts::ARCH, "loadavg_1_5_15m": loadavg})
}

/// `TANDEM_GIT_COMMIT`, else `git rev-parse HEAD`, else "unknown" (a copied binary has no repo).
pub fn git_commit() -> String {
    if let Ok(c) = std::env::var("TANDEM_GIT_COMMIT") {
        return c;
    }
    Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// UTC time as `YYYY-MM-DDTHH:MM:SSZ` (no date crate for one line of output).
pub fn utc_now() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format_utc(secs)
}

pub fn format_utc(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar, counting
/// in 400-year eras that start on March 1st (so the leap day ends a year).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The full report object.
pub fn build(kind: &str, backend: Value, model: Value, settings: Value, results: Value) -> Value {
    json!({
        "benchmark": kind,
        "date": utc_now(),
        "git_commit": git_commit(),
        "tandem_version": env!("CARGO_PKG_VERSION"),
        "machine": machine(),
        "backend": backend,
        "model": model,
        "settings": settings,
        "results": results,
    })
}

/// Writes `<dir>/<stem>.json`; returns its path.
pub fn write_json(out: &OutputArgs, default_stem: &str, report: &Value) -> Result<PathBuf> {
    let path = out_path(out, default_stem, "json")?;
    let text = serde_json::to_string_pretty(report)? + "\n";
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(path)
}

/// `<dir>/<stem>.<ext>`, with the folder created.
pub fn out_path(out: &OutputArgs, default_stem: &str, ext: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(&out.output_dir).with_context(|| format!("creating {}", out.output_dir.display()))?;
    let stem = out.name.clone().unwrap_or_else(|| sanitize(default_stem));
    Ok(out.output_dir.join(format!("{stem}.{ext}")))
}

/// A file-name-safe stem: letters, digits, `-`, `_`, `.`.
pub fn sanitize(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).collect()
}

/// A Markdown table.
pub fn markdown_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut s =
        format!("| {} |\n|{}|\n", header.join(" | "), header.iter().map(|_| "---").collect::<Vec<_>>().join("|"));
    for r in rows {
        s += &format!("| {} |\n", r.join(" | "));
    }
    s
}

/// A model directory's label for file names: its folder name.
pub fn dir_label(dir: &Path) -> String {
    dir.file_name().map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates_match_known_instants() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        // 2000-02-29 12:34:56 UTC, a leap day in a century leap year.
        assert_eq!(format_utc(951_827_696), "2000-02-29T12:34:56Z");
        // 2026-11-30 23:59:59 UTC.
        assert_eq!(format_utc(1_796_083_199), "2026-11-30T23:59:59Z");
    }

    #[test]
    fn tables_have_a_separator_per_column() {
        let t = markdown_table(&["a", "b"], &[vec!["1".into(), "2".into()]]);
        assert_eq!(t, "| a | b |\n|---|---|\n| 1 | 2 |\n");
        assert_eq!(sanitize("tiny/ref x"), "tiny-ref-x");
    }
}
