//! NVRTC: one `.cu` (header already pasted in) to PTX text for one virtual architecture, or
//! to a cubin for the device's own architecture (NVRTC runs ptxas itself, so the driver has
//! nothing left to JIT), with an on-disk cache keyed by the source, the architecture, the
//! options, the output kind and the NVRTC version (`~/.cache/tandem/ptx`, or
//! `TANDEM_PTX_CACHE`; `TANDEM_PTX_CACHE=off` disables it).
//!
//! Why cubins: on the H200 (2026-12-04) a fresh machine's first process spent over 120 s
//! loading the kernels' PTX, the driver compiling each module for sm_90; a cubin made once,
//! here or by `cargo xtask gpu-bundle`, loads in milliseconds.

use std::path::PathBuf;

use sha2::{Digest, Sha256};
use tandem_core::{Error, Result};

use crate::sources::KernelSource;
use crate::toolchain::Toolchain;

/// Options every kernel is compiled with. No fast math: the kernels are checked against an
/// exact f32 reference. `--fmad=false`: no multiply and add contracted into an FMA unless the
/// source says so (`fmaf`), as the emulator (g++, no contraction) computes them, so a result
/// the emulator checked bitwise is the GPU's too, up to the mma's own rounding. `-lineinfo`
/// lets Nsight Compute map stalls to source lines.
const OPTIONS: &[&str] = &["-std=c++17", "--fmad=false", "-lineinfo"];
/// A cubin's: no `-lineinfo`, which embeds the whole PTX text (matmul's cubin: 25 MB with it,
/// too much for the GPU bundle). For source-level profiling run with TANDEM_CUDA_CUBIN=0.
const CUBIN_OPTIONS: &[&str] = &["-std=c++17", "--fmad=false"];

/// `"90"`, `"sm_90"`, `"compute_90"` -> `"90"`.
pub fn arch_number(arch: &str) -> Result<String> {
    let n = arch.trim_start_matches("compute_").trim_start_matches("sm_");
    if n.len() >= 2
        && n.chars().all(|c| c.is_ascii_alphanumeric())
        && n.chars().next().is_some_and(|c| c.is_ascii_digit())
    {
        Ok(n.to_string())
    } else {
        Err(Error::backend("cuda", format!("architecture `{arch}` is not like sm_90, compute_80 or 90")))
    }
}

/// NVRTC's version, e.g. (13, 0).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    ensure_nvrtc()?;
    let (mut maj, mut min) = (0, 0);
    // SAFETY: two out-parameters, written by the library.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut maj, &mut min) };
    r.result().map_err(|e| Error::backend("cuda", format!("nvrtcVersion: {e:?}")))?;
    Ok((maj, min))
}

fn ensure_nvrtc() -> Result<()> {
    if Toolchain::nvrtc_loadable() {
        Ok(())
    } else {
        Err(Error::backend("cuda", Toolchain::discover().nvrtc_missing_message()))
    }
}

/// The architecture `src` is compiled for on a device of `arch` (a number, `arch_number`'s):
/// kernels/matmul_sm90.cu and kernels/paged_attention_sm90.cu use wgmma (and TMA), which exist
/// only for the architecture-specific `sm_90a` (NVRTC `--gpu-architecture=sm_90a`), so on an
/// sm_90 device those files take `90a`;
/// elsewhere its body is compiled out (it tests `__CUDA_ARCH_FEAT_SM90_ALL`) and the module is
/// empty. Every other file takes `arch` as it is.
pub fn arch_for(name: &str, arch: &str) -> String {
    if is_sm90_only(name) && arch == "90" {
        "90a".to_string()
    } else {
        arch.to_string()
    }
}

/// Whether kernel file `name` exists only for sm_90a (its body compiled out elsewhere).
pub fn is_sm90_only(name: &str) -> bool {
    name == "matmul_sm90" || name == "paged_attention_sm90"
}

