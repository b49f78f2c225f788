#!/bin/bash
export PYTHONPATH=.
M=gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,smsp__warp_issue_stalled_barrier_per_warp_active.pct,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_wait_per_warp_active.pct,smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct,smsp__warp_issue_stalled_sleeping_per_warp_active.pct,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active
for v in new old; do
  VARIANT=$v timeout 200 ncu --kernel-name regex:moe_grouped_gemm_tma --launch-skip 1 --launch-count 1 --metrics $M python scratch/s64/ncu_idle.py > $OUT/ncu_$v.log 2>&1
  echo "== $v"; grep -E "gpu__time|gmma|sm__throughput|lts__t_bytes|stalled|grid_size|warps_active" $OUT/ncu_$v.log
done
