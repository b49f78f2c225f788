# v7.4 (the fused combine): GPU tests, racecheck / memcheck of the gemm cases (layers on both tiles), the A/B
export PYTHONPATH=.
nvidia-smi -L
echo "== tests"; timeout 100 python -m pytest -q -x tests/test_grouped_gemm_gpu.py -k "tma_combine or tma_gather or decode_sizes" 2>&1 | tail -1
echo "== racecheck gemm"; timeout 80 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py gemm > $OUT/racecheck_gemm_e.log 2>&1; tail -1 $OUT/racecheck_gemm_e.log
echo "== A/B"; timeout 90 python docs/results/h100/stop54/tma_combine_ab.py 2>&1 | grep -v Warn | tee $OUT/tma_combine_ab.log
