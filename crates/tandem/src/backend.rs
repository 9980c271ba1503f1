//! Backend choice and model loading: the one wiring from a model directory and a backend name
//! to a loaded [`ModelRunner`]. The CLI (`tandem generate`, `serve`, `bench`, `compare`) loads
//! through here too.
//!
//! [`Backend::Auto`] takes CUDA where a CUDA driver is found, else wgpu where an adapter is
//! found, else the reference backend, with a warning saying how slow that is and how to get a
//! faster one. Probing never panics: the CUDA backend checks for the driver library before it
//! touches the driver API.
//!
//! A GGUF file stands for a model directory ([`model_dir`]): its metadata files are written once
//! into a cache directory beside a link to the file, and its weights load from the file kept in
//! their stored layouts (`tandem_core::quant_layout`), on a backend that runs them.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use tandem_core::backend::Backend as Compute;
use tandem_core::lora::LoraAdapter;
use tandem_core::model::{LoadOptions, ModelRunner};
use tandem_core::{Model, ModelConfig};
use tandem_model_files::convert::{gguf_model_dir, gguf_weights, is_gguf, GGUF_WEIGHTS};

use crate::error::{Error, Result};
use crate::lora_modules::LoraModules;

/// Which backend runs the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// CUDA if a driver is found, else wgpu if an adapter is found, else reference.
    #[default]
    Auto,
    /// Plain f32 Rust on the CPU: the oracle, written for clarity, not speed.
    Reference,
    /// Vulkan (or Metal, DX12) through wgpu; on a machine without a GPU, Mesa's lavapipe.
    Wgpu,
    /// NVIDIA GPUs; kernels compiled with NVRTC at start-up.
    Cuda,
}

impl Backend {
    pub const ALL: [Backend; 4] = [Backend::Auto, Backend::Reference, Backend::Wgpu, Backend::Cuda];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Reference => "reference",
            Backend::Wgpu => "wgpu",
            Backend::Cuda => "cuda",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = Error;
    fn from_str(s: &str) -> Result<Backend> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| Error::Config(format!("unknown backend {s:?}: expected auto, reference, wgpu or cuda")))
    }
}

/// A model loaded on a backend.
pub struct LoadedModel {
    pub runner: Box<dyn ModelRunner>,
    /// The backend that runs it (never [`Backend::Auto`]).
    pub backend: Backend,
    /// The device, for logs and reports: the GPU's or adapter's name, or "CPU".
    pub device: String,
}

impl fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedModel")
            .field("backend", &self.backend)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

/// What [`Backend::Auto`] says when it settles on the reference backend.
pub const REFERENCE_FALLBACK_WARNING: &str = "backend auto: no CUDA driver and no wgpu adapter found, so the model runs on the reference backend \
(plain f32 Rust on the CPU, written to be checked against, not for speed: expect tens of times fewer tokens per second than on a GPU). \
For a faster one, install a GPU driver (NVIDIA's for cuda, a Vulkan driver for wgpu), or on a machine without a GPU Mesa's software \
Vulkan driver (Debian: apt-get install mesa-vulkan-drivers libvulkan1), then use --backend wgpu or auto";

// Lives only until the model is loaded onto it: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Opened {
    Reference(tandem_reference::RefBackend),
    Wgpu(tandem_wgpu::WgpuBackend),
    Cuda(tandem_cuda::CudaBackend),
}

fn open(backend: Backend) -> Result<Opened> {
    Ok(match backend {
        Backend::Reference => Opened::Reference(tandem_reference::RefBackend::new()),
        Backend::Wgpu => Opened::Wgpu(tandem_wgpu::WgpuBackend::new()?),
        Backend::Cuda => Opened::Cuda(tandem_cuda::CudaBackend::new(0)?),
        Backend::Auto => open_auto(),
    })
}

