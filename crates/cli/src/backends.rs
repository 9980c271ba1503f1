//! `--backend NAME` for the CLI. Loading itself is the library's (`tandem::load_model`), so the
//! server, `generate`, `bench` and `compare` share one wiring with embedders.

use std::path::Path;

use anyhow::{Context, Result};
use clap::ValueEnum;
use tandem_core::model::{LoadOptions, ModelRunner};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// cuda where a CUDA driver is found, else wgpu where an adapter is found, else reference
    /// (with a warning).
    Auto,
    Reference,
    Wgpu,
    Cuda,
}

impl From<BackendKind> for tandem::Backend {
    fn from(k: BackendKind) -> tandem::Backend {
        match k {
            BackendKind::Auto => tandem::Backend::Auto,
            BackendKind::Reference => tandem::Backend::Reference,
            BackendKind::Wgpu => tandem::Backend::Wgpu,
            BackendKind::Cuda => tandem::Backend::Cuda,
        }
    }
}

pub fn load(kind: BackendKind, dir: &Path, opts: LoadOptions) -> Result<Box<dyn ModelRunner>> {
    Ok(load_model(kind, dir, opts)?.runner)
}

/// As [`load`], with LoRA slots and `lora`'s adapters in them where given; an adapter that
/// does not fit is an error naming it, its file and what does not fit.
pub fn load_with_lora(
    kind: BackendKind,
    dir: &Path,
    opts: LoadOptions,
    lora: Option<&tandem::LoraModules>,
) -> Result<Box<dyn ModelRunner>> {
    Ok(tandem::load_model_with_lora(kind.into(), dir, opts, lora)?.runner)
}

/// As [`load`], keeping which backend ran (what `auto` chose) and the device's name.
pub fn load_model(kind: BackendKind, dir: &Path, opts: LoadOptions) -> Result<tandem::LoadedModel> {
    let m = tandem::load_model(kind.into(), dir, opts)?;
    tracing::debug!(backend = m.backend.name(), device = %m.device, "backend opened");
    Ok(m)
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        tandem::Backend::from(self).name()
    }
}

/// The model directory: the one given (for a GGUF file, the directory of its metadata beside a
/// link to it: `tandem::model_dir`), else the default model (fetched when absent).
pub fn resolve_model(model: Option<&Path>) -> Result<std::path::PathBuf> {
    match model {
        Some(p) => Ok(tandem::model_dir(p)?),
        None => tandem_model_files::fetch::fetch_default(&crate::models_dir()).context("fetching the default model"),
    }
}
