#!/usr/bin/env bash
# Sixtieth session, branch attention-atomic-60: the training step with cuDNN's deterministic
# attention backward (default) against its fp32-accumulator form (CODAGPT_ATTENTION_ATOMIC=1),
# both paths, 350M and 1.5B, alternating twice; carry .carry/dev60d (codagpt of this branch).
#   COMMIT=<built commit> bash bench/run_atomic60.sh
set -uo pipefail
start=$(date +%s)
D=$PWD/.carry/dev60d
export CODAGPT_COMMIT=${COMMIT:-unknown}
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv,noheader | tee $OUT/gpu.txt
run() {  # model fusion atomic round
  CODAGPT_ATTENTION_ATOMIC=$3 timeout 100 $D/codagpt train --config $D/configs/$1.json --device cuda --fusion $2 \
    --recompute none --steps ${STEPS:-30} --train_data "$D/data/train_*.bin" --val_data "$D/data/val_*.bin" \
    --eval_every 0 --eval_batches 2 --log_every 10 --quiet --out_dir /tmp/runs60d/$1-$2-$3-$4 \
    --bench-json $OUT/train.json > $OUT/train_$1-$2-atomic$3-r$4.log 2>&1
  echo "[$(( $(date +%s) - start )) s] $1 $2 atomic=$3 r$4 rc=$?: $(grep -E '^done' $OUT/train_$1-$2-atomic$3-r$4.log)"
}
for round in 1 2; do
  for model in gpt2-350m gpt2-1.5b; do
    for fusion in coda unfused; do
      run $model $fusion 0 $round
      run $model $fusion 1 $round
    done
  done
done
