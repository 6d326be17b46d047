#!/usr/bin/env bash
# Session 50, fifth call: 461339a's bench_gemm (the LnBackwardX ladder's rungs as one template) and
# bench_step_energy (AdamW on the masters' halves) on a GPU for the first time.
# Expect: the ladder's rungs as in h100_ablate_4c758c8 (1.5B: 1.028 / 1.069 / 1.082 / 1.102 on an
# H100); the step-energy parts run, the optimizer among them.
set -uo pipefail
tar -xJf .carry/dev50/dev50e.tar.xz -C /tmp
D=/tmp/dev50e
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv,noheader | tee $OUT/gpu.txt
timeout 200 $D/bench_gemm --ablate --model 1.5b --reps 20 > $OUT/ablate_1.5b.log 2>&1; echo "ablate rc=$?"
grep -iE "LnBackwardX|LnDx|ln_dx|rung" $OUT/ablate_1.5b.log | head -20
timeout 150 $D/bench_step_energy --config $D/configs/gpt2-1.5b.json --seconds 3 > $OUT/step_energy.log 2>&1; echo "step_energy rc=$?"
tail -12 $OUT/step_energy.log
