#!/bin/bash
# stop 64, H100: GPU tests of the grouped GEMM / MoE / models on the idle-warpgroup kernel, the sanitizers on the
# gemm family, then the A/B against the kernel before (-DGEMM_IDLE_WG=0)
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
s=$(date +%s); python -m pytest -q -p no:cacheprovider tests/test_grouped_gemm_gpu.py tests/test_moe_gpu.py > $OUT/tests.log 2>&1; echo "tests $(( $(date +%s) - s )) s: $(tail -1 $OUT/tests.log)"
s=$(date +%s); timeout 150 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py gemm > $OUT/racecheck_gemm.log 2>&1; echo "racecheck $(( $(date +%s) - s )) s: $(tail -1 $OUT/racecheck_gemm.log)"
s=$(date +%s); timeout 150 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py gemm > $OUT/memcheck_gemm.log 2>&1; echo "memcheck $(( $(date +%s) - s )) s: $(tail -1 $OUT/memcheck_gemm.log)"
s=$(date +%s); timeout 280 python scratch/s64/idle_ab.py > $OUT/idle_ab.log 2>&1; echo "ab rc $? $(( $(date +%s) - s )) s"; cat $OUT/idle_ab.log
