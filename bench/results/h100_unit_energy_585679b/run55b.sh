#!/usr/bin/env bash
set -uo pipefail
export LD_LIBRARY_PATH=/tmp/dev55:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
L=/tmp/call2; rm -rf $L; mkdir -p $L
NCU=/usr/local/cuda/bin/ncu
M=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second
B=.carry/dev55b/bench_wgmma
timeout 150 $B --energy 4 --json $L/unit_energy.json > $L/wgmma_energy.log 2>&1; echo "bench_wgmma rc=$?"; cat $L/wgmma_energy.log
timeout 90 $NCU --clock-control none --csv --metrics $M -k regex:'bulk_copy|wgmma_copy' --launch-count 60 $B --iters 2000 --energy 0.01 > $L/ncu_copies.csv 2> $L/ncu_copies.err; echo "ncu rc=$?"
cp -r /tmp/logs_prev $L/ 2>/dev/null
tar -cJf $OUT/call2.tar.xz -C /tmp call2 $( [ -d /tmp/dev55 ] && echo ) 2>/dev/null
ls -la $OUT
