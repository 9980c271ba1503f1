//! `cargo xtask bench <kind> [args...]`: runs `tandem bench <kind> ...` from a release build
//! (`cargo run --release -p tandem-cli`), from the repository root so relative paths such as
//! `bench/hf_baseline.py` and `docs/` resolve. Kinds: throughput, serve, compare, sweep, load,
//! decode; `cargo xtask bench <kind> --help` lists each one's flags.

use std::process::Command;

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {
    /// The benchmark and its flags, passed on unchanged (see `tandem bench --help`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    args: Vec<String>,
}

pub fn run(a: Args) -> Result<()> {
    let root = crate::workspace_root();
    let st = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["run", "--release", "--quiet", "-p", "tandem-cli", "--bin", "tandem", "--", "bench"])
        .args(&a.args)
        .status()?;
    if !st.success() {
        bail!("tandem bench exited with {st}");
    }
    Ok(())
}
