export PYTHONPATH=.
nvidia-smi -L
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,sm__inst_executed.sum,sm__cycles_elapsed.avg,launch__grid_size,launch__block_size,launch__cluster_dim_x,launch__cluster_dim_y,launch__shared_mem_per_block_dynamic,launch__registers_per_thread,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__warps_launched.sum
for E in 8 32; do
E=$E timeout 150 ncu -k regex:"moe_grouped_gemm|device_kernel|[Gg]rouped|[Gg]emm" --launch-skip 0 --launch-count 6 --metrics $M python scratch/gemm_ncu8.py > $OUT/ncu_e$E.log 2>&1
echo "== E$E"; grep -v "^==PROF==" $OUT/ncu_e$E.log | grep -E "^  [a-zA-Z]|  [a-z_]+__" | cut -c1-220 | head -60
done
echo "== gemm GPU tests"; timeout 240 python -m pytest -q -x tests/test_grouped_gemm_gpu.py tests/test_moe_gpu.py 2>&1 | tail -2
echo "== sanitizer gemm"; timeout 240 python -m pytest -q -x tests/test_sanitizer_gpu.py -k "gemm" 2>&1 | tail -2
