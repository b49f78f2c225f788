# From the repository root on an H100 / H200, with docs/perf/next/tma_gather.patch applied to the tree
# (git apply docs/perf/next/tma_gather.patch): correctness, sanitizers, then the A/B.
export PYTHONPATH=.
nvidia-smi -L
timeout 200 python -m pytest -q -x tests/test_grouped_gemm_gpu.py -k "tma_gather or pair_tail or every_config" 2>&1 | tail -2
timeout 250 compute-sanitizer --tool racecheck --report-api-errors no python -m pytest -q -x tests/test_grouped_gemm_gpu.py -k "tma_gather" > $OUT/race_gather.log 2>&1; tail -2 $OUT/race_gather.log
timeout 250 compute-sanitizer --tool memcheck --report-api-errors no python -m pytest -q -x tests/test_grouped_gemm_gpu.py -k "tma_gather" > $OUT/mem_gather.log 2>&1; tail -2 $OUT/mem_gather.log
timeout 300 python docs/perf/next/tma_gather_ab.py 2>&1 | grep -v Warn | tee $OUT/tma_gather_ab.log
