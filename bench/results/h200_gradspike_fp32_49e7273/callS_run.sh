#!/usr/bin/env bash
# Call S: how often does each path's gradient spike in the first 20 steps of the 350M parity
# schedule? Seeds from 2000 up, both paths per seed, until the time is spent.
D=/tmp/w; rm -rf $D; mkdir -p $D; tar xJf .carry/ab.tar.xz -C $D
export LD_LIBRARY_PATH=$D/dev:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
export PATH=/opt/torch/.venv/bin:$PATH
R=$OUT/s; mkdir -p $R; cd $D/dev
t0=$(date +%s); seed=2000
while (( $(date +%s) - t0 < 150 )); do
  for f in coda unfused; do
    timeout 40 ./codagpt train --config configs/gpt2-350m.json --steps 300 --train_data "data/train_*.bin" --val_data "data/val_*.bin" \
      --eval_every 0 --seed $seed --device cuda --fusion $f --log_every 1 --quiet --stop-after 20 --ckpt_every 0 \
      --out_dir $D/runs/${f}_$seed > /dev/null 2>&1 && cp $D/runs/${f}_$seed/metrics.jsonl $R/${f}_$seed.jsonl
  done
  echo "seed $seed done $(( $(date +%s) - t0 )) s"; seed=$((seed + 1))
done
python3 - $R <<'PY' | tee $OUT/summary.txt
import json, sys, glob, os, statistics
R = sys.argv[1]
for f in sorted(glob.glob(f"{R}/*.jsonl")):
    st = [j for j in map(json.loads, open(f)) if "grad_norm" in j]
    n = [j["grad_norm"] for j in st]
    late = n[4:]  # steps 5-20: past the first steps' large norms
    med = statistics.median(late)
    top = max(range(4, len(n)), key=lambda i: n[i])
    print(f"{os.path.basename(f)[:-6]:14s} steps {len(n)} median(5-20) {med:.2f} max {n[top]:.2f} at step {top + 1} ({n[top] / med:.1f}x)")
PY

