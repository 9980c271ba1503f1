//! `cargo xtask serve [MODEL_DIR] [--backend auto|cuda|wgpu|reference] [--host H --port P] ...`:
//! fetches the default model when none is given and none is there, then runs `tandem serve`
//! (release build) with the same arguments.

use std::process::Command;

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Everything `tandem serve` takes (see `tandem serve --help`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

pub fn run(a: Args) -> Result<()> {
    let root = crate::workspace_root();
    let mut args = a.args;
    // A model given as `--model DIR`, or positionally first as `vllm serve MODEL` takes it.
    let positional = args.first().is_some_and(|a| !a.starts_with('-'));
    if !positional && !args.iter().any(|x| x == "--model" || x.starts_with("--model=")) {
        let dir = tandem_model_files::fetch::fetch_default(&root.join("models"))?;
        args.extend(["--model".to_string(), dir.display().to_string()]);
    }
    let st = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["run", "--release", "--quiet", "-p", "tandem-cli", "--bin", "tandem", "--", "serve"])
        .args(&args)
        .status()?;
    if !st.success() {
        bail!("tandem serve exited with {st}");
    }
    Ok(())
}
