#!/usr/bin/env bash
# Session 54, second call: the trainer's own SM clock (a thread reading nvmlDeviceGetClockInfo every
# 20 ms) checked: its GPU test, then one 1.5B run a path beside nvidia-smi -lms 20, then the
# paper-style table with the new column.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
rm -rf /tmp/dev54; tar -xJf .carry/dev54.tar.xz -C /tmp
D=/tmp/dev54
export CODAGPT_COMMIT=${COMMIT:-unknown}
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=/tmp/logs54b; rm -rf $L; mkdir -p $L
pack() { tar -cJf $OUT/logs54b.tar.xz -C /tmp logs54b; }
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
timeout 120 $D/test_gpu_model --gtest_filter='GPUModel.ClockSamples*:GPUModel.EnergyCounter*' > $L/test_gpu_model_clock.log 2>&1
el "test_gpu_model clock/energy rc=$?"; grep -E "samples|read right|W \(limit|OK \]|FAILED|Failure" $L/test_gpu_model_clock.log
Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.sw_power_cap
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done; }
for f in unfused coda; do
  tag=1.5b-$f-1
  nvidia-smi --query-gpu=$Q --format=csv,noheader,nounits -lms 20 > $L/smi_$tag.csv 2>&1 &
  smi=$!
  echo "$(date +%s.%N) $(date "+%Y/%m/%d %H:%M:%S.%N")" > $L/t0_$tag.txt
  timeout 240 stdbuf -oL $D/codagpt train --config $D/configs/gpt2-1.5b.json --device cuda --fusion $f --recompute none \
    --steps 30 --train_data "$D/data/train_*.bin" --val_data "$D/data/val_*.bin" --eval_every 0 --eval_batches 4 \
    --log_every 1 --out_dir /tmp/runs54/$tag --bench-json $L/clock_runs.json 2>&1 | stamp > $L/train_$tag.log
  kill $smi; wait $smi 2>/dev/null
  el "$tag: $(grep -o '[0-9]* tok/s.*' $L/train_$tag.log | tail -1)"
done
pack
STEPS=30 PEER=1 RECOMPUTE=none RUNS_DIR=/tmp/table_runs bash scripts/reproduce_table.sh $D $L/table
el table; cat $L/table/table.md; pack
