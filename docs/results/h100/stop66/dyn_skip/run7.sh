#!/bin/bash
# stop 66 run 7: the dynamic schedule + idle-warpgroup skip (both patches, rebased): GPU tests, sanitizers
export PYTHONPATH=.
t0=$(date +%s)
nvidia-smi -L | tee $OUT/gpu.txt
timeout 200 python -m pytest -q -x -p no:cacheprovider tests/test_grouped_gemm_cpu.py -k "sm_90a or pair or min_blocks" > $OUT/compile.log 2>&1
echo "offline compile rc=$? $(( $(date +%s) - t0 ))s"; tail -2 $OUT/compile.log
timeout 250 python -m pytest -q -x -p no:cacheprovider tests/test_grouped_gemm_gpu.py tests/test_moe_gpu.py > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s"; tail -3 $OUT/tests.log
timeout 150 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py gemm > $OUT/racecheck_gemm.log 2>&1
echo "racecheck rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $OUT/racecheck_gemm.log
timeout 150 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py gemm > $OUT/memcheck_gemm.log 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $OUT/memcheck_gemm.log
