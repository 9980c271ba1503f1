#!/usr/bin/env bash
# Builds and runs the host emulation of every kernel (kernels/emu/emu_test.cpp) with g++, then
# the three deliberately broken matmul builds (break_test.cpp), which must be caught.
# Needs only a C++20 compiler; no GPU, no CUDA. A few minutes on 2 cores.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${TMPDIR:-/tmp}/tandem-emu-test-$$"
cxx() { "${CXX:-g++}" -std=c++20 -O1 -pthread -Wall -Wno-unused-function -Wno-unknown-pragmas "$@"; }
trap 'rm -f "$out" "$out-break1" "$out-break2" "$out-break3"' EXIT
cxx -o "$out" "$here/emu_test.cpp" & p0=$!
cxx -DTANDEM_GEMM_BREAK=1 -o "$out-break1" "$here/break_test.cpp" & p1=$!
cxx -DTANDEM_GEMM_BREAK=2 -o "$out-break2" "$here/break_test.cpp" & p2=$!
cxx -DTANDEM_GEMM_BREAK=3 -o "$out-break3" "$here/break_test.cpp" & p3=$!
wait $p0 && wait $p1 && wait $p2 && wait $p3
status=0
for b in 1 2 3; do
    if ! "$out-break$b"; then
        echo "FAIL the emulator tests did not catch TANDEM_GEMM_BREAK=$b"
        status=1
    fi
done
"$out" || status=1
exit $status
