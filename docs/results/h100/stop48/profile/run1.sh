export PYTHONPATH=.
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $W/gpu.txt
DTYPES=bf16,fp16 timeout 150 python scratch/bwd_parts.py > $W/bwd_parts_hb125m.log 2>&1
# ncu: cudnn's and ours backward kernels, one of each (hb125m bf16 non-causal)
DTYPES=bf16 ITERS=1 WARM=1 ONLY=ours,cudnn NOPROF=1 timeout 240 ncu --launch-skip 0 --launch-count 30 --section LaunchStats --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,lts__t_bytes.sum,dram__bytes.sum python scratch/bwd_parts.py > $W/ncu_hb125m.log 2>&1
for sh in 4,1024,8,8,64 8,1024,8,8,64; do
  timeout 60 python tools/fwd_timeline.py --shape $sh --json $W/timeline_$sh.json > $W/timeline_$sh.log 2>&1
done
timeout 150 python -m attention.bench --suite decode --case decode_b1_L8k_h32-8_d128_q1 --case decode_b1_L32k_h32-8_d128_q1 --case decode_b1_L1k --json $W/decode_b1.json > $W/decode_b1.log 2>&1
cd $OUT && tar czf w.tgz w && rm -rf w
