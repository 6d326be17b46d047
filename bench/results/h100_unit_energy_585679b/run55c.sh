#!/usr/bin/env bash
# Session 55, call 3 (binaries of 585679b's build). Nsight's bytes of the 1.5B fused programs (the
# file call 1 lost); where our multicast's bytes go (L2 reads against bytes delivered to the SMs,
# pp128x128 against pp128x128c2 and cuBLASLt on fc dX); a third shape's energy sweep for the fit.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
rm -rf /tmp/dev55; tar -xJf .carry/dev55.tar.xz -C /tmp
D=/tmp/dev55
export CODAGPT_COMMIT=585679b
export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
L=/tmp/call3; rm -rf $L; mkdir -p $L
pack() { tar -cJf $OUT/call3.tar.xz -C /tmp call3; }
NCU=/usr/local/cuda/bin/ncu
M=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
timeout 60 $NCU --clock-control none --csv --metrics $M -k regex:'gemm_kernel|nvjet' --launch-count 120 \
  $D/bench_gemm --only none --reps 1 > $L/ncu_programs.csv 2> $L/ncu_programs.err
el "ncu programs rc=$? $(grep -c gemm_kernel $L/ncu_programs.csv) lines"; pack
for m in lts__t_sectors_op_read.sum lts__t_requests_srcunit_tex_op_read.sum l1tex__m_xbar2l1tex_read_bytes.sum; do
  timeout 30 $NCU --clock-control none --csv --metrics $m,gpu__time_duration.sum -k regex:'gemm_kernel|nvjet' --launch-count 16 \
    $D/bench_gemm --only "1.5b fc dX" --no-fused --sweep --reps 1 > $L/ncu_fc_dX_$m.csv 2> $L/ncu_fc_dX_$m.err
  el "ncu $m rc=$?"; pack
done
timeout 60 $D/bench_gemm --only "1.5b fc fwd" --no-fused --sweep --reps 5 --energy 3 --json $L/gemm_energy.json > $L/gemm_energy_1.5b_fc_fwd.log 2>&1
el "gemm energy fc fwd rc=$?"; grep -E "energy|^1.5b" $L/gemm_energy_1.5b_fc_fwd.log; pack
timeout 30 $NCU --clock-control none --csv --metrics $M -k regex:'gemm_kernel|nvjet' --launch-count 16 \
  $D/bench_gemm --only "1.5b fc fwd" --no-fused --sweep --reps 1 > $L/ncu_1.5b_fc_fwd.csv 2> $L/ncu_1.5b_fc_fwd.err
el "ncu fc fwd rc=$?"; pack
el done
