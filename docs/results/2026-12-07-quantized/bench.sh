#!/bin/bash
# The quantized-weights bench: each file and its bf16 twin, reference and wgpu (lavapipe).
export WGPU_BACKEND=vulkan XDG_RUNTIME_DIR=$(mktemp -d) TANDEM_CACHE=/tmp/qw/cache
T=/work/wt/quantw/target/debug/tandem
for be in wgpu reference; do
  for m in /work/main/models/SmolLM2-135M-Instruct /tmp/qw/gguf/smollm2-135m-Q8_0.gguf /tmp/qw/gguf/smollm2-135m-Q4_0.gguf; do
    n=$(basename $m .gguf)
    echo "== $be $n"
    timeout 240 $T bench decode --backend $be --model $m --prompt-len 32 --max-tokens 17 --runs 2 --batch-sizes 1 \
      --output-dir docs/results/2026-12-07-quantized --name $be-$n 2>&1 | grep -vE "INFO|DEBUG" | tail -12
  done
done
