#!/usr/bin/env bash
# ncu of one decode call per (case, cache, pipe): duration, DRAM, L2, stall reasons
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_op_read_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,smsp__inst_executed.sum,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_barrier_per_warp_active.pct,smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct,smsp__warp_issue_stalled_membar_per_warp_active.pct,smsp__warp_issue_stalled_short_scoreboard_per_warp_active.pct,smsp__warps_active.avg.pct_of_peak_sustained_active
for spec in "1 32768 16 16 64 1 16" "1 32768 16 16 64 1 0" "8 131072 32 8 128 1 0" "1 131072 16 16 64 1 16"; do
  for pipe in 0 1; do
    echo "== $spec pipe=$pipe"
    ncu --kernel-name regex:flash_decode --launch-skip 2 --launch-count 1 --metrics $M --csv python scratch/s65/ncu_one.py $spec $pipe 2>/dev/null | grep -v "^==PROF" | awk -F'","' 'NR>1 {print $(NF-2) " = " $NF " " $(NF-1)}'
  done
done
