//! Backend choice: turns `--backend NAME` and a model directory into a loaded model.

use std::path::Path;

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use tandem_core::model::{LoadOptions, ModelRunner};
use tandem_core::LlamaModel;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    Reference,
    Wgpu,
    Cuda,
}

pub fn load(kind: BackendKind, dir: &Path, opts: LoadOptions) -> Result<Box<dyn ModelRunner>> {
    if !dir.join("config.json").exists() {
        bail!("{}: not a model directory (no config.json)", dir.display());
    }
    let runner: Box<dyn ModelRunner> = match kind {
        BackendKind::Reference => Box::new(LlamaModel::load(tandem_reference::RefBackend::new(), dir, opts)?),
        BackendKind::Wgpu => Box::new(LlamaModel::load(tandem_wgpu::WgpuBackend::new()?, dir, opts)?),
        BackendKind::Cuda => Box::new(LlamaModel::load(tandem_cuda::CudaBackend::new(0)?, dir, opts)?),
    };
    Ok(runner)
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Reference => "reference",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cuda => "cuda",
        }
    }
}

/// The model directory: the one given, else the default model (fetched when absent).
pub fn resolve_model(model: Option<&Path>) -> Result<std::path::PathBuf> {
    match model {
        Some(p) => Ok(p.to_path_buf()),
        None => tandem_models::fetch::fetch_default(&crate::models_dir()).context("fetching the default model"),
    }
}
