#!/usr/bin/env bash
# Session 54, one call. The SM clock and power of each path's steps (nvidia-smi every 20 ms during
# 30-step runs of 1.5B and 350M, the paths alternating twice: unfused, coda, unfused, coda), to
# check on this card what the sixteenth session measured on the H200 (fused 1500 MHz against
# unfused 1590-1605). If the card is an H200: the paper-style table first.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
rm -rf /tmp/dev54; tar -xJf .carry/dev54.tar.xz -C /tmp
D=/tmp/dev54
export CODAGPT_COMMIT=${COMMIT:-42923e1}
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=/tmp/logs54a; rm -rf $L; mkdir -p $L
pack() { tar -cJf $OUT/logs54a.tar.xz -C /tmp logs54a; }
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
timeout 120 $D/test_gpu_model --gtest_filter='GPUModel.ClockSamples*:GPUModel.EnergyCounter*' > $L/test_gpu_model_clock.log 2>&1
el "test_gpu_model clock/energy rc=$?"; grep -E "samples|read right|W \(limit|OK \]|FAILED|Failure" $L/test_gpu_model_clock.log
if grep -q H200 $L/gpu.txt; then
  STEPS=30 PEER=1 RECOMPUTE=none RUNS_DIR=/tmp/table_runs bash scripts/reproduce_table.sh $D $L/table
  el table; cat $L/table/table.md; pack
fi
Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.sw_power_cap,clocks_event_reasons.hw_slowdown,clocks_event_reasons.sw_thermal_slowdown
nvidia-smi --query-gpu=$Q --format=csv,noheader,nounits > $L/smi_probe.txt 2>&1 || Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu
cat $L/smi_probe.txt
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done; }
run() {  # model fusion round
  local m=$1 f=$2 r=$3 tag=$1-$2-$3 steps=30
  [[ $m == 350m ]] && steps=60
  nvidia-smi --query-gpu=$Q --format=csv,noheader,nounits -lms 20 > $L/smi_$tag.csv 2>&1 &
  local smi=$!
  $D/nvml_probe 300 250 > $L/nvml_$tag.txt 2>&1 &
  local probe=$!
  echo "$(date +%s.%N) $(date "+%Y/%m/%d %H:%M:%S.%N")" > $L/t0_$tag.txt
  timeout 240 stdbuf -oL $D/codagpt train --config $D/configs/gpt2-$m.json --device cuda --fusion $f --recompute none \
    --steps $steps --train_data "$D/data/train_*.bin" --val_data "$D/data/val_*.bin" --eval_every 0 --eval_batches 4 \
    --log_every 1 --out_dir /tmp/runs54/$tag 2>&1 | stamp > $L/train_$tag.log
  kill $smi $probe; wait $smi $probe 2>/dev/null
  el "$tag: $(grep -o '[0-9]* tok/s.*' $L/train_$tag.log | tail -1)"
}
for m in 1.5b 350m; do
  for r in 1 2; do
    for f in unfused coda; do run $m $f $r; done
  done
  pack
done
el done
pack
