#!/usr/bin/env bash
# gpu/tune.sh OUT_DIR — a tuning round on the lent GPU, in one call, after check.sh has run in
# an earlier call or session (docs/gpu-check.md, "Tuning rounds"). Correctness of the kernel
# variants first, then their timings side by side, then Nsight Compute on the GEMM kernels the
# kernel lab found slow. Variants are picked per process by environment
# (TANDEM_CUDA_GEMM_LARGE for m > 128, _MID for 17..128 rows, _SMALL for up to 16:
# crates/cuda/src/matmul.rs `GemmVariants`); each gives the defaults' bits (kernels/emu), and
# the op suite and the GPU-only tests here confirm it on the hardware.
#
# Settings: TANDEM_TUNE_BUDGET_S (default 300: fits one call with the machine's start inside
# the session's 15 minutes after a check), TANDEM_TUNE_VARIANTS (space-separated
# LARGE:MID:SMALL, default "m128_occ2:m64_occ4:m16 m128_occ2:m64_occ4:m16_gemv4
# m128_occ2:m64_occ4:m16_gemv8 m128_occ2:m64_occ4:m16_x1": the defaults, then the decode
# variants of issue 25 item 1 beside them; the round of 2026-12-04 timed m128, m128_n128, m64,
# m16_s8), and wgmma:m64_occ4:m16 (LARGE=wgmma is kernels/matmul_sm90.cu, wgmma + TMA, sm_90
# only: its bits equal the mma.sync kernels' in the emulator only; the "cuda tests [wgmma:...]"
# step is the hardware's bitwise check: gpu_invariance's m = 300 rows, wgmma, against the same
# rows alone and at m <= 128, mma.sync; the plain GEMM in matmul_rows_do_not_depend_on_the_batch,
# the silu and residual epilogues in fused_gemm_rows_do_not_depend_on_the_batch; every prefill
# projection above 128 rows, fused epilogues included, takes wgmma with the switch), and
# m128_w64:m64_occ4:m16 (LARGE=m128_w64: the mma.sync large-m loop with 64 x 64 warp tiles and
# addresses worked out once, ~2.3 SASS instructions per mma against m128_occ2's ~9.5; same bits),
# wgmma_ws:m64_occ4:m16 (LARGE=wgmma_ws: the persistent warp-specialised wgmma kernels, one block
# an SM walking tiles, 128 x 256 tiles where a GEMM has one K slice; same bits in the emulator),
# TANDEM_TUNE_SAMPLERS (SAMPLER:ARGMAX pairs, default "bisect:one radix:multi multi:multi"),
# TANDEM_TUNE_ATTN_VARIANTS (space-separated TANDEM_CUDA_ATTENTION values, default "tc tc_deep
# tc_shared wgmma": the decode attention timed side by side at ctx 1024/4096/16384 and batch 1/8/64,
# head_dim 64 and 128, each row's fraction of the copy floor (tc_shared's and wgmma's decodes
# are tc's: not timed again), and the prefill attention (512 and 2048 tokens) beside torch SDPA;
# the non-default ones also pass the op suite and the GPU-only tests first; wgmma is
# kernels/paged_attention_sm90.cu, prefill on wgmma, sm_90 only, tc's bits in the emulator only:
# its "cuda tests [attn wgmma]" step is the hardware's bitwise check against tc, and its op
# suite also runs the head_dim-256 cases with TANDEM_CUDA_ATTENTION_D256=tc),
# TANDEM_TUNE_ATTN_D256_VARIANTS (TANDEM_CUDA_ATTENTION_D256 values, default "partial tc": the
# head_dim-256 attention, Gemma 3 1B's shape, timed the same way; tc passes the op suite's
# head_dim-256 cases first), TANDEM_TUNE_BW_GBS (the copy floor, GB/s; default: check.sh's
# ceilings.json, else 4200),
# TANDEM_TUNE_PDL=0 to skip programmatic dependent launch (TANDEM_CUDA_PDL=1: its GPU-only tests
# and compare, then decode b1 / b64 with it off and on, one after the other),
# TANDEM_TUNE_NCU=0 to skip ncu, TANDEM_TUNE_MOE=0 to skip the mixture-of-experts paths
# (TANDEM_CUDA_MOE=routed against dense: tiny-qwen3-moe compared on both, then decode b1 / b64
# and prefill 2048 timed on qwen3-30b-a3b-2l, Qwen3-30B-A3B's layer in 2 layers).
# TANDEM_TUNE_SMALL=1: rehearsal sizes (`cargo xtask gpu-rehearsal` on the fake driver): the
# tiny shape everywhere, short prompts and contexts, one run each; TANDEM_TUNE_OPS: only the op
# suite's cases matching this; TANDEM_TUNE_COMPARE_ARGS: more `tandem compare` arguments (the
# rehearsal's fewer prompts and steps); TANDEM_TUNE_CUDA_TESTS: the GPU-only test filters of each variant
# (default gpu_invariance:: graphs:: launches::; TANDEM_GOLDEN_DIR as for check.sh); TANDEM_OPS_SEED: the op suite's seed (pinned,
# gpu/lib.sh). Every step has its own timeout: a hang costs that step, and the table says
# TIMEOUT beside it.
# Writes OUT_DIR/tune.log (everything), OUT_DIR/tune.tsv (one row per variant and case) and
# OUT_DIR/tune-files.tar.gz (ncu-*.txt, each step's log, the raw reports): three files, so that
# a call that ran check.sh first returns eight (gpu/lib.sh); prints the table last.

