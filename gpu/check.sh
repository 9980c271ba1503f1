#!/usr/bin/env bash
# gpu/check.sh OUT_DIR — the whole GPU check in one call (docs/gpu-check.md).
#
# Prints the machine (date, GPU, driver, glibc, commit), finds libnvrtc, then: the op suite on
# the backend, random models made here by our binary, whole-model compares against the reference
# backend (and HF transformers), the two ceilings (copy bandwidth, bf16 matmul), and short
# benchmarks held against their floors. Everything runs with the backend's default KV cache
# (bf16 on cuda); one compare repeats the tiny bf16 model with an f32 cache (the f32 kernels).
# The benchmarks' reports say which element size they stored; summarize.py counts KV bytes by it. Every step has its own timeout, a failed step does not
# stop the next, and the whole run keeps inside TANDEM_CHECK_BUDGET_S. Full logs go to OUT_DIR
# (six files); a short table is printed last.
#
# Runs from the bundle (`cargo xtask gpu-bundle`: tandem, *.py, check.sh, COMMIT, kernels/) or
# from gpu/ in a checkout (binary from TANDEM_BIN or target/release/tandem).
#
# Settings (environment):
#   TANDEM_CHECK_BACKEND     cuda (default), wgpu or reference: the latter two are dry runs
#   TANDEM_CHECK_BENCH_SHAPE llama-3.2-1b (default); a small shape for dry runs
#   TANDEM_CHECK_SMALL=1     dry run sizes: fewer compare steps, tiny benchmarks
#   TANDEM_CHECK_BUDGET_S    seconds for all steps together (default 330)
#   TANDEM_CHECK_WORK        scratch folder for models and raw outputs (default /tmp/tandem-check)
#   TANDEM_CHECK_PYTHON      python with torch + transformers (default python3)
#   TANDEM_KERNEL_DIR        passed through: kernel sources to use instead of the built-in ones

