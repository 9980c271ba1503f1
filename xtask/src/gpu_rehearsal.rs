//! `cargo xtask gpu-rehearsal OUT`: the GPU call rehearsed on the fake driver (crates/fake-cuda),
//! end to end, before a GPU minute is spent on it.
//!
//! A lent GPU gives 15 minutes, and a call returns at most 8 files, no more than 2 folders
//! down, 16 MiB each (docs/gpu-check.md, "What comes back"). This lays out the bundle exactly as
//! `cargo xtask gpu-bundle` does (from the debug builds, linked rather than copied), runs its
//! check.sh and then a short tune.sh into one OUT at tiny shapes on the fake driver, and then
//! checks OUT as the device tool would return it: the file count, the depth, the names, the
//! sizes; latest.json there and marked as the fake's (gpu/merge_latest.py must refuse it); the
//! two archives readable. Both scripts must exit 0: a failed step fails the rehearsal, a
//! skipped one (no torch here, say) is listed.
//!
//! It runs in the fake-driver group of `cargo xtask test` (xtask/src/fake_cuda.rs), so a change
//! that would make the next GPU call lose its results fails CI.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::fake_cuda::FakeEnv;

/// What a device call returns (the device tool's limits).
pub const MAX_FILES: usize = 8;
/// Folders between OUT and a file that still comes back (`OUT/a/b/file`).
pub const MAX_FOLDERS: usize = 2;
pub const MAX_FILE_BYTES: u64 = 16 << 20;
pub const MAX_TOTAL_BYTES: u64 = 64 << 20;

/// The files a rehearsal (check.sh, then tune.sh, into one OUT) must leave.
const EXPECTED: [&str; 8] = [
    "check.log",
    "summary.txt",
    "results.json",
    "latest.json",
    "check-files.tar.gz",
    "tune.log",
    "tune.tsv",
    "tune-files.tar.gz",
];

/// The rehearsal's settings of check.sh and tune.sh: the tiny shape, the quick parts of each
/// group, budgets that keep the whole under about three minutes on two CPU cores.
const CHECK_ENV: [(&str, &str); 12] = [
    ("TANDEM_CHECK_BACKEND", "cuda"),
    ("TANDEM_CHECK_BENCH_SHAPE", "tiny"),
    ("TANDEM_CHECK_SMALL", "2"),
    ("TANDEM_CHECK_BUDGET_S", "150"),
    ("TANDEM_CHECK_GROUPS", "correctness,decode,kernels"),
    ("TANDEM_CHECK_OPS", "rms_norm"),
    ("TANDEM_CHECK_CUDA_TESTS", "moe::"),
    ("TANDEM_CHECK_FAMILIES", "tiny-qwen3-moe"),
    ("TANDEM_CHECK_SMOL", "0"),
    ("TANDEM_CHECK_COMPARE_ARGS", "--prompts 2 --steps 3 --chunk 32 --batch 0"),
    ("TANDEM_CHECK_HF_COMPILE", "0"),
    ("TANDEM_OPS_SEED", "1"),
];
const TUNE_ENV: [(&str, &str); 12] = [
    ("TANDEM_TUNE_SMALL", "1"),
    ("TANDEM_TUNE_BUDGET_S", "150"),
    ("TANDEM_TUNE_VARIANTS", "m128_occ2:m64_occ4:m16 m128_occ2:m64_occ4:m16_gemv4"),
    ("TANDEM_TUNE_ATTN_VARIANTS", "tc"),
    ("TANDEM_TUNE_ATTN_D256_VARIANTS", "partial"),
    ("TANDEM_TUNE_SAMPLERS", "bisect:one"),
    ("TANDEM_TUNE_PDL", "0"),
    ("TANDEM_TUNE_ATTN_FP8", "0"),
    ("TANDEM_TUNE_OPS", "rms_norm"),
    ("TANDEM_TUNE_CUDA_TESTS", "staging::"),
    ("TANDEM_TUNE_COMPARE_ARGS", "--prompts 2 --steps 3 --chunk 32 --batch 0"),
    ("TANDEM_TUNE_NCU", "0"),
];

