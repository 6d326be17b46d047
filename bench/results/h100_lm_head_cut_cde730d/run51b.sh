#!/usr/bin/env bash
# Session 51, second call: the LM head's chunks cut by the engine's plan cost (1.5B: 4 x 3840 +
# 1024 rows; 350M: 6272 + 4224 + 5888) against cc0fa76's even chunks (4 x 4096; 3 x ~5464).
# test_gpu_coda and test_gpu_dist (codagpt beside them) with the new binaries; one traced fused
# step each, base and new, 1.5B and 350M (the LM head's kernels: LnBackwardX launches 96 + chunks);
# then tok/s A/B, alternating base / new, twice.
# Expect: tests pass; new LnBackwardX total below base's by ~1 ms (1.5B) and ~0.3 ms (350M), the
# same 96 layer launches; tok/s new >= base within noise; 1.5B device memory unchanged, 350M +81 MiB.
set -uo pipefail
rm -rf /tmp/dev51 /tmp/dev51b; tar -xJf .carry/dev51/dev51.tar.xz -C /tmp; tar -xJf .carry/dev51/dev51b.tar.xz -C /tmp
D=/tmp/dev51; N=/tmp/dev51b
mkdir -p $D/base && cp $D/codagpt $D/base/codagpt
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=/tmp/logs51b; mkdir -p $L
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
pack() { tar -cJf $OUT/logs51b.tar.xz -C /tmp logs51b; }
for t in test_gpu_coda test_gpu_dist; do
  timeout 150 $N/$t > $L/$t.log 2>&1; el "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' $L/$t.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' $L/$t.log | head -5
done
pack
run() {  # model bin-dir tag [extra args]
  local m=$1 bin=$2 tag=$1_$3; shift 3
  [ $(( $(date +%s) - T0 )) -gt 540 ] && { el "skip $tag (time)"; return; }
  timeout 100 $bin/codagpt train --config $D/configs/gpt2-$m.json --device cuda --fusion coda \
    --out_dir /tmp/run_$tag --train_data "$D/data/train_*.bin" --val_data "$D/data/val_*.bin" --eval_every 0 \
    --eval_batches 1 --log_every 10 "$@" > $L/step_$tag.log 2>&1
  el "$tag rc=$? $(grep '^done' $L/step_$tag.log)"
}
for m in 1.5b 350m; do
  run $m $D/base trace_base --steps 4 --trace-kernels $L/trace_${m}_base.txt
  run $m $N trace_new --steps 4 --trace-kernels $L/trace_${m}_new.txt
  for v in base new; do
    f=$L/trace_${m}_$v.txt
    [ -f $f ] && el "$m $v: $(grep -E 'LnBackwardX|LmHeadForward|CrossEntropyGradient|all kernels' $f | tail -5 | tr -s ' ' | tr '\n' ';')"
  done
done
pack
for R in 1 2; do for m in 1.5b 350m; do
  run $m $D/base base_r$R --steps 30; run $m $N new_r$R --steps 30
done; done
pack
