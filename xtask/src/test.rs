//! `cargo xtask test`: every test, the way CI runs it.
//!
//! 1. The default model, fetched and converted once (cached), so the SmolLM2 golden tests run.
//! 2. The CUDA kernels' compile check (NVRTC + ptxas from pinned wheels), when the toolchain is
//!    installed (`bash kernels/install-toolchain.sh`; `.ci/run` does it): the cuda crate's
//!    `kernels_check` test, required (TANDEM_REQUIRE_CUDA_TOOLCHAIN=1) wherever the toolchain is
//!    there, and under CI. It ran here a second time before `cargo test`, for its table in CI's
//!    output, which cost 1.5-3 minutes; `cargo xtask kernels --check` prints that table.
//! 3. `cargo test --workspace`, with the environment the wgpu tests need.
//! 4. The official `openai` and `anthropic` Python clients against our server
//!    (crates/server/tests/openai_client.sh).
//! 5. The fuzz targets (`cargo xtask fuzz`): regression inputs, then about 20 s of each target
//!    (`TANDEM_FUZZ_SECONDS`); skipped, counted, without a nightly toolchain.
//! 6. The fake-driver group (xtask/src/fake_cuda.rs): the CUDA backend's host code on the fake
//!    driver (crates/fake-cuda), where the CUDA toolchain is installed; counted in the closing line.
//! 7. A count of the tests that skipped themselves (`tandem_core::skip::note` logs them).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Passed on to `cargo test` (e.g. `-p tandem-engine`, `-- --nocapture`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    extra: Vec<String>,
}

