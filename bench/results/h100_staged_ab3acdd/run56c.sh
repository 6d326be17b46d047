#!/usr/bin/env bash
# Session 56, call 3 (the staged tile with a fourth warpgroup): the staged tile (st128x256). Registers/spills of its kernels; a plain 1.5B
# shape on every tile (checked against cuBLASLt, short rounds); each 1.5B fused program on every
# tile it runs on, back to back (bench_gemm --energy); the GEMM tests (every program on every tile);
# the 350M programs the same way. (No training steps: the codagpt binary was not rebuilt.)
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
D=$PWD/.carry/dev56
export CODAGPT_COMMIT=${COMMIT:-staged4wg}
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=$OUT/call3; mkdir -p $L
finish() { cd $OUT && tar -czf call3.tgz call3 && rm -rf call3; el done; }
trap finish EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
/usr/local/cuda/bin/cuobjdump --dump-resource-usage $D/bench_gemm 2>/dev/null > $L/resource_usage.txt
grep -A1 "ILi128ELi256ELi3ELb0ELi1ELb1E" $L/resource_usage.txt | grep -o "REG:[0-9]* STACK:[0-9]* SHARED:[0-9]* LOCAL:[0-9]*" | sort | uniq -c > $L/staged_regs.txt
el "regs:"; cat $L/staged_regs.txt
timeout 60 $D/bench_gemm --only "1.5b fc fwd" --sweep --reps 10 --no-fused > $L/plain_sweep.log 2>&1
el "plain sweep rc=$?"; grep -E "^1.5b|geomean|FAIL" $L/plain_sweep.log
timeout 200 $D/bench_gemm --only none --sweep --reps 5 --energy 0.4 --model 1.5b --json $L/programs_1.5b.json > $L/programs_1.5b.log 2>&1
el "programs 1.5b rc=$?"; grep -E "energy|x plain|^1.5b" $L/programs_1.5b.log | head -120
left=$(( 230 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $D/test_gpu_gemm > $L/test_gpu_gemm.log 2>&1
el "test_gpu_gemm rc=$?: $(tail -3 $L/test_gpu_gemm.log | tr '\n' ' ')"
grep -E "FAILED|Failure" $L/test_gpu_gemm.log | head -20
left=$(( 240 - ($(date +%s) - start) ))
if (( left > 60 )); then
timeout $left $D/bench_gemm --only none --sweep --reps 5 --energy 0.5 --model 350m --json $L/programs_350m.json > $L/programs_350m.log 2>&1
el "programs 350m rc=$?"; grep -E "x plain|pp128x128|st128x256" $L/programs_350m.log | head -60
fi
