export PYTHONPATH=.
nvidia-smi -L
SECS=3 COOL=2 timeout 200 python scratch/gemm_power.py 2>&1 | grep -v Warn | tee $OUT/gemm_power.log
timeout 200 ncu -k regex:"moe_grouped_gemm|cutlass|[Gg]rouped|gemm|Gemm" --launch-skip 4 --launch-count 2 --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,sm__inst_executed.sum,smsp__inst_executed_pipe_uniform.sum,sm__cycles_elapsed.avg python scratch/gemm_ncu.py > $OUT/gemm_ncu.log 2>&1; grep -E "^  [a-z_]|moe_|Kernel|cutlass|void|sm90" $OUT/gemm_ncu.log | cut -c1-160 | head -30
