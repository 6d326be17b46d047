#!/usr/bin/env bash
# The paper-style table on one GPU: GPT-2 350M and 1.5B at B=16, T=1024, both fusion paths of
# codagpt in the same run (same seed, same data), and the PyTorch peer (torch.compile) beside them.
#   bash scripts/reproduce_table.sh DIR [OUT]
# DIR: a folder made by scripts/device_pack.sh (the codagpt binary, configs, shards, torch_gpt2.py),
# or the repository root after `make` (binary in build/). OUT (default ./table_out) receives
# table.json (benchmark records, ../shared/design/RESULTS.md format) and table.md (the table).
# Environment: STEPS (default 30) steps a run; MODELS (default "gpt2-350m gpt2-1.5b");
# PEER=0 skips the PyTorch peer; RECOMPUTE (default none): the --recompute modes, each a row of the
# table with both paths (e.g. "none mlp"; MODE:N recomputes in the first N layers only, with
# --recompute-layers N: "none mlp:31 mlp"); RUNS_DIR (default OUT/runs) receives the runs' folders
# (metrics.jsonl).
set -uo pipefail
dir=$1; out=${2:-table_out}
mkdir -p "$out"
json=$out/table.json; md=$out/table.md; log=$out/table.log
: > "$log"
bin=$dir/codagpt; [[ -x $bin ]] || bin=$dir/build/codagpt
configs=$dir/configs
data=$dir/data; [[ -f $data/val_000000.bin ]] || data=$dir/data/tinyshakespeare
[[ -x $bin ]] || { echo "reproduce_table: no codagpt binary in $dir or $dir/build" >&2; exit 1; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
steps=${STEPS:-30}

for model in ${MODELS:-gpt2-350m gpt2-1.5b}; do
  for recompute in ${RECOMPUTE:-none}; do
    mode=${recompute%%:*}; layers=()
    [[ $recompute == *:* ]] && layers=(--recompute-layers "${recompute#*:}")
    for fusion in unfused coda; do
      # Evaluation once, after the last step (same val batches for both paths).
      "$bin" train --config "$configs/$model.json" --device cuda --fusion $fusion --recompute "$mode" "${layers[@]}" \
        --steps "$steps" --train_data "$data/train_*.bin" --val_data "$data/val_*.bin" --eval_every 0 \
        --eval_batches 4 --log_every 10 --quiet --out_dir "${RUNS_DIR:-$out/runs}/$model-$fusion-${recompute/:/-}" \
        --bench-json "$json" >> "$log" 2>&1 || echo "codagpt $model $fusion --recompute $recompute failed (see $log)" >&2
      grep -E "^done|error" "$log" | tail -1
    done
  done
  if [[ ${PEER:-1} == 1 && -f $dir/torch_gpt2.py ]]; then
    case $model in
      gpt2-350m) shape="24 1024 16" ;;
      gpt2-1.5b) shape="48 1600 25" ;;
      *) shape="" ;;
    esac
    if [[ -n $shape ]]; then
      read -r layers dim heads <<< "$shape"
      python3 "$dir/torch_gpt2.py" --layers "$layers" --dim "$dim" --heads "$heads" --batch 16 --compile 1 \
        --model "$model" --json-out "$json" >> "$log" 2>&1 | tail -1
    fi
  fi
done

# The table: one row per model and --recompute mode, from this run's records only.
python3 - "$json" "$md" "$configs" <<'EOF'
import functools, json, os, sys
records = json.load(open(sys.argv[1]))
@functools.lru_cache(maxsize=None)  # a config file read once a model, not once a record and row
def n_layer(model):
    try: return json.load(open(os.path.join(sys.argv[3], model + ".json")))["n_layer"]
    except (OSError, KeyError, ValueError, TypeError): return None
def recompute_of(r):  # the row's label: the mode, with ":N" where it ran in the first N layers only
    n = r.get("recompute_layers")
    return r.get("recompute") if n in (None, 0, n_layer(r.get("model"))) else "{}:{}".format(r.get("recompute"), n)
rows = ["| model | recompute | unfused tok/s | coda tok/s | speedup | unfused GiB | coda GiB | memory saved | "
        "MFU unfused | MFU coda | val loss unfused | val loss coda | rel. diff | torch.compile tok/s | "
        "J/step unfused | J/step coda | W unfused / coda (limit) | SM MHz unfused / coda |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
rows_of = []  # (model, recompute) in the order measured
for r in records:
    if r.get("system") == "codagpt" and (r.get("model"), recompute_of(r)) not in rows_of:
        rows_of.append((r.get("model"), recompute_of(r)))
def pick(model, recompute=None, **kv):
    found = [r for r in records if r.get("model") == model and all(r.get(k) == v for k, v in kv.items())
             and (recompute is None or recompute_of(r) == recompute)]
    return found[-1] if found else None
fmt = lambda x, f: "-" if x is None else f.format(x)
limit = lambda u, c: (c or {}).get("power_limit_w") or (u or {}).get("power_limit_w")  # the GPU's, in W
for m, rc in rows_of:
    u = pick(m, system="codagpt", fusion="unfused", recompute=rc)
    c = pick(m, system="codagpt", fusion="coda", recompute=rc)
    p = pick(m, peer="pytorch+compile") or pick(m, system="pytorch-compile")
    get = lambda r, k: None if r is None else r.get(k)
    speed = get(c, "tok_s") / get(u, "tok_s") if u and c else None
    mem = 1 - get(c, "peak_mem_gib") / get(u, "peak_mem_gib") if u and c and get(u, "peak_mem_gib") else None
    rel = abs(get(c, "val_loss") - get(u, "val_loss")) / get(u, "val_loss") if u and c else None
    rows.append("| " + " | ".join([m, rc, fmt(get(u, "tok_s"), "{:,.0f}"), fmt(get(c, "tok_s"), "{:,.0f}"),
        fmt(speed, "{:.3f}x"), fmt(get(u, "peak_mem_gib"), "{:.1f}"), fmt(get(c, "peak_mem_gib"), "{:.1f}"),
        fmt(mem, "{:.1%}"), fmt(get(u, "mfu"), "{:.1%}"), fmt(get(c, "mfu"), "{:.1%}"),
        fmt(get(u, "val_loss"), "{:.4f}"), fmt(get(c, "val_loss"), "{:.4f}"), fmt(rel, "{:.3%}"),
        fmt(get(p, "tok_s"), "{:,.0f}"), fmt(get(u, "energy_j_step"), "{:.1f}"), fmt(get(c, "energy_j_step"), "{:.1f}"),
        fmt(get(u, "power_w"), "{:.0f}") + " / " + fmt(get(c, "power_w"), "{:.0f}") +
        ("" if limit(u, c) is None else " ({:.0f})".format(limit(u, c))),
        fmt(get(u, "sm_clock_mhz"), "{:.0f}") + " / " + fmt(get(c, "sm_clock_mhz"), "{:.0f}")]) + " |")
open(sys.argv[2], "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
EOF
