#!/usr/bin/env bash
# Session 53, first call: the paper-style table at 9074678 (HEAD), then test_gpu_model at HEAD (the
# mended tests' tiny config; the gradient test of 32282bc), then the gradient test against two
# mutants of gpu_training.cpp (32282bc + mutation; expect both to FAIL), then bench_gemm's fused
# programs (--only none) if time is left.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
rm -rf /tmp/dev53; tar -xJf .carry/dev53.tar.xz -C /tmp
D=/tmp/dev53
export CODAGPT_COMMIT=9074678
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=/tmp/logs53a; mkdir -p $L
pack() { tar -cJf $OUT/logs53a.tar.xz -C /tmp logs53a; }
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
STEPS=30 PEER=1 RECOMPUTE=none RUNS_DIR=/tmp/table_runs bash scripts/reproduce_table.sh $D $L/table
el table
grep -E "codagpt train:" $L/table/table.log | head -4
cat $L/table/table.md
pack
timeout 120 $D/test_gpu_model > $L/test_gpu_model.log 2>&1; el "test_gpu_model rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' $L/test_gpu_model.log | tr '\n' ' ')"
pack
rm -rf /tmp/mut52; tar -xJf .carry/dev52/mut52.tar.xz -C /tmp
for m in never_first always_first; do
  timeout 60 /tmp/mut52/test_gpu_model_$m --gtest_filter='GPUModel.EachSteps*' > $L/mutant_$m.log 2>&1; el "mutant $m rc=$?"
  grep -E "Failure|FAILED \]|OK \]" $L/mutant_$m.log | head -6
done
pack
el "bench_gemm programs"
timeout $(( 560 - ( $(date +%s) - start ) )) $D/bench_gemm --only none --reps 10 --json $L/programs_1.5b.json > $L/programs_1.5b.log 2>&1; el "bench_gemm rc=$?"
tail -25 $L/programs_1.5b.log
pack
