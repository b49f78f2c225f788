#!/bin/bash
# stop 67 call 5: the plain epilogue in 64-column passes (v4.12): sanitizers and GPU tests
export PYTHONPATH=.
t0=$(date +%s)
nvidia-smi -L | tee $OUT/gpu.txt
timeout 170 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py gemm > $OUT/racecheck_gemm.log 2>&1
echo "racecheck rc=$? $(( $(date +%s) - t0 ))s"; tail -2 $OUT/racecheck_gemm.log
timeout 170 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py gemm > $OUT/memcheck_gemm.log 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 ))s"; tail -2 $OUT/memcheck_gemm.log
timeout 240 python -m pytest -q -x -p no:cacheprovider tests/test_grouped_gemm_gpu.py tests/test_moe_gpu.py > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s"; tail -2 $OUT/tests.log
