//! The compile check that needs no GPU: every `kernels/*.cu` through NVRTC to PTX for each
//! architecture, then `ptxas -arch=sm_XX -v` to assemble it and report registers, shared
//! memory, stack and spills per kernel. CI runs it (`cargo xtask kernels --check`); a
//! researcher runs it after editing a kernel.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use tandem_core::{Error, Result};

use crate::compile::{arch_number, compile_ptx};
use crate::sources::{self, KernelSource};
use crate::toolchain::Toolchain;

/// What ptxas says about one kernel for one architecture.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelReport {
    pub file: String,
    pub kernel: String,
    /// `sm_90`
    pub arch: String,
    /// `mma.sync` instructions in the kernel's PTX (tensor-core work; 0 for SIMT kernels).
    pub mma: u32,
    pub registers: u32,
    pub shared_bytes: u32,
    pub stack_bytes: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
}

/// Compiles and assembles every kernel of `kernels_dir` for each of `archs` (`"sm_80"`,
/// `"90"`, ...). `only` keeps the files whose stem contains it. Fails on the first file that
/// does not compile or assemble, with the compiler's message.
pub fn check_kernels(kernels_dir: &Path, archs: &[&str]) -> Result<Vec<KernelReport>> {
    check_kernels_filtered(kernels_dir, archs, None)
}

pub fn check_kernels_filtered(kernels_dir: &Path, archs: &[&str], only: Option<&str>) -> Result<Vec<KernelReport>> {
    let tc = Toolchain::discover();
    if !Toolchain::nvrtc_loadable() {
        return Err(Error::backend("cuda", tc.nvrtc_missing_message()));
    }
    let ptxas = tc.ptxas.clone().ok_or_else(|| {
        Error::backend(
            "cuda",
            "ptxas not found: run kernels/install-toolchain.sh (wheel nvidia-cuda-nvcc==13.0.88) or set TANDEM_PTXAS",
        )
    })?;
    let mut srcs = sources::from_dir(kernels_dir)?;
    if let Some(f) = only {
        srcs.retain(|s| s.name.contains(f));
        if srcs.is_empty() {
            return Err(Error::backend("cuda", format!("no kernel file in {} matches `{f}`", kernels_dir.display())));
        }
    }
    let work = scratch_dir()?;
    let mut out = vec![];
    for src in &srcs {
        for arch in archs {
            let n = arch_number(arch)?;
            // kernels/matmul_sm90.cu and paged_attention_sm90.cu exist only for sm_90a (compile.rs
            // `arch_for`): their modules are empty elsewhere, so only sm_90 checks them (ptxas
            // then assembles for sm_90a).
            let target = crate::compile::arch_for(&src.name, &n);
            if crate::compile::is_sm90_only(&src.name) && target == n {
                continue;
            }
            let ptx = compile_ptx(src, &n, tc.include_dir.as_ref())?;
            out.extend(assemble(&ptxas, &work, src, &target, &ptx)?);
        }
    }
    // TANDEM_KERNELS_CHECK_KEEP=1 keeps the PTX and cubins (for nvdisasm, instruction counts).
    if std::env::var_os("TANDEM_KERNELS_CHECK_KEEP").is_some() {
        eprintln!("PTX and cubins kept in {}", work.display());
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    Ok(out)
}

fn scratch_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("tandem-kernels-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    Ok(dir)
}

fn assemble(ptxas: &Path, work: &Path, src: &KernelSource, arch: &str, ptx: &str) -> Result<Vec<KernelReport>> {
    let ptx_path = work.join(format!("{}-{arch}.ptx", src.name));
    std::fs::write(&ptx_path, ptx).map_err(|e| Error::io(&ptx_path, e))?;
    let cubin = work.join(format!("{}-{arch}.cubin", src.name));
    let res = Command::new(ptxas)
        .arg(format!("-arch=sm_{arch}"))
        .arg("-v")
        .arg(&ptx_path)
        .arg("-o")
        .arg(&cubin)
        .output()
        .map_err(|e| Error::io(ptxas, e))?;
    let text = format!("{}{}", String::from_utf8_lossy(&res.stdout), String::from_utf8_lossy(&res.stderr));
    if !res.status.success() {
        return Err(Error::backend("cuda", format!("ptxas -arch=sm_{arch} rejected {}.cu:\n{text}", src.name)));
    }
    let file = format!("{}.cu", src.name);
    let mut reports = parse_ptxas(&text, &file, &format!("sm_{arch}"));
    let mma = count_mma(ptx);
    for r in &mut reports {
        r.mma = mma.iter().find(|(k, _)| *k == r.kernel).map_or(0, |(_, n)| *n);
    }
    if reports.is_empty() {
        return Err(Error::backend("cuda", format!("ptxas -v printed no kernel for {file} (sm_{arch}):\n{text}")));
    }
    Ok(reports)
}

/// Reads the `-v` report of ptxas: "Compiling entry function 'x' for 'sm_90'", then
/// "N bytes stack frame, N bytes spill stores, N bytes spill loads" and
/// "Used N registers, ..., N bytes smem, ...". Non-entry functions are ignored.
pub fn parse_ptxas(text: &str, file: &str, arch: &str) -> Vec<KernelReport> {
    let mut out: Vec<KernelReport> = vec![];
    let mut props_for: Option<String> = None;
    let num_before = |line: &str, unit: &str| -> Option<u32> {
        let i = line.find(unit)?;
        line[..i].trim_end().rsplit([' ', ',', ':']).next()?.parse().ok()
    };
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            out.push(KernelReport { file: file.into(), kernel: name, arch: arch.into(), ..Default::default() });
        } else if let Some(rest) = line.split("Function properties for ").nth(1) {
            props_for = Some(rest.trim().to_string());
        } else if line.contains("bytes stack frame") {
            if let Some(r) = out.iter_mut().rev().find(|r| Some(&r.kernel) == props_for.as_ref()) {
                r.stack_bytes = num_before(line, "bytes stack frame").unwrap_or(0);
                r.spill_stores = num_before(line, "bytes spill stores").unwrap_or(0);
                r.spill_loads = num_before(line, "bytes spill loads").unwrap_or(0);
            }
        } else if line.contains("Used ") && line.contains("registers") {
            if let Some(r) = out.last_mut() {
                r.registers = line
                    .split("Used ")
                    .nth(1)
                    .and_then(|s| s.split(' ').next())
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                r.shared_bytes = num_before(line, "bytes smem").unwrap_or(0);
            }
        }
    }
    out
}

