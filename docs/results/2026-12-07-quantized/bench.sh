#!/bin/bash
# The quantized-weights bench: each quantized model and its bf16 twin, on wgpu (lavapipe) and
# the reference, in one script run. On wgpu each quantized model runs twice: the file's bytes in
# a storage buffer (TANDEM_WGPU_QUANT_TEXELS=0, the first version's kernels) and split into
# aligned texels (the default on CPU adapters, crates/wgpu/src/quant_split.rs).
#   T: the tandem binary; GGUF: the folder of make_gguf.py's files; Q: make_fp8_int4.py's output.
export WGPU_BACKEND=vulkan XDG_RUNTIME_DIR=$(mktemp -d) TANDEM_CACHE=${TANDEM_CACHE:-/tmp/qw/cache}
T=${T:-target/debug/tandem}
GGUF=${GGUF:-/tmp/qw/gguf}
Q=${Q:-/tmp/qbench}
OUT=docs/results/2026-12-07-quantized
BF16=${BF16:-models/SmolLM2-135M-Instruct}
run() { # backend name model [env]
  echo "== $1 $2"
  env ${4:-X=1} timeout 300 $T bench decode --backend $1 --model $3 --prompt-len 32 --max-tokens 17 --runs 2 \
    --batch-sizes 1 --output-dir $OUT --name $1-$2 2>&1 | grep -vE "INFO|DEBUG" | tail -6
}
for be in ${BACKENDS:-wgpu reference}; do
  run $be SmolLM2-135M-Instruct $BF16
  for m in $GGUF/smollm2-135m-Q8_0.gguf $GGUF/smollm2-135m-Q4_0.gguf $Q/smollm2-135m-fp8 $Q/smollm2-135m-int4; do
    n=$(basename $m .gguf)
    [ $be = wgpu ] && run $be $n-buffer $m TANDEM_WGPU_QUANT_TEXELS=0
    run $be $n $m
  done
done
