//! Where the CUDA compile tools are: libnvrtc (loaded by cudarc through the loader path),
//! the CUDA include folder (optional: our kernels include no CUDA header) and `ptxas`.
//!
//! Looked up in this order: the variables `TANDEM_CUDA_LIB`, `TANDEM_CUDA_INCLUDE`,
//! `TANDEM_PTXAS` (what `kernels/install-toolchain.sh` prints); the pip wheels in a venv
//! (`TANDEM_CUDA_VENV`, else `.venv-cuda` in the current directory or a parent, else at the
//! root of the checkout this crate was built from); a CUDA toolkit (`CUDA_HOME`,
//! `/usr/local/cuda`); `ptxas` on `PATH`.

use std::path::{Path, PathBuf};

/// The found pieces; `None` where nothing was found.
#[derive(Debug, Clone, Default)]
pub struct Toolchain {
    /// Folder holding `libnvrtc.so.13` (must be on `LD_LIBRARY_PATH` before the process starts).
    pub lib_dir: Option<PathBuf>,
    pub include_dir: Option<PathBuf>,
    pub ptxas: Option<PathBuf>,
}

const NVRTC_SONAME: &str = "libnvrtc.so.13";

impl Toolchain {
    pub fn discover() -> Toolchain {
        let env_path = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let mut t = Toolchain {
            lib_dir: env_path("TANDEM_CUDA_LIB"),
            include_dir: env_path("TANDEM_CUDA_INCLUDE"),
            ptxas: env_path("TANDEM_PTXAS"),
        };
        for root in venv_candidates() {
            if let Some(cu) = wheel_root(&root) {
                fill(&mut t, cu.join("lib"), cu.join("include"), cu.join("bin/ptxas"));
            }
        }
        let mut toolkits: Vec<PathBuf> = env_path("CUDA_HOME").into_iter().collect();
        toolkits.push(PathBuf::from("/usr/local/cuda"));
        for tk in toolkits {
            fill(&mut t, tk.join("lib64"), tk.join("include"), tk.join("bin/ptxas"));
        }
        if t.ptxas.is_none() {
            t.ptxas = std::env::var_os("PATH")
                .and_then(|p| std::env::split_paths(&p).map(|d| d.join("ptxas")).find(|p| p.is_file()));
        }
        t
    }

    /// Is libnvrtc loadable by name right now (that is, through the loader path)?
    pub fn nvrtc_loadable() -> bool {
        // SAFETY: only tries to dlopen the library and drops it again.
        unsafe { cudarc::nvrtc::sys::is_culib_present() }
    }

    /// Is `lib_dir` already on this process's `LD_LIBRARY_PATH`?
    pub fn lib_dir_on_loader_path(&self) -> bool {
        let Some(lib) = &self.lib_dir else { return false };
        std::env::var_os("LD_LIBRARY_PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| &d == lib))
    }

    /// A message naming what is missing and how to get it.
    pub fn nvrtc_missing_message(&self) -> String {
        match &self.lib_dir {
            Some(lib) => format!(
                "{NVRTC_SONAME} is not on the loader path; start the process with LD_LIBRARY_PATH={} (a process cannot change its own loader path)",
                lib.display()
            ),
            None => format!(
                "{NVRTC_SONAME} not found: run `eval $(kernels/install-toolchain.sh)` (pip wheels nvidia-cuda-nvrtc==13.0.88 etc. into .venv-cuda), or set TANDEM_CUDA_LIB / LD_LIBRARY_PATH to a folder holding it"
            ),
        }
    }
}

fn fill(t: &mut Toolchain, lib: PathBuf, include: PathBuf, ptxas: PathBuf) {
    if t.lib_dir.is_none() && lib.join(NVRTC_SONAME).exists() {
        t.lib_dir = Some(lib);
    }
    if t.include_dir.is_none() && include.join("cuda_bf16.h").exists() {
        t.include_dir = Some(include);
    }
    if t.ptxas.is_none() && ptxas.is_file() {
        t.ptxas = Some(ptxas);
    }
}

fn venv_candidates() -> Vec<PathBuf> {
    let mut out = vec![];
    if let Some(v) = std::env::var_os("TANDEM_CUDA_VENV").filter(|v| !v.is_empty()) {
        out.push(PathBuf::from(v));
    }
    if let Ok(mut dir) = std::env::current_dir() {
        loop {
            out.push(dir.join(".venv-cuda"));
            if !dir.pop() {
                break;
            }
        }
    }
    out.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-cuda"));
    out.retain(|p| p.is_dir());
    out
}

/// `<venv>/lib/python3.*/site-packages/nvidia/cu13`, if present.
fn wheel_root(venv: &Path) -> Option<PathBuf> {
    let lib = std::fs::read_dir(venv.join("lib")).ok()?;
    let mut pys: Vec<PathBuf> = lib
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("python3")))
        .collect();
    pys.sort();
    pys.into_iter().map(|p| p.join("site-packages/nvidia/cu13")).find(|p| p.is_dir())
}
