#!/bin/bash
# stop 60 run g: the dynamic schedule: GPU tests, sanitizer
export PYTHONPATH=.
t0=$(date +%s)
timeout 300 python -m pytest -q -x tests/test_grouped_gemm_gpu.py tests/test_moe_gpu.py > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s"; tail -3 $OUT/tests.log
timeout 120 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py gemm > $OUT/memcheck_gemm.log 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $OUT/memcheck_gemm.log
timeout 150 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py gemm > $OUT/racecheck_gemm.log 2>&1
echo "racecheck rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $OUT/racecheck_gemm.log
