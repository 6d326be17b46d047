#!/usr/bin/env bash
# Session 51: test_gpu_coda with the new test of the default LM head cut (against one chunk).
set -uo pipefail
rm -rf /tmp/dev51f; tar -xJf .carry/dev51/dev51f.tar.xz -C /tmp
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 /tmp/dev51f/test_gpu_coda > $OUT/test_gpu_coda.log 2>&1; echo "rc=$?"
grep -A14 "DefaultLmHeadCut" $OUT/test_gpu_coda.log | head -30
grep -E '^\[  (PASSED|FAILED)  \]' $OUT/test_gpu_coda.log
