//! `cargo xtask fetch-model`: installs the catalog's default model and prints its directory.

use std::path::PathBuf;

use anyhow::Context;

#[derive(clap::Args)]
pub struct Args {
    /// Directory holding catalog.toml and the installed models.
    #[arg(long, default_value_os_t = crate::workspace_root().join("models"))]
    models_dir: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let dir = tandem_model_files::fetch_default(&args.models_dir).context("fetch-model failed")?;
    println!("{}", dir.display());
    Ok(())
}