pub fn run(a: Args) -> Result<()> {
    let extra = &a.extra;
    let root = crate::workspace_root();
    let t_model = std::time::Instant::now();
    let model = tandem_models::fetch::fetch_default(&root.join("models")).context("fetching the default model")?;
    println!("default model ready in {:.0} s", t_model.elapsed().as_secs_f64());
    let t0 = std::time::Instant::now();
    let ci = std::env::var_os("CI").is_some();

    // Without the toolchain the kernels_check test skips itself, and says so.
    let toolchain = root.join(".venv-cuda").exists();
    if !toolchain && ci {
        bail!("CI: the CUDA compile-check toolchain is missing; run `bash kernels/install-toolchain.sh`");
    }

    let skip_log = std::env::temp_dir().join(format!("tandem-skips-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&skip_log);
    let runtime_dir = std::env::temp_dir().join(format!("tandem-xdg-{}", std::process::id()));
    std::fs::create_dir_all(&runtime_dir)?;
    let mut child = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["test", "--workspace", "--no-fail-fast"])
        .args(extra)
        .env("TANDEM_SMOLLM2_DIR", &model)
        .env("TANDEM_REQUIRE_MODEL", "1")
        .env("XDG_RUNTIME_DIR", &runtime_dir)
        .env("WGPU_BACKEND", "vulkan")
        .env("TANDEM_SKIP_LOG", &skip_log)
        .env("TANDEM_REQUIRE_CUDA_TOOLCHAIN", if toolchain { "1" } else { "0" })
        .stdout(Stdio::piped())
        .spawn()
        .context("running cargo test")?;
    let (mut passed, mut failed) = (0u64, 0u64);
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        println!("{line}");
        // "test result: ok. 14 passed; 0 failed; 0 ignored; ..."
        if let Some(rest) = line.strip_prefix("test result: ") {
            let count = |word: &str| rest.split(';').find_map(|p| p.trim().strip_suffix(word)?.trim().rsplit(' ').next()?.parse::<u64>().ok()).unwrap_or(0);
            passed += count(" passed");
            failed += count(" failed");
        }
    }
    let status = child.wait()?;
    let skipped: Vec<String> = std::fs::read_to_string(&skip_log).unwrap_or_default().lines().map(String::from).collect();
    println!("\n{} test(s) skipped themselves:", skipped.len());
    for s in &skipped {
        println!("  {s}");
    }
    println!("cargo test took {:.0} s", t0.elapsed().as_secs_f64());
    if !status.success() {
        bail!("cargo test failed");
    }
    // The op suite once more through the binary, for its per-case log and count in CI's output.
    // A whole-workspace `cargo test` has just built the binary (the cli tests run it), with the
    // workspace's features; `cargo run -p tandem-cli` would resolve features for that package
    // alone and recompile much of the workspace. A filtered run (`extra`) may not have built it.
    let t1 = std::time::Instant::now();
    let target = std::env::var_os("CARGO_TARGET_DIR").map(|d| root.join(d)).unwrap_or_else(|| root.join("target"));
    let built = target.join("debug/tandem");
    let whole = extra.is_empty();
    let mut ops = if whole && built.is_file() {
        Command::new(&built)
    } else {
        let mut c = Command::new(env!("CARGO"));
        c.args(["run", "--quiet", "-p", "tandem-cli", "--bin", "tandem", "--"]);
        c
    };
    let st = ops.current_dir(&root).args(["test-ops", "--backend", "wgpu"]).env("XDG_RUNTIME_DIR", &runtime_dir).status()?;
    if !st.success() {
        bail!("tandem test-ops --backend wgpu failed");
    }
    println!("test-ops --backend wgpu took {:.0} s", t1.elapsed().as_secs_f64());
    let t2 = std::time::Instant::now();
    let examples = target.join("debug/examples");
    openai_client(&root, (whole && examples.join("fake_server").is_file() && examples.join("tiny_server").is_file()).then_some(examples.as_path()))?;
    println!("the openai client check took {:.0} s", t2.elapsed().as_secs_f64());
    let (mut passed, mut failed, mut skipped) = (passed, failed, skipped);
    // The fuzz targets (fuzz/): each finding's input replayed, then a short run of each.
    if whole {
        let t4 = std::time::Instant::now();
        let seconds = std::env::var("TANDEM_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
        let o = crate::fuzz::fuzz(&root, None, seconds, false)?;
        passed += o.passed;
        if let Some(why) = o.skipped {
            skipped.push(format!("the fuzz targets (cargo xtask fuzz): {why}"));
            println!("SKIPPED the fuzz targets: {why}");
        }
        println!("the fuzz targets took {:.0} s", t4.elapsed().as_secs_f64());
    }
    // The CUDA backend on the fake driver (crates/fake-cuda), where NVRTC is installed.
    if toolchain && whole {
        let t3 = std::time::Instant::now();
        let fake = crate::fake_cuda::group(&root, built.is_file().then_some(built.clone()))?;
        passed += fake.passed;
        failed += fake.failed;
        println!("the fake-driver group took {:.0} s", t3.elapsed().as_secs_f64());
    } else {
        let why = if toolchain { "a filtered run" } else { "no CUDA toolchain (bash kernels/install-toolchain.sh)" };
        skipped.push(format!("the fake-driver group (cargo xtask fake-cuda --group): {why}"));
        println!("SKIPPED the fake-driver group: {why}");
    }
    // The one closing line a CI reader looks for.
    println!("tandem: {passed} passed, {failed} failed, {} skipped", skipped.len());
    if failed > 0 {
        bail!("{failed} test(s) failed");
    }
    Ok(())
}

/// The `anthropic` SDK the Messages API check runs (pinned: its event accumulation is what is
/// checked).
const ANTHROPIC_SDK: &str = "anthropic==2.17.0";

/// The official `openai` and `anthropic` Python clients (clients we did not write) against our
/// server: completions, chat, messages, streaming, tools. The packages go into `.venv-openai`
/// (git-ignored).
fn openai_client(root: &std::path::Path, examples: Option<&std::path::Path>) -> Result<()> {
    let venv = root.join(".venv-openai");
    let py = venv.join("bin/python");
    let pinned = format!("import anthropic, openai; assert anthropic.__version__ == {:?}", ANTHROPIC_SDK.trim_start_matches("anthropic=="));
    if !py.exists() || !Command::new(&py).args(["-c", &pinned]).status()?.success() {
        let ok = (py.exists() || Command::new("python3").arg("-m").arg("venv").arg(&venv).status()?.success())
            && Command::new(&py).args(["-m", "pip", "install", "-q", "openai", ANTHROPIC_SDK]).status()?.success();
        if !ok {
            bail!("could not install the openai and anthropic packages into {}", venv.display());
        }
    }
    let mut cmd = Command::new("bash");
    cmd.current_dir(root).arg("crates/server/tests/openai_client.sh").arg(&py);
    if let Some(dir) = examples {
        cmd.env("TANDEM_EXAMPLES_DIR", dir);
    }
    let st = cmd.status()?;
    if !st.success() {
        bail!("the openai / anthropic client check failed");
    }
    Ok(())
}
