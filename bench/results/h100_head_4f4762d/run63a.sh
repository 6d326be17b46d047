#!/usr/bin/env bash
# Session 63, call 1 (binaries of main's code, 4f4762d): the paper-style table with the PyTorch
# peer in the same call, then bench_gemm (every plain training shape against cuBLASLt, the fused
# programs at 1.5B, the passes), then the fused programs at 350M, each as the time left allows.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
left() { echo $(( ${LIMIT:-575} - ( $(date +%s) - start ) )); }
rm -rf /tmp/dev63; tar -xJf .carry/dev63.tar.xz -C /tmp
D=/tmp/dev63
export CODAGPT_COMMIT=${COMMIT:-4f4762d}
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=$OUT
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
el start
STEPS=30 PEER=1 RECOMPUTE=none RUNS_DIR=/tmp/table_runs timeout $(( $(left) - 100 )) bash scripts/reproduce_table.sh $D $L/table
el "table rc=$?"; cat $L/table/table.md
timeout $(( $(left) - 40 )) $D/bench_gemm --reps 10 --json $L/gemm_1.5b.json > $L/gemm_1.5b.log 2>&1; el "bench_gemm 1.5b rc=$?"
grep -E "^fused|geomean|FAILED" $L/gemm_1.5b.log
timeout $(left) $D/bench_gemm --reps 10 --model 350m --only none --json $L/gemm_350m.json > $L/gemm_350m.log 2>&1; el "bench_gemm 350m rc=$?"
grep -E "^fused|geomean" $L/gemm_350m.log
el done
