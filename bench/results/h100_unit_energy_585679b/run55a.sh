#!/usr/bin/env bash
# Session 55, call 1 (binaries of the working tree on b30e056 with bench_wgmma --energy). What a
# unit of each of a GEMM's resources costs in joules: the wgmma issue patterns, bulk copies from
# L2 and DRAM, and the two together (bench_wgmma --energy); then our GEMMs' and cuBLASLt's joules
# a call on three 1.5B shapes, every tile (bench_gemm --energy --sweep), and Nsight Compute's L2
# and DRAM bytes of the same launches and of the copies; last the GPU model tests at HEAD.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
rm -rf /tmp/dev55; tar -xJf .carry/dev55.tar.xz -C /tmp
D=/tmp/dev55
export CODAGPT_COMMIT=${COMMIT:-b30e056+wgmma-energy}
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
L=$OUT/call1; mkdir -p $L
NCU=/usr/local/cuda/bin/ncu
M=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
timeout 200 $D/bench_wgmma --energy 4 --json $L/unit_energy.json > $L/wgmma_energy.log 2>&1
el "bench_wgmma rc=$?"; cat $L/wgmma_energy.log
timeout 120 $NCU --clock-control none --csv --metrics $M -k regex:'bulk_copy|wgmma_copy' --launch-count 60 \
  $D/bench_wgmma --iters 2000 --energy 0.01 > $L/ncu_copies.csv 2> $L/ncu_copies.err
el "ncu copies rc=$?"
energy() {  # bench_gemm --energy on one plain 1.5B shape, every tile; then its bytes under Nsight Compute
  local s=$1 tag=${1// /_}
  timeout 200 $D/bench_gemm --only "$s" --no-fused --sweep --reps 5 --energy 3 --json $L/gemm_energy.json > $L/gemm_energy_$tag.log 2>&1
  el "gemm energy $s rc=$?"; grep -E "energy|^1.5b" $L/gemm_energy_$tag.log | head -40
  timeout 200 $NCU --clock-control none --csv --metrics $M -k regex:'gemm_kernel|nvjet' --launch-count 16 \
    $D/bench_gemm --only "$s" --no-fused --sweep --reps 1 > $L/ncu_$tag.csv 2> $L/ncu_$tag.err
  el "ncu $s rc=$?"
}
energy "1.5b fc dX"
timeout 150 $D/bench_gemm --only none --reps 5 --energy 3 --json $L/program_energy.json > $L/program_energy.log 2>&1
el "program energy rc=$?"; grep -E "energy|x plain" $L/program_energy.log | head -40
timeout 150 $NCU --clock-control none --csv --metrics $M -k regex:'gemm_kernel|nvjet' --launch-count 150 \
  $D/bench_gemm --only none --reps 1 > $L/ncu_programs.csv 2> $L/ncu_programs.err
el "ncu programs rc=$?"
energy "1.5b qkv fwd"
timeout 240 $D/test_gpu_model > $L/test_gpu_model.log 2>&1
el "test_gpu_model rc=$?: $(tail -3 $L/test_gpu_model.log | tr '\n' ' ')"
el done