fn open_auto() -> Opened {
    match tandem_cuda::CudaBackend::new(0) {
        Ok(b) => return Opened::Cuda(b),
        // No driver is the ordinary case on a machine without an NVIDIA GPU; a driver that
        // fails is worth a warning.
        Err(e) if e.to_string().contains(tandem_cuda::NO_DRIVER) => tracing::debug!("backend auto: {e}"),
        Err(e) => tracing::warn!(
            "backend auto: a CUDA driver is present but the CUDA backend did not start ({e}); trying wgpu"
        ),
    }
    match tandem_wgpu::WgpuBackend::new() {
        Ok(b) => return Opened::Wgpu(b),
        Err(e) => tracing::info!("backend auto: no wgpu adapter ({e})"),
    }
    tracing::warn!("{REFERENCE_FALLBACK_WARNING}");
    Opened::Reference(tandem_reference::RefBackend::new())
}

/// The step token budget on a GPU (CUDA, or wgpu on a GPU adapter) when none is given. vLLM
/// picks 8192 for online serving on GPUs of 70 GiB and more (2048 below); 2048 is the largest
/// step the H200 check has measured here, so it holds until a larger one is.
pub const GPU_BATCH_TOKENS: usize = 2048;
/// The step token budget on a CPU (the reference backend, or wgpu on a CPU adapter such as
/// Mesa's lavapipe) when none is given: the default model prefills at about 60-80 tokens a
/// second on lavapipe on this project's 2-core CI machine (docs/bench-cpu.md), so a 32-token
/// step takes about half a second, and a request arriving during a long prompt's prefill gets
/// its first token within about two steps (the scheduler's half-budget rule) instead of
/// seconds. Decodes beyond the budget wait for the next step.
pub const CPU_BATCH_TOKENS: usize = 32;

/// The budget `load_model` gives a step when `LoadOptions::max_batch_tokens` is 0, and why.
fn default_batch_tokens(b: &Opened) -> (usize, &'static str) {
    match b {
        Opened::Cuda(_) => (GPU_BATCH_TOKENS, "a GPU"),
        Opened::Wgpu(w) if w.adapter().is_cpu() => (CPU_BATCH_TOKENS, "a CPU adapter"),
        Opened::Wgpu(_) => (GPU_BATCH_TOKENS, "a GPU adapter"),
        Opened::Reference(_) => (CPU_BATCH_TOKENS, "the CPU"),
    }
}

/// Loads the model in `dir` (config.json, safetensors, tokenizer) on `backend`.
/// `opts.max_batch_tokens` 0 takes the backend's default step budget ([`GPU_BATCH_TOKENS`],
/// [`CPU_BATCH_TOKENS`]), logged.
/// The model directory `path` stands for: `path` itself, or for a GGUF file the directory of
/// its metadata (made once under `$TANDEM_CACHE/gguf`, else `~/.cache/tandem/gguf`).
pub fn model_dir(path: &Path) -> Result<PathBuf> {
    if !is_gguf(path) {
        return Ok(path.to_path_buf());
    }
    let cache = tandem_model_files::fetch::cache_dir().join("gguf");
    let dir = gguf_model_dir(path, &cache).map_err(|e| Error::Config(e.to_string()))?;
    tracing::info!("serving {} kept quantized; its metadata is in {}", path.display(), dir.display());
    Ok(dir)
}

/// Whether the model directory `dir` serves a GGUF file ([`model_dir`] made it).
pub fn is_gguf_dir(dir: &Path) -> bool {
    dir.join(GGUF_WEIGHTS).exists()
}

pub fn load_model(backend: Backend, dir: &Path, opts: LoadOptions) -> Result<LoadedModel> {
    load_model_with_lora(backend, dir, opts, None)
}

