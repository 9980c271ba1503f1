//! Runs `tandem-kernels-check` (NVRTC + ptxas over every kernels/*.cu for sm_80 and sm_90) when
//! the toolchain is installed (kernels/install-toolchain.sh). Without it the test says it is
//! skipped and why; with TANDEM_REQUIRE_CUDA_TOOLCHAIN=1 a missing toolchain fails.

use std::process::Command;

use tandem_cuda::toolchain::Toolchain;

#[test]
fn every_kernel_compiles_and_assembles_without_spills() {
    let tc = Toolchain::discover();
    let required = std::env::var("TANDEM_REQUIRE_CUDA_TOOLCHAIN").is_ok_and(|v| v == "1");
    if (tc.lib_dir.is_none() && !Toolchain::nvrtc_loadable()) || tc.ptxas.is_none() {
        let msg = format!("CUDA toolchain not found ({tc:?}); run kernels/install-toolchain.sh");
        assert!(!required, "{msg}");
        tandem_core::skip::note(format!("kernel compile check: {msg}"));
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_tandem-kernels-check"))
        .args(["--arch", "sm_80,sm_90", "--no-spills"])
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "kernel check failed:\n{text}");
    for kernel in [
        "matmul_tc_bf16_m16",
        "matmul_tc_f16_m128",
        "matmul_tiled_f32",
        "add_rms_norm_bf16",
        "rope_kv_write_bf16",
        "rope_kv_write_f32",
        "paged_attention_partial_f32",
        "paged_attention_partial_bf16",
        "argmax",
        "rope",
        "kv_write_f32",
        "kv_write_bf16",
    ] {
        assert!(text.contains(kernel), "report lacks {kernel}");
    }
    assert!(text.contains("sm_80") && text.contains("sm_90"));
    // The kernels the backend resolves at start-up are exactly those the sources define: a
    // renamed or removed kernel fails here rather than at start-up on a GPU.
    let compiled: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| l.split_whitespace().nth(2) == Some("sm_90"))
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    let resolved: std::collections::BTreeSet<&str> = tandem_cuda::kernel_names().into_iter().collect();
    assert_eq!(resolved, compiled, "kernels resolved at start-up vs kernels compiled");
    // The tensor-core kernels really hold mma instructions (the `mma` column of the table).
    let mma_of = |kernel: &str| -> Vec<u32> {
        text.lines()
            .filter(|l| l.split_whitespace().nth(1) == Some(kernel))
            .filter_map(|l| l.split_whitespace().nth(3)?.parse().ok())
            .collect()
    };
    for kernel in [
        "matmul_tc_bf16_m16",
        "matmul_tc_bf16_m64",
        "matmul_tc_f16_m128",
        "matmul_tc_bf16_m16_n128",
        "matmul_tc_f16_m64_n128",
    ] {
        let counts = mma_of(kernel);
        assert!(!counts.is_empty() && counts.iter().all(|&c| c > 0), "{kernel}: mma counts {counts:?}");
    }
    assert!(mma_of("matmul_tiled_f32").iter().all(|&c| c == 0));
}

/// `--fill-cache 90` leaves a cubin of the kernel file in the cache folder, and a second fill
/// reads them back instead of compiling (compile.rs `compile_cubin_cached`, what the backend
/// calls at start on a GPU).
#[test]
fn fill_cache_writes_sm90_cubins_that_the_cache_returns() {
    let tc = Toolchain::discover();
    let required = std::env::var("TANDEM_REQUIRE_CUDA_TOOLCHAIN").is_ok_and(|v| v == "1");
    if tc.lib_dir.is_none() && !Toolchain::nvrtc_loadable() {
        let msg = format!("NVRTC not found ({tc:?}); run kernels/install-toolchain.sh");
        assert!(!required, "{msg}");
        tandem_core::skip::note(format!("cubin cache check: {msg}"));
        return;
    }
    let dir = std::env::temp_dir().join(format!("tandem-cubin-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let kernels = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
    let out = Command::new(env!("CARGO_BIN_EXE_tandem-kernels-check"))
        .args(["--fill-cache", "90", "--only", "add", "--dir"])
        .arg(&kernels)
        .env("TANDEM_PTX_CACHE", &dir)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    let mut cubins: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "cubin"))
        .collect();
    cubins.sort();
    // --only add: add.cu alone (a second of NVRTC; the whole set takes over a minute here).
    assert_eq!(cubins.len(), 1, "{cubins:?}");
    assert!(cubins[0].file_name().unwrap().to_string_lossy().starts_with("add-90-"), "{cubins:?}");
    for p in &cubins {
        let bytes = std::fs::read(p).unwrap();
        assert!(bytes.starts_with(b"\x7fELF"), "{}", p.display());
    }
    // A second fill finds every cubin under the backend's key and rewrites none (a cubin made
    // again would be written through a temporary file and renamed: a new modification time).
    let stamps = |ps: &[std::path::PathBuf]| {
        ps.iter().map(|p| std::fs::metadata(p).unwrap().modified().unwrap()).collect::<Vec<_>>()
    };
    let before = stamps(&cubins);
    let again = Command::new(env!("CARGO_BIN_EXE_tandem-kernels-check"))
        .args(["--fill-cache", "90", "--only", "add", "--dir"])
        .arg(&kernels)
        .env("TANDEM_PTX_CACHE", &dir)
        .output()
        .unwrap();
    assert!(again.status.success());
    assert_eq!(stamps(&cubins), before, "the second fill recompiled instead of reading the cache");
    let _ = std::fs::remove_dir_all(&dir);
}
