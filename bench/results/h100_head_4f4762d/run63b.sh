#!/usr/bin/env bash
# Session 63, call 2 (binaries of main's code, 4f4762d): every GPU test binary (scripts/gpu_check.sh
# tests), then one traced step a path at 1.5B (scripts/gpu_check.sh trace) as the time left allows.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
left() { echo $(( ${LIMIT:-575} - ( $(date +%s) - start ) )); }
[[ -d /tmp/dev63 ]] || tar -xJf .carry/dev63.tar.xz -C /tmp
D=/tmp/dev63
export CODAGPT_COMMIT=${COMMIT:-4f4762d}
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
OUT=$OUT/tests timeout $(( $(left) - 150 )) bash scripts/gpu_check.sh $D tests > $OUT/tests_summary.log 2>&1
el "tests rc=$?"; tail -20 $OUT/tests_summary.log
OUT=$OUT/trace TRACE_MODELS=gpt2-1.5b timeout $(left) bash scripts/gpu_check.sh $D trace > $OUT/trace_summary.log 2>&1
el "trace rc=$?"; tail -8 $OUT/trace_summary.log
el done
