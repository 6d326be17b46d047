#!/usr/bin/env bash
# On a GPU machine: runs the GPU tests and/or the training benchmarks from a folder made by
# scripts/device_pack.sh. Everything lands in three files under $OUT (default ./gpu_out):
# tests.log, bench.log and train_bench.json (benchmark records, bench/results format).
#   bash scripts/gpu_check.sh DIR tests      every GPU test binary
#   bash scripts/gpu_check.sh DIR bench      350M and 1.5B at B=16, T=1024: codagpt (GELU kept and
#                                            recomputed) and the PyTorch peer (eager and compiled)
#   bash scripts/gpu_check.sh DIR all
# STEPS (default 30) sets the benchmark's steps; PEER_COMPILE="0 1" (default) which peer modes run.
set -uo pipefail
dir=$1; what=${2:-tests}
out=${OUT:-gpu_out}; mkdir -p "$out"
runs=$(mktemp -d)
# cuBLASLt and cuDNN where the GPU machine keeps them (../shared/DEVICE.md)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
summary=()

if [[ $what == tests || $what == all ]]; then
  for t in "$dir"/test_gpu_*; do
    name=$(basename "$t")
    start=$(date +%s%N)
    "$t" > "$runs/$name.log" 2>&1; rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    { echo "===== $name (rc=$rc, $ms ms)"; cat "$runs/$name.log"; } >> "$out/tests.log"
    summary+=("$(printf '%-20s rc=%d %6d ms %s' "$name" "$rc" "$ms" \
                "$(grep -E '^\[  (PASSED|FAILED)  \]' "$runs/$name.log" | tr '\n' ' ')")")
  done
fi

if [[ $what == bench || $what == all ]]; then
  data=(--train_data "$dir/data/train_*.bin" --val_data "$dir/data/val_*.bin" --eval_every 0 --eval_batches 1)
  json=$out/train_bench.json
  for model in gpt2-350m gpt2-1.5b; do
    for recompute in none gelu; do
      log=$runs/train-$model-$recompute.log
      "$dir/codagpt" train --config "$dir/configs/$model.json" --device cuda --steps "${STEPS:-30}" --recompute $recompute \
        --out_dir "$runs/run-$model-$recompute" "${data[@]}" --log_every 5 --bench-json "$json" > "$log" 2>&1
      { echo "===== codagpt $model recompute=$recompute"; cat "$log"; } >> "$out/bench.log"
      summary+=("codagpt $model recompute=$recompute: $(grep -E '^done|error' "$log")")
    done
  done
  if [[ -f "$dir/torch_gpt2.py" ]]; then
    for compile in ${PEER_COMPILE:-0 1}; do
      for shape in "gpt2-350m 24 1024 16" "gpt2-1.5b 48 1600 25"; do
        read -r model layers dim heads <<< "$shape"
        line=$(python3 "$dir/torch_gpt2.py" --layers "$layers" --dim "$dim" --heads "$heads" --batch 16 \
               --compile $compile --model "$model" --json-out "$json" 2>>"$out/bench.log" | tail -1)
        echo "===== pytorch $model compile=$compile: $line" >> "$out/bench.log"
        summary+=("pytorch compile=$compile $model: $line")
      done
    done
  fi
fi

rm -rf "$runs"
printf '%s\n' "${summary[@]}"
