#!/usr/bin/env bash
# Sixtieth session: --nondeterministic-attention on the device (binaries of b0213df in
# .carry/dev60e): test_gpu_coda (its new atomic-attention case among the rest), then 350M and 1.5B,
# each path, with and without the flag, 30 steps. Carry .carry/dev60e:
#   COMMIT=<built commit> bash bench/run_nondet60.sh
set -uo pipefail
start=$(date +%s)
D=$PWD/.carry/dev60e
export CODAGPT_COMMIT=${COMMIT:-unknown}
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv,noheader | tee $OUT/gpu.txt
timeout 300 $D/test_gpu_coda > $OUT/test_gpu_coda.log 2>&1
echo "[$(( $(date +%s) - start )) s] test_gpu_coda rc=$?: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/test_gpu_coda.log | tr '\n' ' ')"
grep -E "FAILED|Failure" $OUT/test_gpu_coda.log | head
grep -A3 "AtomicAttention" $OUT/test_gpu_coda.log | grep -E "attention|loss|OK" | head -8
run() {  # model fusion tag [flag]
  local model=$1 fusion=$2 tag=$3; shift 3
  timeout 100 $D/codagpt train --config $D/configs/$model.json --device cuda --fusion $fusion "$@" \
    --steps ${STEPS:-30} --train_data "$D/data/train_*.bin" --val_data "$D/data/val_*.bin" \
    --eval_every 0 --eval_batches 2 --log_every 10 --quiet --out_dir /tmp/runs60e/$model-$fusion-$tag \
    --bench-json $OUT/train.json > $OUT/train_$model-$fusion-$tag.log 2>&1
  echo "[$(( $(date +%s) - start )) s] $model $fusion $tag rc=$?: $(grep -E '^done' $OUT/train_$model-$fusion-$tag.log)"
}
for model in gpt2-350m gpt2-1.5b; do
  for fusion in coda unfused; do
    run $model $fusion det
    run $model $fusion nondet --nondeterministic-attention
  done
done
grep -h "attention" $OUT/train_gpt2-350m-*-*.log | head -4
