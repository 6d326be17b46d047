#!/usr/bin/env bash
# Session 50, last call (2 GPUs): every GPU test binary but test_gpu_gemm (kernels unchanged) with
# 7e9bdab's binaries on GPU 0, compute-sanitizer memcheck of the chunked LM head and the AdamW
# tests, and the ZeRO path's gather of the masters' low halves on 2 ranks: a 2-rank 124M run of 12
# steps with a checkpoint at 6 against the same run resumed from that checkpoint, each path.
# Expect: all pass; memcheck 0 errors; the resumed runs' step 7-12 losses equal the uninterrupted
# ones bit for bit (a mis-gathered low half would change the resumed weights).
set -uo pipefail
X=.carry/dev50
rm -rf /tmp/dev50; tar -xJf $X/dev50.tar.xz -C /tmp
D=/tmp/dev50
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=/tmp/logs50d; mkdir -p $L
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv,noheader | tee $L/gpu.txt
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
pack() { tar -cJf $OUT/logs50d.tar.xz -C /tmp logs50d; }
ngpu=$(nvidia-smi -L | wc -l)
for c in unfused coda; do
  [ $ngpu -ge 2 ] || { el "one GPU: no 2-rank runs"; break; }
  common=(--config $D/configs/gpt2-124m.json --device cuda --fusion $c --steps 12 --train_data "$D/data/train_*.bin"
          --val_data "$D/data/val_*.bin" --eval_every 0 --eval_batches 1 --log_every 1 --sample_every 0 -q)
  timeout 120 $D/new/codagpt train --nproc-per-node 2 "${common[@]}" --ckpt_every 6 --out_dir /tmp/r2_$c > $L/r2_$c.log 2>&1
  el "2 ranks $c rc=$? $(grep '^done' $L/r2_$c.log)"
  timeout 120 $D/new/codagpt train --nproc-per-node 2 "${common[@]}" --resume /tmp/r2_$c/ckpt_6.bin --out_dir /tmp/r2res_$c > $L/r2res_$c.log 2>&1
  el "2 ranks $c resumed at 6 rc=$? $(grep '^done' $L/r2res_$c.log)"
  cp /tmp/r2_$c/metrics.jsonl $L/metrics_r2_$c.jsonl; cp /tmp/r2res_$c/metrics.jsonl $L/metrics_r2res_$c.jsonl
  python3 - $L/metrics_r2_$c.jsonl $L/metrics_r2res_$c.jsonl $c <<'PY'
import json, sys
def steps(p):
    out = {}
    for line in open(p):
        j = json.loads(line)
        if "loss" in j and "step" in j and j.get("type", "train") == "train": out[j["step"]] = (j["loss"], j.get("grad_norm"))
    return out
a, b = steps(sys.argv[1]), steps(sys.argv[2])
common = sorted(set(a) & set(b))
same = [s for s in common if a[s] == b[s]]
print(f"{sys.argv[3]}: steps in both {common}; bit-equal loss and norm at {len(same)} of {len(common)}")
for s in common: print(" ", s, a[s], b[s])
PY
done
pack
export CUDA_VISIBLE_DEVICES=0
for t in test_gpu_optim test_gpu_coda test_gpu_dist test_gpu_checkpoint test_gpu_model test_gpu_sample test_gpu_kernels test_gpu_matmul test_gpu_attention; do
  [ $(( $(date +%s) - T0 )) -gt 430 ] && { el "skip $t (time)"; continue; }
  timeout 150 $D/new/$t > $L/$t.log 2>&1; el "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|  SKIPPED)  \]' $L/$t.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' $L/$t.log | head -5
done
pack
timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $D/new/test_gpu_coda \
  --gtest_filter='CodaGPU.TinyWithTheLmHeadInThreeChunks*' > $L/memcheck_coda.log 2>&1
el "memcheck coda rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $L/memcheck_coda.log | tr '\n' ' ')"
timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $D/new/test_gpu_optim \
  --gtest_filter='AdamW.MatchesCpu*:AdamW.Misaligned*' > $L/memcheck_optim.log 2>&1
el "memcheck optim rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $L/memcheck_optim.log | tr '\n' ' ')"
pack
