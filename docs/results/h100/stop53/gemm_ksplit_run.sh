# From the repository root on a GPU: the tree and a copy with the patch applied, side by side.
export PYTHONPATH=.
N=docs/perf/next
nvidia-smi -L
rm -rf /tmp/vK; mkdir /tmp/vK; cp -r attention cukernels moe models tools profiles expected_results pyproject.toml tests $N /tmp/vK/
(cd /tmp/vK && patch -p1 -s < next/gemm_ksplit_per_thread_release.patch)
(cd /tmp/vK && timeout 120 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py gemm > $OUT/race_ks.log 2>&1; grep "sanitize:" $OUT/race_ks.log; tail -1 $OUT/race_ks.log)
(cd /tmp/vK && timeout 100 python -m pytest -q -x tests/test_grouped_gemm_gpu.py -k "split_k or every_config or persistent_many or dense_offsets" 2>&1 | tail -1)
for r in 1 2; do python $N/gemm_ksplit_perf.py tree; (cd /tmp/vK && python next/gemm_ksplit_perf.py var); done
