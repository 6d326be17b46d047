#!/usr/bin/env bash
# Session 52, first call: zero_grad clears only the gradients kernels add into; the first backward's
# dW GEMMs write the weight matrices' gradients (beta = 0). GPU tests of the changed code, one traced
# step per model and path (new), then 1.5B tok/s A/B against cc0fa76's binary (same 1.5B code path
# but this change), alternating, twice per path.
# Expect: tests pass (the new GPUModel.EachStepsGradientsAreItsOwnAndMicroBatchesAdd too); the
# step's 6.2 GB memset (1.9 ms at 1.5B) gone from the traces; the same losses as base; tok/s +~0.5%.
set -uo pipefail
start=$(date +%s)
rm -rf /tmp/dev52; tar -xJf .carry/dev52/dev52.tar.xz -C /tmp
D=/tmp/dev52
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=/tmp/logs52a; mkdir -p $L
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
pack() { tar -cJf $OUT/logs52a.tar.xz -C /tmp logs52a; }
for t in test_gpu_model test_gpu_matmul test_gpu_coda test_gpu_checkpoint test_gpu_dist test_gpu_optim test_gpu_sample; do
  timeout 150 $D/new/$t > $L/$t.log 2>&1; el "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' $L/$t.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' $L/$t.log | head -5
done
grep -A12 "EachStepsGradients" $L/test_gpu_model.log | grep -E "grad |OK|FAIL" | head -20
pack
run() {  # model fusion bin-dir tag [extra args]
  local m=$1 fu=$2 bin=$3 tag=$1_$2_$4; shift 4
  timeout 100 $bin/codagpt train --config $D/configs/gpt2-$m.json --device cuda --fusion $fu \
    --out_dir /tmp/run_$tag --train_data "$D/data/train_*.bin" --val_data "$D/data/val_*.bin" --eval_every 0 \
    --eval_batches 1 --log_every 10 "$@" > $L/step_$tag.log 2>&1
  el "$tag rc=$? $(grep '^done' $L/step_$tag.log)"
}
for m in 1.5b 350m; do for fu in coda unfused; do
  run $m $fu $D/new trace_new --steps 4 --trace-kernels $L/trace_${m}_${fu}_new.txt
done; done
pack
for R in 1 2; do for fu in coda unfused; do
  run 1.5b $fu $D/base base_r$R --steps 30; run 1.5b $fu $D/new new_r$R --steps 30
done; done
for f in $L/step_1.5b_*_r*.log; do echo "$(basename $f): $(grep -E '^done' $f)"; done
pack
