#!/usr/bin/env bash
# Builds and runs the host emulation of every kernel (kernels/emu/emu_test.cpp) with g++, beside
# the five deliberately broken matmul builds (break_test.cpp; 5: the GeGLU epilogue as silu), the four broken tensor-core
# attention builds and five broken tc_deep builds and two broken tc_shared builds (attn_break_test.cpp) and a broken routed-MoE combine (moe_break_test.cpp),
# which must be caught, and a
# kernel that deadlocks at a barrier (deadlock_test.cpp), which must be reported, not hang, and
# the fake driver's interleaved block order (interleave_test.cpp, built as crates/fake-cuda does),
# and its model of programmatic dependent launch with a read above the wait and a defeated wait,
# which must be caught (pdl_test.cpp).
# sm90_test.cpp: the emulated wgmma / TMA / mbarrier and the wgmma GEMM (kernels/matmul_sm90.cu),
# then the same program with each of its kernels' eleven deliberate breaks (argument 1..11; 10, 11:
# the persistent kernels matmul_wgmma_ws*),
# which must be caught.
# sm90_attention_test.cpp: the wgmma prefill attention (kernels/paged_attention_sm90.cu) through
# attention_tc_test.h's suite, bitwise against paged_attention_tc, then its three deliberate
# breaks (argument 1..3), which must be caught.
# Needs only a C++20 compiler; no GPU, no CUDA. Each program runs on one core (the emulator's
# CUDA threads are fibers), so they run side by side: about half a minute on 2 cores.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${TMPDIR:-/tmp}/tandem-emu-test-$$"
cxx() { "${CXX:-g++}" -std=c++20 -O1 -pthread -Wall -Wno-unused-function -Wno-unknown-pragmas "$@"; }
trap 'rm -f "$out" "$out-break1" "$out-break2" "$out-break3" "$out-break4" "$out-break5" "$out-attn1" "$out-attn2" "$out-attn3" "$out-attn4" "$out-attnd1" "$out-attnd2" "$out-attnd3" "$out-attnd4" "$out-attnd5" "$out-attns1" "$out-attns2" "$out-deadlock" "$out-interleave" "$out-pdl" "$out-moe1" "$out-sm90" "$out-sm90a" "$out.sm90" "$out.log" "$out.breaks" "$out.main"' EXIT
cxx -o "$out" "$here/emu_test.cpp" & p0=$!
cxx -DTANDEM_GEMM_BREAK=1 -o "$out-break1" "$here/break_test.cpp" & p1=$!
cxx -DTANDEM_GEMM_BREAK=2 -o "$out-break2" "$here/break_test.cpp" & p2=$!
cxx -DTANDEM_GEMM_BREAK=3 -o "$out-break3" "$here/break_test.cpp" & p3=$!
cxx -DTANDEM_GEMM_BREAK=4 -o "$out-break4" "$here/break_test.cpp" & p5=$!
cxx -DTANDEM_GEMM_BREAK=5 -o "$out-break5" "$here/break_test.cpp" & p8=$!
cxx -o "$out-deadlock" "$here/deadlock_test.cpp" & p4=$!
cxx -DTANDEM_EMU_STRICT -o "$out-interleave" "$here/interleave_test.cpp" & p6=$!
cxx -DTANDEM_EMU_STRICT -o "$out-pdl" "$here/pdl_test.cpp" & p7=$!
wait $p0 && wait $p1 && wait $p2 && wait $p3 && wait $p4 && wait $p5 && wait $p6 && wait $p7 && wait $p8
cxx -DTANDEM_MOE_BREAK=1 -o "$out-moe1" "$here/moe_break_test.cpp" & pm=$!
cxx -Wno-psabi -o "$out-sm90" "$here/sm90_test.cpp" & psm=$!
cxx -Wno-psabi -o "$out-sm90a" "$here/sm90_attention_test.cpp" & psa=$!
pids=()
for b in 1 2 3 4; do
    cxx -DTANDEM_PAT_BREAK=$b -o "$out-attn$b" "$here/attn_break_test.cpp" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
pids=()
for b in 1 2 3 4 5; do
    cxx -DTANDEM_PATD_BREAK=$b -o "$out-attnd$b" "$here/attn_break_test.cpp" & pids+=($!)
done
for b in 1 2; do
    cxx -DTANDEM_PATS_BREAK=$b -o "$out-attns$b" "$here/attn_break_test.cpp" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
wait $pm
wait $psm
wait $psa
status=0
breaks() {
    local s=0
    for b in 1 2 3 4 5; do
        if ! "$out-break$b"; then
            echo "FAIL the emulator tests did not catch TANDEM_GEMM_BREAK=$b"
            s=1
        fi
    done
    for b in 1 2 3 4; do
        if ! "$out-attn$b" | tail -n 1; then
            echo "FAIL the emulator tests did not catch TANDEM_PAT_BREAK=$b"
            s=1
        fi
    done
    for b in 1 2 3 4 5; do
        if ! "$out-attnd$b" | tail -n 1; then
            echo "FAIL the emulator tests did not catch TANDEM_PATD_BREAK=$b"
            s=1
        fi
    done
    for b in 1 2; do
        if ! "$out-attns$b" | tail -n 1; then
            echo "FAIL the emulator tests did not catch TANDEM_PATS_BREAK=$b"
            s=1
        fi
    done
    if ! "$out-moe1" | tail -n 1; then
        echo "FAIL the emulator tests did not catch TANDEM_MOE_BREAK=1"
        s=1
    fi
    for b in 1 2 3 4 5 6 7 8 9 10 11; do
        if ! "$out-sm90" $b > "$out.sm90" 2>&1; then
            cat "$out.sm90"
            echo "FAIL the emulator tests did not catch TANDEM_WGMMA_BREAK=$b"
            s=1
        else
            tail -n 1 "$out.sm90"
        fi
    done
    for b in 1 2 3; do
        if ! "$out-sm90a" $b > "$out.sm90" 2>&1; then
            cat "$out.sm90"
            echo "FAIL the emulator tests did not catch TANDEM_PAW_BREAK=$b"
            s=1
        else
            tail -n 1 "$out.sm90"
        fi
    done
    # In a subshell, so that the shell's "Aborted" notice lands in the log too.
    if ("$out-deadlock") > "$out.log" 2>&1; then
        echo "FAIL the emulator ran a kernel that deadlocks at a barrier to the end"
        s=1
    elif grep -q "cuda_emu: deadlock" "$out.log"; then
        echo "deadlock at a barrier reported (as it must): $(grep -m1 'cuda_emu: deadlock' "$out.log")"
    else
        echo "FAIL the deadlocking kernel failed without the deadlock message:"
        cat "$out.log"
        s=1
    fi
    "$out-interleave" || s=1
    "$out-pdl" || s=1
    return $s
}
# The checks print one line each; the broken builds' lines come first, then the checks'.
breaks > "$out.breaks" 2>&1 & pb=$!
"$out" > "$out.main" 2>&1 || status=1
"$out-sm90" >> "$out.main" 2>&1 || status=1
"$out-sm90a" >> "$out.main" 2>&1 || status=1
wait $pb || status=1
cat "$out.breaks" "$out.main"
exit $status
