export PYTHONPATH=.
nvidia-smi -L
echo "== racecheck gemm"; timeout 200 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py gemm > $OUT/race_gemm.log 2>&1; grep "sanitize:" $OUT/race_gemm.log; tail -1 $OUT/race_gemm.log; grep -o "in moe_[a-z_]*" $OUT/race_gemm.log | sort | uniq -c | head
echo "== memcheck gemm"; timeout 200 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py gemm > $OUT/mem_gemm.log 2>&1; tail -1 $OUT/mem_gemm.log
echo "== tests"; timeout 150 python -m pytest -q -x tests/test_grouped_gemm_gpu.py -k "split_k or every_config or persistent_many or dense_offsets or pair or cluster" 2>&1 | tail -1
echo "== pair bench"; timeout 150 python scratch/pair_bench.py new 2>&1 | grep -v Warn | tee $OUT/pair_bench.log
echo "== ksplit A/B"; for r in 1 2 3; do (cd scratch/headtree && PYTHONPATH=. python ../gemm_ksplit_perf.py v7.1 2>&1 | grep -v Warn); python scratch/gemm_ksplit_perf.py fence 2>&1 | grep -v Warn; done | tee $OUT/ksplit_ab.log
