export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L; mkdir -p $OUT/s61
for E in 32 64; do
  timeout 120 ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_bytes.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active -k regex:moe_grouped_gemm_tma python scratch/s61/skip_ncu.py $E > $OUT/s61/ncu_E$E.log 2>&1
  echo "ncu E$E rc $?"; grep -E "moe_grouped|duration|dram__bytes|lts__t_bytes|hmma" $OUT/s61/ncu_E$E.log | sed 's/  */ /g' | cut -c1-120
done
CASES="E32 routed,E64 random" ROUNDS=3 timeout 300 python scratch/s61/skip_ab.py 2>&1 | tee $OUT/s61/skip_ab2.log | grep -v "^    "
