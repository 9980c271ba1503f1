#!/usr/bin/env bash
# GuideLLM (the vLLM project's load generator) against `tandem serve`: a short sweep at
# concurrency 1 and 8, synthetic 128-token prompts, 32 output tokens, 16 requests a level. Fails
# when any request failed or was incomplete.
#
#   tests/guidellm/run.sh        # env: MODEL (default: the default model), BACKEND (wgpu)
#
# Not run in CI: GuideLLM pulls torch (a multi-GB venv, .venv-guidellm) and the sweep wants a
# release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${MODEL:-$(cargo xtask fetch-model 2>/dev/null | tail -n 1)}
BACKEND=${BACKEND:-wgpu}
VENV=${GUIDELLM_VENV:-.venv-guidellm}
OUT=target/guidellm
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ ! -x "$VENV/bin/guidellm" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "guidellm==0.8.1"
fi
rm -rf "$OUT" && mkdir -p "$OUT"
TANDEM_BIN=${TANDEM_BIN:-target/release/tandem}
[ "$TANDEM_BIN" = target/release/tandem ] && cargo build --release -q -p tandem-cli
source tests/start_server.sh
start_server --max-num-seqs 16 --max-model-len 2048
"$VENV/bin/guidellm" run --backend "kind=openai_http,target=http://127.0.0.1:$PORT" \
  --profile kind=concurrent,streams=1 --override profile.streams 1,8 \
  --constraint kind=max_requests,count=16 \
  --data "kind=synthetic_text,prompt_tokens=128,output_tokens=32" \
  --tokenizer "kind=huggingface_auto,model=$MODEL" \
  --output "kind=json,path=$OUT/report.json" 2>&1 | tee "$OUT/guidellm.log"
python3 tests/guidellm/check.py "$OUT/report.json"