/// `mma.sync` lines per `.entry` of a PTX text (the body of an entry runs to the next one;
/// the kernels inline their device functions, so nothing hides in a `.func`).
pub fn count_mma(ptx: &str) -> Vec<(String, u32)> {
    let mut out: Vec<(String, u32)> = vec![];
    for line in ptx.lines() {
        if let Some(rest) = line.split(".entry ").nth(1) {
            let name = rest.split(['(', ' ']).next().unwrap_or_default().trim().to_string();
            out.push((name, 0));
        } else if line.trim_start().starts_with("mma.sync") {
            if let Some(last) = out.last_mut() {
                last.1 += 1;
            }
        }
    }
    out
}

/// The report as an aligned text table, one row per kernel and architecture.
pub fn format_table(reports: &[KernelReport]) -> String {
    let w = reports.iter().map(|r| r.kernel.len()).max().unwrap_or(6).max(6);
    let fw = reports.iter().map(|r| r.file.len()).max().unwrap_or(4).max(4);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<fw$}  {:<w$}  {:<6}  {:>4}  {:>4}  {:>6}  {:>5}  {:>6}  {:>6}",
        "file", "kernel", "arch", "mma", "regs", "smem", "stack", "spill>", "spill<"
    );
    for r in reports {
        let _ = writeln!(
            s,
            "{:<fw$}  {:<w$}  {:<6}  {:>4}  {:>4}  {:>6}  {:>5}  {:>6}  {:>6}",
            r.file, r.kernel, r.arch, r.mma, r.registers, r.shared_bytes, r.stack_bytes, r.spill_stores, r.spill_loads
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ptxas_verbose_output() {
        let text = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'rms_norm_bf16' for 'sm_90'\n\
ptxas info    : Function properties for rms_norm_bf16\n\
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 20 registers, used 1 barriers, 128 bytes smem, 380 bytes cmem[0]\n\
ptxas info    : Compiling entry function 'add' for 'sm_90'\n\
ptxas info    : Function properties for add\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 10 registers, used 0 barriers, 372 bytes cmem[0]\n";
        let r = parse_ptxas(text, "x.cu", "sm_90");
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            KernelReport {
                file: "x.cu".into(),
                kernel: "rms_norm_bf16".into(),
                arch: "sm_90".into(),
                mma: 0,
                registers: 20,
                shared_bytes: 128,
                stack_bytes: 8,
                spill_stores: 4,
                spill_loads: 12
            }
        );
        assert_eq!((r[1].kernel.as_str(), r[1].registers, r[1].shared_bytes, r[1].spill_loads), ("add", 10, 0, 0));
    }

    #[test]
    fn counts_mma_per_entry() {
        let ptx = ".visible .entry a(\n\t.param .u64 p\n)\n{\n\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1}, {%r1}, {%r2}, {%f1};\n\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f2}, {%r1}, {%r2}, {%f2};\n}\n.visible .entry b()\n{\n\tret;\n}\n";
        assert_eq!(count_mma(ptx), vec![("a".to_string(), 2), ("b".to_string(), 0)]);
    }
}
