#!/usr/bin/env bash
# gpu/check.sh OUT_DIR — the whole GPU check in one call (docs/gpu-check.md).
#
# Prints the machine (date, GPU, driver, glibc, commit), finds libnvrtc, then: the op suite on
# the backend, random models made here by our binary, whole-model compares against the reference
# backend (and HF transformers), the two ceilings (copy bandwidth, bf16 matmul), and benchmarks
# held against their floors and against HF transformers on the same GPU (issue 14 item 8);
# summarize.py writes every figure it measured into latest.json (docs/gpu/latest.json). Everything runs with the backend's default KV cache
# (bf16 on cuda); one compare repeats the tiny bf16 model with an f32 cache (the f32 kernels).
# The benchmarks' reports say which element size they stored; summarize.py counts KV bytes by it. Every step has its own timeout, a failed step does not
# stop the next, and the whole run keeps inside TANDEM_CHECK_BUDGET_S. OUT_DIR holds five files:
# check.log (every step's output), summary.txt, results.json, latest.json and check-files.tar.gz
# (the compares' and HF's JSON, the raw bench reports, each step's log); a device call returns
# at most 8 (gpu/lib.sh). A short table is printed last, with every latest.json field beside
# its target. On the fake driver (TANDEM_FAKE_CUDA=1, `cargo xtask gpu-rehearsal`) latest.json
# says so: it is never a measurement.
#
# Runs from the bundle (`cargo xtask gpu-bundle`: tandem, *.py, check.sh, COMMIT, kernels/) or
# from gpu/ in a checkout (binary from TANDEM_BIN or target/release/tandem).
#
# Settings (environment):
#   TANDEM_CHECK_BACKEND     cuda (default), wgpu or reference: the latter two are dry runs
#   TANDEM_CHECK_BENCH_SHAPE llama-3.2-1b (default); a small shape for dry runs
#   TANDEM_CHECK_SMALL=1     dry run sizes: fewer compare steps, tiny benchmarks
#   TANDEM_CHECK_SMALL=2     rehearsal sizes (the fake driver, `cargo xtask gpu-rehearsal`): as 1,
#                            with the fewest tokens each benchmark and lab case can take
#   TANDEM_CHECK_BUDGET_S    seconds for all steps together (default 480: one 10-minute call
#                            of 600 s, less the machine's start-up and the summary, with margin)
#   TANDEM_CHECK_GROUPS      comma list of step groups to run (default all): correctness,
#                            decode, peers, kernels, compare, serve (models and ceilings always)
#   TANDEM_CHECK_HF_COMPILE  1 (default; 0 in dry runs): torch.compile in the HF batch-1 peer
#   TANDEM_CHECK_HF_MAX_BATCHES  run only the first N of HF's static batches (default 0: all)
#   TANDEM_CHECK_WORK        scratch folder for models and raw outputs (default /tmp/tandem-check)
#   TANDEM_CHECK_PYTHON      python with torch + transformers (default python3); without them
#                            the steps that need them are skipped, and say why
#   TANDEM_CHECK_OPS         only the op suite's cases matching this (`test-ops --op`; default all)
#   TANDEM_OPS_SEED          the op suite's seed (default 1, pinned: gpu/lib.sh)
#   TANDEM_CHECK_CUDA_TESTS  the GPU-only test filters (default gpu_invariance:: graphs::
#                            launches:: staging:: moe:: cublaslt:: quant:: fp8:: int4:: lora::)
#   TANDEM_GOLDEN_DIR        the golden files the int4 and LoRA CUDA tests read (default: the
#                            tests/golden of the tree the bundle sits in, else of the working
#                            directory; the test binary's built-in path is the build machine's)
#   TANDEM_CHECK_FAMILIES    the model families compared (default tiny-qwen3 tiny-qwen3-moe
#                            tiny-mistral tiny-gemma3)
#   TANDEM_CHECK_SMOL        0 skips the smollm2-135m compare (default 1)
#   TANDEM_CHECK_COMPARE_ARGS  extra `tandem compare` arguments (rehearsals: fewer prompts and steps)
#   TANDEM_KERNEL_DIR        passed through: kernel sources to use instead of the built-in ones
#   TANDEM_PTX_CACHE         the kernel cache (default WORK/ptx-cache; the rehearsal passes the
#                            fake driver's, so NVRTC does not compile every kernel again)