/// NVRTC's options: `base`, the target (`compute_90` or `sm_90`), the include folder.
fn nvrtc_options(base: &[&str], target: String, include_dir: Option<&PathBuf>) -> Vec<String> {
    let mut options: Vec<String> = base.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={target}"));
    if let Some(inc) = include_dir {
        options.push(format!("--include-path={}", inc.display()));
    }
    options
}

/// Compiles `src` to PTX for `compute_<arch>`.
pub fn compile_ptx(src: &KernelSource, arch: &str, include_dir: Option<&PathBuf>) -> Result<String> {
    ensure_nvrtc()?;
    let arch = arch_for(&src.name, &arch_number(arch)?);
    let options = nvrtc_options(OPTIONS, format!("compute_{arch}"), include_dir);
    if src.text.contains('\0') {
        return Err(Error::backend("cuda", format!("{}.cu: contains a NUL byte", src.name)));
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: options.clone(),
        name: Some(format!("{}.cu", src.name)),
        ..Default::default()
    };
    // cudarc unwraps inside its error path; keep any such panic from reaching the caller.
    let res = std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(&src.text, opts))
        .map_err(|_| Error::backend("cuda", format!("{}.cu: NVRTC panicked (see stderr)", src.name)))?;
    match res {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => Err(Error::backend(
            "cuda",
            format!("{}.cu for compute_{arch} does not compile:\n{}", src.name, log.to_string_lossy()),
        )),
        Err(e) => Err(Error::backend("cuda", format!("{}.cu for compute_{arch}: NVRTC failed: {e}", src.name))),
    }
}

/// Compiles `src` to a cubin for `sm_<arch>` (the device's own architecture).
pub fn compile_cubin(src: &KernelSource, arch: &str, include_dir: Option<&PathBuf>) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    ensure_nvrtc()?;
    let arch = arch_for(&src.name, &arch_number(arch)?);
    let options = nvrtc_options(CUBIN_OPTIONS, format!("sm_{arch}"), include_dir);
    let fail = |what: &str, e: &dyn std::fmt::Debug| {
        Error::backend("cuda", format!("{}.cu for sm_{arch}: {what}: {e:?}", src.name))
    };
    let text = std::ffi::CString::new(src.text.as_str())
        .map_err(|_| Error::backend("cuda", format!("{}.cu: contains a NUL byte", src.name)))?;
    let name = std::ffi::CString::new(format!("{}.cu", src.name))
        .map_err(|_| Error::backend("cuda", format!("{}: a NUL byte in the name", src.name)))?;
    let prog = result::create_program(&text, Some(&name)).map_err(|e| fail("nvrtcCreateProgram", &e))?;
    /// Destroys the program on every path out.
    struct Program(sys::nvrtcProgram);
    impl Drop for Program {
        fn drop(&mut self) {
            // SAFETY: created above, destroyed once.
            let _ = unsafe { result::destroy_program(self.0) };
        }
    }
    let prog = Program(prog);
    // SAFETY: a live program; options are plain strings.
    if let Err(e) = unsafe { result::compile_program(prog.0, &options) } {
        // SAFETY: a live program.
        let log = unsafe { result::get_program_log(prog.0) }
            .map(|l| l.iter().map(|&c| c as u8 as char).collect::<String>())
            .unwrap_or_default();
        return Err(Error::backend(
            "cuda",
            format!("{}.cu for sm_{arch} does not compile ({e:?}):\n{}", src.name, log.trim_end_matches('\0')),
        ));
    }
    let mut size = 0usize;
    // SAFETY: out-parameter written by the library.
    unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) }.result().map_err(|e| fail("nvrtcGetCUBINSize", &e))?;
    let mut cubin = vec![0u8; size];
    // SAFETY: the buffer holds the `size` bytes the library reported.
    unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) }.result().map_err(|e| fail("nvrtcGetCUBIN", &e))?;
    if cubin.len() < 4 || cubin[..4] != *b"\x7fELF" {
        return Err(Error::backend(
            "cuda",
            format!("{}.cu for sm_{arch}: NVRTC returned no cubin ({} bytes)", src.name, cubin.len()),
        ));
    }
    Ok(cubin)
}

