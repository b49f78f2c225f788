#!/bin/bash
# stop 60, run a: scatter (fused combine) tests, A/B, sanitizer
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > $OUT/gpu.txt
timeout 240 python -m pytest -q -x tests/test_grouped_gemm_gpu.py -k "scatter or gather or layer" > $OUT/tests.log 2>&1
tail -3 $OUT/tests.log
timeout 200 python scratch/s60/scatter_ab.py $OUT/scatter_ab.json > $OUT/scatter_ab.log 2>&1
cat $OUT/scatter_ab.log
timeout 120 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py gemm > $OUT/memcheck_gemm.log 2>&1
tail -3 $OUT/memcheck_gemm.log
