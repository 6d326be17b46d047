#!/usr/bin/env bash
# Session 51, third call: the LM head's default chunks as committed (the fewest chunks within the
# cap, cut where the plan prices their dX GEMMs least: 1.5B 4 x 4096 as before, 350M 6272 + 5888 +
# 4224 against cc0fa76's 3 x ~5464). GPU tests of the model code; one traced 350M step each, base and
# new; 350M tok/s A/B, alternating, three times; then the table with the new binary.
# Expect: tests pass; the 350M LM head kernels ~0.5 ms less a step (LnBackwardX, LmHeadForward, CE,
# dW); tok/s new >= base; 1.5B unchanged (4 x 4096); 350M device memory +78 MiB.
set -uo pipefail
start=$(date +%s)
rm -rf /tmp/dev51 /tmp/dev51c; tar -xJf .carry/dev51/dev51.tar.xz -C /tmp; tar -xJf .carry/dev51/dev51c.tar.xz -C /tmp
D=/tmp/dev51; N=/tmp/dev51c
mkdir -p $D/base && cp $D/codagpt $D/base/codagpt
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=/tmp/logs51c; mkdir -p $L
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
pack() { tar -cJf $OUT/logs51c.tar.xz -C /tmp logs51c; }
for t in test_gpu_coda test_gpu_model test_gpu_checkpoint test_gpu_sample; do
  timeout 150 $N/$t > $L/$t.log 2>&1; el "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' $L/$t.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' $L/$t.log | head -5
done
pack
run() {  # model bin-dir tag [extra args]
  local m=$1 bin=$2 tag=$1_$3; shift 3
  timeout 100 $bin/codagpt train --config $D/configs/gpt2-$m.json --device cuda --fusion coda \
    --out_dir /tmp/run_$tag --train_data "$D/data/train_*.bin" --val_data "$D/data/val_*.bin" --eval_every 0 \
    --eval_batches 1 --log_every 10 "$@" > $L/step_$tag.log 2>&1
  el "$tag rc=$? $(grep '^done' $L/step_$tag.log)"
}
run 350m $D/base trace_base --steps 4 --trace-kernels $L/trace_350m_base.txt
run 350m $N trace_new --steps 4 --trace-kernels $L/trace_350m_new.txt
for R in 1 2 3; do run 350m $D/base base_r$R --steps 30; run 350m $N new_r$R --steps 30; done
run 1.5b $N cut_new --steps 2
grep -h "codagpt train:" $L/step_*.log | sort | uniq -c
pack
mkdir -p $D/newbin && cp -r $D/configs $D/data $D/torch_gpt2.py $D/newbin/ && cp $N/codagpt $D/newbin/codagpt
STEPS=30 PEER=1 RECOMPUTE=none RUNS_DIR=/tmp/table_runs bash scripts/reproduce_table.sh $D/newbin $L/table
grep -E "codagpt train:" $L/table/table.log | head -4
cat $L/table/table.md
pack
