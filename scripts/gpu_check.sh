#!/usr/bin/env bash
# On a GPU machine: runs the GPU tests and/or the training benchmarks from a folder made by
# scripts/device_pack.sh. Everything lands under $OUT (default ./gpu_out): tests.log, bench.log and
# train_bench.json (benchmark records, bench/results format), and each mode's own files below.
#   bash scripts/gpu_check.sh DIR tests      every GPU test binary
#   bash scripts/gpu_check.sh DIR bench      350M and 1.5B at B=16, T=1024: codagpt (each --recompute
#                                            mode) and the PyTorch peer (eager and compiled)
#   bash scripts/gpu_check.sh DIR trace      the kernels of one training step and their times, each
#                                            fusion path, 350M and 1.5B (TRACE_MODELS):
#                                            trace_{coda,unfused}_{350m,1.5b}.txt
#   bash scripts/gpu_check.sh DIR parity     350M on TinyShakespeare, PARITY_STEPS (default 300) steps,
#                                            same seed and data, both paths, each also with 16
#                                            sequences a step as 2 x 8 accumulated micro-batches (a
#                                            control: other sampling and summation order), the
#                                            fused path again with every GEMM on the 128 x 256 tile
#                                            (a control that changes rounding alone: same data,
#                                            same schedule), and both paths with each seed of
#                                            PARITY_SEEDS (default none) at B = 16:
#                                            parity_{coda,unfused}_{b16,accum2,seedS}.jsonl,
#                                            parity_coda_tile.jsonl (the runs' metrics) and
#                                            parity.json (a parity record)
#   bash scripts/gpu_check.sh DIR eval       EVAL_MODEL (default gpt2-350m), 16 steps with a checkpoint,
#                                            each path; `codagpt eval` of each checkpoint on each path:
#                                            eval.log, and a failure line where eval on the run's own
#                                            path does not give the run's last logged validation loss
#                                            (and HellaSwag accuracies, with HELLASWAG=FILE) bit for bit
#   bash scripts/gpu_check.sh DIR all        tests and bench
# STEPS (default 30) sets the benchmark's steps; PEER_COMPILE="0 1" (default) which peer modes run.
set -uo pipefail
dir=$1; what=${2:-tests}
shards=(--train_data "$dir/data/train_*.bin" --val_data "$dir/data/val_*.bin")  # the prepared TinyShakespeare
out=${OUT:-gpu_out}; mkdir -p "$out"
runs=$(mktemp -d)
# cuBLASLt, cuDNN and NCCL where the GPU machine keeps them (../shared/DEVICE.md); DIR: carried libraries
export LD_LIBRARY_PATH=$dir:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
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
  data=("${shards[@]}" --eval_every 0 --eval_batches 1)
  json=$out/train_bench.json
  for model in gpt2-350m gpt2-1.5b; do
    for recompute in none gelu mlp; do
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

