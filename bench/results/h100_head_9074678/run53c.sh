#!/usr/bin/env bash
# Session 53: the table at 9074678 on an H200 (the card) if this call got one; on any other
# card it stops at once (the H100 table of this session is call 1's).
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
L=/tmp/logs53c; mkdir -p $L
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
grep -q H200 $L/gpu.txt || { echo "not an H200: stop"; exit 0; }
rm -rf /tmp/dev53; tar -xJf .carry/dev53.tar.xz -C /tmp
D=/tmp/dev53
export CODAGPT_COMMIT=9074678
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
STEPS=30 PEER=1 RECOMPUTE=none RUNS_DIR=/tmp/table_runs timeout 480 bash scripts/reproduce_table.sh $D $L/table
el table; grep -E "codagpt train:" $L/table/table.log | head -4; cat $L/table/table.md
tar -cJf $OUT/logs53c.tar.xz -C /tmp logs53c
timeout $(( 570 - ( $(date +%s) - start ) )) $D/bench_gemm --only none --reps 10 --json $L/programs_1.5b.json > $L/programs_1.5b.log 2>&1; el "bench_gemm rc=$?"
grep -A12 "^fused program" $L/programs_1.5b.log
tar -cJf $OUT/logs53c.tar.xz -C /tmp logs53c
