#!/usr/bin/env bash
# On a GPU machine: runs the GPU tests and/or the training benchmarks from a folder made by
# scripts/device_pack.sh. Results (logs, bench JSON) go to $OUT (default ./gpu_out).
#   bash scripts/gpu_check.sh DIR tests      every GPU test binary
#   bash scripts/gpu_check.sh DIR bench      350M and 1.5B at B=16, T=1024 (codagpt unfused, PyTorch peer)
set -uo pipefail
dir=$1; what=${2:-tests}
out=${OUT:-gpu_out}; mkdir -p "$out"
# cuDNN and cuBLASLt where the GPU machine keeps them (../shared/DEVICE.md)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
summary=()

if [[ $what == tests || $what == all ]]; then
  for t in "$dir"/test_gpu_*; do
    name=$(basename "$t")
    start=$(date +%s%N)
    "$t" > "$out/$name.log" 2>&1; rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    line=$(grep -E "^\[  (PASSED|FAILED)  \]" "$out/$name.log" | tr '\n' ' ')
    summary+=("$(printf '%-20s rc=%d %6d ms %s' "$name" "$rc" "$ms" "$line")")
    grep -E "FAILED|Failure|error" "$out/$name.log" | head -20
  done
fi

if [[ $what == bench || $what == all ]]; then
  data=(--train_data "$dir/data/train_*.bin" --val_data "$dir/data/val_*.bin" --eval_every 0 --eval_batches 1)
  json=$out/train_bench.json
  for model in gpt2-350m gpt2-1.5b; do
    for recompute in none gelu; do
      "$dir/codagpt" train --config "configs/$model.json" --device cuda --steps "${STEPS:-25}" --recompute $recompute \
        --out_dir "$out/run-$model-$recompute" "${data[@]}" --log_every 5 --bench-json "$json" \
        > "$out/train-$model-$recompute.log" 2>&1
      summary+=("$model recompute=$recompute: $(tail -2 "$out/train-$model-$recompute.log" | head -1)")
    done
  done
  if [[ -f "$dir/torch_gpt2.py" ]]; then
    for compile in 0 1; do
      python3 "$dir/torch_gpt2.py" --layers 24 --dim 1024 --heads 16 --batch 16 --compile $compile \
        --model gpt2-350m --json-out "$json" >> "$out/peer.log" 2>&1
      python3 "$dir/torch_gpt2.py" --layers 48 --dim 1600 --heads 25 --batch 16 --compile $compile \
        --model gpt2-1.5b --json-out "$json" >> "$out/peer.log" 2>&1
    done
    summary+=("$(grep -h '"peer"' "$out/peer.log")")
  fi
fi

printf '%s\n' "${summary[@]}"