if [[ $what == trace ]]; then
  for model in ${TRACE_MODELS:-gpt2-350m gpt2-1.5b}; do
    for fusion in coda unfused; do
      name=trace_${fusion}_${model#gpt2-}
      "$dir/codagpt" train --config "$dir/configs/$model.json" --device cuda --fusion $fusion --steps 3 --quiet \
        "${shards[@]}" --eval_every 0 --eval_batches 1 \
        --out_dir "$runs/$name" --trace-kernels "$out/$name.txt" > "$runs/$name.log" 2>&1
      summary+=("$name: $(grep -E 'kernels of step|error' "$runs/$name.log")")
      summary+=("$(grep -A12 'kernels of step' "$runs/$name.log" | tail -12)")
      summary+=("$(grep 'all kernels' "$runs/$name.log")")
    done
  done
fi

if [[ $what == eval ]]; then
  model=${EVAL_MODEL:-gpt2-350m}
  hs=(); [[ -n ${HELLASWAG:-} ]] && hs=(--hellaswag_data "$HELLASWAG")
  for fusion in coda unfused; do
    run=$runs/eval-$fusion
    "$dir/codagpt" train --config "$dir/configs/$model.json" --device cuda --fusion $fusion --steps 16 \
      "${shards[@]}" --eval_every 8 --eval_batches 4 \
      --ckpt_every 16 --log_every 8 --quiet --out_dir "$run" "${hs[@]}" >> "$out/eval.log" 2>&1
    for path in coda unfused; do
      "$dir/codagpt" eval --checkpoint "$run/ckpt_16.bin" --device cuda --fusion $path --json > "$run/eval_$path.json" 2>> "$out/eval.log"
      line=$(python3 - "$run/metrics.jsonl" "$run/eval_$path.json" "$fusion" "$path" <<'PY'
import json, sys
fusion, path = sys.argv[3], sys.argv[4]
try:  # the run's last validation line, and eval's result
    logged = [json.loads(l) for l in open(sys.argv[1]) if '"val_loss"' in l][-1]
    ev = json.load(open(sys.argv[2]))
    val = ev["val_loss"]
except (ValueError, OSError, IndexError, KeyError):
    sys.exit(print(f"eval of the {fusion} run's checkpoint on {path}: FAILED, no result (see eval.log)"))
hs = ev.get("hellaswag", {})  # both sides have HellaSwag, or neither
same = val == logged["val_loss"] and all(hs.get(k) == logged.get("hellaswag_" + k) for k in ("acc_norm", "acc"))
def shown(loss, acc_norm, acc):
    return f"val loss {loss!r}" + ("" if acc_norm is None else f", HellaSwag acc_norm {acc_norm} acc {acc}")
logged_shown = shown(logged["val_loss"], logged.get("hellaswag_acc_norm"), logged.get("hellaswag_acc"))
verdict = "" if fusion != path else (" (the logged value, bit for bit)" if same else " FAILED: the run logged " + logged_shown)
print(f"eval of the {fusion} run's checkpoint on {path}: {shown(val, hs.get('acc_norm'), hs.get('acc'))}{verdict}")
PY
)
      echo "$line" >> "$out/eval.log"
      summary+=("$line")
    done
  done
fi

if [[ $what == parity ]]; then
  # Each path twice: B = 16, and 16 sequences a step as 2 accumulated micro-batches of 8 (a
  # control: the loader then draws other sequences, and the gradient sums in another order, so
  # it shows how far one path's losses move under an equally valid change of the run).
  # A third, for the fused path only: every GEMM on another tile configuration (CODAGPT_GEMM_TILE),
  # which changes how its sums round and nothing else.
  parity_run() {  # fusion, run name, extra train options...
    local fusion=$1 run=$2; shift 2
    "$dir/codagpt" train --config "$dir/configs/gpt2-350m.json" --device cuda --fusion $fusion "$@" \
      --steps "${PARITY_STEPS:-300}" "${shards[@]}" \
      --eval_every 50 --eval_batches 8 --log_every 50 --quiet --out_dir "$runs/parity-$fusion-$run" > "$runs/parity-$fusion-$run.log" 2>&1
    cp "$runs/parity-$fusion-$run/metrics.jsonl" "$out/parity_${fusion}_$run.jsonl" 2>/dev/null
    summary+=("parity $fusion $run: $(grep -E '^done|error' "$runs/parity-$fusion-$run.log")")
  }
  for fusion in unfused coda; do
    parity_run $fusion b16
    parity_run $fusion accum2 --batch_size 8 --grad_accum 2
  done
  CODAGPT_GEMM_TILE=128x256 parity_run coda tile
  for seed in ${PARITY_SEEDS:-}; do
    for fusion in unfused coda; do parity_run $fusion seed$seed --seed $seed; done
  done
  python3 - "$out" <<'PY' && summary+=("$(cat "$out/parity.line")")
import json, os, subprocess, sys, datetime
out = sys.argv[1]
def val(name):
    vals = [json.loads(l) for l in open(f"{out}/parity_{name}.jsonl") if '"val_loss"' in l]
    return vals[-1]["val_loss"], vals[-1]["step"]
(u, steps), (c, _) = val("unfused_b16"), val("coda_b16")
u2, c2 = val("unfused_accum2")[0], val("coda_accum2")[0]
ct = val("coda_tile")[0]
seeds = []
for seed in os.environ.get("PARITY_SEEDS", "").split():
    us, cs = val(f"unfused_seed{seed}")[0], val(f"coda_seed{seed}")[0]
    seeds.append({"seed": int(seed), "val_loss_coda": cs, "val_loss_unfused": us, "rel_diff": abs(cs - us) / us})
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                     text=True).stdout.strip().splitlines()[0]
rec = {"kind": "parity", "gpu": gpu, "commit": os.environ.get("CODAGPT_COMMIT", "unknown"),
       "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
       "command": "bash scripts/gpu_check.sh DIR parity", "model": "gpt2-350m", "steps": steps,
       "val_loss_coda": c, "val_loss_unfused": u, "rel_diff": abs(c - u) / u,
       "control": {"what": "16 sequences a step as 2 x 8 accumulated micro-batches (other sampling, other summation order)",
                   "val_loss_coda": c2, "val_loss_unfused": u2,
                   "rel_diff_unfused": abs(u2 - u) / u, "rel_diff_coda": abs(c2 - c) / c},
       "rounding_control": {"what": "the fused path with every GEMM on the 128 x 256 tile (CODAGPT_GEMM_TILE): same data and schedule, other rounding",
                            "val_loss_coda": ct, "rel_diff_coda": abs(ct - c) / c},
       "seeds": seeds}
json.dump([rec], open(f"{out}/parity.json", "w"), indent=2)
open(f"{out}/parity.line", "w").write(
    f"parity after {steps} steps: val loss coda {c:.5f}, unfused {u:.5f}, rel diff {abs(c-u)/u:.3%}; "
    f"control (2 x 8 accumulated): unfused {u2:.5f} ({abs(u2-u)/u:.3%} from B=16), coda {c2:.5f} ({abs(c2-c)/c:.3%}); "
    f"coda on 128x256 tiles {ct:.5f} ({abs(ct-c)/c:.3%})"
    + "".join(f"; seed {r['seed']}: coda {r['val_loss_coda']:.5f}, unfused {r['val_loss_unfused']:.5f} ({r['rel_diff']:.3%})" for r in seeds))
PY
  rm -f "$out/parity.line"
fi

rm -rf "$runs"
printf '%s\n' "${summary[@]}"
