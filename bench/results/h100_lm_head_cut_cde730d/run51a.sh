#!/usr/bin/env bash
# Session 51, first call: the paper-style table at cc0fa76 (HEAD) on whichever card came, then the
# GPU test binaries (all but test_gpu_gemm) with what time is left.
set -uo pipefail
start=$(date +%s)
rm -rf /tmp/dev51; tar -xJf .carry/dev51/dev51.tar.xz -C /tmp
D=/tmp/dev51
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
STEPS=30 PEER=1 RECOMPUTE=none RUNS_DIR=/tmp/table_runs bash scripts/reproduce_table.sh $D $OUT/table
mkdir -p $OUT/tests
for t in test_gpu_optim test_gpu_coda test_gpu_model test_gpu_checkpoint test_gpu_dist test_gpu_sample test_gpu_kernels test_gpu_matmul test_gpu_attention; do
  left=$(( 570 - ($(date +%s) - start) ))
  (( left < 20 )) && { echo "$t not run (time)"; continue; }
  timeout $left $D/new/$t > $OUT/tests/$t.log 2>&1; echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/tests/$t.log | tr '\n' ' ')"
done
cat $OUT/table/table.md
