#!/usr/bin/env bash
# Session 51, last call: the table with cde730d's codagpt where the card is an H200 (the issue's
# targets are the H200's); on any other card it stops at once.
set -uo pipefail
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$gpu"
[[ $gpu == *H200* ]] || { echo "not an H200: no table"; exit 0; }
rm -rf /tmp/dev51 /tmp/dev51e; tar -xJf .carry/dev51/dev51.tar.xz -C /tmp; tar -xJf .carry/dev51/dev51e.tar.xz -C /tmp
cp /tmp/dev51e/codagpt /tmp/dev51/codagpt
export LD_LIBRARY_PATH=/tmp/dev51:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader > $OUT/gpu.txt
STEPS=30 PEER=1 RECOMPUTE=none RUNS_DIR=/tmp/table_runs bash scripts/reproduce_table.sh /tmp/dev51 $OUT/table
cat $OUT/table/table.md
