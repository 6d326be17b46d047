#!/usr/bin/env bash
# Session 64, call 1: main's codagpt (dev64/old: the build of session 63, code of b4ad612 = main)
# against this session's experiment build (dev64/codagpt: CODAGPT_DY_LAST=1 runs the fused
# backward's dW_o GEMM before its dY GEMM; CODAGPT_PASS_ORDER=reverse runs the sm80 pass kernels'
# tiles last to first). Fused path: losses must match bit for bit across variants; step times
# alternate. Then traced steps, then the fused model's and the engine's GPU tests with both switches.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
left() { echo $(( ${LIMIT:-580} - ( $(date +%s) - start ) )); }
[[ -f /tmp/dev64/codagpt ]] || tar -xJf .carry/dev64.tar.xz -C /tmp
D=/tmp/dev64
export CODAGPT_COMMIT=${COMMIT:-exp64}
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p $OUT/ab $OUT/trace /tmp/runs
run() {  # model variant round steps [trace]
  local model=$1 v=$2 r=$3 steps=$4 trace=${5:-} bin=$D/codagpt envs=()
  case $v in
    old) bin=$D/old/codagpt ;;
    dy) envs=(CODAGPT_DY_LAST=1) ;;
    rev) envs=(CODAGPT_PASS_ORDER=reverse) ;;
    both) envs=(CODAGPT_DY_LAST=1 CODAGPT_PASS_ORDER=reverse) ;;
  esac
  local extra=(--bench-json $OUT/ab/${model}_${v}_r$r.json) log=$OUT/ab/${model}_${v}_r$r.log
  [[ -n $trace ]] && extra=(--trace-kernels $OUT/trace/${model}_${v}.txt) && log=$OUT/trace/${model}_${v}.log
  env "${envs[@]}" $bin train --config $D/configs/$model.json --device cuda --fusion coda --recompute none \
    --steps $steps --train_data "$D/data/train_*.bin" --val_data "$D/data/val_*.bin" --eval_every 0 \
    --eval_batches 4 --log_every 10 --quiet --out_dir /tmp/runs/${model}_${v}_$r "${extra[@]}" > $log 2>&1
  echo "$model $v r$r rc=$? $(grep -E '^done|rror' $log | tail -1)"
}
for r in 1 2; do for v in old none dy rev both; do run gpt2-350m $v $r 30; done; done
for v in old both; do run gpt2-350m $v 3 30; done
el "350M A/B done"
for r in 1 2; do for v in old both; do run gpt2-1.5b $v $r 20; done; done
run gpt2-1.5b none 1 20
el "1.5B A/B done"
for m in gpt2-350m gpt2-1.5b; do for v in none both; do run $m $v t 3 trace; done; done
el "traces done"
python3 - $OUT/ab <<'PY'
import json, glob, os, sys, statistics as st
rows = {}
for f in sorted(glob.glob(sys.argv[1] + '/*.json')):
    model, v, r = os.path.basename(f)[:-5].split('_')
    for rec in json.load(open(f)):
        if rec.get('kind') == 'train':
            rows.setdefault((model, v), []).append(rec)
for (model, v), recs in sorted(rows.items()):
    ms = [r['ms_step'] for r in recs]
    print(f"{model:10s} {v:5s} ms {' '.join(f'{x:7.2f}' for x in ms):24s} med {st.median(ms):7.2f} "
          f"train {recs[0]['train_loss']!r} val {recs[0]['val_loss']!r} same {len({(r['train_loss'], r['val_loss']) for r in recs}) == 1} "
          f"clk {[r.get('sm_clock_mhz') for r in recs]}")
PY
export CODAGPT_DY_LAST=1 CODAGPT_PASS_ORDER=reverse
for t in test_gpu_coda test_gpu_model test_gpu_gemm; do
  timeout $(( $(left) - 3 )) $D/$t > $OUT/$t.log 2>&1
  el "$t rc=$?: $(grep -E '^\[  (PASSED|FAILED|  SKIPPED)' $OUT/$t.log | tr '\n' ' ')"
done
el done
