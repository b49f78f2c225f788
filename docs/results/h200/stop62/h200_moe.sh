#!/bin/bash
# stop 62: issue 14's H200 rows (the MoE suites), only on an H200
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
nvidia-smi -L | grep -q H200 || { echo "not an H200: nothing run"; exit 0; }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv | tee -a $OUT/gpu.txt
for s in $SUITES; do
  case $s in
    gemm) python -m moe.bench --suite gemm --impl ours,cublas,torch-grouped --rounds 5 --json $OUT/moe_gemm.json > $OUT/moe_gemm.txt 2>&1 ;;
    *) python -m moe.bench --suite $s --json $OUT/moe_$s.json > $OUT/moe_$s.txt 2>&1 ;;
  esac
  echo "== $s rc $?"; tail -25 $OUT/moe_$s.txt
done
