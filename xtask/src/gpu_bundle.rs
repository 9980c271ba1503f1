//! `cargo xtask gpu-bundle`: everything the GPU machine needs in `bundle/` (git-ignored): the
//! stripped release `tandem`, the stripped release build of the CUDA crate's integration tests
//! (`cuda-tests`: check.sh runs their GPU-only modules, which skip everywhere else), gpu/check.sh,
//! gpu/*.py and bench/*.py (the HF peers), the kernel sources (for `TANDEM_KERNEL_DIR`) and a
//! COMMIT file. That machine has no Rust toolchain and no network,
//! and at most 64 MiB travels with the working tree, so the bundle must be small and whole.
//! Prints its size and the exact device `run` call (docs/gpu-check.md). `cargo xtask
//! gpu-rehearsal` lays out the same folder ([`assemble`]) from debug builds and runs it on the
//! fake driver.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// What may travel to the device machine: the working tree and the carried paths together.
const TRAVEL_LIMIT: u64 = 64 << 20;

#[derive(clap::Args)]
pub struct Args {
    /// Bundle the release binary already built instead of building it first.
    #[arg(long)]
    no_build: bool,
    /// Output folder, relative to the workspace root.
    #[arg(long, default_value = "bundle")]
    out: PathBuf,
}

pub fn run(a: Args) -> Result<()> {
    let root = crate::workspace_root();
    if !a.no_build {
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--release", "-p", "tandem-cli"])
            .current_dir(&root)
            .status()
            .context("running cargo build --release -p tandem-cli")?;
        if !status.success() {
            bail!("cargo build --release -p tandem-cli failed ({status})");
        }
    }
    let bin = root.join("target/release/tandem");
    if !bin.is_file() {
        bail!("{}: no release binary (run without --no-build)", bin.display());
    }
    let tests = cuda_test_binary(&root, a.no_build, true)?;
    let out = root.join(&a.out);
    let Assembled { scripts, kernel_files: cu } = assemble(&root, &out, &bin, &tests, false)?;
    // The release profile strips already; `strip` again is a no-op then, and a guard if the
    // profile ever changes (an unstripped binary with debug info is ~200 MB).
    for b in ["tandem", "cuda-tests"] {
        match Command::new("strip").arg(out.join(b)).status() {
            Ok(s) if s.success() => {}
            Ok(s) => eprintln!("warning: strip {b} exited with {s}; bundling it as built"),
            Err(e) => eprintln!("warning: no strip ({e}); bundling {b} as built"),
        }
    }
    let cached = fill_ptx_cache(&root, &out.join("ptx-cache"));
    let commit = git(&root, &["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    // Uncommitted changes in tracked files mean the binary is not exactly that commit.
    let dirty = git(&root, &["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    let built = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    // With --no-build the binary may predate this commit: say so rather than vouch for it.
    let line = format!(
        "{commit}{}{} bundled {}",
        if dirty { " (with uncommitted changes)" } else { "" },
        if a.no_build { " (--no-build: binary built earlier, maybe from another commit)" } else { "" },
        built.unwrap_or_default()
    );
    std::fs::write(out.join("COMMIT"), line.clone() + "\n").context("writing COMMIT")?;

    let bundle = dir_size(&out)?;
    let tree = travelling_tree_size(&root);
    let size = |b: &str| std::fs::metadata(out.join(b)).map(|m| mib(m.len()));
    println!("bundle: {} ({:.1} MiB: tandem {:.1} MiB, cuda-tests {:.1} MiB, {scripts} scripts, {cu} kernel files, {cached}), commit {line}", out.display(), mib(bundle), size("tandem")?, size("cuda-tests")?);
    match tree {
        Some(t) => println!(
            "working tree that travels with it: {:.1} MiB; together {:.1} of {:.0} MiB",
            mib(t),
            mib(t + bundle),
            mib(TRAVEL_LIMIT)
        ),
        None => println!(
            "working tree size unknown (git ls-files failed); the limit is {:.0} MiB together",
            mib(TRAVEL_LIMIT)
        ),
    }
    if bundle + tree.unwrap_or(0) > TRAVEL_LIMIT {
        bail!("bundle and working tree exceed the {:.0} MiB that may travel", mib(TRAVEL_LIMIT));
    }
    println!();
    // check.sh keeps its steps inside 480 s (TANDEM_CHECK_BUDGET_S); a step cut at the budget
    // may take 10 s more to die, then the summary: 570 s stays under the 600 s a call may run.
    // Without kind="nvidia-h200" a call may land on an H100, whose figures are not the H200's.
    println!("device call (one H200, at most about 8 minutes of steps; timeout leaves room for the summary):");
    println!(
        r#"  run(command="bash {}/check.sh $OUT", carry=["{}"], kind="nvidia-h200", timeout_s=570)"#,
        a.out.display(),
        a.out.display()
    );
    println!("then the tuning round (after `cargo xtask gpu-rehearsal` has run both on the fake driver):");
    println!(
        r#"  run(command="bash {}/tune.sh $OUT", carry=["{}"], kind="nvidia-h200", timeout_s=400)"#,
        a.out.display(),
        a.out.display()
    );
    println!("each returns at most 8 files; merge latest.json with: python3 gpu/merge_latest.py OUT/latest.json");
    println!("dry run here:  XDG_RUNTIME_DIR=/tmp/xdg TANDEM_CHECK_BACKEND=wgpu TANDEM_CHECK_BENCH_SHAPE=tiny TANDEM_CHECK_SMALL=1 bash {}/check.sh /tmp/check-out", a.out.display());
    Ok(())
}

/// The kernels' cubins for sm_90 (the H200), compiled here by NVRTC 13.0 from the pip wheels
/// into `dir` under the backend's cache keys (`tandem-kernels-check --fill-cache 90`): check.sh
/// copies them into the backend's cache, so the first process there skips NVRTC and the
/// driver's JIT (the first start took about 80 s in the 2026-12-04 check, and over 120 s in its
/// tuning round, with PTX only). The key holds NVRTC's version: the GPU's own 13.0 finds these;
/// another version compiles afresh. Optional: without the toolchain the bundle goes without
/// them, and says so.
fn fill_ptx_cache(root: &Path, dir: &Path) -> String {
    let tc = root.join(".venv-cuda/lib/python3.11/site-packages/nvidia/cu13/lib");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root)
        .args([
            "run",
            "--quiet",
            "--release",
            "-p",
            "tandem-cuda",
            "--bin",
            "tandem-kernels-check",
            "--",
            "--fill-cache",
            "90",
        ])
        .env("TANDEM_PTX_CACHE", dir);
    if tc.is_dir() {
        cmd.env("TANDEM_CUDA_LIB", &tc);
    }
    match cmd.status() {
        Ok(s) if s.success() => format!("cubins for sm_90 in {}", dir.display()),
        Ok(s) => {
            eprintln!("warning: no kernel cache in the bundle (tandem-kernels-check --fill-cache exited with {s}; kernels/install-toolchain.sh installs NVRTC)");
            "no kernel cache".into()
        }
        Err(e) => {
            eprintln!("warning: no kernel cache in the bundle ({e})");
            "no kernel cache".into()
        }
    }
}

/// The build of crates/cuda/tests/cuda (the `cuda` test target), release or debug, built here
/// unless `no_build` (then the newest one already in target/<profile>/deps). Cargo names the
/// file `cuda-<hash>`; with a build, its JSON messages say which.
pub fn cuda_test_binary(root: &Path, no_build: bool, release: bool) -> Result<PathBuf> {
    let profile = if release { "release" } else { "debug" };
    if no_build {
        let deps = root.join("target").join(profile).join("deps");
        let mut found: Vec<(std::time::SystemTime, PathBuf)> = vec![];
        for e in std::fs::read_dir(&deps).with_context(|| format!("reading {}", deps.display()))? {
            let p = e?.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with("cuda-") && p.extension().is_none() && p.is_file() {
                found.push((std::fs::metadata(&p)?.modified()?, p));
            }
        }
        return found.into_iter().max().map(|(_, p)| p).ok_or_else(|| {
            anyhow::anyhow!("no release build of the cuda tests in {} (run without --no-build)", deps.display())
        });
    }
    // The debug build (the fake driver's rehearsal) as the fake-driver group runs it, with the
    // workspace's features (fake_cuda.rs CUDA_TEST: `-p tandem-cuda` would recompile much of
    // what the workspace's `cargo test` built).
    let mut args = if release {
        vec!["test", "--release", "-p", "tandem-cuda", "--test", "cuda"]
    } else {
        crate::fake_cuda::CUDA_TEST.to_vec()
    };
    args.extend(["--no-run", "--message-format=json"]);
    let o = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(&args)
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !o.status.success() {
        bail!("cargo {} failed ({})", args.join(" "), o.status);
    }
    // The artifact line of the `cuda` test target carries "executable":"<path>".
    let out = String::from_utf8_lossy(&o.stdout);
    let key = "\"executable\":\"";
    out.lines()
        .filter(|l| {
            l.contains("\"reason\":\"compiler-artifact\"") && l.contains("\"name\":\"cuda\"") && l.contains("\"test\"")
        })
        .find_map(|l| l.split_once(key).and_then(|(_, rest)| rest.split_once('"')).map(|(p, _)| PathBuf::from(p)))
        .ok_or_else(|| anyhow::anyhow!("cargo built the cuda tests but named no executable"))
}

/// What [`assemble`] put in the folder.
pub struct Assembled {
    pub scripts: usize,
    pub kernel_files: usize,
}

/// The bundle's layout in `out` (emptied first): `tandem` and `cuda-tests` (copies, or links
/// to them with `link`), gpu/*.sh and gpu/*.py and bench/*.py beside them (the bundle is flat),
/// and kernels/*.cu, *.cuh. The caller adds COMMIT and, for the GPU, the kernel cache.
pub fn assemble(root: &Path, out: &Path, tandem: &Path, tests: &Path, link: bool) -> Result<Assembled> {
    if out.exists() {
        std::fs::remove_dir_all(out).with_context(|| format!("removing the old {}", out.display()))?;
    }
    std::fs::create_dir_all(out.join("kernels")).with_context(|| format!("creating {}", out.display()))?;
    for (from, name) in [(tandem, "tandem"), (tests, "cuda-tests")] {
        if link {
            std::os::unix::fs::symlink(from, out.join(name))
                .with_context(|| format!("linking {} as {}", from.display(), out.join(name).display()))?;
        } else {
            copy(from, &out.join(name))?;
        }
    }
    let gpu = root.join("gpu");
    let mut scripts = 0;
    for e in std::fs::read_dir(&gpu).with_context(|| format!("reading {}", gpu.display()))? {
        let p = e?.path();
        let ext = p.extension().and_then(|x| x.to_str()).unwrap_or("");
        if ext == "py" || ext == "sh" {
            copy(&p, &out.join(p.file_name().unwrap_or_default()))?;
            scripts += 1;
        }
    }
    // The HF transformers peers (bench/hf_*.py) sit beside check.sh in the bundle; it looks
    // there first, then in ../bench of a checkout.
    let bench = root.join("bench");
    for e in std::fs::read_dir(&bench).with_context(|| format!("reading {}", bench.display()))? {
        let p = e?.path();
        if p.extension().and_then(|x| x.to_str()) == Some("py") {
            let dest = out.join(p.file_name().unwrap_or_default());
            if dest.exists() {
                bail!("{} and gpu/ both have {}: the bundle is flat", p.display(), dest.display());
            }
            copy(&p, &dest)?;
            scripts += 1;
        }
    }
    if !out.join("check.sh").is_file() {
        bail!("gpu/check.sh is missing: the bundle would have nothing to run");
    }
    let kernels = root.join("kernels");
    let mut kernel_files = 0;
    for e in std::fs::read_dir(&kernels).with_context(|| format!("reading {}", kernels.display()))? {
        let p = e?.path();
        if matches!(p.extension().and_then(|x| x.to_str()), Some("cu" | "cuh")) {
            copy(&p, &out.join("kernels").join(p.file_name().unwrap_or_default()))?;
            kernel_files += 1;
        }
    }
    Ok(Assembled { scripts, kernel_files })
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

fn git(root: &Path, args: &[&str]) -> Option<String> {
    let o = Command::new("git").args(args).current_dir(root).output().ok()?;
    o.status.success().then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let md = e.metadata()?;
        total += if md.is_dir() { dir_size(&e.path())? } else { md.len() };
    }
    Ok(total)
}

/// Tracked and untracked-but-not-ignored files: what the device machine receives besides
/// the carried paths.
fn travelling_tree_size(root: &Path) -> Option<u64> {
    let list = git(root, &["ls-files", "-co", "--exclude-standard", "-z"])?;
    Some(
        list.split('\0')
            .filter(|p| !p.is_empty())
            .filter_map(|p| std::fs::metadata(root.join(p)).ok())
            .map(|m| m.len())
            .sum(),
    )
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}
