#!/usr/bin/env bash
# Session 50: fp32 master weights kept as bf16 weights + 16 low bits (2 bytes a parameter less),
# and the fused path's LM head in row chunks (no M x Vp logits buffer). new = this session's
# binaries, base = 338f254's codagpt.
# Expect: the GPU tests of the changed code pass; 1.5B fused device memory ~50,000 MiB (was
# 54,163 on an H100 / 52.9 GiB on the H200), unfused ~2,970 MiB below its 67.2 GiB; 350M -677 MiB
# (unfused) and ~-1.1 GiB (fused); tok/s level within ~1% (the chunks' extra wte-gradient passes).
set -uo pipefail
X=.carry/dev50
tar -xJf $X/dev50.tar.xz -C /tmp
D=/tmp/dev50
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=/tmp/logs50; mkdir -p $L
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
pack() { tar -cJf $OUT/logs50.tar.xz -C /tmp logs50; }
for t in test_gpu_optim test_gpu_coda test_gpu_dist test_gpu_checkpoint test_gpu_model test_gpu_sample; do
  timeout 150 $D/new/$t > $L/$t.log 2>&1; el "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' $L/$t.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' $L/$t.log | head -5
done
pack
run() {  # model version fusion
  local tag=$1_$2_$3
  [ $(( $(date +%s) - T0 )) -gt 520 ] && { el "skip $tag (time)"; return; }
  timeout 90 $D/$2/codagpt train --config $D/configs/gpt2-$1.json --device cuda --fusion $3 --steps 12 \
    --out_dir /tmp/run_$tag --train_data "$D/data/train_*.bin" --val_data "$D/data/val_*.bin" --eval_every 0 \
    --eval_batches 1 --log_every 1 > $L/step_$tag.log 2>&1
  el "$tag rc=$? $(grep '^done' $L/step_$tag.log)"
}
for m in 1.5b 350m; do for f in coda unfused; do for v in base new; do run $m $v $f; done; done; done
pack
echo "===== losses (step, loss) base | new"
for m in 1.5b 350m; do for f in coda unfused; do
  paste <(grep -hE '^step ' $L/step_${m}_base_$f.log | awk '{print $2, $5}') <(grep -hE '^step ' $L/step_${m}_new_$f.log | awk '{print $5}') | tail -3 | sed "s/^/$m $f /"
done; done
