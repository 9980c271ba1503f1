#!/usr/bin/env bash
# gpu/lib.sh — what check.sh and tune.sh share; sourced, never run. The caller sets BUDGET
# (seconds for all steps), WORK, OUT and PY, then calls begin_run.
#
# What comes back from a device call is at most 8 files, no more than 2 folders down
# (docs/gpu-check.md, "What comes back"). So OUT only ever holds the few files a script names
# (its log, its summary, latest.json); everything else a step writes goes to $EXTRA or
# $WORK/raw and is packed into one archive in OUT at the end (pack_run). A call cut short
# before that still returns what OUT holds, and never more than 8 files.

# The op suite's seed: pinned, so a failure on the GPU replays here (`tandem test-ops --seed`).
OPS_SEED=${TANDEM_OPS_SEED:-1}

# begin_run LOGFILE ARCHIVE: fresh $WORK/logs, $WORK/raw and $EXTRA ($WORK/extra, the files
# that go into OUT/ARCHIVE.tar.gz), LOG (the whole log, emptied), STEPS ($WORK/raw/steps.tsv,
# emptied) and T0 (the budget's start).
begin_run() {
    rm -rf "$WORK/logs" "$WORK/raw" "$WORK/extra"
    EXTRA=$WORK/extra
    ARCHIVE=$2
    mkdir -p "$WORK/logs" "$WORK/raw" "$WORK/models" "$EXTRA"
    LOG=$1
    STEPS=$WORK/raw/steps.tsv
    : >"$LOG"
    : >"$STEPS"
    rm -f "$OUT/$ARCHIVE.tar.gz"
    T0=$(date +%s)
}

# tmo SECONDS CMD...: CMD under `timeout` outside a step (machine facts, probes), so that a
# hung driver or python costs SECONDS, not the call.
tmo() {
    local s=$1; shift
    timeout -k 5 "$s" "$@"
}

# pack_run: $EXTRA, $WORK/raw and $WORK/logs into OUT/$ARCHIVE.tar.gz (the models and the
# kernel cache stay behind), then a line saying what OUT holds against the device's limits.
pack_run() {
    local tmp="$OUT/.$ARCHIVE.tar.gz.part"
    if tmo 120 tar -czf "$tmp" -C "$WORK" extra raw logs 2>>"$LOG"; then
        mv "$tmp" "$OUT/$ARCHIVE.tar.gz"
    else
        rm -f "$tmp"
        say "packing $ARCHIVE.tar.gz failed: the files beside it in $OUT are all that comes back"
    fi
    local n deep big
    n=$(find "$OUT" -type f | wc -l)
    deep=$(find "$OUT" -mindepth 4 -type f | wc -l)
    big=$(find "$OUT" -type f -size +16M | wc -l)
    say "$OUT holds $n files ($deep more than 2 folders down, $big over 16 MiB): a device call returns at most 8, 2 folders down, 16 MiB each"
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
    # `timeout` answers 124 when TERM ended the step, 137 when it had to KILL it 10 s later;
    # both are the step's timeout (a step that was killed by something else before its limit
    # keeps its 137).
    if [ $rc -eq 137 ] && awk -v t="$secs" -v l="$limit" 'BEGIN { exit !(t >= l) }'; then rc=124; fi
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
    done < <(tmo 30 "$PY" -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null)
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

# golden_dir: exports TANDEM_GOLDEN_DIR, the tests/golden the int4 and LoRA CUDA tests read. The
# test binary knows only the path it was built at; here the tree is a copy at another path. A
# given TANDEM_GOLDEN_DIR stands; else the tree the bundle sits in, else the working directory's.
golden_dir() {
    local g
    if [ -z "${TANDEM_GOLDEN_DIR:-}" ]; then
        for g in "$HERE/../tests/golden" "$PWD/tests/golden"; do
            if [ -d "$g/lora" ]; then
                TANDEM_GOLDEN_DIR=$(cd "$g" && pwd)
                break
            fi
        done
    fi
    export TANDEM_GOLDEN_DIR=${TANDEM_GOLDEN_DIR:-}
    printf 'golden_dir\t%s\n' "${TANDEM_GOLDEN_DIR:-NOT FOUND}" >>"$WORK/raw/env.txt"
}