set -u
OUT=${1:?usage: tune.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
BUDGET=${TANDEM_TUNE_BUDGET_S:-300}
VARIANTS=${TANDEM_TUNE_VARIANTS:-"m128_occ2:m64_occ4:m16 m128_occ2:m64_occ4:m16_gemv4 m128_occ2:m64_occ4:m16_gemv8 m128_occ2:m64_occ4:m16_x1 wgmma:m64_occ4:m16 wgmma_ws:m64_occ4:m16 m128_w64:m64_occ4:m16"}
ATTN_VARIANTS=${TANDEM_TUNE_ATTN_VARIANTS:-"tc tc_deep tc_shared wgmma"}
ATTN_D256_VARIANTS=${TANDEM_TUNE_ATTN_D256_VARIANTS:-"partial tc"}
WORK=${TANDEM_CHECK_WORK:-/tmp/tandem-check}
PY=${TANDEM_CHECK_PYTHON:-python3}
BIN=${TANDEM_BIN:-$HERE/tandem}
export PYTHONUNBUFFERED=1 RUST_LOG=${RUST_LOG:-info}
export TANDEM_PTX_CACHE=${TANDEM_PTX_CACHE:-$WORK/ptx-cache}
SMALL=${TANDEM_TUNE_SMALL:-0}
if [ "$SMALL" = 1 ]; then
    SHAPE=tiny; SHAPE_8B=tiny; MOE_SHAPE=tiny-qwen3-moe
    LAB_M=1,16; MIN_MS=1; AB=1,4; ACTX=64; APRE=32; SB=1,4
    PRE=(--prompt-len 64 --max-tokens 2 --runs 1 --max-num-batched-tokens 256)
    DEC=(--prompt-len 16 --max-tokens 4 --batch-sizes 1,4 --runs 1 --max-num-batched-tokens 256)
else
    SHAPE=llama-3.2-1b; SHAPE_8B=llama-3.1-8b; MOE_SHAPE=qwen3-30b-a3b-2l
    LAB_M=1,64,256,2048; MIN_MS=50; AB=1,8,64; ACTX=1024,4096,16384; APRE=512,2048; SB=1,64
    PRE=(--prompt-len 2048 --max-tokens 2 --runs 2 --max-num-batched-tokens 2048)
    DEC=(--prompt-len 512 --max-tokens 64 --batch-sizes 1,64 --runs 2 --max-num-batched-tokens 2048)
fi
OPS_FILTER=(); [ -n "${TANDEM_TUNE_OPS:-}" ] && OPS_FILTER=(--op "$TANDEM_TUNE_OPS")
# shellcheck disable=SC2206  # the arguments are words
CMP_EXTRA=(${TANDEM_TUNE_COMPARE_ARGS:-})
# shellcheck disable=SC2206  # the filters are words
CUDA_TESTS=(${TANDEM_TUNE_CUDA_TESTS:-gpu_invariance:: graphs:: launches::})
. "$HERE/lib.sh"
# check.sh's ceilings (the copy floor below), kept across begin_run, which empties raw/.
CEIL_JSON=$(cat "$WORK/raw/ceilings.json" 2>/dev/null)
begin_run "$OUT/tune.log" tune-files
[ -n "$CEIL_JSON" ] && echo "$CEIL_JSON" >"$WORK/raw/ceilings.json"
# gpu/kernel_lab.py (torch SDPA beside ours) needs torch in $PY; without it those steps are left out.
HAVE_TORCH=$(tmo 120 "$PY" -c 'import torch; print(1)' 2>/dev/null | tail -n 1)
mkdir -p "$TANDEM_PTX_CACHE"
[ -d "$HERE/ptx-cache" ] && cp -n "$HERE"/ptx-cache/* "$TANDEM_PTX_CACHE"/ 2>/dev/null

{
    echo "tandem tuning round, budget ${BUDGET}s, variants: $VARIANTS"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ), commit: $(cat "$HERE/COMMIT" 2>/dev/null || echo unknown)"
    [ "${TANDEM_FAKE_CUDA:-0}" = 1 ] && echo "FAKE DRIVER (crates/fake-cuda): a rehearsal; every timing below is the CPU emulator's, not a measurement"
    command -v nvidia-smi >/dev/null && tmo 30 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader 2>&1
} | tee -a "$LOG"
: >"$WORK/raw/env.txt"
cuda_libs
golden_dir

BENCH_DIR=$WORK/models/bench-$SHAPE-bf16
TINY=$WORK/models/tiny-bf16
GEN_PID=
if [ ! -e "$BENCH_DIR/config.json" ]; then
    rm -rf "$BENCH_DIR"
    step "gen-model bench $SHAPE" 150 "$BIN" gen-model --shape "$SHAPE" --seed 1 --dtype bf16 --out "$BENCH_DIR" &
    GEN_PID=$!
fi
[ -e "$TINY/config.json" ] || step "gen-model tiny" 30 "$BIN" gen-model --shape tiny --seed 1 --dtype bf16 --out "$TINY"

# 1. Correctness of every variant on the hardware: the op suite (the first run also times the
#    process's first start: NVRTC from the bundle's cache, the driver's JIT) and the GPU-only
#    tests (batch invariance, graphs, fused == unfused), then a whole-model compare.
for v in $VARIANTS; do
    IFS=: read -r L M S <<<"$v"
    E=(env TANDEM_CUDA_GEMM_LARGE="$L" TANDEM_CUDA_GEMM_MID="$M" TANDEM_CUDA_GEMM_SMALL="$S")
    NEED=20 step "test-ops [$v]" 120 "${E[@]}" "$BIN" test-ops --backend cuda --seed "$OPS_SEED" "${OPS_FILTER[@]}"
    [ -x "$HERE/cuda-tests" ] && NEED=20 PICK='test result|panicked|FAILED' step "cuda tests [$v]" 90 "${E[@]}" TANDEM_REQUIRE_CUDA=1 "$HERE/cuda-tests" --test-threads 1 "${CUDA_TESTS[@]}"
    NEED=10 step "compare tiny [$v]" 60 "${E[@]}" "$BIN" compare --backend cuda --model "$TINY" "${CMP_EXTRA[@]}"
done
# The attention variants (TANDEM_CUDA_ATTENTION) other than the default: the op suite and the
# GPU-only tests (graphs:: replays a captured step with the variant's partition count).
for av in $ATTN_VARIANTS; do
    [ "$av" = tc ] && continue
    NEED=20 step "test-ops [attn $av]" 120 env TANDEM_CUDA_ATTENTION="$av" "$BIN" test-ops --backend cuda --seed "$OPS_SEED" "${OPS_FILTER[@]}"
    [ -x "$HERE/cuda-tests" ] && NEED=20 PICK='test result|panicked|FAILED' step "cuda tests [attn $av]" 90 env TANDEM_CUDA_ATTENTION="$av" TANDEM_REQUIRE_CUDA=1 "$HERE/cuda-tests" --test-threads 1 gpu_invariance:: graphs::
    [ "$av" = wgmma ] && NEED=10 step "test-ops [attn wgmma d256]" 60 env TANDEM_CUDA_ATTENTION=wgmma TANDEM_CUDA_ATTENTION_D256=tc "$BIN" test-ops --backend cuda --seed "$OPS_SEED" --op head_dim=256
done
for dv in $ATTN_D256_VARIANTS; do
    [ "$dv" = partial ] && continue
    NEED=10 step "test-ops [attn d256 $dv]" 60 env TANDEM_CUDA_ATTENTION_D256="$dv" "$BIN" test-ops --backend cuda --seed "$OPS_SEED" --op head_dim=256
done
# tc's fp8 form over an fp8 KV cache (TANDEM_CUDA_ATTENTION_FP8=tc, off by default: the model
# predicts it slower at decode than the f32 kernel): the op suite's fp8-cache cases, the bitwise
# check against tc over the decoded cache, and the lab's "attention decode fp8" rows beside the
# default's. TANDEM_TUNE_ATTN_FP8=0 skips it.
if [ "${TANDEM_TUNE_ATTN_FP8:-1}" = 1 ]; then
NEED=10 step "test-ops [attn fp8 tc]" 60 env TANDEM_CUDA_ATTENTION_FP8=tc "$BIN" test-ops --backend cuda --seed "$OPS_SEED" --op kv=fp8
[ -x "$HERE/cuda-tests" ] && NEED=20 PICK='test result|panicked|FAILED' step "cuda tests [attn fp8 tc]" 90 env TANDEM_CUDA_ATTENTION_FP8=tc TANDEM_REQUIRE_CUDA=1 "$HERE/cuda-tests" --test-threads 1 kv_fp8:: gpu_invariance::long_context
for FV in partial tc; do
    NEED=15 PICK='attention decode fp8' step "attention lab [fp8 $FV]" 90 env TANDEM_CUDA_ATTENTION_FP8=$FV "$BIN" bench kernels --backend cuda --no-cublaslt --shape "$SHAPE" --only-attention --attn-batch "$AB" --attn-context "$ACTX" --attn-prefill "${APRE%%,*}" --min-ms "$MIN_MS" --output-dir "$WORK/raw" --name "attn-fp8-$FV"
done
fi
# Programmatic dependent launch (TANDEM_CUDA_PDL=1, sm_90+; kernels/README.md): the GPU-only
# tests (graphs:: replays captured steps, whose kernel edges become programmatic) and a compare.
if [ "${TANDEM_TUNE_PDL:-1}" = 1 ]; then
    [ -x "$HERE/cuda-tests" ] && NEED=20 PICK='test result|panicked|FAILED' step "cuda tests [pdl 1]" 90 env TANDEM_CUDA_PDL=1 TANDEM_REQUIRE_CUDA=1 "$HERE/cuda-tests" --test-threads 1 gpu_invariance:: graphs::
    NEED=10 step "compare tiny [pdl 1]" 60 env TANDEM_CUDA_PDL=1 "$BIN" compare --backend cuda --model "$TINY" "${CMP_EXTRA[@]}"
fi
[ -n "$GEN_PID" ] && wait "$GEN_PID"

# 2. Timings: the GEMM lab at the m each variant changes, prefill 2048 and decode b1 / b64
# (cuBLASLt, the same for every variant, is timed once, by check.sh's kernel lab: --no-cublaslt here).
: >"$OUT/tune.tsv"
for v in $VARIANTS; do
    IFS=: read -r L M S <<<"$v"
    E=(env TANDEM_CUDA_GEMM_LARGE="$L" TANDEM_CUDA_GEMM_MID="$M" TANDEM_CUDA_GEMM_SMALL="$S")
    NEED=15 PICK='attention prefill' step "kernel lab [$v]" 60 "${E[@]}" "$BIN" bench kernels --backend cuda --no-cublaslt --shape "$SHAPE" --m "$LAB_M" --attn-batch 1 --attn-context "${ACTX%%,*}" --attn-prefill "${APRE%%,*}" --min-ms "$MIN_MS" --output-dir "$WORK/raw" --name "lab-$L-$M-$S"
    grep -E '^\| gemm' "$WORK/logs/kernel_lab__${v//:/_}_.log" 2>/dev/null | awk -F'|' -v v="$v" '{gsub(/^ +| +$/, "", $2); gsub(/^ +| +$/, "", $3); gsub(/^ +| +$/, "", $4); print v "\t" $2 " " $3 "\t" $4}' >>"$OUT/tune.tsv"
    NEED=15 PICK='prefill tok/s' step "prefill 2048 [$v]" 60 "${E[@]}" "$BIN" bench decode --backend cuda --model "$BENCH_DIR" "${PRE[@]}" --output-dir "$WORK/raw" --name "prefill-$L-$M-$S"
    grep -E '^\| prefill tok/s' "$WORK/logs/prefill_2048__${v//:/_}_.log" 2>/dev/null | awk -F'|' -v v="$v" '{gsub(/^ +| +$/, "", $3); print v "\tprefill 2048 tok/s\t" $3}' >>"$OUT/tune.tsv"
    NEED=20 PICK='decode tok/s' step "decode b1,b64 [$v]" 60 "${E[@]}" "$BIN" bench decode --backend cuda --model "$BENCH_DIR" "${DEC[@]}" --output-dir "$WORK/raw" --name "decode-$L-$M-$S"
    grep -E '^\| decode tok/s' "$WORK/logs/decode_b1_b64__${v//:/_}_.log" 2>/dev/null | awk -F'|' -v v="$v" '{gsub(/^ +| +$/, "", $2); gsub(/^ +| +$/, "", $3); print v "\t" $2 "\t" $3}' >>"$OUT/tune.tsv"
done

# 2a. Programmatic dependent launch off and on, the default kernels, decode b1 / b64 one after
#     the other in this call (the decode step is a captured graph; with TANDEM_CUDA_PDL=1 each
#     kernel's prologue, the decode GEMMs' first weight loads, overlaps the previous one's tail).
if [ "${TANDEM_TUNE_PDL:-1}" = 1 ]; then
    for P in 0 1; do
        NEED=20 PICK='decode tok/s' step "decode b1,b64 [pdl $P]" 60 env TANDEM_CUDA_PDL=$P "$BIN" bench decode --backend cuda --model "$BENCH_DIR" "${DEC[@]}" --output-dir "$WORK/raw" --name "decode-pdl-$P"
        grep -E '^\| decode tok/s' "$WORK/logs/decode_b1_b64__pdl_${P}_.log" 2>/dev/null | awk -F'|' -v v="pdl $P" '{gsub(/^ +| +$/, "", $2); gsub(/^ +| +$/, "", $3); print v "\t" $2 "\t" $3}' >>"$OUT/tune.tsv"
    done
else
    printf 'pdl off vs on\t125\t0\tskipped: TANDEM_TUNE_PDL=0\n' >>"$STEPS"
fi

# 2b. The mixture of experts: every expert over every token (dense) against the routed path
#     (each expert over its own tokens, crates/cuda/src/moe.rs), the same bits by construction
#     (kernels/emu/moe_test.h): the compare on both, then the timings, one row per path.
if [ "${TANDEM_TUNE_MOE:-1}" = 1 ]; then
    MOE_TINY=$WORK/models/tiny-qwen3-moe-bf16
    MOE_DIR=$WORK/models/$MOE_SHAPE-bf16
    [ -e "$MOE_TINY/config.json" ] || step "gen-model tiny-qwen3-moe" 30 "$BIN" gen-model --shape tiny-qwen3-moe --seed 1 --dtype bf16 --out "$MOE_TINY"
    [ -e "$MOE_DIR/config.json" ] || NEED=30 step "gen-model $MOE_SHAPE" 120 "$BIN" gen-model --shape "$MOE_SHAPE" --seed 1 --dtype bf16 --out "$MOE_DIR"
    for P in routed dense; do
        NEED=10 step "compare tiny-qwen3-moe [moe $P]" 60 env TANDEM_CUDA_MOE=$P "$BIN" compare --backend cuda --model "$MOE_TINY" "${CMP_EXTRA[@]}"
        NEED=15 PICK='prefill tok/s' step "prefill 2048 [moe $P]" 60 env TANDEM_CUDA_MOE=$P "$BIN" bench decode --backend cuda --model "$MOE_DIR" "${PRE[@]}" --output-dir "$WORK/raw" --name "moe-prefill-$P"
        grep -E '^\| prefill tok/s' "$WORK/logs/prefill_2048__moe_${P}_.log" 2>/dev/null | awk -F'|' -v v="moe $P" '{gsub(/^ +| +$/, "", $3); print v "\tprefill 2048 tok/s\t" $3}' >>"$OUT/tune.tsv"
        NEED=20 PICK='decode tok/s' step "decode b1,b64 [moe $P]" 60 env TANDEM_CUDA_MOE=$P "$BIN" bench decode --backend cuda --model "$MOE_DIR" "${DEC[@]}" --output-dir "$WORK/raw" --name "moe-decode-$P"
        grep -E '^\| decode tok/s' "$WORK/logs/decode_b1_b64__moe_${P}_.log" 2>/dev/null | awk -F'|' -v v="moe $P" '{gsub(/^ +| +$/, "", $2); gsub(/^ +| +$/, "", $3); print v "\t" $2 "\t" $3}' >>"$OUT/tune.tsv"
    done
else
    printf 'moe routed vs dense\t125\t0\tskipped: TANDEM_TUNE_MOE=0\n' >>"$STEPS"
fi

# 2c. The sampler and argmax variants (TANDEM_CUDA_SAMPLER=bisect|radix|multi, TANDEM_CUDA_ARGMAX=
#     one|multi; each gives the host sampler's ids, crates/cuda/tests): their ids on the GPU
#     against the host (the masked-sampling test), then argmax and top-p sampling at vocabulary
#     128256, batch 1 and 64. Target: top-p at batch 1 under 3% of a batch-1 decode step.
for v in ${TANDEM_TUNE_SAMPLERS:-bisect:one radix:multi multi:multi}; do
    IFS=: read -r SV AV <<<"$v"
    E=(env TANDEM_CUDA_SAMPLER="$SV" TANDEM_CUDA_ARGMAX="$AV")
    [ -x "$HERE/cuda-tests" ] && NEED=10 PICK='test result|panicked|FAILED' step "sampling ids [$v]" 60 "${E[@]}" TANDEM_REQUIRE_CUDA=1 "$HERE/cuda-tests" --test-threads 1 gpu_invariance::masked_sampling
    NEED=10 PICK='sample|argmax' step "sampling lab [$v]" 60 "${E[@]}" "$BIN" bench kernels --backend cuda --shape "$SHAPE" --only-sampling --sample-batch "$SB" --min-ms "$MIN_MS" --output-dir "$WORK/raw" --name "lab-sampling-$SV-$AV"
    grep -E '^\| (sample|argmax)' "$WORK/logs/sampling_lab__${v//:/_}_.log" 2>/dev/null | awk -F'|' -v v="$v" '{gsub(/^ +| +$/, "", $2); gsub(/^ +| +$/, "", $3); gsub(/^ +| +$/, "", $4); print v "\t" $2 " " $3 "\t" $4}' >>"$OUT/tune.tsv"
done

# 2f. FP8 / int4 weights on the tensor cores (TANDEM_CUDA_QUANT_TC=1: kernels/quant_mma.cu, off
#     by default, other bits than the GEMV's) against the GEMV (0): the op suite's quant_matmul
#     cases on each path, then the layer GEMMs of $SHAPE_8B on int4 groups of 128 at decode and
#     prefill m (the kernel lab, --dtype), one row per path and case (docs/gpu/predictions.md,
#     `quant_mma_*`, predicts them). TANDEM_TUNE_QUANT_TC=0 skips it.
if [ "${TANDEM_TUNE_QUANT_TC:-1}" = 1 ]; then
    QDT=int4_g128; QM=1,16,512,2048; [ "$SMALL" = 1 ] && QDT=int4_g32 && QM=1,16,40
    for Q in 0 1; do
        NEED=10 step "test-ops [quant_tc $Q]" 60 env TANDEM_CUDA_QUANT_TC=$Q "$BIN" test-ops --backend cuda --seed "$OPS_SEED" --op quant_matmul
        NEED=15 PICK='^\| gemm' step "quant lab [quant_tc $Q]" 90 env TANDEM_CUDA_QUANT_TC=$Q "$BIN" bench kernels --backend cuda --no-cublaslt --shape "$SHAPE_8B" --dtype "$QDT" --m "$QM" --attn-batch 1 --attn-context 1024 --attn-prefill 512 --verify-batch 1 --verify-k 2 --sample-batch 1 --min-ms "$MIN_MS" --output-dir "$WORK/raw" --name "lab-quant-tc-$Q"
        grep -E '^\| gemm' "$WORK/logs/quant_lab__quant_tc_${Q}_.log" 2>/dev/null | awk -F'|' -v v="quant_tc $Q $QDT" '{gsub(/^ +| +$/, "", $2); gsub(/^ +| +$/, "", $3); gsub(/^ +| +$/, "", $4); print v "\t" $2 " " $3 "\t" $4}' >>"$OUT/tune.tsv"
    done
    # FP8 as W8A8 (TANDEM_CUDA_QUANT_TC=w8a8: kernels/quant_mma_w8a8.cu, sm_89+): the op suite's
    # quant_matmul cases, FP8 judged by the W8A8 limit, and the FP8 golden (crates/cuda fp8_w8a8::).
    NEED=10 step "test-ops [quant_tc w8a8]" 60 env TANDEM_CUDA_QUANT_TC=w8a8 "$BIN" test-ops --backend cuda --seed "$OPS_SEED" --op quant_matmul
    [ -x "$HERE/cuda-tests" ] && NEED=20 PICK='test result|panicked|FAILED|flipped|worst' step "cuda tests [quant_tc w8a8]" 90 env TANDEM_CUDA_QUANT_TC=w8a8 TANDEM_REQUIRE_CUDA=1 "$HERE/cuda-tests" --test-threads 1 --nocapture fp8_w8a8::
fi

# 2e. Prefill attention, each variant beside the others and beside torch SDPA on this GPU: one
#     sequence of 512 and 2048 tokens, causal, at head_dim 64 (llama-3.2-1b) and 128
#     (llama-3.1-8b) (`bench kernels --only-attention`, then gpu/kernel_lab.py on its report:
#     ours, torch's, torch/ours), then the whole 1B model's prefill 2048 with it.
for av in $ATTN_VARIANTS; do
    for shp in $(printf '%s\n' "$SHAPE" "$SHAPE_8B" | uniq); do
        NEED=15 PICK='attention prefill' step "prefill attention [$av $shp]" 60 env TANDEM_CUDA_ATTENTION="$av" "$BIN" bench kernels --backend cuda --shape "$shp" --only-attention --attn-batch 1 --attn-context "${ACTX%%,*}" --attn-prefill "$APRE" --min-ms "$MIN_MS" --output-dir "$WORK/raw" --name "pattn-$av-$shp"
        [ -f "$WORK/raw/pattn-$av-$shp.json" ] && [ "$HAVE_TORCH" = 1 ] && NEED=15 PICK='attention prefill' step "prefill attention torch [$av $shp]" 60 "$PY" "$HERE/kernel_lab.py" "$WORK/raw/pattn-$av-$shp.json" --min-ms 20 --out "$WORK/raw/pattn-torch-$av-$shp.json"
        grep -E '^\| attention prefill' "$WORK/logs/prefill_attention_torch__${av}_${shp}_.log" 2>/dev/null | awk -F'|' -v v="attn $av" '{gsub(/^ +| +$/, "", $3); gsub(/^ +| +$/, "", $4); gsub(/^ +| +$/, "", $5); gsub(/^ +| +$/, "", $6); print v "\tprefill " $3 "\t" $4 " us, torch " $5 " us, torch/ours " $6}' >>"$OUT/tune.tsv"
    done
    [ "$av" = tc ] && continue  # the GEMM loop above timed the default's
    NEED=15 PICK='prefill tok/s' step "prefill 2048 [attn $av]" 60 env TANDEM_CUDA_ATTENTION="$av" "$BIN" bench decode --backend cuda --model "$BENCH_DIR" "${PRE[@]}" --output-dir "$WORK/raw" --name "prefill-attn-$av"
    grep -E '^\| prefill tok/s' "$WORK/logs/prefill_2048__attn_${av}_.log" 2>/dev/null | awk -F'|' -v v="attn $av" '{gsub(/^ +| +$/, "", $3); print v "\tprefill 2048 tok/s\t" $3}' >>"$OUT/tune.tsv"
done

# 2d. Decode attention, each variant beside the others: ctx 1024/4096/16384 x batch 1/8/64 at
#     head_dim 64 (llama-3.2-1b) and 128 (llama-3.1-8b), with each row's fraction of the copy
#     floor (the K/V bytes at TANDEM_TUNE_BW_GBS).
BW=${TANDEM_TUNE_BW_GBS:-$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("copy_gbps") or 4200)' "$WORK/raw/ceilings.json" 2>/dev/null || echo 4200)}
for av in $ATTN_VARIANTS; do
    case "$av" in tc_shared | wgmma) continue ;; esac  # their decodes are tc's split jobs
    for shp in $(printf '%s\n' "$SHAPE" "$SHAPE_8B" | uniq); do
        # The 8B shape's batch 64 at 16k would fill 8.6 GB of cache from the host: batch 1 and 8 only.
        B_=$AB
        [ "$shp" = llama-3.1-8b ] && B_=1,8
        NEED=15 PICK='attention decode' step "attention lab [$av $shp]" 90 env TANDEM_CUDA_ATTENTION="$av" "$BIN" bench kernels --backend cuda --no-cublaslt --shape "$shp" --m 1 --attn-batch "$B_" --attn-context "$ACTX" --attn-prefill "${APRE%%,*}" --min-ms "$MIN_MS" --bandwidth-gbs "$BW" --output-dir "$WORK/raw" --name "attn-$av-$shp"
        grep -E '^\| attention' "$WORK/logs/attention_lab__${av}_${shp}_.log" 2>/dev/null | awk -F'|' -v v="attn $av" '{gsub(/^ +| +$/, "", $2); gsub(/^ +| +$/, "", $3); gsub(/^ +| +$/, "", $4); gsub(/^ +| +$/, "", $7); print v "\t" $2 " " $3 "\t" $4 " us, " $7 " of floor"}' >>"$OUT/tune.tsv"
    done
done
# 2e. Head_dim 256 (gemma-3-1b: 4 heads over 1 KV head): TANDEM_CUDA_ATTENTION_D256=partial
#     (the default, the f32 kernel) beside tc (paged_attention_tc_d256), the same cases.
# Rehearsal sizes: the attention only (gemma-3-1b's GEMMs and vocabulary are no tiny shape).
D256_ONLY=(--m 1 --sample-batch 1); [ "$SMALL" = 1 ] && D256_ONLY=(--only-attention)
for dv in $ATTN_D256_VARIANTS; do
    NEED=15 PICK='attention decode' step "attention lab [d256 $dv gemma-3-1b]" 90 env TANDEM_CUDA_ATTENTION_D256="$dv" "$BIN" bench kernels --backend cuda --no-cublaslt --shape gemma-3-1b "${D256_ONLY[@]}" --attn-batch "$AB" --attn-context "$ACTX" --attn-prefill "${APRE%%,*}" --min-ms "$MIN_MS" --bandwidth-gbs "$BW" --output-dir "$WORK/raw" --name "attn-d256-$dv-gemma-3-1b"
    grep -E '^\| attention' "$WORK/logs/attention_lab__d256_${dv}_gemma-3-1b_.log" 2>/dev/null | awk -F'|' -v v="attn d256 $dv" '{gsub(/^ +| +$/, "", $2); gsub(/^ +| +$/, "", $3); gsub(/^ +| +$/, "", $4); gsub(/^ +| +$/, "", $7); print v "\t" $2 " " $3 "\t" $4 " us, " $7 " of floor"}' >>"$OUT/tune.tsv"
done

# 3. Nsight Compute on one launch of each slow GEMM (the kernel lab's qkv at m = 64 and 2048,
#    default kernels, and the m128_n128 variant at 2048), the decode attention at batch 1, and
#    the decode GEMM at m = 1 (m16 and m16_gemv4).
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
[ "$SMALL" = 1 ] && NCU=
if [ "${TANDEM_TUNE_NCU:-1}" = 1 ] && [ -n "$NCU" ]; then
    SECTIONS=(--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis)
    ncu_case() { # ncu_case NAME KERNEL_REGEX M [ENV...]
        local name=$1 re=$2 m=$3; shift 3
        NEED=25 PICK='==PROF==|Error|error' step "ncu $name" 60 env "$@" "$NCU" --clock-control none "${SECTIONS[@]}" -k "regex:$re" -c 1 "$BIN" bench kernels --backend cuda --no-cublaslt --shape llama-3.2-1b --m "$m" --attn-batch 1 --attn-context 1024 --attn-prefill 512 --min-ms 1
        cp "$WORK/logs/ncu_$(printf '%s' "$name" | tr -c 'A-Za-z0-9_.-' '_').log" "$EXTRA/ncu-$name.txt" 2>/dev/null
    }
    ncu_case m2048-m128 'matmul_tc_bf16_m128$' 2048
    ncu_case m2048-m128_n128 'matmul_tc_bf16_m128_n128' 2048 TANDEM_CUDA_GEMM_LARGE=m128_n128
    ncu_case m2048-wgmma 'matmul_wgmma_bf16' 2048 TANDEM_CUDA_GEMM_LARGE=wgmma
    ncu_case m2048-wgmma_ws 'matmul_wgmma_ws' 2048 TANDEM_CUDA_GEMM_LARGE=wgmma_ws
    ncu_case m2048-m128_w64 'matmul_tc_bf16_m128_w64' 2048 TANDEM_CUDA_GEMM_LARGE=m128_w64
    ncu_case m64-m64 'matmul_tc_bf16_m64$' 64
    ncu_case attn-decode 'paged_attention_tc' 1
    # The decode GEMM at one token: m16 against the register-streaming GEMV variant.
    ncu_case m1-m16 'matmul_tc_bf16_m16$' 1
    ncu_case m1-m16_gemv4 'matmul_tc_bf16_m16_gemv4' 1 TANDEM_CUDA_GEMM_SMALL=m16_gemv4
    ncu_case attn-decode-tc_deep 'paged_attention_tc_deep' 1 TANDEM_CUDA_ATTENTION=tc_deep
else
    printf 'ncu\t125\t0\tskipped: %s\n' "$([ -n "$NCU" ] && echo 'TANDEM_TUNE_NCU=0' || echo 'no ncu on this machine')" >>"$STEPS"
fi

pack_run

# The table, last.
echo
echo "== steps =="
awk -F'\t' '{ printf "%-38s %-6s %6s  %s\n", $1, ($2 == 0 ? "ok" : ($2 == 125 ? "SKIP" : "FAIL " $2)), $3, $4 }' "$STEPS"
echo
echo "== variants (LARGE:MID:SMALL; attn VARIANT) =="
awk -F'\t' '{ printf "%-26s %-40s %s\n", $1, $2, $3 }' "$OUT/tune.tsv"
FAILED=$(awk -F'\t' '$2 != 0 && $2 != 125' "$STEPS" | wc -l)
echo "tune: $(awk -F'\t' '$2 == 0' "$STEPS" | wc -l) steps ok, $FAILED failed, $(awk -F'\t' '$2 == 125' "$STEPS" | wc -l) skipped, $(elapsed) s; files in $OUT"
[ "$FAILED" -eq 0 ]
