//! Runs every kernel on the CPU through kernels/emu (a C++20 emulation of CUDA threads, block
//! barriers, warp shuffles, ldmatrix, mma.sync and cp.async) against naive double-precision
//! references: 1,136 checks (and 78 of the sm90 wgmma GEMMs, 108 of the sm90 wgmma attention) covering the emulated primitives against the PTX ISA, the tensor-core
//! matmul at awkward shapes with derived bf16/f16 bounds and bitwise row equality across m,
//! each other op, kv_write and attention over an f32 and a bf16 cache (round-to-nearest-even
//! bits, a derived bound against the unrounded values), split attention and its batch
//! invariance for both caches, and GQA heads packed per block bitwise against one head per block; the fused ops (the q/k/v and gate/up-silu GEMM epilogues,
//! add_rms_norm, rope_kv_write) against f64 and bitwise against the unfused composition, the
//! fused norms (the residual-add epilogue, and the input norm in the projection's prologue)
//! bitwise against matmul + add and rms_norm + projection, rope and the KV write in the q/k/v
//! epilogue bitwise against qkv_proj + rope_kv_write, activations stored in 16 bits (every
//! producer's output the f32 output rounded, the GEMM on such x bitwise the GEMM on f32 x), the
//! one-launch GEMM (x rounded in-kernel, split K folded in-kernel) bitwise against the former
//! matmul_x + tile kernel + matmul_fold path, split attention combined in-kernel by the last
//! partition block bitwise against the former partial + combine launches, the tensor-core
//! attention against f64 within a derived bound and bitwise across split jobs, chunk jobs of any
//! width, and each token alone; then three deliberately broken matmul builds (a
//! wrong fragment index, a missing cp.async wait, a split-K fold in arrival order) and four
//! broken tensor-core attention builds (a wrong fragment index, a missing cp.async wait,
//! partials folded newest first, a chunk's rows sharing one partition length) that must fail,
//! and a kernel that deadlocks at a barrier, which must be reported rather than hang. This is how the
//! kernels' indexing and reductions are executed on a machine without a GPU. It needs g++ (or
//! $CXX); without one it prints SKIPPED, and TANDEM_REQUIRE_EMU=1 makes that a failure.
//! About half a minute on 2 cores (each CUDA thread is a fiber; see kernels/emu/cuda_emu.h).

use std::path::Path;
use std::process::Command;

#[test]
fn kernels_match_reference_in_host_emulation() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let have = Command::new(&cxx).arg("--version").output().is_ok_and(|o| o.status.success());
    if !have {
        assert!(
            !std::env::var("TANDEM_REQUIRE_EMU").is_ok_and(|v| v == "1"),
            "TANDEM_REQUIRE_EMU=1 but no C++ compiler `{cxx}`"
        );
        tandem_core::skip::note(format!("kernel emulation: no C++ compiler `{cxx}`"));
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels/emu/run.sh");
    let out = Command::new("bash").arg(&script).output().expect("running kernels/emu/run.sh");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(
        out.status.success(),
        "kernel emulation failed:\n{}",
        text.lines().filter(|l| !l.starts_with("ok ")).collect::<Vec<_>>().join("\n")
    );
    assert!(text.contains("checks, 0 failed"), "unexpected emulation output:\n{text}");
    assert!(text.contains("deadlock at a barrier reported"), "the deadlocking kernel was not reported:\n{text}");
    // The fake driver's block order (kernels/emu/interleave_test.cpp): 5 checks, none failed.
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok   interleave: ")).count(),
        5,
        "the interleaved block order checks did not all pass:\n{text}"
    );
    // A check that silently stopped running (a case list emptied, a test not called) lowers it:
    // the floors are what the programs run (kernels/emu/run.sh, 2026-12-06); raise them with the
    // checks you add.
    let count = text.lines().find_map(|l| l.strip_suffix(" checks, 0 failed")?.trim().parse::<usize>().ok());
    assert!(count.is_some_and(|n| n >= 1136), "expected at least 1136 emulator checks, got {count:?}");
    let sm90 =
        text.lines().find_map(|l| l.strip_prefix("sm90: ")?.strip_suffix(" checks, 0 failed")?.parse::<usize>().ok());
    assert!(sm90.is_some_and(|n| n >= 78), "expected at least 78 sm90 emulator checks, got {sm90:?}");
    // The wgmma prefill attention (kernels/emu/sm90_attention_test.cpp) and its three breaks.
    let attn90 = text
        .lines()
        .find_map(|l| l.strip_prefix("sm90 attention: ")?.strip_suffix(" checks, 0 failed")?.parse::<usize>().ok());
    assert!(attn90.is_some_and(|n| n >= 108), "expected at least 108 sm90 attention checks, got {attn90:?}");
    for b in 1..=3 {
        let line = format!("TANDEM_PAW_BREAK={b}: ");
        let caught = text.lines().find_map(|l| l.strip_prefix(line.as_str())?.split(' ').next()?.parse::<usize>().ok());
        assert!(caught.is_some_and(|n| n > 0), "the broken wgmma attention build {b} was not caught: {caught:?}");
    }
    for b in 1..=4 {
        let line = format!("TANDEM_PAT_BREAK={b}: ");
        let caught = text.lines().find_map(|l| l.strip_prefix(line.as_str())?.split(' ').next()?.parse::<usize>().ok());
        assert!(caught.is_some_and(|n| n > 0), "the broken attention build {b} was not caught: {caught:?}");
    }
}
