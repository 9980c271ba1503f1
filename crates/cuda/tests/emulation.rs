//! Runs every kernel on the CPU through kernels/emu (a C++20 emulation of CUDA threads, block
//! barriers and warp shuffles) against naive double-precision references: 115 checks covering
//! each op, both matmul paths and dtypes, split attention and bitwise batch invariance. This is
//! how the kernels' indexing and reductions are executed on a machine without a GPU. It needs
//! g++ (or $CXX); without one it prints SKIPPED, and TANDEM_REQUIRE_EMU=1 makes that a failure.
//! Takes about 1.5 minutes on 2 cores (barrier-heavy).

use std::path::Path;
use std::process::Command;

#[test]
fn kernels_match_reference_in_host_emulation() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let have = Command::new(&cxx).arg("--version").output().is_ok_and(|o| o.status.success());
    if !have {
        assert!(!std::env::var("TANDEM_REQUIRE_EMU").is_ok_and(|v| v == "1"), "TANDEM_REQUIRE_EMU=1 but no C++ compiler `{cxx}`");
        tandem_core::skip::note(format!("kernel emulation: no C++ compiler `{cxx}`"));
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels/emu/run.sh");
    let out = Command::new("bash").arg(&script).output().expect("running kernels/emu/run.sh");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "kernel emulation failed:\n{}", text.lines().filter(|l| !l.starts_with("ok ")).collect::<Vec<_>>().join("\n"));
    assert!(text.contains("checks, 0 failed"), "unexpected emulation output:\n{text}");
}
