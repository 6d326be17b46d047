#!/usr/bin/env bash
# Session 50, second call: the LM head's default chunks (1.5B: 4 of 4096 rows; 350M: 3 of 5464)
# with dy in df's place (8 M C of scratch). Tests of the changed model code, then tok/s A/B, twice,
# alternating: base (338f254) coda, new coda (default chunks), new coda --lm-head-chunks 1.
# Expect: tests pass; 1.5B fused device memory below 50,000 MiB (run 1: 50,015 with 9 M C and
# chunks of 4608); tok/s of new within ~1% of base and of --lm-head-chunks 1.
set -uo pipefail
X=.carry/dev50
rm -rf /tmp/dev50; tar -xJf $X/dev50.tar.xz -C /tmp
D=/tmp/dev50
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=/tmp/logs50b; mkdir -p $L
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
pack() { tar -cJf $OUT/logs50b.tar.xz -C /tmp logs50b; }
for t in test_gpu_coda test_gpu_model test_gpu_checkpoint; do
  timeout 150 $D/new/$t > $L/$t.log 2>&1; el "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' $L/$t.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' $L/$t.log | head -5
done
pack
run() {  # model version tag [extra args]
  local m=$1 v=$2 tag=$1_$3_r$R; shift 3
  [ $(( $(date +%s) - T0 )) -gt 540 ] && { el "skip $tag (time)"; return; }
  timeout 90 $D/$v/codagpt train --config $D/configs/gpt2-$m.json --device cuda --fusion coda --steps 30 \
    --out_dir /tmp/run_$tag --train_data "$D/data/train_*.bin" --val_data "$D/data/val_*.bin" --eval_every 0 \
    --eval_batches 1 --log_every 10 "$@" > $L/step_$tag.log 2>&1
  el "$tag rc=$? $(grep '^done' $L/step_$tag.log)"
}
for R in 1 2; do for m in 1.5b 350m; do
  run $m base base; run $m new new; run $m new one --lm-head-chunks 1
done; done
pack
