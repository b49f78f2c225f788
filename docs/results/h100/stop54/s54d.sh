# after pair_units (the pair's item count in one helper; the pair kernels' SASS changed): grouped GEMM GPU tests,
# racecheck / memcheck of the gemm cases
export PYTHONPATH=.
nvidia-smi -L
echo "== grouped GEMM GPU tests"; timeout 250 python -m pytest -q -x tests/test_grouped_gemm_gpu.py 2>&1 | tail -1
for tool in racecheck memcheck; do echo "== $tool gemm"; timeout 150 compute-sanitizer --tool $tool --report-api-errors no python tools/sanitize.py gemm > $OUT/${tool}_gemm_d.log 2>&1; tail -1 $OUT/${tool}_gemm_d.log; done
