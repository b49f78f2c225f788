export PYTHONPATH=.
nvidia-smi -L
timeout 300 ncu -k regex:"moe_grouped_gemm|device_kernel" --launch-skip 3 --launch-count 3 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section LaunchStats --metrics lts__t_bytes.sum,dram__bytes_read.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__cycles_active.avg python scratch/pair_ncu.py > $OUT/pair_ncu.log 2>&1
grep -v "^==PROF==" $OUT/pair_ncu.log | grep -E "^  void|Duration|Stall|stall|Throughput|tensor_op|lts__t_bytes|dram__bytes|Cluster|Warp Cycles|Issued|Eligible|Active Warps|No Eligible|L2 Hit|Mem Busy|Max Bandwidth" | cut -c1-150 | head -120
