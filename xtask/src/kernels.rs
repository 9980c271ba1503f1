//! `cargo xtask kernels --check`: compiles every `kernels/*.cu` with NVRTC to PTX for sm_80 and
//! sm_90 and assembles it with ptxas, printing registers, shared memory and spills per kernel.
//! Needs no GPU: NVRTC and ptxas come from pinned Python wheels (`kernels/install-toolchain.sh`,
//! run here when the venv is missing). `--predict`: the CPU performance model
//! (kernels_predict.rs), calibrated against the committed H200 timings.

use std::process::Command;

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Compile and assemble every kernel.
    #[arg(long)]
    check: bool,
    /// The performance model: calibration against the committed H200 timings, predictions
    /// for the untimed variants (no GPU, no network).
    #[arg(long)]
    predict: bool,
    /// With --predict: write the predictions to docs/gpu/predictions.{md,tsv}.
    #[arg(long, requires = "predict")]
    write: bool,
    /// Only kernels whose file name contains this.
    #[arg(long)]
    only: Option<String>,
}

pub fn run(a: Args) -> Result<()> {
    if a.predict {
        crate::kernels_predict::run(a.write)?;
        if !a.check {
            return Ok(());
        }
    }
    if !a.check {
        bail!("nothing to do: pass --check or --predict");
    }
    check_only(a.only.as_deref())
}

fn check_only(only: Option<&str>) -> Result<()> {
    let root = crate::workspace_root();
    if !root.join(".venv-cuda/bin/python").exists() {
        let st = Command::new("bash").arg(root.join("kernels/install-toolchain.sh")).status()?;
        if !st.success() {
            bail!("kernels/install-toolchain.sh failed");
        }
    }
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(&root).args([
        "run",
        "--quiet",
        "-p",
        "tandem-cuda",
        "--bin",
        "tandem-kernels-check",
        "--",
        "--no-spills",
    ]);
    if let Some(o) = only {
        cmd.args(["--only", o]);
    }
    if !cmd.status()?.success() {
        bail!("kernel check failed");
    }
    Ok(())
}
