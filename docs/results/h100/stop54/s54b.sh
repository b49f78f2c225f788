export PYTHONPATH=.
nvidia-smi -L
echo "== layer GPU tests"; timeout 150 python -m pytest -q -x tests/test_grouped_gemm_gpu.py -k "tma_gather or decode_sizes or fused or graph" 2>&1 | tail -1
echo "== racecheck gemm"; timeout 150 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py gemm > $OUT/racecheck_gemm_b.log 2>&1; tail -1 $OUT/racecheck_gemm_b.log
for r in 1 2; do
echo "== layer $r"; timeout 170 python -m moe.bench --suite seed004 --case layer --impl ours,torch-loop,torch-grouped --json $OUT/layer$r.json > $OUT/layer$r.log 2>&1; grep -E "layer +\| (ours|torch)" $OUT/layer$r.log | cut -c1-150
done