#[derive(clap::Args)]
pub struct Args {
    /// Where to leave what the device call would return (emptied first).
    out: PathBuf,
    /// The `tandem` binary to bundle (default: target/debug/tandem, built first when missing;
    /// `cargo build -p tandem-cli` alone resolves other features than the workspace and
    /// recompiles much, so a binary the workspace built is preferred).
    #[arg(long)]
    tandem: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    let root = crate::workspace_root();
    let env = crate::fake_cuda::prepare(&root)?;
    let built = crate::fake_cuda::target_dir(&root).join("debug/tandem");
    let tandem = match a.tandem {
        Some(t) => t,
        None if built.is_file() => built,
        None => crate::fake_cuda::build_tandem(&root)?,
    };
    println!("gpu-rehearsal: bundling {}", tandem.display());
    let out = if a.out.is_absolute() { a.out.clone() } else { std::env::current_dir()?.join(&a.out) };
    let r = rehearse(&root, &env, &tandem, &out)?;
    println!("{}", r.line());
    if !r.problems.is_empty() {
        bail!("the rehearsal failed: {}", r.problems.join("; "));
    }
    Ok(())
}

/// What a rehearsal found.
pub struct Rehearsal {
    pub files: Vec<Returned>,
    pub problems: Vec<String>,
    pub skipped: Vec<String>,
    pub seconds: f64,
}

impl Rehearsal {
    pub fn line(&self) -> String {
        let bytes: u64 = self.files.iter().map(|f| f.bytes).sum();
        format!(
            "gpu-rehearsal: {} files ({:.1} MiB) of at most {MAX_FILES}: {}; {} steps skipped{}; {} in {:.0} s",
            self.files.len(),
            bytes as f64 / (1 << 20) as f64,
            self.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>().join(", "),
            self.skipped.len(),
            if self.skipped.is_empty() { String::new() } else { format!(" ({})", self.skipped.join("; ")) },
            if self.problems.is_empty() { "ok".to_string() } else { format!("FAILED: {}", self.problems.join("; ")) },
            self.seconds
        )
    }
}

