//! `tandem-kernels-check`: compiles every kernels/*.cu with NVRTC for compute_80 and
//! compute_90, assembles each with `ptxas -v`, and prints registers, shared memory, stack and
//! spills per kernel. Exit status 1 on any compile error (and with `--no-spills`, on any spill).
//!
//!   tandem-kernels-check [--dir kernels] [--arch sm_80,sm_90] [--only matmul] [--no-spills]
//!   tandem-kernels-check --fill-cache 90 [--dir kernels] [--only add]
//!
//! `--fill-cache ARCH` instead compiles every kernel to a cubin for sm_ARCH into the backend's
//! kernel cache (TANDEM_PTX_CACHE, else ~/.cache/tandem/ptx) under the key the backend looks
//! up, so a machine given that folder skips NVRTC and the driver's JIT at start (the GPU
//! bundle carries one for sm_90).
//!
//! TANDEM_KERNELS_CHECK_KEEP=1 keeps the PTX and cubins in the scratch folder it prints (for
//! nvdisasm: instructions per mma on a main loop's path, as kernels/matmul.cu's m128_w64 cites).
//!
//! libnvrtc must be on the loader path before the process starts; when it is not but the
//! toolchain was found (kernels/install-toolchain.sh), the binary re-executes itself once with
//! LD_LIBRARY_PATH extended.

use std::path::PathBuf;
use std::process::ExitCode;

use tandem_cuda::check::{check_kernels_filtered, format_table};
use tandem_cuda::toolchain::Toolchain;

const USAGE: &str = "usage: tandem-kernels-check [--dir DIR] [--arch sm_80,sm_90] [--only NAME] [--no-spills] | --fill-cache ARCH [--dir DIR] [--only NAME]";

fn main() -> ExitCode {
    let mut dir = None;
    let mut archs = "sm_80,sm_90".to_string();
    let mut only = None;
    let mut no_spills = false;
    let mut fill = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--dir" => dir = args.next().map(PathBuf::from),
            "--arch" => archs = args.next().unwrap_or_default(),
            "--only" => only = args.next(),
            "--no-spills" => no_spills = true,
            "--fill-cache" => fill = args.next(),
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("unknown argument `{other}`\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    reexec_with_loader_path();
    let dir = dir.unwrap_or_else(default_dir);
    if let Some(arch) = fill {
        return fill_cache(&dir, &arch, only.as_deref());
    }
    let archs: Vec<&str> = archs.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    match check_kernels_filtered(&dir, &archs, only.as_deref()) {
        Ok(reports) => {
            print!("{}", format_table(&reports));
            let spilled: Vec<_> = reports.iter().filter(|r| r.spill_stores + r.spill_loads > 0).collect();
            let files = reports.iter().map(|r| &r.file).collect::<std::collections::BTreeSet<_>>().len();
            println!(
                "{} kernels in {files} files, {} architectures; {} with spills",
                reports.len() / archs.len().max(1),
                archs.len(),
                spilled.len()
            );
            if no_spills && !spilled.is_empty() {
                eprintln!("spills found (--no-spills)");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kernel check failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Every kernel of `dir` into the PTX cache for compute_`arch` (see the module comment).
fn fill_cache(dir: &std::path::Path, arch: &str, only: Option<&str>) -> ExitCode {
    let include = Toolchain::discover().include_dir;
    let run = || -> tandem_core::Result<usize> {
        let mut srcs = tandem_cuda::sources::from_dir(dir)?;
        srcs.retain(|s| only.is_none_or(|o| s.name.contains(o)));
        for src in &srcs {
            tandem_cuda::compile::compile_cubin_cached(src, arch, include.as_ref())?;
        }
        Ok(srcs.len())
    };
    match run() {
        Ok(n) => {
            println!("{n} kernel files compiled to cubins for sm_{arch} into the kernel cache");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("filling the PTX cache failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `kernels/` of the current directory or a parent, else of the checkout this was built from.
fn default_dir() -> PathBuf {
    if let Ok(mut d) = std::env::current_dir() {
        loop {
            if d.join("kernels/common.cuh").is_file() {
                return d.join("kernels");
            }
            if !d.pop() {
                break;
            }
        }
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../kernels")
}

fn reexec_with_loader_path() {
    use std::os::unix::process::CommandExt;
    const GUARD: &str = "TANDEM_KERNELS_CHECK_REEXEC";
    if Toolchain::nvrtc_loadable() || std::env::var_os(GUARD).is_some() {
        return;
    }
    let tc = Toolchain::discover();
    let (Some(lib), false) = (&tc.lib_dir, tc.lib_dir_on_loader_path()) else { return };
    let Ok(exe) = std::env::current_exe() else { return };
    let mut paths = vec![lib.clone()];
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        paths.extend(std::env::split_paths(&old));
    }
    let Ok(joined) = std::env::join_paths(paths) else { return };
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", joined)
        .env(GUARD, "1")
        .exec();
    eprintln!("could not re-execute with LD_LIBRARY_PATH set: {err}");
}
