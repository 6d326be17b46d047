#!/usr/bin/env bash
# Session 53, second call: the GPU test binaries at 9074678 (HEAD) not run in the first call, then
# on an H200 only the table and bench_gemm's fused programs, then compute-sanitizer memcheck of the
# gradient test of 32282bc (HEAD binary) in the time left.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
left() { echo $(( 575 - ( $(date +%s) - start ) )); }
rm -rf /tmp/dev53; tar -xJf .carry/dev53.tar.xz -C /tmp
D=/tmp/dev53
export CODAGPT_COMMIT=9074678
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=/tmp/logs53b; mkdir -p $L
pack() { tar -cJf $OUT/logs53b.tar.xz -C /tmp logs53b; }
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
for t in test_gpu_coda test_gpu_matmul test_gpu_checkpoint test_gpu_dist test_gpu_optim test_gpu_sample test_gpu_attention test_gpu_kernels; do
  timeout 150 $D/$t > $L/$t.log 2>&1; el "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' $L/$t.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' $L/$t.log | head -5
done
pack
if grep -q H200 $L/gpu.txt; then
  STEPS=30 PEER=1 RECOMPUTE=none RUNS_DIR=/tmp/table_runs timeout $(left) bash scripts/reproduce_table.sh $D $L/table
  el table; cat $L/table/table.md; pack
  timeout 60 $D/bench_gemm --only none --reps 10 --json $L/programs_1.5b.json > $L/programs_1.5b.log 2>&1; el "bench_gemm rc=$?"
  grep -A12 "^fused program" $L/programs_1.5b.log; pack
fi
which compute-sanitizer >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
timeout $(left) compute-sanitizer --tool memcheck $D/test_gpu_model --gtest_filter='GPUModel.EachSteps*' > $L/memcheck_new_test.log 2>&1; el "memcheck rc=$?"
tail -4 $L/memcheck_new_test.log
pack
