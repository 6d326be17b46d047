#!/usr/bin/env bash
# Session 56, call 1: the staged tile (st128x256). Registers/spills of its kernels; a plain 1.5B
# shape on every tile (checked against cuBLASLt, short rounds); each 1.5B fused program on every
# tile it runs on, back to back (bench_gemm --energy); 1.5B training steps with the programs that
# allow it on the staged tile against the default plan; the GEMM tests (every program on every tile).
# The defaults are call 1 as it ran. The call prepared for branch staged-4wg-56 (which got no
# machine; its codagpt binary not rebuilt): CALL=call3 ENERGY=0.4 TRAIN=0 TEST_BY=230 P350_BY=240.
CALL=${CALL:-call1} ENERGY=${ENERGY:-0.6} TRAIN=${TRAIN:-1} TEST_BY=${TEST_BY:-440} P350_BY=${P350_BY:-0}
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
D=$PWD/.carry/dev56
export CODAGPT_COMMIT=${COMMIT:-41bcd32+staged}
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=$OUT/$CALL; mkdir -p $L
finish() { cd $OUT && tar -czf $CALL.tgz $CALL && rm -rf $CALL; el done; }
trap finish EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
/usr/local/cuda/bin/cuobjdump --dump-resource-usage $D/bench_gemm 2>/dev/null > $L/resource_usage.txt
grep -A1 "ILi128ELi256ELi3ELb0ELi1ELb1E" $L/resource_usage.txt | grep -o "REG:[0-9]* STACK:[0-9]* SHARED:[0-9]* LOCAL:[0-9]*" | sort | uniq -c > $L/staged_regs.txt
el "regs:"; cat $L/staged_regs.txt
timeout 60 $D/bench_gemm --only "1.5b fc fwd" --sweep --reps 10 --no-fused > $L/plain_sweep.log 2>&1
el "plain sweep rc=$?"; grep -E "^1.5b|geomean|FAIL" $L/plain_sweep.log
timeout 200 $D/bench_gemm --only none --sweep --reps 5 --energy $ENERGY --model 1.5b --json $L/programs_1.5b.json > $L/programs_1.5b.log 2>&1
el "programs 1.5b rc=$?"; grep -E "energy|x plain|^1.5b" $L/programs_1.5b.log | head -120
train() {  # model tag [env]
  local model=$1 tag=$2; shift 2
  env "$@" timeout 80 $D/codagpt train --config $D/configs/$model.json --device cuda --fusion ${FUSION:-coda} --recompute none \
    --steps ${STEPS:-15} --train_data "$D/data/train_*.bin" --val_data "$D/data/val_*.bin" --eval_every 0 --eval_batches 2 \
    --log_every 5 --quiet --out_dir /tmp/runs56/$model-$tag --bench-json $L/train.json > $L/train_$model-$tag.log 2>&1
  el "$model $tag rc=$?: $(grep -E '^done' $L/train_$model-$tag.log | tail -1)"
}
if [[ $TRAIN == 1 ]]; then
  train gpt2-1.5b coda1
  train gpt2-1.5b staged1 CODAGPT_GEMM_TILE=st128x256
fi
left=$(( TEST_BY - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $D/test_gpu_gemm > $L/test_gpu_gemm.log 2>&1
el "test_gpu_gemm rc=$?: $(tail -3 $L/test_gpu_gemm.log | tr '\n' ' ')"
grep -E "FAILED|Failure" $L/test_gpu_gemm.log | head -20
left=$(( P350_BY - ($(date +%s) - start) ))
if (( P350_BY > 0 && left > 60 )); then
  timeout $left $D/bench_gemm --only none --sweep --reps 5 --energy 0.5 --model 350m --json $L/programs_350m.json > $L/programs_350m.log 2>&1
  el "programs 350m rc=$?"; grep -E "x plain|pp128x128|st128x256" $L/programs_350m.log | head -60
fi