/// Like [`compile_ptx`], but returns the cached PTX when source, arch, options and NVRTC
/// version are unchanged. A cache that cannot be read or written is skipped with a warning.
pub fn compile_ptx_cached(src: &KernelSource, arch: &str, include_dir: Option<&PathBuf>) -> Result<String> {
    let bytes = cached(
        src,
        arch,
        "ptx",
        |b| String::from_utf8_lossy(b).contains(".entry"),
        || compile_ptx(src, arch, include_dir).map(String::into_bytes),
    )?;
    String::from_utf8(bytes).map_err(|_| Error::backend("cuda", format!("{}.cu: cached PTX is not text", src.name)))
}

/// Like [`compile_cubin`], cached as [`compile_ptx_cached`] is (its own key: `cubin`).
pub fn compile_cubin_cached(src: &KernelSource, arch: &str, include_dir: Option<&PathBuf>) -> Result<Vec<u8>> {
    cached(src, arch, "cubin", |b| b.starts_with(b"\x7fELF"), || compile_cubin(src, arch, include_dir))
}

/// The file `<name>-<arch>-<hash>.<ext>` of the cache: read when `valid`, else made and written.
fn cached(
    src: &KernelSource,
    arch: &str,
    ext: &str,
    valid: impl Fn(&[u8]) -> bool,
    make: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<Vec<u8>> {
    let Some(dir) = cache_dir() else { return make() };
    let (maj, min) = nvrtc_version()?;
    let mut h = Sha256::new();
    // The PTX key is as it always was (no kind in it), so caches made before cubins stay valid.
    let kind = if ext == "ptx" { String::new() } else { format!("kind {ext}") };
    let options = if ext == "ptx" { OPTIONS } else { CUBIN_OPTIONS };
    for part in
        [src.text.as_str(), arch_number(arch)?.as_str(), &options.join(" "), &format!("nvrtc {maj}.{min}"), &kind]
    {
        if part.is_empty() {
            continue;
        }
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    let hash: String = h.finalize().iter().take(12).map(|b| format!("{b:02x}")).collect();
    let path = dir.join(format!("{}-{}-{hash}.{ext}", src.name, arch_number(arch)?));
    if let Ok(bytes) = std::fs::read(&path) {
        if valid(&bytes) {
            return Ok(bytes);
        }
    }
    let bytes = make()?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = std::fs::create_dir_all(&dir)
        .and_then(|_| std::fs::write(&tmp, &bytes))
        .and_then(|_| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        tracing::warn!("kernel cache {}: {e}", dir.display());
    }
    Ok(bytes)
}

fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("TANDEM_PTX_CACHE") {
        Some(v) if v == "off" => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(base.join("tandem/ptx"))
        }
    }
}

/// Names of the `.entry` functions in PTX text.
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l.strip_prefix(".visible .entry ").or_else(|| l.strip_prefix(".entry "))?;
            Some(rest.split(['(', ' ']).next()?.to_string())
        })
        .filter(|n| !n.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_numbers() {
        assert_eq!(arch_number("sm_90").unwrap(), "90");
        assert_eq!(arch_number("compute_80").unwrap(), "80");
        assert_eq!(arch_number("90a").unwrap(), "90a");
        assert!(arch_number("sm_").is_err());
        assert!(arch_number("x9").is_err());
        assert_eq!(arch_for("matmul_sm90", "90"), "90a");
        assert_eq!(arch_for("matmul_sm90", "80"), "80");
        assert_eq!(arch_for("paged_attention_sm90", "90"), "90a");
        assert_eq!(arch_for("paged_attention_sm90", "80"), "80");
        assert_eq!(arch_for("paged_attention", "90"), "90");
        assert_eq!(arch_for("matmul", "90"), "90");
    }

    #[test]
    fn entries_from_ptx() {
        let ptx = ".version 9.0\n.visible .entry add(\n\t.param .u64 add_param_0\n)\n.visible .entry rope(\n";
        assert_eq!(ptx_entries(ptx), vec!["add", "rope"]);
    }
}