set -u
OUT=${1:?usage: check.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
BACKEND=${TANDEM_CHECK_BACKEND:-cuda}
BENCH_SHAPE=${TANDEM_CHECK_BENCH_SHAPE:-llama-3.2-1b}
SMALL=${TANDEM_CHECK_SMALL:-0}
BUDGET=${TANDEM_CHECK_BUDGET_S:-480}
GROUPS_=${TANDEM_CHECK_GROUPS:-all}
WORK=${TANDEM_CHECK_WORK:-/tmp/tandem-check}
PY=${TANDEM_CHECK_PYTHON:-python3}
export PYTHONUNBUFFERED=1
export RUST_LOG=${RUST_LOG:-info}
export TANDEM_PTX_CACHE=${TANDEM_PTX_CACHE:-$WORK/ptx-cache}
# The bundle's cubins for sm_90, compiled by the same NVRTC version (the cache key holds it),
# so the first process skips NVRTC and the driver's JIT (over 120 s on a fresh H200).
if [ -d "$HERE/ptx-cache" ]; then mkdir -p "$TANDEM_PTX_CACHE" && cp -n "$HERE"/ptx-cache/* "$TANDEM_PTX_CACHE"/ 2>/dev/null; fi

BIN=${TANDEM_BIN:-}
for b in "$HERE/tandem" "$HERE/../target/release/tandem"; do
    [ -z "$BIN" ] && [ -x "$b" ] && BIN=$b
done
BIN=${BIN:-$HERE/tandem}

# begin_run, say, elapsed, step, cuda_libs and golden_dir: gpu/lib.sh, shared with tune.sh.
. "$HERE/lib.sh"
begin_run "$OUT/check.log" check-files

# ---------------------------------------------------------------- the machine
{
    echo "tandem GPU check, backend $BACKEND, bench shape $BENCH_SHAPE, budget ${BUDGET}s"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -a)"
    echo "commit: $(cat "$HERE/COMMIT" 2>/dev/null || git -C "$HERE" rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "binary: $BIN"
    echo "glibc: $(ldd --version 2>&1 | head -n 1)"
    echo "cpus: $(nproc), memory: $(free -g 2>/dev/null | awk '/Mem:/ {print $2 " GiB"}')"
    echo "python: $(tmo 20 "$PY" --version 2>&1), torch: $(tmo 60 "$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>&1 | tail -n 1)"
    if [ "${TANDEM_FAKE_CUDA:-0}" = 1 ]; then
        # crates/fake-cuda: every kernel runs on the CPU emulator. summarize.py marks
        # latest.json as the fake's, so it is never taken for a measurement.
        printf 'fake_driver\t1\n'
    fi
    if command -v nvidia-smi >/dev/null; then
        # A hung GPU can hang nvidia-smi too: bounded, like every step.
        tmo 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv 2>&1
        tmo 30 nvidia-smi 2>&1
    else
        echo "nvidia-smi: not found"
    fi
} >"$WORK/raw/env.txt" 2>&1
cat "$WORK/raw/env.txt" >>"$LOG"
head -n 9 "$WORK/raw/env.txt"

cuda_libs
golden_dir

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
WANT_SMOL=${TANDEM_CHECK_SMOL:-1}
[ "$WANT_SMOL" = 1 ] && gen smollm2-135m bf16 "$SMOL" 60
# The other families (issue 26): Qwen3 (q/k norms), Qwen3-MoE (the routed experts), Mistral with
# a sliding window of 16 keys, Gemma 3 (GeGLU, sandwich norms, a sliding and a global layer).
FAMILIES=${TANDEM_CHECK_FAMILIES-tiny-qwen3 tiny-qwen3-moe tiny-mistral tiny-gemma3}
for fam in $FAMILIES; do gen "$fam" bf16 "$WORK/models/$fam-bf16" 30; done

# ---------------------------------------------------------------- correctness
# want GROUP: whether TANDEM_CHECK_GROUPS (default all) names it; a second call can rerun parts.
want() { [ "$GROUPS_" = all ] || [[ ",$GROUPS_," == *",$1,"* ]]; }
if want correctness; then
OPS_FILTER=(); [ -n "${TANDEM_CHECK_OPS:-}" ] && OPS_FILTER=(--op "$TANDEM_CHECK_OPS")
if ! step "test-ops $BACKEND" 150 "$BIN" test-ops --backend "$BACKEND" --seed "$OPS_SEED" "${OPS_FILTER[@]}"; then
    # Rerun each failing op (up to 3) with a synchronize after every launch, so an
    # asynchronous fault is reported against the kernel that caused it.
    TL="$WORK/logs/test-ops_$BACKEND.log"
    OPS=$(grep -E ' FAIL ' "$TL" | awk '{print $1}' | sort -u | head -n 3)
    for op in $OPS; do
        step "test-ops $op SYNC=1" 60 env TANDEM_CUDA_SYNC=1 "$BIN" test-ops --backend "$BACKEND" --op "$op" --seed "$OPS_SEED"
    done
    # No FAIL line: the suite died (a fault, a panic, the timeout); the whole suite again, synced.
    [ -z "$OPS" ] && step "test-ops $BACKEND SYNC=1" 120 env TANDEM_CUDA_SYNC=1 "$BIN" test-ops --backend "$BACKEND" --seed "$OPS_SEED" "${OPS_FILTER[@]}"
fi

# The CUDA crate's GPU-only tests (they skip on a machine without a GPU, so only here do they
# run): bitwise batch invariance of matmul rows and attention, graphs vs eager, launches per
# layer, fused norms and 16-bit activations bitwise, the metadata staging, the routed experts'
# bits against every expert's (the MoE default), the quantized models (Q8_0, FP8, int4) against
# the reference and HF's goldens, LoRA against peft's. TANDEM_REQUIRE_CUDA=1
# turns a skip into a failure; one test at a time, so each holds the GPU alone.
# shellcheck disable=SC2206  # the filters are words
CUDA_TESTS=(${TANDEM_CHECK_CUDA_TESTS:-gpu_invariance:: graphs:: launches:: staging:: moe:: cublaslt:: quant:: fp8:: int4:: lora::})
if [ "$BACKEND" = cuda ] && [ -x "$HERE/cuda-tests" ]; then
    PICK='test result|panicked|FAILED' step "cuda tests (GPU-only)" 180 env TANDEM_REQUIRE_CUDA=1 "$HERE/cuda-tests" --test-threads 1 "${CUDA_TESTS[@]}"
elif [ "$BACKEND" = cuda ]; then
    printf 'cuda tests (GPU-only)\t125\t0\tskipped: no cuda-tests beside check.sh (cargo xtask gpu-bundle builds it)\n' >>"$STEPS"
fi

# Dry runs on a CPU adapter: the 135M model's compare shrinks to fit a few minutes.
SMOL_ARGS=(--steps 16)
[ "$SMALL" != 0 ] && SMOL_ARGS=(--steps 8 --prompts 3 --batch 8)
# shellcheck disable=SC2206  # the arguments are words
CMP_EXTRA=(${TANDEM_CHECK_COMPARE_ARGS:-})
# hf_compare.py needs torch + transformers in $PY; without them its steps say so and skip.
HAVE_HF=$(tmo 120 "$PY" -c 'import torch, transformers; print(1)' 2>/dev/null | tail -n 1)
# hf_compare_of NAME MODEL: HF transformers against compare-NAME.json's ids, if that was written.
hf_compare_of() {
    if [ ! -s "$EXTRA/compare-$1.json" ]; then
        printf 'hf_compare %s\t125\t0\tskipped: tandem compare wrote no compare-%s.json\n' "$1" "$1" >>"$STEPS"
    elif [ "$HAVE_HF" != 1 ]; then
        printf 'hf_compare %s\t125\t0\tskipped: no torch + transformers in %s\n' "$1" "$PY" >>"$STEPS"
    else
        step "hf_compare $1" "$3" "$PY" "$HERE/hf_compare.py" --model "$2" --ids-json "$EXTRA/compare-$1.json" --out "$EXTRA/hf-$1.json"
    fi
}
step "compare $BACKEND tiny bf16" 90 "$BIN" compare --backend "$BACKEND" --model "$TINY" "${CMP_EXTRA[@]}" --json "$EXTRA/compare-tiny.json"
step "compare $BACKEND tiny bf16, f32 KV" 90 "$BIN" compare --backend "$BACKEND" --model "$TINY" --kv-cache-dtype f32 "${CMP_EXTRA[@]}" --json "$EXTRA/compare-tiny-f32kv.json"
step "compare $BACKEND tiny f32" 90 "$BIN" compare --backend "$BACKEND" --model "$TINY32" "${CMP_EXTRA[@]}"
if [ "$WANT_SMOL" = 1 ]; then
    step "compare $BACKEND smollm2-135m" 200 "$BIN" compare --backend "$BACKEND" --model "$SMOL" "${SMOL_ARGS[@]}" "${CMP_EXTRA[@]}" --json "$EXTRA/compare-smollm2.json"
fi
hf_compare_of tiny "$TINY" 150
# Each family against the reference, then its ids and logprobs against HF transformers here.
for fam in $FAMILIES; do
    FDIR=$WORK/models/$fam-bf16
    step "compare $BACKEND $fam" 60 "$BIN" compare --backend "$BACKEND" --model "$FDIR" "${CMP_EXTRA[@]}" --json "$EXTRA/compare-$fam.json"
    hf_compare_of "$fam" "$FDIR" 90
done
fi # want correctness

# ---------------------------------------------------------------- ceilings and benchmarks
# Most important first (issue 14 item 8): correctness above, then our decode at batch 1 and 64,
# then the peers (HF transformers on this GPU), then the rest. The GPU seconds beside each step
# are ESTIMATES for the H200 at the speeds of the 2026-11-29 run (decode b=1 404 tok/s, prefill
# ~7.4k tok/s, b=64 ~1.1k out tok/s), not measurements; a faster engine shortens ours. NEED=S
# skips a step that would start with less than S seconds of the budget left, rather than
# starting it only to be killed with nothing written (docs/gpu-check.md, "Budget").
if [ "$HAVE_HF" != 1 ] && ! tmo 60 "$PY" -c 'import torch' 2>/dev/null; then
    printf 'ceilings\t125\t0\tskipped: no torch in %s (no floors)\n' "$PY" >>"$STEPS"
elif [ "$SMALL" != 0 ]; then
    step "ceilings" 120 "$PY" "$HERE/ceilings.py" --copy-mib 64 --n 1024 --reps 5 --allow-cpu
else
    step "ceilings" 120 "$PY" "$HERE/ceilings.py"                                          # ~10 s
fi
grep -E '^\{' "$WORK/logs/ceilings.log" 2>/dev/null | tail -n 1 >"$WORK/raw/ceilings.json"

wait "$GEN_PID"
BENCH_OUT=$WORK/raw/bench
# HF transformers' scripts: beside this one in the bundle, in bench/ in a checkout.
HFDIR=$HERE
[ -f "$HFDIR/hf_baseline.py" ] || HFDIR=$HERE/../bench
HF_CUDA=$(tmo 120 "$PY" -c 'import torch, transformers; print(int(torch.cuda.is_available()))' 2>/dev/null | tail -n 1)
# hf_skip NAME...: records why a peer step did not run (no torch, or no GPU outside a dry run).
hf_skip() {
    local why=
    if [ -z "$HF_CUDA" ]; then why="no torch + transformers in $PY"
    elif [ "$HF_CUDA" != 1 ] && [ "$SMALL" = 0 ]; then why="torch sees no CUDA device (HF peers run on the CPU only in dry runs)"
    fi
    [ -z "$why" ] && return 1
    for n in "$@"; do printf '%s\t125\t0\tskipped: %s\n' "$n" "$why" >>"$STEPS"; done
    say "HF peers skipped: $why"
    return 0
}
if [ "$SMALL" != 0 ]; then
    DEC1=(--prompt-len 64 --max-tokens 16 --batch-sizes 1,64 --runs 2 --max-num-batched-tokens 1024)
    DEC1E=(--prompt-len 64 --max-tokens 16 --batch-sizes 1 --runs 1 --max-num-batched-tokens 1024)
    DEC2=(--prompt-len 64 --max-tokens 16 --batch-sizes 8,256 --runs 2 --max-num-batched-tokens 2048)
    # tiny's context is 2048 tokens, so no 2048-token prompt: prefill_2048_frac stays absent.
    PRE=(--prompt-len 1024 --max-tokens 2 --runs 2 --max-num-batched-tokens 1024)
    MIX=(--num-prompts 16 --min-len 16 --max-len 64 --min-output-len 16 --max-output-len 32 --max-num-seqs 16 --num-kv-blocks 128)
    HF_BATCH=4
    HFB1=(--prompt-len 64 --max-tokens 16 --runs 2)
    CMP_ARGS=(--min-len 16 --max-len 64 --min-output-len 16 --max-output-len 32 --num-kv-blocks 256)
    CMPS=(4 2 8)
    SRV=(--input-len 64 --output-len 16 --num-prompts 16 --max-concurrency 8 --max-num-seqs 8 --num-kv-blocks 128)
else
    DEC1=(--prompt-len 512 --max-tokens 128 --batch-sizes 1,64 --runs 3 --max-num-batched-tokens 2048)
    DEC1E=(--prompt-len 512 --max-tokens 128 --batch-sizes 1 --runs 2 --max-num-batched-tokens 2048)
    DEC2=(--prompt-len 512 --max-tokens 128 --batch-sizes 8,256 --runs 2 --max-num-batched-tokens 2048)
    PRE=(--prompt-len 2048 --max-tokens 2 --runs 3 --max-num-batched-tokens 2048)
    # The peer workload: 256 requests, prompts uniform in 16..=1024, outputs in 16..=512, all
    # submitted at once (continuous batching decides); HF runs them as static batches of 64.
    MIX=(--num-prompts 256 --min-len 16 --max-len 1024 --min-output-len 16 --max-output-len 512 --max-num-seqs 256 --max-num-batched-tokens 4096)
    HF_BATCH=64
    HFB1=(--prompt-len 512 --max-tokens 128 --runs 3)
    # Static vs continuous: 2 x C requests at concurrency C (two static waves: the least that
    # shows what a static batch waits for), prompts 16..=512, outputs 16..=256. Half the peer
    # workload's lengths so that C = 100 fits the budget; the ratio follows the spread of the
    # output lengths, uniform from 16 in both.
    CMP_ARGS=(--min-len 16 --max-len 512 --min-output-len 16 --max-output-len 256 --max-num-batched-tokens 4096)
    CMPS=(100 50 200)
    SRV=(--input-len 512 --output-len 128 --num-prompts 128 --max-concurrency 64 --max-num-seqs 64 --max-num-batched-tokens 2048)
fi
if [ "$SMALL" = 2 ]; then
    # The fake driver runs every CUDA thread on the CPU: a handful of tokens per benchmark.
    DEC1=(--prompt-len 16 --max-tokens 4 --batch-sizes 1,4 --runs 1 --max-num-batched-tokens 256)
    DEC1E=(--prompt-len 16 --max-tokens 4 --batch-sizes 1 --runs 1 --max-num-batched-tokens 256)
    DEC2=(--prompt-len 16 --max-tokens 4 --batch-sizes 8 --runs 1 --max-num-batched-tokens 256)
    PRE=(--prompt-len 64 --max-tokens 2 --runs 1 --max-num-batched-tokens 256)
fi
HF_COMPILE=${TANDEM_CHECK_HF_COMPILE:-$([ "$SMALL" != 0 ] && echo 0 || echo 1)}
HF_MAX_BATCHES=${TANDEM_CHECK_HF_MAX_BATCHES:-0}
if "$BIN" bench --help >/dev/null 2>&1; then
    BM=(--backend "$BACKEND" --model "$BENCH_DIR")
    if want decode; then
        # ~25 s: prefill of 64 x 512 tokens untimed, then 3 x (b=1 and b=64, 127 steps each).
        NEED=30 PICK='decode tok/s' step "bench decode b1,b64 $BENCH_SHAPE" 150 "$BIN" bench decode "${BM[@]}" "${DEC1[@]}" --output-dir "$BENCH_OUT" --name decode
        # ~8 s: batch 1 again without CUDA graphs (--enforce-eager): what the graphs above buy.
        NEED=15 PICK='decode tok/s' step "bench decode b1 eager $BENCH_SHAPE" 90 "$BIN" bench decode "${BM[@]}" "${DEC1E[@]}" --enforce-eager --output-dir "$BENCH_OUT" --name decode-eager
        # ~10 s: 3 prefills of 2048 tokens (one forward each) plus a load.
        NEED=15 PICK='prefill tok/s' step "bench prefill 2048 $BENCH_SHAPE" 90 "$BIN" bench decode "${BM[@]}" "${PRE[@]}" --output-dir "$BENCH_OUT" --name prefill
    fi
    # Ours on the mixed workload only serves the ratio to HF: it is skipped with HF.
    if want peers && ! hf_skip "hf generate b1 static+compile" "bench mixed $BENCH_SHAPE" "hf mixed static b$HF_BATCH"; then
        # ~90 s, mostly torch.compile of the decode step (reported apart as compile_s).
        HFC=(); [ "$HF_COMPILE" = 1 ] || HFC=(--no-compile)
        NEED=60 PICK='^hf generate run' step "hf generate b1 static+compile" 200 "$PY" "$HFDIR/hf_generate.py" --model "$BENCH_DIR" "${HFB1[@]}" "${HFC[@]}"
        grep -E '^\{' "$WORK/logs/hf_generate_b1_static_compile.log" | tail -n 1 >"$WORK/raw/hf-b1.json"
        # Ours on the mixed workload, ~80 s (256 requests, ~67k output tokens); it leaves the
        # exact prompts for HF.
        NEED=45 PICK='^\| tandem' step "bench mixed $BENCH_SHAPE" 200 "$BIN" bench throughput "${BM[@]}" --workload mixed "${MIX[@]}" --warmup 2 --timeout-s 190 --write-prompts "$WORK/raw/mixed-prompts.json" --output-dir "$BENCH_OUT" --name mixed
        if [ -s "$WORK/raw/mixed-prompts.json" ]; then
            # ~60 s: 4 static batches of 64, each up to 1024 + 512 tokens (padded, waiting for
            # its longest). A JSON line per finished batch, so a timeout keeps what finished.
            NEED=30 PICK='^hf batch' step "hf mixed static b$HF_BATCH" 150 "$PY" "$HFDIR/hf_baseline.py" --model "$BENCH_DIR" --prompts-file "$WORK/raw/mixed-prompts.json" --batch-size "$HF_BATCH" --max-batches "$HF_MAX_BATCHES"
            grep -E '^\{' "$WORK/logs/hf_mixed_static_b$HF_BATCH.log" | tail -n 1 >"$WORK/raw/hf-mixed.json"
        else
            printf 'hf mixed static b%s\t125\t0\tskipped: bench mixed wrote no prompts\n' "$HF_BATCH" >>"$STEPS"
        fi
    fi
else
    printf 'bench\t125\t0\tskipped: this tandem binary has no bench subcommand\n' >>"$STEPS"
fi

# The kernel lab (issue 13): each GEMM and attention kernel at the Llama shapes, against the
# ceilings just measured, then the same cases through torch (cuBLAS, SDPA) on this GPU.
# ~40 s for the 1B shape with its torch half; the 8B one comes last.
kernel_lab() { # kernel_lab SHAPE...
    "$BIN" bench kernels --help >/dev/null 2>&1 || return 0
    want kernels || return 0
    read -r BW PK < <(python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); print(c.get("copy_gbps") or 0, c.get("matmul_tflops") or 0)' "$WORK/raw/ceilings.json" 2>/dev/null || echo "0 0")
    local CEIL=() LAB KS
    [ "${BW%.*}" -gt 0 ] 2>/dev/null && CEIL+=(--bandwidth-gbs "$BW")
    [ "${PK%.*}" -gt 0 ] 2>/dev/null && CEIL+=(--peak-tflops "$PK")
    local TORCH_CPU=()
    if [ "$SMALL" != 0 ]; then LAB=(--m 1,64 --attn-batch 1,8 --attn-context 256 --attn-prefill 128 --min-ms 20); TORCH_CPU=(--allow-cpu); else LAB=(--min-ms 100); fi
    [ "$SMALL" = 2 ] && LAB=(--m 1,16 --attn-batch 1 --attn-context 64 --attn-prefill 32 --sample-batch 1 --min-ms 1)
    for KS in "$@"; do
        NEED=20 PICK='attention prefill' step "kernel lab $KS" 150 "$BIN" bench kernels --backend "$BACKEND" --shape "$KS" "${LAB[@]}" "${CEIL[@]}" --output-dir "$BENCH_OUT" --name "kernels-$KS"
        if [ "$HAVE_HF" != 1 ]; then
            printf 'kernel lab torch %s\t125\t0\tskipped: no torch + transformers in %s\n' "$KS" "$PY" >>"$STEPS"
        elif [ -f "$BENCH_OUT/kernels-$KS.json" ]; then
            NEED=20 PICK='attention prefill' step "kernel lab torch $KS" 150 "$PY" "$HERE/kernel_lab.py" "$BENCH_OUT/kernels-$KS.json" --min-ms 50 "${TORCH_CPU[@]}" --out "$WORK/raw/kernel-lab-$KS.json"
        fi
    done
}
if [ "$SMALL" != 0 ]; then kernel_lab tiny; else kernel_lab llama-3.2-1b; fi

# compare_at C: static against continuous at concurrency C, 2 x C requests (`tandem bench compare`).
compare_at() {
    want compare || return 0
    "$BIN" bench --help >/dev/null 2>&1 || return 0
    # ~40 s at C = 100 (two static waves of 100 waiting for outputs of up to 256 tokens, then
    # the same work continuously, 4 model loads); ~25 s at 50, ~70 s at 200.
    NEED=$(( $1 * 3 / 10 + 10 )) PICK='^\| [0-9]' step "bench compare c$1 $BENCH_SHAPE" $(( $1 * 2 + 60 )) "$BIN" bench compare "${BM[@]}" "${CMP_ARGS[@]}" --concurrency "$1" --num-prompts $(( $1 * 2 )) --warmup 1 --timeout-s $(( $1 * 2 + 40 )) --output-dir "$BENCH_OUT" --name "compare-c$1"
}
compare_at "${CMPS[0]}"
if "$BIN" bench --help >/dev/null 2>&1 && want serve; then
    # ~25 s: a spawned `tandem serve`, 128 streamed requests of 512 + 128 tokens, 64 in flight.
    NEED=25 PICK='^\| [0-9]' step "bench serve c64 $BENCH_SHAPE" 150 "$BIN" bench serve --spawn "${BM[@]}" --workload random "${SRV[@]}" --startup-timeout-s 60 --timeout-s 120 --output-dir "$BENCH_OUT" --name serve
fi
if "$BIN" bench --help >/dev/null 2>&1 && want decode; then
    # ~50 s: prefill of 256 x 512 tokens untimed, then 2 x (b=8 and b=256, 127 steps each).
    NEED=45 PICK='decode tok/s' step "bench decode b8,b256 $BENCH_SHAPE" 150 "$BIN" bench decode "${BM[@]}" "${DEC2[@]}" --output-dir "$BENCH_OUT" --name decode-big
fi
compare_at "${CMPS[1]}"
compare_at "${CMPS[2]}"
[ "$SMALL" != 0 ] || kernel_lab llama-3.1-8b

# ---------------------------------------------------------------- the table, last
tmo 120 python3 "$HERE/summarize.py" --work "$WORK" --out "$OUT" --compares "$EXTRA" --bench-model "$BENCH_DIR" --backend "$BACKEND" >"$WORK/raw/summary.out" 2>&1
SUM_RC=$?
cat "$WORK/raw/summary.out" >>"$LOG"
pack_run
echo
cat "$WORK/raw/summary.out"
FAILED=$(awk -F'\t' '$2 != 0 && $2 != 125' "$STEPS" | wc -l)
SKIPPED=$(awk -F'\t' '$2 == 125' "$STEPS" | wc -l)
echo "check: $(awk -F'\t' '$2 == 0' "$STEPS" | wc -l) steps ok, $FAILED failed, $SKIPPED skipped, $(elapsed) s; files in $OUT"
[ "$FAILED" -eq 0 ] && [ $SUM_RC -eq 0 ]