/// Lays out the bundle from the debug builds, runs check.sh then tune.sh into `out` on the fake
/// driver, and checks `out` against the device's limits. Errors only where it could not run;
/// what it found wrong is in `problems`.
pub fn rehearse(root: &Path, env: &FakeEnv, tandem: &Path, out: &Path) -> Result<Rehearsal> {
    let t = Instant::now();
    let tests = crate::gpu_bundle::cuda_test_binary(root, false, false)?;
    let base = crate::fake_cuda::target_dir(root).join("gpu-rehearsal");
    let bundle = base.join("bundle");
    crate::gpu_bundle::assemble(root, &bundle, tandem, &tests, true)?;
    let commit = Command::new("git").args(["rev-parse", "HEAD"]).current_dir(root).output().ok();
    let commit = commit.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default();
    std::fs::write(bundle.join("COMMIT"), format!("{commit} (fake-driver rehearsal, debug build)\n"))?;
    if out.exists() {
        std::fs::remove_dir_all(out).with_context(|| format!("emptying {}", out.display()))?;
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let work = base.join("work");
    let mut problems = vec![];
    let mut skipped = vec![];
    for (script, settings, limit) in [("check.sh", &CHECK_ENV[..], 240), ("tune.sh", &TUNE_ENV[..], 240)] {
        let mut cmd = env.command("bash");
        cmd.arg(bundle.join(script)).arg(out).current_dir(root).env("TANDEM_CHECK_WORK", &work);
        for (k, v) in settings {
            cmd.env(k, v);
        }
        let s = Instant::now();
        match run_bounded(cmd, Duration::from_secs(limit))? {
            Some(st) if st.success() => println!("gpu-rehearsal: {script} ok in {:.0} s", s.elapsed().as_secs_f64()),
            Some(st) => problems.push(format!("{script} exited with {st} (its table above says which step)")),
            None => problems.push(format!("{script} ran past {limit} s: a step outran its own timeout")),
        }
        // Each script starts its work folder's steps.tsv afresh: read it before the next.
        skipped.extend(skipped_steps(script, &work.join("raw/steps.tsv")));
    }
    let files = returned(out)?;
    problems.extend(check_returned(&files));
    problems.extend(check_latest(root, &out.join("latest.json")));
    for archive in ["check-files.tar.gz", "tune-files.tar.gz"] {
        problems.extend(check_archive(&out.join(archive)));
    }
    Ok(Rehearsal { files, problems, skipped, seconds: t.elapsed().as_secs_f64() })
}

/// Runs `cmd`, killing it (and its process group) after `limit`. None: it was killed.
fn run_bounded(mut cmd: Command, limit: Duration) -> Result<Option<std::process::ExitStatus>> {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    let mut child = cmd.spawn().context("starting bash")?;
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(Some(st));
        }
        if t.elapsed() > limit {
            let _ = Command::new("kill").args(["-KILL", &format!("-{}", child.id())]).status();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A file under OUT: its path relative to OUT and its size.
#[derive(Debug, Clone, PartialEq)]
pub struct Returned {
    pub path: String,
    pub bytes: u64,
    /// Folders between OUT and the file.
    pub folders: usize,
    /// Not a plain file (a link, a device) or a name the tool would not return.
    pub odd: Option<String>,
}

/// Every entry under `dir` that the device tool would try to return, sorted by path.
pub fn returned(dir: &Path) -> Result<Vec<Returned>> {
    fn walk(base: &Path, dir: &Path, folders: usize, acc: &mut Vec<Returned>) -> Result<()> {
        for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let e = e?;
            let p = e.path();
            let ft = e.file_type()?;
            let rel = p.strip_prefix(base).unwrap_or(&p).to_string_lossy().into_owned();
            let name = e.file_name().to_string_lossy().into_owned();
            let bad_name = !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
            if ft.is_dir() {
                if bad_name {
                    acc.push(Returned {
                        path: rel,
                        bytes: 0,
                        folders,
                        odd: Some("a folder name of other characters".into()),
                    });
                }
                walk(base, &p, folders + 1, acc)?;
                continue;
            }
            let odd = if !ft.is_file() {
                Some("not a plain file".to_string())
            } else if bad_name {
                Some("a name of other characters than letters, digits, '.', '_' and '-'".to_string())
            } else {
                None
            };
            acc.push(Returned { path: rel, bytes: e.metadata()?.len(), folders, odd });
        }
        Ok(())
    }
    let mut acc = vec![];
    walk(dir, dir, 0, &mut acc)?;
    acc.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(acc)
}

/// What the device tool would not return of `files`, each a line; also the expected files
/// that are missing.
pub fn check_returned(files: &[Returned]) -> Vec<String> {
    let mut p = vec![];
    if files.len() > MAX_FILES {
        p.push(format!("{} files, more than the {MAX_FILES} a call returns", files.len()));
    }
    for f in files {
        if f.folders > MAX_FOLDERS {
            p.push(format!("{}: {} folders down, more than {MAX_FOLDERS}", f.path, f.folders));
        }
        if f.bytes > MAX_FILE_BYTES {
            p.push(format!("{}: {} bytes, over 16 MiB", f.path, f.bytes));
        }
        if let Some(why) = &f.odd {
            p.push(format!("{}: {why}", f.path));
        }
    }
    let total: u64 = files.iter().map(|f| f.bytes).sum();
    if total > MAX_TOTAL_BYTES {
        p.push(format!("{total} bytes in all, over 64 MiB"));
    }
    for want in EXPECTED {
        if !files.iter().any(|f| f.path == want) {
            p.push(format!("{want} is missing"));
        }
    }
    p
}

/// latest.json: present, marked as the fake driver's, and refused by gpu/merge_latest.py.
fn check_latest(root: &Path, path: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(path) else { return vec![format!("{}: not written", path.display())] };
    let mut p = vec![];
    if !text.contains("\"fake_driver\": true") {
        p.push("latest.json is not marked fake_driver: it could be taken for a measurement".into());
    }
    let into = path.with_file_name(".merge-probe.json");
    let r = Command::new("python3").arg(root.join("gpu/merge_latest.py")).arg(path).arg("--into").arg(&into).output();
    let _ = std::fs::remove_file(&into);
    match r {
        Ok(o) if o.status.code() == Some(1) && String::from_utf8_lossy(&o.stderr).contains("fake driver") => {}
        Ok(o) => p.push(format!(
            "gpu/merge_latest.py did not refuse the fake's latest.json ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => p.push(format!("running gpu/merge_latest.py: {e}")),
    }
    p
}

/// An archive `tar` can list, and not empty.
fn check_archive(path: &Path) -> Vec<String> {
    match Command::new("tar").arg("-tzf").arg(path).output() {
        Ok(o) if o.status.success() && o.stdout.iter().filter(|&&b| b == b'\n').count() > 1 => vec![],
        Ok(o) => {
            vec![format!("{}: tar -tzf: {} {}", path.display(), o.status, String::from_utf8_lossy(&o.stderr).trim())]
        }
        Err(e) => vec![format!("{}: running tar: {e}", path.display())],
    }
}

/// The steps `script` skipped (rc 125 in its steps.tsv), each with why.
fn skipped_steps(script: &str, steps: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(steps).unwrap_or_default();
    text.lines()
        .map(|l| l.split('\t').collect::<Vec<_>>())
        .filter(|f| f.len() >= 4 && f[1] == "125")
        .map(|f| format!("{script} {}: {}", f[0], f[3]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, bytes: u64, folders: usize) -> Returned {
        Returned { path: path.into(), bytes, folders, odd: None }
    }

    #[test]
    fn the_expected_eight_pass_and_a_ninth_or_a_deep_one_does_not() {
        let eight: Vec<Returned> = EXPECTED.iter().map(|p| file(p, 1000, 0)).collect();
        assert!(check_returned(&eight).is_empty(), "{:?}", check_returned(&eight));
        let mut nine = eight.clone();
        nine.push(file("compare-tiny.json", 10, 0));
        assert!(check_returned(&nine).iter().any(|p| p.contains("9 files")), "{:?}", check_returned(&nine));
        let mut deep = eight.clone();
        deep[0] = file("a/b/c/check.log", 10, 3);
        let p = check_returned(&deep);
        assert!(
            p.iter().any(|p| p.contains("3 folders down")) && p.iter().any(|p| p == "check.log is missing"),
            "{p:?}"
        );
        let mut big = eight;
        big[1].bytes = 17 << 20;
        assert!(check_returned(&big).iter().any(|p| p.contains("over 16 MiB")));
    }

    #[test]
    fn returned_walks_folders_and_flags_odd_names() {
        let d = std::env::temp_dir().join(format!("gpu-rehearsal-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("a/b/c")).unwrap();
        std::fs::write(d.join("latest.json"), "{}").unwrap();
        std::fs::write(d.join("a/b/ok.txt"), "x").unwrap();
        std::fs::write(d.join("a/b/c/deep.txt"), "xy").unwrap();
        std::fs::write(d.join("odd name.txt"), "").unwrap();
        let r = returned(&d).unwrap();
        let _ = std::fs::remove_dir_all(&d);
        let by = |p: &str| r.iter().find(|f| f.path == p).cloned();
        assert_eq!(by("a/b/ok.txt").map(|f| (f.folders, f.bytes)), Some((2, 1)));
        assert_eq!(by("a/b/c/deep.txt").map(|f| f.folders), Some(3));
        assert!(by("odd name.txt").and_then(|f| f.odd).is_some());
        assert!(by("latest.json").is_some_and(|f| f.odd.is_none()));
        let p = check_returned(&r);
        assert!(
            p.iter().any(|p| p.starts_with("a/b/c/deep.txt: 3 folders"))
                && p.iter().any(|p| p.starts_with("odd name.txt")),
            "{p:?}"
        );
    }
}
