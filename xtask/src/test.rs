//! `cargo xtask test`: every test, the way CI runs it.
//!
//! 1. The default model, fetched and converted once (cached), so the SmolLM2 golden tests run.
//! 2. The CUDA kernels' compile check (NVRTC + ptxas from pinned wheels), when the toolchain is
//!    installed (`bash kernels/install-toolchain.sh`; `.ci/run` does it). Required under CI.
//! 3. `cargo test --workspace`, with the environment the wgpu tests need.
//! 4. A count of the tests that skipped themselves (`tandem_core::skip::note` logs them).

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
    let model = tandem_models::fetch::fetch_default(&root.join("models")).context("fetching the default model")?;
    let t0 = std::time::Instant::now();
    let ci = std::env::var_os("CI").is_some();

    let mut own_skips = Vec::new();
    let venv = root.join(".venv-cuda");
    if venv.exists() {
        crate::kernels::check()?;
    } else if ci {
        bail!("CI: the CUDA compile-check toolchain is missing; run `bash kernels/install-toolchain.sh`");
    } else {
        own_skips.push("SKIPPED: CUDA kernel compile check (no .venv-cuda; run `bash kernels/install-toolchain.sh`)".to_string());
    }

    let skip_log = std::env::temp_dir().join(format!("tandem-skips-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&skip_log);
    let runtime_dir = std::env::temp_dir().join(format!("tandem-xdg-{}", std::process::id()));
    std::fs::create_dir_all(&runtime_dir)?;
    let mut child = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["test", "--workspace"])
        .args(extra)
        .env("TANDEM_SMOLLM2_DIR", &model)
        .env("TANDEM_REQUIRE_MODEL", "1")
        .env("XDG_RUNTIME_DIR", &runtime_dir)
        .env("WGPU_BACKEND", "vulkan")
        .env("TANDEM_SKIP_LOG", &skip_log)
        .stdout(Stdio::piped())
        .spawn()
        .context("running cargo test")?;
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        println!("{}", line?);
    }
    let status = child.wait()?;
    let mut skipped = own_skips;
    skipped.extend(std::fs::read_to_string(&skip_log).unwrap_or_default().lines().map(String::from));
    println!("\n{} test(s) skipped themselves:", skipped.len());
    for s in &skipped {
        println!("  {s}");
    }
    println!("cargo test took {:.0} s", t0.elapsed().as_secs_f64());
    if !status.success() {
        bail!("cargo test failed");
    }
    Ok(())
}
