#!/usr/bin/env bash
# The LM head dX GEMM split between cuBLASLt (K's first columns, fp32 partial) and the engine (the
# last CODAGPT_WIP_LM_ENGINE_K columns, LnBackwardXSplit's epilogue): the change's GPU tests, then
# 30-step runs at several k (50304: all on the engine, as main), most wanted first, rounds
# interleaved so that drift shows.
#   COMMIT=<built commit> bash bench/run_lmsplit62.sh   (codagpt, the GPU tests and bench_attention
#   of this branch, configs, data/*.bin and libgomp in .carry/dev62; LIMIT: no run starts after
#   this many seconds)
set -uo pipefail
start=$(date +%s)
D=$PWD/.carry/dev62
export CODAGPT_COMMIT=${COMMIT:-unknown}
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv,noheader | tee $OUT/gpu.txt
t() { echo "[$(( $(date +%s) - start )) s] $*"; }
{
  $D/test_gpu_matmul 2>&1 | grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) |tests ran"; t matmul
  $D/test_gpu_gemm --gtest_filter='*LnBackwardX*' 2>&1 | grep -E "^\[ +(FAILED|PASSED|SKIPPED) |tests ran|Failure" | head -20; t gemm
  $D/test_gpu_coda 2>&1 | grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) |tests ran|Failure" | head -40; t coda
  $D/test_gpu_attention 2>&1 | grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) |tests ran|Failure" | head -20; t attention
} > $OUT/tests.log 2>&1
grep -E "PASSED|FAILED|SKIPPED|\[ *[0-9]+ s\]" $OUT/tests.log
run() {  # model engine_k tag
  CODAGPT_WIP_LM_ENGINE_K=$2 timeout 100 $D/codagpt train --config $D/configs/$1.json --device cuda --fusion coda \
    --recompute none --steps ${STEPS:-30} --train_data "$D/data/train_*.bin" --val_data "$D/data/val_*.bin" \
    --eval_every 0 --eval_batches 2 --log_every 10 --quiet --out_dir /tmp/runs62/$1-$2-$3 \
    --bench-json $OUT/train.json > /tmp/train_$1-k$2-$3.log 2>&1
  t "$1 k=$2 $3: $(grep -E '^done' /tmp/train_$1-k$2-$3.log)"
}
LIMIT=${LIMIT:-420}
i=0
for spec in "gpt2-1.5b 50304" "gpt2-1.5b 2048" "gpt2-350m 50304" "gpt2-350m 2048" \
            "gpt2-1.5b 4096" "gpt2-1.5b 1024" "gpt2-350m 4096" "gpt2-350m 1024" \
            "gpt2-1.5b 50304" "gpt2-1.5b 2048" "gpt2-350m 50304" "gpt2-350m 2048" \
            "gpt2-1.5b 8192" "gpt2-1.5b 4096" "gpt2-1.5b 1024"; do
  (( $(date +%s) - start > LIMIT )) && { t "stop: past $LIMIT s"; break; }
  set -- $spec
  i=$((i + 1))
  run $1 $2 r$i
done 2>&1 | tee $OUT/runs.log
tar czf $OUT/train_logs.tgz -C /tmp $(cd /tmp && ls train_*.log)
(( $(date +%s) - start < ${BENCH_LIMIT:-470} )) && $D/bench_attention --config $D/configs/gpt2-1.5b.json > $OUT/bench_attention.log 2>&1
t end
