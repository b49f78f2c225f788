#!/bin/bash
export PYTHONPATH=.
M=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct
for T in seed004_b16x2048; do
timeout 280 ncu --metrics $M -k regex:moe_grouped_gemm_tma --launch-skip 4 --launch-count 2 python scratch/s60/layer_once.py $T > $OUT/ncu_$T.log 2>&1; echo rc=$?
grep -E "moe_grouped|dram__|lts__|gpu__time|gmma" $OUT/ncu_$T.log | head -30
done
