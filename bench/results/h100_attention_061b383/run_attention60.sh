#!/usr/bin/env bash
# Sixtieth session: bench_attention (built here, sm_90a, into .carry/dev60b) at the 350M and 1.5B
# shapes, twice each, from the repository root on the device, carrying .carry/dev60b:
#   COMMIT=<built commit> bash bench/run_attention60.sh
set -uo pipefail
D=$PWD/.carry/dev60b
export CODAGPT_COMMIT=${COMMIT:-unknown}
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
for round in 1 2; do
  for model in gpt2-350m gpt2-1.5b; do
    timeout 120 $D/bench_attention --config $model --reps 20 --json $OUT/attention.json 2>&1 | tee -a $OUT/attention.log
  done
done
