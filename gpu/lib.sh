#!/usr/bin/env bash
# gpu/lib.sh — what check.sh and tune.sh share; sourced, never run. The caller sets BUDGET
# (seconds for all steps), WORK and PY, then calls begin_run.

# begin_run LOGFILE: fresh $WORK/logs and $WORK/raw, LOG (the whole log, emptied), STEPS
# ($WORK/raw/steps.tsv, emptied) and T0 (the budget's start).
begin_run() {
    rm -rf "$WORK/logs" "$WORK/raw"
    mkdir -p "$WORK/logs" "$WORK/raw" "$WORK/models"
    LOG=$1
    STEPS=$WORK/raw/steps.tsv
    : >"$LOG"
    : >"$STEPS"
    T0=$(date +%s)
}

say() { echo "$*" | tee -a "$LOG"; }
elapsed() { echo $(( $(date +%s) - T0 )); }

# step NAME TIMEOUT_S CMD...: runs CMD under `timeout`, logs its whole output, records
# (name, rc, seconds, verdict line) in steps.tsv, prints one status line. rc 124 = timed out,
# 125 = skipped for lack of time: fewer than NEED seconds (default 15) of the budget left. The verdict line is the last line matching PICK (a regex;
# default: a pass/fail count or an error), else the last line.
step() {
    local name=$1 limit=$2; shift 2
    local left=$(( BUDGET - $(elapsed) ))
    local slog="$WORK/logs/$(printf '%s' "$name" | tr -c 'A-Za-z0-9_.-' '_').log"
    local need=${NEED:-15}
    if [ "$left" -lt "$need" ]; then
        printf '%s\t125\t0\tskipped: needs ~%s s, %s s left of the %s s budget\n' "$name" "$need" "$left" "$BUDGET" >>"$STEPS"
        say "[$(elapsed) s] $name: SKIPPED (needs ~$need s, $left s of the budget left)"
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

# cuda_libs: finds libnvrtc.so.13 and libcublas.so.13, puts their folders on LD_LIBRARY_PATH,
# sets TANDEM_CUDA_LIB, and notes both in $WORK/raw/env.txt.
cuda_libs() {
    NVRTC_DIR=$(find_lib libnvrtc.so.13)
    CUBLAS_DIR=$(find_lib libcublas.so.13)
    say "libnvrtc.so.13: ${NVRTC_DIR:-NOT FOUND}; libcublas.so.13: ${CUBLAS_DIR:-NOT FOUND}"
    local d
    for d in "$CUBLAS_DIR" "$NVRTC_DIR"; do
        [ -n "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    done
    [ -n "$NVRTC_DIR" ] && export TANDEM_CUDA_LIB=$NVRTC_DIR
    printf 'nvrtc_dir\t%s\ncublas_dir\t%s\n' "$NVRTC_DIR" "$CUBLAS_DIR" >>"$WORK/raw/env.txt"
}
