//! `cargo xtask fuzz`: the coverage-guided fuzz targets in fuzz/ (cargo-fuzz, libFuzzer).
//!
//! Why cargo-fuzz: libFuzzer's coverage-guided mutation through rustc's own sanitizer-coverage
//! instrumentation, with AddressSanitizer and libFuzzer's allocation and RSS limits, needs only
//! the nightly toolchain installed beside stable here and a `cargo install`; afl would need
//! AFL++ built from source with its LLVM plugins, which this machine's Debian LLVM does not ship.
//!
//! - `cargo xtask fuzz` (what `cargo xtask test` runs): every target's committed regression
//!   inputs (fuzz/regressions/<target>/, each a finding since fixed) replayed, then every target
//!   fuzzed for `--seconds` (default [`CI_SECONDS`]) from its committed corpus into a scratch
//!   corpus, with
//!   libFuzzer's mutations drawn from a fixed seed ([`CI_SEED`]): libFuzzer on one thread is
//!   deterministic for a given binary, corpus and seed, so the test command explores the same
//!   inputs on every run of a commit (a slower machine, a prefix of them) and passes or fails
//!   the same way; new ground is broken by the runs by hand below, never by CI's luck.
//! - `cargo xtask fuzz --target T --seconds 1800 --keep --seed 0`: a long run by hand (seed 0:
//!   libFuzzer draws one and prints it); new corpus entries go into fuzz/corpus/T (minimise with
//!   `cargo fuzz cmin` before committing).
//!
//! A crash leaves its input under fuzz/artifacts/<target>/ and fails the task.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

/// Every target (fuzz/fuzz_targets/<name>.rs).
pub const TARGETS: &[&str] = &["gguf", "safetensors", "config_json", "tokenizer_json", "chat_template", "http_request"];

/// libFuzzer's limits for every run: inputs up to 64 KiB (model headers and requests), any
/// single allocation over 1 GiB or an RSS over 2 GiB is a finding, as is one input taking 10 s.
const LIMITS: &[&str] = &["-max_len=65536", "-malloc_limit_mb=1024", "-rss_limit_mb=2048", "-timeout=10"];

/// Seconds of fuzzing per target in the test command's run (and `cargo xtask fuzz`'s default).
/// libFuzzer first runs every input of the committed corpus (fuzz/corpus/<target>, what the
/// 30-minute runs by hand of docs/results/2026-12-04-fuzzing.md found, minimised), whatever the
/// time limit, and only then mutates: so a CI run is the regression inputs, the whole corpus
/// replayed under ASan and libFuzzer's limits, and a few seconds' smoke of fresh mutations from
/// [`CI_SEED`]. New ground is the long runs' job, not CI's.
pub const CI_SECONDS: u64 = 5;

/// The mutation seed of the test command's runs (any fixed value; 0 asks libFuzzer for a fresh one).
pub const CI_SEED: u32 = 1;

#[derive(clap::Args)]
pub struct Args {
    /// One target (default: all).
    #[arg(long)]
    target: Option<String>,
    /// Seconds of fuzzing per target.
    #[arg(long, default_value_t = CI_SECONDS)]
    seconds: u64,
    /// Keep what the run finds in fuzz/corpus/<target> (a long run by hand).
    #[arg(long)]
    keep: bool,
    /// libFuzzer's mutation seed; 0 draws a fresh one (printed in its log).
    #[arg(long, default_value_t = CI_SEED)]
    seed: u32,
}

pub struct Outcome {
    pub passed: u64,
    pub skipped: Option<String>,
}

pub fn run(a: Args) -> Result<()> {
    let o = fuzz(&crate::workspace_root(), a.target.as_deref(), a.seconds, a.keep, a.seed)?;
    if let Some(why) = o.skipped {
        println!("SKIPPED fuzzing: {why}");
    }
    Ok(())
}

/// Cargo on the nightly toolchain, through rustup.
fn nightly() -> Command {
    let mut c = Command::new("cargo");
    c.arg("+nightly");
    c
}

