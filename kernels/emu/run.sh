#!/usr/bin/env bash
# Builds and runs the host emulation of every kernel (kernels/emu/emu_test.cpp) with g++.
# Needs only a C++20 compiler; no GPU, no CUDA. Takes under a minute on 2 cores.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${TMPDIR:-/tmp}/tandem-emu-test-$$"
"${CXX:-g++}" -std=c++20 -O1 -pthread -Wall -Wno-unused-function -Wno-unknown-pragmas -o "$out" "$here/emu_test.cpp"
trap 'rm -f "$out"' EXIT
"$out"
