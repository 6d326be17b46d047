#!/usr/bin/env bash
# Session 63, call 3 (binaries of main's code, 4f4762d): one traced 350M step a path, then
# compute-sanitizer memcheck on the fused model's tests and the engine's programs, as time allows.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
left() { echo $(( ${LIMIT:-400} - ( $(date +%s) - start ) )); }
[[ -d /tmp/dev63 ]] || tar -xJf .carry/dev63.tar.xz -C /tmp
D=/tmp/dev63
export CODAGPT_COMMIT=${COMMIT:-4f4762d}
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
OUT=$OUT/trace TRACE_MODELS=gpt2-350m timeout 120 bash scripts/gpu_check.sh $D trace > $OUT/trace350_summary.log 2>&1
el "trace rc=$?"
S=/usr/local/cuda/bin/compute-sanitizer
for t in "test_gpu_coda" "test_gpu_gemm --gtest_filter=*GeluBackward*:*ResidualForward*"; do
  set -- $t
  timeout $(( $(left) - 5 )) $S --tool memcheck --error-exitcode 9 $D/"$@" > $OUT/sanitizer_$1.log 2>&1
  el "memcheck $t rc=$?: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $OUT/sanitizer_$1.log | tr '\n' ' ')"
done
el done
