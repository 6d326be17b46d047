#!/usr/bin/env bash
# Session 57, call 1: the staged tile with a fourth warpgroup for the epilogue (branch staged-4wg-56,
# f18f1cf; binaries in D built from it). Registers/spills of its kernels; the GEMM tests (every
# program on every tile, the staged tile's cases included); a plain 1.5B shape on every tile
# (checked against cuBLASLt, short rounds); each fused program on every tile it runs on, back to
# back (bench_gemm --energy), 1.5B then 350M; training steps with the programs that allow it on the
# staged tile (CODAGPT_GEMM_TILE=st128x256) against the default plan, 1.5B then 350M.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
D=$PWD/.carry/dev57
export CODAGPT_COMMIT=${COMMIT:-f18f1cf}
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=$OUT/call1; mkdir -p $L
finish() { cd $OUT && tar -czf call1.tgz call1 && rm -rf call1; el done; }
trap finish EXIT
by() { local left=$(( $1 - ($(date +%s) - start) )); echo $(( left > 20 ? left : 20 )); }
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
/usr/local/cuda/bin/cuobjdump --dump-resource-usage $D/bench_gemm 2>/dev/null > $L/resource_usage.txt
grep -A1 "ILi128ELi256ELi3ELb0ELi1ELb1E" $L/resource_usage.txt | grep -o "REG:[0-9]* STACK:[0-9]* SHARED:[0-9]* LOCAL:[0-9]*" | sort | uniq -c > $L/staged_regs.txt
el "regs:"; cat $L/staged_regs.txt
timeout 60 $D/test_gpu_gemm --gtest_filter='*st128x256*:*Staged*:*staged*' > $L/test_staged.log 2>&1
el "test_gpu_gemm staged rc=$?: $(tail -2 $L/test_staged.log | tr '\n' ' ')"
grep -E "FAILED|Failure" $L/test_staged.log | head -10
timeout 45 $D/bench_gemm --only "1.5b fc fwd" --sweep --reps 10 --no-fused > $L/plain_sweep.log 2>&1
el "plain sweep rc=$?"; grep -E "^1.5b|geomean|FAIL" $L/plain_sweep.log
timeout $(by 230) $D/bench_gemm --only none --sweep --reps 5 --energy 0.4 --model 1.5b --json $L/programs_1.5b.json > $L/programs_1.5b.log 2>&1
el "programs 1.5b rc=$?"; grep -E "x plain|pp128x128|st128x256" $L/programs_1.5b.log | head -60
train() {  # model tag [env]
  local model=$1 tag=$2; shift 2
  env "$@" timeout 75 $D/codagpt train --config $D/configs/$model.json --device cuda --fusion coda --recompute none \
    --steps ${STEPS:-15} --train_data "$D/data/train_*.bin" --val_data "$D/data/val_*.bin" --eval_every 0 --eval_batches 2 \
    --log_every 5 --quiet --out_dir /tmp/runs57/$model-$tag --bench-json $L/train.json > $L/train_$model-$tag.log 2>&1
  el "$model $tag rc=$?: $(grep -E '^done' $L/train_$model-$tag.log | tail -1)"
}
if [[ -x $D/codagpt ]]; then
  train gpt2-1.5b coda1
  train gpt2-1.5b staged1 CODAGPT_GEMM_TILE=st128x256
  train gpt2-350m coda1
  train gpt2-350m staged1 CODAGPT_GEMM_TILE=st128x256
fi
left=$(( 470 - ($(date +%s) - start) ))
if (( left > 40 )); then
  timeout $left $D/bench_gemm --only none --sweep --reps 5 --energy 0.3 --model 350m --json $L/programs_350m.json > $L/programs_350m.log 2>&1
  el "programs 350m rc=$?"; grep -E "x plain|pp128x128|st128x256" $L/programs_350m.log | head -60
fi
timeout $(by 560) $D/test_gpu_gemm > $L/test_gpu_gemm.log 2>&1
el "test_gpu_gemm rc=$?: $(tail -3 $L/test_gpu_gemm.log | tr '\n' ' ')"
grep -E "FAILED|Failure" $L/test_gpu_gemm.log | head -20
