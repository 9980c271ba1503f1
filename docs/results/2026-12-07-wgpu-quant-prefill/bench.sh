#!/bin/bash
# Quantized prefill on wgpu (lavapipe): each model with the tile kernel off
# (TANDEM_WGPU_QUANT_TILE_M=0, the default: the GEMV-shaped kernels) and on (=8), one
# binary, one run of this script; the bf16 twin as the yardstick.
#   T: the tandem binary; GGUF: the folder of docs/results/2026-12-07-quantized/make_gguf.py's files.
export WGPU_BACKEND=vulkan XDG_RUNTIME_DIR=$(mktemp -d) TANDEM_CACHE=${TANDEM_CACHE:-/tmp/qw/cache}
T=${T:-target/debug/tandem}
GGUF=${GGUF:-/tmp/qw/gguf}
OUT=docs/results/2026-12-07-wgpu-quant-prefill
PL=${PL:-64}
run() { # name model [env]
  echo "== $1"
  env ${3:-X=1} timeout 400 $T bench decode --backend wgpu --model $2 --prompt-len $PL --max-tokens 3 --runs 2 \
    --batch-sizes 1 --output-dir $OUT --name $1 2>&1 | grep -vE "INFO|DEBUG" | grep -iE "prefill|decode|error" | tail -4
}
run bf16 ${BF16:-models/SmolLM2-135M-Instruct}
# The split-layout models whose tile pipelines compile in seconds (see the README).
for m in $GGUF/smollm2-135m-Q8_0.gguf $GGUF/smollm2-135m-Q4_0.gguf; do
  n=$(basename $m .gguf)
  run $n-gemv $m TANDEM_WGPU_QUANT_TILE_M=0
  run $n-tile $m TANDEM_WGPU_QUANT_TILE_M=8
done