/// Builds, replays the regressions and fuzzes; `Outcome::skipped` says why nothing ran.
pub fn fuzz(root: &Path, only: Option<&str>, seconds: u64, keep: bool, seed: u32) -> Result<Outcome> {
    let dir = root.join("fuzz");
    let targets: Vec<&str> = match only {
        Some(t) if TARGETS.contains(&t) => vec![t],
        Some(t) => bail!("no fuzz target `{t}` (targets: {})", TARGETS.join(", ")),
        None => TARGETS.to_vec(),
    };
    if !nightly().arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Ok(Outcome {
            passed: 0,
            skipped: Some("no nightly toolchain (`rustup toolchain install nightly`)".into()),
        });
    }
    if !nightly().args(["fuzz", "--version"]).output().is_ok_and(|o| o.status.success()) {
        println!("installing cargo-fuzz");
        let st = nightly().args(["install", "cargo-fuzz", "--locked"]).status()?;
        if !st.success() {
            bail!("`cargo install cargo-fuzz` failed");
        }
    }
    let t0 = Instant::now();
    let mut build = nightly();
    build.current_dir(&dir).args(["fuzz", "build", "-O", "--debug-assertions"]);
    if let Some(t) = only {
        build.arg(t);
    }
    if !build.status()?.success() {
        bail!("building the fuzz targets failed");
    }
    println!("fuzz targets built in {:.0} s", t0.elapsed().as_secs_f64());
    let bins = dir.join("target/x86_64-unknown-linux-gnu/release");
    let mut passed = 0;
    for t in targets {
        let bin = bins.join(t);
        // The findings, fixed: each must now run clean.
        let reg = dir.join("regressions").join(t);
        let inputs: Vec<_> =
            std::fs::read_dir(&reg).map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
        if !inputs.is_empty() {
            let st = Command::new(&bin)
                .current_dir(&dir)
                .args(LIMITS)
                .args(&inputs)
                .status()
                .with_context(|| format!("running {}", bin.display()))?;
            if !st.success() {
                bail!("fuzz target {t}: a regression input crashes again (fuzz/regressions/{t})");
            }
            println!("fuzz {t}: {} regression input(s) pass", inputs.len());
        }
        let corpus = dir.join("corpus").join(t);
        let scratch = std::env::temp_dir().join(format!("tandem-fuzz-corpus-{}-{t}", std::process::id()));
        std::fs::create_dir_all(&scratch)?;
        let artifacts = dir.join("artifacts").join(t);
        std::fs::create_dir_all(&artifacts)?;
        // libFuzzer writes new inputs into the first corpus folder and reads the others.
        let (write, read) = if keep { (corpus.clone(), None) } else { (scratch.clone(), Some(corpus.clone())) };
        let t1 = Instant::now();
        let out = Command::new(&bin)
            .current_dir(&dir)
            .args(LIMITS)
            .arg(format!("-max_total_time={seconds}"))
            .arg(format!("-seed={seed}"))
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .arg("-print_final_stats=1")
            .arg(&write)
            .args(read)
            .output()
            .with_context(|| format!("running {}", bin.display()))?;
        let _ = std::fs::remove_dir_all(&scratch);
        let log = String::from_utf8_lossy(&out.stderr);
        let runs = log
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "?".into());
        let cov = log
            .lines()
            .rev()
            .find_map(|l| l.split_once(" cov: ").map(|(_, r)| r.split_whitespace().next().unwrap_or("?").to_string()))
            .unwrap_or_else(|| "?".into());
        if !out.status.success() {
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!("fuzz target {t} found a crash (input under fuzz/artifacts/{t}):\n{}", tail.join("\n"));
        }
        println!(
            "fuzz {t}: {runs} inputs in {:.0} s (seed {seed}), coverage {cov}, no crash",
            t1.elapsed().as_secs_f64()
        );
        passed += 1;
    }
    Ok(Outcome { passed, skipped: None })
}
