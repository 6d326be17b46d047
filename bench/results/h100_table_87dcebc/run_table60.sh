#!/usr/bin/env bash
# Sixtieth session: the paper-style table on the H200 at the current trainer (binaries of HEAD
# built by scripts/device_pack.sh's build folder into .carry/dev60: codagpt, configs, shards,
# torch_gpt2.py, libgomp). Carry .carry/dev60:  COMMIT=<built commit> bash run_table60.sh
set -uo pipefail
start=$(date +%s)
D=$PWD/.carry/dev60
export CODAGPT_COMMIT=${COMMIT:-unknown}
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
STEPS=${STEPS:-30} PEER=1 RECOMPUTE=none RUNS_DIR=/tmp/runs60 bash scripts/reproduce_table.sh $D $OUT/table
echo "[$(( $(date +%s) - start )) s] table rc=$?"
cat $OUT/table/table.md
