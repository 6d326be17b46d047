#!/usr/bin/env bash
# Where do the paths' gradients part? One or more training steps from the same checkpoint on each
# path, with --grad-norms, then each tensor's gradient norm (per layer) against the first path's:
#   bash scripts/grad_compare.sh OUT "cpu unfused coda" <codagpt train options>
# The options must resume a checkpoint and stop soon, e.g.
#   --config configs/gpt2-350m.json --steps 300 --seed 1338 --resume runs/x/ckpt_12.bin --stop-after 13
# (the same --steps as the run that wrote it: the schedule depends on it). Paths: cpu (the fp32
# reference), unfused, coda. Each path trains in OUT/<path> (metrics.jsonl, its log); the table
# (OUT/compare.txt) lists, for each step and path, the gradient norm and the tensors whose norm
# departs most from the first path's, then every layer's largest departure. CODAGPT names the
# binary (default build/codagpt). DUMP_LAYERS="17,16" has each path dump those layers' activations
# and gradients of its first step into OUT/<path>/dump (CODAGPT_DUMP, src/tensor_dump.hpp), for
# scripts/compare_dumps.py.
set -euo pipefail
[[ $# -ge 3 ]] || { echo "usage: grad_compare.sh OUT \"PATH...\" <codagpt train options>" >&2; exit 2; }
out=$1 paths=$2; shift 2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${CODAGPT:-$root/build/codagpt}
for p in $paths; do
  [[ $p == cpu || $p == unfused || $p == coda ]] || { echo "grad_compare: unknown path '$p' (cpu, unfused or coda)" >&2; exit 2; }
done
mkdir -p "$out"
for p in $paths; do
  if [[ $p == cpu ]]; then dev=(--device cpu); else dev=(--device cuda --fusion "$p"); fi
  rm -rf "${out:?}/$p"
  dump=()
  if [[ -n ${DUMP_LAYERS:-} ]]; then mkdir -p "$out/$p/dump"; dump=(env "CODAGPT_DUMP=$out/$p/dump:$DUMP_LAYERS"); fi
  "${dump[@]}" "$bin" train "$@" "${dev[@]}" --grad-norms --ckpt_every 0 --log_every 1 --quiet --out_dir "$out/$p" \
    > "$out/$p.log" 2>&1 || { echo "grad_compare: the $p run failed: $(tail -1 "$out/$p.log")" >&2; exit 1; }
done
python3 - "$out" $paths <<'PY' | tee "$out/compare.txt"
import json, sys
out, paths = sys.argv[1], sys.argv[2:]
def steps(p):
    return {j["step"]: j for j in map(json.loads, open(f"{out}/{p}/metrics.jsonl")) if "grad_norms" in j}
runs = {p: steps(p) for p in paths}
ref = paths[0]
def flat(norms):  # (tensor, layer or None) -> norm
    for name, v in norms.items():
        if isinstance(v, list):
            for l, x in enumerate(v): yield (name, l), x
        else:
            yield (name, None), v
for step in sorted(runs[ref]):
    r = dict(flat(runs[ref][step]["grad_norms"]))
    print(f"step {step}: {ref} loss {runs[ref][step].get('loss', float('nan')):.5f} grad norm {runs[ref][step].get('grad_norm', float('nan')):.4f}")
    for p in paths[1:]:
        if step not in runs[p]: continue
        j = runs[p][step]
        ratio = {k: (x / r[k] if r[k] > 0 else float("inf")) for k, x in flat(j["grad_norms"])}
        label = lambda k: k[0] + ("" if k[1] is None else f"[{k[1]}]")
        worst = sorted(ratio, key=lambda k: -abs(ratio[k] - 1))[:8]
        print(f"  {p}: loss {j.get('loss', float('nan')):.5f} grad norm {j.get('grad_norm', float('nan')):.4f}; "
              "most apart: " + ", ".join(f"{label(k)} {ratio[k]:.3f}x" for k in worst))
        layers = sorted({k[1] for k in ratio if k[1] is not None})
        if layers:
            print("    by layer (largest departure): " + " ".join(
                f"{l}:{max((ratio[k] for k in ratio if k[1] == l), key=lambda x: abs(x - 1)):.3f}" for l in layers))
PY
