#!/usr/bin/env bash
# Session 52, second call: the paper-style table with the new binary (zero_grad's memset only over
# the gradients kernels add into; the first backward's dW GEMMs write the rest).
set -uo pipefail
rm -rf /tmp/dev52; tar -xJf .carry/dev52/dev52.tar.xz -C /tmp
D=/tmp/dev52
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=/tmp/logs52b; mkdir -p $L
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
STEPS=30 PEER=1 RECOMPUTE=none RUNS_DIR=/tmp/table_runs bash scripts/reproduce_table.sh $D $L/table
grep -E "codagpt train:" $L/table/table.log | head -4
cat $L/table/table.md
tar -cJf $OUT/logs52b.tar.xz -C /tmp logs52b
