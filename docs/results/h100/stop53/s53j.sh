export PYTHONPATH=.
nvidia-smi -L
echo "== gemm GPU tests"; timeout 300 python -m pytest -q -x tests/test_grouped_gemm_gpu.py 2>&1 | tail -3
echo "== racecheck gemm"; timeout 150 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py gemm > $OUT/race_gemm.log 2>&1; grep "sanitize:" $OUT/race_gemm.log; tail -1 $OUT/race_gemm.log
echo "== memcheck gemm"; timeout 150 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py gemm > $OUT/mem_gemm.log 2>&1; tail -1 $OUT/mem_gemm.log
