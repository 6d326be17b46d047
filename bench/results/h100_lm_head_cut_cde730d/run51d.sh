#!/usr/bin/env bash
# Session 51, fourth call: test_gpu_gemm with this tree's engine headers (Plan.cost, gemm_plan_cost),
# and compute-sanitizer memcheck of the fused model's LM head chunk tests.
set -uo pipefail
start=$(date +%s)
rm -rf /tmp/dev51d; tar -xJf .carry/dev51/dev51d.tar.xz -C /tmp
N=/tmp/dev51d
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=/tmp/logs51d; mkdir -p $L
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv,noheader | tee $L/gpu.txt
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
timeout 400 $N/test_gpu_gemm > $L/test_gpu_gemm.log 2>&1; el "test_gpu_gemm rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' $L/test_gpu_gemm.log | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' $L/test_gpu_gemm.log | head -5
timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $N/test_gpu_coda \
  --gtest_filter='CodaGPU.*Chunk*' > $L/memcheck_coda.log 2>&1
el "memcheck coda chunks rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $L/memcheck_coda.log | tr '\n' ' ')"
tar -cJf $OUT/logs51d.tar.xz -C /tmp logs51d