/// As [`load_model`], with LoRA slots and the first `--max-loras` adapters of `lora` in them
/// (adapter `i` in slot `i`) where given; an adapter that does not fit fails the load, naming
/// the adapter. Those beyond the slots are the engine's to swap in (`EngineConfig::lora_modules`).
pub fn load_model_with_lora(
    backend: Backend,
    dir: &Path,
    mut opts: LoadOptions,
    lora: Option<&LoraModules>,
) -> Result<LoadedModel> {
    if let Some(l) = lora {
        l.validate()?;
    }
    let dir = &model_dir(dir)?;
    if !dir.join("config.json").exists() {
        return Err(Error::Config(format!("{}: not a model directory (no config.json)", dir.display())));
    }
    let opened = open(backend)?;
    if opts.max_batch_tokens == 0 {
        let (n, on) = default_batch_tokens(&opened);
        tracing::info!("max_num_batched_tokens = {n}, the default on {on} (--max-num-batched-tokens sets it)");
        opts.max_batch_tokens = n;
    }
    Ok(match opened {
        Opened::Reference(b) => {
            LoadedModel { runner: load_on(b, dir, opts, lora)?, backend: Backend::Reference, device: "CPU".into() }
        }
        Opened::Wgpu(b) => {
            let device = b.adapter().to_string();
            LoadedModel { runner: load_on(b, dir, opts, lora)?, backend: Backend::Wgpu, device }
        }
        Opened::Cuda(b) => {
            let device = format!("{} (sm_{})", b.device_name(), b.arch());
            LoadedModel { runner: load_on(b, dir, opts, lora)?, backend: Backend::Cuda, device }
        }
    })
}

/// `dir`'s model on `b`: its safetensors, or the GGUF file it links to, kept quantized; with
/// LoRA slots and the adapters of `lora` in them where given.
fn load_on<B: Compute>(
    b: B,
    dir: &Path,
    opts: LoadOptions,
    lora: Option<&LoraModules>,
) -> Result<Box<dyn ModelRunner>> {
    let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
    let weights = match is_gguf_dir(dir) {
        true => gguf_weights(&dir.join(GGUF_WEIGHTS))?,
        false => tandem_core::weights::Weights::open(dir)?,
    };
    let Some(l) = lora else { return Ok(Box::new(Model::from_weights(b, cfg, &weights, opts)?)) };
    let mut m = Model::from_weights_lora(b, cfg.clone(), &weights, opts, Some(l.limits))?;
    for (slot, module) in l.modules.iter().enumerate().take(l.limits.max_loras) {
        let named = |e| Error::Config(format!("LoRA module {:?}: {e}", module.name));
        let adapter = LoraAdapter::load(&module.path, &cfg).map_err(named)?;
        m.load_lora(slot, &adapter).map_err(named)?;
    }
    Ok(Box::new(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_an_error() {
        for b in Backend::ALL {
            assert_eq!(b.name().parse::<Backend>().unwrap(), b);
        }
        let e = "tpu".parse::<Backend>().unwrap_err();
        assert!(e.to_string().contains("unknown backend \"tpu\""), "{e}");
    }

    fn module(name: &str, path: std::path::PathBuf) -> crate::lora_modules::LoraModule {
        crate::lora_modules::LoraModule { name: name.into(), path, base_model_name: None }
    }

    #[test]
    fn lora_modules_load_into_their_slots_and_a_bad_one_is_named() {
        let dir = std::env::temp_dir().join(format!("tandem-lib-lora-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        tandem_model_files::random_model::write_random_model(
            &dir,
            tandem_model_files::random_model::Shape::Tiny,
            3,
            tandem_core::DType::F32,
        )
        .unwrap();
        let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/lora");
        let opts = LoadOptions { max_batch_tokens: 16, max_seqs: 2, num_kv_blocks: 4, ..Default::default() };
        let limits = tandem_core::lora::LoraLimits { max_loras: 2, max_rank: 8 };
        let lora = LoraModules { modules: vec![module("rs", golden.join("tiny-rs"))], ..LoraModules::new(limits) };
        let m = load_model_with_lora(Backend::Reference, &dir, opts, Some(&lora)).unwrap();
        assert_eq!(m.runner.lora_slots(), vec![true, false]);
        let small = tandem_core::lora::LoraLimits { max_loras: 2, max_rank: 4 };
        let lora = LoraModules { modules: vec![module("all", golden.join("tiny-all"))], ..LoraModules::new(small) };
        let e = load_model_with_lora(Backend::Reference, &dir, opts, Some(&lora)).err().unwrap().to_string();
        assert!(e.contains("LoRA module \"all\"") && e.contains("--max-lora-rank"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn missing_model_dir_is_an_error() {
        let e = load_model(Backend::Reference, Path::new("/nonexistent/model"), LoadOptions::default()).unwrap_err();
        assert!(e.to_string().contains("not a model directory"), "{e}");
    }
}
