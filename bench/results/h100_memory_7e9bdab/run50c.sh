#!/usr/bin/env bash
# Session 50, third call: the paper-style table with this session's codagpt (both paths) and the
# PyTorch peer, as the forty-ninth session's H200 table (STEPS=30 PEER=1 RECOMPUTE=none).
set -uo pipefail
X=.carry/dev50
rm -rf /tmp/dev50; tar -xJf $X/dev50.tar.xz -C /tmp
D=/tmp/dev50
cp $D/new/codagpt $D/codagpt
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
STEPS=30 PEER=1 RECOMPUTE=none RUNS_DIR=/tmp/table_runs bash scripts/reproduce_table.sh $D $OUT/table
cat $OUT/table/table.md
