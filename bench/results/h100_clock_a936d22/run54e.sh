#!/usr/bin/env bash
# Session 54, fifth call (binaries of de7dab0): the GPU test binaries that link the trainer (whose
# energy meter now runs a clock thread): model, checkpoint, sample, coda, dist.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
rm -rf /tmp/dev54; tar -xJf .carry/dev54.tar.xz -C /tmp
D=/tmp/dev54
export CODAGPT_COMMIT=${COMMIT:-de7dab0}
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=/tmp/logs54e; rm -rf $L; mkdir -p $L
pack() { tar -cJf $OUT/logs54e.tar.xz -C /tmp logs54e; }
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv,noheader | tee $L/gpu.txt

for t in test_gpu_model test_gpu_coda test_gpu_checkpoint test_gpu_sample test_gpu_dist; do
  timeout 200 $D/$t > $L/$t.log 2>&1
  el "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)  \]' $L/$t.log | tr '\n' ' ')"
  grep -E "FAILED \]|Failure" $L/$t.log | head -5
  pack
done
grep -E "clock samples|read right" $L/test_gpu_model.log
