#!/usr/bin/env bash
# CODAGPT_DUMP and scripts/compare_dumps.py end to end on the CPU reference (gpt2-tiny, one step):
# two runs from other seeds dump both layers; the script finds no difference between a directory
# and itself and a difference in every tensor between the runs, and splits dout[0]'s difference
# along 1 and xhat (x of layer 1 is dumped). Skips (77) without a python3 that has numpy.
# Usage: compare_dumps.sh path/to/codagpt   (from the repository root)
set -euo pipefail
bin=$1
py=
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import numpy' 2>/dev/null; then py=$p; break; fi
done
[[ -n $py ]] || { echo "skip: no python3 with numpy"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Shards of a small text, by `codagpt prepare` (the GPT-2 tokenizer files under data/gpt2).
for i in $(seq 400); do printf 'First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n'; done > "$tmp/text.txt"
"$bin" prepare --input "$tmp/text.txt" --out "$tmp" --split-on-blank-lines > /dev/null
for seed in 1 2; do
  mkdir -p "$tmp/d$seed"
  CODAGPT_DUMP="$tmp/d$seed:0,1" "$bin" train --config configs/gpt2-tiny.json --device cpu --steps 1 --eval_every 0 \
    --train_data "$tmp/train_*.bin" --val_data "$tmp/val_*.bin" \
    --seed $seed --quiet --out_dir "$tmp/run$seed" > "$tmp/train$seed.log" 2>&1 || { cat "$tmp/train$seed.log"; exit 1; }
done
out=$("$py" scripts/compare_dumps.py --seq-len 64 --embd 64 --heads 4 "$tmp/d1" "$tmp/d1" "$tmp/d2")
echo "$out"
fail=0
check() {  # check "what" count expected
  if [[ $2 -ne $3 ]]; then echo "FAIL: $1: $2 lines, expected $3"; fail=1; fi
}
check "tensors against themselves with no difference" "$(grep -c '] d1: rel 0.00e+00;' <<<"$out")" 12
check "tensors of the other seed with a difference" "$(grep '] d2: rel ' <<<"$out" | grep -vc 'rel 0.00e+00')" 12
check "dout[0] split along 1 and xhat" "$(grep -c '^dout\[0\] d2: .*along 1: .*along xhat: ' <<<"$out")" 1
exit $fail
