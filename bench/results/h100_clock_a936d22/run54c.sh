#!/usr/bin/env bash
# Session 54, third call (binaries of a936d22). On an H200: the paper-style table first. Then, on any
# card: one traced 1.5B and 350M step a path (--steps 12, the last step traced) with the trainer's
# SM clock over the steady steps, to put the kernels both paths share in cycles.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
rm -rf /tmp/dev54; tar -xJf .carry/dev54.tar.xz -C /tmp
D=/tmp/dev54
export CODAGPT_COMMIT=${COMMIT:-a936d22}
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=/tmp/logs54c; rm -rf $L; mkdir -p $L
pack() { tar -cJf $OUT/logs54c.tar.xz -C /tmp logs54c; }
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
if grep -q H200 $L/gpu.txt; then
  STEPS=30 PEER=1 RECOMPUTE=none RUNS_DIR=/tmp/table_runs bash scripts/reproduce_table.sh $D $L/table
  el table; cat $L/table/table.md; pack
fi
for m in 1.5b 350m; do
  for f in unfused coda; do
    tag=$m-$f
    timeout 150 $D/codagpt train --config $D/configs/gpt2-$m.json --device cuda --fusion $f --recompute none \
      --steps 12 --train_data "$D/data/train_*.bin" --val_data "$D/data/val_*.bin" --eval_every 0 --eval_batches 4 \
      --log_every 1 --out_dir /tmp/runs54c/$tag --trace-kernels $L/trace_$tag.txt --bench-json $L/trace_runs.json \
      > $L/train_$tag.log 2>&1
    el "$tag rc=$?: $(grep -o '[0-9]* tok/s.*' $L/train_$tag.log | tail -1)"
    pack
  done
done
el done