set -u
OUT=${1:?usage: check.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
BACKEND=${TANDEM_CHECK_BACKEND:-cuda}
BENCH_SHAPE=${TANDEM_CHECK_BENCH_SHAPE:-llama-3.2-1b}
SMALL=${TANDEM_CHECK_SMALL:-0}
BUDGET=${TANDEM_CHECK_BUDGET_S:-330}
WORK=${TANDEM_CHECK_WORK:-/tmp/tandem-check}
PY=${TANDEM_CHECK_PYTHON:-python3}
export PYTHONUNBUFFERED=1
export RUST_LOG=${RUST_LOG:-info}
export TANDEM_PTX_CACHE=$WORK/ptx-cache

BIN=${TANDEM_BIN:-}
for b in "$HERE/tandem" "$HERE/../target/release/tandem"; do
    [ -z "$BIN" ] && [ -x "$b" ] && BIN=$b
done
BIN=${BIN:-$HERE/tandem}

rm -rf "$WORK/logs" "$WORK/raw"
mkdir -p "$WORK/logs" "$WORK/raw" "$WORK/models"
LOG=$OUT/check.log
STEPS=$WORK/raw/steps.tsv
: >"$LOG"
: >"$STEPS"
T0=$(date +%s)

say() { echo "$*" | tee -a "$LOG"; }
elapsed() { echo $(( $(date +%s) - T0 )); }

# step NAME TIMEOUT_S CMD...: runs CMD under `timeout`, logs its whole output, records
# (name, rc, seconds, verdict line) in steps.tsv, prints one status line. rc 124 = timed out,
# 125 = skipped for lack of time. The verdict line is the last line matching PICK (a regex;
# default: a pass/fail count or an error), else the last line.
step() {
    local name=$1 limit=$2; shift 2
    local left=$(( BUDGET - $(elapsed) ))
    local slog="$WORK/logs/$(printf '%s' "$name" | tr -c 'A-Za-z0-9_.-' '_').log"
    if [ "$left" -lt 15 ]; then
        printf '%s\t125\t0\tskipped: out of the %s s budget\n' "$name" "$BUDGET" >>"$STEPS"
        say "[$(elapsed) s] $name: SKIPPED (out of time budget)"
        return 125
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    { echo; echo "===== $name (timeout ${limit}s): $*"; } >>"$LOG"
    local s=$(date +%s.%N)
    timeout -k 10 "$limit" "$@" >"$slog" 2>&1
    local rc=$?
    local secs
    secs=$(awk -v a="$s" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    cat "$slog" >>"$LOG"
    echo "----- $name: rc=$rc in ${secs}s" >>"$LOG"
    # The last line that looks like a verdict, else the last line.
    local last
    last=$(grep -E "${PICK:-(passed|failed|error|Error|FAIL|skipped)}" "$slog" | tail -n 1)
    [ -z "$last" ] && last=$(grep -v '^\s*$' "$slog" | tail -n 1)
    last=$(echo "$last" | sed -e 's/\x1b\[[0-9;]*m//g' | tr '\t' ' ' | cut -c1-160)
    [ $rc -eq 124 ] && last="TIMED OUT after ${limit}s; $last"
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$secs" "$last" >>"$STEPS"
    if [ $rc -eq 0 ]; then say "[$(elapsed) s] $name: ok (${secs}s) $last"; else say "[$(elapsed) s] $name: FAILED rc=$rc (${secs}s) $last"; fi
    return $rc
}

# ---------------------------------------------------------------- the machine
{
    echo "tandem GPU check, backend $BACKEND, bench shape $BENCH_SHAPE, budget ${BUDGET}s"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -a)"
    echo "commit: $(cat "$HERE/COMMIT" 2>/dev/null || git -C "$HERE" rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "binary: $BIN"
    echo "glibc: $(ldd --version 2>&1 | head -n 1)"
    echo "cpus: $(nproc), memory: $(free -g 2>/dev/null | awk '/Mem:/ {print $2 " GiB"}')"
    echo "python: $($PY --version 2>&1), torch: $($PY -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>&1 | tail -n 1)"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv 2>&1
        nvidia-smi 2>&1
    else
        echo "nvidia-smi: not found"
    fi
} >"$WORK/raw/env.txt" 2>&1
cat "$WORK/raw/env.txt" >>"$LOG"
head -n 9 "$WORK/raw/env.txt"

# libnvrtc.so.13 (the cuda backend compiles its kernels at start) and libcublas, from the
# toolkit or from python's nvidia wheels; the folder goes on LD_LIBRARY_PATH.
find_lib() {
    local so=$1 d
    local dirs=("${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib)
    for d in /usr/local/cuda-13*/lib64; do dirs+=("$d"); done
    while read -r d; do
        for x in "$d"/nvidia/*/lib; do dirs+=("$x"); done
    done < <($PY -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null)
    for d in "${dirs[@]}"; do
        [ -e "$d/$so" ] && { echo "$d"; return 0; }
    done
    return 1
}
NVRTC_DIR=$(find_lib libnvrtc.so.13)
CUBLAS_DIR=$(find_lib libcublas.so.13)
say "libnvrtc.so.13: ${NVRTC_DIR:-NOT FOUND}; libcublas.so.13: ${CUBLAS_DIR:-NOT FOUND}"
for d in "$CUBLAS_DIR" "$NVRTC_DIR"; do
    [ -n "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
[ -n "$NVRTC_DIR" ] && export TANDEM_CUDA_LIB=$NVRTC_DIR
printf 'nvrtc_dir\t%s\ncublas_dir\t%s\n' "$NVRTC_DIR" "$CUBLAS_DIR" >>"$WORK/raw/env.txt"

step "binary starts" 20 "$BIN" --version

# ---------------------------------------------------------------- random models
# Made here by our binary (no weights travel). The bench model is the slow one (about 20 s
# single-threaded for llama-3.2-1b): it is made in the background while the checks run.
gen() { # gen SHAPE DTYPE DIR TIMEOUT: a model left by an earlier run is reused (config.json is written last)
    if [ -e "$3/config.json" ]; then
        printf 'gen-model %s\t0\t0\treused %s\n' "$(basename "$3")" "$3" >>"$STEPS"
        return 0
    fi
    rm -rf "$3"
    step "gen-model $(basename "$3")" "$4" "$BIN" gen-model --shape "$1" --seed 1 --dtype "$2" --out "$3"
}
BENCH_DIR=$WORK/models/bench-$BENCH_SHAPE-bf16
gen "$BENCH_SHAPE" bf16 "$BENCH_DIR" 150 &
GEN_PID=$!
TINY=$WORK/models/tiny-bf16
TINY32=$WORK/models/tiny-f32
SMOL=$WORK/models/smollm2-135m-bf16
gen tiny bf16 "$TINY" 30
gen tiny f32 "$TINY32" 30
gen smollm2-135m bf16 "$SMOL" 60

# ---------------------------------------------------------------- correctness
if ! step "test-ops $BACKEND" 150 "$BIN" test-ops --backend "$BACKEND"; then
    # Rerun each failing op (up to 3) with a synchronize after every launch, so an
    # asynchronous fault is reported against the kernel that caused it.
    TL="$WORK/logs/test-ops_$BACKEND.log"
    SEED=$(grep -o 'seed [0-9]*' "$TL" | head -n 1 | awk '{print $2}')
    OPS=$(grep -E ' FAIL ' "$TL" | awk '{print $1}' | sort -u | head -n 3)
    for op in $OPS; do
        step "test-ops $op SYNC=1" 60 env TANDEM_CUDA_SYNC=1 "$BIN" test-ops --backend "$BACKEND" --op "$op" ${SEED:+--seed "$SEED"}
    done
    # No FAIL line: the suite died (a fault, a panic, the timeout); the whole suite again, synced.
    [ -z "$OPS" ] && step "test-ops $BACKEND SYNC=1" 120 env TANDEM_CUDA_SYNC=1 "$BIN" test-ops --backend "$BACKEND" ${SEED:+--seed "$SEED"}
fi

# Dry runs on a CPU adapter: the 135M model's compare shrinks to fit a few minutes.
SMOL_ARGS=(--steps 16)
[ "$SMALL" = 1 ] && SMOL_ARGS=(--steps 8 --prompts 3 --batch 8)
step "compare $BACKEND tiny bf16" 90 "$BIN" compare --backend "$BACKEND" --model "$TINY" --json "$OUT/compare-tiny.json"
step "compare $BACKEND tiny bf16, f32 KV" 90 "$BIN" compare --backend "$BACKEND" --model "$TINY" --kv-cache-dtype f32 --json "$OUT/compare-tiny-f32kv.json"
step "compare $BACKEND tiny f32" 90 "$BIN" compare --backend "$BACKEND" --model "$TINY32"
step "compare $BACKEND smollm2-135m" 200 "$BIN" compare --backend "$BACKEND" --model "$SMOL" "${SMOL_ARGS[@]}" --json "$OUT/compare-smollm2.json"
if [ -s "$OUT/compare-tiny.json" ]; then
    step "hf_compare tiny" 150 "$PY" "$HERE/hf_compare.py" --model "$TINY" --ids-json "$OUT/compare-tiny.json" --out "$OUT/hf-tiny.json"
else
    printf 'hf_compare tiny\t125\t0\tskipped: tandem compare wrote no compare-tiny.json\n' >>"$STEPS"
fi

# ---------------------------------------------------------------- ceilings and benchmarks
if [ "$SMALL" = 1 ]; then
    step "ceilings" 120 "$PY" "$HERE/ceilings.py" --copy-mib 64 --n 1024 --reps 5 --allow-cpu
else
    step "ceilings" 120 "$PY" "$HERE/ceilings.py"
fi
grep -E '^\{' "$WORK/logs/ceilings.log" | tail -n 1 >"$WORK/raw/ceilings.json"

wait "$GEN_PID"
BENCH_OUT=$WORK/raw/bench
if [ "$SMALL" = 1 ]; then
    DEC=(--prompt-len 64 --max-tokens 16 --runs 2 --max-num-batched-tokens 64)
    THR=(--max-num-seqs 8 --num-prompts 8 --input-len 32 --output-len 8 --num-kv-blocks 64 --max-num-batched-tokens 256 --warmup 1)
else
    DEC=(--prompt-len 512 --max-tokens 128 --runs 3 --max-num-batched-tokens 512)
    THR=(--max-num-seqs 64 --num-prompts 64 --input-len 128 --output-len 128 --num-kv-blocks 1280 --max-num-batched-tokens 2048 --warmup 2)
fi
if "$BIN" bench --help >/dev/null 2>&1; then
    PICK='decode tok/s' step "bench decode $BENCH_SHAPE" 180 "$BIN" bench decode --backend "$BACKEND" --model "$BENCH_DIR" "${DEC[@]}" --output-dir "$BENCH_OUT" --name decode
    PICK='^\| tandem' step "bench throughput $BENCH_SHAPE" 180 "$BIN" bench throughput --backend "$BACKEND" --model "$BENCH_DIR" "${THR[@]}" --timeout-s 150 --output-dir "$BENCH_OUT" --name throughput
else
    printf 'bench\t125\t0\tskipped: this tandem binary has no bench subcommand\n' >>"$STEPS"
fi

# The kernel lab (issue 13): each GEMM and attention kernel at the Llama shapes, against the
# ceilings just measured, then the same cases through torch (cuBLAS, SDPA) on this GPU.
if "$BIN" bench kernels --help >/dev/null 2>&1; then
    read -r BW PK < <(python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); print(c.get("copy_gbps") or 0, c.get("matmul_tflops") or 0)' "$WORK/raw/ceilings.json" 2>/dev/null || echo "0 0")
    CEIL=()
    [ "${BW%.*}" -gt 0 ] 2>/dev/null && CEIL+=(--bandwidth-gbs "$BW")
    [ "${PK%.*}" -gt 0 ] 2>/dev/null && CEIL+=(--peak-tflops "$PK")
    if [ "$SMALL" = 1 ]; then
        LABS=(tiny); LAB=(--m 1,64 --attn-batch 1,8 --attn-context 256 --attn-prefill 128 --min-ms 20)
    else
        LABS=(llama-3.2-1b llama-3.1-8b); LAB=(--min-ms 100)
    fi
    for KS in "${LABS[@]}"; do
        PICK='attention prefill' step "kernel lab $KS" 150 "$BIN" bench kernels --backend "$BACKEND" --shape "$KS" "${LAB[@]}" "${CEIL[@]}" --output-dir "$BENCH_OUT" --name "kernels-$KS"
        [ -f "$BENCH_OUT/kernels-$KS.json" ] && PICK='attention prefill' step "kernel lab torch $KS" 150 "$PY" "$HERE/kernel_lab.py" "$BENCH_OUT/kernels-$KS.json" --min-ms 50 --out "$WORK/raw/kernel-lab-$KS.json"
    done
fi

# ---------------------------------------------------------------- the table, last
python3 "$HERE/summarize.py" --work "$WORK" --out "$OUT" --bench-model "$BENCH_DIR" --backend "$BACKEND" >"$WORK/raw/summary.out" 2>&1
SUM_RC=$?
cat "$WORK/raw/summary.out" >>"$LOG"
echo
cat "$WORK/raw/summary.out"
FAILED=$(awk -F'\t' '$2 != 0' "$STEPS" | wc -l)
echo "check: $(awk -F'\t' '$2 == 0' "$STEPS" | wc -l) steps ok, $FAILED failed or skipped, $(elapsed) s; logs in $OUT"
[ "$FAILED" -eq 0 ] && [ $SUM_RC -eq 0 ]
