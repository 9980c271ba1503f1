#!/usr/bin/env bash
# lm-evaluation-harness against `tandem serve`: a loglikelihood (multiple-choice) task and a
# generate_until task, defined from local JSONL files (tests/lm_eval/*.yaml), run through lm-eval's
# `local-completions` model and compared item by item with lm-eval's own `hf` model on the same
# model (committed as golden_hf.json; `--golden` regenerates it).
#
#   tests/lm_eval/run.sh [--golden]     # env: MODEL (default: the default model), BACKEND (wgpu)
#
# Not run in CI: lm-eval needs torch (a ~6 GB venv, .venv-lmeval) and a release build. About 4
# minutes here once those exist.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${MODEL:-$(cargo xtask fetch-model 2>/dev/null | tail -n 1)}
BACKEND=${BACKEND:-wgpu}
VENV=${LMEVAL_VENV:-.venv-lmeval}
OUT=target/lm-eval
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ ! -x "$VENV/bin/lm_eval" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "lm-eval[hf,api]==0.4.13"
fi
rm -rf "$OUT" && mkdir -p "$OUT"
TASKS=tandem_mc,tandem_gen

if [ "${1:-}" = "--golden" ]; then
  "$VENV/bin/lm_eval" --model hf --model_args "pretrained=$MODEL,dtype=float32" --device cpu \
    --tasks $TASKS --include_path tests/lm_eval --log_samples --output_path "$OUT/hf" --batch_size 1
  "$VENV/bin/python" tests/lm_eval/samples.py extract "$OUT/hf" > tests/lm_eval/golden_hf.json
  echo "wrote tests/lm_eval/golden_hf.json"
  exit 0
fi

TANDEM_BIN=${TANDEM_BIN:-target/release/tandem}
[ "$TANDEM_BIN" = target/release/tandem ] && cargo build --release -q -p tandem-cli
source tests/start_server.sh
start_server --max-num-seqs 8 --max-model-len 2048
"$VENV/bin/lm_eval" --model local-completions \
  --model_args "model=$NAME,base_url=http://127.0.0.1:$PORT/v1/completions,tokenizer_backend=huggingface,tokenizer=$MODEL,num_concurrent=4,max_retries=1,timeout=600" \
  --tasks $TASKS --include_path tests/lm_eval --log_samples --output_path "$OUT/tandem" --batch_size 1
"$VENV/bin/python" tests/lm_eval/samples.py extract "$OUT/tandem" > "$OUT/tandem.json"
"$VENV/bin/python" tests/lm_eval/samples.py compare tests/lm_eval/golden_hf.json "$OUT/tandem.json"
