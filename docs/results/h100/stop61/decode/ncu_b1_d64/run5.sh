export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L; mkdir -p $OUT/s61/paged
for L in 8192 32768; do timeout 150 python scratch/s61/paged_probe.py $L 2>&1 | tee $OUT/s61/paged/time_L$L.log; done
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read.sum
for var in contig p16_inorder p16_inorder_w4s4 p16_shuffled; do
  timeout 100 ncu --metrics $M -k regex:flash_decode --launch-skip 1 --launch-count 1 python scratch/s61/paged_probe.py 32768 $var > $OUT/s61/paged/ncu_$var.log 2>&1
  echo "== ncu $var rc $?"; grep -E "^$var|duration|dram__|lts__|inst_executed|warps_active|stalled|ldgsts" $OUT/s61/paged/ncu_$var.log | sed 's/  */ /g' | cut -c1-110
done
