#!/usr/bin/env bash
# Installs the CUDA compile toolchain (NVRTC, CUDA headers, ptxas) from NVIDIA's pip wheels into
# a venv, so kernels can be checked on a machine with no GPU and no CUDA install.
# Idempotent: a second run installs nothing and prints the same paths.
#
#   kernels/install-toolchain.sh            # venv at <repo>/.venv-cuda
#   TANDEM_CUDA_VENV=/some/dir kernels/install-toolchain.sh
#   kernels/install-toolchain.sh --cublas   # also libcublasLt (423 MB), for --gemm cublaslt
#
# Prints shell lines (export ...) that the check binary also understands; `eval` them or pass
# the venv path to `tandem-kernels-check --venv`.
set -euo pipefail

# 13.0.x only: a newer NVRTC emits PTX that the 580 driver on our GPU cannot load.
WHEELS=(nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-nvcc==13.0.88)
# nvidia-cublas: libcublasLt.so.13, loaded at run time only by TANDEM_CUDA_GEMM=cublaslt and
# `tandem bench kernels` (the peer of our GEMMs); the cuBLAS of the CUDA 13.0 update whose
# runtime is pinned beside it. Only with --cublas (or TANDEM_CUDA_CUBLAS=1): no test needs it
# (the fake driver exports its own cuBLASLt) and a machine with CUDA installed has it already.
cublas=0
if [ "${1:-}" = "--cublas" ] || [ "${TANDEM_CUDA_CUBLAS:-0}" = "1" ]; then
    cublas=1
    WHEELS+=(nvidia-cublas==13.1.0.3)
fi

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TANDEM_CUDA_VENV:-$repo/.venv-cuda}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    echo "creating venv $venv" >&2
    "$python" -m venv "$venv"
fi

# Skip pip entirely when the pinned versions are already there (no network needed on rerun).
need=()
for w in "${WHEELS[@]}"; do
    name="${w%%==*}"; want="${w##*==}"
    have="$("$venv/bin/python" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p' || true)"
    [ "$have" = "$want" ] || need+=("$w")
done
if [ "${#need[@]}" -gt 0 ]; then
    echo "installing ${need[*]}" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${need[@]}" >&2
fi

site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cu="$site/nvidia/cu13"
lib="$cu/lib"
inc="$cu/include"
bin="$cu/bin"

missing=0
[ -e "$lib/libnvrtc.so.13" ] || { echo "missing: $lib/libnvrtc.so.13" >&2; missing=1; }
[ -e "$inc/cuda_bf16.h" ] || { echo "missing: $inc/cuda_bf16.h" >&2; missing=1; }
[ -x "$bin/ptxas" ] || { echo "missing: $bin/ptxas" >&2; missing=1; }
[ "$cublas" -eq 0 ] || [ -e "$lib/libcublasLt.so.13" ] || { echo "missing: $lib/libcublasLt.so.13" >&2; missing=1; }
if [ "$missing" -ne 0 ]; then
    echo "the wheels installed but not where expected; look under $site/nvidia" >&2
    exit 1
fi

echo "export TANDEM_CUDA_LIB=$lib"
echo "export TANDEM_CUDA_INCLUDE=$inc"
echo "export TANDEM_PTXAS=$bin/ptxas"
echo "export LD_LIBRARY_PATH=$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
