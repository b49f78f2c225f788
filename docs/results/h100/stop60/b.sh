#!/bin/bash
# stop 60, run b: the pair-only fused combine: tests, A/B at large T, the seed004 suite, racecheck
export PYTHONPATH=.
nvidia-smi -L > $OUT/gpu.txt
t0=$(date +%s)
timeout 240 python -m pytest -q tests/test_grouped_gemm_gpu.py -k "scatter or layer" tests/test_moe_gpu.py tests/test_models_gpu.py tests/test_moe_experts_gpu.py > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $OUT/tests.log
TS=2048,32768,65536 timeout 200 python scratch/s60/scatter_ab.py $OUT/scatter_ab.json > $OUT/scatter_ab.log 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 ))s"; grep ratio $OUT/scatter_ab.log
timeout 150 python -m moe.bench --suite seed004 --json $OUT/moe_seed004.json > $OUT/moe_seed004.log 2>&1
echo "seed004 rc=$? $(( $(date +%s) - t0 ))s"
grep -E "layer +\| (ours|torch-loop|torch-grouped)" $OUT/moe_seed004.log | cut -c1-200
timeout 150 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py gemm > $OUT/racecheck_gemm.log 2>&1
echo "racecheck rc=$? $(( $(date +%s) - t0 ))s"; tail -2 $OUT/racecheck_gemm.log
